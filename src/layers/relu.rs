//! `Relu`: the rectifier, elementwise `y = max(x, 0) + negative_slope · min(x, 0)` (Caffe's leaky
//! ReLU; `negative_slope` defaults to 0). Bottom and top have the same shape `(N, ...)`.

use crate::config::layer_params::ReluParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The rectifier; see the module docs.
pub type Relu = NeuronLayer<ReluParams>;

/// `y = x > 0 ? x : negative_slope · x`.
impl Neuron for ReluParams {
    const TYPE_NAME: &'static str = "relu";

    fn forward(&self, x: f32) -> f32 {
        if x > 0.0 {
            x
        } else {
            self.negative_slope * x
        }
    }

    /// `dx += dy · (x > 0 ? 1 : negative_slope)`.
    fn accumulate_gradient(&self, dx: &mut f32, x: f32, _y: f32, dy: f32) {
        *dx += if x > 0.0 {
            dy
        } else {
            self.negative_slope * dy
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};
    use crate::layers::Layer;

    fn relu(slope: f32) -> Relu {
        layer::<ReluParams>("relu", &format!("negative_slope = {slope:?}"))
    }

    fn forward_row(layer: &mut Relu, x: &[f32]) -> Vec<f32> {
        forward(layer, &[blob(&[1, x.len()], x)], &[])
            .remove(0)
            .data
    }

    #[test]
    fn forward_by_hand() {
        let x = [-2.0, -0.5, 0.0, 1.5];
        assert_eq!(forward_row(&mut relu(0.0), &x), vec![0.0, 0.0, 0.0, 1.5]);
        let plain = forward_row(&mut layer::<ReluParams>("relu", ""), &x);
        assert_eq!(plain, vec![0.0, 0.0, 0.0, 1.5]);
        let leaky = forward_row(&mut relu(0.1), &x);
        let want = [-0.2, -0.05, 0.0, 1.5];
        for (g, w) in leaky.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{leaky:?} vs {want:?}");
        }
    }

    /// Caffe's ReLU test settings: the kink at 0 is skipped within one step.
    fn check(slope: f32) {
        let bottom = uniform_blob(&[2, 3, 4, 5], -1.0, 1.0, 21);
        let report = GradientChecker::skipping_kink(0.0, 0.01).assert_passes(
            &mut relu(slope),
            &[bottom],
            &[true],
        );
        assert!(report.checked > 100, "{report}");
    }

    #[test]
    fn gradient_slope_0() {
        check(0.0);
    }

    #[test]
    fn gradient_slope_0_1() {
        check(0.1);
    }

    #[test]
    fn rejects_two_bottoms() {
        assert!(relu(0.0).reshape(&[&[1, 2], &[1, 2]]).is_err());
    }
}
