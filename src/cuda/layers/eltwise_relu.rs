//! `GpuEltwiseRelu`: an Eltwise SUM of two bottoms and the ReLU after it, run as one layer on the
//! GPU (the join of a residual block: `relu(shortcut + branch)`). The net fuses such a pair when
//! nothing else reads the sum (see [`fusable`]); the result is that of the two layers with less
//! than half their memory traffic: the forward reads both bottoms and writes the top once, the
//! backward reads the top's data and gradient once and writes both bottoms' gradients.
//!
//! Shapes: bottoms `x0`, `x1` and top `y`, all of one shape. Forward
//! `y = relu(c0 · x0 + c1 · x1)`; backward `dx_k (+)= c_k · dy · relu'(y)`. No parameters.
//!
//! Mixed precision: the kernels round `y` and each `dx_k` as the CPU rounds the ReLU's top and the
//! sum's bottom gradients (the net fuses the pair then only where the ReLU has slope 0), so the
//! net rounds nothing after it ([`GpuLayer::rounds_itself`]), and they round `x_k` and `dy` as
//! they read them ([`GpuLayer::rounds_on_load`]).
//!
//! On half-type blobs ([`GpuEltwiseRelu::on_half_blobs`]: both bottoms and the top stored as
//! [`Elem::Half`](crate::cuda::blob::Elem::Half), values and gradients) the kernels' half-type
//! twins read `x_k`, `y` and `dy` as bit patterns, widened, and write `y` and each `dx_k` as the
//! bit patterns of what they round (`dx_k` after the addition to what it held, in FP32): the
//! numbers of the same pair on FP32 blobs.

use super::{BackwardPass, BlobElem, ForwardPass, GpuLayer};
use crate::config::layer_params::LayerParams;
use crate::config::EltwiseOp;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::net::NodeView;
use crate::precision::Half;

/// Whether the layers `chain` (an Eltwise, then a ReLU reading its top, in net order) compute
/// what one [`GpuEltwiseRelu`] does: a SUM of two distinct bottoms (with two coefficients, if
/// any) and a ReLU with a slope ≥ 0 (so that `relu'` can be read off the top). The net checks
/// the wiring (single consumer, same phases).
pub fn fusable(chain: &[NodeView]) -> bool {
    match chain {
        [sum, relu] => match (sum.params, relu.params) {
            (LayerParams::Eltwise(e), LayerParams::Relu(r)) => {
                e.operation == EltwiseOp::Sum
                    && sum.bottoms.len() == 2
                    && sum.bottoms[0] != sum.bottoms[1]
                    && e.coeff.as_ref().is_none_or(|c| c.len() == 2)
                    && r.negative_slope >= 0.0
            }
            _ => false,
        },
        _ => false,
    }
}

/// The fused pair; see the module docs.
#[derive(Debug)]
pub struct GpuEltwiseRelu {
    name: String,
    coeff: [f32; 2],
    slope: f32,
    /// The half type of mixed precision, whose rounding the kernels apply.
    half: Option<Half>,
    /// Whether the bottoms and the top are stored in the half type.
    half_blobs: bool,
}

impl GpuEltwiseRelu {
    /// The same layer on half-type blobs (its bottoms and top stored as
    /// [`Elem::Half`](crate::cuda::blob::Elem::Half)) where `yes`; needs a half type.
    pub fn on_half_blobs(mut self, yes: bool) -> Self {
        assert!(
            !yes || self.half.is_some(),
            "a sum and ReLU on half-type blobs needs the half type"
        );
        self.half_blobs = yes;
        self
    }

    /// The pair `chain` (checked by [`fusable`]), rounding to `half` in mixed precision (where
    /// the ReLU has slope 0).
    pub fn new(chain: &[NodeView], half: Option<Half>) -> Self {
        let (LayerParams::Eltwise(sum), LayerParams::Relu(relu)) =
            (chain[0].params, chain[1].params)
        else {
            panic!("not a fusable Eltwise SUM → ReLU pair");
        };
        assert!(fusable(chain), "not a fusable Eltwise SUM → ReLU pair");
        let coeff = sum.coeff.as_deref().unwrap_or(&[1.0, 1.0]);
        GpuEltwiseRelu {
            name: chain[0].name.to_string(),
            coeff: [coeff[0], coeff[1]],
            slope: relu.negative_slope,
            half,
            half_blobs: false,
        }
    }
}

impl GpuLayer for GpuEltwiseRelu {
    fn type_name(&self) -> &'static str {
        "eltwise+relu"
    }

    fn rounds_itself(&self) -> bool {
        self.half.is_some()
    }

    fn rounds_on_load(&self) -> bool {
        self.half.is_some()
    }

    /// Two bottoms of one shape.
    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        match bottoms {
            [a, b] if a == b => Ok(()),
            _ => Err(Error::net(
                &self.name,
                format!("takes 2 bottoms of one shape, got {bottoms:?}"),
            )),
        }
    }

    fn forward(&mut self, pass: ForwardPass<'_>) -> Result<()> {
        if self.half_blobs {
            self.forward_as::<u16>(pass)
        } else {
            self.forward_as::<f32>(pass)
        }
    }

    fn backward(&mut self, pass: BackwardPass<'_>) -> Result<()> {
        if self.half_blobs {
            self.backward_as::<u16>(pass)
        } else {
            self.backward_as::<f32>(pass)
        }
    }
}

impl GpuEltwiseRelu {
    /// Forward on blobs stored as `T`.
    fn forward_as<T: BlobElem>(&self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [x0, x1, y] = pass.blobs.two_bottoms_top();
        let n = y.count();
        gpu.kernels.sum2_relu_forward(
            &gpu.compute,
            self.coeff,
            self.slope,
            &T::data(x0),
            &T::data(x1),
            &mut T::data_mut(y),
            n,
            self.half,
        )
    }

    /// Backward on blobs stored as `T`.
    fn backward_as<T: BlobElem>(&self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grads) = (pass.gpu, pass.grads);
        let [x0, x1, y] = pass.blobs.two_bottoms_top();
        let n = y.count();
        let (mut dx0, mut dx1) = (T::diff_mut(x0), T::diff_mut(x1));
        let dx = [
            grads[0].wanted().then(|| (&mut dx0, grads[0].accumulate())),
            grads[1].wanted().then(|| (&mut dx1, grads[1].accumulate())),
        ];
        gpu.kernels.sum2_relu_backward(
            &gpu.compute,
            self.coeff,
            self.slope,
            &T::data(y),
            &T::diff(y),
            dx,
            n,
            self.half,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::GpuEltwiseRelu;
    use crate::config::Phase;
    use crate::cuda::layers::testing::{half_blobs_match_fp32_blobs, net_of, HalfBlobsCase};
    use crate::cuda::layers::Grad;
    use crate::cuda::test_util::gpu_or_skip;
    use crate::cuda::Gpu;
    use crate::precision::Half;

    /// The pair `relu(c0 · data + c1 · twin)` (`coeff` the Eltwise's `coeff` key, or none) on
    /// FP32 blobs and on half-type blobs: the same bits.
    fn check(gpu: &Gpu, shape: [usize; 4], coeff: &str, half: Half, seed: u64) {
        let [_, c, h, w] = shape;
        let layers = format!(
            "[[layer]]\nname = \"twin\"\ntype = \"power\"\nbottom = [\"data\"]\ntop = [\"twin\"]\n\n\
             [[layer]]\nname = \"sum\"\ntype = \"eltwise\"\nbottom = [\"data\", \"twin\"]\n\
             top = [\"sum\"]\n{coeff}\n\n\
             [[layer]]\nname = \"relu\"\ntype = \"relu\"\nbottom = [\"sum\"]\ntop = [\"sum\"]\n\n\
             [[layer]]\nname = \"ip\"\ntype = \"inner_product\"\nbottom = [\"sum\"]\ntop = [\"ip\"]\n\
             num_output = 10\n\n\
             [[layer]]\nname = \"loss\"\ntype = \"softmax_with_loss\"\nbottom = [\"ip\", \"label\"]\n\
             top = [\"loss\"]\n"
        );
        let (graph, _) = net_of(&layers, [c, h, w]);
        let nodes = [graph.node(1), graph.node(2)];
        let (acc, over, skip) = (Grad::Accumulate, Grad::Overwrite, Grad::Skip);
        let case = HalfBlobsCase {
            what: format!("{shape:?}, `{coeff}`, {half:?}"),
            half,
            phase: Phase::Train,
            bottoms: vec![shape.to_vec(), shape.to_vec()],
            tops: vec![shape.to_vec()],
            params: Vec::new(),
            backward: vec![
                (vec![acc, acc], acc),
                (vec![over, over], over),
                (vec![skip, over], acc),
                (vec![acc, skip], acc),
            ],
            seed,
        };
        half_blobs_match_fp32_blobs(gpu, &case, |half_blobs| {
            Box::new(GpuEltwiseRelu::new(&nodes, Some(half)).on_half_blobs(half_blobs))
        });
    }

    /// On half-type blobs the residual sum and its ReLU compute, bit for bit, what they compute
    /// on FP32 blobs in mixed precision from the same half-type values: the top and both bottom
    /// gradients (accumulated, overwritten, one of them skipped), with and without
    /// coefficients, in both half types, and on a tensor beyond four waves of threads, where the
    /// kernels take their loads four at a time.
    #[test]
    fn half_blobs_match_rounded_fp32_blobs() {
        let gpu = gpu_or_skip!("half_blobs_match_rounded_fp32_blobs");
        let n = 4 * gpu.kernels.wave_threads() / (8 * 16 * 16) + 1;
        for half in [Half::Bf16, Half::Fp16] {
            for coeff in ["", "coeff = [1.0, 0.5]", "coeff = [-0.75, 1.5]"] {
                check(&gpu, [3, 4, 5, 7], coeff, half, 2200);
            }
            check(&gpu, [n, 8, 16, 16], "coeff = [1.0, 0.5]", half, 2300);
        }
    }
}
