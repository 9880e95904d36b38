//! `AbsVal`: `y = |x|` element-wise; `dx = dy · sign(x)` (0 at 0). Top: the bottom's shape.

use crate::config::layer_params::AbsValParams;
use crate::error::Result;
use crate::layers::{elementwise_shape, Ctx, Layer};
use crate::tensor::Blob;

/// The absolute-value layer; see the module docs.
#[derive(Debug, Clone)]
pub struct AbsVal {
    name: String,
}

impl AbsVal {
    pub fn new(name: &str, _params: &AbsValParams) -> Self {
        AbsVal {
            name: name.to_string(),
        }
    }
}

impl Layer for AbsVal {
    fn type_name(&self) -> &'static str {
        "abs_val"
    }

    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        elementwise_shape(&self.name, bottoms)
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        for (y, &x) in tops[0].data.iter_mut().zip(&bottoms[0].data) {
            *y = x.abs();
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
        if !propagate_down[0] {
            return;
        }
        let bottom = &mut bottoms[0];
        for ((d, &x), &g) in bottom.diff.iter_mut().zip(&bottom.data).zip(&tops[0].diff) {
            if x > 0.0 {
                *d += g;
            } else if x < 0.0 {
                *d -= g;
            }
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
