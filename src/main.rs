//! The `p2ptrain` command line: parses arguments and hands over to `p2ptrain::cmd`.
//!
//! ```text
//! p2ptrain [train] [CONFIG] [--set section.key=value]... [--weights FILE] [--output DIR]
//!          [--timeline FILE [--timeline-iters N]] [--progress | --no-progress]
//!          [--resume FILE|latest|auto] [--allow-batch-change]
//! p2ptrain check CONFIG [--set ...]
//! p2ptrain bench CONFIG [--warmup N] [--iters N] [--layers] [--set ...]
//! p2ptrain bench-allreduce [--min-bytes 1K] [--max-bytes 1G] [--factor 2] [--backend auto] ...
//! p2ptrain plot RUN/metrics.jsonl... -o curves.svg|curves.png [--label NAME]... [--log-loss]
//! p2ptrain compute-mean CONFIG -o mean.binaryproto [--set ...]
//! p2ptrain test CONFIG --weights FILE [--set ...] [--output DIR]
//! p2ptrain predict CONFIG --weights FILE --input FILE... -o predictions.jsonl [--top-k 5]
//! p2ptrain import-caffe NET.prototxt [--solver SOLVER.prototxt] [--weights X.caffemodel] -o DIR
//! p2ptrain export SNAPSHOT --format caffe|torchvision -o FILE [--config CONFIG]
//! p2ptrain convert-imageset [--gray] [--shuffle] [--encoded] [--resize-height H --resize-width W] ROOT/ LIST DB
//! p2ptrain bench-data CONFIG [--batches N] [--workers N] [--decode-only] [--set ...]
//! p2ptrain                      # the embedded quickstart
//! ```
//! Exit codes: 0 success, 2 bad usage, config or input, 1 runtime failure, 128 + signal number
//! after a stop on SIGTERM (143), SIGINT (130) or SIGHUP (129).

use clap::{Args, Parser, Subcommand};
use p2ptrain::caffe::export::{ExportFormat, ExportOptions};
use p2ptrain::caffe::import::ImportOptions;
use p2ptrain::cmd::bench_allreduce::{self as allreduce_bench, BenchOptions};
use p2ptrain::cmd::bench_data::{self, BenchDataOptions};
use p2ptrain::cmd::compute_mean::{self, MeanOptions};
use p2ptrain::cmd::convert_imageset::{self, ConvertOptions};
use p2ptrain::cmd::plot::{self, PlotOptions};
use p2ptrain::cmd::train::{self as app, Action, Options};
use p2ptrain::config::BackendKind;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "p2ptrain",
    version,
    about = "Data-parallel neural-network training on MPI clusters",
    long_about = "Data-parallel neural-network training on MPI clusters.\n\n\
        Launch one process per rank: `mpirun -np 4 p2ptrain cluster.toml`, \
        `srun --mpi=pmix p2ptrain cluster.toml`, or `p2ptrain cluster.toml` alone.\n\
        Without arguments, trains the embedded quickstart (an MLP on bundled digits).\n\n\
        Signals (at the next iteration boundary, agreed by every rank): SIGUSR1 writes a \
        snapshot and training goes on; SIGTERM and SIGINT write a snapshot and stop every rank \
        ([solver] sigint_effect = \"snapshot_stop\" | \"snapshot\" | \"stop\" | \"none\"); \
        SIGHUP writes a snapshot (sighup_effect, same choices). A second SIGINT exits at once.\n\n\
        Exit codes: 0 success, 2 bad usage, config or input (also a snapshot that cannot be \
        resumed), 1 runtime failure (also a failed replica consistency check), 143 stopped by \
        SIGTERM, 130 by SIGINT, 129 by SIGHUP (128 + signal number, after the snapshot)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train the network a config describes (the default command).
    Train {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        timeline: TimelineArgs,
    },
    /// Validate a config and print the resolved plan without training.
    Check(Common),
    /// Time training steps: samples/s and the split of a step into its phases.
    Bench {
        #[command(flatten)]
        common: Common,
        /// Untimed iterations first.
        #[arg(long, default_value_t = 5)]
        warmup: u64,
        /// Timed iterations.
        #[arg(long, default_value_t = 50)]
        iters: u64,
        /// Then as many iterations again, timing each layer's forward and backward (device
        /// time on GPUs, as Caffe's `caffe time` prints).
        #[arg(long)]
        layers: bool,
    },
    /// Check then time all-reduces over a sweep of sizes (after nccl-tests' all_reduce_perf).
    #[command(
        name = "bench-allreduce",
        long_about = "Check then time in-place f32 all-reduces (average) over a sweep of sizes, \
            through the trainer's communicators: NCCL with one GPU per replica, or the CPU path \
            (threads within a process, MPI between processes).\n\n\
            Every replica fills its buffer with a rank-dependent pattern, runs one all-reduce and \
            checks every element; a wrong value stops the run with exit status 1, naming the \
            size, the replica and the element. Each size is then timed (CUDA events on GPUs, the \
            wall clock on the CPU); the time is the slowest replica's mean per all-reduce.\n\n\
            Columns, as nccl-tests: algbw = bytes / time (GB = 1e9 bytes); \
            busbw = algbw * 2(n-1)/n for n replicas, comparable with a link's bandwidth.\n\n\
            Example: mpirun -np 2 p2ptrain bench-allreduce --backend cuda"
    )]
    BenchAllreduce(AllreduceArgs),
    /// Draw training loss and test accuracy against iteration and wall time (SVG or PNG).
    #[command(
        long_about = "Draw the training loss and the test accuracy of one or more runs against \
            iteration and against wall time, in one figure of four panels, runs overlaid. Each \
            run is a metrics.jsonl (or the directory holding it), labelled by its directory \
            name unless --label names it.\n\n\
            Example: p2ptrain plot runs/a/metrics.jsonl runs/b/metrics.jsonl -o curves.png"
    )]
    Plot(PlotArgs),
    /// Write the per-pixel mean image of a config's training set (Caffe's mean.binaryproto).
    #[command(
        name = "compute-mean",
        long_about = "Average every training record of a config's data set per pixel, before \
            any transform, and write the image as a Caffe BlobProto (mean.binaryproto, as \
            Caffe's compute_image_mean writes it), for `data.mean_file`. Runs in one process.\n\n\
            Example: p2ptrain compute-mean config/cifar10_quick.toml -o data/cifar10/mean.binaryproto"
    )]
    ComputeMean(MeanArgs),
    /// Score weights: the test phase alone over the whole test set, on every rank.
    #[command(
        long_about = "Run the test phase alone, over the whole test set, on every rank \
            and replica, with the weights given: no update, no snapshot. Prints the loss and \
            the accuracies (top-1 and top-5: an Accuracy layer of the net gets the one it \
            lacks) and appends them to metrics.jsonl in the output folder, as the test of a \
            training run is logged (as the test of iteration N for a snapshot \
            PREFIX_iter_N.safetensors).\n\n\
            Example: mpirun -np 2 p2ptrain test config/lenet.toml --weights \
            runs/lenet/snapshots/lenet_iter_10000.safetensors"
    )]
    Test(TestArgs),
    /// Class probabilities of new inputs, one JSON line per input.
    #[command(
        long_about = "Run the net's test-phase forward on new inputs (the config's \
            test transform applied) and write, for each input in order, one line \
            {\"input\": \"FILE#INDEX\", \"top_k\": [{\"class\": 3, \"prob\": 0.91}, ...]}. \
            The class scores are the top of the net's Softmax layer, or the scores its \
            SoftmaxWithLoss or Accuracy layer reads (softmax applied). Inputs: MNIST IDX image \
            files, CIFAR-10 batches, NumPy .npy arrays (N, C, H, W) or (N, H, W) of uint8 or \
            float32. Every rank and replica computes a contiguous share, on the CPU or the GPUs \
            as [cluster] backend says.\n\n\
            Example: p2ptrain predict config/lenet.toml --weights lenet_iter_10000.safetensors \
            --input t10k-images-idx3-ubyte.gz -o predictions.jsonl"
    )]
    Predict(PredictArgs),
    /// Convert a Caffe net (and solver and weights) into a config and a weights file.
    #[command(
        name = "import-caffe",
        long_about = "Read a Caffe net prototxt, optionally its solver prototxt and a \
            .caffemodel, and write DIR/cluster.toml and DIR/weights.safetensors, so that \
            `p2ptrain train DIR/cluster.toml --weights DIR/weights.safetensors` trains the same \
            net from the same weights. Data layers become [data] with format = \"lmdb\" and \
            train_source / test_source (relative to the prototxt's folder); a deploy net's \
            Input layer stays an input layer, with a synthetic [data] of its shape for \
            `p2ptrain predict --input`; layers keep their \
            names and Caffe's parameter names; anything p2ptrain lacks is an error naming the \
            layer, its type and the line.\n\n\
            Example: p2ptrain import-caffe lenet_train_test.prototxt --solver \
            lenet_solver.prototxt --weights lenet_iter_10000.caffemodel -o lenet/"
    )]
    ImportCaffe(ImportArgs),
    /// Write a snapshot's weights as a Caffe .caffemodel or a torchvision state dict.
    #[command(
        long_about = "Write the weights of a snapshot as a Caffe .caffemodel (every layer \
            with its type, wiring and blobs; Caffe loads it with the net's prototxt) or, for \
            ResNets named as Kaiming He's Caffe ResNets, as a safetensors state dict with \
            torchvision's names and BatchNorm conventions. The layers come from the snapshot's \
            .solverstate, or from --config.\n\n\
            Example: p2ptrain export runs/resnet50/snapshots/resnet50_iter_100.safetensors \
            --format torchvision -o resnet50_torchvision.safetensors"
    )]
    Export(ExportArgs),
    /// Write a list of images into a new Caffe LMDB (Caffe's convert_imageset).
    #[command(
        name = "convert-imageset",
        long_about = "Write the images of a Caffe list file (`relative/path label` per line, \
            paths under ROOT) into a new LMDB folder of Caffe Datums, as Caffe's convert_imageset \
            does: keys `%08d_<path>` in list order, raw pixels (C, H, W) in BGR or grey, or the \
            image files themselves with --encoded. Caffe reads the result; so does \
            `format = \"lmdb\"`.\n\n\
            Example: p2ptrain convert-imageset --gray tests/data/caffe/png/ \
            tests/data/caffe/png/train.txt digits_train_lmdb"
    )]
    ConvertImageset(ConvertArgs),
    /// Images per second of one rank's data pipeline (decode, augment, batch); no GPU needed.
    #[command(
        name = "bench-data",
        long_about = "Read, decode, augment (the config's [data] transform) and assemble \
            training batches of data.batch_size on one rank's decode workers (data.workers, or \
            --workers), check the first batch (finite values, labels below the classes), then \
            time --batches of them and print images/s and images/s per worker. No GPU, no MPI. \
            --decode-only times reading and decoding alone.\n\n\
            Example: p2ptrain bench-data config/resnet50_imagenet.toml --workers 16"
    )]
    BenchData(BenchDataArgs),
}

#[derive(Args)]
struct TestArgs {
    /// The config file (TOML).
    config: PathBuf,
    /// The weights to score (safetensors: a snapshot, or imported).
    #[arg(long, value_name = "FILE", required = true)]
    weights: PathBuf,
    /// Override a config value, as for training.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Output directory whose metrics.jsonl gets the result (default `runs/<config stem>/`).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct PredictArgs {
    /// The config file (TOML).
    config: PathBuf,
    /// The weights (safetensors).
    #[arg(long, value_name = "FILE", required = true)]
    weights: PathBuf,
    /// Input files, read in order as one list of records.
    #[arg(long = "input", value_name = "FILE", required = true, num_args = 1..)]
    inputs: Vec<PathBuf>,
    /// The predictions file to write (JSON lines).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Classes per input, most probable first.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    top_k: u64,
    /// Override a config value, as for training.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Args)]
struct ImportArgs {
    /// The net prototxt (train_val: Data layers for TRAIN and TEST; or a deploy net with an
    /// Input layer).
    net: PathBuf,
    /// The solver prototxt.
    #[arg(long, value_name = "FILE")]
    solver: Option<PathBuf>,
    /// The .caffemodel to convert into DIR/weights.safetensors.
    #[arg(long, value_name = "FILE")]
    weights: Option<PathBuf>,
    /// The folder to write cluster.toml (and weights.safetensors) into.
    #[arg(short, long, value_name = "DIR")]
    output: PathBuf,
}

#[derive(Args)]
struct ExportArgs {
    /// The snapshot's weights (.safetensors).
    snapshot: PathBuf,
    /// caffe (.caffemodel) or torchvision (safetensors state dict of a ResNet).
    #[arg(long, value_parser = clap::value_parser!(ExportFormat))]
    format: ExportFormat,
    /// The file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// The config of the weights' net, when the snapshot has no .solverstate beside it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct ConvertArgs {
    /// The folder the list's paths are relative to.
    root: PathBuf,
    /// The list file: `relative/path label` per line.
    list: PathBuf,
    /// The LMDB folder to create (it must not exist).
    db: PathBuf,
    /// Grey images (one channel); colour (B, G, R) otherwise.
    #[arg(long)]
    gray: bool,
    /// Shuffle the lines before writing (seeded by --seed).
    #[arg(long)]
    shuffle: bool,
    /// The seed of --shuffle.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Store the image files themselves (encoded: true) instead of raw pixels.
    #[arg(long)]
    encoded: bool,
    /// With --encoded: png, or the files' own type (default).
    #[arg(long, default_value = "")]
    encode_type: String,
    /// Resize every image to this height (with --resize-width).
    #[arg(long, default_value_t = 0)]
    resize_height: usize,
    /// Resize every image to this width (with --resize-height).
    #[arg(long, default_value_t = 0)]
    resize_width: usize,
}

#[derive(Args)]
struct BenchDataArgs {
    /// The config file (TOML) whose [data] names the training set.
    config: PathBuf,
    /// Untimed batches first.
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Timed batches.
    #[arg(long, default_value_t = 20)]
    batches: u64,
    /// Decode workers [default: the config's data.workers; 0 there = every core].
    #[arg(long)]
    workers: Option<usize>,
    /// Time reading and decoding only (no resampling, no batches).
    #[arg(long)]
    decode_only: bool,
    /// Override a config value, as for training.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Args)]
struct MeanArgs {
    /// The config file (TOML) whose [data] names the training set.
    config: PathBuf,
    /// The mean image file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Override a config value, as for training: `--set data.train_files=["a.bin"]`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Args)]
struct TimelineArgs {
    /// Write a timeline of the run to FILE (Chrome trace JSON: chrome://tracing, Perfetto).
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Iterations the timeline records in detail, from the first (test passes are always recorded).
    #[arg(long, value_name = "N", default_value_t = app::DEFAULT_TIMELINE_ITERS,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeline_iters: u64,
}

#[derive(Args)]
struct PlotArgs {
    /// metrics.jsonl files (or run directories holding one).
    #[arg(required = true, value_name = "METRICS")]
    inputs: Vec<PathBuf>,
    /// The figure to write: its extension (.svg or .png) picks the format.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Label of a run, in the order of the files (default: the file's directory name).
    #[arg(long = "label", value_name = "NAME")]
    labels: Vec<String>,
    /// Logarithmic loss axis.
    #[arg(long)]
    log_loss: bool,
}

#[derive(Args)]
struct AllreduceArgs {
    /// Smallest size in bytes (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "1K", value_parser = allreduce_bench::parse_bytes)]
    min_bytes: usize,
    /// Largest size in bytes [default: 1G on GPUs, 64M on the CPU].
    #[arg(long, value_parser = allreduce_bench::parse_bytes)]
    max_bytes: Option<usize>,
    /// Each size is the previous one times this.
    #[arg(long, default_value_t = 2)]
    factor: usize,
    /// Timed all-reduces per size.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed all-reduces per size before the timed ones.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// cpu, cuda, or auto (cuda when every rank has NCCL and enough GPUs).
    #[arg(long, default_value = "auto", value_parser = allreduce_bench::parse_backend)]
    backend: BackendKind,
    /// Replicas per process: threads on the CPU, GPUs on CUDA (device = node-local rank x
    /// replicas + index).
    #[arg(long, default_value_t = 1)]
    replicas_per_rank: usize,
}

#[derive(Args)]
struct Common {
    /// The config file (TOML); without one, the embedded quickstart.
    config: Option<PathBuf>,
    /// Override a config value, parsed as TOML: `--set solver.base_lr=0.1`, `--set layer.0.num_output=64`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Initialise the parameters from a safetensors file (a snapshot).
    #[arg(long, value_name = "FILE")]
    weights: Option<PathBuf>,
    /// Output directory (default `runs/<config stem>/`).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Never draw the progress bar (drawn by rank 0 when its stdout is a terminal, under a
    /// launcher only with --progress).
    #[arg(long, conflicts_with = "progress")]
    no_progress: bool,
    /// Draw the progress bar under a launcher too (mpirun, srun and torchrun give the ranks a
    /// pseudo-terminal even when the job's output goes to a file).
    #[arg(long)]
    progress: bool,
    /// Go on from a snapshot: its `.safetensors` or `.solverstate` file, or `latest` (the newest
    /// complete snapshot of `snapshot_prefix` in the output directory), or `auto` (`latest` when
    /// there is one, else a fresh start: for job scripts that are requeued). Restores the weights,
    /// solver history, iteration and data position on every replica.
    #[arg(long, value_name = "FILE|latest|auto")]
    resume: Option<String>,
    /// With --resume: accept a global batch (batch_size x replicas x iter_size) other than the
    /// snapshot's.
    #[arg(long)]
    allow_batch_change: bool,
}

impl From<Common> for Options {
    fn from(c: Common) -> Self {
        Options {
            config: c.config,
            sets: c.sets,
            weights: c.weights,
            output: c.output,
            progress: match (c.progress, c.no_progress) {
                (true, _) => app::Progress::Always,
                (_, true) => app::Progress::Never,
                _ => app::Progress::Auto,
            },
            resume: c.resume.as_deref().map(app::ResumeFrom::parse),
            allow_batch_change: c.allow_batch_change,
            ..Options::default()
        }
    }
}

/// `p2ptrain CONFIG ...` means `p2ptrain train CONFIG ...`.
fn with_default_command(mut args: Vec<String>) -> Vec<String> {
    const KNOWN: [&str; 17] = [
        "train",
        "plot",
        "compute-mean",
        "test",
        "predict",
        "import-caffe",
        "export",
        "convert-imageset",
        "bench-data",
        "check",
        "bench",
        "bench-allreduce",
        "help",
        "-h",
        "--help",
        "-V",
        "--version",
    ];
    if let Some(first) = args.get(1) {
        if !KNOWN.contains(&first.as_str()) {
            args.insert(1, "train".into());
        }
    }
    args
}

/// This process's rank as the launcher set it (`mpirun`, `srun`, torchrun, or an MPICH-style
/// `PMI_RANK`); 0 when started alone.
fn launcher_rank() -> usize {
    p2ptrain::dist::launch_env::LaunchEnv::detect()
        .map(|l| l.rank)
        .or_else(|| std::env::var("PMI_RANK").ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// The first rank of this process's command line under OpenMPI's MPMD launch
/// (`mpirun -np 2 A : -np 1 B`): the ranks of the application contexts before this one
/// (`OMPI_APP_CTX_NUM_PROCS`, one count per context, and this one's index
/// `OMPI_MCA_orte_app_num`). `None` where the launcher does not say.
fn first_rank_of_command_line() -> Option<usize> {
    let var = |k: &str| std::env::var(k).ok();
    let app: usize = var("OMPI_MCA_orte_app_num")?.trim().parse().ok()?;
    let counts: Vec<usize> = var("OMPI_APP_CTX_NUM_PROCS")?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    (app < counts.len()).then(|| counts[..app].iter().sum())
}

/// Parses the command line. Every rank started with one command line parses the same
/// arguments, so a usage error (or `--help`) is printed by the first of them only (rank 0, or
/// the first rank of each command line of an MPMD launch), and every rank exits with clap's code
/// (2 for an error).
fn parse_cli() -> Cli {
    Cli::try_parse_from(with_default_command(std::env::args().collect())).unwrap_or_else(|e| {
        if launcher_rank() == first_rank_of_command_line().unwrap_or(0) {
            let _ = e.print();
        }
        std::process::exit(e.exit_code())
    })
}

fn main() {
    let cli = parse_cli();
    let (action, opts) = match cli.command {
        None => (Action::Train, Options::default()),
        Some(Command::Train { common, timeline }) => (
            Action::Train,
            Options {
                timeline: timeline.timeline,
                timeline_iters: timeline.timeline_iters,
                ..common.into()
            },
        ),
        Some(Command::Check(c)) => (Action::Check, c.into()),
        Some(Command::Bench {
            common,
            warmup,
            iters,
            layers,
        }) => (
            Action::Bench {
                warmup,
                iters,
                layers,
            },
            common.into(),
        ),
        Some(Command::Plot(p)) => std::process::exit(plot::run(&PlotOptions {
            inputs: p.inputs,
            labels: p.labels,
            output: p.output,
            log_loss: p.log_loss,
        })),
        Some(Command::ComputeMean(m)) => std::process::exit(compute_mean::run(&MeanOptions {
            config: m.config,
            sets: m.sets,
            output: m.output,
        })),
        Some(Command::Test(t)) => (
            Action::Test,
            Options {
                config: Some(t.config),
                sets: t.sets,
                weights: Some(t.weights),
                output: t.output,
                progress: app::Progress::Never,
                ..Options::default()
            },
        ),
        Some(Command::Predict(p)) => (
            Action::Predict(p2ptrain::cmd::predict::Request {
                inputs: p.inputs,
                output: p.output,
                top_k: usize::try_from(p.top_k).unwrap_or(usize::MAX),
            }),
            Options {
                config: Some(p.config),
                sets: p.sets,
                weights: Some(p.weights),
                progress: app::Progress::Never,
                ..Options::default()
            },
        ),
        Some(Command::ImportCaffe(i)) => {
            std::process::exit(p2ptrain::cmd::import_caffe::run(&ImportOptions {
                net: i.net,
                solver: i.solver,
                weights: i.weights,
                out_dir: i.output,
            }))
        }
        Some(Command::Export(e)) => {
            std::process::exit(p2ptrain::cmd::export::run(&ExportOptions {
                snapshot: e.snapshot,
                config: e.config,
                format: e.format,
                output: e.output,
            }))
        }
        Some(Command::ConvertImageset(c)) => {
            std::process::exit(convert_imageset::run(&ConvertOptions {
                root: c.root,
                list: c.list,
                output: c.db,
                gray: c.gray,
                shuffle: c.shuffle,
                seed: c.seed,
                encoded: c.encoded,
                encode_type: c.encode_type,
                resize_height: c.resize_height,
                resize_width: c.resize_width,
            }))
        }
        Some(Command::BenchData(b)) => std::process::exit(bench_data::run(&BenchDataOptions {
            config: b.config,
            sets: b.sets,
            warmup: b.warmup,
            batches: b.batches,
            workers: b.workers,
            decode_only: b.decode_only,
        })),
        Some(Command::BenchAllreduce(a)) => {
            std::process::exit(allreduce_bench::run(&BenchOptions {
                min_bytes: a.min_bytes,
                max_bytes: a.max_bytes,
                factor: a.factor,
                iters: a.iters,
                warmup: a.warmup,
                backend: a.backend,
                replicas_per_rank: a.replicas_per_rank,
            }))
        }
    };
    let code = app::run(action, opts);
    p2ptrain::logging::drain();
    std::process::exit(code);
}
