//! `Flatten`: Caffe's flatten, merging the axes `axis ..= end_axis` into one (`axis` default 1,
//! `end_axis` default −1, the last): `(N, C, H, W)` becomes `(N, C·H·W)`. The data is copied; the
//! gradient passes through unchanged.

use crate::config::layer_params::FlattenParams;
use crate::error::{Error, Result};
use crate::layers::{Ctx, Layer};
use crate::tensor::Blob;

/// The flatten layer; see the module docs.
#[derive(Debug, Clone)]
pub struct Flatten {
    name: String,
    axis: usize,
    end_axis: i64,
}

impl Flatten {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`FlattenParams`]).
    pub fn new(name: &str, p: &FlattenParams) -> Self {
        Flatten {
            name: name.to_string(),
            axis: p.axis,
            end_axis: p.end_axis,
        }
    }
}

impl Layer for Flatten {
    fn type_name(&self) -> &'static str {
        "flatten"
    }

    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let err = |msg: String| Err(Error::net(&self.name, msg));
        let [shape] = bottoms else {
            return err(format!("takes 1 bottom, got {}", bottoms.len()));
        };
        let rank = shape.len() as i64;
        let end = if self.end_axis < 0 {
            rank + self.end_axis
        } else {
            self.end_axis
        };
        let axis = self.axis as i64;
        if axis >= rank || end < axis || end >= rank {
            return err(format!(
                "axes {} ..= {} are out of range for bottom {shape:?}",
                self.axis, self.end_axis
            ));
        }
        let (a, e) = (axis as usize, end as usize);
        let mut top = shape[..a].to_vec();
        top.push(shape[a..=e].iter().product());
        top.extend_from_slice(&shape[e + 1..]);
        Ok(vec![top])
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        tops[0].data.copy_from_slice(&bottoms[0].data);
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
        if propagate_down[0] {
            for (d, &g) in bottoms[0].diff.iter_mut().zip(&tops[0].diff) {
                *d += g;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};

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
