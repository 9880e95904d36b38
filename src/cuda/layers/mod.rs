//! The GPU layers: the [`GpuLayer`] trait and one file per layer, each the device twin of the CPU
//! layer of the same name in `crate::layers`, which stays the reference semantics (the tests of
//! each file compare the two on random inputs).
//!
//! Conventions, as on the CPU:
//! - Blobs are row-major `(N, ...)`, 4-D ones stored NCHW or channels-last as the layer was built
//!   to run (see [`crate::cuda::layout`]); a layer reads and writes the blobs the net names by
//!   index in one slice of [`GpuBlob`]s, so that a layer borrows its bottoms and tops disjointly
//!   without collecting references (all indices of one layer are distinct; the net checks this).
//!   A call's arguments come bundled: [`ForwardPass`], [`StatePass`] and [`BackwardPass`], whose
//!   [`LayerBlobs`] picks the bottoms and tops (`pass.blobs.bottom_top()`).
//! - Layers computed element by element (relu, sigmoid, tanh, abs_val, power, elu, and the views
//!   flatten and reshape) are kinds of one generic layer, [`neuron::GpuNeuron`]; Scale and Bias
//!   are kinds of [`affine::GpuAffine`]. Each kind's file builds it and holds its tests.
//! - `backward` accumulates into the parameter gradient and into the bottoms' diffs, unless told
//!   [`Grad::Overwrite`]: the net says so for a bottom when the layer is the first in backward
//!   order to contribute to that blob's gradient, and for the parameters on the first backward
//!   of an iteration, which saves zero-filling the buffers first and reading the zeros back (the
//!   result is the same).
//! - A layer sees its learnable tensors as one view of its contiguous range of the flat buffers,
//!   in the order of the CPU layer's `param_specs()`.
//! - Everything is enqueued on [`Gpu::compute`]; nothing synchronises.
//! - [`GpuCtx`] tells a layer the pass it runs in (phase, iteration, seed, first sample: what
//!   `crate::layers::Ctx` tells the CPU layer) and, for a job of several replicas, the
//!   [`Collective`] that BatchNorm's `sync` reduces its statistics with.
//! - Layers with state in the flat parameters (BatchNorm's running statistics) write it in
//!   [`GpuLayer::update_state`], which the net calls after a training forward.
//! - The layers that can run on half-type blobs (the fused chains and the poolings, built with
//!   [`build`]'s `half_blobs`) write each pass once, generic over how the blobs are stored
//!   (`BlobElem`: `f32` or the half type's bit patterns), and compute the same numbers on
//!   either.

/// `layer_builder!(Params, |p| layer)`: the [`BuildGpu`] of `Params` whatever the device, the
/// name and the layout: the GPU layer `layer`, an expression of the parameters `p`.
macro_rules! layer_builder {
    ($params:ty, |$p:pat_param| $layer:expr) => {
        impl $crate::cuda::layers::BuildGpu for $params {
            fn build_gpu(
                &self,
                _gpu: &$crate::cuda::Gpu,
                _name: &str,
                _layout: $crate::cuda::layout::Layout,
            ) -> $crate::error::Result<Box<dyn $crate::cuda::layers::GpuLayer>> {
                let $p = self;
                Ok(Box::new($layer))
            }
        }
    };
}

/// Declares a GPU layer without state, the unit struct `$layer`, and builds it from `$params`
/// whatever the device, the name and the layout.
macro_rules! stateless_layer {
    ($(#[$doc:meta])* pub struct $layer:ident for $params:ty;) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $layer;

        layer_builder!($params, |_| $layer);
    };
}

pub mod abs_val;
pub mod accuracy;
pub mod affine;
pub mod arg_max;
pub mod batch_norm;
pub mod bias;
pub mod bn_scale_relu;
pub mod concat;
pub mod convolution;
pub mod deconvolution;
pub mod dropout;
pub mod eltwise;
pub mod eltwise_relu;
pub mod elu;
pub mod euclidean_loss;
pub mod flatten;
pub mod inner_product;
pub mod input;
pub mod lrn;
pub mod neuron;
pub mod pooling;
pub mod power;
pub mod prelu;
pub mod relu;
pub mod reshape;
pub mod scale;
pub mod sigmoid;
pub mod silence;
pub mod slice;
pub mod softmax;
pub mod softmax_with_loss;
pub mod split;
pub mod tanh;
pub mod view;

use super::blob::GpuBlob;
use super::kernels::StoredElem;
use super::layout::Layout;
use super::nccl::{NcclComm, ReduceOp};
use super::{gpu_error, Gpu};
use crate::config::layer_params::LayerParams;
use crate::config::Phase;
use crate::error::Result;
use crate::precision::Half;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut};

/// The pass a layer runs in: the device twin of `crate::layers::Ctx`.
#[derive(Clone, Copy)]
pub struct GpuCtx<'a> {
    pub phase: Phase,
    /// Iteration number (for topology-invariant randomness).
    pub iter: u64,
    /// The run's `random_seed`.
    pub seed: u64,
    /// Global index (in the epoch's record order) of this replica's first sample of the batch.
    pub first_sample: u64,
    /// The replicas' all-reduce; `None` for a replica alone (tests, single-replica jobs).
    pub collective: Option<Collective<'a>>,
}

impl GpuCtx<'_> {
    /// A context without collectives (a replica alone).
    pub fn local(phase: Phase, iter: u64, seed: u64, first_sample: u64) -> GpuCtx<'static> {
        GpuCtx {
            phase,
            iter,
            seed,
            first_sample,
            collective: None,
        }
    }
}

/// The replica group's communicator as a layer uses it: sums on the compute stream.
///
/// Another stream (the gradient all-reduce's) may have collectives of the same communicator in
/// flight; two collectives of one communicator must never run at once, so before each of its
/// collectives the compute stream waits for that stream (through `fence`). Every replica issues
/// the same collectives in the same order, as NCCL requires, because every replica runs the
/// same layers in the same order.
#[derive(Clone, Copy)]
pub struct Collective<'a> {
    pub comm: &'a NcclComm,
    /// The other stream that runs collectives of `comm`, and the event that orders it.
    pub other: Option<(&'a CudaEvent, &'a CudaStream)>,
}

impl Collective<'_> {
    /// Replaces `buf[..n]` by its element-wise sum over every replica, on the compute stream.
    pub fn sum_f64(&self, gpu: &Gpu, buf: &mut CudaSlice<f64>, n: usize) -> Result<()> {
        if self.comm.size() == 1 {
            return Ok(());
        }
        if let Some((fence, stream)) = self.other {
            fence
                .record(stream)
                .map_err(|e| gpu_error("record an event", e))?;
            gpu.compute
                .wait(fence)
                .map_err(|e| gpu_error("wait for an event", e))?;
        }
        self.comm.all_reduce(buf, 0..n, ReduceOp::Sum, &gpu.compute)
    }

    /// Number of replicas.
    pub fn size(&self) -> usize {
        self.comm.size()
    }
}

/// What a layer's backward does to one gradient buffer (a bottom's diff, or its parameters').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grad {
    /// No gradient flows into this bottom.
    Skip,
    /// `diff += gradient` (the layer contract).
    Accumulate,
    /// `diff = gradient`: this layer is the buffer's first contributor in backward order.
    Overwrite,
}

impl Grad {
    /// Whether a gradient is computed at all.
    pub fn wanted(self) -> bool {
        self != Grad::Skip
    }

    /// Whether it is added to the old diff.
    pub fn accumulate(self) -> bool {
        self == Grad::Accumulate
    }

    /// `beta` of a GEMM that writes this gradient: 1 to accumulate, 0 to overwrite.
    pub fn beta(self) -> f32 {
        if self.accumulate() {
            1.0
        } else {
            0.0
        }
    }
}

/// The blobs one layer call reads and writes: the net's blobs and the layer's bottoms and tops
/// among them, by index (all distinct).
pub struct LayerBlobs<'a> {
    /// Every blob of the net (in a layer test: the bottoms, then the tops).
    pub all: &'a mut [GpuBlob],
    /// Indices of the layer's bottoms in `all`.
    pub bottoms: &'a [usize],
    /// Indices of the layer's tops in `all`.
    pub tops: &'a [usize],
}

impl<'a> LayerBlobs<'a> {
    pub fn new(all: &'a mut [GpuBlob], bottoms: &'a [usize], tops: &'a [usize]) -> Self {
        LayerBlobs { all, bottoms, tops }
    }

    /// `N` distinct blobs by index into `all`, mutably (see [`pick`]).
    pub fn pick<const N: usize>(&mut self, idx: [usize; N]) -> [&mut GpuBlob; N] {
        pick(self.all, idx)
    }

    /// `[bottom 0, top 0]`, mutably: the blobs of a one-in, one-out layer.
    pub fn bottom_top(&mut self) -> [&mut GpuBlob; 2] {
        pick(self.all, [self.bottoms[0], self.tops[0]])
    }

    /// `[bottom 0, bottom 1, top 0]`, mutably: the blobs of a two-in, one-out layer.
    pub fn two_bottoms_top(&mut self) -> [&mut GpuBlob; 3] {
        pick(self.all, [self.bottoms[0], self.bottoms[1], self.tops[0]])
    }

    /// Bottom `i`.
    pub fn bottom(&self, i: usize) -> &GpuBlob {
        &self.all[self.bottoms[i]]
    }

    /// Top `i`.
    pub fn top(&self, i: usize) -> &GpuBlob {
        &self.all[self.tops[i]]
    }
}

/// What a layer's forward gets: the device, the pass, its blobs and its learnable tensors.
pub struct ForwardPass<'a> {
    pub gpu: &'a Gpu,
    pub ctx: &'a GpuCtx<'a>,
    /// The bottoms to read and the tops (already shaped) to write.
    pub blobs: LayerBlobs<'a>,
    /// The layer's range of the flat parameters `(param_len)`, in `param_specs()` order.
    pub params: CudaView<'a, f32>,
    /// The same as half-type operands, where mixed precision allows them.
    pub half: Option<HalfOperands<'a>>,
}

/// What a layer's update of its state after a training forward gets: the device, the pass and
/// the layer's range of the flat parameters, to write.
pub struct StatePass<'a> {
    pub gpu: &'a Gpu,
    pub ctx: &'a GpuCtx<'a>,
    /// The layer's range of the flat parameters `(param_len)`, in `param_specs()` order.
    pub params: CudaViewMut<'a, f32>,
}

/// What a layer's backward gets: [`ForwardPass`]'s arguments, what to do with each gradient,
/// and the layer's range of the flat gradient.
pub struct BackwardPass<'a> {
    pub gpu: &'a Gpu,
    pub ctx: &'a GpuCtx<'a>,
    /// The tops' diffs to read and the bottoms' diffs to write.
    pub blobs: LayerBlobs<'a>,
    /// What happens to bottom `i`'s diff: `grads[i]`.
    pub grads: &'a [Grad],
    /// The layer's range of the flat parameters `(param_len)`, in `param_specs()` order.
    pub params: CudaView<'a, f32>,
    /// The same as half-type operands, where mixed precision allows them.
    pub half: Option<HalfOperands<'a>>,
    /// What happens to `param_diff`: `Accumulate` or `Overwrite`.
    pub param_grad: Grad,
    /// The layer's range of the flat gradient `(param_len)`, laid out as `params`.
    pub param_diff: CudaViewMut<'a, f32>,
}

/// A differentiable operation on device blobs.
pub trait GpuLayer: Send {
    /// The config name of the layer type, e.g. `inner_product`.
    fn type_name(&self) -> &'static str;

    /// Takes the bottom shapes of a new batch (called at build and whenever the batch changes;
    /// the CPU layer has already checked them) and grows scratch buffers when needed; nothing
    /// for a layer without scratch buffers or shape-dependent state.
    fn reshape(&mut self, _gpu: &Gpu, _bottoms: &[&[usize]]) -> Result<()> {
        Ok(())
    }

    /// Computes the tops (already shaped) from the bottoms and the layer's learnable tensors.
    fn forward(&mut self, pass: ForwardPass<'_>) -> Result<()>;

    /// From the tops' diffs, writes the bottoms' diffs as `pass.grads[i]` says and the layer's
    /// range of the flat gradient as `pass.param_grad` says (`Accumulate` or `Overwrite`).
    fn backward(&mut self, pass: BackwardPass<'_>) -> Result<()>;

    /// After a training forward: writes the layer's state kept in its range of the flat
    /// parameters `pass.params` (BatchNorm's running statistics). Nothing for most layers.
    fn update_state(&mut self, _pass: StatePass<'_>) -> Result<()> {
        Ok(())
    }

    /// Whether the forward maps bottoms holding half-type values to tops holding half-type
    /// values exactly (a selection or a sign: ReLU without slope, max pooling, the views), so
    /// that mixed precision need not round its tops (`crate::cuda::net::rounding`).
    fn forward_keeps_half(&self) -> bool {
        false
    }

    /// Whether the backward, overwriting a bottom's diff, maps top diffs holding half-type values
    /// to a bottom diff holding half-type values exactly (ReLU without slope, the views).
    fn backward_keeps_half(&self) -> bool {
        false
    }

    /// Whether the layer runs its products on [`HalfOperands`] when its passes carry them. Such
    /// a layer then reads its first tensor (the weights) only from the half copy: the floats its
    /// passes get hold its other tensors, and nothing in that tensor's range.
    fn takes_half_operands(&self) -> bool {
        false
    }

    /// Whether the layer, built for mixed precision, rounds its tops and the bottom diffs it
    /// writes itself, wherever the CPU layers it stands for round (a fused chain), so that the
    /// net rounds nothing after it.
    fn rounds_itself(&self) -> bool {
        false
    }

    /// Whether the layer, built for mixed precision, rounds what it reads to the half type as it
    /// reads it — its bottoms' data in forward, its tops' diffs in backward (the fused chains
    /// that round themselves) — so that a value only such layers read needs no rounding pass.
    fn rounds_on_load(&self) -> bool {
        false
    }
}

/// The half-type operands of mixed precision (`crate::cuda::net::rounding`) for a layer whose
/// products run on them ([`GpuLayer::takes_half_operands`]). Passed only where converting the
/// layer's operands to the half type is exact: its bottoms hold half-type values (the rounded
/// input or rounded tops) and so will its tops' diffs (no top is a loss top), so that the
/// products are those of the rounding contract, accumulated in FP32.
pub struct HalfOperands<'a> {
    pub half: Half,
    /// The layer's range of the weights the layers see, as half-type bit patterns
    /// `(param_len)`; only the first tensor's part is written.
    pub params: CudaView<'a, u16>,
}

/// The GPU column of the layer registry ([`crate::config::layer_params`]): how the resolved
/// parameters of one kind build its GPU layer. Each kind implements it in its own file
/// (`cuda/layers/<layer>.rs`); [`build`] is generated from the registry, so that a kind without
/// an implementation does not compile.
pub trait BuildGpu {
    /// The GPU layer `name` with these parameters, running in `layout` (its 4-D bottoms and
    /// tops stored so), not yet shaped.
    fn build_gpu(&self, gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>>;
}

/// Generates [`build_unshaped`] from the registry's list of `Kind => ParamsStruct`.
macro_rules! gpu_builder {
    ($($kind:ident => $params:ident,)*) => {
        /// The GPU layer of `params`, by its kind's [`BuildGpu`], not yet shaped.
        fn build_unshaped(
            gpu: &Gpu,
            name: &str,
            params: &LayerParams,
            layout: Layout,
        ) -> Result<Box<dyn GpuLayer>> {
            match params {
                $(LayerParams::$kind(p) => {
                    <crate::config::layer_params::$params as BuildGpu>::build_gpu(
                        p, gpu, name, layout,
                    )
                })*
            }
        }
    };
}

crate::config::layer_params::for_each_layer_kind!(gpu_builder);

/// Builds the GPU layer `name` from its resolved parameters (see [`BuildGpu`]), for the given
/// bottom shapes, running in `layout` (its 4-D bottoms and tops stored so; `Nhwc` only where
/// [`runs_channels_last`](crate::cuda::layout::runs_channels_last) allows). In mixed precision
/// (`half`), a layer that rounds in its own kernels (a pooling, a convolution's weight gradient)
/// is built to round to that type, and with `half_blobs` its bottoms and tops are stored in that
/// type ([`crate::cuda::blob::Elem::Half`]; only for the layers the storage plan allows it,
/// `crate::cuda::net::storage::runs_on_half_blobs`).
pub fn build(
    gpu: &Gpu,
    name: &str,
    params: &LayerParams,
    bottoms: &[&[usize]],
    layout: Layout,
    half: Option<Half>,
    half_blobs: bool,
) -> Result<Box<dyn GpuLayer>> {
    assert!(
        half.is_some() || !half_blobs,
        "half-type blobs without a half type"
    );
    let mut layer: Box<dyn GpuLayer> = match (params, half) {
        (LayerParams::Pooling(p), Some(_)) => Box::new(
            pooling::GpuPooling::new(gpu, name, p, layout)?
                .rounding_to(half)
                .on_half_blobs(half_blobs),
        ),
        (LayerParams::Convolution(p), Some(h)) => Box::new(
            convolution::GpuConvolution::new(gpu, name, p, layout)?
                .in_mixed_precision(gpu, h, half_blobs)?,
        ),
        _ => {
            assert!(!half_blobs, "layer `{name}` cannot run on half-type blobs");
            build_unshaped(gpu, name, params, layout)?
        }
    };
    layer.reshape(gpu, bottoms)?;
    Ok(layer)
}

/// `N` distinct blobs by index, mutably.
///
/// # Panics
/// If two indices are equal or one is out of range (the net rules both out when it is built).
pub(crate) fn pick<const N: usize>(blobs: &mut [GpuBlob], idx: [usize; N]) -> [&mut GpuBlob; N] {
    blobs
        .get_disjoint_mut(idx)
        .unwrap_or_else(|e| panic!("layer blobs {idx:?}: {e}"))
}

/// `(rows, classes)` of a classifier layer's bottoms `[scores, labels (rows)]` (accuracy,
/// softmax with loss): the scores flattened at `axis`, as the CPU classifier layers view them;
/// an error naming the layer unless it has two bottoms.
pub(crate) fn classifier_rows(
    layer: &str,
    bottoms: &[&[usize]],
    axis: usize,
) -> Result<(usize, usize)> {
    let [scores, _labels] = bottoms else {
        return Err(crate::error::Error::net(
            layer,
            format!("takes 2 bottoms (scores, labels), got {}", bottoms.len()),
        ));
    };
    let axis = axis.min(scores.len());
    Ok((
        scores[..axis].iter().product(),
        scores[axis..].iter().product(),
    ))
}

/// `(n)` elements of scratch on the device, zeroed (allocated at build or when the batch grows,
/// never in a step).
pub(crate) fn scratch<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    n: usize,
) -> Result<CudaSlice<T>> {
    gpu.compute
        .alloc_zeros::<T>(n.max(1))
        .map_err(|e| gpu_error(&format!("allocate layer scratch of {n} elements"), e))
}

/// Grows `buf` to at least `n` elements (contents unspecified afterwards).
pub(crate) fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    buf: &mut CudaSlice<T>,
    n: usize,
) -> Result<()> {
    if buf.len() < n {
        *buf = scratch(gpu, n)?;
    }
    Ok(())
}

/// The bottom of a one-bottom layer, or an error naming the layer.
pub(crate) fn one_bottom<'a>(layer: &str, bottoms: &[&'a [usize]]) -> Result<&'a [usize]> {
    match bottoms {
        [shape] => Ok(shape),
        _ => Err(crate::error::Error::net(
            layer,
            format!("takes 1 bottom, got {}", bottoms.len()),
        )),
    }
}

/// The bottom of a one-bottom layer that reads it around `axis`, or an error naming the layer
/// unless it has more than `axis` axes.
pub(crate) fn one_bottom_with_axis<'a>(
    layer: &str,
    bottoms: &[&'a [usize]],
    axis: usize,
) -> Result<&'a [usize]> {
    let shape = one_bottom(layer, bottoms)?;
    if axis >= shape.len() {
        return Err(crate::error::Error::net(
            layer,
            format!("`axis` {axis} out of range for bottom {shape:?}"),
        ));
    }
    Ok(shape)
}

/// The `(N, C, H, W)` of a 4-D bottom, or an error naming the layer.
pub(crate) fn nchw(layer: &str, shape: &[usize]) -> Result<[usize; 4]> {
    match shape {
        &[n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(crate::error::Error::net(
            layer,
            format!("needs a 4-D (N, C, H, W) bottom, got {shape:?}"),
        )),
    }
}

/// The backward of a layer whose gradient to every bottom is zero (Silence, Input): the
/// bottoms' diffs the net asks to overwrite are zeroed, the accumulated ones left as they are.
pub(crate) fn zero_gradient(pass: &mut BackwardPass<'_>) -> Result<()> {
    let gpu = pass.gpu;
    for (&b, &g) in pass.blobs.bottoms.iter().zip(pass.grads) {
        if g == Grad::Overwrite {
            let [x] = pass.blobs.pick([b]);
            let n = x.count();
            gpu.kernels.fill(&gpu.compute, &mut x.diff_mut(), 0.0, n)?;
        }
    }
    Ok(())
}

/// `x (n) → y (n)` copy on the compute stream (dropout at test time).
pub(crate) fn copy_data(gpu: &Gpu, x: &GpuBlob, y: &mut GpuBlob) -> Result<()> {
    let n = x.count();
    gpu.compute
        .memcpy_dtod(&x.data.slice(..n), &mut y.data.slice_mut(..n))
        .map_err(|e| gpu_error("copy a blob", e))
}

/// A blob's values and gradient of the logical shape, `(count)` elements each, as stored: `f32`
/// ([`GpuBlob::data`], [`GpuBlob::diff`]) or half-type bit patterns (`u16`,
/// [`GpuBlob::half_data`], [`GpuBlob::half_diff`]), so that a layer that runs on either storage
/// writes its passes once, generic over the element type, and launches the kernels of that
/// storage ([`StoredElem`]). The half-type views panic on a blob stored in FP32.
pub(crate) trait BlobElem: StoredElem {
    fn data(b: &GpuBlob) -> CudaView<'_, Self>;
    fn data_mut(b: &mut GpuBlob) -> CudaViewMut<'_, Self>;
    fn diff(b: &GpuBlob) -> CudaView<'_, Self>;
    fn diff_mut(b: &mut GpuBlob) -> CudaViewMut<'_, Self>;
    /// The values and, writable, the gradient at once (a backward that reads a bottom's values
    /// as it writes its gradient).
    fn data_and_diff_mut(b: &mut GpuBlob) -> (CudaView<'_, Self>, CudaViewMut<'_, Self>);
}

impl BlobElem for f32 {
    fn data(b: &GpuBlob) -> CudaView<'_, f32> {
        b.data()
    }

    fn data_mut(b: &mut GpuBlob) -> CudaViewMut<'_, f32> {
        b.data_mut()
    }

    fn diff(b: &GpuBlob) -> CudaView<'_, f32> {
        b.diff()
    }

    fn diff_mut(b: &mut GpuBlob) -> CudaViewMut<'_, f32> {
        b.diff_mut()
    }

    fn data_and_diff_mut(b: &mut GpuBlob) -> (CudaView<'_, f32>, CudaViewMut<'_, f32>) {
        let n = b.count();
        (b.data.slice(..n), b.diff.slice_mut(..n))
    }
}

impl BlobElem for u16 {
    fn data(b: &GpuBlob) -> CudaView<'_, u16> {
        b.half_data()
    }

    fn data_mut(b: &mut GpuBlob) -> CudaViewMut<'_, u16> {
        b.half_data_mut()
    }

    fn diff(b: &GpuBlob) -> CudaView<'_, u16> {
        b.half_diff()
    }

    fn diff_mut(b: &mut GpuBlob) -> CudaViewMut<'_, u16> {
        b.half_diff_mut()
    }

    fn data_and_diff_mut(b: &mut GpuBlob) -> (CudaView<'_, u16>, CudaViewMut<'_, u16>) {
        let n = b.count();
        let h = b
            .half
            .as_mut()
            .expect("a half-type view of a blob stored in FP32");
        (h.data.slice(..n), h.diff.slice_mut(..n))
    }
}

#[cfg(test)]
pub(crate) mod testing;
