//! [`HalfConvolution`]: the path of a [`GpuConvolution`](super::GpuConvolution) whose bottom and
//! top are stored in the half type (mixed precision's half-type blobs, chosen by the net's
//! storage plan for ungrouped convolutions): every direction an execution plan of cuDNN's graph
//! API on half-type tensors with FP32 accumulation — at half the bytes of the FP32 tensors and
//! twice the tensor-core rate of TF32.
//!
//! Shapes as the layer's: `x (N, C, H, W)`, `w (K, C, kh, kw)`, `y (N, K, OH, OW)`, stored NCHW
//! or channels-last as the layer runs (the filter KCRS or KRSC beside them).
//!
//! - Forward: the weights the layers see (rounded FP32, KCRS) are written as half-type bits
//!   into the layer's `weight` (transposed to KRSC when channels-last), then `y = conv(x, w)`,
//!   or with a bias `y = conv(x, w) + b`: the bias the layers see (rounded FP32) written as
//!   half-type bits too, and one plan that adds it in FP32 to the FP32 products before their
//!   one rounding to the half type, as the CPU rounds the top it wrote with its bias.
//! - Data gradient: `dx (+)= conv_t(dy, w)`, the plan for β = 1 where the net accumulates; the
//!   result is rounded once to the half type after the addition, as the CPU rounds a bottom
//!   gradient after each layer's contribution.
//! - Weight gradient: `dW = conv(x, dy)` in the half type (no engine takes half-type `x` and
//!   `dy` into an FP32 `dW`), widened and written or added into the FP32 gradient (transposed
//!   back to KCRS when channels-last): the contract's rounding of a convolution's weight
//!   gradient in mixed precision (docs/design.md, Mixed precision). Where the bottom wants a
//!   gradient it runs on the device's side stream beside the data gradient, as the FP32 path's.
//! - Bias gradient: `db (+)= Σ dy` over the samples and positions, in double from the exact
//!   half-type values (`Kernels::channel_reduce_half`), never rounded (the contract's FP32
//!   parameter gradients); beside the weight gradient, on its stream.
//!
//! Each direction's first [`HALF_CANDIDATES`] plans that `conv_exact` allows are timed once per
//! bottom shape (the larger of device and host time, as every path choice) and the cheapest
//! kept; with `conv_algorithm = "heuristic"` the first of them, untimed, so that every run
//! takes the same plans. Workspaces are cut back to the chosen plans' need.

use super::{fastest, GraphRun, SideFork};
use crate::config::ConvAlgorithm;
use crate::cuda::blob::GpuBlob;
use crate::cuda::cudnn::{self, graph, ConvGeometry};
use crate::cuda::layers::{grow, scratch, Grad};
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::precision::Half;
use cudarc::cudnn::sys::cudnnDataType_t;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

/// How many of the heuristics' allowed execution plans are timed per direction.
const HALF_CANDIDATES: usize = 4;

/// The cuDNN element type of `half`.
pub fn cudnn_type(half: Half) -> cudnnDataType_t {
    match half {
        Half::Bf16 => cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        Half::Fp16 => cudnnDataType_t::CUDNN_DATA_HALF,
    }
}

/// What a convolution is, apart from its batch: the layer's fixed parameters.
#[derive(Debug, Clone, Copy)]
pub struct ConvShape {
    pub num_output: usize,
    pub kernel: [usize; 2],
    pub geometry: ConvGeometry,
    pub layout: Layout,
    /// Whether the layer adds a bias, which its forward's plan adds ([`graph::Conv::bias`]).
    pub bias: bool,
}

impl ConvShape {
    /// The graph API's description of the `direction` of this convolution of `bottom`
    /// `(N, C, H, W)` into `top` `(N, K, OH, OW)`, on tensors of `half`.
    fn conv(
        &self,
        direction: graph::Direction,
        bottom: [usize; 4],
        top: [usize; 4],
        half: Half,
    ) -> graph::Conv {
        let c = bottom[1];
        graph::Conv {
            direction,
            dims: [
                bottom,
                [self.num_output, c, self.kernel[0], self.kernel[1]],
                top,
            ],
            types: [cudnn_type(half); 3],
            layout: self.layout,
            geometry: self.geometry,
            bias: self.bias && direction == graph::Direction::Forward,
        }
    }
}

/// Whether cuDNN's graph API has an allowed execution plan for each direction of the
/// convolution `shape` of `bottom` into `top` on half-type tensors, as
/// [`HalfConvolution`]'s reshape will find them (among the first [`HALF_CANDIDATES`] allowed
/// plans, one with its β = 1 twin, but for a forward that adds a bias): what the storage plan
/// asks before it stores the convolution's blobs in the half type. The first allowed plan and
/// its twin answer for most shapes; only where that twin does not build are the candidates
/// built.
pub fn plans_exist(
    gpu: &Gpu,
    shape: &ConvShape,
    bottom: [usize; 4],
    top: [usize; 4],
    half: Half,
) -> bool {
    let Ok(dnn) = gpu.cudnn() else {
        return false;
    };
    let (math, exact) = (dnn.math(), gpu.conv_exact);
    let accept = |notes: &graph::Notes| notes.allowed(math, exact);
    [
        graph::Direction::Forward,
        graph::Direction::BackwardData,
        graph::Direction::BackwardFilter,
    ]
    .into_iter()
    .all(|direction| {
        let conv = shape.conv(direction, described(bottom), described(top), half);
        let first = graph::plans(dnn, &conv, 0.0, 1, accept).and_then(|plans| match conv.bias {
            true => Ok(true),
            false => Ok(plans[0].with_beta(dnn, &conv, 1.0)?.is_some()),
        });
        match first {
            Ok(true) => true,
            Ok(false) => !GraphRun::candidates(dnn, &conv, exact, HALF_CANDIDATES).is_empty(),
            Err(e) => {
                let bias = conv.bias;
                tracing::debug!(?direction, ?bottom, bias, error = %e, "no half-type plan");
                false
            }
        }
    })
}

/// `shape` `(N, C, H, W)` with its batch at least 1: cuDNN rejects empty tensors, so an empty
/// batch is described as one sample (and skipped).
fn described([n, c, h, w]: [usize; 4]) -> [usize; 4] {
    [n.max(1), c, h, w]
}

/// The chosen plan of each direction for one bottom shape.
#[derive(Debug)]
struct HalfPlan {
    bottom: [usize; 4],
    fwd: GraphRun,
    dgrad: GraphRun,
    wgrad: GraphRun,
}

impl HalfPlan {
    fn workspace(&self) -> usize {
        [&self.fwd, &self.dgrad, &self.wgrad]
            .iter()
            .map(|run| run.workspace())
            .max()
            .unwrap_or(0)
    }
}

/// The half-type path of one convolution layer; see the module docs.
#[derive(Debug)]
pub struct HalfConvolution {
    half: Half,
    /// Plans by bottom shape; `current` indexes the one of the last reshape.
    plans: Vec<HalfPlan>,
    current: usize,
    /// `(K·C·kh·kw)` the weight as half-type bits, KCRS or KRSC as the layout: written by
    /// forward, read by the data gradient of the same pass.
    weight: CudaSlice<u16>,
    /// `(K·C·kh·kw)` the weight gradient as half-type bits, before it is widened into the FP32
    /// gradient.
    grad: CudaSlice<u16>,
    /// `(K)` the bias as half-type bits (a layer with a bias), written by forward.
    bias: CudaSlice<u16>,
    workspace: CudaSlice<u8>,
    /// The weight gradient's, on the side stream.
    wgrad_workspace: CudaSlice<u8>,
}

impl HalfConvolution {
    pub fn new(gpu: &Gpu, half: Half) -> Result<HalfConvolution> {
        Ok(HalfConvolution {
            half,
            plans: Vec::new(),
            current: 0,
            weight: scratch(gpu, 1)?,
            grad: scratch(gpu, 1)?,
            bias: scratch(gpu, 1)?,
            workspace: scratch(gpu, 1)?,
            wgrad_workspace: scratch(gpu, 1)?,
        })
    }

    /// Takes the plans of the bottom `(N, C, H, W)` into `top`, timing the candidates of a new
    /// shape (synchronises then). An error naming the layer `name` where a direction has no
    /// allowed plan.
    pub fn reshape(
        &mut self,
        gpu: &Gpu,
        name: &str,
        shape: &ConvShape,
        bottom: [usize; 4],
        top: [usize; 4],
    ) -> Result<()> {
        if let Some(i) = self.plans.iter().position(|p| p.bottom == bottom) {
            self.current = i;
            return Ok(());
        }
        let wlen = shape.num_output * bottom[1] * shape.kernel[0] * shape.kernel[1];
        grow(gpu, &mut self.weight, wlen)?;
        grow(gpu, &mut self.grad, wlen)?;
        grow(gpu, &mut self.bias, shape.num_output)?;
        let dnn = gpu.cudnn()?;
        let described = (described(bottom), described(top));
        let candidates = |direction| -> Result<Vec<GraphRun>> {
            let conv = shape.conv(direction, described.0, described.1, self.half);
            let runs = GraphRun::candidates(dnn, &conv, gpu.conv_exact, HALF_CANDIDATES);
            if runs.is_empty() {
                return Err(Error::Device(format!(
                    "layer `{name}` (convolution): cuDNN offers no execution plan for the \
                     {direction:?} convolution of {bottom:?} on {:?} tensors",
                    self.half
                )));
            }
            Ok(runs)
        };
        let fwd = candidates(graph::Direction::Forward)?;
        let dgrad = candidates(graph::Direction::BackwardData)?;
        let wgrad = candidates(graph::Direction::BackwardFilter)?;
        let most = [&fwd, &dgrad, &wgrad]
            .iter()
            .flat_map(|runs| runs.iter())
            .map(GraphRun::workspace)
            .max()
            .unwrap_or(0);
        grow(gpu, &mut self.workspace, most)?;
        // An empty batch has nothing to time; `conv_algorithm = "heuristic"` promises the same
        // choice every run: the heuristics' first allowed plans.
        let plan = if bottom[0] == 0 || gpu.conv_algorithm == ConvAlgorithm::Heuristic {
            let first = |mut runs: Vec<GraphRun>| runs.swap_remove(0);
            HalfPlan {
                bottom,
                fwd: first(fwd),
                dgrad: first(dgrad),
                wgrad: first(wgrad),
            }
        } else {
            let tensors = (bottom, top, shape.bias);
            self.choose(gpu, name, tensors, wlen, [fwd, dgrad, wgrad])?
        };
        // The workspaces were grown for every candidate: keep what the chosen plans of every
        // cached shape need.
        let need = self.plans.iter().chain([&plan]).map(HalfPlan::workspace);
        let need = need.max().unwrap_or(0).max(1);
        for buf in [&mut self.workspace, &mut self.wgrad_workspace] {
            if buf.len() != need {
                *buf = scratch(gpu, need)?;
            }
        }
        self.plans.push(plan);
        self.current = self.plans.len() - 1;
        Ok(())
    }

    /// The cheapest candidate of each direction (see [`fastest`]) for the bottom `(N, C, H, W)`
    /// into `top` (the forward with a bias where `bias`), timed on zeroed tensors.
    fn choose(
        &mut self,
        gpu: &Gpu,
        name: &str,
        (bottom, top, bias): ([usize; 4], [usize; 4], bool),
        wlen: usize,
        [fwd, dgrad, wgrad]: [Vec<GraphRun>; 3],
    ) -> Result<HalfPlan> {
        let s = &gpu.compute;
        let dnn = gpu.cudnn()?;
        let count = |shape: [usize; 4]| shape.iter().product::<usize>();
        let x = scratch::<u16>(gpu, count(bottom))?;
        let y = scratch::<u16>(gpu, count(top))?;
        let w = scratch::<u16>(gpu, wlen)?;
        let b = scratch::<u16>(gpu, top[1])?;
        let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, s);
        let (xp, _gx) = x.device_ptr(s);
        let (yp, _gy) = y.device_ptr(s);
        let (wp, _gw) = w.device_ptr(s);
        let (bp, _gb) = b.device_ptr(s);
        let indices = |runs: &[GraphRun]| (0..runs.len()).collect::<Vec<_>>();
        let pick = |what: &str, runs: Vec<GraphRun>, pointers: &[u64]| -> Result<GraphRun> {
            let best = fastest(gpu, (name, bottom), what, &indices(&runs), |i| {
                // SAFETY: the scratch tensors hold the plan's shapes on this device and the
                // workspace was grown to every candidate's; all outlive the synchronising
                // timing.
                unsafe { runs[i].execute(dnn, pointers, ws, 0.0) }
            })?;
            Ok(runs.into_iter().nth(best).expect("a timed candidate"))
        };
        let forward: &[u64] = match bias {
            true => &[xp, wp, yp, bp],
            false => &[xp, wp, yp],
        };
        let fwd = pick("half-type forward", fwd, forward)?;
        let dgrad = pick("half-type data gradient", dgrad, &[xp, wp, yp])?;
        let wgrad = pick("half-type weight gradient", wgrad, &[xp, wp, yp])?;
        Ok(HalfPlan {
            bottom,
            fwd,
            dgrad,
            wgrad,
        })
    }

    /// `y = conv(x, w) (+ b)` from the weights the layers see, `weight` (rounded FP32, KCRS)
    /// and, where the layer has one, `bias (K)` (rounded FP32).
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        shape: &ConvShape,
        (weight, bias): (&CudaView<'_, f32>, Option<&CudaView<'_, f32>>),
        x: &GpuBlob,
        y: &mut GpuBlob,
    ) -> Result<()> {
        assert_eq!(
            bias.is_some(),
            shape.bias,
            "a bias exactly where the layer has one"
        );
        let plan = &self.plans[self.current];
        if plan.bottom[0] == 0 {
            return Ok(());
        }
        let (s, k) = (&gpu.compute, &gpu.kernels);
        let fp16 = self.half.is_fp16();
        let wlen = weight.len();
        let mut w = self.weight.slice_mut(..wlen);
        match shape.layout {
            Layout::Nchw => k.narrow_half(s, weight, &mut w, fp16, false, wlen)?,
            Layout::Nhwc => {
                let (c, taps) = (plan.bottom[1], shape.kernel[0] * shape.kernel[1]);
                let matrix = (c, taps);
                k.transpose_to_half(s, weight, &mut w, shape.num_output, matrix, fp16)?
            }
        }
        let (xv, mut yv) = (x.half_data(), y.half_data_mut());
        let (xp, _gx) = xv.device_ptr(s);
        let (yp, _gy) = yv.device_ptr_mut(s);
        if let Some(b) = bias {
            let n = b.len();
            k.narrow_half(s, b, &mut self.bias.slice_mut(..n), fp16, false, n)?;
        }
        let (wp, _gw) = self.weight.device_ptr(s);
        let (bp, _gb) = self.bias.device_ptr(s);
        let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, s);
        let pointers: &[u64] = match bias {
            Some(_) => &[xp, wp, yp, bp],
            None => &[xp, wp, yp],
        };
        // SAFETY: x, y, the weight and the bias hold the plan's tensors (the net shaped the
        // blobs for this plan's bottom; the bias has the layer's K), the workspace every chosen
        // plan's; all outlive the enqueued call.
        unsafe { plan.fwd.execute(gpu.cudnn()?, pointers, ws, 0.0) }
    }

    /// `dx (+)=` the data gradient as `grad` says, and the weight gradient, rounded to the half
    /// type, and the bias gradient, written or added (`param_grad`) into `dw` (the FP32 weight
    /// gradient, KCRS, followed by the bias's `(K)` where the layer has one); the parameter
    /// gradients on the side stream where `dx` is wanted, through the layer's `fork`.
    /// `[x, y]`: the bottom and the top.
    pub fn backward(
        &mut self,
        gpu: &Gpu,
        shape: &ConvShape,
        (grad, param_grad): (Grad, Grad),
        fork: &SideFork,
        [x, y]: [&mut GpuBlob; 2],
        dw: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let plan = &self.plans[self.current];
        let s = &gpu.compute;
        if plan.bottom[0] == 0 {
            return super::empty_batch_param_gradient(gpu, param_grad, dw);
        }
        let k = shape.num_output;
        let wlen = dw.len() - if shape.bias { k } else { 0 };
        let (mut dw, mut db) = dw.split_at_mut(wlen);
        let wants_dx = grad.wanted();
        let side = wants_dx.then(|| gpu.side()).transpose()?;
        if let Some(side) = side {
            fork.fork(s, side.stream())?;
        }
        {
            let (dnn, buf) = match side {
                Some(side) => (&side.dnn, &mut self.wgrad_workspace),
                None => (gpu.cudnn()?, &mut self.workspace),
            };
            let ws_stream = dnn.stream();
            let (ws, _gws) = cudnn::Workspace::of(buf, ws_stream);
            {
                let (xv, dyv) = (x.half_data(), y.half_diff());
                let (xp, _gx) = xv.device_ptr(ws_stream);
                let (dyp, _gdy) = dyv.device_ptr(ws_stream);
                let (gp, _gg) = self.grad.device_ptr_mut(ws_stream);
                // SAFETY: as in forward; the side stream waited for dy above, and the compute
                // stream waits for the side stream before this backward returns.
                unsafe { plan.wgrad.execute(dnn, &[xp, gp, dyp], ws, 0.0)? };
            }
            let (kernels, acc) = (&gpu.kernels, param_grad.accumulate());
            let fp16 = self.half.is_fp16();
            let g = self.grad.slice(..wlen);
            match shape.layout {
                Layout::Nchw => kernels.widen_half(ws_stream, &g, &mut dw, fp16, acc, wlen)?,
                Layout::Nhwc => {
                    let (c, taps) = (plan.bottom[1], shape.kernel[0] * shape.kernel[1]);
                    let matrix = (taps, c);
                    kernels.transpose_widen(ws_stream, &g, &mut dw, k, matrix, acc, fp16)?
                }
            }
            if shape.bias {
                let view = shape.layout.channel_view(&y.shape);
                let dy = y.half_diff();
                kernels.channel_reduce_half(ws_stream, &dy, self.half, &mut db, view, acc)?;
            }
        }
        if wants_dx {
            let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, s);
            let (dyv, mut dxv) = (y.half_diff(), x.half_diff_mut());
            let (wp, _gw) = self.weight.device_ptr(s);
            let (dyp, _gdy) = dyv.device_ptr(s);
            let (dxp, _gdx) = dxv.device_ptr_mut(s);
            // SAFETY: as in forward.
            unsafe {
                plan.dgrad
                    .execute(gpu.cudnn()?, &[dxp, wp, dyp], ws, grad.beta())?
            };
        }
        if let Some(side) = side {
            fork.join(side.stream(), s)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{ConvShape, GraphRun, HalfConvolution, HALF_CANDIDATES};
    use crate::config::{ConvAlgorithm, MathMode};
    use crate::cuda::cudnn::{graph, ConvGeometry};
    use crate::cuda::layout::Layout;
    use crate::cuda::test_util::gpu_for_test;
    use crate::precision::Half;

    /// With `conv_algorithm = "heuristic"` each direction runs the heuristics' first allowed
    /// plan, the same engine in every layer built for the shape, as the FP32 path's legacy
    /// calls take cuDNN's first-ranked algorithm.
    #[test]
    fn heuristic_choice_takes_the_first_plans() {
        let name = concat!(module_path!(), "::heuristic_choice_takes_the_first_plans");
        let Some(mut gpu) = gpu_for_test(name, MathMode::Bf16) else {
            return;
        };
        gpu.conv_algorithm = ConvAlgorithm::Heuristic;
        let shape = ConvShape {
            num_output: 32,
            kernel: [3, 3],
            geometry: ConvGeometry {
                pad: [1, 1],
                stride: [1, 1],
                dilation: [1, 1],
                group: 1,
            },
            layout: Layout::Nhwc,
            bias: false,
        };
        let (bottom, top) = ([8, 16, 12, 12], [8, 32, 12, 12]);
        let dnn = gpu.cudnn().unwrap();
        let first = |direction| {
            let conv = shape.conv(direction, bottom, top, Half::Bf16);
            let runs = GraphRun::candidates(dnn, &conv, gpu.conv_exact, HALF_CANDIDATES);
            runs.first().expect("a plan").overwrite.engine
        };
        let want = [
            first(graph::Direction::Forward),
            first(graph::Direction::BackwardData),
            first(graph::Direction::BackwardFilter),
        ];
        for _ in 0..2 {
            let mut conv = HalfConvolution::new(&gpu, Half::Bf16).unwrap();
            conv.reshape(&gpu, "conv", &shape, bottom, top).unwrap();
            let plan = &conv.plans[conv.current];
            let got = [&plan.fwd, &plan.dgrad, &plan.wgrad].map(|run| run.overwrite.engine);
            assert_eq!(got, want);
        }
    }
}
