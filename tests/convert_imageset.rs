//! `p2ptrain convert-imageset` and `compute-mean` against what BVLC Caffe made of the same PNGs
//! (`tests/data/caffe`): the LMDBs match Caffe's record for record (keys, order, `Datum` bytes),
//! raw and PNG-encoded, and the mean of the raw LMDB is Caffe's `compute_image_mean` image.

mod common;

use common::*;
use p2ptrain::data::lmdb::LmdbStore;
use p2ptrain::data::mean_file;
use std::path::Path;
use std::process::Command;

/// Every (key, value) of the LMDB folder `path`, in stored order.
fn records(path: &Path) -> Vec<(String, Vec<u8>)> {
    let db = LmdbStore::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (0..db.len())
        .map(|i| (db.key(i), db.with_value(i, |v| Ok(v.to_vec())).unwrap()))
        .collect()
}

fn convert(args: &[&str], out: &Path) {
    let png = repo("tests/data/caffe/png");
    let root = format!("{}/", png.display());
    let list = png.join("train.txt");
    let o = run(Command::new(bin())
        .arg("convert-imageset")
        .args(args)
        .args([root.as_str(), list.to_str().unwrap(), out.to_str().unwrap()]));
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn raw_and_encoded_lmdbs_match_caffes_record_for_record() {
    let dir = tempfile::tempdir().unwrap();
    for (args, caffes) in [
        (vec!["--gray"], "digits_train_lmdb"),
        (
            vec!["--gray", "--encoded", "--encode-type", "png"],
            "digits_train_encoded_lmdb",
        ),
    ] {
        let out = dir.path().join(caffes);
        convert(&args, &out);
        let (ours, theirs) = (
            records(&out),
            records(&repo(&format!("tests/data/caffe/{caffes}"))),
        );
        assert_eq!(ours.len(), 1500, "{caffes}");
        assert_eq!(ours.len(), theirs.len(), "{caffes}");
        for (k, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(a.0, b.0, "{caffes}: key of record {k}");
            assert_eq!(a.1, b.1, "{caffes}: Datum of record {k} ({})", a.0);
        }
    }
    // A second conversion into the same folder is refused: nothing is overwritten.
    let o = run(Command::new(bin()).args([
        "convert-imageset",
        "--gray",
        repo("tests/data/caffe/png").to_str().unwrap(),
        repo("tests/data/caffe/png/train.txt").to_str().unwrap(),
        dir.path().join("digits_train_lmdb").to_str().unwrap(),
    ]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("already exists"), "{}", text(&o));
}

#[test]
fn a_shuffled_conversion_holds_the_same_records_in_another_order() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shuffled");
    convert(&["--gray", "--shuffle", "--seed", "4"], &out);
    let ours = records(&out);
    let theirs = records(&repo("tests/data/caffe/digits_train_lmdb"));
    let strip = |k: &str| k.split_once('_').unwrap().1.to_string();
    let mut a: Vec<_> = ours.iter().map(|(k, v)| (strip(k), v.clone())).collect();
    let mut b: Vec<_> = theirs.iter().map(|(k, v)| (strip(k), v.clone())).collect();
    assert_ne!(a, b, "shuffled");
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert!(ours
        .iter()
        .enumerate()
        .all(|(i, (k, _))| k.starts_with(&format!("{i:08}_"))));
}

#[test]
fn compute_mean_of_an_lmdb_is_caffes_mean_image() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("lmdb.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nformat = \"lmdb\"\ntrain_source = \"{}\"\ntest_source = \"{}\"\nbatch_size = 1\n\
             [solver]\nbase_lr = 0.1\nmax_iter = 1\n{}",
            repo("tests/data/caffe/digits_train_lmdb").display(),
            repo("tests/data/caffe/digits_test_lmdb").display(),
            config_text::linear_classifier("data", 10, "")
        ),
    )
    .unwrap();
    let mean = dir.path().join("mean.binaryproto");
    let o = compute_mean(&cfg, &mean);
    assert!(o.status.success(), "{}", text(&o));
    let ours = mean_file::read(&mean).unwrap();
    let caffes = mean_file::read(&repo("tests/data/caffe/digits_mean.binaryproto")).unwrap();
    assert_eq!(ours.shape, caffes.shape);
    for (a, b) in ours.data.iter().zip(&caffes.data) {
        // Caffe sums in f32, p2ptrain in f64: the last bits may differ.
        assert!(
            (a - b).abs() <= 1e-4 * b.abs().max(1.0),
            "{a} vs Caffe's {b}"
        );
    }
}
