//! `NeuronLayer<F>`: Caffe's NeuronLayer, the one body of every elementwise layer. One bottom
//! `(N, ...)`, one top of the same shape; `F` (a [`Neuron`]) says what happens to one element
//! forward and backward, and the layer runs it over the blob. The kinds live in their own files
//! (`sigmoid.rs`, `tanh.rs`, `relu.rs`, `abs_val.rs`, `power.rs`), each a `Neuron` and a type
//! alias `NeuronLayer<ThatNeuron>` under the layer's name.

use crate::error::Result;
use crate::layers::{elementwise_shape, Ctx, Layer};
use crate::tensor::Blob;

/// One elementwise function and its derivative.
pub trait Neuron: Send {
    /// The config name of the layer type, e.g. `sigmoid`.
    const TYPE_NAME: &'static str;

    /// `y = f(x)` for one element.
    fn forward(&self, x: f32) -> f32;

    /// Adds to `dx` the gradient through one element, from its input `x`, its output `y` and the
    /// top's gradient `dy`.
    fn accumulate_gradient(&self, dx: &mut f32, x: f32, y: f32, dy: f32);

    /// Whether backward adds anything at all (a constant function adds nothing).
    fn has_gradient(&self) -> bool {
        true
    }
}

/// An elementwise layer: a name and the function `F` it applies to every element.
#[derive(Debug, Clone)]
pub struct NeuronLayer<F> {
    name: String,
    neuron: F,
}

impl<F: Neuron> NeuronLayer<F> {
    /// A layer named `name` applying `neuron`.
    pub fn with_neuron(name: impl Into<String>, neuron: F) -> Self {
        NeuronLayer {
            name: name.into(),
            neuron,
        }
    }
}

impl<F: Neuron + Default> Default for NeuronLayer<F> {
    /// The default function, in a layer named after its type (`relu`, `sigmoid`, ...).
    fn default() -> Self {
        NeuronLayer::with_neuron(F::TYPE_NAME, F::default())
    }
}

impl<F: Neuron> Layer for NeuronLayer<F> {
    fn type_name(&self) -> &'static str {
        F::TYPE_NAME
    }

    /// One bottom `(N, ...)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        elementwise_shape(&self.name, bottoms)
    }

    /// `top[i] = f(bottom[i])`.
    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        for (y, &x) in tops[0].data.iter_mut().zip(&bottoms[0].data) {
            *y = self.neuron.forward(x);
        }
    }

    /// `bottom.diff[i] += f'(bottom[i]) · top.diff[i]`, as the neuron writes it.
    fn backward(
        &mut self,
        _ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        _params: &[&[f32]],
        _param_diffs: &mut [&mut [f32]],
    ) {
        if !propagate_down[0] || !self.neuron.has_gradient() {
            return;
        }
        let (top, bottom) = (&tops[0], &mut bottoms[0]);
        let inputs = bottom.data.iter().zip(&top.data).zip(&top.diff);
        for (dx, ((&x, &y), &dy)) in bottom.diff.iter_mut().zip(inputs) {
            self.neuron.accumulate_gradient(dx, x, y, dy);
        }
    }
}
