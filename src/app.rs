//! The program's flow for `train`, `check` and `bench`: MPI start-up, config and data read on
//! every rank with the outcome agreed (so a bad input ends the job together, reported once),
//! config fingerprints compared, then the `P2PManager` run. Returns the process exit code.

use crate::config::BackendKind;
use crate::config::{self, Plan};
use crate::data::{self, DataSplit};
use crate::dist::bootstrap::report_error;
use crate::dist::Bootstrap;
use crate::error::{Error, Result};
use crate::metrics::MetricsLog;
use crate::net::Net;
use crate::parallel::manager::Devices;
use crate::parallel::{Mode, Outputs, P2PManager, RunReport};
use crate::params::Params;
use crate::snapshot;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::info;

/// The config embedded in the binary for `p2ptrain` without arguments.
pub const QUICKSTART: &str = include_str!("../config/quickstart.toml");

/// What to run.
#[derive(Debug, Clone)]
pub enum Action {
    Train,
    Check,
    Bench { warmup: u64, iters: u64 },
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
    /// Draw a progress bar when stdout is a terminal.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: None,
            sets: Vec::new(),
            weights: None,
            output: None,
            progress: true,
        }
    }
}

/// Everything a rank prepares before training, each step able to fail on bad input.
struct Prepared {
    plan: Arc<Plan>,
    data: DataSplit,
    initial: Params,
    devices: Devices,
}

fn prepare(opts: &Options, boot: &Bootstrap) -> Result<Prepared> {
    let (cfg, source) = match &opts.config {
        Some(path) => config::load(path, &opts.sets)?,
        None => config::load_str("quickstart.toml", QUICKSTART, Path::new("."), &opts.sets)?,
    };
    let devices = choose_devices(&cfg, &source, boot)?;
    let world_size = boot.size;
    let plan = Plan::new(cfg, source, world_size)?;
    let data = data::open(&plan.config.data, plan.config.solver.random_seed)?;
    // The parameter layout does not depend on the batch: build with batch 1 so that a large net
    // (ResNet-50 at 224²) does not allocate a full batch of activations here as well.
    let (_, mut initial) = Net::build(&plan.config, data.train.record_shape(), 1)?;
    Net::init_params(&mut initial, plan.config.solver.random_seed);
    if let Some(w) = &opts.weights {
        snapshot::load_weights(w, &mut initial)?;
    }
    Ok(Prepared {
        plan: Arc::new(plan),
        data,
        initial,
        devices,
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
        threads_per_replica: threads_per_replica(cfg, boot),
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

fn open_outputs(dir: &Path, max_iter: u64, progress: bool) -> Result<Outputs> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let metrics = MetricsLog::create(&dir.join("metrics.jsonl"))?;
    Ok(Outputs {
        dir: dir.to_path_buf(),
        metrics,
        progress: progress.then(|| progress_bar(max_iter)).flatten(),
    })
}

/// A progress bar on stdout, drawn only when stdout is a terminal (under mpirun it is a pipe).
fn progress_bar(max_iter: u64) -> Option<indicatif::ProgressBar> {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(Some(max_iter), ProgressDrawTarget::stdout());
    let template = "{bar:40} {pos}/{len} iterations, {msg} [{elapsed} < {eta}]";
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// GEMM threads per replica: the config's, or the node's cores shared among its replicas.
fn threads_per_replica(cfg: &config::Config, boot: &Bootstrap) -> usize {
    match cfg.cluster.threads_per_replica {
        0 => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores / (boot.local_size * cfg.cluster.replicas_per_rank)).max(1)
        }
        n => n,
    }
}

/// Runs `action` and returns the exit code.
pub fn run(action: Action, opts: Options) -> i32 {
    let boot = match Bootstrap::init() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("p2ptrain: error: {e}");
            return e.exit_code();
        }
    };
    crate::logging::init(boot.rank, boot.size);
    let prepared = match boot.agree(prepare(&opts, &boot)) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let fingerprint = boot
        .check_same_fingerprint(prepared.plan.fingerprint)
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
    let plan = prepared.plan.clone();
    let devices_line = match prepared.devices {
        Devices::Cpu {
            threads_per_replica,
        } => {
            format!("cpu, {threads_per_replica} GEMM thread(s) per replica")
        }
        Devices::Cuda { first_ordinal, .. } => format!(
            "cuda, rank 0's replicas on GPUs {}..{} ({:?} math, {:?} reduce)",
            first_ordinal,
            first_ordinal + plan.replicas_per_rank,
            plan.config.cluster.math,
            plan.config.cluster.reduce
        ),
    };
    let extra = [
        ("parameters", prepared.initial.len().to_string()),
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
            prepared.initial.len()
        );
    }
    let dir = output_dir(&opts);
    let outputs = match &action {
        Action::Train if boot.rank == 0 => Some(open_outputs(
            &dir,
            plan.config.solver.max_iter,
            opts.progress,
        )),
        _ => None,
    };
    let outputs = match boot.agree(outputs.transpose()) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let mut devices = prepared.devices;
    if let Devices::Cuda { nccl_id, .. } = &mut devices {
        match share_nccl_id(&boot) {
            Ok(id) => *nccl_id = id,
            Err(code) => return code,
        }
    }
    let manager = P2PManager {
        plan: plan.clone(),
        data: prepared.data,
        initial: Arc::new(prepared.initial),
        devices,
    };
    let mode = match action {
        Action::Bench { warmup, iters } => Mode::Bench { warmup, iters },
        _ => Mode::Train,
    };
    match manager.run(&boot, mode, outputs) {
        Ok(report) => {
            if boot.rank == 0 {
                summarize(&plan, &report, mode, &dir);
            }
            0
        }
        Err(e) => {
            report_error(boot.rank, &e);
            e.exit_code()
        }
    }
}

fn summarize(plan: &Plan, report: &RunReport, mode: Mode, dir: &Path) {
    let rate = report.iterations as f64 * plan.global_batch as f64 / report.seconds.max(1e-9);
    match mode {
        Mode::Train => {
            println!(
                "trained {} iterations in {:.2} s ({:.0} samples/s)",
                report.iterations, report.seconds, rate
            );
            if let Some(t) = &report.last_test {
                let acc = t
                    .accuracy
                    .map(|a| format!(", accuracy {:.2}%", 100.0 * a))
                    .unwrap_or_default();
                println!("test: loss {:.4}{acc} over {} samples", t.loss, t.samples);
            }
            println!("outputs: {}", dir.join("metrics.jsonl").display());
            for s in &report.snapshots {
                println!("         {}", s.display());
            }
        }
        Mode::Bench { .. } => {
            println!(
                "bench: {} replicas, global batch {}, {} iterations in {:.3} s: {:.1} samples/s",
                plan.total_replicas, plan.global_batch, report.iterations, report.seconds, rate
            );
            if let Some(split) = report.step_seconds {
                let total: f64 = split.iter().sum();
                println!(
                    "step split, {} clock, mean over replicas:",
                    report.step_clock
                );
                println!("{:<12} {:>12} {:>8}", "phase", "ms/iter", "share");
                for (p, s) in crate::parallel::timing::Phase::ALL.iter().zip(split) {
                    println!(
                        "{:<12} {:>12.3} {:>7.1}%",
                        p.label(),
                        s * 1e3,
                        100.0 * s / total.max(1e-12)
                    );
                }
            }
        }
    }
}
