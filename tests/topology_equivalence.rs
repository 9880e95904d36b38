//! The central promise, under the real launcher: N replicas × batch b train to the same weights,
//! losses and test accuracy as 1 replica × batch N·b, whatever the split into processes and
//! threads (float tolerance), for several update rules.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// A run: processes, replicas per process, per-replica batch, extra `--set`s.
struct Topology {
    np: usize,
    replicas: usize,
    batch: usize,
    sets: Vec<String>,
}

fn topo(np: usize, replicas: usize, batch: usize) -> Topology {
    Topology {
        np,
        replicas,
        batch,
        sets: vec![],
    }
}

/// Trains `tests/configs/equivalence.toml` with `topology` and `sets`; returns the output dir.
fn train(name: &str, t: &Topology, sets: &[&str]) -> PathBuf {
    let dir = out_dir(name);
    let config = repo("tests/configs/equivalence.toml");
    let mut args: Vec<String> = vec![
        "train".into(),
        config.display().to_string(),
        "--output".into(),
        dir.display().to_string(),
        "--set".into(),
        format!("data.batch_size={}", t.batch),
        "--set".into(),
        format!("cluster.replicas_per_rank={}", t.replicas),
    ];
    for s in sets
        .iter()
        .map(|s| s.to_string())
        .chain(t.sets.iter().cloned())
    {
        args.push("--set".into());
        args.push(s);
    }
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = mpi_p2ptrain(t.np, &args);
    assert!(out.status.success(), "{name} failed:\n{}", text(&out));
    dir
}

fn final_snapshot(dir: &Path) -> PathBuf {
    dir.join("snapshots/equiv_iter_30.safetensors")
}

/// Asserts that every run matches the reference: weights, per-iteration losses, test metrics.
fn assert_equivalent(reference: &Path, other: &Path, what: &str) {
    let diff = max_rel_diff(&final_snapshot(reference), &final_snapshot(other));
    assert!(diff < 2e-4, "{what}: weights differ by {diff:e} (relative)");
    let a = assert_same_metrics(
        reference,
        other,
        what,
        &["accuracy", "accuracy_top3"],
        &["lr"],
    );
    let tests = a.iter().filter(|x| x["phase"] == "test").count();
    assert_eq!(tests, 2, "tests at iterations 15 and 30");
}

fn check_all(prefix: &str, sets: &[&str], topologies: &[Topology]) {
    let reference = train(&format!("{prefix}_reference"), &topo(1, 1, 32), sets);
    for t in topologies {
        let name = format!("{prefix}_np{}_r{}_b{}", t.np, t.replicas, t.batch);
        let dir = train(&name, t, sets);
        assert_equivalent(&reference, &dir, &name);
    }
}

#[test]
fn sgd_momentum_four_replicas_in_every_layout_match_one_replica_with_four_times_the_batch() {
    check_all("sgd", &[], &[topo(4, 1, 8), topo(2, 2, 8), topo(1, 4, 8)]);
}

#[test]
fn iter_size_accumulation_matches_the_same_global_batch() {
    let mut t = topo(2, 1, 8);
    t.sets.push("solver.iter_size=2".into());
    check_all("itersize", &[], &[t]);
}

#[test]
fn adam_with_clipping_and_nesterov_match_across_layouts() {
    check_all(
        "adam",
        &[
            "solver.type=\"adam\"",
            "solver.base_lr=0.01",
            "solver.momentum=0.9",
            "solver.clip_gradients=0.5",
        ],
        &[topo(2, 2, 8)],
    );
    check_all("nesterov", &["solver.type=\"nesterov\""], &[topo(2, 2, 8)]);
}

#[test]
fn a_different_topology_really_changes_the_weights_when_the_global_batch_differs() {
    // The comparison above can fail: the same layouts with half the global batch diverge.
    let reference = train("control_reference", &topo(1, 1, 32), &[]);
    let other = train("control_half_batch", &topo(2, 1, 8), &[]);
    let diff = max_rel_diff(&final_snapshot(&reference), &final_snapshot(&other));
    assert!(
        diff > 1e-3,
        "a different global batch should change the weights (diff {diff:e})"
    );
}
