//! The convolutional nets through the real binary: the digits CNN trains to a stated accuracy
//! under `mpirun -np 2`; LeNet (on synthetic data) and cifar10_quick (on generated CIFAR-10 files)
//! pass `check` and train a few iterations; and a CNN with every spatial layer kind gives the
//! same weights for 2 replicas × batch b as for 1 replica × batch 2b.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// `p2ptrain args...` in one process.
fn p2ptrain(args: &[&str]) -> std::process::Output {
    run(alone().args(args))
}

/// The last test-phase line of a run's metrics.
fn last_test(dir: &Path) -> serde_json::Value {
    metrics(&dir.join("metrics.jsonl"))
        .into_iter()
        .rfind(|m| m["phase"] == "test")
        .expect("a test-phase metrics line")
}

#[test]
fn digits_cnn_trains_under_mpirun_beyond_95_5_percent() {
    let dir = out_dir("cnn_digits_np2");
    ok(&mpi_p2ptrain(
        2,
        &[
            "train",
            repo("config/digits_cnn.toml").to_str().unwrap(),
            "--output",
            dir.to_str().unwrap(),
        ],
    ));
    let test = last_test(&dir);
    assert_eq!(test["iter"], 2000);
    let acc = test["accuracy"].as_f64().unwrap();
    // 96.6% (287/297) with the seed of the config; the MLP quickstart reaches about 95%. The
    // bound leaves two test images for GEMM summation-order differences between machines.
    assert!(acc >= 0.955, "test accuracy {acc} below 0.955: {test}");

    // The snapshot's 4-D convolution weights load back: testing them before any step gives
    // the final test result again.
    let snapshot = dir.join("snapshots/digits_cnn_iter_2000.safetensors");
    let shapes = tensors(&snapshot);
    assert_eq!(shapes["conv1.weight"].0, vec![16, 1, 3, 3]);
    assert_eq!(shapes["conv2.weight"].0, vec![32, 16, 3, 3]);
    let again = out_dir("cnn_digits_weights");
    let config = repo("config/digits_cnn.toml");
    let mut args = train_args(
        &config,
        &again,
        &["solver.max_iter=1", "solver.test_initialization=true"],
    );
    args.extend(["--weights", snapshot.to_str().unwrap()]);
    ok(&p2ptrain(&args));
    let first = metrics(&again.join("metrics.jsonl"))
        .into_iter()
        .find(|m| m["phase"] == "test")
        .unwrap();
    assert_eq!(first["iter"], 0);
    assert_eq!(first["accuracy"], test["accuracy"], "{first} vs {test}");
    let (l0, l1) = (
        first["loss"].as_f64().unwrap(),
        test["loss"].as_f64().unwrap(),
    );
    assert!((l0 - l1).abs() < 1e-5 * l1.max(1.0), "{first} vs {test}");
}

/// `config/lenet.toml` with the IDX files replaced by synthetic MNIST-shaped records.
fn lenet_on_synthetic_data() -> PathBuf {
    let text = std::fs::read_to_string(repo("config/lenet.toml")).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("train_")
            || line.starts_with("test_images")
            || line.starts_with("test_labels")
        {
            continue;
        }
        if line.starts_with("format = \"idx\"") {
            out.push_str(
                "format = \"synthetic\"\nshape = [1, 28, 28]\ntrain_size = 640\ntest_size = 200\n",
            );
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    let dir = out_dir("cnn_lenet_config");
    let path = dir.join("lenet_synthetic.toml");
    std::fs::write(&path, out).unwrap();
    path
}

#[test]
fn lenet_names_the_missing_mnist_file_and_passes_check_on_synthetic_data() {
    let out = p2ptrain(&["check", repo("config/lenet.toml").to_str().unwrap()]);
    if repo("data/mnist/train-images-idx3-ubyte.gz").exists() {
        eprintln!("NOTE: data/mnist is present; checking lenet.toml against the real files");
        assert!(out.status.success(), "{}", text(&out));
    } else {
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let msg = text(&out);
        assert!(
            msg.contains("lenet.toml:16:1: `data.train_images`: file not found"),
            "{msg}"
        );
    }
    let config = lenet_on_synthetic_data();
    let out = p2ptrain(&["check", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let plan = text(&out);
    // conv1 20·1·5·5 + 20, conv2 50·20·5·5 + 50, ip1 500·800 + 500, ip2 10·500 + 10.
    assert!(plan.contains("parameters         431080"), "{plan}");
    let dir = out_dir("cnn_lenet_train");
    let sets = [
        "solver.max_iter=3",
        "solver.test_iter=1",
        "solver.snapshot=0",
    ];
    ok(&mpi_p2ptrain(2, &train_args(&config, &dir, &sets)));
    let loss = last_test(&dir)["loss"].as_f64().unwrap();
    assert!(loss.is_finite() && loss > 0.0, "test loss {loss}");
}

/// The shipped cifar10_quick config, pointed at generated CIFAR-10 files (the real ones are not
/// in the repository), passes `check` and trains with its own transform keys.
#[test]
fn cifar10_quick_passes_check_and_trains_a_few_iterations() {
    let config = repo("config/cifar10_quick.toml");
    let dir = out_dir("cnn_cifar_train");
    let [train_files, test_files] = cifar10_files(&dir.join("data"));
    let files = ["--set", &train_files, "--set", &test_files];
    let mut check = vec!["check", config.to_str().unwrap()];
    check.extend(files);
    let out = p2ptrain(&check);
    assert!(out.status.success(), "{}", text(&out));
    let plan = text(&out);
    // conv1 32·3·25 + 32, conv2 32·32·25 + 32, conv3 64·32·25 + 64, ip1 64·1024 + 64,
    // ip2 10·64 + 10: pool1 32→16, pool2 16→8, pool3 8→4 (Caffe's ceil rule).
    assert!(plan.contains("parameters         145578"), "{plan}");
    let mut train = train_args(
        &config,
        &dir,
        &[
            "solver.max_iter=2",
            "solver.test_iter=1",
            "solver.snapshot=0",
            "data.batch_size=8",
            "data.test_batch_size=8",
        ],
    );
    train.extend(files);
    ok(&p2ptrain(&train));
    let test = last_test(&dir);
    assert!(test["loss"].as_f64().unwrap().is_finite(), "{test}");
}

/// Without its data files the shipped config stops at once with exit code 2, naming the key and
/// the missing file.
#[test]
fn cifar10_quick_without_its_files_names_the_missing_one() {
    let config = repo("config/cifar10_quick.toml");
    let missing = out_dir("cnn_cifar_missing").join("nowhere/data_batch_1.bin");
    let set = format!("data.train_files=[{:?}]", missing.display().to_string());
    let out = p2ptrain(&["check", config.to_str().unwrap(), "--set", &set]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("data.train_files[0]") && t.contains("nowhere/data_batch_1.bin"),
        "{t}"
    );
}

/// Trains `tests/configs/cnn_equivalence.toml` with `np` processes of one replica each and a
/// per-replica batch of `batch`; returns the output directory.
fn train_equivalence(name: &str, np: usize, batch: usize) -> PathBuf {
    let dir = out_dir(name);
    let config = repo("tests/configs/cnn_equivalence.toml");
    let batch = format!("data.batch_size={batch}");
    let out = train_to(np, &config, &dir, &with_sets(&[], &[&batch]));
    assert!(out.status.success(), "{name} failed:\n{}", text(&out));
    dir
}

fn snapshot(dir: &Path) -> PathBuf {
    dir.join("snapshots/cnn_equiv_iter_30.safetensors")
}

#[test]
fn cnn_two_replicas_match_one_replica_with_twice_the_batch() {
    let reference = train_equivalence("cnn_equiv_np1_b32", 1, 32);
    let split = train_equivalence("cnn_equiv_np2_b16", 2, 16);
    let diff = max_rel_diff(&snapshot(&reference), &snapshot(&split));
    assert!(diff < 2e-4, "weights differ by {diff:e} (relative)");
    let (a, b) = (
        metrics(&reference.join("metrics.jsonl")),
        metrics(&split.join("metrics.jsonl")),
    );
    assert_eq!(a.len(), b.len(), "metrics lines");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((&x["iter"], &x["phase"]), (&y["iter"], &y["phase"]));
        let (lx, ly) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!(
            (lx - ly).abs() < 2e-4 * lx.abs().max(1.0),
            "loss {x} vs {y}"
        );
        if x["phase"] == "test" {
            assert_eq!(x["accuracy"], y["accuracy"], "test accuracy");
        }
    }
    // The comparison can fail: half the global batch gives other weights.
    let half = train_equivalence("cnn_equiv_np2_b8", 2, 8);
    let control = max_rel_diff(&snapshot(&reference), &snapshot(&half));
    assert!(
        control > 1e-3,
        "half the global batch should differ ({control:e})"
    );
}
