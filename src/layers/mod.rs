//! Layers: the `Layer` trait (Caffe's setup/reshape/forward/backward) with its per-call
//! arguments ([`ForwardPass`], [`BackwardPass`]), one file per layer, the fillers, and the CPU
//! column of the layer registry: [`BuildCpu`], which each kind's parameter struct implements in
//! its layer's file, and [`build`], generated from the registry, which turns a layer's resolved
//! parameters into a boxed layer.
//!
//! A layer is its name, its resolved parameters and the state its passes keep: [`CpuLayer`]`<P,
//! S>`, e.g. `Softmax = CpuLayer<SoftmaxParams, AxisView>`; the elementwise and shape-only
//! families share one body each (`neuron.rs`, `reshaping.rs`).
//!
//! Adding a layer type (the whole list is in [`crate::config::layer_params`]): its file here
//! holds the layer (its state type and `impl Layer`), `impl BuildCpu for ItsParams` (written by
//! `cpu_layer!` for a [`CpuLayer`]) and its tests, a gradient check ([`gradient_check`]) among
//! them; `build` picks it up from the registry line, and a kind whose parameters lack `BuildCpu`
//! does not compile.
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

/// Declares the CPU layer `$layer`, a [`CpuLayer`] over the parameters `$params` with the state
/// `$state`, and builds it from those parameters ([`BuildCpu`], with an empty state).
macro_rules! cpu_layer {
    ($(#[$doc:meta])* pub type $layer:ident = CpuLayer<$params:ident, $state:ty>;) => {
        $(#[$doc])*
        pub type $layer = CpuLayer<$params, $state>;

        impl $crate::layers::BuildCpu for $params {
            type Layer = $layer;

            fn build(&self, name: &str) -> $layer {
                $crate::layers::CpuLayer::new(name, self)
            }
        }
    };
}

pub mod abs_val;
pub mod accuracy;
pub mod arg_max;
pub mod batch_norm;
pub mod bias;
pub mod broadcast;
pub mod concat;
pub mod convolution;
pub mod deconvolution;
pub mod dropout;
pub mod eltwise;
pub mod elu;
pub mod euclidean_loss;
pub mod filler;
pub mod flatten;
pub mod gradient_check;
pub mod inner_product;
pub mod input;
pub mod lrn;
pub mod neuron;
pub mod pooling;
pub mod power;
pub mod prelu;
pub mod relu;
pub mod reshape;
pub mod reshaping;
pub mod scale;
pub mod sigmoid;
pub mod silence;
pub mod slice;
pub mod softmax;
pub mod softmax_with_loss;
pub mod spatial;
pub mod split;
pub mod tanh;
#[cfg(test)]
pub(crate) mod test_util;

use crate::backend::Cpu;
use crate::config::layer_params::{for_each_layer_kind, LayerParams};
use crate::config::{FillerConfig, LayerConfig, Phase};
use crate::error::{Error, Result};
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

/// What a layer's forward gets: the step, its bottoms and learnable tensors, and its tops.
pub struct ForwardPass<'a> {
    pub ctx: &'a Ctx<'a>,
    /// The bottoms to read, in the layer's order.
    pub bottoms: &'a [Blob],
    /// The learnable tensors, in `param_specs()` order.
    pub params: &'a [&'a [f32]],
    /// The tops to write, already shaped.
    pub tops: &'a mut [Blob],
}

/// What a layer's backward gets: [`ForwardPass`]'s blobs and tensors after the forward, which
/// bottoms want a gradient, and the gradients of the learnable tensors.
pub struct BackwardPass<'a> {
    pub ctx: &'a Ctx<'a>,
    /// The tops as forward left them, with the gradient to propagate in their `diff`.
    pub tops: &'a [Blob],
    /// Whether bottom `i` wants a gradient: `propagate_down[i]`.
    pub propagate_down: &'a [bool],
    /// The bottoms; their `diff` is accumulated into where propagated, left alone elsewhere.
    pub bottoms: &'a mut [Blob],
    /// The learnable tensors, in `param_specs()` order.
    pub params: &'a [&'a [f32]],
    /// Their gradients, laid out as `params`, accumulated into.
    pub param_diffs: &'a mut [&'a mut [f32]],
}

impl<'a> BackwardPass<'a> {
    /// Top 0 and bottom 0 of a one-in, one-out layer when the bottom wants its gradient, `None`
    /// when it does not.
    pub fn top_and_bottom(self) -> Option<(&'a Blob, &'a mut Blob)> {
        let BackwardPass {
            tops,
            propagate_down,
            bottoms,
            ..
        } = self;
        match propagate_down[0] {
            true => Some((&tops[0], &mut bottoms[0])),
            false => None,
        }
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

    /// Whether the net reports the first value of each top after a forward pass: losses and
    /// metrics (a layer without backward, Accuracy). ArgMax, without backward but with a top that
    /// is not a scalar, says no.
    fn reports_output(&self) -> bool {
        self.is_loss() || !self.has_backward()
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

    /// Computes the tops from the bottoms and the learnable tensors.
    fn forward(&mut self, pass: ForwardPass<'_>);

    /// Accumulates gradients into `bottoms[i].diff` where `propagate_down[i]`, and into
    /// `param_diffs`, from the tops' diffs.
    fn backward(&mut self, pass: BackwardPass<'_>);
}

/// A CPU layer of one kind: its name, its resolved parameters `P` (its settings) and the state
/// `S` its reshape and passes keep, empty until the first reshape (Caffe's `Layer` base class
/// holds the same: the layer's parameters and what the derived layer stores). The elementwise
/// and shape-only families have bodies of their own (`NeuronLayer`, `ReshapingLayer`).
#[derive(Debug, Clone)]
pub struct CpuLayer<P, S> {
    /// For errors, and for keys of randomness (Dropout).
    name: String,
    settings: P,
    state: S,
}

impl<P: Clone, S: Default> CpuLayer<P, S> {
    /// The layer `name` with `settings` and an empty state.
    pub fn new(name: &str, settings: &P) -> Self {
        CpuLayer {
            name: name.to_string(),
            settings: settings.clone(),
            state: S::default(),
        }
    }
}

/// The CPU column of the layer registry: a kind's resolved parameters build its layer. Every
/// parameter struct of [`crate::config::layer_params`] implements it in its layer's file.
pub trait BuildCpu {
    /// The layer these parameters describe.
    type Layer: Layer + 'static;

    /// The layer `name` with these parameters.
    fn build(&self, name: &str) -> Self::Layer;
}

/// Generates [`build`] from the registry's list of kinds.
macro_rules! cpu_builder {
    ($($kind:ident => $params:ident,)*) => {
        /// Builds the layer `name` from its resolved parameters (the CPU column of the layer
        /// registry, [`crate::config::layer_params`]).
        pub fn build(name: &str, params: &LayerParams) -> Box<dyn Layer> {
            match params {
                $(LayerParams::$kind(p) => Box::new(
                    <crate::config::layer_params::$params as BuildCpu>::build(p, name),
                ),)*
            }
        }
    };
}

for_each_layer_kind!(cpu_builder);

/// Builds the layer a `[[layer]]` table describes, resolving its parameters (an error names the
/// layer and the key).
pub fn build_from_config(cfg: &LayerConfig) -> Result<Box<dyn Layer>> {
    Ok(build(&cfg.name, &cfg.params()?))
}

/// The only bottom shape of a layer that takes exactly one bottom.
pub(crate) fn one_bottom<'b>(layer: &str, bottoms: &[&'b [usize]]) -> Result<&'b [usize]> {
    match bottoms {
        [shape] => Ok(shape),
        _ => Err(Error::net(
            layer,
            format!("takes 1 bottom, got {}", bottoms.len()),
        )),
    }
}

/// Checks that Caffe's `axis` key names an axis of the bottom `shape`; the error names `layer`.
pub(crate) fn check_axis(layer: &str, axis: usize, shape: &[usize]) -> Result<()> {
    if axis >= shape.len() {
        return Err(Error::net(
            layer,
            format!("`axis` {axis} is out of range for bottom {shape:?}"),
        ));
    }
    Ok(())
}

/// The top shapes of an elementwise layer: one bottom `(N, ...)`, one top of the same shape.
pub(crate) fn elementwise_shape(layer: &str, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
    Ok(vec![one_bottom(layer, bottoms)?.to_vec()])
}

/// The end of the axes `axis .. axis + num_axes` of a shape of `rank` axes (`num_axes` −1: to
/// the last axis); `None` past the last axis.
pub(crate) fn axes_end(axis: usize, num_axes: i64, rank: usize) -> Option<usize> {
    match num_axes {
        -1 => Some(rank),
        n if n >= 0 && axis + n as usize <= rank => Some(axis + n as usize),
        _ => None,
    }
}

/// A shape viewed as `(outer, dim, inner)` around some of its axes: the product of the axes
/// before them, of them, and after them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AxisView {
    pub outer: usize,
    pub dim: usize,
    pub inner: usize,
}

impl AxisView {
    /// `shape` around its axes `axes`.
    pub fn around(shape: &[usize], axes: std::ops::Range<usize>) -> Self {
        AxisView {
            outer: shape[..axes.start].iter().product(),
            dim: shape[axes.clone()].iter().product(),
            inner: shape[axes.end..].iter().product(),
        }
    }
}

/// The tensors of a layer with a weight and an optional bias (InnerProduct, Convolution):
/// `weight` of `shape` `(num_output, ...)`, then `bias` `(num_output)` when `bias` gives its
/// filler.
pub(crate) fn weight_and_bias(
    shape: Vec<usize>,
    weight: &FillerConfig,
    bias: Option<&FillerConfig>,
) -> Vec<ParamSpec> {
    let num_output = shape[0];
    let mut specs = vec![ParamSpec::new("weight", shape, weight)];
    specs.extend(bias.map(|f| ParamSpec::new("bias", vec![num_output], f)));
    specs
}
