//! `Broadcast`: how Scale and Bias apply a tensor over some axes of their bottom (Caffe's
//! broadcast). The bottom `(d0, …)` is viewed as `(outer, dim, inner)`, where `dim` is the
//! product of the tensor's axes `d[axis .. axis + num_axes]` (`num_axes` −1: to the last axis, 0:
//! a scalar); row `r` of `inner` elements uses the tensor's element `r mod dim`. With one bottom
//! the tensor is learnable; with two, the second bottom is the tensor and its shape must equal
//! the first bottom's from `axis` (its axes give `num_axes`).

use crate::config::FillerConfig;
use crate::error::{Error, Result};
use crate::layers::{axes_end, check_axis, AxisView};
use crate::params::ParamSpec;

/// The broadcast over the current bottom.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Broadcast {
    /// Whether the tensor is the second bottom (fixed by the reshape).
    pub from_bottom: bool,
    /// The tensor's shape.
    pub shape: Vec<usize>,
    pub outer: usize,
    pub dim: usize,
    pub inner: usize,
}

impl Broadcast {
    /// Checks the bottoms of `layer` (the data, and optionally the tensor) and views the first
    /// as `(outer, dim, inner)` around its axes `axis .. axis + num_axes` (or the second
    /// bottom's); returns the top shape, the first bottom's.
    pub fn reshape(
        &mut self,
        layer: &str,
        (axis, num_axes): (usize, i64),
        bottoms: &[&[usize]],
    ) -> Result<Vec<Vec<usize>>> {
        let err = |msg: String| Err(Error::net(layer, msg));
        let shape = match bottoms {
            [s] | [s, _] => *s,
            _ => return err(format!("takes 1 or 2 bottoms, got {}", bottoms.len())),
        };
        check_axis(layer, axis, shape)?;
        let end = match bottoms {
            [_, second] if shape[axis..].starts_with(second) => axis + second.len(),
            [_, second] => {
                return err(format!(
                    "the second bottom {second:?} must match the first bottom {shape:?} from axis {axis}"
                ))
            }
            _ => match axes_end(axis, num_axes, shape.len()) {
                Some(end) => end,
                None => {
                    return err(format!(
                        "`num_axes` {num_axes} is out of range for bottom {shape:?} from axis {axis}"
                    ))
                }
            },
        };
        let AxisView { outer, dim, inner } = AxisView::around(shape, axis..end);
        *self = Broadcast {
            from_bottom: bottoms.len() == 2,
            shape: shape[axis..end].to_vec(),
            outer,
            dim,
            inner,
        };
        Ok(vec![shape.to_vec()])
    }

    /// The learnable tensor `name` of the broadcast shape, filled by `filler`.
    pub fn spec(&self, name: &str, filler: &FillerConfig) -> ParamSpec {
        ParamSpec::new(name, self.shape.clone(), filler)
    }

    /// `sums[s] += Σ` of the rows of `values` (the bottom's layout) that use element `s`: the
    /// gradient of a broadcast bias from the top's.
    pub fn add_row_sums(&self, values: &[f32], sums: &mut [f32]) {
        for (row, vs) in values.chunks(self.inner).enumerate() {
            sums[row % self.dim] += vs.iter().sum::<f32>();
        }
    }
}
