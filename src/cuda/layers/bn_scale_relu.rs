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
//! Backward, from `dz` and `x` (`y` and the Scale's output `v` recomputed, the same bits as the
//! forward's; `z` is not read): `g = dz · relu'(v)`, the ReLU passing `g` where `v > 0`, which is
//! where `z > 0` (slope ≥ 0); one pass of sums gives
//! the Scale's gradient `dgamma = Σ g·y`, `dbeta = Σ g` and the BatchNorm's sums of
//! `dy = gamma · g` (`Σ dy = gamma · Σ g`, `Σ dy·y = gamma · Σ g·y`), all-reduced when `sync`;
//! a second pass writes `dx`. The BatchNorm state gets a zero gradient, as in the layer itself,
//! written (where the gradient is overwritten) by the sums' last launch.
//!
//! With a residual sum ([`GpuBnScaleRelu::with_sum`]: BatchNorm → Scale → two-bottom Eltwise SUM
//! → ReLU, the end of a residual block) the layer has two bottoms, `x` and the sum's other
//! bottom, the shortcut `r` (both `(N, C, ...)`), and its top is the ReLU's: the forward writes
//! `z = relu(c0 · b0 + c1 · b1)` over the sum's bottoms in one pass, never storing the Scale's
//! output or the sum. Backward: the sum's backward gives the shortcut `c_r · g` and the Scale's
//! output `c_v · g`, `g = dz · relu'(z)`. Where those are the same value (equal coefficients, the
//! shortcut's gradient overwritten: a residual block's join), the chain's sums pass runs it,
//! reading `z` and `dz` and writing `c_v · g` as the shortcut's gradient, which the second pass
//! reads back; else a pass of its own writes the shortcut's gradient and the chain's into a
//! scratch tensor, and the chain's backward above reads that.
//!
//! Mixed precision (built with a [`Half`]): the kernels round what the three layers' CPU versions
//! round — `x` and `dz` as they read them (the net leaves a top or a gradient that only such
//! layers read unrounded, [`GpuLayer::rounds_on_load`]), the normalised `y`, the Scale's output,
//! the leaky part of `z`, the gradients the ReLU and the Scale pass down, and `dx` — so the
//! chain computes their numbers and the net rounds nothing after it
//! ([`GpuLayer::rounds_itself`]). The BatchNorm's sums are then those of the
//! rounded `gamma · g`, which are not `gamma` times the Scale's: two more sums in the same pass,
//! taken only where the BatchNorm's backward needs them (batch statistics, a wanted `dx`).
//!
//! On half-type blobs ([`GpuBnScaleRelu::on_half_blobs`]: `x` and `z` stored as
//! [`Elem::Half`](crate::cuda::blob::Elem::Half), values and gradients) the same kernels' half-type
//! twins read `x` and `dz` as bit patterns, widened (values of the half type, which their
//! rounding leaves as they are), and write `z` and `dx` as the bit patterns of what they round —
//! `dx` after the addition to what it held, in FP32 — so that the layer computes the numbers of
//! the same layer on FP32 blobs, with half the activation traffic. The statistics, the sums and
//! the Scale's parameter gradient stay FP32 (doubles for the sums), as there.

use super::batch_norm::GpuBatchNorm;
use super::{eltwise_relu, BackwardPass, BlobElem, ForwardPass, GpuLayer, Grad, StatePass};
use crate::config::layer_params::LayerParams;
use crate::cuda::blob::GpuBlob;
use crate::cuda::kernels::{BnScaleRelu, ChainGrad, ChainSums, ResidualSum};
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
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

/// Whether the layers `chain` (a BatchNorm, a Scale, an Eltwise, a ReLU, in net order) compute
/// what one [`GpuBnScaleRelu`] with a residual sum does: the BatchNorm and the Scale
/// [`fusable`], the Eltwise and the ReLU [`eltwise_relu::fusable`], and the Scale's top one of
/// the sum's bottoms. The net checks the wiring (single consumers, same phases).
pub fn fusable_with_sum(chain: &[NodeView]) -> bool {
    match chain {
        [bn, scale, sum, relu] => {
            fusable(&[*bn, *scale])
                && eltwise_relu::fusable(&[*sum, *relu])
                && scale.tops.len() == 1
                && sum.bottoms.contains(&scale.tops[0])
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
    sum: Option<ResidualSum>,
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
        sum: shape.sum,
        dims: shape.dims,
        half: shape.half,
    }
}

/// The fused chain; see the module docs.
pub struct GpuBnScaleRelu {
    bn: GpuBatchNorm,
    bias_term: bool,
    relu: Option<f32>,
    /// The residual sum and ReLU the chain ends in (then `relu` is `None`).
    sum: Option<ResidualSum>,
    /// The gradient reaching the Scale's output where the chain has a sum and cannot read it
    /// off the shortcut's (allocated on first need, stored as the blobs).
    dz: Option<GpuBlob>,
    /// Offset of the Scale's parameters in the layer's view.
    scale_offset: usize,
    /// The half type of mixed precision, whose rounding the kernels apply.
    half: Option<Half>,
    /// Whether `x` and `z` are stored in the half type.
    half_blobs: bool,
}

impl GpuBnScaleRelu {
    /// The same layer on half-type blobs (its bottom and top stored as
    /// [`Elem::Half`](crate::cuda::blob::Elem::Half)) where `yes`; needs a half type.
    pub fn on_half_blobs(mut self, yes: bool) -> Self {
        assert!(
            !yes || self.half.is_some(),
            "a BatchNorm chain on half-type blobs needs the half type"
        );
        self.half_blobs = yes;
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
            sum: None,
            dz: None,
            scale_offset,
            half,
            half_blobs: false,
        })
    }

    /// The layers `chain` (checked by [`fusable_with_sum`]): the chain of [`Self::new`] ending
    /// in the residual sum and its ReLU; its bottoms are the BatchNorm's and the sum's other one.
    pub fn with_sum(
        gpu: &Gpu,
        chain: &[NodeView],
        scale_offset: usize,
        layout: Layout,
        half: Option<Half>,
    ) -> Result<Self> {
        assert!(
            fusable_with_sum(chain),
            "not a fusable BatchNorm → Scale → Eltwise SUM → ReLU chain"
        );
        let (LayerParams::Eltwise(sum), LayerParams::Relu(relu)) =
            (chain[2].params, chain[3].params)
        else {
            unreachable!("fusable_with_sum checked the sum and its ReLU");
        };
        let coeff = sum.coeff.as_deref().unwrap_or(&[1.0, 1.0]);
        let mut layer = Self::new(gpu, &chain[..2], scale_offset, layout, half)?;
        layer.sum = Some(ResidualSum {
            coeff: [coeff[0], coeff[1]],
            shortcut_first: chain[2].bottoms[1] == chain[1].tops[0],
            slope: relu.negative_slope,
        });
        Ok(layer)
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
            sum: self.sum,
            half: self.half,
        }
    }

    /// Floats of the BatchNorm's state at the start of the view.
    fn state_len(&self) -> usize {
        2 * self.bn.dims().1 + 1
    }
}

impl GpuBnScaleRelu {
    /// Forward on blobs stored as `T`.
    fn forward_as<T: BlobElem>(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, params) = (pass.gpu, &pass.params);
        let state = params.slice(..self.state_len());
        let (x, shortcut, z) = match self.sum {
            Some(_) => {
                let [x, r, z] = pass.blobs.two_bottoms_top();
                (x, Some(r), z)
            }
            None => {
                let [x, z] = pass.blobs.bottom_top();
                (x, None, z)
            }
        };
        self.bn
            .statistics::<T>(gpu, pass.ctx, x, &state, self.half)?;
        let op = self.operands(self.bn.mean_and_inv_std(), params);
        let shortcut = shortcut.map(|r| T::data(r));
        let mut z = T::data_mut(z);
        gpu.kernels
            .bn_scale_relu_forward(&gpu.compute, &op, &T::data(x), shortcut.as_ref(), &mut z)
    }

    /// Whether the chain with a residual `sum` reads the gradient reaching the Scale's output
    /// off the shortcut's, whose gradient is written as `shortcut`: the same values where the
    /// sum's backward overwrites it with the same coefficient (not 0, which leaves the chain no
    /// gradient to form in its sums pass).
    fn reads_dz_off_shortcut(sum: ResidualSum, shortcut: Grad) -> bool {
        let (c_shortcut, c_chain) = sum.coeff_of_shortcut_and_chain();
        shortcut == Grad::Overwrite && c_shortcut == c_chain && c_chain != 0.0
    }

    /// The residual sum's backward on blobs stored as `T`, in a pass of its own where the chain
    /// cannot read the gradient reaching the Scale's output off the shortcut's
    /// ([`Self::reads_dz_off_shortcut`]): the shortcut's gradient as `shortcut` says, and the
    /// chain's into the scratch [`Self::dz`].
    fn sum_backward_as<T: BlobElem>(
        &mut self,
        pass: &mut BackwardPass<'_>,
        sum: ResidualSum,
        shortcut: Grad,
    ) -> Result<()> {
        let gpu = pass.gpu;
        let [r, z] = pass.blobs.pick([pass.blobs.bottoms[1], pass.blobs.tops[0]]);
        let n = z.count();
        if self.dz.as_ref().is_none_or(|d| d.shape != z.shape) {
            self.dz = Some(GpuBlob::new_as(gpu, &z.shape, 0, z.elem())?);
        }
        let dz = self.dz.as_mut().expect("allocated above");
        let (mut dr, mut dz) = (T::diff_mut(r), T::diff_mut(dz));
        let to_shortcut = shortcut.wanted().then(|| (&mut dr, shortcut.accumulate()));
        let to_chain = Some((&mut dz, false));
        let dx = match sum.shortcut_first {
            true => [to_shortcut, to_chain],
            false => [to_chain, to_shortcut],
        };
        gpu.kernels.sum2_relu_backward(
            &gpu.compute,
            sum.coeff,
            sum.slope,
            &T::data(z),
            &T::diff(z),
            dx,
            n,
            self.half,
        )
    }

    /// Backward on blobs stored as `T`.
    fn backward_as<T: BlobElem>(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad) = (pass.gpu, pass.grads[0]);
        // With a residual sum: whether the sums pass runs the sum's backward, writing the
        // gradient reaching the Scale's output as the shortcut's; else a pass of its own writes
        // the shortcut's and, into scratch, the chain's.
        let sum_in_sums = match self.sum {
            Some(sum) if Self::reads_dz_off_shortcut(sum, pass.grads[1]) => Some(sum),
            Some(sum) => {
                let shortcut = pass.grads[1];
                self.sum_backward_as::<T>(&mut pass, sum, shortcut)?;
                None
            }
            None => None,
        };
        let params = &pass.params;
        let (param_grad, param_diff) = (pass.param_grad, &mut pass.param_diff);
        let s = &gpu.compute;
        let state_len = self.state_len();
        let c = self.bn.dims().1;
        let at = self.scale_offset;
        let scale_len = c * (1 + self.bias_term as usize);
        // The state's gradient, zero (overwritten in the sums' last launch), before the Scale's.
        let (mut state_diff, mut after_state) = param_diff.split_at_mut(state_len);
        let zero_state = (param_grad == Grad::Overwrite).then_some(&mut state_diff);
        let mut scale_diff = after_state.slice_mut(at - state_len..at - state_len + scale_len);
        let batch_stats = self.bn.batch_stats();
        // The chain's bottom; the blob whose diff holds the gradient reaching the Scale's output
        // (or the ReLU's, the chain's top without a sum) once the sums pass is done; with the sum
        // in the sums pass, the chain's top.
        let (x, dz_blob, top) = match self.sum {
            None => {
                let [x, z] = pass.blobs.bottom_top();
                (x, z, None)
            }
            Some(_) => {
                let [x, r, z] = pass.blobs.two_bottoms_top();
                (x, r, Some(z))
            }
        };
        let shape = self.shape();
        let dz_blob: &mut GpuBlob = match (&mut self.dz, sum_in_sums) {
            (Some(scratch), None) if shape.sum.is_some() => scratch,
            _ => dz_blob,
        };
        // The sums land in the BatchNorm's buffer, which its all-reduce then sums.
        let bn_sums_needed = batch_stats && grad.wanted();
        let which = match (self.half, bn_sums_needed) {
            (None, _) => ChainSums::Both,
            (Some(_), false) => ChainSums::Scale,
            (Some(_), true) => ChainSums::Separate,
        };
        {
            let dz = match (sum_in_sums, &top) {
                (Some(sum), Some(z)) => ChainGrad::FromSum {
                    y: T::data(z),
                    dy: T::diff(z),
                    dz_out: T::diff_mut(dz_blob),
                    coeff: sum.coeff_of_shortcut_and_chain().1,
                    slope: sum.slope,
                },
                _ => ChainGrad::Stored(T::diff(dz_blob)),
            };
            let (mean, inv_std, sums) = self.bn.stats_and_sums_mut();
            let op = operands(shape, (mean, inv_std), params);
            gpu.kernels.bn_scale_relu_sums(
                s,
                &op,
                dz,
                &T::data(x),
                sums,
                (&mut scale_diff, param_grad.accumulate()),
                zero_state,
                which,
            )?;
        }
        if !grad.wanted() {
            return Ok(());
        }
        if batch_stats {
            self.bn.reduce(gpu, pass.ctx)?;
        }
        let op = operands(shape, self.bn.mean_and_inv_std(), params);
        let (xd, mut dx) = T::data_and_diff_mut(x);
        gpu.kernels.bn_scale_relu_backward(
            s,
            &op,
            &T::diff(dz_blob),
            &xd,
            self.bn.sums(),
            batch_stats,
            &mut dx,
            grad.accumulate(),
        )
    }
}

impl GpuLayer for GpuBnScaleRelu {
    fn type_name(&self) -> &'static str {
        "batch_norm+scale+relu"
    }

    /// One bottom, or with a residual sum two of one shape.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        match (self.sum, bottoms) {
            (None, _) => self.bn.reshape(gpu, bottoms),
            (Some(_), [x, r]) if x == r => self.bn.reshape(gpu, &bottoms[..1]),
            (Some(_), _) => Err(Error::net(
                self.bn.name(),
                format!("with its residual sum takes 2 bottoms of one shape, got {bottoms:?}"),
            )),
        }
    }

    fn rounds_itself(&self) -> bool {
        self.half.is_some()
    }

    fn rounds_on_load(&self) -> bool {
        self.half.is_some()
    }

    fn forward(&mut self, pass: ForwardPass<'_>) -> Result<()> {
        if self.half_blobs {
            self.forward_as::<u16>(pass)
        } else {
            self.forward_as::<f32>(pass)
        }
    }

    fn update_state(&mut self, mut pass: StatePass<'_>) -> Result<()> {
        let params = pass.params.slice_mut(..self.state_len());
        let (gpu, ctx) = (pass.gpu, pass.ctx);
        self.bn.update_state(StatePass { gpu, ctx, params })
    }

    fn backward(&mut self, pass: BackwardPass<'_>) -> Result<()> {
        if self.half_blobs {
            self.backward_as::<u16>(pass)
        } else {
            self.backward_as::<f32>(pass)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GpuBnScaleRelu;
    use crate::config::Phase;
    use crate::cuda::kernels::launched;
    use crate::cuda::layers::testing::{half_blobs_match_fp32_blobs, net_of, HalfBlobsCase};
    use crate::cuda::layers::{GpuLayer, Grad};
    use crate::cuda::layout::Layout;
    use crate::cuda::test_util::gpu_or_skip;
    use crate::cuda::Gpu;
    use crate::layers::gradient_check::uniform_blob;
    use crate::precision::Half;

    /// A BatchNorm → Scale (→ ReLU of `relu`'s slope) chain on records of `record`, its Scale
    /// with a bias where `beta`: the graph's nodes, the Scale's offset in the chain's view of the
    /// parameters and random parameters for that view (a positive variance and factor, the
    /// Scale's rounded to `half`, zero in any gap between the two layers' tensors).
    fn chain(
        record: [usize; 3],
        relu: Option<f32>,
        beta: bool,
        half: Half,
        seed: u64,
    ) -> (crate::net::Net, usize, Vec<f32>) {
        let relu = relu.map_or(String::new(), |slope| {
            format!(
                "[[layer]]\nname = \"relu\"\ntype = \"relu\"\nbottom = [\"bn\"]\ntop = [\"bn\"]\n\
                 negative_slope = {slope:?}\n\n"
            )
        });
        let layers = format!(
            "[[layer]]\nname = \"bn\"\ntype = \"batch_norm\"\nbottom = [\"data\"]\ntop = [\"bn\"]\n\n\
             [[layer]]\nname = \"scale\"\ntype = \"scale\"\nbottom = [\"bn\"]\ntop = [\"bn\"]\n\
             bias_term = {beta}\n\n{relu}\
             [[layer]]\nname = \"ip\"\ntype = \"inner_product\"\nbottom = [\"bn\"]\ntop = [\"ip\"]\n\
             num_output = 10\n\n\
             [[layer]]\nname = \"loss\"\ntype = \"softmax_with_loss\"\nbottom = [\"ip\", \"label\"]\n\
             top = [\"loss\"]\n"
        );
        let (graph, spans) = net_of(&layers, record);
        let of = |layer: usize| spans.iter().filter(move |s| s.layer == layer);
        let start = of(0).next().unwrap().offset;
        let end = of(1).next_back().unwrap().range().end;
        let mut params = vec![0.0; end - start];
        let c = record[0];
        let mut fill = |span: &crate::params::ParamSpan, lo: f32, hi: f32, round: bool| {
            let mut v = uniform_blob(&[span.len], lo, hi, seed + span.offset as u64).data;
            if round {
                half.round_slice(&mut v);
            }
            params[span.offset - start..][..span.len].copy_from_slice(&v);
        };
        for (i, span) in of(0).enumerate() {
            // [mean (C), variance (C), factor (1)]
            let (lo, hi) = if i == 0 { (-0.5, 0.5) } else { (0.5, 2.0) };
            assert_eq!(span.len, if i < 2 { c } else { 1 }, "{}", span.full_name);
            fill(span, lo, hi, false);
        }
        for span in of(1) {
            fill(span, -1.5, 1.5, true);
        }
        let scale_offset = of(1).next().unwrap().offset - start;
        (graph, scale_offset, params)
    }

    /// Runs without a GPU: the chain reads the gradient reaching its Scale's output off the
    /// shortcut's only where the sum's backward writes the same value there — overwritten, with
    /// the chain's own coefficient, which is not 0 — whichever bottom of the sum the shortcut is.
    #[test]
    fn the_chain_reads_its_gradient_off_the_shortcut_only_where_it_is_the_same() {
        use crate::cuda::kernels::ResidualSum;
        let sum = |coeff: [f32; 2], shortcut_first: bool| ResidualSum {
            coeff,
            shortcut_first,
            slope: 0.0,
        };
        let reads = GpuBnScaleRelu::reads_dz_off_shortcut;
        for first in [true, false] {
            assert!(reads(sum([1.0, 1.0], first), Grad::Overwrite));
            assert!(reads(sum([0.5, 0.5], first), Grad::Overwrite));
            assert!(!reads(sum([1.0, 1.0], first), Grad::Accumulate));
            assert!(!reads(sum([1.0, 1.0], first), Grad::Skip));
            assert!(!reads(sum([1.0, 0.5], first), Grad::Overwrite));
            assert!(!reads(sum([0.0, 0.0], first), Grad::Overwrite));
        }
    }

    /// The BatchNorm state's part of the chain's parameter gradient: zero where the chain
    /// overwrites the gradient (written in the sums' last launch over whatever was there, here
    /// NaN), untouched where it adds to it; the Scale's part written either way. FP32 and
    /// bf16, both layouts (the `_h8` sums where the half-type blobs are channels-last).
    #[test]
    fn the_state_gradient_is_zero_where_the_chain_overwrites() {
        use crate::cuda::blob::GpuBlob;
        use crate::cuda::layers::testing::Fixture;
        use crate::cuda::layers::GpuCtx;
        let gpu = gpu_or_skip!("the_state_gradient_is_zero_where_the_chain_overwrites");
        let (c, shape) = (16, [4, 16, 3, 3]);
        let (graph, scale_offset, params) = chain([c, 3, 3], Some(0.0), true, Half::Bf16, 77);
        let nodes: Vec<_> = (0..=2).map(|i| graph.node(i)).collect();
        let ctx = GpuCtx::local(Phase::Train, 0, 1, 0);
        let mut x = uniform_blob(&shape, -2.0, 2.0, 78);
        x.diff = uniform_blob(&shape, -1.0, 1.0, 79).data;
        Half::Bf16.round_slice(&mut x.data);
        Half::Bf16.round_slice(&mut x.diff);
        for (half, layout) in [
            (None, Layout::Nchw),
            (Some(Half::Bf16), Layout::Nchw),
            (Some(Half::Bf16), Layout::Nhwc),
        ] {
            for (param_grad, before, want) in [
                (Grad::Overwrite, f32::NAN, 0.0f32),
                (Grad::Accumulate, 0.25, 0.25),
            ] {
                let what = format!("{half:?}, {layout:?}, {param_grad:?}");
                let mut layer = GpuBnScaleRelu::new(&gpu, &nodes, scale_offset, layout, half)
                    .unwrap()
                    .on_half_blobs(half.is_some());
                layer.reshape(&gpu, &[&shape]).unwrap();
                let elem = half.map_or(crate::cuda::blob::Elem::F32, crate::cuda::blob::Elem::Half);
                let blobs = [&x, &x].map(|b| GpuBlob::from_host_as(&gpu, b, elem).unwrap());
                let diff = vec![before; params.len()];
                let mut run = Fixture::new(&gpu, blobs.into(), 1, &params, &diff);
                run.forward(&gpu, &ctx, &mut layer);
                run.backward((&gpu, &ctx), &mut layer, &[Grad::Overwrite], param_grad);
                let got = run.param_diff(&gpu);
                let state = &got[..2 * c + 1];
                let kept = state.iter().position(|v| v.to_bits() != want.to_bits());
                assert_eq!(kept, None, "{what}: state gradient {state:?}");
                let scale = &got[scale_offset..scale_offset + 2 * c];
                assert!(scale.iter().all(|v| v.is_finite()), "{what}: {scale:?}");
            }
        }
    }

    /// One chain on FP32 blobs and on half-type blobs: the same bits.
    #[allow(clippy::too_many_arguments)]
    fn check(
        gpu: &Gpu,
        shape: [usize; 4],
        relu: Option<f32>,
        beta: bool,
        phase: Phase,
        layout: Layout,
        half: Half,
        seed: u64,
    ) {
        let [_, c, h, w] = shape;
        let (graph, scale_offset, params) = chain([c, h, w], relu, beta, half, seed);
        let last = if relu.is_some() { 2 } else { 1 };
        let nodes: Vec<_> = (0..=last).map(|i| graph.node(i)).collect();
        let case = HalfBlobsCase {
            what: format!("{shape:?}, relu {relu:?}, beta {beta}, {phase:?}, {layout:?}, {half:?}"),
            half,
            phase,
            bottoms: vec![shape.to_vec()],
            tops: vec![shape.to_vec()],
            params,
            backward: vec![
                (vec![Grad::Accumulate], Grad::Accumulate),
                (vec![Grad::Overwrite], Grad::Overwrite),
                (vec![Grad::Skip], Grad::Accumulate),
            ],
            seed,
        };
        launched::take();
        half_blobs_match_fp32_blobs(gpu, &case, |half_blobs| {
            let layer = GpuBnScaleRelu::new(gpu, &nodes, scale_offset, layout, Some(half))
                .unwrap()
                .on_half_blobs(half_blobs);
            let mut layer: Box<dyn GpuLayer> = Box::new(layer);
            layer.reshape(gpu, &[&shape]).unwrap();
            layer
        });
        // The half-type blobs take the `_h8` kernels exactly where they can (the FP32 blobs
        // never): the statistics' sums only with batch statistics.
        let launched = launched::take();
        let by_eight = layout == Layout::Nhwc && c % 8 == 0;
        let statistics = (phase == Phase::Train).then_some("bn_sums_h8");
        let chain = [
            "bn_scale_relu_forward_h8",
            "bn_scale_relu_sums_h8",
            "bn_scale_relu_backward_h8",
        ];
        for kernel in chain.into_iter().chain(statistics) {
            assert_eq!(
                launched.contains(kernel),
                by_eight,
                "{kernel} launched for {}",
                case.what
            );
        }
        if !by_eight {
            assert!(!launched.contains("bn_sums_h8"), "{}", case.what);
        }
    }

    /// On half-type blobs the chain computes, bit for bit, what it computes on FP32 blobs in
    /// mixed precision from the same half-type values: forward, the bottom gradient
    /// (accumulated and overwritten) and the Scale's gradient; with batch statistics (train) and
    /// global ones (test), with and without a ReLU (leaky too) and the Scale's bias, in both
    /// layouts (channels-last takes the sums' tiled grid, and with a multiple of 8 channels the
    /// `_h8` kernels, several channels a thread) and both half types; and on tensors beyond four
    /// waves of threads, where the elementwise kernels take their loads four at a time and the
    /// `_h8` sums several rows at a time, or beyond 32, where each thread of the `_h8`
    /// elementwise kernels meets several groups of eight, of the same channels or not.
    #[test]
    fn half_blobs_match_rounded_fp32_blobs() {
        let gpu = gpu_or_skip!("half_blobs_match_rounded_fp32_blobs");
        let mut seed = 2100;
        for half in [Half::Bf16, Half::Fp16] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                for phase in [Phase::Train, Phase::Test] {
                    for relu in [None, Some(0.0), Some(0.1)] {
                        for beta in [true, false] {
                            // Channels-last with a multiple of 8 channels takes the `_h8`
                            // kernels: 24 channels, one tile of their sums' grids; 264, two
                            // tiles of the statistics' (eight channels a thread) and three of
                            // the backward sums' (four).
                            for shape in [[3, 5, 6, 7], [3, 24, 5, 3], [2, 264, 3, 2]] {
                                seed += 10;
                                check(&gpu, shape, relu, beta, phase, layout, half, seed);
                            }
                        }
                    }
                }
            }
        }
        let wave = gpu.kernels.wave_threads();
        let n = 4 * wave / (8 * 16 * 16) + 1;
        // The `_h8` elementwise kernels take eight elements a thread, the forward four groups of
        // them at a time: beyond 32 waves a thread meets several groups, of the same channels
        // where C divides a wave's 8 · wave_threads elements, and of changing channels (its
        // per-channel operands reloaded) where it does not.
        let uneven = (16..).step_by(8).find(|c| (8 * wave) % c != 0).unwrap();
        let groups = |c: usize| 32 * wave / (c * 8 * 8) + 1;
        for half in [Half::Bf16, Half::Fp16] {
            for (shape, layout) in [
                ([n, 8, 16, 16], Layout::Nchw),
                ([groups(64), 64, 8, 8], Layout::Nhwc),
                ([groups(uneven), uneven, 8, 8], Layout::Nhwc),
            ] {
                check(
                    &gpu,
                    shape,
                    Some(0.0),
                    true,
                    Phase::Train,
                    layout,
                    half,
                    2900,
                );
            }
        }
    }
}
