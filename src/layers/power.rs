//! `Power`: Caffe's `y = (shift + scale·x)^power` element-wise (`power` 1, `scale` 1, `shift` 0
//! by default). Backward: `dx = dy · power · scale · (shift + scale·x)^(power − 1)` (0 when
//! `power = 0`, `scale` when `power = 1`). Top: the bottom's shape.

use crate::config::layer_params::PowerParams;
use crate::error::Result;
use crate::layers::{elementwise_shape, Ctx, Layer};
use crate::tensor::Blob;

/// The power layer; see the module docs.
#[derive(Debug, Clone)]
pub struct Power {
    name: String,
    power: f32,
    scale: f32,
    shift: f32,
}

impl Power {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`PowerParams`]).
    pub fn new(name: &str, p: &PowerParams) -> Self {
        Power {
            name: name.to_string(),
            power: p.power,
            scale: p.scale,
            shift: p.shift,
        }
    }
}

impl Layer for Power {
    fn type_name(&self) -> &'static str {
        "power"
    }

    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        elementwise_shape(&self.name, bottoms)
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        let (p, a, b) = (self.power, self.scale, self.shift);
        for (y, &x) in tops[0].data.iter_mut().zip(&bottoms[0].data) {
            let base = b + a * x;
            *y = if p == 1.0 { base } else { base.powf(p) };
        }
    }

    fn backward(
        &mut self,
        _ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        _params: &[&[f32]],
        _param_diffs: &mut [&mut [f32]],
    ) {
        if !propagate_down[0] || self.power == 0.0 {
            return;
        }
        let (p, a, b) = (self.power, self.scale, self.shift);
        let bottom = &mut bottoms[0];
        for ((d, &x), &g) in bottom.diff.iter_mut().zip(&bottom.data).zip(&tops[0].diff) {
            let slope = if p == 1.0 {
                a
            } else {
                p * a * (b + a * x).powf(p - 1.0)
            };
            *d += g * slope;
        }
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
