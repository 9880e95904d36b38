//! `TanH`: the hyperbolic tangent, elementwise `y = tanh(x)`. Bottom and top have the same shape
//! `(N, ...)`.

use crate::config::layer_params::TanhParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The hyperbolic tangent; see the module docs.
pub type TanH = NeuronLayer<TanhParams>;

/// `y = tanh(x)`.
impl Neuron for TanhParams {
    const TYPE_NAME: &'static str = "tanh";

    fn forward(&self, x: f32) -> f32 {
        x.tanh()
    }

    /// `dx += dy · (1 − y²)`, from the top's data.
    fn accumulate_gradient(&self, dx: &mut f32, _x: f32, y: f32, dy: f32) {
        *dx += dy * (1.0 - y * y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    #[test]
    fn forward_by_hand() {
        let bottom = blob(&[1, 5], &[0.0, 0.5, -1.0, 50.0, -50.0]);
        let top = forward(&mut layer::<TanhParams>("tanh", ""), &[bottom], &[]);
        let want = [0.0, 0.462_117_16, -0.761_594_2, 1.0, -1.0];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", top[0].data);
        }
    }

    #[test]
    fn gradient() {
        let bottom = uniform_blob(&[2, 3, 4], -2.0, 2.0, 41);
        let mut tanh = layer::<TanhParams>("tanh", "");
        GradientChecker::default().assert_passes(&mut tanh, &[bottom], &[true]);
    }
}
