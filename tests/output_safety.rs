//! The safety of a run's outputs, through the real binary under `mpirun`: `snapshot_keep` deletes
//! only the run's own snapshots (and, resumed, its lineage's); ranks that would start differently
//! (another snapshot, `--timeline` on one rank) are stopped before anything is written; a second
//! job into a busy output folder is refused naming the first; an unwritable snapshot location is
//! found before training; a usage error is printed once for the job.

mod common;

use common::{
    bin, config_dir, digits_mlp, mpirun, run, snapshot_iters, text, wait_for_training, with_sets,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

/// An MLP on the bundled digits (16 hidden units), snapshots under `snap/m`.
fn config() -> String {
    digits_mlp("", "max_iter = 40\ndisplay = 10\n", 16)
}
/// A fresh directory holding the config as `cfg.toml`.
fn setup(name: &str) -> (PathBuf, PathBuf) {
    config_dir(name, &config())
}

/// The arguments of one rank group: `p2ptrain cfg --output out --no-progress args...`.
fn rank_args(cfg: &Path, out: &Path, args: &[&str]) -> Vec<String> {
    let mut v = vec![
        bin().display().to_string(),
        cfg.display().to_string(),
        "--output".into(),
        out.display().to_string(),
        "--no-progress".into(),
    ];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

/// `mpirun -np np p2ptrain cfg --output out args...`.
fn train(np: usize, cfg: &Path, out: &Path, args: &[&str]) -> Output {
    let mut c = mpirun(np);
    c.args(rank_args(cfg, out, args));
    run(&mut c)
}

/// `mpirun -np 1 p2ptrain cfg --output a a_args... : -np 1 p2ptrain cfg --output b b_args...`:
/// two ranks launched with different command lines (node-local output folders).
fn train_mpmd(cfg: &Path, (a, a_args): (&Path, &[&str]), (b, b_args): (&Path, &[&str])) -> Output {
    let mut c = mpirun(1);
    c.args(rank_args(cfg, a, a_args))
        .args([":", "-np", "1"])
        .args(rank_args(cfg, b, b_args));
    run(&mut c)
}

fn ok(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
}

fn refused(out: &Output, wanted: &[&str]) -> String {
    let t = text(out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    for w in wanted {
        assert!(t.contains(w), "expected {w:?} in:\n{t}");
    }
    assert!(!t.contains("panicked"), "{t}");
    t
}

#[test]
fn snapshot_keep_deletes_only_the_runs_own_snapshots_and_a_resumed_run_prunes_its_lineage() {
    let (dir, cfg) = setup("output_safety_keep");
    let out = dir.join("out");
    // An earlier run's snapshots in the same folder, under the same prefix.
    let sets = |sets: &[&'static str]| with_sets(&[], sets);
    ok(&train(
        2,
        &cfg,
        &out,
        &sets(&["solver.max_iter=100", "solver.snapshot=50"]),
    ));
    assert_eq!(snapshot_iters(&out), [50, 100]);

    let keep = |max_iter| sets(&[max_iter, "solver.snapshot=10", "solver.snapshot_keep=2"]);
    let fresh = train(2, &cfg, &out, &keep("solver.max_iter=30"));
    ok(&fresh);
    assert_eq!(snapshot_iters(&out), [20, 30, 50, 100], "{}", text(&fresh));

    // Resumed from its own snapshot 30, the run goes on pruning its lineage (20 and 30 are its
    // own), never the earlier run's.
    let from = out.join("snap/m_iter_30.safetensors").display().to_string();
    let mut args = keep("solver.max_iter=45");
    args.extend(["--resume", &from]);
    ok(&train(2, &cfg, &out, &args));
    assert_eq!(snapshot_iters(&out), [40, 45, 50, 100]);
}

#[test]
fn ranks_that_find_different_snapshots_to_resume_are_stopped_before_writing_anything() {
    let (dir, cfg) = setup("output_safety_resume_agree");
    let (node_a, node_b) = (dir.join("nodeA"), dir.join("nodeB"));
    ok(&train(2, &cfg, &node_a, &["--set", "solver.max_iter=20"]));
    let metrics_a = std::fs::read(node_a.join("metrics.jsonl")).unwrap();
    std::fs::create_dir_all(&node_b).unwrap();

    // nodeA holds snapshot 20, nodeB nothing: one rank would resume, the other start fresh.
    let auto: &[&str] = &["--resume", "auto"];
    let out = train_mpmd(&cfg, (&node_a, auto), (&node_b, auto));
    let t = refused(
        &out,
        &["rank 0", "rank 1", "iteration 20", "no snapshot in"],
    );
    assert!(!t.contains("MPI_ABORT"), "{t}");
    assert!(!node_b.join("metrics.jsonl").exists());
    assert!(!node_b.join("snap").exists());
    assert_eq!(
        std::fs::read(node_a.join("metrics.jsonl")).unwrap(),
        metrics_a
    );
    assert_eq!(snapshot_iters(&node_a), [20]);

    // Both folders hold a snapshot, of different iterations.
    ok(&train(2, &cfg, &node_b, &["--set", "solver.max_iter=10"]));
    let latest: &[&str] = &["--resume", "latest"];
    let out = train_mpmd(&cfg, (&node_a, latest), (&node_b, latest));
    refused(&out, &["rank 0", "rank 1", "iteration 20", "iteration 10"]);
    assert_eq!(snapshot_iters(&node_a), [20]);
    assert_eq!(snapshot_iters(&node_b), [10]);
}

#[test]
fn a_timeline_asked_of_one_rank_only_is_refused_naming_each_ranks_options() {
    let (dir, cfg) = setup("output_safety_timeline");
    let out = dir.join("out");
    let trace = dir.join("trace.json").display().to_string();
    let result = train_mpmd(
        &cfg,
        (&out, &["--timeline", &trace]),
        (&out, &[] as &[&str]),
    );
    refused(
        &result,
        &["rank 0: ", "--timeline", "rank 1: ", "no --timeline"],
    );
    assert!(!out.join("metrics.jsonl").exists());
}

/// A long run (it trains until stopped) into `out` under `mpirun -np 1`.
fn spawn_endless(cfg: &Path, out: &Path) -> Child {
    let mut c = mpirun(1);
    let sets = [
        "solver.max_iter=100000000",
        "solver.display=1",
        "solver.sigint_effect=\"stop\"",
    ];
    c.args(rank_args(cfg, out, &with_sets(&[], &sets)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().expect("starting mpirun")
}

/// Stops the job with SIGTERM and waits for it.
fn stop(job: Child) -> Output {
    // SAFETY: a plain kill(2) of a process this test started.
    assert_eq!(
        unsafe { libc::kill(job.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let out = job.wait_with_output().expect("waiting for mpirun");
    eprintln!(
        "--- first job: exit {:?}\n{}",
        out.status.code(),
        text(&out)
    );
    out
}

#[test]
fn a_second_job_into_a_busy_output_folder_is_refused_naming_the_first() {
    let (dir, cfg) = setup("output_safety_lock");
    let out = dir.join("out");
    let mut first = spawn_endless(&cfg, &out);
    wait_for_training(&out, &mut first, Duration::from_secs(300));
    let second = train(2, &cfg, &out, &[]);
    stop(first);
    let t = refused(
        &second,
        &["in use by another job", "pid ", "host ", "started "],
    );
    assert_eq!(t.matches("in use by another job").count(), 1, "{t}");
    // The first job's log holds only whole lines.
    for line in std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
    {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("torn line {line:?}: {e}"));
    }
}

#[test]
fn a_lock_left_by_an_ended_job_does_not_block_the_next() {
    let (dir, cfg) = setup("output_safety_stale_lock");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join(".p2ptrain.lock"),
        "host gone, pid 999999, started 2020-01-01 00:00:00 UTC\n",
    )
    .unwrap();
    ok(&train(2, &cfg, &out, &["--set", "solver.max_iter=10"]));
    ok(&train(2, &cfg, &out, &["--set", "solver.max_iter=10"]));
}

#[test]
fn an_unwritable_snapshot_location_is_refused_before_the_first_iteration() {
    let (dir, cfg) = setup("output_safety_unwritable");
    // A name longer than the file system allows.
    let out = dir.join("long");
    let long = format!("solver.snapshot_prefix=\"{}\"", "m".repeat(300));
    let result = train(2, &cfg, &out, &["--set", &long]);
    refused(
        &result,
        &["solver.snapshot_prefix", "cannot write snapshots"],
    );
    assert!(!out.join("metrics.jsonl").exists());

    // A folder on a read-only file system.
    let out = dir.join("readonly");
    let ro = "solver.snapshot_prefix=\"/proc/p2ptrain-snapshots/m\"";
    let result = train(2, &cfg, &out, &["--set", ro]);
    refused(
        &result,
        &["solver.snapshot_prefix", "/proc/p2ptrain-snapshots"],
    );
    assert!(!out.join("metrics.jsonl").exists());
}

#[test]
fn a_usage_error_is_printed_once_for_the_job() {
    let (_, cfg) = setup("output_safety_usage");
    let mut c = mpirun(2);
    c.arg(bin()).arg(&cfg).arg("--output");
    let out = run(&mut c);
    let t = refused(&out, &["a value is required for '--output <DIR>'"]);
    assert_eq!(t.matches("a value is required").count(), 1, "{t}");

    // Launched with two command lines, the one that is wrong is still reported, once.
    let mut c = mpirun(1);
    c.arg(bin())
        .arg(&cfg)
        .args([":", "-np", "2"])
        .arg(bin())
        .arg(&cfg)
        .arg("--output");
    let out = run(&mut c);
    let t = text(&out);
    assert_ne!(out.status.code(), Some(0), "{t}");
    assert_eq!(t.matches("a value is required").count(), 1, "{t}");
}
