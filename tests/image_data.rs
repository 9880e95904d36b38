//! The image formats through the real binary under `mpirun`: the same net trained from Caffe's
//! raw LMDB, its PNG-encoded LMDB, the list of PNGs and the IDX files gives bitwise the same
//! weights; ImageNet's resized crop with mirroring trains the same on any topology; unreadable
//! images stop the run naming them (exit 2) or are skipped and counted; a missing file, a label
//! out of range and a folder that is not an LMDB are named before anything is written.

mod common;

use common::config_text::{accuracy, convolution, linear_classifier};
use common::*;
use std::path::{Path, PathBuf};

/// `tests/data/caffe/NAME`, as a string for a config.
fn caffe(name: &str) -> String {
    repo(&format!("tests/data/caffe/{name}"))
        .display()
        .to_string()
}

/// The weight filler of the learned layers of [`net`].
const XAVIER: &str = "weight_filler = { type = \"xavier\" }\n";

/// A small CNN on 1×8×8 digits (or 1×6×6 crops): conv 8 3×3 pad 1 → relu → max pool 2 → ip 10,
/// trained `max_iter` iterations, with `data` as its `[data]` section.
fn net(data: &str, max_iter: u64) -> String {
    format!(
        r#"[data]
batch_size = 20
scale = 0.00390625
{data}

[solver]
base_lr = 0.05
momentum = 0.9
max_iter = {max_iter}
display = 1
test_interval = 0
snapshot_prefix = "snap/net"
random_seed = 3

{conv1}
[[layer]]
name = "relu1"
type = "relu"
bottom = ["conv1"]
top = ["conv1"]

[[layer]]
name = "pool1"
type = "pooling"
bottom = ["conv1"]
top = ["pool1"]
pool = "max"
kernel_size = 2
stride = 2

{classifier}
{accuracy}
[[layer]]
name = "accuracy_top5"
type = "accuracy"
bottom = ["ip", "label"]
top = ["accuracy_top5"]
top_k = 5
phase = "test"
"#,
        conv1 = convolution(
            "conv1",
            "data",
            8,
            &format!("kernel_size = 3\npad = 1\n{XAVIER}")
        ),
        classifier = linear_classifier("pool1", 10, XAVIER),
        accuracy = accuracy("ip"),
    )
}

/// Trains `config` on `np` ranks with `sets`; returns the output folder.
fn train(name: &str, config: &str, np: usize, sets: &[&str]) -> PathBuf {
    let (dir, cfg) = config_dir(name, config);
    let out = dir.join("out");
    let mut args = vec![cfg.to_str().unwrap(), "--output", out.to_str().unwrap()];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = mpi_p2ptrain(np, &args);
    assert!(o.status.success(), "{name}: {}", text(&o));
    out
}

/// Every tensor of two snapshots, bit for bit.
fn assert_bitwise_equal(a: &Path, b: &Path, what: &str) {
    let (ta, tb) = (tensors(a), tensors(b));
    assert_eq!(ta.len(), tb.len(), "{what}");
    for (name, (shape, values)) in &ta {
        let (s2, v2) = &tb[name];
        assert_eq!(shape, s2, "{what}: {name}");
        let same = values
            .iter()
            .zip(v2)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{what}: {name} differs");
    }
}

#[test]
fn raw_lmdb_encoded_lmdb_image_list_and_idx_train_bitwise_the_same_weights() {
    let digits = |f: &str| repo(&format!("data/digits/{f}")).display().to_string();
    let sources = [
        (
            "idx",
            format!(
                "format = \"idx\"\ntrain_images = \"{}\"\ntrain_labels = \"{}\"\n\
                 test_images = \"{}\"\ntest_labels = \"{}\"",
                digits("train-images-idx3-ubyte.gz"),
                digits("train-labels-idx1-ubyte.gz"),
                digits("test-images-idx3-ubyte.gz"),
                digits("test-labels-idx1-ubyte.gz")
            ),
        ),
        (
            "raw_lmdb",
            format!(
                "format = \"lmdb\"\ntrain_source = \"{}\"\ntest_source = \"{}\"",
                caffe("digits_train_lmdb"),
                caffe("digits_test_lmdb")
            ),
        ),
        (
            "encoded_lmdb",
            format!(
                "format = \"lmdb\"\nis_color = false\ntrain_source = \"{}\"\ntest_source = \"{}\"",
                caffe("digits_train_encoded_lmdb"),
                caffe("digits_test_lmdb")
            ),
        ),
        (
            "image_list",
            format!(
                "format = \"image_list\"\nis_color = false\nroot_folder = \"{}\"\n\
                 train_source = \"{}\"\ntest_source = \"{}\"",
                caffe("png"),
                caffe("png/train.txt"),
                caffe("png/test.txt")
            ),
        ),
    ];
    // 90 iterations of 20: 1800 records, an epoch boundary crossed (1500 records), shuffled.
    let outs: Vec<(&str, PathBuf)> = sources
        .iter()
        .map(|(name, data)| (*name, train(&format!("img_{name}"), &net(data, 90), 1, &[])))
        .collect();
    let snap = |o: &Path| o.join("snap/net_iter_90.safetensors");
    let reference = &outs[0];
    let ref_test = metrics(&reference.1.join("metrics.jsonl"))
        .into_iter()
        .rev()
        .find(|l| l["phase"] == "test")
        .unwrap();
    let acc = ref_test["accuracy"].as_f64().unwrap();
    let top5 = ref_test["accuracy_top5"].as_f64().unwrap();
    assert!(acc > 0.5 && top5 >= acc, "{ref_test}");
    for (name, out) in &outs[1..] {
        assert_bitwise_equal(&snap(&reference.1), &snap(out), name);
        let test = metrics(&out.join("metrics.jsonl"))
            .into_iter()
            .rev()
            .find(|l| l["phase"] == "test")
            .unwrap();
        assert_eq!(test, ref_test, "{name}");
    }
    // Nothing was written into the dataset's folders (no lock file).
    for db in [
        "digits_train_lmdb",
        "digits_test_lmdb",
        "digits_train_encoded_lmdb",
    ] {
        assert!(!Path::new(&caffe(db)).join("lock.mdb").exists(), "{db}");
    }
}

/// The digit PNGs through `random_resized_crop = 6` with mirroring: 1 replica × 8, 2 ranks × 4
/// and 1 rank × 2 replicas × 4 train the same weights (windows and flips keyed by position).
#[test]
fn resized_crops_and_flips_train_the_same_on_any_topology() {
    let data = format!(
        "format = \"image_list\"\nis_color = false\nroot_folder = \"{}\"\n\
         train_source = \"{}\"\ntest_source = \"{}\"\nrandom_resized_crop = 6\n\
         crop_area = [0.3, 1.0]\nmirror = true\nresize_shorter = 7\nmean_value = [30.0]",
        caffe("png"),
        caffe("png/train.txt"),
        caffe("png/test.txt")
    );
    let cfg = net(&data, 12);
    let one = train("rrc_np1_b8", &cfg, 1, &["data.batch_size=8"]);
    let two = train("rrc_np2_b4", &cfg, 2, &["data.batch_size=4"]);
    let threads = train(
        "rrc_np1_r2_b4",
        &cfg,
        1,
        &["data.batch_size=4", "cluster.replicas_per_rank=2"],
    );
    let snap = |o: &Path| o.join("snap/net_iter_12.safetensors");
    // The net's input is the 1×6×6 crop: pooled to 8×3×3 before the inner product.
    let shapes: Vec<Vec<usize>> = tensors(&snap(&one)).into_values().map(|t| t.0).collect();
    assert!(shapes.contains(&vec![10, 72]), "{shapes:?}");
    for (other, what) in [(&two, "2 ranks × 4"), (&threads, "2 replicas × 4")] {
        let diff = max_rel_diff(&snap(&one), &snap(other));
        assert!(diff < 2e-4, "1 × 8 and {what} differ by {diff:e}");
        assert_same_metrics(&one, other, what, &["accuracy", "accuracy_top5"], &[]);
    }
}

/// A list of good digit PNGs with five unreadable files among them.
fn corrupt_corpus(dir: &Path) -> (PathBuf, PathBuf) {
    let png = Path::new(&caffe("png/train")).to_path_buf();
    let jpeg = std::fs::read(repo("tests/data/jpeg/grey.jpg")).unwrap();
    let mut lines = Vec::new();
    for i in 0..40 {
        let name = format!("{i:05}.png");
        std::fs::copy(png.join(&name), dir.join(&name)).unwrap();
        lines.push(format!("{name} {}", i % 10));
    }
    // A 1×1 PNG whose header declares 12000 × 12000 pixels (a "PNG bomb").
    let mut bomb = std::fs::read(png.join("00000.png")).unwrap();
    bomb[16..24].copy_from_slice(&[0, 0, 0x2e, 0xe0, 0, 0, 0x2e, 0xe0]);
    let crc = crc32(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    let mut huge = jpeg.clone();
    let sof = huge.windows(2).position(|w| w == [0xff, 0xc0]).unwrap();
    huge[sof + 5..sof + 9].copy_from_slice(&[0xfd, 0xe8, 0xfd, 0xe8]);
    let bad: [(&str, Vec<u8>); 5] = [
        ("truncated.jpg", jpeg[..jpeg.len() / 2].to_vec()),
        ("wrong_magic.png", b"GIF89a not an image".to_vec()),
        ("empty.png", Vec::new()),
        ("huge.jpg", huge),
        ("bomb.png", bomb),
    ];
    for (k, (name, bytes)) in bad.iter().enumerate() {
        std::fs::write(dir.join(name), bytes).unwrap();
        lines.insert(5 + 7 * k, format!("{name} 1"));
    }
    let train = dir.join("train.txt");
    std::fs::write(&train, lines.join("\n")).unwrap();
    let test = dir.join("test.txt");
    std::fs::write(&test, lines[..5].join("\n")).unwrap();
    (train, test)
}

/// CRC-32 (PNG's).
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[test]
fn unreadable_images_stop_the_run_naming_them_or_are_skipped_and_counted() {
    let data = tempfile::tempdir().unwrap();
    let (train_list, test_list) = corrupt_corpus(data.path());
    let section = format!(
        "format = \"image_list\"\nis_color = false\nshuffle = false\n\
         train_source = \"{}\"\ntest_source = \"{}\"",
        train_list.display(),
        test_list.display()
    );
    let (dir, cfg) = config_dir("img_corrupt_stop", &net(&section, 9));
    let out = dir.join("out");
    // One rank: its first batch holds three bad files; the first in batch order is named.
    let o = mpi_p2ptrain(
        1,
        &[cfg.to_str().unwrap(), "--output", out.to_str().unwrap()],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("truncated.jpg") && t.contains("corrupt JPEG header: "),
        "{t}"
    );
    // 45 records in file order, 9 iterations of 2 × 20 = 8 epochs: each of the five bad files
    // read (and skipped) 8 times; the test list holds none.
    let out = train(
        "img_corrupt_skip",
        &net(&section, 9),
        2,
        &["data.on_corrupt=\"skip\""],
    );
    let last = metrics(&out.join("metrics.jsonl"))
        .into_iter()
        .rev()
        .find(|l| l["phase"] == "test")
        .unwrap();
    assert_eq!(last["skipped_records"], 40.0, "{last}");
}

#[test]
fn a_missing_file_a_label_out_of_range_and_a_folder_not_an_lmdb_are_named_before_training() {
    let data = tempfile::tempdir().unwrap();
    let png = PathBuf::from(caffe("png"));
    let list = |name: &str, body: &str| {
        let p = data.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let good = list("good.txt", "train/00000.png 0\ntrain/00001.png 1\n");
    let cases = [
        (
            "image_list",
            list("missing.txt", "train/00000.png 0\ntrain/nothing.png 1\n"),
            good.clone(),
            "line 2: no such image file",
        ),
        (
            "image_list",
            good.clone(),
            list("label.txt", "train/00000.png 0\ntrain/00001.png 12\n"),
            "label 12 is not below classes = 10",
        ),
        (
            "lmdb",
            data.path().display().to_string(),
            caffe("digits_test_lmdb"),
            "not an LMDB",
        ),
    ];
    for (k, (format, train_source, test_source, want)) in cases.iter().enumerate() {
        let root = match *format {
            "image_list" => format!("root_folder = \"{}\"\n", png.display()),
            _ => String::new(),
        };
        let section = format!(
            "format = \"{format}\"\nis_color = false\n{root}\
             train_source = \"{train_source}\"\ntest_source = \"{test_source}\""
        );
        let (dir, cfg) = config_dir(&format!("img_bad_{k}"), &net(&section, 2));
        let out = dir.join("out");
        let o = mpi_p2ptrain(
            2,
            &[cfg.to_str().unwrap(), "--output", out.to_str().unwrap()],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{want}: {t}");
        assert!(t.contains(want), "{want}: {t}");
        assert_absent(
            &out.join("metrics.jsonl"),
            &format!("{want}: nothing written"),
        );
    }
}

/// A folder of class folders holding baseline and progressive colour JPEGs, a grey JPEG and a
/// PNG trains with resized crops; the classes are the sorted folder names.
#[test]
fn an_image_folder_of_jpegs_and_pngs_trains_on_its_class_folders() {
    let data = tempfile::tempdir().unwrap();
    let jpeg = repo("tests/data/jpeg");
    for (split, class, file) in [
        ("train", "apple", "colour_baseline.jpg"),
        ("train", "apple", "colour_progressive.jpg"),
        ("train", "pear", "grey.jpg"),
        ("train", "pear", "colour_baseline.decoded.png"),
        ("val", "pear", "colour_progressive.jpg"),
        ("val", "apple", "grey.jpg"),
    ] {
        let dir = data.path().join(split).join(class);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(jpeg.join(file), dir.join(file)).unwrap();
    }
    let section = format!(
        "format = \"image_folder\"\ntrain_source = \"{0}/train\"\ntest_source = \"{0}/val\"\n\
         random_resized_crop = 16\nmirror = true\nmean_value = [104.0, 117.0, 123.0]",
        data.path().display()
    );
    let cfg = net(&section, 4);
    let out = train("img_folder", &cfg, 1, &["data.batch_size=2"]);
    // 3×16×16 crops, convolved to 8 channels and pooled to 8×8 before the inner product.
    let weights = tensors(&out.join("snap/net_iter_4.safetensors"));
    assert_eq!(weights["ip.weight"].0, vec![10, 8 * 8 * 8]);
    let test = metrics(&out.join("metrics.jsonl"))
        .into_iter()
        .rev()
        .find(|l| l["phase"] == "test")
        .unwrap();
    // Two test images: 0, 1 or 2 of them right.
    let acc = test["accuracy"].as_f64().unwrap();
    assert!([0.0, 0.5, 1.0].contains(&acc), "{test}");
    // config/resnet50_imagenet.toml validates on this folder: 3×224×224 crops into ResNet-50.
    let o = run(alone().args([
        "check",
        repo("config/resnet50_imagenet.toml").to_str().unwrap(),
        "--set",
        &format!("data.train_source=\"{}/train\"", data.path().display()),
        "--set",
        &format!("data.test_source=\"{}/val\"", data.path().display()),
    ]));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("random_resized_crop 224") && t.contains("accuracy_top5"),
        "{t}"
    );
}

/// `bench-data` checks and times a pipeline and prints its rates (no figure is asserted).
#[test]
fn bench_data_prints_the_rate_of_a_pipeline() {
    let data = format!(
        "format = \"image_list\"\nis_color = false\nroot_folder = \"{}\"\n\
         train_source = \"{}\"\ntest_source = \"{}\"\nrandom_resized_crop = 6\nmirror = true",
        caffe("png"),
        caffe("png/train.txt"),
        caffe("png/test.txt")
    );
    let (_, cfg) = config_dir("img_bench_data", &net(&data, 1));
    let o = run(alone().args([
        "bench-data",
        cfg.to_str().unwrap(),
        "--workers",
        "2",
        "--batches",
        "3",
    ]));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("60 images")
            && t.contains("on 2 workers")
            && t.contains("images per CPU-second"),
        "{t}"
    );
}
