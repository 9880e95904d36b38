//! The config file: serde structs in Caffe's vocabulary (`[cluster]`, `[data]`, `[solver]`,
//! `[[layer]]`), parsed from TOML with `--set` overrides, validated as a whole before anything is
//! allocated, and resolved into a [`Plan`]. No backend or communicator types here.
//!
//! The key names are the user contract: extend, never rename.

pub mod layer_params;
mod load;
mod locate;
mod plan;

pub use layer_params::{LayerKind, LayerParams};
pub use load::{parse, parse_bytes, parse_str, Source};
pub use plan::{fnv1a64, rank_fingerprint, state_fingerprint, Plan, RESUME_FREE_KEYS};

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The whole config file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub cluster: ClusterConfig,
    pub data: DataConfig,
    pub solver: SolverConfig,
    #[serde(rename = "layer")]
    pub layers: Vec<LayerConfig>,
}

/// Which compute backend runs the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    #[default]
    Cpu,
    Cuda,
    Auto,
}

/// `[cluster]`: how replicas map onto processes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub backend: BackendKind,
    /// Replicas (threads, later GPUs) per MPI rank.
    #[serde(default = "one")]
    pub replicas_per_rank: usize,
    /// GEMM threads per replica on the CPU backend; 0 = the node's cores divided among its replicas.
    #[serde(default)]
    pub threads_per_replica: usize,
    /// How gradients are all-reduced on GPUs.
    #[serde(default)]
    pub reduce: ReduceMode,
    /// Target size of a gradient bucket (`reduce = "bucketed"`), in MiB of FP32 gradient.
    #[serde(default = "bucket_mb_default")]
    pub bucket_mb: f64,
    /// The element type gradients travel in during their all-reduce: `"fp32"`, or `"bf16"`
    /// (half the bytes; each replica's gradient and the sum rounded to bfloat16).
    #[serde(default)]
    pub reduce_dtype: ReduceDtype,
    /// How the bfloat16 wire's buckets cross between the GPUs of one host: `"nccl"` (NCCL's
    /// all-reduce, on the multiprocessors) or `"copy_engines"` (peer copies by the copy engines
    /// and one summing kernel; see [`ReduceTransport`]).
    #[serde(default)]
    pub reduce_transport: ReduceTransport,
    /// Compute precision: `"fp32"`, `"tf32"` (GPU GEMMs on tensor cores, 10-bit mantissa
    /// inputs), or mixed precision `"bf16"` / `"fp16"` (activations and their gradients in the
    /// half type, FP32 master weights; see [`MathMode`] and `crate::precision`).
    #[serde(default)]
    pub math: MathMode,
    /// Loss scaling: `"dynamic"`, a fixed positive number, or unset (the default: dynamic
    /// with `math = "fp16"`, none otherwise). See `crate::solver::loss_scale`.
    pub loss_scale: Option<LossScale>,
    /// Dynamic loss scaling: the scale of the first step.
    #[serde(default = "loss_scale_init_default")]
    pub loss_scale_init: f32,
    /// Dynamic loss scaling: the scale doubles after this many steps in a row without overflow.
    #[serde(default = "loss_scale_growth_interval_default")]
    pub loss_scale_growth_interval: u64,
    /// Dynamic loss scaling: the factor the scale is multiplied by on an overflow, in (0, 1).
    #[serde(default = "loss_scale_backoff_default")]
    pub loss_scale_backoff: f32,
    /// How cuDNN convolution algorithms are chosen per shape on GPUs.
    #[serde(default)]
    pub conv_algorithm: ConvAlgorithm,
    /// `true`: GPU convolutions take only deterministic cuDNN algorithms, and in `fp32` only the
    /// GEMM-like ones (a plain dot product's rounding). `false`: any algorithm cuDNN offers (FFT,
    /// Winograd, non-deterministic backward ones), as PyTorch does by default.
    #[serde(default = "yes")]
    pub conv_exact: bool,
    /// How GPUs store 4-D activations: `"auto"` (channels-last with `math = "tf32"` where most of
    /// the convolution work has at least 64 input channels, else NCHW), `"nchw"` or `"nhwc"`.
    #[serde(default)]
    pub gpu_layout: GpuLayout,
    /// The number of MPI processes the job must have; the job stops at start-up when MPI's world
    /// differs (a launcher misconfiguration). Unset: any.
    pub world_size: Option<usize>,
    /// Compare a bit-exact hash of every replica's parameters every this many iterations and stop
    /// the job at the first difference (0: never).
    #[serde(default)]
    pub verify_interval: u64,
    /// Seconds any rank waits in one collective (gradient all-reduce, score sum, barrier,
    /// broadcast, start-up agreement) before it names the missing ranks and aborts the job.
    #[serde(default = "collective_timeout_default")]
    pub collective_timeout_s: f64,
    /// How the replicas keep together: a gradient all-reduce every step, or local SGD.
    #[serde(default)]
    pub sync: SyncMode,
    /// Local SGD: steps between two averagings of the parameters (H).
    #[serde(default = "sync_period_default")]
    pub sync_period: u64,
    /// Local SGD: synchronous steps (gradient all-reduce) before the first local one.
    #[serde(default)]
    pub sync_warmup: u64,
    /// Local SGD: which replicas still all-reduce their gradients every step.
    #[serde(default)]
    pub sync_scope: SyncScope,
    /// Local SGD: the rule that turns the replicas' parameters into the averaged ones.
    #[serde(default)]
    pub outer_optimizer: OuterOptimizer,
    /// Local SGD with `outer_optimizer = "nesterov"`: the outer learning rate.
    #[serde(default = "outer_lr_default")]
    pub outer_lr: f32,
    /// Local SGD with `outer_optimizer = "nesterov"`: the outer momentum.
    #[serde(default = "outer_momentum_default")]
    pub outer_momentum: f32,
    /// Ranks per node for `sync_scope = "node"`: consecutive blocks of this many MPI ranks form
    /// a node; 0: the hosts, as MPI finds them (ranks that share memory).
    #[serde(default)]
    pub node_ranks: usize,
}

/// How the replicas keep their parameters together (`cluster.sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// Synchronous SGD: the gradients are all-reduced every step; the replicas never differ.
    #[default]
    Allreduce,
    /// Local SGD: each replica steps on its own gradient (or its node's, see [`SyncScope`]) and
    /// the parameters are averaged every `sync_period` steps (`crate::parallel::local_sgd`).
    LocalSgd,
}

/// Which replicas all-reduce their gradients every step under local SGD (`cluster.sync_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SyncScope {
    /// None: every replica steps on its own gradient.
    #[default]
    Replica,
    /// The replicas of one node (shared memory, NVLink); nodes average their parameters every
    /// `sync_period` steps.
    Node,
}

/// The outer rule of local SGD (`cluster.outer_optimizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OuterOptimizer {
    /// The replicas' parameters are replaced by their mean.
    #[default]
    Average,
    /// Nesterov momentum on the mean parameter delta since the last averaging, with `outer_lr`
    /// and `outer_momentum` (DiLoCo's outer step).
    Nesterov,
}

impl OuterOptimizer {
    /// The names of the state buffers the rule keeps, each as long as the parameters (a
    /// snapshot's `outer/<name>/<tensor>`): none for the average, the anchor (the parameters of
    /// the last averaging) and the momentum for Nesterov.
    pub fn state_names(self) -> &'static [&'static str] {
        match self {
            OuterOptimizer::Average => &[],
            OuterOptimizer::Nesterov => &["anchor", "momentum"],
        }
    }
}

/// Gradient all-reduce schedule on GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReduceMode {
    /// One all-reduce of the whole gradient buffer after backward.
    Flat,
    /// Each layer's gradient span as soon as its backward is done (Caffe's).
    Layerwise,
    /// Contiguous spans of about `bucket_mb`, in reverse layer order, each launched when all its
    /// layers are done.
    #[default]
    Bucketed,
}

/// The element type of the gradient all-reduce (`cluster.reduce_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReduceDtype {
    /// The FP32 gradients themselves.
    #[default]
    Fp32,
    /// bfloat16 (8-bit significand, FP32's exponent range): each replica's gradient is rounded
    /// to it (to nearest, ties to even), summed in it, and the sum brought back to FP32 and
    /// divided by the replicas (`crate::dist::wire`).
    Bf16,
}

/// How the buckets of the bfloat16 gradient wire are summed across GPUs
/// (`cluster.reduce_transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReduceTransport {
    /// NCCL's all-reduce, whose kernels run on the multiprocessors beside the backward pass.
    #[default]
    Nccl,
    /// Every replica on one host, GPUs reaching each other by peer access (NVLink or PCIe): each
    /// bucket is reduce-scattered and all-gathered by peer copies, which the copy engines run
    /// without a multiprocessor, and its slices are summed by one kernel in rank order
    /// (`crate::cuda::peer_wire`). Needs `reduce_dtype = "bf16"` and the GPU backend.
    CopyEngines,
}

impl ReduceDtype {
    /// Bytes one gradient element takes on the wire.
    pub fn bytes(self) -> usize {
        match self {
            ReduceDtype::Fp32 => 4,
            ReduceDtype::Bf16 => 2,
        }
    }
}

/// Compute precision (`cluster.math`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MathMode {
    /// FP32 everywhere.
    #[default]
    Fp32,
    /// FP32 storage; GPU GEMMs and convolutions on tensor cores with TF32 inputs (the CPU
    /// computes in FP32).
    Tf32,
    /// Mixed precision with bfloat16 activations (8 significant bits, FP32's range): the
    /// rounding points of `crate::precision`.
    Bf16,
    /// Mixed precision with IEEE binary16 activations (11 significant bits, largest finite
    /// 65504), loss scaling by default.
    Fp16,
}

impl MathMode {
    /// Whether activations and their gradients are kept in a 16-bit type.
    pub fn is_half(self) -> bool {
        matches!(self, MathMode::Bf16 | MathMode::Fp16)
    }

    /// Whether GPU GEMMs and convolutions run on tensor cores with TF32 operands: in `tf32`,
    /// and in the half modes, whose values TF32 holds exactly (bf16's 8 and fp16's 11
    /// significant bits within TF32's 11, its exponent range FP32's), so that the products are
    /// those of half-type operands, accumulated in FP32.
    pub fn tf32_tensor_cores(self) -> bool {
        self != MathMode::Fp32
    }
}

/// `cluster.loss_scale`: `"dynamic"` or a fixed factor (anything else is refused saying so).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    /// Backed off on an overflow, grown after a run of good steps.
    Dynamic,
    /// A fixed factor, never changed.
    Fixed(f32),
}

/// What `cluster.loss_scale` accepts, in messages.
const LOSS_SCALE_EXPECTED: &str = "\"dynamic\" or a positive number (a fixed scale)";

impl Serialize for LossScale {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            LossScale::Dynamic => s.serialize_str("dynamic"),
            LossScale::Fixed(v) => s.serialize_f32(*v),
        }
    }
}

impl<'de> Deserialize<'de> for LossScale {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(LossScaleVisitor)
    }
}

/// Reads a [`LossScale`]: `"dynamic"` or a number.
struct LossScaleVisitor;

impl serde::de::Visitor<'_> for LossScaleVisitor {
    type Value = LossScale;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(LOSS_SCALE_EXPECTED)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<LossScale, E> {
        match v {
            "dynamic" => Ok(LossScale::Dynamic),
            _ => Err(E::custom(format!(
                "expected {LOSS_SCALE_EXPECTED}, found {v:?}"
            ))),
        }
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<LossScale, E> {
        Ok(LossScale::Fixed(v as f32))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<LossScale, E> {
        Ok(LossScale::Fixed(v as f32))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<LossScale, E> {
        Ok(LossScale::Fixed(v as f32))
    }
}

/// How GPUs store 4-D activations (`cluster.gpu_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GpuLayout {
    /// Channels-last where tensor cores compute (not `math = "fp32"`) and most of the
    /// convolutions' multiply-adds have at least 64 input channels; in bf16 and fp16 also where
    /// the convolutions do at least [`HALF_CHANNELS_LAST_MACS`] multiply-adds a step; NCHW
    /// otherwise. cuDNN's tensor-core convolutions run fastest on channels-last tensors once
    /// they are that wide, its FP32 ones and narrow ones (cifar10_quick's in tf32) on NCHW. In
    /// the half types, narrow convolutions run on half-type blobs channels-last, which pays once
    /// a step holds enough work to hide its heavier host side (cuDNN's graph API).
    #[default]
    Auto,
    /// Caffe's `(N, C, H, W)` everywhere.
    Nchw,
    /// Channels-last `(N, H, W, C)` wherever the layers can run on it.
    Nhwc,
}

/// The convolutions' multiply-adds a step (one replica's batch, forward) from which
/// `gpu_layout = "auto"` stores a net of narrow convolutions channels-last in bf16 and fp16.
/// Measured on one H200 (docs/benchmarks.md, "The layout `auto` picks in the half types"),
/// channels-last against NCHW: 1.12–1.31× for ResNet-20 at batch 128 (5.2 G multiply-adds) and
/// 1.00–1.20× for cifar10_quick at 512 (6.3 G); 0.69–1.13× (median 0.96) for cifar10_quick at
/// 100 (1.2 G), 0.51–0.82× for LeNet at 64 (0.12 G) and 0.71–0.95× for the digits net.
pub const HALF_CHANNELS_LAST_MACS: f64 = 2.5e9;

impl GpuLayout {
    /// Whether GPUs store activations channels-last under `math`, for a net whose
    /// convolutions are `wide` and do `macs` multiply-adds a step (see [`GpuLayout::Auto`]).
    pub fn channels_last(self, math: MathMode, wide: bool, macs: f64) -> bool {
        match self {
            GpuLayout::Auto => {
                let large = math.is_half() && macs >= HALF_CHANNELS_LAST_MACS;
                math.tf32_tensor_cores() && (wide || large)
            }
            GpuLayout::Nchw => false,
            GpuLayout::Nhwc => true,
        }
    }
}

/// How the GPU convolution layer chooses cuDNN's algorithms for each input shape, among those
/// `conv_exact` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ConvAlgorithm {
    /// Time every candidate once per shape at the first step (`cudnnFind*`) and keep the
    /// fastest: the choice may differ between runs and replicas (results then differ by rounding).
    #[default]
    Measured,
    /// Take cuDNN's heuristic ranking without timing anything: the same algorithms every run.
    Heuristic,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            backend: BackendKind::Cpu,
            replicas_per_rank: 1,
            threads_per_replica: 0,
            reduce: ReduceMode::Bucketed,
            bucket_mb: bucket_mb_default(),
            reduce_dtype: ReduceDtype::Fp32,
            reduce_transport: ReduceTransport::Nccl,
            math: MathMode::Fp32,
            loss_scale: None,
            loss_scale_init: loss_scale_init_default(),
            loss_scale_growth_interval: loss_scale_growth_interval_default(),
            loss_scale_backoff: loss_scale_backoff_default(),
            conv_algorithm: ConvAlgorithm::Measured,
            conv_exact: true,
            gpu_layout: GpuLayout::Auto,
            world_size: None,
            verify_interval: 0,
            collective_timeout_s: collective_timeout_default(),
            sync: SyncMode::Allreduce,
            sync_period: sync_period_default(),
            sync_warmup: 0,
            sync_scope: SyncScope::Replica,
            outer_optimizer: OuterOptimizer::Average,
            outer_lr: outer_lr_default(),
            outer_momentum: outer_momentum_default(),
            node_ranks: 0,
        }
    }
}

/// Record source format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// MNIST IDX files, gzip-compressed or raw.
    Idx,
    /// Deterministic random records of `shape`, for benchmarks.
    Synthetic,
    /// The handwritten-digit set bundled in the binary (1500 train, 297 test, 1×8×8, 10 classes).
    Digits,
    /// CIFAR-10 binary batches: records of 1 label byte and 3×32×32 pixel bytes.
    Cifar10,
    /// Caffe LMDBs of `Datum`s (raw pixels, `float_data`, or encoded JPEG/PNG).
    Lmdb,
    /// Caffe `ImageData` list files: `relative/path label` per line, under `root_folder`.
    #[serde(rename = "image_list")]
    ImageList,
    /// One folder per class (torchvision's `ImageFolder`), classes in sorted name order.
    #[serde(rename = "image_folder")]
    ImageFolder,
}

/// The values of synthetic records (`data.pixels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SyntheticPixels {
    /// Floats in [0, 1), handed to the net as floats.
    #[default]
    Float,
    /// Whole 8-bit pixels, 0 to 255: batches travel as bytes and are normalised where they are
    /// used (on a GPU, by the device), as the image formats' do.
    U8,
}

/// Which library decodes JPEG files (`data.jpeg_decoder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum JpegDecoderKind {
    /// zune-jpeg (pure Rust, whole images).
    Zune,
    /// jpeg-decoder (pure Rust, image-rs).
    JpegDecoder,
    /// libjpeg-turbo (C with SIMD, built from source by the `turbojpeg-sys` crate), decoding
    /// only the part of each image that `random_resized_crop`'s window needs: the fastest
    /// measured (docs/benchmarks.md).
    #[default]
    LibjpegTurbo,
}

/// What reading a record that cannot be decoded does (`data.on_corrupt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CorruptMode {
    /// Stop with an error naming the record's file or LMDB key (exit 2).
    #[default]
    Stop,
    /// Read the next readable record in its place, counting and logging the skip.
    Skip,
}

/// `[data]`: feeds the net the blobs `data` (N, C, H, W) and `label` (N).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    pub format: DataFormat,
    /// IDX paths, relative to the config file (resolved to absolute by `load`).
    pub train_images: Option<PathBuf>,
    pub train_labels: Option<PathBuf>,
    pub test_images: Option<PathBuf>,
    pub test_labels: Option<PathBuf>,
    /// CIFAR-10 batch files (`data_batch_*.bin`, `test_batch.bin`), relative to the config file.
    pub train_files: Option<Vec<PathBuf>>,
    pub test_files: Option<Vec<PathBuf>>,
    /// Per-replica batch.
    pub batch_size: usize,
    /// Per-replica batch of the test pass; default `batch_size`.
    pub test_batch_size: Option<usize>,
    #[serde(default = "yes")]
    pub shuffle: bool,
    /// Pixel value multiplier applied after mean subtraction.
    #[serde(default = "unit")]
    pub scale: f32,
    /// Subtracted from every pixel before scaling (all channels; see `mean_value`).
    #[serde(default)]
    pub mean: f32,
    /// Per-channel mean subtracted before scaling: one value for every channel or one per
    /// channel (Caffe's `mean_value`); excludes a non-zero `mean`.
    pub mean_value: Option<Vec<f32>>,
    /// Per-pixel mean image `(C, H, W)` of the records, subtracted before scaling (Caffe's
    /// `mean_file`: a `BlobProto` binaryproto, e.g. from `p2ptrain compute-mean`), relative to
    /// the config file; excludes `mean` and `mean_value`.
    pub mean_file: Option<PathBuf>,
    /// Square crop side: random crops in training, the centre crop in tests; 0 = no crop.
    #[serde(default)]
    pub crop_size: usize,
    /// Random horizontal flips in training.
    #[serde(default)]
    pub mirror: bool,
    /// Number of classes; labels must be below it. Default: 10 for IDX.
    pub classes: Option<usize>,
    /// Synthetic: record shape `[C, H, W]`.
    pub shape: Option<Vec<usize>>,
    /// Synthetic: number of training records.
    pub train_size: Option<usize>,
    /// Synthetic: number of test records.
    pub test_size: Option<usize>,
    /// Synthetic: the records' values (default `"float"`, in [0, 1)).
    pub pixels: Option<SyntheticPixels>,
    /// Training augmentation: translate each record by up to `shift` pixels along H and W
    /// (offsets keyed by seed and stream position; the border gets the value of a zero pixel).
    #[serde(default)]
    pub shift: usize,
    /// Image formats: the training and test data — an LMDB folder (`lmdb`), a list file
    /// (`image_list`), a folder of class folders (`image_folder`) — relative to the config file.
    pub train_source: Option<PathBuf>,
    pub test_source: Option<PathBuf>,
    /// `image_list`: the folder the list's paths are relative to (Caffe's `root_folder`);
    /// default the list file's folder.
    pub root_folder: Option<PathBuf>,
    /// Image formats: decode encoded images as colour (3 channels, B, G, R) or grey (Caffe's
    /// `is_color`; raw `Datum`s keep their own channels).
    #[serde(default = "yes")]
    pub is_color: bool,
    /// Image formats: resize every decoded image to `new_height`×`new_width` (Caffe's; 0 = off,
    /// both or neither).
    #[serde(default)]
    pub new_height: usize,
    #[serde(default)]
    pub new_width: usize,
    /// Image formats: ImageNet's training crop — a random window of `crop_area` of the image's
    /// area and aspect ratio in `crop_aspect`, resized to this side, keyed by (seed, stream
    /// position); 0 = off. Tests then resize the shorter side to `resize_shorter` and take the
    /// centre `center_crop` square.
    #[serde(default)]
    pub random_resized_crop: usize,
    /// Fraction of the image's area a random resized crop covers: `[min, max]`, default
    /// `[0.08, 1.0]`.
    pub crop_area: Option<Vec<f32>>,
    /// Aspect ratio (width / height) range of a random resized crop: default `[0.75, 1.3333]`.
    pub crop_aspect: Option<Vec<f32>>,
    /// Test images: the shorter side resized to this; default `random_resized_crop / 0.875`
    /// (256 for 224).
    pub resize_shorter: Option<usize>,
    /// Test images: the centre square of this side after `resize_shorter`; it must equal
    /// `random_resized_crop` (the default).
    pub center_crop: Option<usize>,
    /// Decode workers per rank (image formats); 0 = the node's cores divided among its ranks.
    #[serde(default)]
    pub workers: usize,
    /// What an unreadable image or record does: `"stop"` (exit 2, naming it) or `"skip"`.
    #[serde(default)]
    pub on_corrupt: CorruptMode,
    /// Image formats: the JPEG decoder, `"libjpeg-turbo"` (default), `"zune"` or `"jpeg-decoder"`.
    #[serde(default)]
    pub jpeg_decoder: JpegDecoderKind,
    /// Batches each replica's reader keeps ready, at least (small batches: more, see
    /// [`crate::data::reader::ReadyQueue`]).
    #[serde(default = "prefetch_default")]
    pub prefetch: usize,
}

/// Update rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SolverType {
    Sgd,
    Nesterov,
    Adagrad,
    Rmsprop,
    Adam,
    /// Caffe's AdaDelta (Zeiler 2012), `momentum` its decay.
    Adadelta,
    /// Adam with decoupled weight decay (Loshchilov and Hutter 2019), as PyTorch's AdamW.
    Adamw,
}

/// Learning-rate policy (Caffe's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LrPolicy {
    Fixed,
    Step,
    Multistep,
    Exp,
    Inv,
    Poly,
    Sigmoid,
    /// `base_lr · (1 + cos(π · iter / max_iter)) / 2`.
    Cosine,
}

/// Weight-decay norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
pub enum Regularization {
    #[default]
    L2,
    L1,
}

/// `[solver]`: the training loop and update rule.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SolverConfig {
    #[serde(rename = "type", default = "sgd")]
    pub solver_type: SolverType,
    pub base_lr: f32,
    #[serde(default)]
    pub momentum: f32,
    /// Adam's β₂.
    #[serde(default = "beta2_default")]
    pub momentum2: f32,
    /// AdaGrad / RMSProp / Adam ε.
    #[serde(default = "delta_default")]
    pub delta: f32,
    #[serde(default = "rms_decay_default")]
    pub rms_decay: f32,
    #[serde(default)]
    pub weight_decay: f32,
    #[serde(default)]
    pub regularization_type: Regularization,
    #[serde(default = "fixed")]
    pub lr_policy: LrPolicy,
    #[serde(default)]
    pub gamma: f32,
    #[serde(default)]
    pub power: f32,
    #[serde(default)]
    pub stepsize: u64,
    #[serde(default)]
    pub stepvalue: Vec<u64>,
    /// Linear warmup: iteration `i < warmup_iter` gets `(i + 1) / warmup_iter` of the
    /// policy's rate (0: none).
    #[serde(default)]
    pub warmup_iter: u64,
    pub max_iter: u64,
    /// Sub-batches accumulated per iteration.
    #[serde(default = "one_u64")]
    pub iter_size: u64,
    /// Log every `display` iterations (0: never).
    #[serde(default)]
    pub display: u64,
    /// Smooth the displayed loss over this many iterations.
    #[serde(default = "one_u64")]
    pub average_loss: u64,
    /// Test every `test_interval` iterations (0: only at the end).
    #[serde(default)]
    pub test_interval: u64,
    /// Test batches per replica; default: the whole test set.
    pub test_iter: Option<u64>,
    #[serde(default)]
    pub test_initialization: bool,
    /// Snapshot every `snapshot` iterations (0: only at the end).
    #[serde(default)]
    pub snapshot: u64,
    #[serde(default = "snapshot_prefix_default")]
    pub snapshot_prefix: String,
    /// Keep only the newest this many snapshots of `snapshot_prefix` (0: keep all).
    #[serde(default)]
    pub snapshot_keep: usize,
    /// What SIGINT and SIGTERM do (Caffe's `-sigint_effect`).
    #[serde(default = "sigint_effect_default")]
    pub sigint_effect: SignalEffect,
    /// What SIGHUP does (Caffe's `-sighup_effect`).
    #[serde(default = "sighup_effect_default")]
    pub sighup_effect: SignalEffect,
    #[serde(default = "one_u64")]
    pub random_seed: u64,
    /// Clip the global L2 norm of the averaged gradient to this value (≤ 0: off).
    #[serde(default = "neg_one")]
    pub clip_gradients: f32,
    /// What a step whose loss or averaged gradient is not finite does (see
    /// `crate::solver::non_finite`).
    #[serde(default)]
    pub non_finite: NonFiniteMode,
}

/// What a step whose loss or averaged gradient holds a NaN or an infinity does; its update is
/// never applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NonFiniteMode {
    /// Every rank fails at that iteration (exit 1), the last snapshot kept.
    #[default]
    Stop,
    /// Training goes on without that update; the step is counted in `metrics.jsonl`.
    Skip,
}

/// What a signal does to training, at the next iteration boundary agreed by every replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalEffect {
    /// Snapshot, then stop every rank.
    SnapshotStop,
    /// Snapshot, then go on training.
    Snapshot,
    /// Stop every rank without a snapshot.
    Stop,
    /// Ignore the signal.
    None,
}

/// A spatial size given once for every spatial axis or once per axis: `3` or `[3, 5]`
/// (Caffe's repeated `kernel_size`, `stride`, `pad`, `dilation`). Anything else (a negative
/// number, a string, a list holding one) is refused saying what the key accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Dims {
    One(usize),
    PerAxis(Vec<usize>),
}

/// What a [`Dims`] key accepts, in messages.
const DIMS_EXPECTED: &str =
    "a non-negative integer or a list of them, one per spatial axis (e.g. 1 or [1, 2])";

impl<'de> Deserialize<'de> for Dims {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(DimsVisitor)
    }
}

/// Reads a [`Dims`]: an integer or a sequence of them.
struct DimsVisitor;

impl<'de> serde::de::Visitor<'de> for DimsVisitor {
    type Value = Dims;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(DIMS_EXPECTED)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Dims, E> {
        dim(v, DIMS_EXPECTED).map(Dims::One)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Dims, E> {
        dim(v, DIMS_EXPECTED).map(Dims::One)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Dims, A::Error> {
        let mut list = Vec::new();
        while let Some(Dim(v)) = seq.next_element()? {
            list.push(v);
        }
        Ok(Dims::PerAxis(list))
    }
}

/// One entry of a per-axis [`Dims`] list.
struct Dim(usize);

/// What an entry of a per-axis [`Dims`] list accepts, in messages.
const DIM_EXPECTED: &str = "a non-negative integer in each entry of the list";

impl<'de> Deserialize<'de> for Dim {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(DimVisitor)
    }
}

/// Reads a [`Dim`]: a non-negative integer.
struct DimVisitor;

impl<'de> serde::de::Visitor<'de> for DimVisitor {
    type Value = Dim;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(DIM_EXPECTED)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Dim, E> {
        dim(v, DIM_EXPECTED).map(Dim)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Dim, E> {
        dim(v, DIM_EXPECTED).map(Dim)
    }
}

/// `v` as a size, or an error saying `expected` and what was found.
fn dim<T, E>(v: T, expected: &str) -> std::result::Result<usize, E>
where
    T: Copy + std::fmt::Display + TryInto<usize>,
    E: serde::de::Error,
{
    v.try_into()
        .map_err(|_| E::custom(format!("expected {expected}, found {v}")))
}

impl Dims {
    /// The value for each of `axes` spatial axes; `None` when a per-axis list has another length.
    pub fn per_axis(&self, axes: usize) -> Option<Vec<usize>> {
        match self {
            Dims::One(v) => Some(vec![*v; axes]),
            Dims::PerAxis(v) if v.len() == axes => Some(v.clone()),
            Dims::PerAxis(v) if v.len() == 1 => Some(vec![v[0]; axes]),
            Dims::PerAxis(_) => None,
        }
    }
}

/// Pooling methods (Caffe's `pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolMethod {
    Max,
    Ave,
}

/// Eltwise operations (Caffe's `operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EltwiseOp {
    Sum,
    Prod,
    Max,
}

/// The neighbourhood LRN normalises over (Caffe's `norm_region`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormRegion {
    /// `local_size` adjacent channels at the same position.
    AcrossChannels,
    /// A `local_size × local_size` square of positions in the same channel.
    WithinChannel,
}

/// Phase in which a layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Train,
    Test,
}

/// Filler kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FillerKind {
    Constant,
    Uniform,
    Gaussian,
    Xavier,
    Msra,
    /// Caffe's bilinear interpolation kernel, for a (de)convolution's square weight.
    Bilinear,
}

/// Fan used by xavier and msra.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum VarianceNorm {
    #[default]
    FanIn,
    FanOut,
    Average,
}

/// A weight initialiser, e.g. `{ type = "xavier" }` or `{ type = "gaussian", std = 0.01 }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FillerConfig {
    #[serde(rename = "type")]
    pub kind: FillerKind,
    #[serde(default)]
    pub value: f32,
    #[serde(default)]
    pub min: f32,
    #[serde(default = "unit")]
    pub max: f32,
    #[serde(default)]
    pub mean: f32,
    #[serde(default = "unit")]
    pub std: f32,
    #[serde(default)]
    pub variance_norm: VarianceNorm,
}

impl FillerConfig {
    /// `{ type = "constant", value }`.
    pub fn constant(value: f32) -> Self {
        FillerConfig {
            kind: FillerKind::Constant,
            value,
            min: 0.0,
            max: 1.0,
            mean: 0.0,
            std: 1.0,
            variance_norm: VarianceNorm::FanIn,
        }
    }
}

/// One `[[layer]]` table. Type-specific keys are flattened into it, as Caffe's `*_param` fields;
/// validation rejects a key that does not apply to the layer's type.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LayerConfig {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: LayerKind,
    #[serde(default)]
    pub bottom: Vec<String>,
    #[serde(default)]
    pub top: Vec<String>,
    /// Run only in this phase; default both.
    pub phase: Option<Phase>,
    /// Weight of this layer's loss top; default 1 for loss layers, 0 otherwise.
    pub loss_weight: Option<f32>,
    /// Per learnable tensor (weight, bias): learning-rate multiplier.
    pub lr_mult: Option<Vec<f32>>,
    /// Per learnable tensor (weight, bias): weight-decay multiplier.
    pub decay_mult: Option<Vec<f32>>,
    // inner_product
    pub num_output: Option<usize>,
    pub bias_term: Option<bool>,
    pub weight_filler: Option<FillerConfig>,
    pub bias_filler: Option<FillerConfig>,
    /// First axis flattened into the inner product / softmax axis; default 1.
    pub axis: Option<usize>,
    // relu
    pub negative_slope: Option<f32>,
    // accuracy
    pub top_k: Option<usize>,
    // softmax_with_loss, accuracy
    pub ignore_label: Option<i64>,
    // convolution, pooling (also num_output, bias_term, weight_filler, bias_filler)
    pub kernel_size: Option<Dims>,
    pub stride: Option<Dims>,
    pub pad: Option<Dims>,
    pub dilation: Option<Dims>,
    pub group: Option<usize>,
    pub pool: Option<PoolMethod>,
    pub global_pooling: Option<bool>,
    // dropout
    pub dropout_ratio: Option<f32>,
    // batch_norm
    pub moving_average_fraction: Option<f32>,
    pub eps: Option<f32>,
    pub use_global_stats: Option<bool>,
    /// Reduce the batch statistics over every replica of the job.
    pub sync: Option<bool>,
    // scale, bias (also axis, bias_term, bias_filler)
    pub num_axes: Option<i64>,
    pub filler: Option<FillerConfig>,
    // eltwise
    pub operation: Option<EltwiseOp>,
    pub coeff: Option<Vec<f32>>,
    // flatten, reshape
    pub end_axis: Option<i64>,
    pub shape: Option<Vec<i64>>,
    // power
    pub power: Option<f32>,
    pub scale: Option<f32>,
    pub shift: Option<f32>,
    // slice (also axis)
    pub slice_point: Option<Vec<usize>>,
    // elu (alpha), lrn
    pub alpha: Option<f32>,
    pub beta: Option<f32>,
    pub k: Option<f32>,
    pub local_size: Option<usize>,
    pub norm_region: Option<NormRegion>,
    // arg_max (also top_k, axis)
    pub out_max_val: Option<bool>,
    // prelu (also filler)
    pub channel_shared: Option<bool>,
}

impl LayerConfig {
    /// This layer's typed parameters (see [`layer_params`]); an error names the layer and the
    /// key. `validate` reports the same errors with their positions in the file.
    pub fn params(&self) -> crate::error::Result<LayerParams> {
        LayerParams::resolve(self).map_err(|e| e.for_layer(&self.name))
    }
}

fn one() -> usize {
    1
}
fn one_u64() -> u64 {
    1
}
fn yes() -> bool {
    true
}
fn unit() -> f32 {
    1.0
}
fn neg_one() -> f32 {
    -1.0
}
fn bucket_mb_default() -> f64 {
    25.0
}
fn collective_timeout_default() -> f64 {
    600.0
}
fn sync_period_default() -> u64 {
    8
}
fn outer_lr_default() -> f32 {
    0.7
}
fn outer_momentum_default() -> f32 {
    0.9
}
fn loss_scale_init_default() -> f32 {
    65536.0
}
fn loss_scale_growth_interval_default() -> u64 {
    2000
}
fn loss_scale_backoff_default() -> f32 {
    0.5
}
fn prefetch_default() -> usize {
    4
}
fn sgd() -> SolverType {
    SolverType::Sgd
}
fn fixed() -> LrPolicy {
    LrPolicy::Fixed
}
fn beta2_default() -> f32 {
    0.999
}
fn delta_default() -> f32 {
    1e-8
}
fn rms_decay_default() -> f32 {
    0.99
}
fn sigint_effect_default() -> SignalEffect {
    SignalEffect::SnapshotStop
}
fn sighup_effect_default() -> SignalEffect {
    SignalEffect::Snapshot
}
fn snapshot_prefix_default() -> String {
    "snapshots/model".to_string()
}

/// The config name of an enum value (`inner_product`, `sgd`, `idx`).
pub(crate) fn name_of<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}
