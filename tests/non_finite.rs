//! Numbers that must not train on, through the real binary under `mpirun`: a non-finite loss or
//! gradient stops every rank at that iteration (exit 1, the last good snapshot kept, no snapshot
//! of non-finite weights) or, with `[solver] non_finite = "skip"`, skips that update on every
//! replica and counts it in `metrics.jsonl`; a NaN in `--weights` or in a `--resume` snapshot is
//! refused at load (exit 2, naming the tensor and the file); and ranks that read different data
//! at the same place are refused at start-up (exit 2, naming the file and the ranks).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The environment variable that makes one replica's loss NaN at one iteration (`RANK:ITER`).
const INJECT_NAN: &str = "P2PTRAIN_INJECT_NAN";

/// `p2ptrain` on the equivalence workload under `mpirun -np np`, writing into `dir`, with
/// `--set` overrides `sets` and the extra environment `env`.
fn train(np: usize, dir: &Path, sets: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = mpirun(np);
    for (k, v) in env {
        c.args(["-x", &format!("{k}={v}")]);
    }
    c.arg(bin())
        .args([&equivalence_config(), "--output", dir.to_str().unwrap()]);
    for s in sets {
        c.args(["--set", s]);
    }
    run(&mut c)
}

fn no_panic(all: &str) {
    assert!(!all.contains("panicked"), "a panic:\n{all}");
}

/// The weights snapshots in `dir/snapshots`, by file name.
fn snapshots(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Asserts that every weight of every snapshot in `dir` is finite.
fn every_snapshot_finite(dir: &Path) {
    for name in snapshots(dir) {
        for (tensor, (_, values)) in tensors(&dir.join("snapshots").join(&name)) {
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{name}: `{tensor}` holds non-finite weights"
            );
        }
    }
}

/// Writes a NaN over element `at` of tensor `name` of the safetensors file `path`, in place (the
/// header and its metadata unchanged).
fn poison(path: &Path, name: &str, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let (header, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let info = meta.info(name).unwrap_or_else(|| panic!("no `{name}`"));
    let start = 8 + header + info.data_offsets.0 + 4 * at;
    bytes[start..start + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_huge_learning_rate_stops_the_job_without_a_snapshot_of_non_finite_weights() {
    let dir = out_dir("non_finite_huge_lr");
    // No display: the look after each step finds it.
    let sets = [
        "solver.base_lr=1e38",
        "solver.max_iter=30",
        "solver.snapshot=0",
        "solver.display=0",
    ];
    let out = train(2, &dir, &sets, &[]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("not finite"), "the cause is named:\n{all}");
    assert!(all.contains("iteration"), "the iteration is named:\n{all}");
    assert!(!all.contains("accuracy 100.00%"), "{all}");
    assert!(
        !snapshots(&dir).contains(&"equiv_iter_30.safetensors".to_string()),
        "no final snapshot: {:?}",
        snapshots(&dir)
    );
    every_snapshot_finite(&dir);
    no_panic(&all);
}

#[test]
fn a_nan_loss_on_one_rank_stops_every_rank_at_that_iteration_keeping_the_last_snapshot() {
    let dir = out_dir("non_finite_stop");
    let out = train(
        2,
        &dir,
        &["solver.max_iter=30", "solver.snapshot=5"],
        &[(INJECT_NAN, "1:7")],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("iteration 7"),
        "the iteration is named:\n{all}"
    );
    assert!(all.contains("not finite"), "the cause is named:\n{all}");
    assert!(
        !all.contains("deadline"),
        "the ranks stopped together:\n{all}"
    );
    assert_eq!(
        snapshots(&dir),
        vec!["equiv_iter_5.safetensors".to_string()]
    );
    every_snapshot_finite(&dir);
    let trained: Vec<u64> = metrics(&dir.join("metrics.jsonl"))
        .iter()
        .filter(|m| m["phase"] == "train")
        .map(|m| m["iter"].as_u64().unwrap())
        .collect();
    assert!(
        trained.iter().all(|&i| i < 7),
        "trained past 7: {trained:?}"
    );
    no_panic(&all);
}

#[test]
fn skip_mode_skips_the_update_on_every_replica_and_counts_it() {
    let dir = out_dir("non_finite_skip");
    let out = train(
        2,
        &dir,
        &[
            "solver.max_iter=12",
            "solver.snapshot=1",
            "solver.non_finite=\"skip\"",
            "cluster.verify_interval=1",
        ],
        &[(INJECT_NAN, "1:7")],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let skips: Vec<u64> = metrics(&dir.join("metrics.jsonl"))
        .iter()
        .filter(|m| m["phase"] == "skip")
        .map(|m| m["iter"].as_u64().unwrap())
        .collect();
    assert_eq!(skips, vec![7], "one skipped update, at iteration 7:\n{all}");
    // Iteration 7's update was skipped: the weights after it are those before it.
    let snap = |n: u64| tensors(&dir.join(format!("snapshots/equiv_iter_{n}.safetensors")));
    assert_eq!(snap(7), snap(8), "the update of iteration 7 was applied");
    assert_ne!(snap(8), snap(9), "training went on after the skipped step");
    every_snapshot_finite(&dir);
    no_panic(&all);
}

#[test]
fn a_nan_in_weights_or_in_a_resume_snapshot_is_refused_naming_the_tensor_and_file() {
    let dir = out_dir("non_finite_load");
    ok(&train(1, &dir, &["solver.max_iter=2"], &[]));
    let snapshot = dir.join("snapshots/equiv_iter_2.safetensors");
    let weights = dir.join("nan.safetensors");
    std::fs::copy(&snapshot, &weights).unwrap();
    poison(&weights, "ip2.weight", 5);

    let mut c = mpirun(2);
    c.arg(bin()).args([
        &equivalence_config(),
        "--weights",
        weights.to_str().unwrap(),
        "--output",
        dir.join("from_weights").to_str().unwrap(),
    ]);
    let out = run(&mut c);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("ip2.weight"), "the tensor is named:\n{all}");
    assert!(
        all.contains(&weights.display().to_string()),
        "the file is named:\n{all}"
    );
    no_panic(&all);

    poison(&snapshot, "ip1.bias", 0);
    let mut c = mpirun(1);
    c.arg(bin()).args([
        &equivalence_config(),
        "--resume",
        "latest",
        "--output",
        dir.to_str().unwrap(),
        "--set",
        "solver.max_iter=4",
    ]);
    let out = run(&mut c);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("ip1.bias"), "the tensor is named:\n{all}");
    assert!(
        all.contains(&snapshot.display().to_string()),
        "the file is named:\n{all}"
    );
    no_panic(&all);
}

/// A config of the equivalence MLP reading CIFAR-10 batch files `train.bin` and `test.bin` next
/// to it (relative paths), written into `dir` with those files: `train_records` training records
/// generated from `seed`.
fn cifar_copy(dir: &Path, train_records: usize, seed: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("train.bin"),
        cifar10_records(train_records, 0, seed),
    )
    .unwrap();
    std::fs::write(dir.join("test.bin"), cifar10_records(16, 0, 99)).unwrap();
    let text = std::fs::read_to_string(equivalence_config())
        .unwrap()
        .replace(
            "format = \"digits\"",
            "format = \"cifar10\"\ntrain_files = [\"train.bin\"]\ntest_files = [\"test.bin\"]",
        );
    let cfg = dir.join("cfg.toml");
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// `p2ptrain check` with rank 0 reading config `a` and rank 1 config `b` (an MPMD launch).
fn check_two_configs(a: &Path, b: &Path, out: &Path) -> Output {
    let mut c = mpirun(1);
    c.arg(bin())
        .args([
            "check",
            a.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ])
        .args([":", "-np", "1"])
        .arg(bin())
        .args([
            "check",
            b.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]);
    run(&mut c)
}

#[test]
fn ranks_that_read_different_data_at_the_same_place_exit_2_naming_the_file_and_ranks() {
    let dir = out_dir("non_finite_data");
    let a = cifar_copy(&dir.join("a"), 64, 1);
    let same = cifar_copy(&dir.join("same"), 64, 1);
    // Identical copies in other directories: the job starts.
    ok(&check_two_configs(&a, &same, &dir.join("out")));

    for (what, records, seed) in [("fewer records", 48, 1), ("other content", 64, 2)] {
        let b = cifar_copy(&dir.join(format!("b_{records}_{seed}")), records, seed);
        let out = check_two_configs(&a, &b, &dir.join("out"));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{what}: {all}");
        assert!(
            all.contains("train.bin"),
            "{what}: the file is named:\n{all}"
        );
        assert!(all.contains("rank 1"), "{what}: the rank is named:\n{all}");
        assert!(
            !all.contains("test.bin"),
            "{what}: the test set agrees:\n{all}"
        );
        no_panic(&all);
    }
}
