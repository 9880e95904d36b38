//! Local SGD (`[cluster] sync = "local_sgd"`) through the real binary under `mpirun`: with
//! `sync_period = 1`, plain averaging and an update rule linear in the gradient it trains
//! synchronous SGD's weights (and a longer period really differs); the same topology trains the
//! same bits run to run; a run stopped between averagings and resumed ends with the bytes of a
//! straight run (plain and Nesterov outer rules, replica and node scopes), also when a signal
//! stops it; resumes that cannot go on exactly are refused; `verify_interval` checks what must
//! agree; the timeline shows the averagings; the communicated volume is reported.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `--set` arguments from `key=value` strings.
fn sets(pairs: &[&str]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|s| ["--set".to_string(), s.to_string()])
        .collect()
}

/// The equivalence workload (an MLP on the digits, 30 iterations, tests at 15 and 30) with
/// `np` processes × `replicas` of batch 8, and `extra` settings; returns the output folder.
fn equivalence(name: &str, np: usize, replicas: usize, extra: &[&str]) -> PathBuf {
    let dir = out_dir(name);
    let mut args = sets(&[
        "data.batch_size=8",
        &format!("cluster.replicas_per_rank={replicas}"),
    ]);
    args.extend(sets(extra));
    ok(&train_to(
        np,
        &repo("tests/configs/equivalence.toml"),
        &dir,
        &args,
    ));
    dir
}

fn final_weights(dir: &Path) -> PathBuf {
    dir.join("snapshots/equiv_iter_30.safetensors")
}

const LOCAL: &str = "cluster.sync=\"local_sgd\"";
const NESTEROV: &str = "cluster.outer_optimizer=\"nesterov\"";
const NODE_SCOPE: &str = "cluster.sync_scope=\"node\"";

#[test]
fn period_one_with_plain_averaging_trains_synchronous_sgds_weights() {
    for (momentum, name) in [
        ("solver.momentum=0", "plain"),
        ("solver.momentum=0.9", "momentum"),
    ] {
        let sync = equivalence(&format!("period1_{name}_sync"), 2, 2, &[momentum]);
        let local = equivalence(
            &format!("period1_{name}_local"),
            2,
            2,
            &[momentum, LOCAL, "cluster.sync_period=1"],
        );
        // Nodes of one rank: gradients all-reduced within each rank's two replicas.
        let node = equivalence(
            &format!("period1_{name}_node"),
            2,
            2,
            &[
                momentum,
                LOCAL,
                "cluster.sync_period=1",
                NODE_SCOPE,
                "cluster.node_ranks=1",
            ],
        );
        for (dir, what) in [(&local, "replica scope"), (&node, "node scope")] {
            let diff = max_rel_diff(&final_weights(&sync), &final_weights(dir));
            assert!(diff < 2e-4, "{name}, {what}: weights differ by {diff:e}");
            assert_same_metrics(&sync, dir, what, &["accuracy", "accuracy_top3"], &["lr"]);
        }
    }
    // The comparison can fail: four local steps between averagings train other weights.
    let sync = final_weights(&out_dir_of("period1_plain_sync"));
    let apart = equivalence(
        "period4_plain_local",
        2,
        2,
        &["solver.momentum=0", LOCAL, "cluster.sync_period=4"],
    );
    let diff = max_rel_diff(&sync, &final_weights(&apart));
    assert!(
        diff > 5e-4,
        "sync_period = 4 should differ well beyond 2e-4 (diff {diff:e})"
    );
}

/// The output folder `equivalence` made for `name` (already there).
fn out_dir_of(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// Every tensor of the weights and of the solver state of snapshot `iter` under `snap` is
/// bit-identical in `a` and `b`.
fn assert_identical(a: &Path, b: &Path, stem: &str) {
    let bits = |p: &Path| -> Vec<(String, Vec<usize>, Vec<u32>)> {
        tensors(p)
            .into_iter()
            .map(|(n, (shape, v))| (n, shape, v.iter().map(|x| x.to_bits()).collect()))
            .collect()
    };
    for ext in ["safetensors", "solverstate"] {
        let (fa, fb) = (
            a.join(format!("{stem}.{ext}")),
            b.join(format!("{stem}.{ext}")),
        );
        let (ta, tb) = (bits(&fa), bits(&fb));
        assert!(!ta.is_empty(), "{} holds no tensor", fa.display());
        assert!(ta == tb, "{} and {} differ", fa.display(), fb.display());
    }
}

#[test]
fn the_same_topology_trains_the_same_bits_run_to_run() {
    let extra = [
        LOCAL,
        NESTEROV,
        "cluster.sync_period=3",
        "cluster.sync_warmup=2",
    ];
    let a = equivalence("repeat_a", 2, 2, &extra);
    let b = equivalence("repeat_b", 2, 2, &extra);
    assert_identical(&a, &b, "snapshots/equiv_iter_30");
    // Four replicas' own states and the outer state are in the solver state.
    let state = tensors(&a.join("snapshots/equiv_iter_30.solverstate"));
    for name in [
        "replica3/weights/ip1.weight",
        "replica0/momentum/ip3.bias",
        "outer/anchor/ip2.weight",
        "outer/momentum/ip2.bias",
    ] {
        assert!(state.contains_key(name), "no {name} in {:?}", state.keys());
    }
}

/// An MLP on the digits with momentum, augmentation and a smoothed loss (every part of the
/// state matters), snapshots under `snap/m`.
fn resume_config(name: &str) -> (PathBuf, PathBuf) {
    config_dir(
        name,
        &digits_mlp(
            "shift = 1\n",
            "lr_policy = \"step\"\ngamma = 0.5\nstepsize = 15\nmax_iter = 40\ndisplay = 5\naverage_loss = 4\n",
            32,
        ),
    )
}

/// Trains straight to 40, and to 10 (between two averagings: warm-up 3, period 4) then
/// resumed to 40; asserts that both end with the same bits.
fn straight_and_resumed(name: &str, np: usize, extra: &[&str]) {
    let (dir, cfg) = resume_config(name);
    let mut args = sets(&[LOCAL, "cluster.sync_period=4", "cluster.sync_warmup=3"]);
    args.extend(sets(extra));
    let (a, b) = (dir.join("straight"), dir.join("resumed"));
    ok(&train_to(np, &cfg, &a, &args));
    let mut first = args.clone();
    first.extend(sets(&["solver.max_iter=10"]));
    ok(&train_to(np, &cfg, &b, &first));
    let mut second = args.clone();
    second.extend(["--resume".to_string(), "latest".to_string()]);
    let out = train_to(np, &cfg, &b, &second);
    ok(&out);
    assert!(text(&out).contains("resuming from"), "{}", text(&out));
    assert_identical(&a, &b, "snap/m_iter_40");
}

#[test]
fn a_run_resumed_between_averagings_ends_with_a_straight_runs_bits() {
    straight_and_resumed("resume_average", 2, &[]);
    straight_and_resumed(
        "resume_nesterov_nodes",
        2,
        &[
            "cluster.replicas_per_rank=2",
            NESTEROV,
            NODE_SCOPE,
            "cluster.node_ranks=1",
        ],
    );
}

#[test]
fn resumes_that_cannot_go_on_exactly_are_refused_and_a_synchronous_snapshot_goes_on() {
    let (dir, cfg) = resume_config("resume_refused");
    let local = sets(&[LOCAL, "cluster.sync_period=4", "solver.max_iter=10"]);
    let snap = dir.join("local");
    ok(&train_to(2, &cfg, &snap, &local));
    let resume = |np: usize, extra: &[&str]| {
        let mut args = sets(extra);
        args.extend(["--resume".to_string(), "latest".to_string()]);
        train_to(np, &cfg, &snap, &args)
    };
    refused(
        &resume(2, &[]),
        &[
            "m_iter_10.solverstate",
            "resume it with cluster.sync = \"local_sgd\"",
        ],
    );
    refused(
        &resume(1, &[LOCAL, "data.batch_size=16"]),
        &["written by 2 replicas training apart", "this run has 1"],
    );
    refused(
        &resume(2, &[LOCAL, NESTEROV]),
        &["outer rule kept []", "keeps [anchor,momentum]"],
    );
    // A synchronous snapshot: every replica goes on from it, the outer rule afresh.
    let sync = dir.join("sync");
    ok(&train_to(2, &cfg, &sync, &sets(&["solver.max_iter=10"])));
    let mut args = sets(&[LOCAL, NESTEROV]);
    args.extend(["--resume".to_string(), "latest".to_string()]);
    ok(&train_to(2, &cfg, &sync, &args));
    assert_eq!(snapshot_iters(&sync), [10, 40]);
}

#[test]
fn verify_interval_checks_what_must_agree() {
    let extra = [
        LOCAL,
        "cluster.sync_period=4",
        NODE_SCOPE,
        "cluster.node_ranks=1",
        "cluster.verify_interval=1",
    ];
    // Healthy: within each node after every step, everywhere after every averaging.
    equivalence("verify_healthy", 2, 2, &extra);
    // Replica 1 (node 0, with replica 0) changed after iteration 5, between averagings.
    let dir = out_dir("verify_perturbed");
    let mut c = mpirun(2);
    c.env("P2PTRAIN_INJECT_PERTURB", "1:5")
        .arg(bin())
        .arg(repo("tests/configs/equivalence.toml"))
        .arg("--output")
        .arg(&dir)
        .arg("--no-progress")
        .args(sets(&["data.batch_size=8", "cluster.replicas_per_rank=2"]))
        .args(sets(&extra));
    let out = run(&mut c);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains(
            "after iteration 6: the parameters of universal rank 1 differ from those of 1 of 2 \
             replicas of node 0"
        ),
        "{t}"
    );
}

#[test]
fn a_signal_stops_at_an_averaging_and_the_resumed_run_ends_like_a_straight_one() {
    let (dir, cfg) = resume_config("resume_signal");
    let (a, b) = (dir.join("straight"), dir.join("signalled"));
    let local = [LOCAL, "cluster.sync_period=4", "solver.stepsize=5000"];
    let mut c = mpirun(2);
    c.env("OMPI_MCA_odls_base_sigkill_timeout", "3")
        .arg(bin())
        .arg(&cfg)
        .arg("--output")
        .arg(&b)
        .arg("--no-progress")
        .args(sets(&local))
        .args(sets(&[
            "solver.max_iter=100000000",
            "solver.display=1000000",
        ]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("starting mpirun");
    let metrics = b.join("metrics.jsonl");
    let start = Instant::now();
    while !std::fs::read_to_string(&metrics).is_ok_and(|t| !t.is_empty()) {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(start.elapsed() < Duration::from_secs(300), "no metrics");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(child.id(), libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let iters = snapshot_iters(&b);
    assert_eq!(iters.len(), 1, "{iters:?}");
    let k = iters[0];
    assert_eq!(
        k % 4,
        0,
        "a signal is acted on where the replicas agree, not after {k}"
    );
    let mut args = sets(&local);
    args.extend(sets(&[&format!("solver.max_iter={}", k + 30)]));
    ok(&train_to(2, &cfg, &a, &args));
    args.extend(["--resume".to_string(), "latest".to_string()]);
    ok(&train_to(2, &cfg, &b, &args));
    assert_identical(&a, &b, &format!("snap/m_iter_{}", k + 30));
}

#[test]
fn the_timeline_shows_every_averaging() {
    let dir = out_dir("timeline_local");
    let trace = dir.join("trace.json");
    let mut args = sets(&[
        "data.batch_size=8",
        "cluster.replicas_per_rank=2",
        LOCAL,
        "cluster.sync_period=4",
    ]);
    args.extend(["--timeline".to_string(), trace.display().to_string()]);
    ok(&train_to(
        2,
        &repo("tests/configs/equivalence.toml"),
        &dir,
        &args,
    ));
    let events: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = events
        .get("traceEvents")
        .unwrap_or(&events)
        .as_array()
        .expect("a list of events")
        .clone();
    let averagings = events
        .iter()
        .filter(|e| e["name"] == "parameter averaging")
        .count();
    // After iterations 4, 8, …, 28 on each of 4 replicas.
    assert_eq!(averagings, 7 * 4);
}

/// The number right after `label` in the run's summary (megabytes).
fn megabytes(log: &str, label: &str) -> f64 {
    let at = log
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in:\n{log}"));
    let number = log[at + label.len()..]
        .split(' ')
        .next()
        .unwrap_or_default();
    number
        .parse()
        .unwrap_or_else(|_| panic!("{number:?} after {label:?}"))
}

#[test]
fn the_summary_says_what_each_replica_communicated() {
    let log = |name: &str, extra: &[&str]| {
        let dir = out_dir(name);
        let mut args = sets(&["data.batch_size=8", "cluster.replicas_per_rank=2"]);
        args.extend(sets(extra));
        let out = train_to(2, &repo("tests/configs/equivalence.toml"), &dir, &args);
        ok(&out);
        text(&out)
    };
    let sync = log("traffic_sync", &[]);
    let local = log("traffic_local", &[LOCAL, "cluster.sync_period=4"]);
    let every_step = megabytes(&sync, "(gradients ");
    assert_eq!(megabytes(&sync, "; parameters "), 0.0);
    assert_eq!(megabytes(&local, "(gradients "), 0.0);
    // 30 gradient all-reduces against 7 averagings and the mean parameters of the tests after
    // 15 and 30 and of the last snapshot's weights: 10 of the parameters' size.
    let ratio = megabytes(&local, "; parameters ") / every_step;
    assert!(
        (ratio - 10.0 / 30.0).abs() < 0.01,
        "ratio {ratio}:\n{local}"
    );
}

#[test]
fn bad_local_sgd_keys_are_refused_naming_the_key() {
    let check = |np: usize, extra: &[&str]| {
        let mut c = mpirun(np);
        c.arg(bin())
            .arg("check")
            .arg(repo("tests/configs/equivalence.toml"))
            .args(sets(extra));
        run(&mut c)
    };
    refused(
        &check(1, &[LOCAL, "cluster.sync_period=0"]),
        &["cluster.sync_period"],
    );
    refused(
        &check(1, &[NESTEROV, "cluster.outer_momentum=1.5"]),
        &["cluster.outer_momentum"],
    );
    refused(
        &check(2, &[LOCAL, NODE_SCOPE, "cluster.node_ranks=3"]),
        &["cluster.node_ranks", "do not split into nodes of 3 ranks"],
    );
    let out = check(1, &[LOCAL, NESTEROV, "cluster.sync_period=16"]);
    ok(&out);
    assert!(
        text(&out).contains("local_sgd: parameters averaged every 16 steps"),
        "{}",
        text(&out)
    );
}
