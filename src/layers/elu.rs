//! `Elu`: the exponential linear unit, elementwise `y = x > 0 ? x : alpha · (e^x − 1)` (Caffe's
//! ELU, written as Caffe writes it: `max(x, 0) + alpha · (e^min(x, 0) − 1)`; `alpha` defaults
//! to 1). Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx += dy · (x > 0 ? 1 : y + alpha)`, where `y + alpha = alpha · e^x` is recomputed
//! from `x` (Caffe reads it from the top; the value is the same).

use crate::config::layer_params::EluParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The exponential linear unit; see the module docs.
pub type Elu = NeuronLayer<EluParams>;

impl EluParams {
    /// The top of the negative part, `alpha · (e^min(x, 0) − 1)`.
    fn negative_part(&self, x: f32) -> f32 {
        self.alpha * (x.min(0.0).exp() - 1.0)
    }
}

/// `y = max(x, 0) + alpha · (e^min(x, 0) − 1)`.
impl Neuron for EluParams {
    const TYPE_NAME: &'static str = "elu";

    fn forward(&self, x: f32) -> f32 {
        x.max(0.0) + self.negative_part(x)
    }

    /// `dx += dy · (x > 0 ? 1 : alpha · (e^x − 1) + alpha)`.
    fn accumulate_gradient(&self, dx: &mut f32, x: f32, _y: f32, dy: f32) {
        *dx += if x > 0.0 {
            dy
        } else {
            dy * (self.negative_part(x) + self.alpha)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer, params_error};

    fn elu(keys: &str) -> Elu {
        layer::<EluParams>("elu", keys)
    }

    #[test]
    fn forward_by_hand() {
        let x = [-2.0f32, -0.5, 0.0, 1.5];
        let top = forward(&mut elu("alpha = 0.5"), &[blob(&[1, 4], &x)], &[]);
        let want = [
            0.5 * ((-2.0f32).exp() - 1.0),
            0.5 * ((-0.5f32).exp() - 1.0),
            0.0,
            1.5,
        ];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{:?} vs {want:?}", top[0].data);
        }
        // alpha defaults to 1: ELU(-1) = e^-1 - 1.
        let top = forward(&mut elu(""), &[blob(&[1, 1], &[-1.0])], &[]);
        assert!((top[0].data[0] - ((-1.0f32).exp() - 1.0)).abs() < 1e-7);
    }

    /// Caffe's ELU test settings: step 1e-2, threshold 1e-3, the kink at 0 skipped.
    #[test]
    fn gradient() {
        for keys in ["", "alpha = 0.5", "alpha = 2.0"] {
            let x = uniform_blob(&[2, 3, 4, 5], -2.0, 2.0, 31);
            let report = GradientChecker::skipping_kink(0.0, 0.01).assert_passes(
                &mut elu(keys),
                &[x],
                &[true],
            );
            assert!(report.checked > 100, "{report}");
        }
    }

    #[test]
    fn alpha_must_be_finite() {
        let e = params_error("elu", "alpha = inf");
        assert!(e.contains("`alpha`") && e.contains("finite"), "{e}");
    }
}
