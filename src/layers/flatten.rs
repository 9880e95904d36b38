//! `Flatten`: Caffe's flatten, merging the axes `axis ..= end_axis` into one (`axis` default 1,
//! `end_axis` default −1, the last): `(N, C, H, W)` becomes `(N, C·H·W)`. The data is copied; the
//! gradient passes through unchanged.

use crate::config::layer_params::FlattenParams;
use crate::error::{Error, Result};
use crate::layers::reshaping::{ReshapingLayer, ShapeRule};

/// The flatten layer; see the module docs.
pub type Flatten = ReshapingLayer<FlattenAxes>;

/// Merges the axes `axis ..= end_axis` into one.
#[derive(Debug, Clone)]
pub struct FlattenAxes {
    axis: usize,
    end_axis: i64,
}

impl Flatten {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`FlattenParams`]).
    pub fn new(name: &str, p: &FlattenParams) -> Self {
        ReshapingLayer::with_rule(
            name,
            FlattenAxes {
                axis: p.axis,
                end_axis: p.end_axis,
            },
        )
    }
}

impl ShapeRule for FlattenAxes {
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
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::Layer;

    fn flatten(extra: &str) -> Flatten {
        from_config(
            Flatten::new,
            &layer_config(&format!("name = \"f\"\ntype = \"flatten\"\n{extra}")),
        )
    }

    #[test]
    fn shapes() {
        let s: &[usize] = &[2, 3, 4, 5];
        assert_eq!(flatten("").reshape(&[s]).unwrap(), vec![vec![2, 60]]);
        assert_eq!(
            flatten("axis = 2").reshape(&[s]).unwrap(),
            vec![vec![2, 3, 20]]
        );
        assert_eq!(
            flatten("end_axis = 2").reshape(&[s]).unwrap(),
            vec![vec![2, 12, 5]]
        );
        assert_eq!(
            flatten("end_axis = -2").reshape(&[s]).unwrap(),
            vec![vec![2, 12, 5]]
        );
        assert!(flatten("axis = 3\nend_axis = 2").reshape(&[s]).is_err());
    }

    #[test]
    fn gradient() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 91);
        GradientChecker::default()
            .check(&mut flatten(""), &[x], &[true])
            .unwrap()
            .assert_ok();
    }
}
