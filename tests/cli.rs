//! The command line as users meet it, through the real binary: the quickstart, `check`, `--help`,
//! `--weights`, bad input under `mpirun` (exit code 2, reported once, naming the key, file or
//! rank), config fingerprints, and a rank that dies taking the whole job down.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn quickstart_without_arguments_reaches_93_percent_and_says_where_its_outputs_went() {
    let dir = out_dir("quickstart");
    let mut c = mpirun(2);
    c.arg(bin()).current_dir(&dir);
    let out = run(&mut c);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("runs/quickstart/metrics.jsonl"), "{stdout}");
    let m = metrics(&dir.join("runs/quickstart/metrics.jsonl"));
    let last_test = m
        .iter()
        .rev()
        .find(|l| l["phase"] == "test")
        .expect("a test line");
    let acc = last_test["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.93, "quickstart test accuracy {acc}");
    let train = m.iter().find(|l| l["phase"] == "train").unwrap();
    for key in ["iter", "loss", "lr", "samples_per_sec", "elapsed_s"] {
        assert!(train.get(key).is_some(), "train line lacks {key}: {train}");
    }
}

#[test]
fn singleton_without_a_launcher_trains() {
    let dir = out_dir("singleton");
    let mut c = alone();
    c.args(equivalence_args(&dir, &["solver.max_iter=5"]));
    ok(&run(&mut c));
    assert!(dir.join("snapshots/equiv_iter_5.safetensors").is_file());
    assert_eq!(
        metrics(&dir.join("metrics.jsonl"))
            .iter()
            .filter(|l| l["phase"] == "train")
            .count(),
        5
    );
}

#[test]
fn check_prints_the_resolved_plan_without_training() {
    let dir = out_dir("check");
    let out = mpi_p2ptrain(
        2,
        &[
            "check",
            &equivalence_config(),
            "--set",
            "cluster.replicas_per_rank=3",
            "--set",
            "cluster.threads_per_replica=2",
            "--set",
            "cluster.backend=\"cpu\"",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // 2 ranks × 3 replicas × batch 32 = global batch 192; 64·48+48 + 48·32+32 + 32·10+10 parameters.
    assert!(stdout.contains("192"), "global batch missing:\n{stdout}");
    // Each rank's worker pool: its 3 replicas × 2 threads, whatever the machine's cores.
    assert!(
        stdout.contains("cpu, 2 GEMM thread(s) per replica, 6 worker thread(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&(64 * 48 + 48 + 48 * 32 + 32 + 32 * 10 + 10).to_string()),
        "{stdout}"
    );
    assert!(!dir.join("metrics.jsonl").exists());
}

#[test]
fn help_and_usage_errors() {
    let out = run(Command::new(bin()).arg("--help"));
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("check"));
    let out = run(Command::new(bin()).args(["bench", "--help"]));
    assert_eq!(out.status.code(), Some(0));
    let out = run(Command::new(bin()).args(["train", "x.toml", "--no-such-flag"]));
    assert_eq!(out.status.code(), Some(2));
}

/// `bench --layers` under mpirun: after the step split, one row per layer of the train net in net
/// order with its forward and backward milliseconds (a `-` where the layer has no backward), and
/// the totals. Only the table's shape is checked: timings are not asserted.
#[test]
fn bench_layers_prints_every_layer_with_its_times() {
    let dir = out_dir("bench_layers");
    let mut c = mpirun(2);
    c.arg(bin()).current_dir(&dir).args([
        "bench",
        &repo("tests/configs/cnn_equivalence.toml")
            .display()
            .to_string(),
        "--warmup",
        "1",
        "--iters",
        "3",
        "--layers",
    ]);
    let out = run(&mut c);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("per layer, host clock"))
        .skip(2)
        .collect();
    let rows: Vec<Vec<&str>> = table
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    let train_layers = [
        "conv_a", "pool_a", "conv_b", "cat", "scale", "conv_c", "sum", "relu", "pool_b", "ip",
        "loss",
    ];
    let expected: Vec<&str> = train_layers.iter().copied().chain(["total"]).collect();
    assert_eq!(names, expected, "{stdout}");
    for r in &rows {
        assert_eq!(r.len(), 3, "{stdout}");
        let forward: f64 = r[1].parse().unwrap();
        assert!(forward >= 0.0 && forward.is_finite(), "{stdout}");
        assert!(
            r[2] == "-" || r[2].parse::<f64>().is_ok_and(|b| b >= 0.0),
            "{stdout}"
        );
    }
}

/// Counts the fatal error reports in a job's output.
fn reports(out: &std::process::Output) -> usize {
    text(out).matches("p2ptrain: rank").count()
}

#[test]
fn a_bad_config_under_mpirun_exits_2_once_naming_the_key_and_position() {
    let out = mpi_p2ptrain(3, &[&equivalence_config(), "--set", "solver.base_lr=-1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(reports(&out), 1, "reported once:\n{}", text(&out));
    assert!(text(&out).contains("solver.base_lr"), "{}", text(&out));

    let bad = repo("tests/configs/bad");
    let typo = std::fs::read_dir(&bad).ok().and_then(|d| {
        d.filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "toml"))
    });
    if let Some(file) = typo {
        let out = mpi_p2ptrain(2, &[file.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}: {}",
            file.display(),
            text(&out)
        );
        assert_eq!(reports(&out), 1, "{}", text(&out));
        assert!(!text(&out).contains("panicked"), "{}", text(&out));
    }
}

#[test]
fn a_missing_data_file_is_named() {
    let dir = out_dir("missing_data");
    let cfg = dir.join("missing.toml");
    let text_cfg = std::fs::read_to_string(equivalence_config())
        .unwrap()
        .replace("format = \"digits\"", "format = \"idx\"\ntrain_images = \"nowhere/train-images.gz\"\ntrain_labels = \"nowhere/l.gz\"\ntest_images = \"nowhere/t.gz\"\ntest_labels = \"nowhere/tl.gz\"");
    std::fs::write(&cfg, text_cfg).unwrap();
    let out = mpi_p2ptrain(2, &[cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("nowhere/train-images.gz"),
        "{}",
        text(&out)
    );
    assert_eq!(reports(&out), 1, "{}", text(&out));
}

#[test]
fn ranks_that_read_different_configs_are_stopped_before_training() {
    let mut c = mpirun(1);
    c.arg(bin())
        .args([
            &equivalence_config(),
            "--output",
            out_dir("fingerprint").to_str().unwrap(),
        ])
        .args([":", "-np", "1"])
        .arg(bin())
        .args([&equivalence_config(), "--set", "solver.base_lr=0.2"]);
    let out = run(&mut c);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("rank 1 resolved a different config"),
        "{}",
        text(&out)
    );
}

#[test]
fn weights_round_trip_and_mismatched_weights_are_named() {
    let first = out_dir("weights_first");
    train_equivalence(&first, 3);
    let snap = first.join("snapshots/equiv_iter_3.safetensors");
    let t = tensors(&snap);
    assert_eq!(t["ip1.weight"].0, vec![48, 64], "PyTorch layout [out, in]");
    assert_eq!(t["ip3.bias"].0, vec![10]);

    // Starting from the snapshot with lr 0 must reproduce it exactly.
    let second = out_dir("weights_second");
    let config = repo("tests/configs/equivalence.toml");
    let frozen = [
        "solver.max_iter=1",
        "solver.lr_policy=\"fixed\"",
        "solver.base_lr=1e-30",
        "solver.weight_decay=0",
    ];
    let mut args = train_args(&config, &second, &frozen);
    args.extend(["--weights", snap.to_str().unwrap()]);
    ok(&mpi_p2ptrain(2, &args));
    assert!(max_rel_diff(&snap, &second.join("snapshots/equiv_iter_1.safetensors")) < 1e-6);

    // A net whose ip2 is wider cannot take these weights: the error names the tensors.
    let out = mpi_p2ptrain(
        2,
        &[
            &equivalence_config(),
            "--weights",
            snap.to_str().unwrap(),
            "--set",
            "layer.2.num_output=40",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("ip2.weight"), "{}", text(&out));
}

#[test]
fn a_rank_killed_mid_training_ends_the_whole_job() {
    let dir = out_dir("killed");
    let mut c = mpirun(3);
    c.arg(bin())
        .args(equivalence_args(&dir, &["solver.max_iter=100000000"]))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut job = c.spawn().unwrap();
    // Wait until training runs (metrics appear), then kill one rank.
    wait_for_training(&dir, &mut job, Duration::from_secs(60));
    let pids = String::from_utf8(
        Command::new("pgrep")
            .args(["-P", &job.id().to_string()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let victim = pids
        .lines()
        .last()
        .expect("a rank process")
        .trim()
        .to_string();
    Command::new("kill").args(["-9", &victim]).status().unwrap();
    let status = wait_within(&mut job, Duration::from_secs(60))
        .expect("the job still runs 60 s after a rank was killed");
    assert!(!status.success(), "the job must fail when a rank dies");
}

#[test]
fn a_panicking_replica_aborts_the_whole_job_naming_its_rank() {
    // Replica 3 of 4 (np 2 × 2 threads) panics at iteration 5; its peers are then waiting in the
    // gradient all-reduce. The panic hook must end the whole job, not leave them hanging.
    let start = Instant::now();
    injected_panic(
        2,
        "3:5",
        1,
        &out_dir("panicking"),
        &[
            "cluster.replicas_per_rank=2",
            "data.batch_size=8",
            "solver.max_iter=100000000",
        ],
    );
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "the job took too long to end"
    );
}
