//! `Power`: Caffe's `y = (shift + scale·x)^power` element-wise (`power` 1, `scale` 1, `shift` 0
//! by default). Backward: `dx = dy · power · scale · (shift + scale·x)^(power − 1)` (0 when
//! `power = 0`, `scale` when `power = 1`). Top: the bottom's shape.

use crate::config::layer_params::PowerParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The power layer; see the module docs.
pub type Power = NeuronLayer<PowerParams>;

impl PowerParams {
    /// `shift + scale·x`.
    fn base(&self, x: f32) -> f32 {
        self.shift + self.scale * x
    }
}

/// `y = (shift + scale·x)^power`.
impl Neuron for PowerParams {
    const TYPE_NAME: &'static str = "power";

    fn forward(&self, x: f32) -> f32 {
        if self.power == 1.0 {
            self.base(x)
        } else {
            self.base(x).powf(self.power)
        }
    }

    /// `dx += dy · power · scale · (shift + scale·x)^(power − 1)` (`dy · scale` when `power = 1`).
    fn accumulate_gradient(&self, dx: &mut f32, x: f32, _y: f32, dy: f32) {
        let (p, a) = (self.power, self.scale);
        let slope = if p == 1.0 {
            a
        } else {
            p * a * self.base(x).powf(p - 1.0)
        };
        *dx += dy * slope;
    }

    /// A constant (`power = 0`) has no gradient.
    fn has_gradient(&self) -> bool {
        self.power != 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    fn power(keys: &str) -> Power {
        layer::<PowerParams>("power", keys)
    }

    #[test]
    fn forward_by_hand() {
        let x = blob(&[1, 3], &[0.0, 1.0, 2.0]);
        let top = forward(
            &mut power("power = 2.0\nscale = 3.0\nshift = 1.0"),
            &[x],
            &[],
        );
        assert_eq!(top[0].data, vec![1.0, 16.0, 49.0]);
    }

    #[test]
    fn gradient() {
        // Positive bases so that non-integer powers are defined.
        for extra in [
            "power = 2.0\nscale = 0.5\nshift = -0.2",
            "power = 0.5\nscale = 0.8\nshift = 1.5",
            "scale = -2.0\nshift = 3.0",
            "power = 0.0",
        ] {
            let x = uniform_blob(&[2, 3, 2], -1.0, 1.0, 94);
            GradientChecker::default().assert_passes(&mut power(extra), &[x], &[true]);
        }
    }
}
