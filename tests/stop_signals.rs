//! Stopping and signalling a run through the real binary, alone and under `mpirun`: SIGTERM or
//! SIGINT to `mpirun` (which stops relaying the ranks' output and signals them only
//! `odls_base_sigkill_timeout` seconds later) ends in a complete snapshot, the signal reaching
//! ranks that agree on signals only every few iterations (`parallel::agreement`); a log under a
//! launcher gets plain lines, the progress bar only with `--progress`; a second SIGINT during a
//! snapshot leaves no temporary file; SIGUSR1 before the config is even read is acted on at the
//! first iteration.

mod common;

use common::{
    alone, bin, config_dir, digits_mlp, kill, mpirun, ranks_of, tensors, text, wait_for_file,
    wait_for_training, wait_within,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// An MLP on the bundled digits, quick to train and to snapshot.
fn config() -> String {
    digits_mlp("", "max_iter = 5\ndisplay = 1\n", 32)
}
/// Runs that go on until they are stopped.
const ENDLESS: &[&str] = &["--set", "solver.max_iter=100000000"];

/// How long a signalled job may take to end: mpirun's kill timeout twice, plus a wide margin for
/// a loaded machine. Only a hang exceeds it.
const END_WITHIN: Duration = Duration::from_secs(90);

/// mpirun's delay between its SIGTERM to the ranks and its SIGKILL (it waits as long before the
/// SIGTERM): room for the snapshot on a loaded machine.
const SIGKILL_TIMEOUT_S: &str = "5";

/// A fresh directory holding the config as `cfg.toml`.
fn setup(name: &str) -> (PathBuf, PathBuf) {
    config_dir(name, &config())
}

/// Whether process `pid` still runs (a zombie counts as ended).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// Waits until the run has written its first display line (it is training).
fn wait_training(out: &Path, child: &mut Child) {
    wait_for_training(out, child, END_WITHIN);
}

/// Waits for `child` to end within [`END_WITHIN`]; kills it and fails otherwise.
fn wait_end(child: &mut Child, what: &str) -> std::process::ExitStatus {
    wait_within(child, END_WITHIN)
        .unwrap_or_else(|| panic!("still running {END_WITHIN:?} after {what}"))
}

/// The names of the files in `out/snap`, sorted.
fn snapshot_files(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out.join("snap"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The iterations of the complete snapshots (both files) in `out/snap`, sorted.
fn snapshot_iters(out: &Path) -> Vec<u64> {
    let files = snapshot_files(out);
    let mut v: Vec<u64> = files
        .iter()
        .filter_map(|n| n.strip_prefix("m_iter_")?.strip_suffix(".solverstate"))
        .filter(|it| files.contains(&format!("m_iter_{it}.safetensors")))
        .filter_map(|it| it.parse().ok())
        .collect();
    v.sort();
    v
}

/// Asserts that no temporary file is left in `out/snap`.
fn no_temporary(out: &Path) {
    let files = snapshot_files(out);
    assert!(
        files.iter().all(|f| !f.contains(".tmp-")),
        "temporary files left: {files:?}"
    );
}

/// Asserts that `out` holds exactly one snapshot, complete, and that a run resumes from it;
/// returns its iteration.
fn one_resumable_snapshot(cfg: &Path, out: &Path) -> u64 {
    no_temporary(out);
    let iters = snapshot_iters(out);
    assert_eq!(iters.len(), 1, "snapshots: {:?}", snapshot_files(out));
    let k = iters[0];
    let weights = out.join(format!("snap/m_iter_{k}.safetensors"));
    assert!(!tensors(&weights).is_empty());
    let end = format!("solver.max_iter={}", k + 3);
    let mut c = mpirun(2);
    c.arg(bin()).arg(cfg).arg("--output").arg(out).args([
        "--no-progress",
        "--resume",
        "latest",
        "--set",
        &end,
    ]);
    let resumed = common::run(&mut c);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert!(
        text(&resumed).contains(&format!("after iteration {k}")),
        "{}",
        text(&resumed)
    );
    k
}

/// Where mpirun's own output goes while a stop signal is tested.
#[derive(Clone, Copy)]
enum Sink {
    /// A file: mpirun writes everything it relays.
    File,
    /// A pipe the test never reads.
    UnreadPipe,
}

/// `mpirun -np 2` training without end, every rank logging each iteration, with mpirun's kill
/// timeout raised as the README says.
fn spawn_chatty_job(cfg: &Path, out: &Path, sink: Sink) -> Child {
    let mut c = mpirun(2);
    c.env("OMPI_MCA_odls_base_sigkill_timeout", SIGKILL_TIMEOUT_S)
        .env("RUST_LOG", "info")
        .arg(bin())
        .arg(cfg)
        .arg("--output")
        .arg(out)
        .args(ENDLESS);
    match sink {
        Sink::File => {
            let log = std::fs::File::create(out.with_extension("log")).unwrap();
            c.stdout(Stdio::from(log.try_clone().unwrap()))
                .stderr(Stdio::from(log));
        }
        Sink::UnreadPipe => {
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
    }
    c.spawn().expect("starting mpirun")
}

/// Sends `sig` to a chatty mpirun job and checks that the ranks end after one complete,
/// resumable snapshot.
fn stop_signal_to_mpirun_snapshots(name: &str, sig: libc::c_int, sink: Sink) {
    let (dir, cfg) = setup(name);
    let out = dir.join("o");
    std::fs::create_dir_all(&out).unwrap();
    let mut job = spawn_chatty_job(&cfg, &out, sink);
    wait_training(&out, &mut job);
    if let Sink::File = sink {
        // The signal reaches ranks that no longer agree after every iteration
        // (parallel::agreement): it is sent once the schedule has set its interval.
        let (log, line) = (out.with_extension("log"), "signals agreed every");
        wait_for_file(&log, "the agreement interval", &mut job, END_WITHIN, |t| {
            t.contains(line)
        });
    }
    let ranks = ranks_of(job.id());
    assert_eq!(ranks.len(), 2, "ranks of mpirun: {ranks:?}");
    kill(job.id(), sig);
    match sink {
        Sink::File => {
            let status = wait_end(&mut job, "the stop signal");
            eprintln!("--- mpirun: {status}");
        }
        Sink::UnreadPipe => {
            // mpirun itself may wait forever to hand its backlog to the unread pipe: the ranks'
            // end is what counts.
            let start = Instant::now();
            while ranks.iter().any(|&r| alive(r)) {
                if start.elapsed() > END_WITHIN {
                    let _ = job.kill();
                    panic!("the ranks still run {END_WITHIN:?} after the stop signal");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = job.kill();
            let _ = job.wait();
        }
    }
    if let Ok(log) = std::fs::read(out.with_extension("log")) {
        let log = String::from_utf8_lossy(&log);
        eprintln!("--- job log (last lines)");
        for l in log.lines().rev().take(20) {
            eprintln!("{l}");
        }
    }
    one_resumable_snapshot(&cfg, &out);
}

#[test]
fn sigterm_to_mpirun_whose_ranks_log_every_iteration_ends_in_a_complete_snapshot() {
    stop_signal_to_mpirun_snapshots("stop_term_file", libc::SIGTERM, Sink::File);
}

#[test]
fn sigint_to_mpirun_whose_ranks_log_every_iteration_ends_in_a_complete_snapshot() {
    stop_signal_to_mpirun_snapshots("stop_int_file", libc::SIGINT, Sink::File);
}

#[test]
fn sigterm_to_mpirun_writing_to_an_unread_pipe_ends_in_a_complete_snapshot() {
    stop_signal_to_mpirun_snapshots("stop_term_pipe", libc::SIGTERM, Sink::UnreadPipe);
}

// ---------------------------------------------------------------------------------------------
// The progress bar under a launcher.

/// Whether `s` holds terminal control: carriage returns or escape sequences.
fn has_redraws(s: &str) -> bool {
    s.contains('\r') || s.contains('\x1b')
}

#[test]
fn a_log_under_mpirun_gets_plain_lines_and_the_bar_only_with_progress() {
    let (dir, cfg) = setup("progress_launcher");
    let train = |out: &str, extra: &[&str]| -> Output {
        let mut c = mpirun(2);
        c.arg(bin())
            .arg(&cfg)
            .arg("--output")
            .arg(dir.join(out))
            .args(["--set", "solver.max_iter=40"])
            .args(extra);
        common::run(&mut c)
    };
    // The ranks see OpenMPI's pseudo-terminal although mpirun writes to a pipe.
    let plain = train("plain", &[]);
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain));
    let t = text(&plain);
    assert!(t.contains("iter 39: loss"), "{t}");
    assert!(!has_redraws(&t), "{t:?}");

    let bar = train("bar", &["--progress"]);
    assert_eq!(bar.status.code(), Some(0), "{}", text(&bar));
    let t = text(&bar);
    assert!(has_redraws(&t) && t.contains("iterations"), "{t:?}");
}

// ---------------------------------------------------------------------------------------------
// A second SIGINT during a snapshot.

/// The test-only delay, in milliseconds, between writing a snapshot file's temporary and renaming
/// it (see README, "Resume and signals").
const DELAY_VAR: &str = "P2PTRAIN_INJECT_SNAPSHOT_DELAY_MS";

#[test]
fn a_second_sigint_during_a_snapshot_leaves_no_temporary_and_the_earlier_snapshot_intact() {
    let (dir, cfg) = setup("second_sigint");
    let out = dir.join("o");
    let mut c = alone();
    c.env(DELAY_VAR, "1000")
        .arg(&cfg)
        .arg("--output")
        .arg(&out)
        .args(["--no-progress", "--set", "solver.display=1000"])
        .args(ENDLESS)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut job = c.spawn().expect("starting p2ptrain");
    wait_training(&out, &mut job);
    // An earlier snapshot, complete.
    kill(job.id(), libc::SIGUSR1);
    let start = Instant::now();
    while snapshot_iters(&out).is_empty() {
        assert!(start.elapsed() < END_WITHIN, "no SIGUSR1 snapshot");
        assert!(job.try_wait().unwrap().is_none(), "the run ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let earlier = snapshot_iters(&out)[0];
    // Ctrl-C: a snapshot begins; a second Ctrl-C while its temporary is on disk.
    kill(job.id(), libc::SIGINT);
    let start = Instant::now();
    while !snapshot_files(&out).iter().any(|f| f.contains(".tmp-")) {
        assert!(
            start.elapsed() < END_WITHIN,
            "no snapshot temporary appeared"
        );
        assert!(job.try_wait().unwrap().is_none(), "the run ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    kill(job.id(), libc::SIGINT);
    let status = wait_end(&mut job, "the second SIGINT");
    assert_eq!(status.code(), Some(130), "{status}");
    no_temporary(&out);
    assert_eq!(snapshot_iters(&out), vec![earlier]);
    let weights = out.join(format!("snap/m_iter_{earlier}.safetensors"));
    assert!(!tensors(&weights).is_empty());
}

// ---------------------------------------------------------------------------------------------
// SIGUSR1 before training starts.

/// Failure injection: a run waits before reading its config until this file exists.
const START_GATE: &str = "P2PTRAIN_INJECT_START_GATE";

/// Waits until `n` processes wait at the start gate `gate` (each made `gate.waiting.<pid>`,
/// before reading its config) and returns their pids.
fn held_at_gate(gate: &Path, n: usize, job: &mut Child) -> Vec<u32> {
    let prefix = format!("{}.waiting.", gate.file_name().unwrap().to_string_lossy());
    let start = Instant::now();
    loop {
        let pids: Vec<u32> = std::fs::read_dir(gate.parent().unwrap())
            .unwrap()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix(&prefix)?.parse().ok()
            })
            .collect();
        if pids.len() == n {
            return pids;
        }
        if let Some(status) = job.try_wait().unwrap() {
            panic!("the run ended before it reached the start gate: {status}");
        }
        assert!(
            start.elapsed() < END_WITHIN,
            "no process reached the start gate"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether process `pid` catches `sig` (its `SigCgt` mask in /proc).
fn catches(pid: u32, sig: libc::c_int) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    mask & (1 << (sig - 1)) != 0
}

#[test]
fn sigusr1_to_a_process_still_before_its_config_snapshots_at_the_first_iteration() {
    let (dir, cfg) = setup("early_usr1_single");
    let (gate, out) = (dir.join("gate"), dir.join("o"));
    let mut c = alone();
    c.arg(&cfg)
        .arg("--output")
        .arg(&out)
        .arg("--no-progress")
        .env(START_GATE, &gate)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut job = c.spawn().expect("starting p2ptrain");
    let held = held_at_gate(&gate, 1, &mut job);
    assert!(
        catches(held[0], libc::SIGUSR1),
        "SIGUSR1 is not caught before the config is read"
    );
    kill(job.id(), libc::SIGUSR1);
    std::fs::write(&gate, b"").unwrap();
    let status = wait_end(&mut job, "SIGUSR1");
    let output = job.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(0), "{status}: {}", text(&output));
    assert_eq!(snapshot_iters(&out), vec![1, 5], "{}", text(&output));
}

#[test]
fn sigusr1_to_mpirun_whose_ranks_are_still_before_their_config_snapshots_at_the_first_iteration() {
    let (dir, cfg) = setup("early_usr1_mpirun");
    let (gate, out) = (dir.join("gate"), dir.join("o"));
    let mut c = mpirun(2);
    c.env(START_GATE, &gate)
        .arg(bin())
        .arg(&cfg)
        .arg("--output")
        .arg(&out)
        .arg("--no-progress")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut job = c.spawn().expect("starting mpirun");
    for pid in held_at_gate(&gate, 2, &mut job) {
        assert!(
            catches(pid, libc::SIGUSR1),
            "rank {pid} does not catch SIGUSR1 before reading its config"
        );
    }
    kill(job.id(), libc::SIGUSR1);
    // mpirun forwards SIGUSR1 at once; give it a moment to reach both ranks before they go on.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&gate, b"").unwrap();
    let status = wait_end(&mut job, "SIGUSR1");
    let output = job.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(0), "{status}: {}", text(&output));
    assert_eq!(snapshot_iters(&out), vec![1, 5], "{}", text(&output));
}
