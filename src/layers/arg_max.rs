//! `ArgMax`: Caffe's ArgMax layer, the indices (and optionally the values) of the `top_k`
//! largest values, stored as f32.
//!
//! Without `axis`, each sample's values are searched as one flattened row: bottom `(N, ...)` of
//! `D` values per sample, top `(N, 1, top_k)` of indices, or `(N, 2, top_k)` with
//! `out_max_val` — the indices, then the values (padded with trailing ones to the bottom's
//! rank when it has more than 3 axes, as Caffe does). With `axis`, the search runs along that
//! axis at every other position: the top is the bottom's shape with `shape[axis] = top_k`,
//! holding the indices, or the values with `out_max_val`.
//!
//! Order: larger values first; equal values in decreasing index order (Caffe's
//! `std::greater` on (value, index) pairs); a NaN ranks above every number. `top_k` may not
//! exceed the values searched. No backward (Caffe has none).

use crate::config::layer_params::ArgMaxParams;
use crate::error::{Error, Result};
use crate::layers::{one_bottom, BackwardPass, CpuLayer, ForwardPass, Layer};
use std::cmp::Ordering;

cpu_layer! {
    /// The ArgMax layer; see the module docs.
    pub type ArgMax = CpuLayer<ArgMaxParams, Search>;
}

/// The bottom as rows searched: `rows = count / dim` searches of `dim` values, `stride`
/// (Caffe's `axis_dist`) apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Search {
    /// Values per search.
    pub dim: usize,
    /// Distance between two values of one search (1 without `axis`).
    pub stride: usize,
    /// Searches.
    pub rows: usize,
}

/// Whether `(a, i)` ranks above `(b, j)`: a larger value, or an equal one at a larger index; a
/// NaN ranks above every number (equal NaNs by index).
pub fn ranks_above((a, i): (f32, usize), (b, j): (f32, usize)) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => i > j,
        (false, false) => a > b || (a == b && i > j),
    }
}

impl ArgMaxParams {
    /// The top's offset of result `k` of search `r` (of `Search`), for an index (`value =
    /// false`) or a value.
    pub fn top_offset(&self, s: &Search, r: usize, k: usize, value: bool) -> usize {
        match (self.out_max_val, self.axis) {
            (true, None) => 2 * r * self.top_k + k + if value { self.top_k } else { 0 },
            _ => (r / s.stride * self.top_k + k) * s.stride + r % s.stride,
        }
    }
}

impl ArgMaxParams {
    /// The searches over a bottom of `shape` and the top's shape, or an error naming the layer
    /// `name` (an `axis` past the bottom's axes, a `top_k` above the values searched).
    pub fn plan(&self, name: &str, shape: &[usize]) -> Result<(Search, Vec<usize>)> {
        let count: usize = shape.iter().product();
        let (dim, stride, top) = match self.axis {
            Some(axis) => {
                if axis >= shape.len() {
                    return Err(Error::net(
                        name,
                        format!("`axis` {axis} out of range for bottom {shape:?}"),
                    ));
                }
                let mut top = shape.to_vec();
                top[axis] = self.top_k;
                (shape[axis], shape[axis + 1..].iter().product(), top)
            }
            None => {
                if shape.is_empty() {
                    return Err(Error::net(name, "needs a bottom (N, ...)"));
                }
                let mut top = vec![1; shape.len().max(3)];
                top[0] = shape[0];
                top[1] = if self.out_max_val { 2 } else { 1 };
                top[2] = self.top_k;
                (shape[1..].iter().product(), 1, top)
            }
        };
        if self.top_k > dim {
            return Err(Error::net(
                name,
                format!(
                    "`top_k` {} exceeds the {dim} values searched in bottom {shape:?}",
                    self.top_k
                ),
            ));
        }
        let rows = count.checked_div(dim).unwrap_or(0);
        Ok((Search { dim, stride, rows }, top))
    }
}

impl Layer for ArgMax {
    fn type_name(&self) -> &'static str {
        "arg_max"
    }

    /// One bottom `(N, ...)`; the top as the module docs say.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        let (search, top) = self.settings.plan(&self.name, shape)?;
        self.state = search;
        Ok(vec![top])
    }

    fn has_backward(&self) -> bool {
        false
    }

    /// Not a metric: its top is not one scalar to report.
    fn reports_output(&self) -> bool {
        false
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let (p, s) = (&self.settings, self.state);
        let x = &pass.bottoms[0].data;
        let y = &mut pass.tops[0].data;
        let mut row: Vec<(f32, usize)> = Vec::with_capacity(s.dim);
        for r in 0..s.rows {
            row.clear();
            let first = r / s.stride * s.dim * s.stride + r % s.stride;
            row.extend((0..s.dim).map(|j| (x[first + j * s.stride], j)));
            row.sort_by(|&a, &b| match (ranks_above(a, b), ranks_above(b, a)) {
                (true, _) => Ordering::Less,
                (_, true) => Ordering::Greater,
                _ => Ordering::Equal,
            });
            for (k, &(v, j)) in row.iter().take(p.top_k).enumerate() {
                if p.out_max_val {
                    y[p.top_offset(&s, r, k, true)] = v;
                }
                if !(p.out_max_val && p.axis.is_some()) {
                    y[p.top_offset(&s, r, k, false)] = j as f32;
                }
            }
        }
    }

    fn backward(&mut self, _pass: BackwardPass<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::uniform_blob;
    use crate::layers::test_util::{blob, forward, layer, params_error};

    fn arg_max(keys: &str) -> ArgMax {
        layer::<ArgMaxParams>("arg_max", keys)
    }

    #[test]
    fn flattened_indices_and_values() {
        // Two samples of (2, 2) values.
        let x = blob(&[2, 2, 2], &[0.5, 3.0, -1.0, 2.0, 7.0, 7.0, 1.0, 9.0]);
        let top = forward(&mut arg_max(""), std::slice::from_ref(&x), &[]);
        assert_eq!(
            (top[0].shape.clone(), top[0].data.clone()),
            (vec![2, 1, 1], vec![1.0, 3.0])
        );
        // Top 3 with values: the tie of 7 at indices 0 and 1 goes to the larger index first.
        let top = forward(&mut arg_max("top_k = 3\nout_max_val = true"), &[x], &[]);
        assert_eq!(top[0].shape, vec![2, 2, 3]);
        assert_eq!(
            top[0].data,
            vec![1.0, 3.0, 0.0, 3.0, 2.0, 0.5, 3.0, 1.0, 0.0, 9.0, 7.0, 7.0]
        );
    }

    #[test]
    fn a_4d_bottom_keeps_its_rank() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 61);
        let top = forward(&mut arg_max("top_k = 2"), &[x], &[]);
        assert_eq!(top[0].shape, vec![2, 1, 2, 1]);
    }

    #[test]
    fn along_an_axis() {
        // (N, C, W) = (1, 3, 2): per column w, the channel of the largest value.
        let x = blob(&[1, 3, 2], &[1.0, 5.0, 4.0, -1.0, 2.0, 6.0]);
        let top = forward(&mut arg_max("axis = 1"), std::slice::from_ref(&x), &[]);
        assert_eq!(
            (top[0].shape.clone(), top[0].data.clone()),
            (vec![1, 1, 2], vec![1.0, 2.0])
        );
        let top = forward(
            &mut arg_max("axis = 1\ntop_k = 2\nout_max_val = true"),
            &[x],
            &[],
        );
        assert_eq!(top[0].shape, vec![1, 2, 2]);
        assert_eq!(top[0].data, vec![4.0, 6.0, 2.0, 5.0]);
    }

    #[test]
    fn nan_ranks_first() {
        let x = blob(&[1, 3], &[1.0, f32::NAN, 2.0]);
        let top = forward(&mut arg_max("top_k = 2"), &[x], &[]);
        assert_eq!(top[0].data, vec![1.0, 2.0]);
    }

    #[test]
    fn bad_settings_are_named() {
        assert!(params_error("arg_max", "top_k = 0").contains("`top_k`"));
        assert!(params_error("arg_max", "axis = 0").contains("`axis`"));
        assert!(params_error("arg_max", "alpha = 1.0").contains("`alpha`"));
        let e = arg_max("top_k = 5")
            .reshape(&[&[2, 4]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`top_k` 5"), "{e}");
        assert!(arg_max("axis = 2").reshape(&[&[2, 4]]).is_err());
        assert!(!arg_max("").has_backward());
    }
}
