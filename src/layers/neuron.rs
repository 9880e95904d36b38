//! `NeuronLayer<F>`: Caffe's NeuronLayer, the one body of every elementwise layer. One bottom
//! `(N, ...)`, one top of the same shape; `F` (a [`Neuron`]) says what happens to one element
//! forward and backward, and the layer runs it over the blob. The kinds live in their own files
//! (`sigmoid.rs`, `tanh.rs`, `relu.rs`, `abs_val.rs`, `power.rs`), each a type alias
//! `NeuronLayer<ItsParams>` under the layer's name and the `Neuron` of its parameter struct:
//! the resolved parameters are the function. Every `Neuron` builds its layer ([`BuildCpu`],
//! implemented here once for the family).

use crate::error::Result;
use crate::layers::{elementwise_shape, BackwardPass, BuildCpu, ForwardPass, Layer};

/// One elementwise function and its derivative.
pub trait Neuron: Clone + Send + 'static {
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

impl<F: Neuron> BuildCpu for F {
    type Layer = NeuronLayer<F>;

    /// The layer `name` applying these parameters' function.
    fn build(&self, name: &str) -> NeuronLayer<F> {
        NeuronLayer {
            name: name.to_string(),
            neuron: self.clone(),
        }
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
    fn forward(&mut self, pass: ForwardPass<'_>) {
        for (y, &x) in pass.tops[0].data.iter_mut().zip(&pass.bottoms[0].data) {
            *y = self.neuron.forward(x);
        }
    }

    /// `bottom.diff[i] += f'(bottom[i]) · top.diff[i]`, as the neuron writes it.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let Some((top, bottom)) = pass.top_and_bottom() else {
            return;
        };
        if !self.neuron.has_gradient() {
            return;
        }
        let inputs = bottom.data.iter().zip(&top.data).zip(&top.diff);
        for (dx, ((&x, &y), &dy)) in bottom.diff.iter_mut().zip(inputs) {
            self.neuron.accumulate_gradient(dx, x, y, dy);
        }
    }
}
