//! Layers: the `Layer` trait (Caffe's setup/reshape/forward/backward), one file per layer, the
//! fillers, and `build()` that turns a `[[layer]]` table into a boxed layer.
//!
//! Conventions:
//! - Blobs are row-major with the batch first: `(N, ...)`.
//! - `backward` **accumulates** into every diff it writes, bottoms' and parameters' alike; the net
//!   zeroes activation diffs before a backward pass and the solver zeroes parameter diffs at the
//!   start of an iteration. A blob consumed by several layers therefore gets the sum.
//! - Learnable tensors live in the replica's flat `Params`; a layer sees them as slices in the
//!   order of its `param_specs()`.

pub mod abs_val;
pub mod accuracy;
pub mod bias;
pub mod concat;
pub mod convolution;
pub mod eltwise;
pub mod filler;
pub mod flatten;
pub mod gradient_check;
pub mod inner_product;
pub mod pooling;
pub mod power;
pub mod relu;
pub mod reshape;
pub mod scale;
pub mod sigmoid;
pub mod softmax;
pub mod softmax_with_loss;
pub mod spatial;
pub mod tanh;
#[cfg(test)]
mod test_util;

use crate::backend::Cpu;
use crate::config::{LayerConfig, LayerKind, Phase};
use crate::error::Result;
use crate::params::ParamSpec;
use crate::tensor::Blob;

/// What a layer may need to know about the step it is in.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub cpu: &'a Cpu,
    pub phase: Phase,
    /// Iteration number (for topology-invariant randomness).
    pub iter: u64,
    /// The run's `random_seed`.
    pub seed: u64,
    /// Global index (in the epoch's record order) of this replica's first sample of the batch.
    pub first_sample: u64,
}

/// A differentiable operation from bottom blobs to top blobs.
pub trait Layer: Send {
    /// The config name of the layer type, e.g. `inner_product`.
    fn type_name(&self) -> &'static str;

    /// Checks the bottom shapes and returns the top shapes. Called at setup and whenever the
    /// batch size changes; the shapes of learnable tensors never change after the first call.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>>;

    /// The learnable tensors, in order (valid after the first `reshape`).
    fn param_specs(&self) -> Vec<ParamSpec> {
        Vec::new()
    }

    /// Whether the layer has a backward pass (Accuracy has none).
    fn has_backward(&self) -> bool {
        true
    }

    /// Whether the top is a loss (a scalar to be weighted into the objective).
    fn is_loss(&self) -> bool {
        false
    }

    /// Computes `tops` from `bottoms` and `params`; `tops` are already shaped.
    fn forward(&mut self, ctx: &Ctx, bottoms: &[Blob], params: &[&[f32]], tops: &mut [Blob]);

    /// Accumulates gradients into `bottoms[i].diff` where `propagate_down[i]`, and into
    /// `param_diffs`, from `tops[..].diff`.
    fn backward(
        &mut self,
        ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        params: &[&[f32]],
        param_diffs: &mut [&mut [f32]],
    );
}

/// The top shapes of an elementwise layer: one bottom `(N, ...)`, one top of the same shape.
pub(crate) fn elementwise_shape(layer: &str, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
    match bottoms {
        [shape] => Ok(vec![shape.to_vec()]),
        _ => Err(crate::error::Error::net(
            layer,
            format!("takes 1 bottom, got {}", bottoms.len()),
        )),
    }
}

/// Builds the layer a validated `[[layer]]` table describes.
pub fn build(cfg: &LayerConfig) -> Result<Box<dyn Layer>> {
    Ok(match cfg.kind {
        LayerKind::InnerProduct => Box::new(inner_product::InnerProduct::new(cfg)?),
        LayerKind::Relu => Box::new(relu::Relu::new(cfg)),
        LayerKind::Sigmoid => Box::new(sigmoid::Sigmoid::new(cfg)),
        LayerKind::Tanh => Box::new(tanh::TanH::new(cfg)),
        LayerKind::SoftmaxWithLoss => Box::new(softmax_with_loss::SoftmaxWithLoss::new(cfg)),
        LayerKind::Accuracy => Box::new(accuracy::Accuracy::new(cfg)),
        LayerKind::Convolution => Box::new(convolution::Convolution::new(cfg)?),
        LayerKind::Pooling => Box::new(pooling::Pooling::new(cfg)?),
        LayerKind::Scale => Box::new(scale::Scale::new(cfg)?),
        LayerKind::Bias => Box::new(bias::Bias::new(cfg)?),
        LayerKind::Eltwise => Box::new(eltwise::Eltwise::new(cfg)?),
        LayerKind::Concat => Box::new(concat::Concat::new(cfg)),
        LayerKind::Flatten => Box::new(flatten::Flatten::new(cfg)),
        LayerKind::Reshape => Box::new(reshape::Reshape::new(cfg)?),
        LayerKind::Softmax => Box::new(softmax::Softmax::new(cfg)),
        LayerKind::Power => Box::new(power::Power::new(cfg)),
        LayerKind::AbsVal => Box::new(abs_val::AbsVal::new(cfg)),
        other => {
            return Err(crate::error::Error::net(
                &cfg.name,
                format!("layer type {other:?} is not built yet"),
            ))
        }
    })
}
