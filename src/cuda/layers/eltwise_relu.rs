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

use super::{BackwardPass, ForwardPass, GpuLayer};
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
}

impl GpuEltwiseRelu {
    /// The same layer on half-type blobs (its bottoms and top stored as
    /// [`Elem::Half`](crate::cuda::blob::Elem::Half)) where `yes`; needs a half type.
    pub fn on_half_blobs(self, yes: bool) -> Self {
        assert!(!yes, "on half-type blobs: not yet");
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

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [x0, x1, y] = pass.blobs.two_bottoms_top();
        let n = y.count();
        gpu.kernels.sum2_relu_forward(
            &gpu.compute,
            self.coeff,
            self.slope,
            &x0.data(),
            &x1.data(),
            &mut y.data_mut(),
            n,
            self.half,
        )
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grads) = (pass.gpu, pass.grads);
        let [x0, x1, y] = pass.blobs.two_bottoms_top();
        let n = y.count();
        let (mut dx0, mut dx1) = (x0.diff_mut(), x1.diff_mut());
        let dx = [
            grads[0].wanted().then(|| (&mut dx0, grads[0].accumulate())),
            grads[1].wanted().then(|| (&mut dx1, grads[1].accumulate())),
        ];
        gpu.kernels.sum2_relu_backward(
            &gpu.compute,
            self.coeff,
            self.slope,
            &y.data(),
            &y.diff(),
            dx,
            n,
            self.half,
        )
    }
}
