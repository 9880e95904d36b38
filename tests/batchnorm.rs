//! Dropout and `sync = true` BatchNorm under the real launcher: N replicas × batch b train to the
//! same weights, running statistics and per-iteration losses as 1 replica × batch N·b, whether
//! the replicas are processes (np 2) or threads of one process (replicas_per_rank = 2); and a
//! control showing that without `sync` the per-replica statistics make np 2 differ.

mod common;

use common::*;
use std::path::{Path, PathBuf};

const CONFIG: &str = "tests/configs/bn_equivalence.toml";
/// Indices of the BatchNorm layers (`sync = true` in the config).
const BN_LAYERS: &[usize] = &[1, 6];

/// Trains the config with `np` processes × `replicas` threads × `batch`; returns the output dir.
fn train(name: &str, np: usize, replicas: usize, batch: usize, sets: &[String]) -> PathBuf {
    let dir = out_dir(name);
    let mut args: Vec<String> = vec![
        "train".into(),
        repo(CONFIG).display().to_string(),
        "--output".into(),
        dir.display().to_string(),
        "--set".into(),
        format!("data.batch_size={batch}"),
        "--set".into(),
        format!("cluster.replicas_per_rank={replicas}"),
    ];
    for s in sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = mpi_p2ptrain(np, &args);
    assert!(out.status.success(), "{name} failed:\n{}", text(&out));
    dir
}

fn final_snapshot(dir: &Path) -> PathBuf {
    dir.join("snapshots/bn_iter_20.safetensors")
}

fn no_sync() -> Vec<String> {
    BN_LAYERS
        .iter()
        .map(|i| format!("layer[{i}].sync=false"))
        .collect()
}

/// Weights and running statistics within 2e-4 (relative), same per-iteration losses and test
/// accuracy. Returns the worst weight difference.
fn assert_equivalent(reference: &Path, other: &Path, what: &str) {
    let snap = tensors(&final_snapshot(reference));
    for name in [
        "bn1.mean",
        "bn1.variance",
        "bn1.factor",
        "bn2.mean",
        "bn2.variance",
    ] {
        let (_, v) = &snap[name];
        assert!(
            v.iter().any(|&x| x != 0.0),
            "{what}: {name} never moved from 0"
        );
    }
    let diff = max_rel_diff(&final_snapshot(reference), &final_snapshot(other));
    eprintln!("{what}: largest relative difference of weights and statistics {diff:e}");
    assert!(
        diff < 2e-4,
        "{what}: weights or running statistics differ by {diff:e} (relative)"
    );
    let a = assert_same_metrics(reference, other, what, &["accuracy"], &[]);
    assert_eq!(a.iter().filter(|x| x["phase"] == "test").count(), 2);
}

#[test]
fn sync_batch_norm_and_dropout_match_across_processes_and_threads() {
    let reference = train("bn_np1_r1_b16", 1, 1, 16, &[]);
    let processes = train("bn_np2_r1_b8", 2, 1, 8, &[]);
    assert_equivalent(&reference, &processes, "np 2 × batch 8");
    let threads = train("bn_np1_r2_b8", 1, 2, 8, &[]);
    assert_equivalent(&reference, &threads, "np 1 × 2 replicas × batch 8");
    // Processes and threads sum the per-replica statistics in the same rank order.
    assert_eq!(
        tensors(&final_snapshot(&processes)),
        tensors(&final_snapshot(&threads)),
        "np 2 and 2 threads should agree bit for bit"
    );
}

#[test]
fn without_sync_two_processes_normalise_per_replica_and_differ() {
    let reference = train("nosync_np1_r1_b16", 1, 1, 16, &no_sync());
    let split = train("nosync_np2_r1_b8", 2, 1, 8, &no_sync());
    let diff = max_rel_diff(&final_snapshot(&reference), &final_snapshot(&split));
    eprintln!("without sync, np 2 × 8 against np 1 × 16: {diff:e}");
    assert!(
        diff > 1e-3,
        "per-replica statistics should change the training (diff {diff:e})"
    );
}

/// The shipped ResNet configs pass `p2ptrain check` (ResNet-20 pointed at generated CIFAR-10
/// files); ResNet-20 trains a few iterations on the CPU, with its translations and flips, with two
/// processes (sync BatchNorm over MPI), with finite losses and running statistics that
/// moved as often as the formula says.
#[test]
fn resnet_configs_check_and_resnet20_trains_on_the_cpu() {
    let dir = out_dir("resnet20_cpu");
    let [train_files, test_files] = cifar10_files(&dir.join("data"));
    for (config, sets) in [
        (
            "config/resnet20.toml",
            vec![train_files.as_str(), test_files.as_str()],
        ),
        ("config/resnet50.toml", vec![]),
    ] {
        let mut check = alone();
        check.arg("check").arg(repo(config));
        for s in sets {
            check.args(["--set", s]);
        }
        let out = run(&mut check);
        assert!(out.status.success(), "{config}:\n{}", text(&out));
    }
    let sets = [
        train_files.as_str(),
        test_files.as_str(),
        "data.batch_size=4",
        "solver.max_iter=3",
        "solver.display=1",
        "solver.test_interval=0",
        "cluster.backend=\"cpu\"",
    ];
    let mut args = vec![
        "train".to_string(),
        repo("config/resnet20.toml").display().to_string(),
        "--output".into(),
        dir.display().to_string(),
    ];
    for s in sets {
        args.push("--set".into());
        args.push(s.into());
    }
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = mpi_p2ptrain(2, &args);
    assert!(out.status.success(), "resnet20:\n{}", text(&out));
    let lines = metrics(&dir.join("metrics.jsonl"));
    let train: Vec<f64> = lines
        .iter()
        .filter(|l| l["phase"] == "train")
        .map(|l| l["loss"].as_f64().unwrap())
        .collect();
    assert_eq!(train.len(), 3, "{lines:?}");
    assert!(train.iter().all(|l| l.is_finite() && *l > 0.0), "{train:?}");
    let snap = tensors(&dir.join("snapshots/resnet20_iter_3.safetensors"));
    let (shape, factor) = &snap["bn4c_branch2b.factor"];
    assert_eq!(shape, &vec![1]);
    // Three train passes with maf 0.999: 1, 1.999, 2.997001.
    assert!((factor[0] - 2.997001).abs() < 1e-5, "factor {factor:?}");
    let (shape, var) = &snap["bn_conv1.variance"];
    assert_eq!(shape, &vec![16]);
    assert!(var.iter().all(|&v| v > 0.0), "{var:?}");
}
