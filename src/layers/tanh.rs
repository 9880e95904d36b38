//! `TanH`: the hyperbolic tangent, elementwise `y = tanh(x)`. Bottom and top have the same shape
//! `(N, ...)`.

use crate::config::layer_params::TanhParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The hyperbolic tangent; see the module docs.
pub type TanH = NeuronLayer<HyperbolicTangent>;

/// `y = tanh(x)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct HyperbolicTangent;

impl TanH {
    pub fn new(name: &str, _params: &TanhParams) -> Self {
        NeuronLayer::with_neuron(name, HyperbolicTangent)
    }
}

impl Neuron for HyperbolicTangent {
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
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward};

    fn tanh() -> TanH {
        from_config(TanH::new, &layer_config("name = \"t\"\ntype = \"tanh\""))
    }

    #[test]
    fn forward_by_hand() {
        let bottom = blob(&[1, 5], &[0.0, 0.5, -1.0, 50.0, -50.0]);
        let top = forward(&mut tanh(), &[bottom], &[]);
        let want = [0.0, 0.462_117_16, -0.761_594_2, 1.0, -1.0];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", top[0].data);
        }
    }

    #[test]
    fn gradient() {
        let bottom = uniform_blob(&[2, 3, 4], -2.0, 2.0, 41);
        GradientChecker::default()
            .check(&mut tanh(), &[bottom], &[true])
            .unwrap()
            .assert_ok();
    }
}
