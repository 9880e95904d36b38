//! `Flatten`: Caffe's flatten, merging the axes `axis ..= end_axis` into one (`axis` default 1,
//! `end_axis` default −1, the last): `(N, C, H, W)` becomes `(N, C·H·W)`. The data is copied; the
//! gradient passes through unchanged.

use crate::config::layer_params::FlattenParams;
use crate::error::{Error, Result};
use crate::layers::reshaping::{ReshapingLayer, ShapeRule};
use crate::layers::BuildCpu;

/// The flatten layer; see the module docs.
pub type Flatten = ReshapingLayer<FlattenParams>;

impl BuildCpu for FlattenParams {
    type Layer = Flatten;

    fn build(&self, name: &str) -> Flatten {
        ReshapingLayer::with_rule(name, *self)
    }
}

/// Merges the axes `axis ..= end_axis` into one.
impl ShapeRule for FlattenParams {
    const TYPE_NAME: &'static str = "flatten";

    fn top_shape(&self, layer: &str, shape: &[usize]) -> Result<Vec<usize>> {
        let rank = shape.len() as i64;
        let end = if self.end_axis < 0 {
            rank + self.end_axis
        } else {
            self.end_axis
        };
        let axis = self.axis as i64;
        if axis >= rank || end < axis || end >= rank {
            return Err(Error::net(
                layer,
                format!(
                    "axes {} ..= {} are out of range for bottom {shape:?}",
                    self.axis, self.end_axis
                ),
            ));
        }
        let (a, e) = (axis as usize, end as usize);
        let mut top = shape[..a].to_vec();
        top.push(shape[a..=e].iter().product());
        top.extend_from_slice(&shape[e + 1..]);
        Ok(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::layer;
    use crate::layers::Layer;

    fn top(keys: &str, bottom: &[usize]) -> Result<Vec<Vec<usize>>> {
        layer::<FlattenParams>("flatten", keys).reshape(&[bottom])
    }

    #[test]
    fn shapes() {
        let s: &[usize] = &[2, 3, 4, 5];
        assert_eq!(top("", s).unwrap(), vec![vec![2, 60]]);
        assert_eq!(top("axis = 2", s).unwrap(), vec![vec![2, 3, 20]]);
        assert_eq!(top("end_axis = 2", s).unwrap(), vec![vec![2, 12, 5]]);
        assert_eq!(top("end_axis = -2", s).unwrap(), vec![vec![2, 12, 5]]);
        assert!(top("axis = 3\nend_axis = 2", s).is_err());
    }

    #[test]
    fn gradient() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 91);
        let mut flatten = layer::<FlattenParams>("flatten", "");
        GradientChecker::default().assert_passes(&mut flatten, &[x], &[true]);
    }
}
