//! `Sigmoid`: the logistic function, elementwise `y = 1 / (1 + e^(−x))`. Bottom and top have the
//! same shape `(N, ...)`.

use crate::config::layer_params::SigmoidParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The logistic function; see the module docs.
pub type Sigmoid = NeuronLayer<SigmoidParams>;

/// `y = 1 / (1 + e^(−x))`.
impl Neuron for SigmoidParams {
    const TYPE_NAME: &'static str = "sigmoid";

    /// Saturates to exactly 0 and 1 for large |x|, never NaN.
    fn forward(&self, x: f32) -> f32 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `dx += dy · y · (1 − y)`, from the top's data.
    fn accumulate_gradient(&self, dx: &mut f32, _x: f32, y: f32, dy: f32) {
        *dx += dy * y * (1.0 - y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    #[test]
    fn forward_by_hand() {
        let bottom = blob(&[1, 5], &[0.0, 1.0, -2.0, 100.0, -100.0]);
        let top = forward(&mut layer::<SigmoidParams>("sigmoid", ""), &[bottom], &[]);
        let want = [0.5, 0.731_058_6, 0.119_202_92, 1.0, 0.0];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", top[0].data);
        }
    }

    #[test]
    fn gradient() {
        let bottom = uniform_blob(&[2, 3, 4], -3.0, 3.0, 31);
        let mut sigmoid = layer::<SigmoidParams>("sigmoid", "");
        GradientChecker::default().assert_passes(&mut sigmoid, &[bottom], &[true]);
    }
}
