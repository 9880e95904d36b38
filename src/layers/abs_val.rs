//! `AbsVal`: `y = |x|` element-wise; `dx = dy · sign(x)` (0 at 0). Top: the bottom's shape.

use crate::config::layer_params::AbsValParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The absolute-value layer; see the module docs.
pub type AbsVal = NeuronLayer<Absolute>;

/// `y = |x|`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Absolute;

impl AbsVal {
    pub fn new(name: &str, _params: &AbsValParams) -> Self {
        NeuronLayer::with_neuron(name, Absolute)
    }
}

impl Neuron for Absolute {
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
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward};

    fn abs() -> AbsVal {
        from_config(
            AbsVal::new,
            &layer_config("name = \"a\"\ntype = \"abs_val\""),
        )
    }

    #[test]
    fn forward_by_hand() {
        let x = blob(&[1, 3], &[-2.0, 0.0, 1.5]);
        assert_eq!(forward(&mut abs(), &[x], &[])[0].data, vec![2.0, 0.0, 1.5]);
    }

    #[test]
    fn gradient() {
        let x = uniform_blob(&[2, 3, 4], -1.0, 1.0, 95);
        let checker = GradientChecker {
            kink: 0.0,
            kink_range: 0.01,
            ..GradientChecker::default()
        };
        let report = checker.check(&mut abs(), &[x], &[true]).unwrap();
        report.assert_ok();
        assert!(report.checked > 10, "{report}");
    }
}
