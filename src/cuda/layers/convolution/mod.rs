//! `GpuConvolution`: 2-D convolution (Caffe's cross-correlation) on cuDNN, the device twin of
//! `crate::layers::convolution`.
//!
//! Shapes: bottom `(N, C, H, W)`, top `(N, K, OH, OW)` with `K = num_output` and
//! `OH = (H + 2·pad_h − (dilation_h·(kh − 1) + 1)) / stride_h + 1` (floor), likewise `OW`.
//! Learnable tensors, in order: `weight (K, C/group, kh, kw)` and, when `bias_term`, `bias (K)`
//! — cuDNN's KCRS filter layout, so the flat parameters are used as they are.
//!
//! Channels-last (`Layout::Nhwc`: bottom and top stored `(N, H, W, C)`): cuDNN takes the filter
//! as KRSC beside NHWC tensors, so forward transposes the weight into a layer buffer (used again
//! by the backward of the same pass: the parameters do not change in between), and the weight
//! gradient is computed in KRSC and transposed back into the flat gradient. The project's own
//! weight gradients are NCHW-only.
//!
//! Forward: `cudnnConvolutionForward` (β = 0) then the project's channel kernel adds the bias in
//! place; or, for an ungrouped NCHW convolution where it timed faster at the plan's creation
//! (`conv_algorithm = "measured"`), the project's direct kernel (`Kernels::conv_forward_direct`),
//! bias included, reading the weight transposed into a layer buffer just before.
//! Backward: the bias gradient by the project's deterministic channel sum (or, with the implicit
//! weight gradient where its tile has room, as one more column of the same products); the weight
//! gradient by `cudnnConvolutionBackwardFilter` or, for an ungrouped convolution where one timed
//! faster at the plan's creation (`conv_algorithm = "measured"`), by im2col and one cuBLAS GEMM
//! (`gemm_wgrad`) or by the project's implicit GEMM (`Kernels::implicit_wgrad`); the data
//! gradient by `cudnnConvolutionBackwardData` or, for an ungrouped NCHW convolution of stride 1
//! where it timed faster, by the direct kernel as the forward of `dy` with the filters flipped
//! (`ConvGeom::data_gradient_geom`), or, for an ungrouped 1 × 1 convolution with a stride and no
//! padding where it timed faster (either layout), as `Wᵀ·dy` by cuBLAS spread to every stride-th
//! position (`Kernels::unstride_planes`). When the bottom wants a gradient, the bias and weight
//! gradients run on the device's side stream ([`Gpu::side`], its own cuDNN and cuBLAS handles and
//! workspace) beside the data gradient on the compute stream; when it does not, a bias gradient
//! of its own runs there beside the weight gradient; joined before the backward returns.
//! Parameter and bottom gradients are accumulated (β = 1) or overwritten (β = 0) as the net says.
//! Groups through `cudnnSetConvolutionGroupCount`.
//!
//! In the TF32 modes (`tf32`, `bf16`, `fp16`) each cuDNN direction of an ungrouped convolution
//! may also run as an execution plan of cuDNN's graph API ([`GraphRun`], `conv_algorithm =
//! "measured"`), the same kernels as the legacy calls for a fraction of their host time: the
//! first few plans `conv_exact` allows are timed beside the legacy algorithm and the project's
//! kernels, the bias added by the channel kernel as after cuDNN's forward. `fp32` keeps the
//! legacy calls (see [`graph::Notes::allowed`]).
//!
//! Descriptors and algorithms are made per bottom shape and cached (train and test batches
//! differ), with one workspace for the layer sized for the largest choice; see
//! [`crate::cuda::cudnn`] for how algorithms are chosen (`cluster.conv_algorithm`, measured or
//! heuristic, among those `cluster.conv_exact` allows) in each math mode.

use super::{grow, nchw, one_bottom, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer, Grad};
use crate::config::layer_params::ConvolutionParams;
use crate::config::ConvAlgorithm;
use crate::cuda::blob::GpuBlob;
use crate::cuda::cudnn::{self, graph, ConvAlgos, ConvGeometry, FilterDesc, TensorDesc};
use crate::cuda::kernels::{ConvGeom, DirectTile, WgradTile, IMPLICIT_WGRAD_TILES};
use crate::cuda::layout::Layout;
use crate::cuda::path_timing::{median_times_in_turns, zeroed_floats};
use crate::cuda::{gpu_error, Gpu};
use crate::error::{Error, Result};
use crate::precision::Half;
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
};
use std::sync::Arc;

mod half;

use half::{ConvShape, HalfConvolution};

/// How a plan computes the weight gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wgrad {
    /// `cudnnConvolutionBackwardFilter` with the chosen algorithm.
    Cudnn,
    /// im2col of the batch and one cuBLAS GEMM (see [`gemm_wgrad`]).
    Gemm,
    /// The project's implicit GEMM, no column matrix (see [`weight_gradient`]), in tiles of
    /// `dW` of this shape (one of [`IMPLICIT_WGRAD_TILES`]).
    Implicit(WgradTile),
    /// A cuDNN execution plan, the plan's `graph.wgrad[i]` ([`GraphRun`]).
    Graph(usize),
}

/// Whether `path` computes a layer's bias gradient (where it has one, `bias_term`) along with
/// the weight's: an implicit one whose last tile has room for it.
fn fuses_bias(bias_term: bool, geom: &ConvGeom, path: Wgrad) -> bool {
    match path {
        Wgrad::Implicit(tile) => bias_term && geom.implicit_wgrad_fuses_bias(tile),
        Wgrad::Cudnn | Wgrad::Gemm | Wgrad::Graph(_) => false,
    }
}

/// How a plan computes the forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fwd {
    /// `cudnnConvolutionForward` with the chosen algorithm, then the bias kernel.
    Cudnn,
    /// The project's direct kernel from shared memory, bias included (see [`forward_pass`]).
    Direct,
    /// A cuDNN execution plan, the plan's `graph.fwd[i]` ([`GraphRun`]), then the bias kernel.
    Graph(usize),
}

/// How a plan computes the data gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dgrad {
    /// `cudnnConvolutionBackwardData` with the chosen algorithm.
    Cudnn,
    /// The project's direct kernel as the forward of `dy` with the flipped filters (see
    /// [`data_gradient`]).
    Direct,
    /// A strided 1 × 1 convolution without padding: `Wᵀ·dy` by cuBLAS (one batched GEMM over
    /// the samples in NCHW, one GEMM in NHWC), spread to every stride-th position of `dx` (see
    /// [`data_gradient`]).
    Unstride,
    /// A cuDNN execution plan, the plan's `graph.dgrad[i]` ([`GraphRun`]).
    Graph(usize),
}

/// One direction of a convolution by a cuDNN execution plan (`cudnn::graph`): the plan for a
/// result that overwrites its buffer (β = 0) and, but for a forward that adds a bias (whose
/// graph has β = 0 only), the same engine and knobs for one added to it (β = 1), each with its
/// variant packs. Against the legacy API's call for the same kernel, a plan run on a pack built
/// once costs the host a fraction of the time (docs/design.md, Mixed precision, step 2), which
/// counts where the host is barely ahead of the device.
#[derive(Debug)]
struct GraphRun {
    overwrite: graph::Plan,
    accumulate: Option<graph::Plan>,
    packs: [graph::Packs; 2],
}

impl GraphRun {
    /// The candidates for `conv` in `dnn`'s math mode: the first `max` plans of
    /// the heuristics that `exact` and the math mode allow ([`graph::Notes::allowed`]) and whose
    /// engine also builds with β = 1 (but for a forward with a bias); none where the graph API
    /// offers none.
    fn candidates(
        dnn: &cudnn::Cudnn,
        conv: &graph::Conv,
        exact: bool,
        max: usize,
    ) -> Vec<GraphRun> {
        let math = dnn.math();
        let accept = |notes: &graph::Notes| notes.allowed(math, exact);
        let found = graph::plans(dnn, conv, 0.0, max, accept).and_then(|plans| {
            let mut runs = Vec::new();
            for plan in plans {
                let accumulate = match conv.bias {
                    true => None,
                    false => match plan.with_beta(dnn, conv, 1.0)? {
                        Some(twin) => Some(twin),
                        None => continue,
                    },
                };
                runs.push(GraphRun {
                    overwrite: plan,
                    accumulate,
                    packs: Default::default(),
                });
            }
            let engines: Vec<i64> = runs.iter().map(|run| run.overwrite.engine).collect();
            let (direction, bias) = (conv.direction, conv.bias);
            tracing::debug!(?direction, bias, ?engines, "execution plans to time");
            Ok(runs)
        });
        found.unwrap_or_else(|e| {
            tracing::debug!(direction = ?conv.direction, error = %e, "no execution plan");
            Vec::new()
        })
    }

    /// The larger workspace of its plans.
    fn workspace(&self) -> usize {
        let accumulate = self.accumulate.as_ref().map_or(0, |p| p.workspace);
        self.overwrite.workspace.max(accumulate)
    }

    /// Runs the plan of `beta` (0 or 1) on `dnn`'s stream with the device addresses of `x`,
    /// `w` and `y` (their gradients by direction, as [`graph::Conv::dims`]; then the bias of a
    /// forward that adds one) and `ws`.
    ///
    /// # Safety
    /// The addresses must hold the plan's tensors on `dnn`'s device and `ws` at least
    /// [`GraphRun::workspace`] bytes, all alive until the stream has run the call.
    unsafe fn execute(
        &self,
        dnn: &cudnn::Cudnn,
        pointers: &[u64],
        ws: cudnn::Workspace,
        beta: f32,
    ) -> Result<()> {
        debug_assert!(beta == 0.0 || beta == 1.0);
        let (i, plan) = match (beta != 0.0, &self.accumulate) {
            (false, _) => (0, &self.overwrite),
            (true, Some(plan)) => (1, plan),
            (true, None) => {
                return Err(Error::Device(
                    "cuDNN graph API: a forward with a bias has no plan that accumulates".into(),
                ))
            }
        };
        debug_assert!(plan.workspace <= ws.bytes);
        // SAFETY: the caller's contract.
        unsafe { self.packs[i].execute(dnn, plan, pointers, ws.ptr) }
    }
}

/// How many of the heuristics' allowed execution plans `measured` times per direction.
const GRAPH_CANDIDATES: usize = 3;

/// A plan's execution-plan candidates by direction, which [`Fwd::Graph`], [`Dgrad::Graph`] and
/// [`Wgrad::Graph`] index.
#[derive(Debug, Default)]
struct GraphRuns {
    fwd: Vec<GraphRun>,
    dgrad: Vec<GraphRun>,
    wgrad: Vec<GraphRun>,
}

/// Whether a convolution's data gradient can take [`Dgrad::Unstride`]: ungrouped, a 1 × 1
/// kernel without padding, a stride above 1 — ResNet's downsampling convolutions — in either
/// layout. (On an H100, for ResNet-50's `res3a_branch1` at batch 64 in fp32, cuDNN's data
/// gradient among the algorithms `conv_exact` allows timed 5.15 ms, the unstriding GEMM
/// 0.60 ms.)
fn unstrides(geom: &ConvGeom, group: usize) -> bool {
    group == 1
        && (geom.kh, geom.kw, geom.ph, geom.pw) == (1, 1, 0, 0)
        && (geom.sh > 1 || geom.sw > 1)
}

/// The largest column matrix (floats) the GEMM weight gradient may use: 1 GiB.
const GEMM_WGRAD_LIMIT: usize = 1 << 28;

/// The descriptors and algorithms of one bottom shape.
#[derive(Debug)]
struct Plan {
    bottom: [usize; 4],
    x: TensorDesc,
    y: TensorDesc,
    w: FilterDesc,
    algos: ConvAlgos,
    geom: ConvGeom,
    /// How the direct kernel covers the forward, where it can ([`ConvGeom::direct_tile`]).
    direct_fwd: Option<DirectTile>,
    /// The data gradient as a forward and the direct kernel's tile of it, where it can
    /// ([`ConvGeom::data_gradient_geom`]).
    direct_dgrad: Option<(ConvGeom, DirectTile)>,
    fwd: Fwd,
    dgrad: Dgrad,
    wgrad: Wgrad,
    /// The implicit weight gradient also computes the bias gradient (see
    /// [`ConvGeom::implicit_wgrad_fuses_bias`]).
    wgrad_bias: bool,
    /// Execution plans by direction (`measured`, ungrouped convolutions only).
    graph: GraphRuns,
}

impl Plan {
    /// Bytes of workspace its chosen paths need.
    fn workspace(&self) -> usize {
        let graph = [
            match self.fwd {
                Fwd::Graph(i) => self.graph.fwd[i].workspace(),
                _ => 0,
            },
            match self.dgrad {
                Dgrad::Graph(i) => self.graph.dgrad[i].workspace(),
                _ => 0,
            },
            match self.wgrad {
                Wgrad::Graph(i) => self.graph.wgrad[i].workspace(),
                _ => 0,
            },
        ];
        graph.into_iter().fold(self.algos.workspace, usize::max)
    }

    /// The top's shape `(N, K, OH, OW)` for `k` outputs (NCHW order, whatever the layout).
    fn top_shape(&self, k: usize) -> [usize; 4] {
        let (oh, ow) = (self.geom.oh as usize, self.geom.ow as usize);
        [self.bottom[0], k, oh, ow]
    }
}

/// Where a weight gradient runs: a stream (the compute stream or the device's side stream) with
/// its cuDNN and cuBLAS handles and a cuDNN workspace.
#[derive(Clone, Copy)]
struct Lane<'a> {
    dnn: &'a cudnn::Cudnn,
    blas: &'a CudaBlas,
    ws: cudnn::Workspace,
}

impl Lane<'_> {
    fn stream(&self) -> &Arc<CudaStream> {
        self.dnn.stream()
    }
}

/// `dw (K, C·kh·kw) (+)= swap(dy) (K, N·OH·OW) · col(x)ᵀ`: the weight gradient of an ungrouped
/// convolution as im2col and one cuBLAS GEMM (deterministic, FP32 or TF32 as the handle's math),
/// through the device's shared convolution scratch, on `lane`.
#[allow(clippy::too_many_arguments)]
fn gemm_wgrad(
    gpu: &Gpu,
    lane: Lane<'_>,
    geom: ConvGeom,
    k: usize,
    x: &impl DevicePtr<f32>,
    dy: &impl DevicePtr<f32>,
    beta: f32,
    dw: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    let col_len = geom.col_len().expect("checked when the plan was made");
    let u = |v: i32| v as usize;
    let (n, p) = (u(geom.n), u(geom.oh) * u(geom.ow));
    let rows = u(geom.c) * u(geom.kh) * u(geom.kw);
    let s = lane.stream();
    gpu.with_conv_scratch((col_len, n * k * p), |col, dyt| {
        gpu.kernels.im2col_batch(s, x, geom, col)?;
        gpu.kernels.swap_outer(s, dy, dyt, (n, k, p))?;
        let on = (lane.blas, &**s);
        gpu.gemm_on(on, (false, true), (k, rows, n * p), 1.0, dyt, col, beta, dw)
    })
}

/// `dw (+)=` the weight gradient of `plan` for the batch `x` and the top gradient `dy` by `path`
/// (cuDNN's, the GEMM one, or the implicit one of
/// [`Kernels::implicit_wgrad`](crate::cuda::kernels::Kernels::implicit_wgrad): deterministic,
/// FP32 whatever the math mode, its partial sums in the device's shared convolution scratch), on
/// `lane`. `with_bias` (the implicit path only): `dw` continues with the bias gradient `(K)`,
/// computed in the same pass.
#[allow(clippy::too_many_arguments)]
fn weight_gradient(
    gpu: &Gpu,
    lane: Lane<'_>,
    plan: &Plan,
    path: Wgrad,
    (num_output, with_bias): (usize, bool),
    x: &impl DevicePtr<f32>,
    dy: &impl DevicePtr<f32>,
    beta: f32,
    dw: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    let (geom, s) = (plan.geom, lane.stream());
    debug_assert!(!with_bias || matches!(path, Wgrad::Implicit(_)));
    match path {
        Wgrad::Gemm => return gemm_wgrad(gpu, lane, geom, num_output, x, dy, beta, dw),
        Wgrad::Implicit(tile) => {
            let outputs = (num_output, with_bias);
            let partial = gpu
                .kernels
                .implicit_wgrad_scratch(&geom, outputs, tile)
                .expect("checked when the plan was made");
            return gpu.with_conv_scratch((partial, 0), |partial, _| {
                gpu.kernels
                    .implicit_wgrad(s, x, dy, geom, outputs, tile, partial, beta, dw)
            });
        }
        Wgrad::Cudnn | Wgrad::Graph(_) => {}
    }
    let (xp, _gx) = x.device_ptr(s);
    let (dyp, _gdy) = dy.device_ptr(s);
    let (dwp, _gdw) = dw.device_ptr_mut(s);
    if let Wgrad::Graph(i) = path {
        // SAFETY: as below; the workspace was grown to the plan's.
        return unsafe { plan.graph.wgrad[i].execute(lane.dnn, &[xp, dwp, dyp], lane.ws, beta) };
    }
    let chosen = &plan.algos.bwd_filter;
    // SAFETY: the caller passes buffers of the plan's shapes on this device and the layer's
    // workspace of `ws.bytes`, all alive while the enqueued work runs.
    unsafe {
        cudnn::conv_backward_filter(
            lane.dnn,
            (&plan.x, xp),
            (&plan.y, dyp),
            (&chosen.conv, chosen.algo),
            lane.ws,
            beta,
            (&plan.w, dwp),
        )
    }
}

/// `y (N, K, OH, OW) = conv(x) (+ bias)` of `plan` by `path`, on the compute stream: cuDNN's
/// chosen algorithm reading `weight` (the layer's weight, or its KRSC copy when channels-last),
/// then the project's channel kernel adding the bias; or the direct kernel of
/// [`Kernels::conv_forward_direct`](crate::cuda::kernels::Kernels::conv_forward_direct), the
/// weight first transposed into the front of `direct_scratch` (at least the weight's length
/// plus the tile's partial sums). `params` is the layer's weight followed, where `has_bias`, by
/// its bias.
#[allow(clippy::too_many_arguments)]
fn forward_pass(
    gpu: &Gpu,
    plan: &Plan,
    path: Fwd,
    (k, has_bias, layout): (usize, bool, Layout),
    ws: cudnn::Workspace,
    x: &impl DevicePtr<f32>,
    params: &CudaView<'_, f32>,
    (weight, direct_scratch): (&CudaView<'_, f32>, &mut CudaSlice<f32>),
    y: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    let s = &gpu.compute;
    let wlen = plan.w.count();
    if path == Fwd::Direct {
        let tile = plan.direct_fwd.expect("checked when the plan was made");
        let (mut wt, mut rest) = direct_scratch.split_at_mut(wlen);
        let rows = wlen / k;
        gpu.kernels
            .transpose(s, &params.slice(..wlen), &mut wt, 1, (k, rows), false)?;
        let bias = has_bias.then(|| params.slice(wlen..wlen + k));
        let inputs = (x, &wt, bias.as_ref());
        let mut partial = rest.slice_mut(..tile.partial_len);
        let (shape, how) = ((plan.geom, &tile), (false, false));
        return gpu
            .kernels
            .conv_forward_direct(s, inputs, shape, k, how, &mut partial, y);
    }
    {
        let (xp, _gx) = x.device_ptr(s);
        let (yp, _gy) = y.device_ptr_mut(s);
        let (wp, _gw) = weight.device_ptr(s);
        // SAFETY: the caller passes x and y holding the elements of the plan's descriptors,
        // the weight's, and a workspace of `ws.bytes` (grown to every chosen plan's); all on
        // this device and alive while enqueued work reads them.
        unsafe {
            if let Fwd::Graph(i) = path {
                plan.graph.fwd[i].execute(gpu.cudnn()?, &[xp, wp, yp], ws, 0.0)?;
            } else {
                cudnn::conv_forward(
                    gpu.cudnn()?,
                    (&plan.x, xp),
                    (&plan.w, wp),
                    (&plan.algos.fwd.conv, plan.algos.fwd.algo),
                    ws,
                    0.0,
                    (&plan.y, yp),
                )?;
            }
        }
    }
    if has_bias {
        // One pass of the project's channel kernel: cuDNN's AddTensor took about twice as
        // long on cifar10_quick's first convolution.
        let b = params.slice(wlen..wlen + k);
        let (_, _, inner) = layout.channel_view(&plan.top_shape(k));
        gpu.kernels
            .channel_bias_inplace(s, y, &b, plan.y.count(), (k, inner))?;
    }
    Ok(())
}

/// `dx (N, C, H, W) (+)= ` the data gradient of `plan` for the top gradient `dy` and `weight`
/// (the layer's weight, or its KRSC copy when channels-last) by `path`, on the compute stream:
/// cuDNN's chosen algorithm; for [`Dgrad::Unstride`], `Wᵀ·dy` into `direct_scratch` (at least
/// `N·C·OH·OW`) by cuBLAS (deterministic, FP32 or TF32 as the handle's math), then spread into
/// `dx`; or the direct kernel of
/// [`Kernels::conv_forward_direct`](crate::cuda::kernels::Kernels::conv_forward_direct) as the
/// forward of `dy` with the filters flipped (see
/// [`ConvGeom::data_gradient_geom`](crate::cuda::kernels::ConvGeom::data_gradient_geom)), their
/// arrangement first written into the front of `direct_scratch` (then the tile's partial
/// sums). `k` is the layer's outputs, `layout` how its blobs are stored; `beta` 0 or 1.
#[allow(clippy::too_many_arguments)]
fn data_gradient(
    gpu: &Gpu,
    plan: &Plan,
    path: Dgrad,
    (k, layout, ws): (usize, Layout, cudnn::Workspace),
    (weight, direct_scratch): (&CudaView<'_, f32>, &mut CudaSlice<f32>),
    dy: &impl DevicePtr<f32>,
    beta: f32,
    dx: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    let s = &gpu.compute;
    if path == Dgrad::Unstride {
        let g = plan.geom;
        let u = |v: i32| v as usize;
        let (n, c, p) = (u(g.n), u(g.c), u(g.oh) * u(g.ow));
        let on = (&gpu.blas, &**s);
        // The weight is `(K, C)` in either layout (a 1 × 1 filter's KCRS and KRSC agree).
        let (planes, inner) = match layout {
            Layout::Nchw => {
                // t (N, C, OH·OW) = Wᵀ (C, K) · dy_n (K, OH·OW) per sample.
                let (shape, strides) = ((c, p, k), (n, 0, k * p, c * p));
                let operands = (1.0, weight, dy);
                let t = &mut *direct_scratch;
                gpu.gemm_batched_on(on, (true, false), shape, strides, operands, 0.0, t)?;
                (n * c, 1)
            }
            Layout::Nhwc => {
                // t (N·OH·OW, C) = dy (N·OH·OW, K) · W (K, C).
                let t = &mut *direct_scratch;
                gpu.gemm_on(on, (false, false), (n * p, c, k), 1.0, dy, weight, 0.0, t)?;
                (n, c)
            }
        };
        let grid = (planes, u(g.oh), u(g.ow), inner);
        let (hw, stride) = ((u(g.h), u(g.w)), (u(g.sh), u(g.sw)));
        return gpu
            .kernels
            .unstride_planes(s, direct_scratch, dx, grid, hw, stride, beta != 0.0);
    }
    if path == Dgrad::Direct {
        let (geom, tile) = plan.direct_dgrad.expect("checked when the plan was made");
        let wlen = plan.w.count();
        let (c, taps) = (plan.bottom[1], (plan.geom.kh * plan.geom.kw) as usize);
        let (mut wt, mut rest) = direct_scratch.split_at_mut(wlen);
        gpu.kernels
            .transpose(s, weight, &mut wt, k, (c, taps), false)?;
        let mut partial = rest.slice_mut(..tile.partial_len);
        let how = (true, beta != 0.0);
        return gpu.kernels.conv_forward_direct(
            s,
            (dy, &wt, None),
            (geom, &tile),
            c,
            how,
            &mut partial,
            dx,
        );
    }
    let (wp, _gw) = weight.device_ptr(s);
    let (dyp, _gdy) = dy.device_ptr(s);
    let (dxp, _gdx) = dx.device_ptr_mut(s);
    // SAFETY: the caller passes buffers of the plan's shapes on this device and the layer's
    // workspace of `ws.bytes` (grown to every chosen plan's), all alive while the enqueued work
    // runs.
    unsafe {
        if let Dgrad::Graph(i) = path {
            return plan.graph.dgrad[i].execute(gpu.cudnn()?, &[dxp, wp, dyp], ws, beta);
        }
        cudnn::conv_backward_data(
            gpu.cudnn()?,
            (&plan.w, wp),
            (&plan.y, dyp),
            (&plan.algos.bwd_data.conv, plan.algos.bwd_data.algo),
            ws,
            beta,
            (&plan.x, dxp),
        )
    }
}

/// The cheapest of `paths` (not empty; the first of equals) for the `what` of layer `name`'s
/// plan for `bottom`: each path's cost (the larger of its median device and host times over runs of
/// `run(path)` on the compute stream: [`crate::cuda::path_timing::PathTime::cost_ms`]), the
/// paths timed in turns ([`median_times_in_turns`]), each logged at debug level. Synchronises.
fn fastest<P: Copy + std::fmt::Debug>(
    gpu: &Gpu,
    (name, bottom): (&str, [usize; 4]),
    what: &str,
    paths: &[P],
    mut run: impl FnMut(P) -> Result<()>,
) -> Result<P> {
    let times = median_times_in_turns(&gpu.compute, &gpu.kernels, paths.len(), |i| run(paths[i]))?;
    let mut best = (paths[0], f32::INFINITY);
    for (&path, time) in paths.iter().zip(times) {
        tracing::debug!(
            layer = %name,
            ?bottom,
            what,
            ?path,
            device_ms = time.device_ms,
            host_ms = time.host_ms,
            "convolution path timed"
        );
        if time.cost_ms() < best.1 {
            best = (path, time.cost_ms());
        }
    }
    Ok(best.0)
}

/// Whether the convolution `p` of `bottom` into `top` (`(N, C, H, W)`, `(N, K, OH, OW)`),
/// running in `layout`, can run on `half`-type blobs on this device: ungrouped, channels-last
/// where it has a bias, and cuDNN's graph API offers an allowed execution plan for each
/// direction (a forward that adds the layer's bias, where it has one). An NCHW net's
/// convolutions with a bias stay on FP32 blobs: cifar10_quick (NCHW, as `gpu_layout = "auto"`
/// runs its narrow convolutions) ran 0.91–0.94× as fast with them on half-type blobs, on an H200:
/// its first convolution's three channels take cuDNN's slow half-type kernels, or on FP32 blobs
/// the conversions around it cost more than the two others gain (docs/benchmarks.md).
pub fn runs_on_half_blobs(
    gpu: &Gpu,
    p: &ConvolutionParams,
    (bottom, top): ([usize; 4], [usize; 4]),
    layout: Layout,
    half: Half,
) -> bool {
    let shape = ConvShape {
        num_output: p.num_output,
        kernel: p.kernel,
        geometry: ConvGeometry {
            pad: p.pad,
            stride: p.stride,
            dilation: p.dilation,
            group: p.group,
        },
        layout,
        bias: p.bias_term,
    };
    let layout_pays = !p.bias_term || layout == Layout::Nhwc;
    p.group == 1 && layout_pays && half::plans_exist(gpu, &shape, bottom, top, half)
}

/// 2-D convolution on cuDNN; see the module docs.
#[derive(Debug)]
pub struct GpuConvolution {
    name: String,
    num_output: usize,
    bias_term: bool,
    kernel: [usize; 2],
    geometry: ConvGeometry,
    /// Input channels, fixed by the first reshape.
    channels: Option<usize>,
    /// Plans by bottom shape; `current` indexes the one of the last reshape.
    plans: Vec<Plan>,
    current: usize,
    /// Bytes of scratch for the algorithms of every cached plan.
    workspace: CudaSlice<u8>,
    /// The same for cuDNN's weight gradient when it runs on the side stream beside the data
    /// gradient (see `backward`).
    wgrad_workspace: CudaSlice<u8>,
    /// Forks the weight gradient onto the side stream and joins it back.
    side_fork: SideFork,
    layout: Layout,
    /// Channels-last only: the weight as KRSC `(K, kh, kw, C/group)`, written by forward.
    weight_krsc: CudaSlice<f32>,
    /// Channels-last only: the weight gradient of a backward as KRSC, before its transpose.
    grad_krsc: CudaSlice<f32>,
    /// The weight as the direct kernel reads it, for a forward or a data gradient by that
    /// kernel, written just before each such launch (see [`forward_pass`], [`data_gradient`]),
    /// then the kernel's partial sums where its tile splits the input channels; or `Wᵀ·dy` at
    /// the output positions (`N·C·OH·OW` floats, in the layer's layout) of an unstriding data
    /// gradient ([`Dgrad::Unstride`]). Used on the compute stream only.
    direct_scratch: CudaSlice<f32>,
    /// Mixed precision's half type, to which the weight gradient is rounded (the FP32 path
    /// rounds its FP32 result; see [`GpuConvolution::in_mixed_precision`]).
    half: Option<Half>,
    /// The half-type path, where the layer's blobs are stored in the half type.
    half_path: Option<HalfConvolution>,
}

impl GpuConvolution {
    /// The convolution `name` with parameters `p`. Loads cuDNN (an error naming the library
    /// where it is missing).
    pub fn new(gpu: &Gpu, name: &str, p: &ConvolutionParams, layout: Layout) -> Result<Self> {
        // A missing cuDNN is the machine's problem, not the config's: a runtime error (exit 1)
        // that names the library and the layer. Both handles are made here, not in a step.
        gpu.cudnn()
            .and_then(|_| gpu.side())
            .map_err(|e| Error::Device(format!("layer `{name}` (convolution): {e}")))?;
        Ok(GpuConvolution {
            name: name.to_string(),
            num_output: p.num_output,
            bias_term: p.bias_term,
            kernel: p.kernel,
            geometry: ConvGeometry {
                pad: p.pad,
                stride: p.stride,
                dilation: p.dilation,
                group: p.group,
            },
            channels: None,
            plans: Vec::new(),
            current: 0,
            workspace: scratch(gpu, 1)?,
            wgrad_workspace: scratch(gpu, 1)?,
            side_fork: SideFork::new(gpu)?,
            layout,
            weight_krsc: scratch(gpu, 1)?,
            grad_krsc: scratch(gpu, 1)?,
            direct_scratch: scratch(gpu, 1)?,
            half: None,
            half_path: None,
        })
    }

    /// The same layer in mixed precision (`half`): its weight gradient rounded to the half
    /// type (each backward's contribution, before it is added to the FP32 gradient), and with
    /// `half_blobs` its bottom and top stored in that type, every direction on the half-type
    /// path ([`HalfConvolution`]; ungrouped).
    pub fn in_mixed_precision(mut self, gpu: &Gpu, half: Half, half_blobs: bool) -> Result<Self> {
        assert!(
            !half_blobs || self.geometry.group == 1,
            "layer `{}`: only an ungrouped convolution runs on half-type blobs",
            self.name
        );
        self.half = Some(half);
        if half_blobs {
            self.half_path = Some(HalfConvolution::new(gpu, half)?);
        }
        Ok(self)
    }

    /// The fixed parameters the half-type path describes its convolutions with.
    fn conv_shape(&self) -> ConvShape {
        ConvShape {
            num_output: self.num_output,
            kernel: self.kernel,
            geometry: self.geometry,
            layout: self.layout,
            bias: self.bias_term,
        }
    }

    fn weight_len(&self) -> usize {
        let c = self.channels.unwrap_or(0);
        self.num_output * (c / self.geometry.group) * self.kernel[0] * self.kernel[1]
    }

    /// Each filter's `(C/group, kh·kw)`: the matrix a KCRS ↔ KRSC transpose turns around.
    fn filter_matrix(&self) -> (usize, usize) {
        let c = self.channels.unwrap_or(0);
        (c / self.geometry.group, self.kernel[0] * self.kernel[1])
    }

    /// Times each of `paths` (cuDNN's chosen backward-filter algorithm, [`gemm_wgrad`], the
    /// implicit GEMM in each of its tiles), each with the layer's bias gradient (fused where
    /// [`fuses_bias`], else the channel sum), on scratch buffers of `plan`'s shapes and answers
    /// the fastest, the first of equals. Synchronises.
    fn fastest_wgrad(&mut self, gpu: &Gpu, plan: &Plan, paths: &[Wgrad]) -> Result<Wgrad> {
        let k = self.num_output;
        let (x, dy, mut dw) = (
            zeroed_floats(&gpu.compute, plan.x.count())?,
            zeroed_floats(&gpu.compute, plan.y.count())?,
            zeroed_floats(&gpu.compute, plan.w.count() + k)?,
        );
        let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, &gpu.compute);
        let lane = Lane {
            dnn: gpu.cudnn()?,
            blas: &gpu.blas,
            ws,
        };
        let (bias_term, wlen) = (self.bias_term, plan.w.count());
        // A path that leaves the bias gradient apart is timed with the channel sum that then
        // computes it (`backward`), so that every path is timed for the same work.
        let top = self.layout.channel_view(&plan.top_shape(k));
        fastest(
            gpu,
            (&self.name, plan.bottom),
            "weight gradient",
            paths,
            |path| {
                let with_bias = fuses_bias(bias_term, &plan.geom, path);
                weight_gradient(gpu, lane, plan, path, (k, with_bias), &x, &dy, 0.0, &mut dw)?;
                if bias_term && !with_bias {
                    let bias = &mut dw.slice_mut(wlen..wlen + k);
                    gpu.kernels
                        .channel_reduce(lane.stream(), &dy, &dy, false, bias, top, false)?;
                }
                Ok(())
            },
        )
    }

    /// Times each of `paths` (cuDNN's chosen forward, the execution plans, each with the bias
    /// kernel, and the direct kernel) on scratch buffers of `plan`'s shapes and answers the
    /// fastest, the first of equals. Synchronises.
    fn fastest_forward(&mut self, gpu: &Gpu, plan: &Plan, paths: &[Fwd]) -> Result<Fwd> {
        let k = self.num_output;
        let wlen = plan.w.count();
        let (x, params, mut y) = (
            zeroed_floats(&gpu.compute, plan.x.count())?,
            zeroed_floats(&gpu.compute, wlen + k)?,
            zeroed_floats(&gpu.compute, plan.y.count())?,
        );
        let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, &gpu.compute);
        let (p, w) = (params.slice(..), params.slice(..wlen));
        let how = (k, self.bias_term, self.layout);
        let direct = &mut self.direct_scratch;
        fastest(gpu, (&self.name, plan.bottom), "forward", paths, |path| {
            let weights = (&w, &mut *direct);
            forward_pass(gpu, plan, path, how, ws, &x, &p, weights, &mut y)
        })
    }

    /// Times each of `paths` (cuDNN's chosen data gradient, the direct kernel's, the unstriding
    /// GEMM) on scratch buffers of `plan`'s shapes and answers the fastest, the first of equals.
    /// Synchronises.
    fn fastest_dgrad(&mut self, gpu: &Gpu, plan: &Plan, paths: &[Dgrad]) -> Result<Dgrad> {
        let k = self.num_output;
        let (dy, weight, mut dx) = (
            zeroed_floats(&gpu.compute, plan.y.count())?,
            zeroed_floats(&gpu.compute, plan.w.count())?,
            zeroed_floats(&gpu.compute, plan.x.count())?,
        );
        let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, &gpu.compute);
        let w = weight.slice(..);
        let (layout, direct) = (self.layout, &mut self.direct_scratch);
        fastest(
            gpu,
            (&self.name, plan.bottom),
            "data gradient",
            paths,
            |path| {
                let weights = (&w, &mut *direct);
                data_gradient(gpu, plan, path, (k, layout, ws), weights, &dy, 0.0, &mut dx)
            },
        )
    }

    /// The output size of one spatial axis, or an error when the kernel does not fit.
    fn out_size(&self, axis: usize, size: usize) -> Result<usize> {
        let g = &self.geometry;
        let extent = g.dilation[axis] * (self.kernel[axis] - 1) + 1;
        let padded = size + 2 * g.pad[axis];
        if padded < extent {
            return Err(Error::net(
                &self.name,
                format!("the kernel extent {extent} exceeds the padded input {padded}"),
            ));
        }
        Ok((padded - extent) / g.stride[axis] + 1)
    }
}

impl BuildGpu for ConvolutionParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuConvolution::new(gpu, name, self, layout)?))
    }
}

impl GpuLayer for GpuConvolution {
    fn type_name(&self) -> &'static str {
        "convolution"
    }

    /// On half-type blobs, its results are half-type values and it reads nothing else.
    fn rounds_itself(&self) -> bool {
        self.half_path.is_some()
    }

    fn rounds_on_load(&self) -> bool {
        self.half_path.is_some()
    }

    /// One `(N, C, H, W)` bottom with the `C` of the first call (a multiple of `group`).
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom(&self.name, bottoms)?;
        let bottom = nchw(&self.name, shape)?;
        let [n, c, h, w] = bottom;
        fix_channels(&self.name, &mut self.channels, shape, self.geometry.group)?;
        let (conv, oh, ow) = (
            self.conv_shape(),
            self.out_size(0, h)?,
            self.out_size(1, w)?,
        );
        if let Some(path) = &mut self.half_path {
            let top = [n, self.num_output, oh, ow];
            return path.reshape(gpu, &self.name, &conv, bottom, top);
        }
        if let Some(i) = self.plans.iter().position(|p| p.bottom == bottom) {
            self.current = i;
            return Ok(());
        }
        let k = self.num_output;
        let dnn = gpu.cudnn()?;
        // cuDNN rejects empty tensors: an empty batch is described as one sample and skipped.
        let nd = n.max(1);
        let layout = self.layout;
        let x = TensorDesc::new([nd, c, h, w], layout)?;
        let y = TensorDesc::new([nd, k, oh, ow], layout)?;
        let wd = FilterDesc::new(
            [k, c / self.geometry.group, self.kernel[0], self.kernel[1]],
            layout,
        )?;
        let algos = ConvAlgos::choose(
            (dnn, &gpu.kernels),
            gpu.conv_algorithm,
            gpu.conv_exact,
            &x,
            &wd,
            self.geometry,
            &y,
        )
        .map_err(|e| Error::Device(format!("layer `{}` (convolution): {e}", self.name)))?;
        grow(gpu, &mut self.workspace, algos.workspace)?;
        grow(gpu, &mut self.wgrad_workspace, algos.workspace)?;
        if layout == Layout::Nhwc || self.half.is_some() {
            // (In mixed precision NCHW, `grad_krsc` holds a weight gradient to be rounded,
            // followed by the bias gradient where the implicit weight gradient computes it.)
            let wlen = self.weight_len();
            grow(gpu, &mut self.weight_krsc, wlen)?;
            grow(gpu, &mut self.grad_krsc, wlen + k)?;
        }
        let g = &self.geometry;
        // Every value fits an int: cuDNN's descriptors above were made from them.
        let int = |v: usize| v as i32;
        let geom = ConvGeom {
            n: int(n),
            c: int(c),
            h: int(h),
            w: int(w),
            kh: int(self.kernel[0]),
            kw: int(self.kernel[1]),
            ph: int(g.pad[0]),
            pw: int(g.pad[1]),
            sh: int(g.stride[0]),
            sw: int(g.stride[1]),
            dh: int(g.dilation[0]),
            dw: int(g.dilation[1]),
            oh: int(oh),
            ow: int(ow),
        };
        let mut plan = Plan {
            bottom,
            x,
            y,
            w: wd,
            algos,
            geom,
            direct_fwd: geom.direct_tile(k),
            direct_dgrad: geom
                .data_gradient_geom(k)
                .and_then(|d| Some((d, d.direct_tile(c)?))),
            fwd: Fwd::Cudnn,
            dgrad: Dgrad::Cudnn,
            wgrad: Wgrad::Cudnn,
            wgrad_bias: false,
            graph: GraphRuns::default(),
        };
        let measured = n > 0 && gpu.conv_algorithm == ConvAlgorithm::Measured;
        let own_kernels = measured && layout == Layout::Nchw && g.group == 1;
        let unstride = measured && unstrides(&geom, g.group);
        // cuDNN's execution plans, for ungrouped convolutions in either layout, where the
        // convolutions run on TF32 tensor cores (`graph::Notes::allowed`) and the library
        // offers the graph API.
        if measured && g.group == 1 && gpu.math.tf32_tensor_cores() && graph::available() {
            let dims = [
                bottom,
                [k, c, self.kernel[0], self.kernel[1]],
                plan.top_shape(k),
            ];
            let conv = |direction| graph::Conv {
                direction,
                dims,
                types: [cudnn::FLOAT; 3],
                layout,
                geometry: self.geometry,
                bias: false,
            };
            let exact = gpu.conv_exact;
            plan.graph = GraphRuns {
                fwd: GraphRun::candidates(
                    dnn,
                    &conv(graph::Direction::Forward),
                    exact,
                    GRAPH_CANDIDATES,
                ),
                dgrad: GraphRun::candidates(
                    dnn,
                    &conv(graph::Direction::BackwardData),
                    exact,
                    GRAPH_CANDIDATES,
                ),
                wgrad: GraphRun::candidates(
                    dnn,
                    &conv(graph::Direction::BackwardFilter),
                    exact,
                    GRAPH_CANDIDATES,
                ),
            };
            let runs = [&plan.graph.fwd, &plan.graph.dgrad, &plan.graph.wgrad];
            let most = runs.iter().flat_map(|r| r.iter()).map(GraphRun::workspace);
            let most = most.max().unwrap_or(0);
            grow(gpu, &mut self.workspace, most)?;
            grow(gpu, &mut self.wgrad_workspace, most)?;
        }
        // The project's own weight gradients take ungrouped NCHW convolutions within their
        // index ranges; measured mode times them and the execution plans against cuDNN's
        // choice, the implicit one in each of its tiles.
        let mut paths = vec![Wgrad::Cudnn];
        if own_kernels {
            if geom.col_len().is_some_and(|len| len <= GEMM_WGRAD_LIMIT) {
                paths.push(Wgrad::Gemm);
            }
            paths.extend(
                IMPLICIT_WGRAD_TILES
                    .into_iter()
                    .filter(|&tile| {
                        let scratch =
                            |bias| gpu.kernels.implicit_wgrad_scratch(&geom, (k, bias), tile);
                        scratch(false).is_some() && scratch(self.bias_term).is_some()
                    })
                    .map(Wgrad::Implicit),
            );
        }
        paths.extend((0..plan.graph.wgrad.len()).map(Wgrad::Graph));
        if paths.len() > 1 {
            plan.wgrad = self.fastest_wgrad(gpu, &plan, &paths)?;
            plan.wgrad_bias = fuses_bias(self.bias_term, &geom, plan.wgrad);
        }
        // The direct kernel, forward and as the data gradient, where its tiles fit; the
        // unstriding GEMM as the data gradient of a strided 1 × 1 convolution.
        let direct_forward = own_kernels && plan.direct_fwd.is_some();
        let direct_dgrad = own_kernels && plan.direct_dgrad.is_some();
        if direct_forward || direct_dgrad {
            let partial_len = [plan.direct_fwd, plan.direct_dgrad.map(|(_, tile)| tile)]
                .iter()
                .flatten()
                .map(|tile| tile.partial_len)
                .max()
                .unwrap_or(0);
            let len = self.weight_len() + partial_len;
            grow(gpu, &mut self.direct_scratch, len)?;
        }
        if unstride {
            grow(gpu, &mut self.direct_scratch, n * c * oh * ow)?;
        }
        let mut fwd_paths = vec![Fwd::Cudnn];
        if direct_forward {
            fwd_paths.push(Fwd::Direct);
        }
        fwd_paths.extend((0..plan.graph.fwd.len()).map(Fwd::Graph));
        if fwd_paths.len() > 1 {
            plan.fwd = self.fastest_forward(gpu, &plan, &fwd_paths)?;
        }
        let mut dgrad_paths = vec![Dgrad::Cudnn];
        if direct_dgrad {
            dgrad_paths.push(Dgrad::Direct);
        }
        if unstride {
            dgrad_paths.push(Dgrad::Unstride);
        }
        dgrad_paths.extend((0..plan.graph.dgrad.len()).map(Dgrad::Graph));
        if dgrad_paths.len() > 1 {
            plan.dgrad = self.fastest_dgrad(gpu, &plan, &dgrad_paths)?;
        }
        // The workspaces were grown for every candidate: keep what the chosen paths of every
        // cached shape need.
        let need = self.plans.iter().chain([&plan]).map(Plan::workspace).max();
        let need = need.unwrap_or(0).max(1);
        for buf in [&mut self.workspace, &mut self.wgrad_workspace] {
            if buf.len() != need {
                *buf = scratch(gpu, need)?;
            }
        }
        self.plans.push(plan);
        self.current = self.plans.len() - 1;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, params) = (pass.gpu, &pass.params);
        let wlen = self.weight_len();
        let conv = self.conv_shape();
        if let Some(path) = &mut self.half_path {
            let [x, y] = pass.blobs.bottom_top();
            let k = self.num_output;
            let bias = self.bias_term.then(|| params.slice(wlen..wlen + k));
            let parameters = (&params.slice(..wlen), bias.as_ref());
            return path.forward(gpu, &conv, parameters, x, y);
        }
        let k = self.num_output;
        let filter = self.filter_matrix();
        let plan = &self.plans[self.current];
        if plan.bottom[0] == 0 {
            return Ok(());
        }
        let s = &gpu.compute;
        let [x, y] = pass.blobs.bottom_top();
        assert!(x.count() == plan.x.count() && y.count() == plan.y.count());
        if self.layout == Layout::Nhwc {
            let w = params.slice(..wlen);
            gpu.kernels
                .transpose(s, &w, &mut self.weight_krsc, k, filter, false)?;
        }
        let weight = match self.layout {
            Layout::Nchw => params.slice(..wlen),
            Layout::Nhwc => self.weight_krsc.slice(..wlen),
        };
        let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, s);
        let how = (k, self.bias_term, self.layout);
        let mut top = y.data_mut();
        let weights = (&weight, &mut self.direct_scratch);
        forward_pass(
            gpu, plan, plan.fwd, how, ws, &x.data, params, weights, &mut top,
        )
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad, params) = (pass.gpu, pass.grads[0], &pass.params);
        let (param_grad, param_diff) = (pass.param_grad, &mut pass.param_diff);
        let wlen = self.weight_len();
        let k = self.num_output;
        let beta = param_grad.beta();
        let (rows, cols) = self.filter_matrix();
        let conv = self.conv_shape();
        if let Some(path) = &mut self.half_path {
            let blobs = pass.blobs.bottom_top();
            let mut dw = param_diff.slice_mut(..wlen + if self.bias_term { k } else { 0 });
            let fork = &self.side_fork;
            return path.backward(gpu, &conv, (grad, param_grad), fork, blobs, &mut dw);
        }
        let plan = &self.plans[self.current];
        let s = &gpu.compute;
        if plan.bottom[0] == 0 {
            return empty_batch_param_gradient(gpu, param_grad, param_diff);
        }
        let dnn = gpu.cudnn()?;
        let [x, y] = pass.blobs.bottom_top();
        // Independent halves of the backward run on two streams, all of them only reading `x`,
        // `dy` and the weight and writing disjoint buffers: where the bottom wants a gradient,
        // the weight and bias gradients run on the side stream beside the data gradient; where
        // it does not (a net's first convolution), the bias gradient runs there beside the
        // weight gradient. Two small convolutions' kernels fill the device better than one. The
        // compute stream waits for the side stream before this backward returns, so the layer's
        // gradients are complete where the net says so.
        let wants_dx = grad.wanted();
        // The implicit weight gradient may compute the bias gradient too.
        let bias_apart = self.bias_term && !plan.wgrad_bias;
        let side = (wants_dx || bias_apart).then(|| gpu.side()).transpose()?;
        if let Some(side) = side {
            self.side_fork.fork(s, side.stream())?;
        }
        let bias_stream = side.map_or(s, |side| side.stream());
        {
            let (wdnn, wblas, wbuf) = match side {
                Some(side) if wants_dx => (&side.dnn, &side.blas, &mut self.wgrad_workspace),
                _ => (dnn, &gpu.blas, &mut self.workspace),
            };
            let ws_stream = wdnn.stream();
            let (ws, _gws) = cudnn::Workspace::of(wbuf, ws_stream);
            let lane = Lane {
                dnn: wdnn,
                blas: wblas,
                ws,
            };
            if bias_apart {
                let db = &mut param_diff.slice_mut(wlen..wlen + k);
                let acc = param_grad.accumulate();
                bias_gradient(gpu, bias_stream, y, self.layout, db, acc)?;
            }
            {
                let outputs = (k, plan.wgrad_bias);
                let mut dw = param_diff.slice_mut(..wlen + if plan.wgrad_bias { k } else { 0 });
                let path = plan.wgrad;
                let accumulate = param_grad.accumulate();
                let (kernels, dw_len) = (&gpu.kernels, dw.len());
                if self.layout == Layout::Nhwc {
                    let krsc = &mut self.grad_krsc;
                    weight_gradient(gpu, lane, plan, path, outputs, &x.data, &y.diff, 0.0, krsc)?;
                    if let Some(h) = self.half {
                        kernels.round_half(ws_stream, krsc, h.is_fp16(), wlen)?;
                    }
                    kernels.transpose(ws_stream, krsc, &mut dw, k, (cols, rows), accumulate)?;
                } else if let Some(h) = self.half {
                    // Mixed precision: this backward's contribution to the weight's gradient
                    // rounded, then added; a bias gradient computed with it is not rounded.
                    let (x, dy, fp16) = (&x.data, &y.diff, h.is_fp16());
                    if accumulate {
                        let g = &mut self.grad_krsc;
                        weight_gradient(gpu, lane, plan, path, outputs, x, dy, 0.0, g)?;
                        kernels.add_rounded(ws_stream, g, &mut dw, fp16, true, wlen)?;
                        if plan.wgrad_bias {
                            let (gb, mut db) = (g.slice(wlen..dw_len), dw.slice_mut(wlen..dw_len));
                            kernels.axpy(ws_stream, 1.0, &gb, &mut db, k)?;
                        }
                    } else {
                        weight_gradient(gpu, lane, plan, path, outputs, x, dy, 0.0, &mut dw)?;
                        kernels.round_half(ws_stream, &mut dw, fp16, wlen)?;
                    }
                } else {
                    let (x, dy) = (&x.data, &y.diff);
                    weight_gradient(gpu, lane, plan, path, outputs, x, dy, beta, &mut dw)?;
                }
            }
        }
        if wants_dx {
            let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, s);
            // Channels-last: the KRSC weight this pass's forward wrote.
            let w = match self.layout {
                Layout::Nchw => params.slice(..wlen),
                Layout::Nhwc => self.weight_krsc.slice(..wlen),
            };
            let weights = (&w, &mut self.direct_scratch);
            let (dy, dx) = (&y.diff, &mut x.diff);
            let beta = grad.beta();
            let how = (k, self.layout, ws);
            data_gradient(gpu, plan, plan.dgrad, how, weights, dy, beta, dx)?;
        }
        if let Some(side) = side {
            self.side_fork.join(side.stream(), s)?;
        }
        Ok(())
    }
}

/// Fixes `channels` to the `C` of the bottom `shape` `(N, C, H, W)` at the first reshape; an
/// error naming `layer` when a later bottom has another `C` or `C` is not a multiple of `group`.
pub(super) fn fix_channels(
    layer: &str,
    channels: &mut Option<usize>,
    shape: &[usize],
    group: usize,
) -> Result<()> {
    let c = shape[1];
    match *channels {
        Some(c0) if c0 != c => Err(Error::net(
            layer,
            format!("bottom {shape:?} has {c} channels, the weight expects {c0}"),
        )),
        _ if !c.is_multiple_of(group) => Err(Error::net(
            layer,
            format!("{c} input channels are not a multiple of `group` {group}"),
        )),
        _ => {
            *channels = Some(c);
            Ok(())
        }
    }
}

/// The parameters' gradient of a batch of no samples: zero, so an overwritten one is filled
/// with zeros on the compute stream and an accumulated one is left alone.
pub(super) fn empty_batch_param_gradient(
    gpu: &Gpu,
    param_grad: Grad,
    param_diff: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    if !param_grad.accumulate() {
        let n = param_diff.len();
        gpu.kernels.fill(&gpu.compute, param_diff, 0.0, n)?;
    }
    Ok(())
}

/// `db (K) (+)= Σ dy` over the samples and positions of `y`'s diff (stored in `layout`), on `s`:
/// the project's two-stage channel sum, deterministic, and several times faster than cuDNN's
/// `cudnnConvolutionBackwardBias` on large activations.
pub(super) fn bias_gradient(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    y: &GpuBlob,
    layout: Layout,
    db: &mut CudaViewMut<'_, f32>,
    accumulate: bool,
) -> Result<()> {
    let dy = y.diff();
    let view = layout.channel_view(&y.shape);
    gpu.kernels
        .channel_reduce(s, &dy, &dy, false, db, view, accumulate)
}

/// The two events of a backward that runs its weight gradient on the device's side stream
/// ([`Gpu::side`]) beside the data gradient: `ready`, recorded on the compute stream once the
/// top's gradient is complete, which the side stream waits for; `done`, recorded on the side
/// stream after its work, which the compute stream waits for before the backward returns.
#[derive(Debug)]
struct SideFork {
    ready: CudaEvent,
    done: CudaEvent,
}

impl SideFork {
    fn new(gpu: &Gpu) -> Result<SideFork> {
        Ok(SideFork {
            ready: event(gpu)?,
            done: event(gpu)?,
        })
    }

    /// The `side` stream waits for what the `compute` stream has enqueued so far.
    fn fork(&self, compute: &CudaStream, side: &CudaStream) -> Result<()> {
        self.ready
            .record(compute)
            .map_err(|e| gpu_error("record an event", e))?;
        side.wait(&self.ready)
            .map_err(|e| gpu_error("wait for an event", e))
    }

    /// The `compute` stream waits for what the `side` stream has enqueued so far.
    fn join(&self, side: &CudaStream, compute: &CudaStream) -> Result<()> {
        self.done
            .record(side)
            .map_err(|e| gpu_error("record an event", e))?;
        compute
            .wait(&self.done)
            .map_err(|e| gpu_error("wait for an event", e))
    }
}

/// An event for ordering two streams (no timing).
fn event(gpu: &Gpu) -> Result<CudaEvent> {
    gpu.ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(|e| gpu_error("create a convolution event", e))
}

#[cfg(test)]
mod tests {
    use super::GpuConvolution;
    use crate::config::MathMode;
    use crate::cuda::layers::testing::{
        check_against_cpu, check_against_cpu_rtol, layer_matches_cpu, LayerCase,
    };
    use crate::cuda::layout::Layout;
    use crate::cuda::test_util::gpu_or_skip;
    use crate::cuda::Gpu;
    use crate::layers::gradient_check::{from_config, layer_config};
    use cudarc::driver::CudaSlice;
    use rand::Rng;
    use rand_chacha::ChaCha8Rng;

    fn case(extra: &str, bottom: &[usize]) -> LayerCase {
        LayerCase::new(
            &format!("name = \"conv\"\ntype = \"convolution\"\n{extra}"),
            vec![bottom.to_vec()],
        )
    }

    /// An NCHW convolution of the keys `extra`, planned for the bottom `shape`.
    fn planned(gpu: &Gpu, extra: &str, shape: [usize; 4]) -> GpuConvolution {
        planned_in(gpu, extra, shape, Layout::Nchw)
    }

    /// A convolution of the keys `extra` storing its blobs in `layout`, planned for the bottom
    /// `shape` (NCHW).
    fn planned_in(gpu: &Gpu, extra: &str, shape: [usize; 4], layout: Layout) -> GpuConvolution {
        use crate::cuda::layers::GpuLayer;
        let cfg = layer_config(&format!("name = \"conv\"\ntype = \"convolution\"\n{extra}"));
        let mut layer = from_config(|n, p| GpuConvolution::new(gpu, n, p, layout), &cfg).unwrap();
        layer.reshape(gpu, &[&shape]).unwrap();
        layer
    }

    /// `n` values uniform in [-1, 1) from `rng`, on the device.
    fn random_on_device(gpu: &Gpu, rng: &mut ChaCha8Rng, n: usize) -> CudaSlice<f32> {
        let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        gpu.compute.clone_htod(&v).unwrap()
    }

    layer_matches_cpu! {
        matches_cpu_3x3_pad_1: "name = \"conv\"\ntype = \"convolution\"\nnum_output = 8\nkernel_size = 3\npad = 1", vec![vec![2, 3, 9, 9]], 301;
        matches_cpu_strided_without_bias: "name = \"conv\"\ntype = \"convolution\"\nnum_output = 5\nkernel_size = [3, 2]\nstride = [2, 1]\npad = [0, 1]\nbias_term = false", vec![vec![3, 4, 11, 8]], 302;
        matches_cpu_dilated: "name = \"conv\"\ntype = \"convolution\"\nnum_output = 6\nkernel_size = 3\ndilation = 2\npad = 2", vec![vec![2, 3, 10, 10]], 303;
        matches_cpu_grouped: "name = \"conv\"\ntype = \"convolution\"\nnum_output = 6\nkernel_size = 3\ngroup = 3\nstride = 2\npad = 1", vec![vec![2, 6, 9, 7]], 304;
        matches_cpu_1x1_at_cnn_size: "name = \"conv\"\ntype = \"convolution\"\nnum_output = 64\nkernel_size = 1", vec![vec![8, 32, 16, 16]], 305;
    }

    /// The GEMM weight gradient (im2col and cuBLAS) and the implicit one agree with cuDNN's on
    /// the same plan, with padding, stride and dilation, and accumulate with beta = 1; the
    /// implicit one in each of its tiles (sub-tiles of 4 × 8 and 8 × 8), over several tiles of
    /// `dW` (K = 40, C·kh·kw = 200) and many chunks of `N·OH·OW` (each tile split as fits the
    /// device's waves), bit for bit the same when run again; with the bias gradient fused (where
    /// the last tile has room: not for 800 columns in tiles of 160), the same weight gradient bit
    /// for bit and the bias gradient the sum of `dy` over samples and positions.
    #[test]
    fn own_weight_gradients_match_cudnn() {
        use super::{cudnn, weight_gradient, Wgrad, IMPLICIT_WGRAD_TILES};
        use crate::cuda::test_util::assert_close;
        use rand::SeedableRng;
        let gpu = gpu_or_skip!("own_weight_gradients_match_cudnn");
        let cases = [
            ("num_output = 5\nkernel_size = [3, 2]\nstride = [2, 1]\npad = [1, 0]\ndilation = [1, 2]", [3, 4, 11, 9]),
            ("num_output = 16\nkernel_size = 1", [2, 24, 7, 7]),
            ("num_output = 8\nkernel_size = 5\npad = 2", [4, 3, 12, 12]),
            ("num_output = 40\nkernel_size = 5\npad = 2", [4, 8, 12, 12]),
            ("num_output = 32\nkernel_size = 5\npad = 2", [2, 32, 8, 8]),
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(308);
        for (extra, shape) in cases {
            let mut layer = planned(&gpu, extra, shape);
            let plan = &layer.plans[layer.current];
            let mut random = |n: usize| random_on_device(&gpu, &mut rng, n);
            let (x, dy) = (random(plan.x.count()), random(plan.y.count()));
            let k = layer.num_output;
            let start = random(plan.w.count() + k);
            let (ws, _gws) = cudnn::Workspace::of(&mut layer.workspace, &gpu.compute);
            let run_with = |path, with_bias, beta| {
                let mut dw = gpu.compute.clone_dtod(&start).unwrap();
                let lane = super::Lane {
                    dnn: gpu.cudnn().unwrap(),
                    blas: &gpu.blas,
                    ws,
                };
                let outputs = (k, with_bias);
                weight_gradient(&gpu, lane, plan, path, outputs, &x, &dy, beta, &mut dw).unwrap();
                let mut host = gpu.compute.clone_dtoh(&dw).unwrap();
                gpu.synchronize().unwrap();
                if !with_bias {
                    host.truncate(plan.w.count());
                }
                host
            };
            let run = |path, beta| run_with(path, false, beta);
            // The bias gradient: dy summed over samples and positions, in f64.
            let (dy_host, start_host) = (
                gpu.compute.clone_dtoh(&dy).unwrap(),
                gpu.compute.clone_dtoh(&start).unwrap(),
            );
            gpu.synchronize().unwrap();
            let per_sample = dy_host.len() / plan.bottom[0];
            let inner = per_sample / k;
            let want_bias = |beta: f32| -> Vec<f32> {
                (0..k)
                    .map(|c| {
                        let sum: f64 = dy_host
                            .chunks(per_sample)
                            .flat_map(|sample| &sample[c * inner..(c + 1) * inner])
                            .map(|&v| f64::from(v))
                            .sum();
                        sum as f32 + beta * start_host[plan.w.count() + c]
                    })
                    .collect()
            };
            for beta in [0.0, 1.0] {
                let want = run(Wgrad::Cudnn, beta);
                let gemm = run(Wgrad::Gemm, beta);
                assert_close(&format!("{extra}, GEMM, beta {beta}"), &gemm, &want, 1e-5);
                for tile in IMPLICIT_WGRAD_TILES {
                    let implicit = run(Wgrad::Implicit(tile), beta);
                    let what = format!("{extra}, implicit, {tile:?}, beta {beta}");
                    assert_close(&what, &implicit, &want, 1e-5);
                    assert!(
                        implicit == run(Wgrad::Implicit(tile), beta),
                        "{what}: the implicit weight gradient differs between two runs"
                    );
                    if plan.geom.implicit_wgrad_fuses_bias(tile) {
                        let fused = run_with(Wgrad::Implicit(tile), true, beta);
                        let (weight, bias) = fused.split_at(plan.w.count());
                        assert!(weight == implicit, "{what}: fused, the weight differs");
                        assert_close(
                            &format!("{what}, fused, bias"),
                            bias,
                            &want_bias(beta),
                            1e-5,
                        );
                    }
                }
            }
        }
    }

    /// Every execution plan the graph API offers a layer in `measured` mode (the candidates it
    /// times) agrees with cuDNN's legacy call on the same plan in tf32, within TF32's precision
    /// (5e-3 of the scale, as against the CPU), in both layouts: the forward (with the bias
    /// kernel), the data gradient and the weight gradient, overwriting and accumulating (β 0
    /// and the engine built again for β 1), bit for bit the same when run again; every shape
    /// here is offered plans in all three directions, none of them nondeterministic.
    #[test]
    fn execution_plans_match_cudnn() {
        use super::{
            cudnn, data_gradient, forward_pass, weight_gradient, Dgrad, Fwd, GraphRun, Lane, Wgrad,
        };
        use crate::config::MathMode;
        use crate::cuda::test_util::assert_close;
        use rand::SeedableRng;
        let gpu = gpu_or_skip!("execution_plans_match_cudnn", MathMode::Tf32);
        assert!(
            super::graph::available(),
            "the loaded cuDNN does not offer the graph API (version {})",
            super::cudnn::Cudnn::version()
        );
        /// Each of `runs` by `run(i)` agrees with `want` within TF32's precision, and gives the
        /// same bits when run again.
        fn plans_agree(
            what: &str,
            runs: &[GraphRun],
            want: &[f32],
            mut run: impl FnMut(usize) -> Vec<f32>,
        ) {
            for (i, graph_run) in runs.iter().enumerate() {
                let got = run(i);
                let name = format!("{what}, plan {i} {:?}", graph_run.overwrite);
                assert_close(&name, &got, want, 5e-3);
                assert!(got == run(i), "{name}: other bits when run again");
            }
        }
        let cases = [
            ("num_output = 8\nkernel_size = 3\npad = 1", [2, 16, 9, 9]),
            ("num_output = 5\nkernel_size = [3, 2]\nstride = [2, 1]\npad = [1, 0]\ndilation = [1, 2]\nbias_term = false", [3, 4, 11, 9]),
            ("num_output = 32\nkernel_size = 5\npad = 2", [4, 32, 16, 16]),
            ("num_output = 64\nkernel_size = 1\nstride = 2", [2, 32, 14, 14]),
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(315);
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for (extra, shape) in cases {
                let what = format!("{extra} ({layout:?})");
                let mut layer = planned_in(&gpu, extra, shape, layout);
                let plan = &layer.plans[layer.current];
                let graph = &plan.graph;
                let directions = [&graph.fwd, &graph.dgrad, &graph.wgrad];
                assert!(
                    directions.iter().all(|runs| !runs.is_empty()),
                    "{what}: no execution plan in some direction: {graph:?}"
                );
                eprintln!("{what}: {graph:?}");
                let runs = directions.iter().flat_map(|runs| runs.iter());
                for run in runs.clone() {
                    let (first, twin) = (&run.overwrite, run.accumulate.as_ref());
                    let twin = twin.unwrap_or_else(|| panic!("{what}: no β = 1 plan: {run:?}"));
                    for p in [first, twin] {
                        assert!(p.notes.allowed(MathMode::Tf32, true), "{what}: {p:?}");
                    }
                    assert!(
                        (first.engine, first.knobs()) == (twin.engine, twin.knobs()),
                        "{what}: the β = 1 plan is another engine or knobs: {run:?}"
                    );
                }
                let most = runs
                    .map(GraphRun::workspace)
                    .fold(plan.algos.workspace, usize::max);
                let mut workspace = gpu.compute.alloc_zeros::<u8>(most.max(1)).unwrap();
                let (ws, _gws) = cudnn::Workspace::of(&mut workspace, &gpu.compute);
                let k = layer.num_output;
                let mut random = |n: usize| random_on_device(&gpu, &mut rng, n);
                let (x, params, dy) = (
                    random(plan.x.count()),
                    random(plan.w.count() + k),
                    random(plan.y.count()),
                );
                let (dx0, dw0) = (random(plan.x.count()), random(plan.w.count()));
                let (p, w) = (params.slice(..), params.slice(..plan.w.count()));
                let host = |buf: &cudarc::driver::CudaSlice<f32>| {
                    let v = gpu.compute.clone_dtoh(buf).unwrap();
                    gpu.synchronize().unwrap();
                    v
                };
                let scratch = &mut layer.direct_scratch;
                let how = (k, layer.bias_term, layout);
                let mut forward = |path| {
                    let mut y = gpu.compute.alloc_zeros::<f32>(plan.y.count()).unwrap();
                    let weights = (&w, &mut *scratch);
                    forward_pass(&gpu, plan, path, how, ws, &x, &p, weights, &mut y).unwrap();
                    host(&y)
                };
                let want = forward(Fwd::Cudnn);
                plans_agree(&format!("{what}: forward"), &graph.fwd, &want, |i| {
                    forward(Fwd::Graph(i))
                });
                let scratch = &mut layer.direct_scratch;
                let mut dgrad = |path, beta| {
                    let mut dx = gpu.compute.clone_dtod(&dx0).unwrap();
                    let weights = (&w, &mut *scratch);
                    let how = (k, layout, ws);
                    data_gradient(&gpu, plan, path, how, weights, &dy, beta, &mut dx).unwrap();
                    host(&dx)
                };
                let lane = Lane {
                    dnn: gpu.cudnn().unwrap(),
                    blas: &gpu.blas,
                    ws,
                };
                let wgrad = |path, beta| {
                    let mut dw = gpu.compute.clone_dtod(&dw0).unwrap();
                    let outputs = (k, false);
                    weight_gradient(&gpu, lane, plan, path, outputs, &x, &dy, beta, &mut dw)
                        .unwrap();
                    host(&dw)
                };
                for beta in [0.0, 1.0] {
                    let want = dgrad(Dgrad::Cudnn, beta);
                    let name = format!("{what}: data gradient, beta {beta}");
                    plans_agree(&name, &graph.dgrad, &want, |i| dgrad(Dgrad::Graph(i), beta));
                    let want = wgrad(Wgrad::Cudnn, beta);
                    let name = format!("{what}: weight gradient, beta {beta}");
                    plans_agree(&name, &graph.wgrad, &want, |i| wgrad(Wgrad::Graph(i), beta));
                }
            }
        }
    }

    /// In fp32 a layer is offered no execution plan: it keeps the legacy calls, whose FMA math
    /// rules TF32 out (`graph::Notes::allowed`).
    #[test]
    fn no_execution_plans_in_fp32() {
        let gpu = gpu_or_skip!("no_execution_plans_in_fp32");
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let layer = planned_in(
                &gpu,
                "num_output = 8\nkernel_size = 3\npad = 1",
                [2, 16, 9, 9],
                layout,
            );
            let graph = &layer.plans[layer.current].graph;
            assert!(
                graph.fwd.is_empty() && graph.dgrad.is_empty() && graph.wgrad.is_empty(),
                "{layout:?}: {graph:?}"
            );
        }
    }

    /// The direct forward agrees with cuDNN's (plus the bias kernel) on the same plan: a first
    /// convolution of cifar10_quick's shape; stride, dilation, a rectangular kernel, no bias,
    /// several row and column tiles and a partial tile of channels; a 7 × 7, stride-2 one with
    /// three tiles of channels; cifar10_quick's second (four chunks of input channels, warps of
    /// 2 × 16 lanes) at batch 512 (one pass over the chunks) and 3 (the chunks in splits of
    /// their own), 37 channels in unequal chunks, and narrow planes (warps of 4 × 8 lanes);
    /// short planes with a sample per row of lanes: cifar10_quick's third (4 samples of 8 × 8,
    /// the last block with 2 samples of its 4), 7 × 7 planes with a partial tile of channels,
    /// 6 × 12 planes (2 samples of 16 columns). Bit for bit the same when run again.
    #[test]
    fn direct_forward_matches_cudnn() {
        use super::{cudnn, forward_pass, Fwd};
        use crate::cuda::test_util::assert_close;
        use rand::SeedableRng;
        let gpu = gpu_or_skip!("direct_forward_matches_cudnn");
        let cases = [
            ("num_output = 32\nkernel_size = 5\npad = 2", [2, 3, 32, 32]),
            ("num_output = 20\nkernel_size = [3, 5]\nstride = 2\npad = [1, 2]\ndilation = [2, 1]\nbias_term = false", [3, 2, 29, 83]),
            ("num_output = 70\nkernel_size = 7\nstride = 2\npad = 3", [2, 3, 21, 21]),
            ("num_output = 32\nkernel_size = 5\npad = 2", [512, 32, 16, 16]),
            ("num_output = 32\nkernel_size = 5\npad = 2", [3, 32, 16, 16]),
            ("num_output = 40\nkernel_size = 3\npad = 1\nstride = [1, 2]", [2, 37, 19, 27]),
            ("num_output = 9\nkernel_size = [5, 3]\npad = [0, 1]", [2, 6, 40, 7]),
            ("num_output = 64\nkernel_size = 5\npad = 2", [6, 32, 8, 8]),
            ("num_output = 40\nkernel_size = 3\npad = 1", [5, 19, 7, 7]),
            ("num_output = 12\nkernel_size = 3\npad = 1\nbias_term = false", [3, 5, 6, 12]),
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(310);
        for (extra, shape) in cases {
            let mut layer = planned(&gpu, extra, shape);
            let plan = &layer.plans[layer.current];
            let k = layer.num_output;
            assert!(plan.geom.direct_tile(k).is_some(), "{extra}");
            let mut random = |n: usize| random_on_device(&gpu, &mut rng, n);
            let wlen = plan.w.count();
            let (x, params) = (random(plan.x.count()), random(wlen + k));
            let (ws, _gws) = cudnn::Workspace::of(&mut layer.workspace, &gpu.compute);
            let how = (k, layer.bias_term, Layout::Nchw);
            let direct = &mut layer.direct_scratch;
            let mut run = |path| {
                let mut y = gpu.compute.alloc_zeros::<f32>(plan.y.count()).unwrap();
                let (p, w) = (params.slice(..), params.slice(..wlen));
                let weights = (&w, &mut *direct);
                forward_pass(&gpu, plan, path, how, ws, &x, &p, weights, &mut y).unwrap();
                let host = gpu.compute.clone_dtoh(&y).unwrap();
                gpu.synchronize().unwrap();
                host
            };
            let (want, direct) = (run(Fwd::Cudnn), run(Fwd::Direct));
            assert_close(&format!("{extra}, direct forward"), &direct, &want, 1e-5);
            assert!(
                direct == run(Fwd::Direct),
                "{extra}: the direct forward differs between two runs"
            );
        }
    }

    /// The data gradient by the direct kernel (the forward of `dy` with the flipped filters)
    /// agrees with cuDNN's on the same plan, overwriting and accumulating (beta 0 and 1):
    /// cifar10_quick's second convolution at batch 512 (one pass over four chunks of channels)
    /// and 3 (the chunks in splits of their own), its third (8 × 8 planes with a sample per row
    /// of lanes), more outputs than inputs, a rectangular dilated kernel with uneven padding,
    /// and a 1 × 1 one. Bit for bit the same when run again.
    #[test]
    fn direct_data_gradient_matches_cudnn() {
        let gpu = gpu_or_skip!("direct_data_gradient_matches_cudnn");
        let cases = [
            (
                "num_output = 32\nkernel_size = 5\npad = 2",
                [512, 32, 16, 16],
            ),
            ("num_output = 32\nkernel_size = 5\npad = 2", [3, 32, 16, 16]),
            ("num_output = 64\nkernel_size = 5\npad = 2", [5, 32, 8, 8]),
            (
                "num_output = 48\nkernel_size = 3\npad = 1\nbias_term = false",
                [2, 20, 13, 30],
            ),
            (
                "num_output = 7\nkernel_size = [3, 2]\npad = [1, 0]\ndilation = [2, 1]",
                [2, 5, 17, 12],
            ),
            ("num_output = 24\nkernel_size = 1", [2, 16, 9, 40]),
        ];
        let path = (super::Dgrad::Direct, Layout::Nchw);
        data_gradient_matches_cudnn(&gpu, &cases, path, 311, |plan, k, c| {
            let geom = plan.geom.data_gradient_geom(k);
            geom.and_then(|g| g.direct_tile(c)).is_some()
        });
    }

    /// The data gradient by `path` agrees with cuDNN's (to 1e-5) on each of `cases` (a layer's
    /// keys and its NCHW bottom shape, planned in measured mode with its blobs in `layout`,
    /// where `applies(plan, K, C)`), overwriting and accumulating (beta 0 and 1), from random
    /// `dy`, weight and `dx`; and is bit for bit the same when run again.
    fn data_gradient_matches_cudnn(
        gpu: &Gpu,
        cases: &[(&str, [usize; 4])],
        (path, layout): (super::Dgrad, Layout),
        seed: u64,
        applies: impl Fn(&super::Plan, usize, usize) -> bool,
    ) {
        use super::{cudnn, data_gradient, Dgrad};
        use crate::cuda::test_util::assert_close;
        use rand::SeedableRng;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for &(extra, shape) in cases {
            let mut layer = planned_in(gpu, extra, shape, layout);
            let plan = &layer.plans[layer.current];
            let k = layer.num_output;
            assert!(applies(plan, k, shape[1]), "{extra}");
            let mut random = |n: usize| random_on_device(gpu, &mut rng, n);
            let (dy, weight, start) = (
                random(plan.y.count()),
                random(plan.w.count()),
                random(plan.x.count()),
            );
            let (ws, _gws) = cudnn::Workspace::of(&mut layer.workspace, &gpu.compute);
            let scratch = &mut layer.direct_scratch;
            let mut run = |path, beta| {
                let mut dx = gpu.compute.clone_dtod(&start).unwrap();
                let weights = (&weight.slice(..), &mut *scratch);
                let how = (k, layout, ws);
                data_gradient(gpu, plan, path, how, weights, &dy, beta, &mut dx).unwrap();
                let host = gpu.compute.clone_dtoh(&dx).unwrap();
                gpu.synchronize().unwrap();
                host
            };
            for beta in [0.0, 1.0] {
                let (want, got) = (run(Dgrad::Cudnn, beta), run(path, beta));
                let what = format!("{extra}, {layout:?}, {path:?} data gradient, beta {beta}");
                assert_close(&what, &got, &want, 1e-5);
                assert!(got == run(path, beta), "{what}: differs between two runs");
            }
        }
    }

    /// The unstriding data gradient of a strided 1 × 1 convolution (a GEMM, then the spread into
    /// every stride-th position) agrees with cuDNN's on the same plan, NCHW and channels-last,
    /// overwriting and accumulating: even and odd planes, unequal strides, ResNet-50's
    /// downsampling shape at a small batch. Bit for bit the same when run again.
    #[test]
    fn unstriding_data_gradient_matches_cudnn() {
        let gpu = gpu_or_skip!("unstriding_data_gradient_matches_cudnn");
        let cases = [
            (
                "num_output = 32\nkernel_size = 1\nstride = 2\nbias_term = false",
                [3, 16, 14, 14],
            ),
            (
                "num_output = 8\nkernel_size = 1\nstride = [2, 3]",
                [2, 12, 13, 11],
            ),
            (
                "num_output = 128\nkernel_size = 1\nstride = 2",
                [4, 64, 28, 28],
            ),
        ];
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let path = (super::Dgrad::Unstride, layout);
            data_gradient_matches_cudnn(&gpu, &cases, path, 312, |plan, _, _| {
                super::unstrides(&plan.geom, 1)
            });
        }
    }

    layer_matches_cpu!(
        matches_cpu_strided_1x1,
        "name = \"conv\"\ntype = \"convolution\"\nnum_output = 12\nkernel_size = 1\nstride = 2",
        vec![vec![2, 8, 9, 10]],
        313
    );

    /// cuDNN's heuristic choice (no timing) computes the same convolution.
    #[test]
    fn matches_cpu_with_heuristic_algorithms() {
        let mut gpu = gpu_or_skip!("matches_cpu_with_heuristic_algorithms");
        gpu.conv_algorithm = crate::config::ConvAlgorithm::Heuristic;
        check_against_cpu(
            &gpu,
            &case(
                "num_output = 8\nkernel_size = 3\npad = 1\nstride = 2",
                &[4, 6, 13, 11],
            ),
            307,
        );
    }

    /// `conv_exact = false` lets FFT and Winograd algorithms in (cifar10_quick's 5×5 shapes at a
    /// batch where cuDNN offers them): they round differently from a dot product, and on this
    /// shape the weight gradient agrees with the CPU's only to about 3e-3 of its largest element
    /// (measured on an H200), hence 1e-2 here: a check that the algorithms compute this
    /// convolution (padding, filter orientation), not of FP32 precision.
    #[test]
    fn matches_cpu_with_any_algorithm() {
        let mut gpu = gpu_or_skip!("matches_cpu_with_any_algorithm");
        gpu.conv_exact = false;
        check_against_cpu_rtol(
            &gpu,
            &case(
                "num_output = 32\nkernel_size = 5\npad = 2",
                &[64, 32, 16, 16],
            ),
            309,
            1e-2,
        );
    }

    /// TF32 tensor cores round the inputs to 10 mantissa bits: agreement to about 1e-3.
    #[test]
    fn matches_cpu_in_tf32_within_its_precision() {
        let gpu = gpu_or_skip!("matches_cpu_in_tf32_within_its_precision", MathMode::Tf32);
        check_against_cpu_rtol(
            &gpu,
            &case("num_output = 16\nkernel_size = 3\npad = 1", &[4, 8, 12, 12]),
            306,
            5e-3,
        );
    }
}
