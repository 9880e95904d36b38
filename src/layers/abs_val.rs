//! `AbsVal`: `y = |x|` element-wise; `dx = dy · sign(x)` (0 at 0). Top: the bottom's shape.

use crate::config::layer_params::AbsValParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The absolute-value layer; see the module docs.
pub type AbsVal = NeuronLayer<AbsValParams>;

/// `y = |x|`.
impl Neuron for AbsValParams {
    const TYPE_NAME: &'static str = "abs_val";

    fn forward(&self, x: f32) -> f32 {
        x.abs()
    }

    /// `dx += dy` where `x > 0`, `dx −= dy` where `x < 0`; `dx` is left as it is at 0.
    fn accumulate_gradient(&self, dx: &mut f32, x: f32, _y: f32, dy: f32) {
        if x > 0.0 {
            *dx += dy;
        } else if x < 0.0 {
            *dx -= dy;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    fn abs() -> AbsVal {
        layer::<AbsValParams>("abs_val", "")
    }

    #[test]
    fn forward_by_hand() {
        let x = blob(&[1, 3], &[-2.0, 0.0, 1.5]);
        assert_eq!(forward(&mut abs(), &[x], &[])[0].data, vec![2.0, 0.0, 1.5]);
    }

    #[test]
    fn gradient() {
        let x = uniform_blob(&[2, 3, 4], -1.0, 1.0, 95);
        let report =
            GradientChecker::skipping_kink(0.0, 0.01).assert_passes(&mut abs(), &[x], &[true]);
        assert!(report.checked > 10, "{report}");
    }
}
