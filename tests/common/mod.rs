//! Shared helpers of the integration tests: run the real binary, alone or under `mpirun` (the
//! command lines, waiting for a job to train or to end), and read what it wrote (metrics.jsonl,
//! safetensors snapshots); [`config_text`] writes the layer tables of the test configs,
//! [`input_files`] the NumPy and IDX inputs.

#![allow(dead_code)]

pub mod config_text;
pub mod input_files;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_p2ptrain"))
}

/// A repository path.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `mpirun` with the settings every test needs: root allowed (CI runs as root), more ranks than
/// cores, no binding, no shared-memory single copy (unavailable in containers).
pub fn mpirun(np: usize) -> Command {
    let mpirun = which("mpirun").unwrap_or_else(|| {
        panic!("mpirun not found: install OpenMPI (`apt-get install openmpi-bin libopenmpi-dev`), see README")
    });
    let mut c = Command::new(mpirun);
    c.args([
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
        &np.to_string(),
    ]);
    mpi_env(&mut c);
    c
}

/// `p2ptrain` alone (no launcher: an MPI singleton) with [`mpi_env`]'s environment, so that
/// tests that start several at once do not share a session directory.
pub fn alone() -> Command {
    let mut c = Command::new(bin());
    mpi_env(&mut c);
    c
}

/// Environment for OpenMPI processes run as root inside containers, each launch with a session
/// directory of its own.
pub fn mpi_env(c: &mut Command) {
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_MCA_orte_tmpdir_base", session_dir_base())
        .env_remove("RUST_LOG");
}

/// A fresh directory under which one launch's OpenMPI keeps its session files. Launches that
/// share the default (`/tmp/ompi.<host>.<uid>`) race: one that ends removes the emptied directory
/// while another is creating it ("A call to mkdir was unable to create the desired directory …
/// File exists", `orte_init` failed). Short paths under the system's temporary directory keep the
/// sockets OpenMPI makes there within their length limit.
///
/// The first call of a test process also removes what earlier, ended test processes left there.
fn session_dir_base() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static SWEEP: Once = Once::new();
    let parent = std::env::temp_dir().join("p2ptrain-tests");
    SWEEP.call_once(|| remove_dirs_of_ended_processes(&parent));
    let dir = parent.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("creating the session directory {}: {e}", dir.display()));
    dir
}

/// Removes the `PID-N` directories under `parent` whose process no longer runs (best effort).
fn remove_dirs_of_ended_processes(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|n| n.split('-').next());
        if pid.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `c` and returns its output, printing both streams for the test log.
pub fn run(c: &mut Command) -> Output {
    let out = c.output().expect("starting the command");
    eprintln!("--- {:?}\n--- exit {:?}", c, out.status.code());
    eprintln!("--- stdout\n{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("--- stderr\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Runs `p2ptrain args...` under `mpirun -np np`.
pub fn mpi_p2ptrain(np: usize, args: &[&str]) -> Output {
    let mut c = mpirun(np);
    c.arg(bin()).args(args);
    run(&mut c)
}

/// `mpirun -np np p2ptrain cfg --output out --no-progress args...` (training, the default
/// command).
pub fn train_to<S: AsRef<std::ffi::OsStr>>(
    np: usize,
    cfg: &Path,
    out: &Path,
    args: &[S],
) -> Output {
    let mut c = mpirun(np);
    c.arg(bin())
        .arg(cfg)
        .arg("--output")
        .arg(out)
        .arg("--no-progress")
        .args(args);
    run(&mut c)
}

/// Waits until the run of `job` has written a line to `out/metrics.jsonl` (it trains), at most
/// `limit`; panics if the job ends first or the time runs out (then killing it).
pub fn wait_for_training(out: &Path, job: &mut Child, limit: Duration) {
    let metrics = out.join("metrics.jsonl");
    wait_for_file(&metrics, "training", job, limit, |t| t.lines().count() >= 1);
}

/// Waits until the file `path` holds text for which `ready` holds (`what` names that state),
/// at most `limit`, while `job` runs; panics if the job ends first or the time runs out (then
/// killing it).
pub fn wait_for_file(
    path: &Path,
    what: &str,
    job: &mut Child,
    limit: Duration,
    ready: impl Fn(&str) -> bool,
) {
    let start = Instant::now();
    while !std::fs::read(path).is_ok_and(|t| ready(&String::from_utf8_lossy(&t))) {
        if let Some(status) = job.try_wait().unwrap() {
            panic!("the run ended before {what}: {status}");
        }
        if start.elapsed() > limit {
            let _ = job.kill();
            let _ = job.wait();
            panic!("no {what} in {} after {limit:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `job` to end, at most `limit`: its exit status, or `None` when it still ran then
/// (it is killed and reaped).
pub fn wait_within(job: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = job.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = job.kill();
            let _ = job.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `p2ptrain compute-mean CONFIG -o OUT` in one process.
pub fn compute_mean(config: &Path, out: &Path) -> Output {
    run(Command::new(bin())
        .arg("compute-mean")
        .arg(config)
        .arg("-o")
        .arg(out))
}

/// Asserts that a run exited 0.
pub fn ok(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
}

/// Asserts that a run was refused as bad input (exit 2), saying every one of `wanted`, without a
/// panic.
pub fn refused(out: &Output, wanted: &[&str]) {
    let t = text(out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    for w in wanted {
        assert!(t.contains(w), "expected {w:?} in:\n{t}");
    }
    assert!(!t.contains("panicked"), "{t}");
}

/// Asserts that nothing stands at `path` (a run wrote nothing there), saying `why` otherwise.
pub fn assert_absent(path: &Path, why: &str) {
    assert!(!path.exists(), "{}: {why}", path.display());
}

/// Asserts that the text file `path` contains every one of `wanted`.
pub fn assert_file_contains(path: &Path, wanted: &[&str]) {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    for w in wanted {
        assert!(text.contains(w), "{w} in {}:\n{text}", path.display());
    }
}

/// Writes `lines` as `dir/metrics.jsonl`, as a run logs them, and returns its path.
pub fn metrics_file(dir: &Path, lines: &str) -> PathBuf {
    let path = dir.join("metrics.jsonl");
    std::fs::write(&path, lines).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// The lines of a `metrics.jsonl`.
pub fn metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Every tensor of a safetensors file as (shape, values).
pub fn tensors(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name} is not f32");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// Largest |a − b| / max(1, |a|, |b|) over every tensor; panics if the names or shapes differ.
pub fn max_rel_diff(a: &Path, b: &Path) -> f32 {
    let (ta, tb) = (tensors(a), tensors(b));
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "tensor names"
    );
    let mut worst = 0.0f32;
    for (name, (sa, va)) in &ta {
        let (sb, vb) = &tb[name];
        assert_eq!(sa, sb, "shape of {name}");
        for (x, y) in va.iter().zip(vb) {
            assert!(x.is_finite() && y.is_finite(), "{name} is not finite");
            worst = worst.max((x - y).abs() / 1f32.max(x.abs()).max(y.abs()));
        }
    }
    worst
}

/// A fresh output directory under the target directory.
pub fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tests/configs/equivalence.toml`, the MLP the equivalence and fault tests train.
pub fn equivalence_config() -> String {
    repo("tests/configs/equivalence.toml").display().to_string()
}

/// `args`, then `--set S` for each `S` of `sets`.
pub fn with_sets<'a>(args: &[&'a str], sets: &[&'a str]) -> Vec<&'a str> {
    let sets = sets.iter().flat_map(|&s| ["--set", s]);
    args.iter().copied().chain(sets).collect()
}

/// `train CONFIG --output OUT`, then `--set S` for each `S` of `sets`.
pub fn train_args<'a>(config: &'a Path, out: &'a Path, sets: &[&'a str]) -> Vec<&'a str> {
    let (config, out) = (config.to_str().unwrap(), out.to_str().unwrap());
    with_sets(&["train", config, "--output", out], sets)
}

/// `predict CONFIG --weights WEIGHTS -o OUT --input INPUT...`, then `extra`.
pub fn predict_args<'a>(
    config: &'a Path,
    weights: &'a Path,
    out: &'a Path,
    inputs: &[&'a str],
    extra: &[&'a str],
) -> Vec<&'a str> {
    let path = |p: &'a Path| p.to_str().unwrap();
    let mut args = vec!["predict", path(config), "--weights", path(weights)];
    args.extend(["-o", path(out), "--input"]);
    args.extend_from_slice(inputs);
    args.extend_from_slice(extra);
    args
}

/// The training losses per iteration of the run in `dir`, as its metrics.jsonl has them.
pub fn train_losses(dir: &Path) -> Vec<f64> {
    metrics(&dir.join("metrics.jsonl"))
        .iter()
        .filter(|m| m["phase"] == "train")
        .map(|m| m["loss"].as_f64().unwrap())
        .collect()
}

/// The arguments that train the equivalence config into `out` with the `--set` options `sets`.
pub fn equivalence_args(out: &Path, sets: &[&str]) -> Vec<String> {
    let config = equivalence_config();
    let args = with_sets(&[&config, "--output", out.to_str().unwrap()], sets);
    args.into_iter().map(String::from).collect()
}

/// Trains the equivalence config on `np` ranks into `dir` with the `--set` options `sets` and a
/// panic injected at `fault` (`universal rank:iteration`, as `P2PTRAIN_INJECT_PANIC` takes it);
/// asserts that the job failed, saying that MPI rank `rank` hit a fatal error, the injected
/// fault. Returns the output.
pub fn injected_panic(np: usize, fault: &str, rank: usize, dir: &Path, sets: &[&str]) -> Output {
    let mut c = mpirun(np);
    c.env("P2PTRAIN_INJECT_PANIC", fault)
        .arg(bin())
        .args(equivalence_args(dir, sets));
    let out = run(&mut c);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(&format!("p2ptrain: rank {rank}: fatal")), "{t}");
    assert!(t.contains("injected fault"), "{t}");
    out
}

/// Trains the equivalence config for `max_iter` iterations on one rank into `dir`, asserting
/// that it succeeds (its snapshot is `dir/snapshots/equiv_iter_{max_iter}.safetensors`).
pub fn train_equivalence(dir: &Path, max_iter: usize) {
    let mut c = mpirun(1);
    c.arg(bin()).args(equivalence_args(
        dir,
        &[&format!("solver.max_iter={max_iter}")],
    ));
    let out = run(&mut c);
    assert!(out.status.success(), "{}", text(&out));
}

/// Asserts that two runs logged the same metrics: the same lines (iteration and phase), losses
/// within 2e-4 (relative, or absolute below 1), identical values of every key in `exact_test` on
/// the test lines (accuracies: exact counts over the whole test set) and of every key in
/// `exact_train` on the others. Returns the reference's lines for further checks.
pub fn assert_same_metrics(
    reference: &Path,
    other: &Path,
    what: &str,
    exact_test: &[&str],
    exact_train: &[&str],
) -> Vec<serde_json::Value> {
    let (a, b) = (
        metrics(&reference.join("metrics.jsonl")),
        metrics(&other.join("metrics.jsonl")),
    );
    assert_eq!(a.len(), b.len(), "{what}: metrics lines");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["iter"], y["iter"]);
        assert_eq!(x["phase"], y["phase"]);
        let (lx, ly) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!(
            (lx - ly).abs() < 2e-4 * lx.abs().max(1.0),
            "{what}: loss at {x} vs {y}"
        );
        let (exact, phase) = if x["phase"] == "test" {
            (exact_test, "test")
        } else {
            (exact_train, "train")
        };
        for key in exact {
            assert_eq!(x[key], y[key], "{what}: {phase} {key}");
        }
    }
    a
}

/// The config of an MLP on the bundled digits: `[data]` (batch 8, scale 1/256, then the lines
/// `data_extra`), `[solver]` (SGD, rate 0.05, momentum 0.9, then the lines `solver`, snapshots
/// only on request under `snap/m`), and [`config_text::mlp`] with `hidden` hidden units.
pub fn digits_mlp(data_extra: &str, solver: &str, hidden: usize) -> String {
    format!(
        r#"
[data]
format = "digits"
batch_size = 8
scale = 0.00390625
{data_extra}[solver]
type = "sgd"
base_lr = 0.05
momentum = 0.9
{solver}snapshot = 0
snapshot_prefix = "snap/m"

{}"#,
        config_text::mlp(hidden, "")
    )
}

/// A fresh output directory `name` holding `config` as `cfg.toml`: (the directory, the file).
pub fn config_dir(name: &str, config: &str) -> (PathBuf, PathBuf) {
    let dir = out_dir(name);
    let cfg = dir.join("cfg.toml");
    std::fs::write(&cfg, config).unwrap();
    (dir, cfg)
}

/// The snapshot iterations in `out/snap` (each counted once, by its solver state), sorted.
pub fn snapshot_iters(out: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(out.join("snap"))
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix("m_iter_")?
                    .strip_suffix(".solverstate")?
                    .parse()
                    .ok()
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Sends `sig` to `pid`, asserting that it was delivered.
pub fn kill(pid: u32, sig: libc::c_int) {
    // SAFETY: a plain kill(2) of a process this test started.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// The pids of the `p2ptrain` children of mpirun `parent` (its ranks).
pub fn ranks_of(parent: u32) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-P", &parent.to_string(), "p2ptrain"])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// stdout and stderr together, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Bytes of one CIFAR-10 binary record: a label byte and 3×32×32 pixels.
pub const CIFAR10_RECORD: usize = 3073;

/// `n` records in the CIFAR-10 binary layout: label (first + i) mod 10, pixels a class pattern
/// plus noise from a fixed-seed generator.
pub fn cifar10_records(n: usize, first: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u8
    };
    let mut b = Vec::with_capacity(n * CIFAR10_RECORD);
    for i in 0..n {
        let label = (first + i) % 10;
        b.push(label as u8);
        for j in 0..3072 {
            let pattern = if (j / 97) % 10 == label { 160u8 } else { 40 };
            b.push(pattern.wrapping_add(next() % 64));
        }
    }
    b
}

/// Writes two small training batches and a test batch of generated CIFAR-10 records into `dir`
/// and returns the `--set` arguments that point a shipped CIFAR-10 config at them.
pub fn cifar10_files(dir: &Path) -> [String; 2] {
    std::fs::create_dir_all(dir).unwrap();
    let files = [
        ("train_1.bin", 48, 0),
        ("train_2.bin", 16, 5),
        ("test.bin", 24, 0),
    ];
    for (seed, (name, n, first)) in files.into_iter().enumerate() {
        std::fs::write(dir.join(name), cifar10_records(n, first, seed as u64 + 1)).unwrap();
    }
    let path = |name: &str| format!("{:?}", dir.join(name).display().to_string());
    [
        format!(
            "data.train_files=[{}, {}]",
            path("train_1.bin"),
            path("train_2.bin")
        ),
        format!("data.test_files=[{}]", path("test.bin")),
    ]
}
