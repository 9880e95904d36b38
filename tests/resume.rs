//! Resume, signals and replica consistency checks through the real binary under `mpirun`:
//! a run stopped at iteration K and resumed to M ends with the bytes of a straight run to M
//! (SGD with momentum, Adam), also across topologies with the same global batch; refused resumes
//! (global batch, config, corrupt file, no snapshot) exit 2 naming what is wrong; SIGUSR1 and
//! SIGTERM reach every rank at one agreed iteration; `verify_interval` names a perturbed replica.

mod common;

use common::{
    bin, config_dir, digits_mlp, kill, max_rel_diff, mpirun, ok, ranks_of, refused, run,
    snapshot_iters, tensors, text, train_to as train, wait_for_training, with_sets,
};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// An MLP on the bundled digits with augmentation and smoothing, so that the data position,
/// the augmentation keys and the loss window all matter.
fn config() -> String {
    digits_mlp(
        "shift = 1\n",
        "lr_policy = \"step\"\ngamma = 0.5\nstepsize = 15\nmax_iter = 40\ndisplay = 5\naverage_loss = 4\n",
        32,
    )
}
/// A fresh directory holding the config as `cfg.toml`.
fn setup(name: &str) -> (PathBuf, PathBuf) {
    config_dir(name, &config())
}

fn weights(out: &Path, iter: u64) -> PathBuf {
    out.join(format!("snap/m_iter_{iter}.safetensors"))
}

fn state(out: &Path, iter: u64) -> PathBuf {
    out.join(format!("snap/m_iter_{iter}.solverstate"))
}

/// Every weight and every solver-history float of snapshot `iter` is bit-identical in `a` and
/// `b` (the files' bytes may differ only in the order of their metadata, which safetensors
/// writes from a hash map).
fn assert_identical(a: &Path, b: &Path, iter: u64) {
    let (wa, wb) = (weights(a, iter), weights(b, iter));
    let bits = |p: &Path| -> Vec<(String, Vec<usize>, Vec<u32>)> {
        tensors(p)
            .into_iter()
            .map(|(n, (shape, v))| (n, shape, v.iter().map(|x| x.to_bits()).collect()))
            .collect()
    };
    assert!(
        bits(&wa) == bits(&wb),
        "{} and {} differ (max relative difference {:e})",
        wa.display(),
        wb.display(),
        max_rel_diff(&wa, &wb)
    );
    assert!(!bits(&wa).is_empty());
    assert!(
        bits(&state(a, iter)) == bits(&state(b, iter)),
        "solver histories of iteration {iter} differ"
    );
}

/// Runs straight to 40 and stopped at 20 (max_iter overridden) then resumed to 40 with
/// `--resume latest`; returns both output directories.
fn straight_and_resumed(name: &str, np: usize, sets: &[&str]) -> (PathBuf, PathBuf) {
    let (dir, cfg) = setup(name);
    let set_args = with_sets(&[], sets);
    let (a, b) = (dir.join("straight"), dir.join("resumed"));
    ok(&train(np, &cfg, &a, &set_args));
    ok(&train(
        np,
        &cfg,
        &b,
        &with_sets(&set_args, &["solver.max_iter=20"]),
    ));
    assert!(state(&b, 20).is_file());
    train_resuming(
        np,
        &cfg,
        &b,
        &[&set_args[..], &["--resume", "latest"]].concat(),
    );
    (a, b)
}

/// Trains `cfg` on `np` ranks into `out` with `args`, asserting that the run resumed and
/// succeeded.
fn train_resuming(np: usize, cfg: &Path, out: &Path, args: &[&str]) {
    let run = train(np, cfg, out, args);
    ok(&run);
    assert!(text(&run).contains("resuming from"), "{}", text(&run));
}

#[test]
fn resumed_sgd_momentum_run_is_bit_identical_to_a_straight_run() {
    let (a, b) = straight_and_resumed("resume_sgd", 2, &[]);
    assert_identical(&a, &b, 40);
    // The displayed loss after the resume (smoothed over 4 iterations) matches too.
    let (ma, mb) = (
        common::metrics(&a.join("metrics.jsonl")),
        common::metrics(&b.join("metrics.jsonl")),
    );
    let after = |m: &[serde_json::Value]| -> Vec<(u64, f64)> {
        m.iter()
            .filter(|x| x["phase"] == "train" && x["iter"].as_u64().unwrap() > 20)
            .map(|x| (x["iter"].as_u64().unwrap(), x["loss"].as_f64().unwrap()))
            .collect()
    };
    let (la, lb) = (after(&ma), after(&mb));
    assert_eq!(la.len(), 3, "display lines at 25, 30, 35");
    for ((i, x), (j, y)) in la.iter().zip(&lb) {
        assert_eq!(i, j);
        assert!((x - y).abs() <= 1e-12 * x.abs(), "loss at {i}: {x} vs {y}");
    }
}

#[test]
fn resumed_adam_run_with_iter_size_is_bit_identical_to_a_straight_run() {
    let (a, b) = straight_and_resumed(
        "resume_adam",
        2,
        &[
            "solver.type=\"adam\"",
            "solver.base_lr=0.01",
            "solver.iter_size=2",
            "solver.clip_gradients=1.0",
        ],
    );
    assert_identical(&a, &b, 40);
    assert!(tensors(&state(&a, 40)).contains_key("v/ip1.weight"));
}

/// A straight 40-iteration run that also snapshots at 20, and a run resumed from that snapshot
/// with the same config (so the same `max_iter`, which the cosine schedule depends on).
fn straight_and_resumed_from_its_snapshot(
    name: &str,
    np: usize,
    sets: &[&str],
) -> (PathBuf, PathBuf) {
    let (dir, cfg) = setup(name);
    let args = with_sets(&with_sets(&[], sets), &["solver.snapshot=20"]);
    let (a, b) = (dir.join("straight"), dir.join("resumed"));
    ok(&train(np, &cfg, &a, &args));
    let from = state(&a, 20).display().to_string();
    train_resuming(
        np,
        &cfg,
        &b,
        &[&args[..], &["--resume", from.as_str()]].concat(),
    );
    (a, b)
}

#[test]
fn resumed_adamw_cosine_warmup_and_adadelta_runs_are_bit_identical_to_straight_runs() {
    let (a, b) = straight_and_resumed_from_its_snapshot(
        "resume_adamw",
        2,
        &[
            "solver.type=\"adamw\"",
            "solver.base_lr=0.01",
            "solver.weight_decay=0.01",
            "solver.lr_policy=\"cosine\"",
            "solver.warmup_iter=25",
        ],
    );
    assert_identical(&a, &b, 40);
    assert!(tensors(&state(&a, 40)).contains_key("m/ip1.weight"));
    let (a, b) = straight_and_resumed(
        "resume_adadelta",
        1,
        &[
            "solver.type=\"adadelta\"",
            "solver.base_lr=1.0",
            "solver.momentum=0.95",
            "solver.delta=1e-6",
        ],
    );
    assert_identical(&a, &b, 40);
    assert!(tensors(&state(&a, 40)).contains_key("u/ip1.weight"));
}

#[test]
fn resume_on_another_topology_with_the_same_global_batch() {
    // np 4 × 1 replica to iteration 20, then np 2 × 2 replicas to 40, against np 4 straight.
    let (dir, cfg) = setup("resume_topology");
    let (a, b) = (dir.join("straight"), dir.join("resumed"));
    ok(&train(4, &cfg, &a, &[] as &[&str]));
    ok(&train(4, &cfg, &b, &["--set", "solver.max_iter=20"]));
    let out = train(
        2,
        &cfg,
        &b,
        &["--set", "cluster.replicas_per_rank=2", "--resume", "latest"],
    );
    ok(&out);
    // The gradient average is summed in another order (threads, then MPI): equal within the
    // tolerance of tests/topology_equivalence.rs, not bit for bit.
    let diff = max_rel_diff(&weights(&a, 40), &weights(&b, 40));
    assert!(diff < 2e-4, "weights differ by {diff:e} (relative)");
    eprintln!("np 4 -> np 2 x 2 resume: max relative difference {diff:e}");
}

#[test]
fn resume_refuses_another_global_batch_unless_allowed() {
    let (dir, cfg) = setup("resume_batch");
    let out_dir = dir.join("o");
    ok(&train(2, &cfg, &out_dir, &["--set", "solver.max_iter=20"]));
    let out = train(
        2,
        &cfg,
        &out_dir,
        &["--set", "data.batch_size=16", "--resume", "latest"],
    );
    refused(
        &out,
        &[
            "m_iter_20.solverstate",
            "global batch 16 (batch_size 8 × 2 replicas × iter_size 1) in the snapshot",
            "32 (batch_size 16 × 2 replicas × iter_size 1) in this run",
            "--allow-batch-change",
        ],
    );
    let out = train(
        2,
        &cfg,
        &out_dir,
        &[
            "--set",
            "data.batch_size=16",
            "--resume",
            "latest",
            "--allow-batch-change",
        ],
    );
    ok(&out);
    assert!(weights(&out_dir, 40).is_file());
}

#[test]
fn resume_refuses_a_snapshot_of_another_config_but_allows_free_keys() {
    let (dir, cfg) = setup("resume_config");
    let o = dir.join("o");
    ok(&train(2, &cfg, &o, &["--set", "solver.max_iter=20"]));
    let snap = weights(&o, 20);
    let snap = snap.to_str().unwrap();
    let out = train(
        2,
        &cfg,
        &o,
        &["--set", "solver.base_lr=0.1", "--resume", snap],
    );
    refused(
        &out,
        &["m_iter_20.solverstate", "another config", "solver.base_lr"],
    );
    let out = train(
        2,
        &cfg,
        &o,
        &["--set", "layer.0.num_output=16", "--resume", snap],
    );
    refused(&out, &["another config", "layer[0].num_output"]);
    // max_iter, display and snapshot settings may change.
    let out = train(
        2,
        &cfg,
        &o,
        &[
            "--set",
            "solver.max_iter=30",
            "--set",
            "solver.display=1",
            "--set",
            "solver.snapshot_keep=1",
            "--resume",
            snap,
        ],
    );
    ok(&out);
    assert!(weights(&o, 30).is_file());
}

#[test]
fn corrupt_truncated_or_missing_snapshots_are_clear_errors() {
    let (dir, cfg) = setup("resume_corrupt");
    let o = dir.join("o");
    let out = train(2, &cfg, &o, &["--resume", "latest"]);
    refused(
        &out,
        &["--resume latest: no snapshot to resume", "m_iter_<N>"],
    );

    ok(&train(2, &cfg, &o, &["--set", "solver.max_iter=20"]));
    let st = state(&o, 20);
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let out = train(2, &cfg, &o, &["--resume", "latest"]);
    refused(&out, &["m_iter_20.solverstate", "truncated or corrupt"]);

    std::fs::write(&st, &bytes).unwrap();
    let w = weights(&o, 20);
    let wb = std::fs::read(&w).unwrap();
    std::fs::write(&w, &wb[..wb.len() - 7]).unwrap();
    let out = train(2, &cfg, &o, &["--resume", "latest"]);
    refused(&out, &["m_iter_20.safetensors", "truncated or corrupt"]);

    let out = train(2, &cfg, &o, &["--resume", "no/such_iter_5.safetensors"]);
    refused(&out, &["no/such_iter_5.solverstate", "cannot read"]);
}

#[test]
fn snapshot_keep_keeps_the_newest_complete_snapshots() {
    let (dir, cfg) = setup("resume_keep");
    let o = dir.join("o");
    let keep = with_sets(&[], &["solver.snapshot=10", "solver.snapshot_keep=2"]);
    ok(&train(1, &cfg, &o, &keep));
    let mut names: Vec<String> = std::fs::read_dir(o.join("snap"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "m_iter_30.safetensors",
            "m_iter_30.solverstate",
            "m_iter_40.safetensors",
            "m_iter_40.solverstate"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Signals.

/// A long run (the signal must find it training): 20000 iterations, a line of metrics each 100.
const LONG: &[&str] = &[
    "--set",
    "solver.max_iter=20000",
    "--set",
    "solver.display=100",
    "--set",
    "solver.stepsize=5000",
];

/// Starts a long run under mpirun in the background (every rank logging at info, unless
/// `display` is raised).
fn spawn_long(np: usize, cfg: &Path, out: &Path, extra: &[&str]) -> std::process::Child {
    let mut c = mpirun(np);
    // On SIGTERM, mpirun sends its ranks SIGCONT, SIGTERM and SIGKILL this many seconds apart
    // (default 1): room for the snapshot on a loaded machine (see README, "Signals").
    c.env("OMPI_MCA_odls_base_sigkill_timeout", "3")
        .env("RUST_LOG", "info")
        .arg(bin())
        .arg(cfg)
        .arg("--output")
        .arg(out)
        .arg("--no-progress")
        .args(LONG)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().expect("starting mpirun")
}

/// Waits until the run has written its first display line (it is training).
fn wait_training(out: &Path, child: &mut std::process::Child) {
    wait_for_training(out, child, Duration::from_secs(300));
}

/// The iteration after which each rank logged an agreed signal.
fn agreed_iterations(log: &str) -> Vec<(String, u64)> {
    log.lines()
        .filter_map(|l| {
            let (head, rest) = l.split_once(": signal agreed after iteration ")?;
            let replica = head.rsplit_once("replica ")?.1.to_string();
            let n = rest.split(':').next()?.trim().parse().ok()?;
            Some((replica, n))
        })
        .collect()
}

fn finish(child: std::process::Child) -> Output {
    let out = child.wait_with_output().expect("waiting for mpirun");
    eprintln!("--- exit {:?}\n{}", out.status.code(), text(&out));
    out
}

#[test]
fn sigusr1_to_mpirun_and_to_one_rank_snapshot_at_one_iteration_and_training_goes_on() {
    let (dir, cfg) = setup("signal_usr1");
    let (a, b) = (dir.join("straight"), dir.join("signalled"));
    let total = 60000u64;
    let max = format!("solver.max_iter={total}");
    let mut child = spawn_long(2, &cfg, &b, &["--set", &max]);
    wait_training(&b, &mut child);
    kill(child.id(), libc::SIGUSR1);
    // Wait for that snapshot, then signal one rank directly.
    let start = Instant::now();
    while snapshot_iters(&b).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(300), "no snapshot");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ranks = ranks_of(child.id());
    assert_eq!(ranks.len(), 2, "ranks of mpirun: {ranks:?}");
    kill(ranks[1], libc::SIGUSR1);
    let out = finish(child);
    ok(&out);
    let log = text(&out);
    let agreed = agreed_iterations(&log);
    let iters = snapshot_iters(&b);
    // Two signal snapshots and the final one; each agreed by both replicas at one iteration.
    assert_eq!(iters.len(), 3, "snapshots {iters:?}, agreed {agreed:?}");
    assert_eq!(*iters.last().unwrap(), total);
    for n in &iters[..2] {
        let who: Vec<&String> = agreed
            .iter()
            .filter(|(_, m)| m == n)
            .map(|(r, _)| r)
            .collect();
        assert_eq!(who.len(), 2, "replicas agreeing after {n}: {agreed:?}");
        assert_ne!(who[0], who[1]);
    }
    assert_eq!(agreed.len(), 4, "{agreed:?}");
    // The snapshot a signal took is the state of a straight run to that iteration.
    let k = iters[0];
    let mut args = LONG.to_vec();
    let end = format!("solver.max_iter={k}");
    args.extend(["--set", &end]);
    ok(&train(2, &cfg, &a, &args));
    assert_identical(&a, &b, k);
}

#[test]
fn sigterm_to_mpirun_snapshots_and_stops_then_resume_latest_finishes_like_a_straight_run() {
    let (dir, cfg) = setup("signal_term");
    let (a, b) = (dir.join("straight"), dir.join("signalled"));
    // Quiet ranks: after SIGTERM mpirun stops relaying its ranks' output, and a rank blocked
    // writing a log line would not reach the snapshot (README, "Signals").
    let quiet = [
        "--set",
        "solver.max_iter=100000000",
        "--set",
        "solver.display=1000000",
    ];
    let mut child = spawn_long(2, &cfg, &b, &quiet);
    wait_training(&b, &mut child);
    kill(child.id(), libc::SIGTERM);
    let out = finish(child);
    // mpirun reports its own status when it is signalled (1 with OpenMPI 4.1), and may drop the
    // ranks' last lines of output while it shuts down: the files are the evidence. The ranks
    // stopped (else mpirun would not have returned before max_iter) after one snapshot.
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let iters = snapshot_iters(&b);
    assert_eq!(iters.len(), 1, "{iters:?}");
    let k = iters[0];

    // Resume to K + 500 and compare with a straight run to K + 500 (max_iter may change).
    let end = format!("solver.max_iter={}", k + 500);
    let mut args = LONG.to_vec();
    args.extend(["--set", &end]);
    ok(&train(2, &cfg, &a, &args));
    args.extend(["--resume", "latest"]);
    ok(&train(2, &cfg, &b, &args));
    assert_identical(&a, &b, k + 500);
}

#[test]
fn sigterm_to_one_rank_stops_the_job_with_exit_code_143() {
    let (dir, cfg) = setup("signal_term_rank");
    let b = dir.join("o");
    let mut child = spawn_long(2, &cfg, &b, &["--set", "solver.max_iter=100000000"]);
    wait_training(&b, &mut child);
    let ranks = ranks_of(child.id());
    assert_eq!(ranks.len(), 2, "ranks of mpirun: {ranks:?}");
    kill(ranks[0], libc::SIGTERM);
    let out = finish(child);
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    let iters = snapshot_iters(&b);
    assert_eq!(iters.len(), 1, "{iters:?}");
    assert!(iters[0] < 100_000_000);
}

// ---------------------------------------------------------------------------------------------
// Replica consistency.

#[test]
fn verify_interval_passes_on_a_healthy_run_and_names_a_perturbed_replica() {
    let (dir, cfg) = setup("verify");
    let out = train(
        3,
        &cfg,
        &dir.join("healthy"),
        &["--set", "cluster.verify_interval=1"],
    );
    ok(&out);

    let mut c = mpirun(3);
    c.env("P2PTRAIN_INJECT_PERTURB", "1:7")
        .arg(bin())
        .arg(&cfg)
        .arg("--output")
        .arg(dir.join("perturbed"))
        .args(["--no-progress", "--set", "cluster.verify_interval=1"]);
    let out = run(&mut c);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("replica consistency check after iteration 8: the parameters of universal rank 1 differ"),
        "{t}"
    );

    // The same perturbation goes unnoticed without the check: the run ends "successfully".
    let mut c = mpirun(3);
    c.env("P2PTRAIN_INJECT_PERTURB", "1:7")
        .arg(bin())
        .arg(&cfg)
        .arg("--output")
        .arg(dir.join("unchecked"))
        .arg("--no-progress");
    ok(&run(&mut c));
}
