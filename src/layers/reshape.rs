//! `Reshape`: Caffe's reshape. The axes `axis .. axis + num_axes` of the bottom (`axis` default
//! 0, `num_axes` default −1 = to the end) are replaced by `shape`, where 0 copies the bottom's
//! dimension at the same position and −1 (at most once) is inferred from the element count. The
//! batch axis must come out unchanged (`shape = [0, -1]` flattens a sample). The data is copied;
//! the gradient passes through unchanged.

use crate::config::layer_params::ReshapeParams;
use crate::error::{Error, Result};
use crate::layers::reshaping::{ReshapingLayer, ShapeRule};
use crate::layers::{axes_end, BuildCpu};

/// The reshape layer; see the module docs.
pub type Reshape = ReshapingLayer<ReshapeParams>;

impl BuildCpu for ReshapeParams {
    type Layer = Reshape;

    fn build(&self, name: &str) -> Reshape {
        ReshapingLayer::with_rule(name, self.clone())
    }
}

/// Replaces the axes `axis .. axis + num_axes` by `shape` (0 copies, −1 infers).
impl ShapeRule for ReshapeParams {
    const TYPE_NAME: &'static str = "reshape";

    fn top_shape(&self, layer: &str, bottom: &[usize]) -> Result<Vec<usize>> {
        let err = |msg: String| Err(Error::net(layer, msg));
        let axis = self.axis;
        let Some(end) = axes_end(axis, self.num_axes, bottom.len()) else {
            return err(format!(
                "`num_axes` {} from axis {axis} is out of range for bottom {bottom:?}",
                self.num_axes
            ));
        };
        if axis > bottom.len() {
            return err(format!(
                "`axis` {axis} is out of range for bottom {bottom:?}"
            ));
        }
        let mut top = bottom[..axis].to_vec();
        let mut infer = None;
        for (i, &d) in self.shape.iter().enumerate() {
            match d {
                0 => match bottom.get(axis + i) {
                    Some(&b) => top.push(b),
                    None => {
                        return err(format!(
                            "`shape[{i}]` = 0 copies axis {} that bottom {bottom:?} lacks",
                            axis + i
                        ))
                    }
                },
                -1 => {
                    infer = Some(top.len());
                    top.push(1);
                }
                d => top.push(d as usize),
            }
        }
        top.extend_from_slice(&bottom[end..]);
        let count: usize = bottom.iter().product();
        if let Some(at) = infer {
            let rest: usize = top.iter().product();
            if rest == 0 || !count.is_multiple_of(rest) {
                return err(format!(
                    "cannot infer the −1 of `shape` {:?}: bottom {bottom:?} has {count} elements",
                    self.shape
                ));
            }
            top[at] = count / rest;
        }
        if top.iter().product::<usize>() != count {
            return err(format!(
                "`shape` {:?} gives {top:?}, which does not hold the {count} elements of bottom {bottom:?}",
                self.shape
            ));
        }
        if top.first() != bottom.first() {
            return err(format!(
                "`shape` {:?} gives {top:?}: the batch axis of bottom {bottom:?} must stay first and unchanged",
                self.shape
            ));
        }
        Ok(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{layer, params_error};
    use crate::layers::Layer;

    fn reshape(keys: &str) -> Reshape {
        layer::<ReshapeParams>("reshape", keys)
    }

    #[test]
    fn shapes_with_0_and_minus_1() {
        let s: &[usize] = &[2, 3, 4, 5];
        let top = |extra: &str| reshape(extra).reshape(&[s]).map(|mut t| t.remove(0));
        assert_eq!(top("shape = [0, -1]").unwrap(), vec![2, 60]);
        assert_eq!(top("shape = [0, 0, -1, 10]").unwrap(), vec![2, 3, 2, 10]);
        assert_eq!(top("shape = [-1, 2]\naxis = 2").unwrap(), vec![2, 3, 10, 2]);
        assert_eq!(
            top("shape = [2, 2]\naxis = 2\nnum_axes = 1").unwrap(),
            vec![2, 3, 2, 2, 5]
        );
        assert!(top("shape = [-1, 6]").is_err()); // batch 20
        assert!(top("shape = [0, 7, -1]").is_err());
        assert!(top("shape = [0, 59]").is_err());
        assert!(params_error("reshape", "shape = [-1, -1]").contains("shape"));
    }

    #[test]
    fn gradient() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 92);
        GradientChecker::default().assert_passes(&mut reshape("shape = [0, -1, 3]"), &[x], &[true]);
    }
}
