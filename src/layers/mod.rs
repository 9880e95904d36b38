//! Layers: the `Layer` trait (Caffe's setup/reshape/forward/backward), one file per layer, the
//! fillers, and `build()` that turns a layer's resolved parameters into a boxed layer.
//!
//! Conventions:
//! - Blobs are row-major with the batch first: `(N, ...)`.
//! - `backward` **accumulates** into every diff it writes, bottoms' and parameters' alike; the net
//!   zeroes activation diffs before a backward pass and the solver zeroes parameter diffs at the
//!   start of an iteration. A blob consumed by several layers therefore gets the sum.
//! - Learnable tensors live in the replica's flat `Params`; a layer sees them as slices in the
//!   order of its `param_specs()`.
//! - **State.** A layer whose `has_state()` is true (BatchNorm) declares in `param_specs()` tensors
//!   that are not learned but updated by the layer itself (running statistics). They live in the
//!   flat `Params` like weights, so snapshots, resume and the start-up broadcast carry them, but
//!   the net gives them `lr_mult = decay_mult = 0` (the solver never moves them; backward leaves
//!   their diffs at zero, so the gradient all-reduce averages zeros). After each forward pass of
//!   such a layer the net calls `update_state` with mutable views of these tensors; the layer
//!   keeps whatever forward computed (batch statistics) until then.
//! - **Cross-replica statistics.** `Ctx::reducer`, when present, sums small f64 buffers over every
//!   replica of the job (local threads and MPI ranks) in universal-rank order; BatchNorm with
//!   `sync = true` uses it for its per-channel sums. The engine supplies it in train passes of a
//!   multi-replica job and `None` otherwise (one replica; test passes, whose batch counts may
//!   differ between replicas). Layers never see the communicator itself.

pub mod abs_val;
pub mod accuracy;
pub mod batch_norm;
pub mod bias;
pub mod concat;
pub mod convolution;
pub mod dropout;
pub mod eltwise;
pub mod filler;
pub mod flatten;
pub mod gradient_check;
pub mod inner_product;
pub mod neuron;
pub mod pooling;
pub mod power;
pub mod relu;
pub mod reshape;
pub mod reshaping;
pub mod scale;
pub mod sigmoid;
pub mod softmax;
pub mod softmax_with_loss;
pub mod spatial;
pub mod tanh;
#[cfg(test)]
mod test_util;

use crate::backend::Cpu;
use crate::config::layer_params::LayerParams;
use crate::config::{LayerConfig, Phase};
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
    /// Sums over every replica of the job, when the pass is collective (see the module docs).
    pub reducer: Option<&'a dyn Reducer>,
}

/// Sums small buffers over every replica of the job (a collective: every replica calls it the
/// same number of times with buffers of the same length, in the same order of layers). The
/// engine implements it over its communicator, so layers do not depend on MPI or NCCL.
pub trait Reducer {
    /// Replaces `buf` by the element-wise sum of every replica's `buf`, added in universal-rank
    /// order: every replica gets the same bits, and replicas grouped differently into processes
    /// (np 2 × 1 replica or np 1 × 2 replicas) get the same bits too. A communication failure
    /// is reported by the engine after the pass.
    fn sum_f64(&self, buf: &mut [f64]);
}

impl std::fmt::Debug for dyn Reducer + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reducer")
    }
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

    /// Whether the tensors of `param_specs()` are state the layer updates itself (BatchNorm's
    /// running statistics) rather than learnable weights: the net fixes their `lr_mult` and
    /// `decay_mult` at 0 and calls `update_state` after every forward pass of the layer.
    fn has_state(&self) -> bool {
        false
    }

    /// Updates the state tensors (in `param_specs()` order) from what the last `forward` computed.
    /// Called by the net right after each forward pass of a layer with `has_state()`, in either
    /// phase; the layer decides what to do (BatchNorm: only in a train pass with batch
    /// statistics).
    fn update_state(&mut self, _ctx: &Ctx, _state: &mut [&mut [f32]]) {}

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

/// The only bottom shape of a layer that takes exactly one bottom.
pub(crate) fn one_bottom<'b>(layer: &str, bottoms: &[&'b [usize]]) -> Result<&'b [usize]> {
    match bottoms {
        [shape] => Ok(shape),
        _ => Err(crate::error::Error::net(
            layer,
            format!("takes 1 bottom, got {}", bottoms.len()),
        )),
    }
}

/// The top shapes of an elementwise layer: one bottom `(N, ...)`, one top of the same shape.
pub(crate) fn elementwise_shape(layer: &str, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
    Ok(vec![one_bottom(layer, bottoms)?.to_vec()])
}

/// Builds the layer `name` from its resolved parameters (the CPU column of the layer registry,
/// [`crate::config::layer_params`]).
pub fn build(name: &str, params: &LayerParams) -> Box<dyn Layer> {
    use LayerParams as P;
    match params {
        P::InnerProduct(p) => Box::new(inner_product::InnerProduct::new(name, p)),
        P::Relu(p) => Box::new(relu::Relu::new(name, p)),
        P::Sigmoid(p) => Box::new(sigmoid::Sigmoid::new(name, p)),
        P::Tanh(p) => Box::new(tanh::TanH::new(name, p)),
        P::SoftmaxWithLoss(p) => Box::new(softmax_with_loss::SoftmaxWithLoss::new(name, p)),
        P::Accuracy(p) => Box::new(accuracy::Accuracy::new(name, p)),
        P::Dropout(p) => Box::new(dropout::Dropout::new(name, p)),
        P::BatchNorm(p) => Box::new(batch_norm::BatchNorm::new(name, p)),
        P::Convolution(p) => Box::new(convolution::Convolution::new(name, p)),
        P::Pooling(p) => Box::new(pooling::Pooling::new(name, p)),
        P::Scale(p) => Box::new(scale::Scale::new(name, p)),
        P::Bias(p) => Box::new(bias::Bias::new(name, p)),
        P::Eltwise(p) => Box::new(eltwise::Eltwise::new(name, p)),
        P::Concat(p) => Box::new(concat::Concat::new(name, p)),
        P::Flatten(p) => Box::new(flatten::Flatten::new(name, p)),
        P::Reshape(p) => Box::new(reshape::Reshape::new(name, p)),
        P::Softmax(p) => Box::new(softmax::Softmax::new(name, p)),
        P::Power(p) => Box::new(power::Power::new(name, p)),
        P::AbsVal(p) => Box::new(abs_val::AbsVal::new(name, p)),
    }
}

/// Builds the layer a `[[layer]]` table describes, resolving its parameters (an error names the
/// layer and the key).
pub fn build_from_config(cfg: &LayerConfig) -> Result<Box<dyn Layer>> {
    Ok(build(&cfg.name, &cfg.params()?))
}
