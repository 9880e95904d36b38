//! `Power`: Caffe's `y = (shift + scale·x)^power` element-wise (`power` 1, `scale` 1, `shift` 0
//! by default). Backward: `dx = dy · power · scale · (shift + scale·x)^(power − 1)` (0 when
//! `power = 0`, `scale` when `power = 1`). Top: the bottom's shape.

use crate::config::layer_params::PowerParams;
use crate::layers::neuron::{Neuron, NeuronLayer};

/// The power layer; see the module docs.
pub type Power = NeuronLayer<AffinePower>;

/// `y = (shift + scale·x)^power`.
#[derive(Debug, Clone, Copy)]
pub struct AffinePower {
    power: f32,
    scale: f32,
    shift: f32,
}

impl Power {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`PowerParams`]).
    pub fn new(name: &str, p: &PowerParams) -> Self {
        NeuronLayer::with_neuron(
            name,
            AffinePower {
                power: p.power,
                scale: p.scale,
                shift: p.shift,
            },
        )
    }
}

impl Neuron for AffinePower {
    const TYPE_NAME: &'static str = "power";

    fn forward(&self, x: f32) -> f32 {
        let (p, a, b) = (self.power, self.scale, self.shift);
        let base = b + a * x;
        if p == 1.0 {
            base
        } else {
            base.powf(p)
        }
    }

    /// `dx += dy · power · scale · (shift + scale·x)^(power − 1)` (`dy · scale` when `power = 1`).
    fn accumulate_gradient(&self, dx: &mut f32, x: f32, _y: f32, dy: f32) {
        let (p, a, b) = (self.power, self.scale, self.shift);
        let slope = if p == 1.0 {
            a
        } else {
            p * a * (b + a * x).powf(p - 1.0)
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
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward};

    fn power(extra: &str) -> Power {
        from_config(
            Power::new,
            &layer_config(&format!("name = \"p\"\ntype = \"power\"\n{extra}")),
        )
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
            GradientChecker::default()
                .check(&mut power(extra), &[x], &[true])
                .unwrap()
                .assert_ok();
        }
    }
}
