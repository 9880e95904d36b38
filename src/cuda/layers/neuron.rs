//! `GpuNeuron`: Caffe's NeuronLayer on the device, one body for every layer whose top has the
//! bottom's shape `(N, ...)` and is computed element by element. Each kind is a [`NeuronFn`]: an
//! [`Activation`] (relu, sigmoid, tanh, abs_val, power, elu: a pair of kernels, and the data its
//! backward reads) or the identity of the views flatten and reshape
//! ([`Identity`](super::view::Identity)). Each kind's file builds its layer from its parameters
//! in one [`neuron_builder`] line.
//!
//! Forward: `y = f(x)` over the `(n)` elements. Backward, only where the bottom wants a
//! gradient: `dx (+)= dy · f'` over `(n)`, from the bottom's data `x` or the top's data `y`.

use super::{BackwardPass, ForwardPass, GpuLayer};
use crate::cuda::kernels::Activation;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// One elementwise function and its derivative: what distinguishes one neuron layer from another.
pub trait NeuronFn: Send {
    /// The config name of the layer type, e.g. `relu`.
    fn type_name(&self) -> &'static str;

    /// `y (n) = f(x (n))`.
    fn forward(&self, gpu: &Gpu, x: &Values<'_>, y: &mut ValuesMut<'_>, n: usize) -> Result<()>;

    /// `dx (n) (+)= dy (n) · f'`, from whichever of `grad.x` and `grad.y` the derivative reads.
    fn backward(&self, gpu: &Gpu, grad: NeuronGrad<'_>) -> Result<()>;

    /// Whether `f` and `dy · f'` map half-type values to half-type values exactly (a selection
    /// or a sign), so that mixed precision need not round them
    /// ([`GpuLayer::forward_keeps_half`]).
    fn keeps_half(&self) -> bool {
        false
    }
}

/// `(n)` values on the device, read-only.
pub type Values<'a> = CudaView<'a, f32>;

/// `(n)` values on the device, writable.
pub type ValuesMut<'a> = CudaViewMut<'a, f32>;

/// The buffers of one neuron backward, all `(n)`.
pub struct NeuronGrad<'a> {
    /// The bottom's data.
    pub x: CudaView<'a, f32>,
    /// The top's data.
    pub y: CudaView<'a, f32>,
    /// The top's diff.
    pub dy: CudaView<'a, f32>,
    /// The bottom's diff.
    pub dx: CudaViewMut<'a, f32>,
    pub n: usize,
    /// `dx += …` rather than `dx = …`.
    pub accumulate: bool,
}

/// The neuron layer of kind `F`; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuNeuron<F>(pub F);

impl<F: NeuronFn> GpuLayer for GpuNeuron<F> {
    fn type_name(&self) -> &'static str {
        self.0.type_name()
    }

    fn forward_keeps_half(&self) -> bool {
        self.0.keeps_half()
    }

    fn backward_keeps_half(&self) -> bool {
        self.0.keeps_half()
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let [x, y] = pass.blobs.bottom_top();
        let n = x.count();
        self.0.forward(pass.gpu, &x.data(), &mut y.data_mut(), n)
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let wanted = pass.grads[0];
        if !wanted.wanted() {
            return Ok(());
        }
        let [x, y] = pass.blobs.bottom_top();
        let n = x.count();
        let grad = NeuronGrad {
            x: x.data.slice(..n),
            y: y.data.slice(..n),
            dy: y.diff.slice(..n),
            dx: x.diff.slice_mut(..n),
            n,
            accumulate: wanted.accumulate(),
        };
        self.0.backward(pass.gpu, grad)
    }
}

/// The activations of relu, sigmoid, tanh, abs_val, power and elu, each one pair of kernels.
impl NeuronFn for Activation {
    fn type_name(&self) -> &'static str {
        match self {
            Activation::Relu { .. } => "relu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
            Activation::Abs => "abs_val",
            Activation::Power { .. } => "power",
            Activation::Elu { .. } => "elu",
        }
    }

    /// ReLU without slope (`x` or 0; `dy` or 0) and the absolute value (`±x`; `±dy`).
    fn keeps_half(&self) -> bool {
        match self {
            Activation::Relu { negative_slope } => *negative_slope == 0.0,
            Activation::Abs => true,
            _ => false,
        }
    }

    fn forward(&self, gpu: &Gpu, x: &Values<'_>, y: &mut ValuesMut<'_>, n: usize) -> Result<()> {
        gpu.kernels.activation_forward(&gpu.compute, *self, x, y, n)
    }

    fn backward(&self, gpu: &Gpu, mut g: NeuronGrad<'_>) -> Result<()> {
        let input = if self.derivative_reads_top() {
            &g.y
        } else {
            &g.x
        };
        let (s, f) = (&gpu.compute, *self);
        gpu.kernels
            .activation_backward(s, f, input, &g.dy, &mut g.dx, g.n, g.accumulate)
    }
}

/// `neuron_builder!(KindParams, |p| f)`: the [`BuildGpu`](super::BuildGpu) of a neuron kind's
/// parameters `KindParams`, a [`GpuNeuron`] of the [`NeuronFn`] `f` (an expression of the
/// parameters `p`).
macro_rules! neuron_builder {
    ($params:ident, |$p:pat_param| $f:expr) => {
        layer_builder!($crate::config::layer_params::$params, |$p| {
            $crate::cuda::layers::neuron::GpuNeuron($f)
        });
    };
}
pub(crate) use neuron_builder;
