//! CIFAR-10 binary batches through the real binary under `mpirun`: training with Caffe's
//! transform keys (crop, mirror, per-channel mean) on files generated here, the same weights
//! from 1 replica × batch 8 and 2 replicas × batch 4 (crops and flips keyed by stream position),
//! bad files reported with exit code 2, naming the file, and Caffe's per-pixel mean image
//! (`p2ptrain compute-mean`, `data.mean_file`).

mod common;

use common::config_text::{accuracy, linear_classifier};
use common::*;
use p2ptrain::data::mean_file::{self, MeanImage};
use std::path::{Path, PathBuf};

const RECORD: usize = CIFAR10_RECORD;

/// Writes `data_batch_1.bin`, `data_batch_2.bin` and `test_batch.bin` and a config reading them
/// by relative paths; returns the config's path.
fn dataset(dir: &Path, extra_data: &str) -> PathBuf {
    std::fs::write(dir.join("data_batch_1.bin"), cifar10_records(40, 0, 1)).unwrap();
    std::fs::write(dir.join("data_batch_2.bin"), cifar10_records(24, 3, 2)).unwrap();
    std::fs::write(dir.join("test_batch.bin"), cifar10_records(30, 0, 3)).unwrap();
    let cfg = format!(
        r#"[data]
format = "cifar10"
train_files = ["data_batch_1.bin", "data_batch_2.bin"]
test_files = ["test_batch.bin"]
batch_size = 8
crop_size = 28
mirror = true
mean_value = [100.0, 110.0, 120.0]
scale = 0.0125
{extra_data}

[solver]
base_lr = 0.05
momentum = 0.9
max_iter = 6
display = 1
test_interval = 3
snapshot_prefix = "snapshots/cifar"
random_seed = 5

{classifier}
{accuracy}"#,
        classifier = linear_classifier(
            "data",
            10,
            "weight_filler = { type = \"gaussian\", std = 0.01 }\n"
        ),
        accuracy = accuracy("ip"),
    );
    let path = dir.join("cifar.toml");
    std::fs::write(&path, cfg).unwrap();
    path
}

fn train(np: usize, batch: usize, name: &str) -> PathBuf {
    let data = tempfile::tempdir().unwrap();
    let cfg = dataset(data.path(), "");
    let out = out_dir(name);
    let batch = format!("data.batch_size={batch}");
    let o = train_to(np, &cfg, &out, &with_sets(&[], &[&batch]));
    assert!(o.status.success(), "{}", text(&o));
    out
}

#[test]
fn trains_on_cifar10_files_with_crop_mirror_and_means_the_same_on_any_topology() {
    let one = train(1, 8, "cifar_np1_b8");
    let two = train(2, 4, "cifar_np2_b4");
    let m = metrics(&one.join("metrics.jsonl"));
    let train_lines: Vec<_> = m.iter().filter(|l| l["phase"] == "train").collect();
    assert_eq!(train_lines.len(), 6);
    for l in &train_lines {
        assert!(l["loss"].as_f64().unwrap().is_finite(), "{l}");
    }
    let test = m.iter().rev().find(|l| l["phase"] == "test").unwrap();
    let acc = test["accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc), "{test}");
    // The net's input is the 3×28×28 crop: the inner product has 10 × 2352 weights.
    let weights = tensors(&one.join("snapshots/cifar_iter_6.safetensors"));
    let shapes: Vec<&Vec<usize>> = weights.values().map(|(s, _)| s).collect();
    assert!(shapes.contains(&&vec![10, 3 * 28 * 28]), "{shapes:?}");
    // Crops and flips depend on the sample's stream position only.
    let diff = max_rel_diff(
        &one.join("snapshots/cifar_iter_6.safetensors"),
        &two.join("snapshots/cifar_iter_6.safetensors"),
    );
    assert!(diff < 2e-4, "1×8 and 2×4 differ by {diff:e}");
    let (a, b) = (
        metrics(&one.join("metrics.jsonl")),
        metrics(&two.join("metrics.jsonl")),
    );
    for (x, y) in a.iter().zip(&b).filter(|(x, _)| x["phase"] == "test") {
        assert_eq!(x["accuracy"], y["accuracy"]);
    }
}

#[test]
fn a_truncated_cifar10_file_exits_2_naming_it() {
    let data = tempfile::tempdir().unwrap();
    let cfg = dataset(data.path(), "");
    let full = std::fs::read(data.path().join("data_batch_2.bin")).unwrap();
    std::fs::write(
        data.path().join("data_batch_2.bin"),
        &full[..full.len() - 100],
    )
    .unwrap();
    let out = mpi_p2ptrain(2, &[cfg.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("data_batch_2.bin")
            && t.contains("data.train_files[1]")
            && t.contains("not a positive multiple of the CIFAR-10 record size 3073"),
        "{t}"
    );
    assert_eq!(
        t.matches("p2ptrain: rank").count(),
        1,
        "reported once:\n{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}

#[test]
fn a_bad_cifar10_label_exits_2_naming_the_file_and_record() {
    let data = tempfile::tempdir().unwrap();
    let cfg = dataset(data.path(), "");
    let path = data.path().join("test_batch.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[17 * RECORD] = 12;
    std::fs::write(&path, bytes).unwrap();
    let out = mpi_p2ptrain(2, &[cfg.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("test_batch.bin") && t.contains("label 12 of record 17"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}

/// The config of [`dataset`] with `mean_file = "mean.binaryproto"` in place of `mean_value`.
fn with_mean_file(cfg: &Path) -> PathBuf {
    let text = std::fs::read_to_string(cfg).unwrap();
    let changed = text.replace(
        "mean_value = [100.0, 110.0, 120.0]\n",
        "mean_file = \"mean.binaryproto\"\n",
    );
    assert_ne!(
        changed, text,
        "the config has the mean_value line as expected"
    );
    let path = cfg.with_file_name("cifar_mean_file.toml");
    std::fs::write(&path, changed).unwrap();
    path
}

#[test]
fn compute_mean_writes_the_pixel_means_of_the_training_files() {
    let data = tempfile::tempdir().unwrap();
    // The config names a mean file that does not exist yet: compute-mean does not read it.
    let cfg = with_mean_file(&dataset(data.path(), ""));
    let mean = data.path().join("mean.binaryproto");
    let out = compute_mean(&cfg, &mean);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("mean image 3×32×32 of 64 training records"),
        "{t}"
    );
    // The mean of every pixel over the 64 records of both training files, from their bytes.
    let mut sums = vec![0f64; RECORD - 1];
    for file in ["data_batch_1.bin", "data_batch_2.bin"] {
        for record in std::fs::read(data.path().join(file))
            .unwrap()
            .chunks(RECORD)
        {
            for (s, &p) in sums.iter_mut().zip(&record[1..]) {
                *s += f64::from(p);
            }
        }
    }
    let want: Vec<f32> = sums.iter().map(|s| (s / 64.0) as f32).collect();
    let image = mean_file::read(&mean).unwrap();
    assert_eq!(image.shape, [3, 32, 32]);
    assert_eq!(image.data, want);
}

#[test]
fn a_mean_image_of_channel_means_trains_as_mean_value_does() {
    // The same per-channel means as a mean image: the same inputs, so bit-identical weights.
    let data = tempfile::tempdir().unwrap();
    let cfg = with_mean_file(&dataset(data.path(), ""));
    let image = MeanImage {
        shape: [3, 32, 32],
        data: [100.0, 110.0, 120.0]
            .iter()
            .flat_map(|&m| std::iter::repeat_n(m, 32 * 32))
            .collect(),
    };
    mean_file::write(&data.path().join("mean.binaryproto"), &image).unwrap();
    let out = out_dir("cifar_mean_file_np2_b4");
    ok(&mpi_p2ptrain(
        2,
        &train_args(&cfg, &out, &["data.batch_size=4"]),
    ));
    let reference = train(2, 4, "cifar_mean_value_np2_b4");
    let snapshot = "snapshots/cifar_iter_6.safetensors";
    assert_eq!(
        tensors(&out.join(snapshot)),
        tensors(&reference.join(snapshot)),
        "mean_file and mean_value runs differ"
    );
}

#[test]
fn a_mean_file_of_another_shape_or_missing_exits_2_naming_it() {
    let data = tempfile::tempdir().unwrap();
    let cfg = with_mean_file(&dataset(data.path(), ""));
    let cfg = cfg.to_str().unwrap();
    let out = mpi_p2ptrain(2, &[cfg, "--no-progress"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    let missing = data.path().join("mean.binaryproto");
    for want in [missing.to_str().unwrap(), "`data.mean_file`", "cannot read"] {
        assert!(t.contains(want), "missing {want:?} in:\n{t}");
    }
    let small = MeanImage {
        shape: [1, 8, 8],
        data: vec![0.0; 64],
    };
    mean_file::write(&missing, &small).unwrap();
    let out = mpi_p2ptrain(2, &[cfg, "--no-progress"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains(
            "mean.binaryproto: `data.mean_file`: the image is 1×8×8, the records are 3×32×32"
        ),
        "{t}"
    );
    assert_eq!(
        t.matches("p2ptrain: rank").count(),
        1,
        "reported once:\n{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}
