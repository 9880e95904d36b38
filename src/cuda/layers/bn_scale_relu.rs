//! `GpuBnScaleRelu`: a BatchNorm, the per-channel Scale that follows it and, optionally, the ReLU
//! after that, run as one layer on the GPU (the conv → BatchNorm → Scale → ReLU pattern of
//! ResNets). The net fuses such a chain when nothing else reads the intermediate blobs (see
//! [`fusable`]); the result is that of the three layers, with about half their memory traffic.
//!
//! Shapes: bottom `x (N, C, ...)`, top `z` of the same shape (the chain's last top). Parameters:
//! one view over the BatchNorm's state `[mean (C), variance (C), factor (1)]` and, at
//! `scale_offset`, the Scale's `[gamma (C), beta (C) when bias_term]`.
//!
//! Forward: the BatchNorm statistics (batch or running, all-reduced when `sync`, exactly as
//! [`GpuBatchNorm`]), then one kernel `z = relu(gamma · (x − mean) · inv_std + beta)`; the
//! normalised `y` and the Scale's output are never stored.
//!
//! Backward, from `dz`, `z` and `x` (y recomputed): `g = dz · relu'(z)`; one pass of sums gives
//! the Scale's gradient `dgamma = Σ g·y`, `dbeta = Σ g` and the BatchNorm's sums of
//! `dy = gamma · g` (`Σ dy = gamma · Σ g`, `Σ dy·y = gamma · Σ g·y`), all-reduced when `sync`;
//! a second pass writes `dx`. The BatchNorm state gets a zero gradient, as in the layer itself.
//!
//! Mixed precision (built with a [`Half`]): the kernels round what the three layers' CPU versions
//! round — `x` and `dz` as they read them (the net leaves a top or a gradient that only such
//! layers read unrounded, [`GpuLayer::rounds_on_load`]), the normalised `y`, the Scale's output,
//! the leaky part of `z`, the gradients the ReLU and the Scale pass down, and `dx` — so the
//! chain computes their numbers and the net rounds nothing after it
//! ([`GpuLayer::rounds_itself`]). The BatchNorm's sums are then those of the
//! rounded `gamma · g`, which are not `gamma` times the Scale's: two more sums in the same pass,
//! taken only where the BatchNorm's backward needs them (batch statistics, a wanted `dx`).

use super::batch_norm::GpuBatchNorm;
use super::{BackwardPass, ForwardPass, GpuLayer, Grad, StatePass};
use crate::config::layer_params::LayerParams;
use crate::cuda::kernels::{BnScaleRelu, ChainSums};
use crate::cuda::layout::Layout;
use crate::cuda::{gpu_error, Gpu};
use crate::error::Result;
use crate::net::NodeView;
use crate::precision::Half;
use cudarc::driver::{CudaSlice, CudaView};

/// Whether the layers `chain` (a BatchNorm, a Scale, optionally a ReLU, in net order, each
/// reading the previous one's top) compute what one [`GpuBnScaleRelu`] does: a Scale with one
/// bottom and one factor per channel (`axis = 1`, `num_axes = 1`), a ReLU with a slope ≥ 0.
/// The net checks the wiring (single consumers, same phases).
pub fn fusable(chain: &[NodeView]) -> bool {
    match chain {
        [bn, scale, rest @ ..] if rest.len() <= 1 => {
            matches!(bn.params, LayerParams::BatchNorm(_))
                && scale.bottoms.len() == 1
                && matches!(scale.params, LayerParams::Scale(s) if s.axis == 1 && s.num_axes == 1)
                && rest.iter().all(
                    |relu| matches!(relu.params, LayerParams::Relu(r) if r.negative_slope >= 0.0),
                )
        }
        _ => false,
    }
}

/// What the kernels' operands depend on besides the buffers.
#[derive(Clone, Copy)]
struct Shape {
    dims: (usize, usize, usize),
    scale_offset: usize,
    bias_term: bool,
    relu: Option<f32>,
    half: Option<Half>,
}

fn operands<'a>(
    shape: Shape,
    (mean, inv_std): (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    params: &'a CudaView<'a, f32>,
) -> BnScaleRelu<'a> {
    let c = shape.dims.1;
    let at = shape.scale_offset;
    BnScaleRelu {
        mean,
        inv_std,
        gamma: params.slice(at..at + c),
        beta: shape.bias_term.then(|| params.slice(at + c..at + 2 * c)),
        relu: shape.relu,
        dims: shape.dims,
        half: shape.half,
    }
}

/// The fused chain; see the module docs.
pub struct GpuBnScaleRelu {
    bn: GpuBatchNorm,
    bias_term: bool,
    relu: Option<f32>,
    /// Offset of the Scale's parameters in the layer's view.
    scale_offset: usize,
    /// The half type of mixed precision, whose rounding the kernels apply.
    half: Option<Half>,
}

impl GpuBnScaleRelu {
    /// The same layer on half-type blobs (its bottoms and top stored as
    /// [`Elem::Half`](crate::cuda::blob::Elem::Half)) where `yes`; needs a half type.
    pub fn on_half_blobs(self, yes: bool) -> Self {
        assert!(!yes, "on half-type blobs: not yet");
        self
    }

    /// The layers `chain` (checked by [`fusable`]), whose Scale's parameters start
    /// `scale_offset` floats after the BatchNorm's in the flat buffers, rounding to `half` in
    /// mixed precision.
    pub fn new(
        gpu: &Gpu,
        chain: &[NodeView],
        scale_offset: usize,
        layout: Layout,
        half: Option<Half>,
    ) -> Result<Self> {
        let (LayerParams::BatchNorm(bn), LayerParams::Scale(scale)) =
            (chain[0].params, chain[1].params)
        else {
            panic!("not a fusable BatchNorm → Scale → ReLU chain");
        };
        assert!(
            fusable(chain),
            "not a fusable BatchNorm → Scale → ReLU chain"
        );
        Ok(GpuBnScaleRelu {
            bn: GpuBatchNorm::new(gpu, chain[0].name, bn, layout)?,
            bias_term: scale.bias_term,
            relu: chain.get(2).map(|relu| match relu.params {
                LayerParams::Relu(r) => r.negative_slope,
                _ => unreachable!("fusable checked the ReLU"),
            }),
            scale_offset,
            half,
        })
    }

    /// The kernels' operands: the statistics `mean` and `inv_std` of the last forward and the
    /// Scale's parameters in `params`.
    fn operands<'a>(
        &self,
        (mean, inv_std): (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
        params: &'a CudaView<'a, f32>,
    ) -> BnScaleRelu<'a> {
        operands(self.shape(), (mean, inv_std), params)
    }

    fn shape(&self) -> Shape {
        Shape {
            dims: self.bn.dims(),
            scale_offset: self.scale_offset,
            bias_term: self.bias_term,
            relu: self.relu,
            half: self.half,
        }
    }

    /// Floats of the BatchNorm's state at the start of the view.
    fn state_len(&self) -> usize {
        2 * self.bn.dims().1 + 1
    }
}

impl GpuLayer for GpuBnScaleRelu {
    fn type_name(&self) -> &'static str {
        "batch_norm+scale+relu"
    }

    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        self.bn.reshape(gpu, bottoms)
    }

    fn rounds_itself(&self) -> bool {
        self.half.is_some()
    }

    fn rounds_on_load(&self) -> bool {
        self.half.is_some()
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, params) = (pass.gpu, &pass.params);
        let [x, z] = pass.blobs.bottom_top();
        let state = params.slice(..self.state_len());
        self.bn.statistics(gpu, pass.ctx, x, &state, self.half)?;
        let op = self.operands(self.bn.mean_and_inv_std(), params);
        gpu.kernels
            .bn_scale_relu_forward(&gpu.compute, &op, &x.data(), &mut z.data_mut())
    }

    fn update_state(&mut self, mut pass: StatePass<'_>) -> Result<()> {
        let params = pass.params.slice_mut(..self.state_len());
        let (gpu, ctx) = (pass.gpu, pass.ctx);
        self.bn.update_state(StatePass { gpu, ctx, params })
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad, params) = (pass.gpu, pass.grads[0], &pass.params);
        let (param_grad, param_diff) = (pass.param_grad, &mut pass.param_diff);
        let s = &gpu.compute;
        let state_len = self.state_len();
        if param_grad == Grad::Overwrite {
            s.memset_zeros(&mut param_diff.slice_mut(..state_len))
                .map_err(|e| gpu_error("zero the batch-norm state gradient", e))?;
        }
        let c = self.bn.dims().1;
        let at = self.scale_offset;
        let scale_len = c * (1 + self.bias_term as usize);
        let batch_stats = self.bn.batch_stats();
        let [x, z] = pass.blobs.bottom_top();
        // The sums land in the BatchNorm's buffer, which its all-reduce then sums.
        let shape = self.shape();
        let bn_sums_needed = batch_stats && grad.wanted();
        let which = match (self.half, bn_sums_needed) {
            (None, _) => ChainSums::Both,
            (Some(_), false) => ChainSums::Scale,
            (Some(_), true) => ChainSums::Separate,
        };
        {
            let (mean, inv_std, sums) = self.bn.stats_and_sums_mut();
            let op = operands(shape, (mean, inv_std), params);
            gpu.kernels.bn_scale_relu_sums(
                s,
                &op,
                &z.diff(),
                &z.data(),
                &x.data(),
                sums,
                &mut param_diff.slice_mut(at..at + scale_len),
                param_grad.accumulate(),
                which,
            )?;
        }
        if !grad.wanted() {
            return Ok(());
        }
        if batch_stats {
            self.bn.reduce(gpu, pass.ctx)?;
        }
        let op = self.operands(self.bn.mean_and_inv_std(), params);
        gpu.kernels.bn_scale_relu_backward(
            s,
            &op,
            &z.diff(),
            &z.data(),
            &x.data,
            self.bn.sums(),
            batch_stats,
            &mut x.diff,
            grad.accumulate(),
        )
    }
}
