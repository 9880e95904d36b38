//! The program's flow for `train`, `check`, `bench`, `test` and `predict`: MPI start-up, config
//! and data read on every rank with the outcome agreed (so a bad input ends the job together,
//! reported once), config fingerprints compared, then the `P2PManager` run. Returns the process
//! exit code. What is particular to `test` and `predict` is in their own modules.

use crate::config::BackendKind;
use crate::config::{self, Plan};
use crate::data::{self, DataSplit};
use crate::dist::bootstrap::report_error;
use crate::dist::Bootstrap;
use crate::error::{Error, Result};
use crate::metrics::MetricsLog;
use crate::net::Net;
use crate::output_folder::{self, OutputLock};
use crate::parallel::manager::Devices;
use crate::parallel::{Mode, Outputs, P2PManager, RunReport};
use crate::params::Params;
use crate::resume::{self, Lineage, ResumeRules, SnapshotFiles, SolverState};
use crate::signals;
use crate::snapshot;
use crate::solver::Solver;
use crate::validate;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::info;

/// `println!` through the output thread (`logging::out_line`): a failed write is ignored (a
/// launcher shutting down after a signal may have closed the rank's stdout) and, after a stop
/// signal, a write never blocks (the launcher may have stopped reading).
macro_rules! outln {
    ($($arg:tt)*) => {{
        crate::logging::out_line(&format!($($arg)*));
    }};
}

/// The config embedded in the binary for `p2ptrain` without arguments.
pub const QUICKSTART: &str = include_str!("../../config/quickstart.toml");

/// Iterations a timeline records in detail unless `--timeline-iters` says otherwise.
pub const DEFAULT_TIMELINE_ITERS: u64 = 50;

/// What to run.
#[derive(Debug, Clone)]
pub enum Action {
    Train,
    Check,
    Bench {
        warmup: u64,
        iters: u64,
        layers: bool,
    },
    /// The test phase alone over the whole test set (`p2ptrain test`; see [`super::test`]).
    Test,
    /// Class probabilities of inputs (`p2ptrain predict`; see [`super::predict`]).
    Predict(super::predict::Request),
}

/// The options shared by every action.
#[derive(Debug, Clone)]
pub struct Options {
    /// The config file; `None` runs the embedded quickstart.
    pub config: Option<PathBuf>,
    /// `--set section.key=value` overrides.
    pub sets: Vec<String>,
    /// `--weights FILE`: initial parameters.
    pub weights: Option<PathBuf>,
    /// `--output DIR`; default `runs/<config stem>/`.
    pub output: Option<PathBuf>,
    /// When to draw the progress bar.
    pub progress: Progress,
    /// `--timeline FILE`: write a Chrome trace of the run (train only).
    pub timeline: Option<PathBuf>,
    /// `--timeline-iters N`: iterations recorded in detail, from the start.
    pub timeline_iters: u64,
    /// `--resume FILE|latest`: go on from a snapshot.
    pub resume: Option<ResumeFrom>,
    /// `--allow-batch-change`: resume with another global batch.
    pub allow_batch_change: bool,
}

/// When rank 0 draws the progress bar: only ever when its stdout is a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Unless a launcher (mpirun, srun, torchrun) started the process: launchers give the ranks a
    /// pseudo-terminal even when the job's output goes to a file.
    Auto,
    /// `--progress`: under a launcher too.
    Always,
    /// `--no-progress`.
    Never,
}

/// Where `--resume` takes its snapshot from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeFrom {
    /// The newest complete snapshot of the config's `snapshot_prefix` in the output directory.
    Latest,
    /// As `Latest` when there is a snapshot, else a fresh start (job scripts that are requeued).
    Auto,
    /// A snapshot named by its `.safetensors` or `.solverstate` file.
    File(PathBuf),
}

impl ResumeFrom {
    /// `latest` or a path.
    pub fn parse(arg: &str) -> Self {
        if arg == "latest" {
            ResumeFrom::Latest
        } else if arg == "auto" {
            ResumeFrom::Auto
        } else {
            ResumeFrom::File(PathBuf::from(arg))
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: None,
            sets: Vec::new(),
            weights: None,
            output: None,
            progress: Progress::Auto,
            timeline: None,
            timeline_iters: DEFAULT_TIMELINE_ITERS,
            resume: None,
            allow_batch_change: false,
        }
    }
}

/// Everything a rank prepares before training, each step able to fail on bad input.
struct Prepared {
    plan: Arc<Plan>,
    data: DataSplit,
    initial: Params,
    devices: Devices,
    resume: Option<(SnapshotFiles, SolverState)>,
    /// Threads of the process's worker pool (see [`size_worker_pool`]).
    workers: usize,
    /// `predict`: the inputs and what to report of them.
    predict: Option<Arc<crate::predict::Job>>,
}

/// Failure injection for testing: with `P2PTRAIN_INJECT_START_GATE=PATH`, a run creates
/// `PATH.waiting.<pid>` and waits, before it reads its config, until the file `PATH` exists (at
/// most a minute), so that a test can signal it at a known point of its start-up.
pub const INJECT_START_GATE: &str = "P2PTRAIN_INJECT_START_GATE";

/// Waits at the [`INJECT_START_GATE`] when it is set.
fn wait_at_start_gate() {
    let Some(gate) = std::env::var_os(INJECT_START_GATE).map(PathBuf::from) else {
        return;
    };
    let mut waiting = gate.clone().into_os_string();
    waiting.push(format!(".waiting.{}", std::process::id()));
    let _ = std::fs::write(&waiting, b"");
    let start = std::time::Instant::now();
    while !gate.exists() && start.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn prepare(action: &Action, opts: &Options, boot: &Bootstrap) -> Result<Prepared> {
    wait_at_start_gate();
    let (mut cfg, source) = match &opts.config {
        Some(path) => validate::load(path, &opts.sets)?,
        None => validate::load_str("quickstart.toml", QUICKSTART, Path::new("."), &opts.sets)?,
    };
    if let Some(n) = cfg.cluster.world_size {
        if n != boot.size {
            return Err(source.error(
                "cluster.world_size",
                format!(
                    "the job must have {n} MPI process(es) but has {} (check the launcher's -np / \
                     --ntasks)",
                    boot.size
                ),
            ));
        }
    }
    if let Action::Test = action {
        super::test::whole_test_set(&mut cfg);
    }
    if matches!(action, Action::Train | Action::Check | Action::Bench { .. }) {
        // A deploy net passes validation without a loss; it cannot train.
        validate::train_loss(&cfg, &source)?;
    }
    let devices = choose_devices(&cfg, &source, boot)?;
    // Before anything runs on the pool (opening the data may).
    let workers = size_worker_pool(
        replica_threads(&cfg, boot, matches!(devices, Devices::Cuda { .. }))
            * cfg.cluster.replicas_per_rank,
    );
    let world_size = boot.size;
    let plan = Plan::new(cfg, source, world_size)?;
    let (data, predict) = match action {
        Action::Predict(request) => {
            let (data, job) = super::predict::open(request, &plan.config)?;
            (data, Some(Arc::new(job)))
        }
        _ => (
            data::open(
                &plan.config.data,
                plan.config.solver.random_seed,
                boot.local_size,
            )?,
            None,
        ),
    };
    // The parameter layout does not depend on the batch: build with batch 1 so that a large net
    // (ResNet-50 at 224²) does not allocate a full batch of activations here as well.
    let (_, mut initial) = Net::build(&plan.config, data.input_shape(), 1)?;
    Net::init_params(&mut initial, plan.config.solver.random_seed);
    if let Some(w) = &opts.weights {
        snapshot::load_weights(w, &mut initial)?;
    }
    let from = match &opts.resume {
        Some(ResumeFrom::Auto) => {
            let dir = output_dir(opts);
            let found = resume::latest(&dir, &plan.config.solver.snapshot_prefix).is_ok();
            if !found && boot.rank == 0 {
                info!(
                    "--resume auto: no snapshot in {}; starting fresh",
                    dir.display()
                );
            }
            found.then_some(&ResumeFrom::Latest)
        }
        other => other.as_ref(),
    };
    let resume = match from {
        None => None,
        Some(_) if opts.weights.is_some() => {
            return Err(Error::Usage(
                "--resume and --weights exclude each other (a snapshot holds the weights)".into(),
            ))
        }
        Some(from) => {
            let files = match from {
                ResumeFrom::Latest | ResumeFrom::Auto => {
                    resume::latest(&output_dir(opts), &plan.config.solver.snapshot_prefix)?
                }
                ResumeFrom::File(f) => SnapshotFiles::of(f),
            };
            let names = Solver::new(&plan.config.solver, 0).history_names();
            let rules = ResumeRules {
                allow_batch_change: opts.allow_batch_change,
            };
            let state = resume::load(&files, &plan, &mut initial, names, data.train.len(), rules)?;
            Some((files, state))
        }
    };
    Ok(Prepared {
        plan: Arc::new(plan),
        data,
        initial,
        devices,
        resume,
        workers,
        predict,
    })
}

/// The backend this rank runs on. `cuda` needs a GPU for every local replica: node-local rank ×
/// replicas_per_rank + i among the devices `CUDA_VISIBLE_DEVICES` leaves; `auto` takes the GPUs
/// when there are enough, else the CPU (and says so).
fn choose_devices(
    cfg: &config::Config,
    source: &config::Source,
    boot: &Bootstrap,
) -> Result<Devices> {
    let k = cfg.cluster.replicas_per_rank;
    let cpu = Devices::Cpu {
        threads_per_replica: replica_threads(cfg, boot, false),
    };
    let wanted = cfg.cluster.backend;
    if wanted == BackendKind::Cpu {
        return Ok(cpu);
    }
    let count = if crate::cuda::available() && crate::cuda::nccl::nccl_available() {
        crate::cuda::device_count()?
    } else {
        0
    };
    let needed = boot.local_size * k;
    if count >= needed {
        return Ok(Devices::Cuda {
            first_ordinal: boot.local_rank * k,
            nccl_id: crate::cuda::nccl::NcclId::from_bytes([0; 128]),
        });
    }
    let node = hostname();
    let why = format!(
        "node {node} hosts {} rank(s) × {k} replica(s) = {needed} replicas but has {count} usable GPU(s)",
        boot.local_size
    );
    if wanted == BackendKind::Auto {
        if boot.rank == 0 {
            tracing::info!("backend \"auto\": {why}; training on the CPU");
        }
        return Ok(cpu);
    }
    Err(source.error("cluster.backend", format!("\"cuda\": {why}")))
}

/// This node's name, for messages.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "(unknown host)".into()
    }
}

/// The nodes of local SGD's node scope (a collective over every rank), `None` for any other
/// sync.
fn local_sgd_nodes(boot: &Bootstrap, plan: &Plan) -> Option<Arc<crate::dist::nodes::Nodes>> {
    let c = &plan.config.cluster;
    let node_scope =
        c.sync == config::SyncMode::LocalSgd && c.sync_scope == config::SyncScope::Node;
    node_scope.then(|| Arc::new(boot.nodes(c.node_ranks)))
}

/// Global rank 0 makes the NCCL unique id; MPI broadcasts its 128 bytes to every rank.
fn share_nccl_id(boot: &Bootstrap) -> std::result::Result<crate::cuda::nccl::NcclId, i32> {
    boot.agree(crate::cuda::nccl::NcclId::shared(boot))
}

/// The output directory: `--output`, or `runs/<config stem>/`.
fn output_dir(opts: &Options) -> PathBuf {
    opts.output.clone().unwrap_or_else(|| {
        let stem = opts
            .config
            .as_ref()
            .and_then(|p| p.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "quickstart".into());
        Path::new("runs").join(stem)
    })
}

/// Claims the output directory for this job (its lock), checks that every output can be written
/// there, and opens it; a resumed run appends to `metrics.jsonl` rather than replacing it, and
/// takes over its lineage's snapshots for `snapshot_keep`.
fn open_outputs(
    dir: &Path,
    plan: &Plan,
    progress: Progress,
    resumed: Option<&SolverState>,
) -> Result<Outputs> {
    let host = hostname();
    let lock = OutputLock::acquire(dir, &host)?;
    let solver = &plan.config.solver;
    output_folder::check_writable(dir, &solver.snapshot_prefix, solver.max_iter, &plan.source)?;
    let path = dir.join("metrics.jsonl");
    let (metrics, lineage) = match resumed {
        Some(state) => (
            MetricsLog::append(&path)?,
            Lineage::resumed(state, dir, &solver.snapshot_prefix, &host),
        ),
        None => (MetricsLog::create(&path)?, Lineage::fresh(&host)),
    };
    Ok(Outputs {
        dir: dir.to_path_buf(),
        metrics,
        progress: progress_bar(solver.max_iter, progress),
        lineage,
        _lock: lock,
    })
}

/// What this rank starts from and the options every rank must share, as a key (equal on every
/// rank of a sound launch) and a description for the error when they differ: the action, the
/// timeline, `--allow-batch-change`, and the parameters and solver state the rank would train
/// from (a snapshot's iteration and a hash of what it holds, `--weights`, or a fresh start).
/// Paths are described but not compared: node-local output folders may differ.
fn start_point(action: &Action, opts: &Options, prepared: &Prepared) -> (u64, String) {
    use std::hash::{Hash, Hasher};
    let mut content = crate::parallel::verify::hash_params(&prepared.initial.data);
    let (iter, from) = match &prepared.resume {
        Some((files, state)) => {
            let apart = state.apart.iter().flat_map(|a| {
                let own = a.params.iter().chain(a.history.iter().flatten());
                own.chain(&a.outer)
            });
            for h in state.history.iter().chain(apart) {
                content = content.rotate_left(7) ^ crate::parallel::verify::hash_params(h);
            }
            content ^= state.data_position.rotate_left(31);
            (state.iter, format!("snapshot {}", files.weights.display()))
        }
        None => {
            let from = match (&opts.weights, &opts.resume) {
                (Some(w), _) => format!("--weights {}", w.display()),
                (None, Some(ResumeFrom::Auto)) => format!(
                    "a fresh start (--resume auto found no snapshot in {})",
                    output_dir(opts).display()
                ),
                (None, _) => "a fresh start".to_string(),
            };
            (0, from)
        }
    };
    let timeline = opts.timeline.as_ref().map(|_| opts.timeline_iters);
    let action_text = format!("{action:?}");
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        &action_text,
        timeline,
        opts.allow_batch_change,
        iter,
        content,
    )
        .hash(&mut hasher);
    let timeline_text = match (&opts.timeline, timeline) {
        (Some(path), Some(n)) => format!("--timeline {} ({n} iterations)", path.display()),
        _ => "no --timeline".to_string(),
    };
    let description = format!(
        "{action_text} from {from} (iteration {iter}, parameters and solver state hash \
         {content:016x}), {timeline_text}, --allow-batch-change {}",
        if opts.allow_batch_change { "on" } else { "off" }
    );
    (hasher.finish(), description)
}

/// A progress bar on stdout, drawn only when stdout is a terminal and `when` allows it (see
/// [`Progress`]); it writes through the output thread (`logging::SinkTerminal`).
fn progress_bar(max_iter: u64, when: Progress) -> Option<indicatif::ProgressBar> {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    use std::io::IsTerminal;
    let wanted = match when {
        Progress::Auto => crate::dist::launch_env::LaunchEnv::detect().is_none(),
        Progress::Always => true,
        Progress::Never => false,
    };
    if !wanted || !std::io::stdout().is_terminal() {
        return None;
    }
    let terminal = crate::logging::SinkTerminal::stdout();
    let target = ProgressDrawTarget::term_like_with_hz(Box::new(terminal), 20);
    let bar = ProgressBar::with_draw_target(Some(max_iter), target);
    let template = "{bar:40} {pos}/{len} iterations, {msg} [{elapsed} < {eta}]";
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// Sizes the process's rayon pool — the threads that prepare batches, copy them into pinned
/// memory and run the CPU backend's GEMMs — to `threads`, this rank's share of the node (its
/// replicas' threads), and answers its size. Left to itself every rank would start a pool of all
/// the node's cores, and the ranks of a node (one per GPU, or one per socket) would contend for
/// them. A pool built before (a second run in one process) stays as it is.
fn size_worker_pool(threads: usize) -> usize {
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("p2ptrain-worker-{i}"))
        .build_global();
    match built {
        Ok(()) => threads,
        Err(_) => rayon::current_num_threads(),
    }
}

/// Most worker threads a GPU replica gets by default. A GPU replica's pool only fills batches of
/// sources without decode workers and copies them into pinned memory: memory-bound work split
/// into small pieces, which more threads slow down (their wake-ups, and memory on the other
/// socket). On a 64-core host, one GPU replica with all 64 threads trained mlp4096 at 153k
/// samples/s and cifar10_quick at 129k, with 8 at 567k and 346k (docs/benchmarks.md,
/// "The worker pool of a GPU replica").
const GPU_REPLICA_THREADS: usize = 8;

/// Worker-pool threads per replica of this node's rank, on GPUs (`on_gpu`) or the CPU (where they
/// are also the GEMM threads): [`threads_for`] this node's cores and replicas.
fn replica_threads(cfg: &config::Config, boot: &Bootstrap, on_gpu: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local_replicas = boot.local_size * cfg.cluster.replicas_per_rank;
    threads_for(
        cfg.cluster.threads_per_replica,
        cores,
        local_replicas,
        on_gpu,
    )
}

/// Threads per replica: `configured` where set (non-zero), else the node's `cores` shared among
/// its `local_replicas`, at most [`GPU_REPLICA_THREADS`] for a GPU replica; at least one.
fn threads_for(configured: usize, cores: usize, local_replicas: usize, on_gpu: bool) -> usize {
    if configured > 0 {
        return configured;
    }
    let share = (cores / local_replicas.max(1)).max(1);
    match on_gpu {
        true => share.min(GPU_REPLICA_THREADS),
        false => share,
    }
}

/// Runs `action` and returns the exit code.
pub fn run(action: Action, opts: Options) -> i32 {
    // First thing: a signal sent at once is counted, and acted on once training starts.
    let early_signals = match action {
        Action::Train => signals::install_early(),
        _ => Ok(()),
    };
    let boot = match super::start_rank() {
        Ok(b) => b,
        Err(code) => return code,
    };
    let prepared = match boot.agree(prepare(&action, &opts, &boot)) {
        Ok(p) => p,
        Err(code) => return code,
    };
    boot.set_collective_timeout(prepared.plan.config.cluster.collective_timeout_s);
    let fingerprint = boot
        .check_same_fingerprint(config::rank_fingerprint(&prepared.plan.config))
        .map_err(|e| {
            // Every rank sees the mismatch; rank 0 reports it.
            Error::Config {
                file: prepared.plan.source.path.display().to_string(),
                pos: None,
                key: "(whole file)".into(),
                msg: e.to_string(),
            }
        });
    if let Err(code) = boot.agree(if boot.rank == 0 { fingerprint } else { Ok(()) }) {
        return code;
    }
    let (start_key, start) = start_point(&action, &opts, &prepared);
    if let Err(code) = boot.agree(boot.check_same_start(start_key, &start)) {
        return code;
    }
    if boot.size > 1 {
        let gather = |words: &[u64]| boot.all_gather_u64(words);
        let same = data::fingerprint::check_across_ranks(&prepared.data, gather);
        if let Err(code) = boot.agree(same) {
            return code;
        }
    }
    let plan = prepared.plan.clone();
    let devices_line = match prepared.devices {
        Devices::Cpu {
            threads_per_replica,
        } => {
            format!(
                "cpu, {threads_per_replica} GEMM thread(s) per replica, {} worker thread(s)",
                prepared.workers
            )
        }
        Devices::Cuda { first_ordinal, .. } => format!(
            "cuda, rank 0's replicas on GPUs {}..{} ({:?} math, {:?} reduce), {} worker thread(s)",
            first_ordinal,
            first_ordinal + plan.replicas_per_rank,
            plan.config.cluster.math,
            plan.config.cluster.reduce,
            prepared.workers
        ),
    };
    let extra = [
        ("parameters", prepared.initial.count().to_string()),
        ("devices", devices_line),
    ];
    if let Action::Check = action {
        if boot.rank == 0 {
            println!("{}", plan.describe(&extra));
        }
        return 0;
    }
    if boot.rank == 0 {
        info!(
            "{} process(es) x {} replica(s) = {} replicas; global batch {} = batch {} x {} replicas x iter_size {}; {} parameters",
            boot.size,
            plan.replicas_per_rank,
            plan.total_replicas,
            plan.global_batch,
            plan.config.data.batch_size,
            plan.total_replicas,
            plan.config.solver.iter_size,
            prepared.initial.count()
        );
    }
    if let Action::Predict(request) = &action {
        let created = match boot.rank {
            0 => super::predict::create_output(request),
            _ => Ok(()),
        };
        if let Err(code) = boot.agree(created) {
            return code;
        }
    }
    let dir = output_dir(&opts);
    let outputs = match &action {
        Action::Train if boot.rank == 0 => Some(open_outputs(
            &dir,
            &plan,
            opts.progress,
            prepared.resume.as_ref().map(|(_, state)| state),
        )),
        Action::Test if boot.rank == 0 => Some(super::test::open_outputs(&dir, &hostname())),
        _ => None,
    };
    // The timeline file is created now, so that a bad path fails before training.
    let outputs = match (&opts.timeline, outputs) {
        (Some(path), Some(Ok(o))) => Some(
            std::fs::File::create(path)
                .map(|_| o)
                .map_err(|e| Error::Usage(format!("--timeline {}: {e}", path.display()))),
        ),
        (_, o) => o,
    };
    let outputs = match boot.agree(outputs.transpose()) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let mut devices = prepared.devices;
    let nodes = local_sgd_nodes(&boot, &plan);
    let mut node_nccl_id = None;
    if let Devices::Cuda { nccl_id, .. } = &mut devices {
        match share_nccl_id(&boot) {
            Ok(id) => *nccl_id = id,
            Err(code) => return code,
        }
        if let Some(nodes) = &nodes {
            match boot.agree(crate::cuda::nccl::NcclId::per_node(&boot, nodes)) {
                Ok(id) => node_nccl_id = Some(id),
                Err(code) => return code,
            }
        }
    }
    if let Some((files, state)) = &prepared.resume {
        if boot.rank == 0 {
            info!(
                "resuming from {} after iteration {} (data position {})",
                files.weights.display(),
                state.iter,
                state.data_position
            );
        }
    }
    if let Action::Train = action {
        if let Err(e) = early_signals.and_then(|()| signals::install(&plan.config.solver)) {
            tracing::warn!("signal handlers not installed ({e}): signals end the process");
        }
    }
    let prepared_job = prepared.predict.clone();
    let manager = P2PManager {
        plan: plan.clone(),
        data: prepared.data,
        initial: Arc::new(prepared.initial),
        devices,
        timeline_iters: opts.timeline.as_ref().map(|_| opts.timeline_iters),
        resume: prepared.resume.map(|(_, state)| Arc::new(state)),
        nodes,
        node_nccl_id,
    };
    let mode = match &action {
        Action::Bench {
            warmup,
            iters,
            layers,
        } => Mode::Bench {
            warmup: *warmup,
            iters: *iters,
            layers: *layers,
        },
        Action::Test => Mode::Test {
            iter: opts
                .weights
                .as_deref()
                .map_or(0, |w| SnapshotFiles::of(w).iter),
        },
        Action::Predict(_) => match &prepared_job {
            Some(job) => Mode::Predict(job.clone()),
            None => Mode::Train,
        },
        _ => Mode::Train,
    };
    match manager.run(&boot, mode.clone(), outputs) {
        Ok(report) => {
            if let Action::Predict(request) = &action {
                return super::predict::write_lines(&boot, request, &report);
            }
            if boot.rank == 0 {
                summarize(&plan, &report, &mode, &dir);
            }
            let Some(path) = opts
                .timeline
                .as_ref()
                .filter(|_| matches!(mode, Mode::Train))
            else {
                return report.stopped.unwrap_or(0);
            };
            match crate::chrome_trace::write(&boot, &hostname(), &report.traces, path) {
                Ok(()) => {
                    if boot.rank == 0 {
                        outln!("timeline: {}", path.display());
                    }
                    report.stopped.unwrap_or(0)
                }
                Err(e) => {
                    report_error(boot.rank, &e);
                    e.exit_code()
                }
            }
        }
        Err(e) => {
            report_error(boot.rank, &e);
            e.exit_code()
        }
    }
}

fn summarize(plan: &Plan, report: &RunReport, mode: &Mode, dir: &Path) {
    let iterations = report.iterations.saturating_sub(report.first_iteration);
    let rate = iterations as f64 * plan.global_batch as f64 / report.seconds.max(1e-9);
    match mode {
        Mode::Train => {
            if let Some(code) = report.stopped {
                outln!(
                    "stopped by a signal after iteration {} (exit code {code}); go on with --resume latest",
                    report.iterations
                );
            } else {
                outln!(
                    "trained to iteration {} in {:.2} s ({:.0} samples/s)",
                    report.iterations,
                    report.seconds,
                    rate
                );
            }
            if let Some(t) = &report.last_test {
                let acc = t
                    .accuracy
                    .map(|a| format!(", accuracy {:.2}%", 100.0 * a))
                    .unwrap_or_default();
                outln!("test: loss {:.4}{acc} over {} samples", t.loss, t.samples);
            }
            print_traffic(report, iterations);
            outln!("outputs: {}", dir.join("metrics.jsonl").display());
            for s in &report.snapshots {
                outln!("         {}", s.display());
            }
        }
        Mode::Test { .. } | Mode::Predict(_) => {
            if let Some(t) = &report.last_test {
                outln!("{}", super::test::summary(t));
            }
            outln!("outputs: {}", dir.join("metrics.jsonl").display());
        }
        Mode::Bench { .. } => {
            outln!(
                "bench: {} replicas, global batch {}, {} iterations in {:.3} s: {:.1} samples/s",
                plan.total_replicas,
                plan.global_batch,
                report.iterations,
                report.seconds,
                rate
            );
            if let Some(split) = report.step_seconds {
                let total: f64 = split.iter().sum();
                outln!(
                    "step split, {} clock, mean over replicas:",
                    report.step_clock
                );
                outln!("{:<12} {:>12} {:>8}", "phase", "ms/iter", "share");
                for (p, s) in crate::spans::Step::ALL.iter().zip(split) {
                    outln!(
                        "{:<12} {:>12.3} {:>7.1}%",
                        p.label(),
                        s * 1e3,
                        100.0 * s / total.max(1e-12)
                    );
                }
            }
            print_traffic(report, report.iterations);
            if let Some(layers) = &report.layer_ms {
                print_layer_times(layers, report.step_clock);
            }
        }
    }
}

/// What universal rank 0 handed to all-reduces over `iterations`, and the bytes a ring
/// all-reduce of it sends per replica (`2(R − 1)/R` per byte; nccl-tests' bus bandwidth factor).
fn print_traffic(report: &RunReport, iterations: u64) {
    let t = &report.traffic;
    if report.replicas < 2 || t.payload_bytes() == 0 {
        return;
    }
    let mb = |bytes: u64| bytes as f64 / 1e6;
    let ring = t.ring_bytes(report.replicas, report.node_replicas) / 1e6;
    let [all, node, params] = t.bytes();
    let wire = match t.gradient_width {
        2 => ", gradients in bf16",
        _ => "",
    };
    outln!(
        "communicated per replica: {:.3} MB of all-reduce payload (gradients {:.3} MB over every \
         replica, {:.3} MB within nodes; parameters {:.3} MB{wire}), {ring:.3} MB sent in ring \
         all-reduces, {:.4} MB per iteration",
        mb(t.payload_bytes()),
        mb(all),
        mb(node),
        mb(params),
        ring / iterations.max(1) as f64
    );
}

/// `bench --layers`: each layer's forward and backward time per iteration and their totals.
fn print_layer_times(layers: &[crate::parallel::sync::LayerTime], clock: &str) {
    let width = layers
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(0)
        .max(5);
    outln!("per layer, {clock} clock, ms per iteration, mean over replicas:");
    outln!("{:<width$} {:>12} {:>12}", "layer", "forward", "backward");
    let (mut fwd, mut bwd) = (0.0, 0.0);
    for l in layers {
        fwd += l.forward_ms;
        bwd += l.backward_ms.unwrap_or(0.0);
        let b = l
            .backward_ms
            .map_or_else(|| "-".to_string(), |ms| format!("{ms:.3}"));
        outln!("{:<width$} {:>12.3} {:>12}", l.name, l.forward_ms, b);
    }
    outln!("{:<width$} {:>12.3} {:>12.3}", "total", fwd, bwd);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_replica_takes_its_share_of_cores_up_to_the_cap() {
        // One GPU rank on a 64-core node: 8, not 64; four ranks: 8 each, not 16.
        assert_eq!(threads_for(0, 64, 1, true), GPU_REPLICA_THREADS);
        assert_eq!(threads_for(0, 64, 4, true), GPU_REPLICA_THREADS);
        // A share below the cap stays what it is, and never drops to zero.
        assert_eq!(threads_for(0, 16, 4, true), 4);
        assert_eq!(threads_for(0, 2, 4, true), 1);
        // CPU replicas keep the whole share for their GEMMs.
        assert_eq!(threads_for(0, 64, 1, false), 64);
        assert_eq!(threads_for(0, 64, 4, false), 16);
        // A configured count is taken as it is, on either backend.
        assert_eq!(threads_for(32, 64, 1, true), 32);
        assert_eq!(threads_for(3, 64, 1, false), 3);
    }
}
