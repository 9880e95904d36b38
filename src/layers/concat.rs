//! `Concat`: Caffe's concatenation of one or more bottoms along `axis` (default 1, channels).
//!
//! Shapes: bottoms `(d0, …, a_b, …)` that agree on every axis but `axis`; top the same with
//! `Σ_b a_b` at `axis`. Viewing each bottom as `(outer, a_b·inner)`, the top row `o` is the
//! concatenation of the bottoms' rows `o`; backward adds each slice of `dtop` back to its bottom.
//! [`Rows`] does both ways for Slice too (`crate::layers::slice`), which cuts where this joins.

use crate::config::layer_params::ConcatParams;
use crate::error::{Error, Result};
use crate::layers::{check_axis, AxisView, BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The concatenation layer; see the module docs.
    pub type Concat = CpuLayer<ConcatParams, Rows>;
}

/// Every bottom and the top viewed as rows: `outer` rows of `width_b` elements (`a_b · inner`)
/// per bottom, of their sum for the top.
#[derive(Debug, Clone, Default)]
pub struct Rows {
    outer: usize,
    widths: Vec<usize>,
}

impl Layer for Concat {
    fn type_name(&self) -> &'static str {
        "concat"
    }

    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let err = |msg: String| Err(Error::net(&self.name, msg));
        let Some(first) = bottoms.first() else {
            return err("takes 1 or more bottoms, got 0".into());
        };
        let axis = self.settings.axis;
        check_axis(&self.name, axis, first)?;
        let mut top = first.to_vec();
        top[axis] = 0;
        for b in bottoms {
            let agree = b.len() == first.len()
                && b.iter()
                    .zip(first.iter())
                    .enumerate()
                    .all(|(i, (x, y))| i == axis || x == y);
            if !agree {
                return err(format!(
                    "bottoms {first:?} and {b:?} differ on an axis other than {axis}"
                ));
            }
            top[axis] += b[axis];
        }
        let AxisView { outer, inner, .. } = AxisView::around(first, axis..axis + 1);
        self.state = Rows {
            outer,
            widths: bottoms.iter().map(|b| b[axis] * inner).collect(),
        };
        Ok(vec![top])
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let pieces = pass.bottoms.iter().map(|b| &b.data[..]);
        self.state.join(pieces, &mut pass.tops[0].data, false);
    }

    fn backward(&mut self, pass: BackwardPass<'_>) {
        let pieces = pass.bottoms.iter_mut().zip(pass.propagate_down);
        let pieces = pieces.map(|(b, &down)| down.then_some(&mut b.diff[..]));
        self.state.cut(&pass.tops[0].diff, pieces, true);
    }
}

impl Rows {
    /// The rows of pieces of `widths` (per row) side by side in blobs of `outer` rows.
    pub(crate) fn new(outer: usize, widths: Vec<usize>) -> Self {
        Rows { outer, widths }
    }

    /// `whole (outer, Σ width)` ← (or `+=` with `add`) the pieces `(outer, width_k)` side by
    /// side in each row.
    pub(crate) fn join<'p>(
        &self,
        pieces: impl Iterator<Item = &'p [f32]>,
        whole: &mut [f32],
        add: bool,
    ) {
        let total: usize = self.widths.iter().sum();
        let mut start = 0;
        for (piece, &w) in pieces.zip(&self.widths) {
            for o in 0..self.outer {
                put(
                    &mut whole[o * total + start..o * total + start + w],
                    &piece[o * w..(o + 1) * w],
                    add,
                );
            }
            start += w;
        }
    }

    /// Each piece given (`Some`) ← (or `+=` with `add`) its columns of `whole (outer, Σ
    /// width)`; `None` pieces are skipped.
    pub(crate) fn cut<'p>(
        &self,
        whole: &[f32],
        pieces: impl Iterator<Item = Option<&'p mut [f32]>>,
        add: bool,
    ) {
        let total: usize = self.widths.iter().sum();
        let mut start = 0;
        for (piece, &w) in pieces.zip(&self.widths) {
            if let Some(piece) = piece {
                for o in 0..self.outer {
                    put(
                        &mut piece[o * w..(o + 1) * w],
                        &whole[o * total + start..o * total + start + w],
                        add,
                    );
                }
            }
            start += w;
        }
    }
}

/// `dst ← src`, or `dst += src` with `add`.
fn put(dst: &mut [f32], src: &[f32], add: bool) {
    match add {
        true => dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s),
        false => dst.copy_from_slice(src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    fn concat(keys: &str) -> Concat {
        layer::<ConcatParams>("concat", keys)
    }

    #[test]
    fn forward_by_hand() {
        let a = blob(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = blob(&[2, 2, 2], &[5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        let top = forward(&mut concat(""), &[a.clone(), b], &[]);
        assert_eq!(top[0].shape, vec![2, 3, 2]);
        assert_eq!(
            top[0].data,
            vec![1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 3.0, 4.0, 9.0, 10.0, 11.0, 12.0]
        );
        let c = blob(&[2, 1, 1], &[0.5, 0.25]);
        let top = forward(&mut concat("axis = 2"), &[a, c], &[]);
        assert_eq!(top[0].data, vec![1.0, 2.0, 0.5, 3.0, 4.0, 0.25]);
    }

    #[test]
    fn gradient_axis_1() {
        let bottoms = [
            uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 81),
            uniform_blob(&[2, 1, 2, 2], -1.0, 1.0, 82),
            uniform_blob(&[2, 2, 2, 2], -1.0, 1.0, 83),
        ];
        GradientChecker::default().assert_passes(&mut concat(""), &bottoms, &[true, false, true]);
    }

    #[test]
    fn gradient_axis_2() {
        let bottoms = [
            uniform_blob(&[2, 3, 1, 2], -1.0, 1.0, 84),
            uniform_blob(&[2, 3, 3, 2], -1.0, 1.0, 85),
        ];
        GradientChecker::default().assert_passes(&mut concat("axis = 2"), &bottoms, &[true, true]);
    }

    #[test]
    fn rejects_mismatched_bottoms() {
        assert!(concat("").reshape(&[&[2, 3, 4], &[2, 3, 5]]).is_err());
        assert!(concat("axis = 3").reshape(&[&[2, 3, 4]]).is_err());
        assert!(concat("").reshape(&[]).is_err());
    }
}
