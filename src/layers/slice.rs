//! `Slice`: Caffe's cut of one bottom along `axis` (default 1, channels) into one piece per
//! top, the inverse of [`Concat`](crate::layers::concat).
//!
//! Shapes: bottom `(d0, …, a, …)`; top `t` the same with `a_t` at `axis`, where the pieces
//! start at `0, slice_point[0], slice_point[1], …` (as many points as tops − 1, each inside the
//! axis) or, without `slice_point`, `a_t = a / tops` (which must divide; the number of tops is
//! the config's, kept in the parameters). Viewed as
//! `(outer, a·inner)` rows, forward copies each top's columns out of every row and backward
//! adds them back into the bottom's gradient, with Concat's [`Rows`].

use crate::config::layer_params::SliceParams;
use crate::error::{Error, Result};
use crate::layers::concat::Rows;
use crate::layers::{check_axis, one_bottom, AxisView, BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The slicing layer; see the module docs.
    pub type Slice = CpuLayer<SliceParams, Rows>;
}

impl SliceParams {
    /// The length along the axis of each top's piece of an axis of `dim`, or why it cannot be
    /// cut so.
    pub fn pieces(&self, dim: usize) -> std::result::Result<Vec<usize>, String> {
        let (points, tops) = (&self.slice_point, self.tops);
        if tops == 0 {
            return Err("needs at least 1 top".into());
        }
        if points.is_empty() {
            if !dim.is_multiple_of(tops) {
                return Err(format!(
                    "cannot cut axis {} of length {dim} into {tops} equal pieces (give \
                     `slice_point`)",
                    self.axis
                ));
            }
            return Ok(vec![dim / tops; tops]);
        }
        if points.len() + 1 != tops {
            return Err(format!(
                "`slice_point` has {} points, which cut {} pieces, but the layer has {tops} tops",
                points.len(),
                points.len() + 1
            ));
        }
        if let Some(&last) = points.last().filter(|&&p| p >= dim) {
            return Err(format!(
                "`slice_point` {last} is not inside axis {} of length {dim}",
                self.axis
            ));
        }
        let starts = std::iter::once(0).chain(points.iter().copied());
        let ends = points.iter().copied().chain(std::iter::once(dim));
        Ok(starts.zip(ends).map(|(a, b)| b - a).collect())
    }
}

impl Layer for Slice {
    fn type_name(&self) -> &'static str {
        "slice"
    }

    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        let axis = self.settings.axis;
        check_axis(&self.name, axis, shape)?;
        let pieces = self
            .settings
            .pieces(shape[axis])
            .map_err(|m| Error::net(&self.name, m))?;
        let AxisView { outer, inner, .. } = AxisView::around(shape, axis..axis + 1);
        self.state = Rows::new(outer, pieces.iter().map(|a| a * inner).collect());
        Ok(pieces
            .iter()
            .map(|&a| {
                let mut top = shape.to_vec();
                top[axis] = a;
                top
            })
            .collect())
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let pieces = pass.tops.iter_mut().map(|t| Some(&mut t.data[..]));
        self.state.cut(&pass.bottoms[0].data, pieces, false);
    }

    fn backward(&mut self, pass: BackwardPass<'_>) {
        if pass.propagate_down[0] {
            let pieces = pass.tops.iter().map(|t| &t.diff[..]);
            self.state.join(pieces, &mut pass.bottoms[0].diff, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer, params_error};
    use crate::tensor::Blob;

    /// A slice layer of `tops` tops with the keys `keys`.
    fn slice(tops: usize, keys: &str) -> Slice {
        let names: Vec<String> = (0..tops).map(|t| format!("t{t}")).collect();
        layer::<SliceParams>("slice", &format!("top = {names:?}\n{keys}"))
    }

    /// Forward of `layer` over `bottom`.
    fn run(layer: &mut Slice, bottom: Blob) -> Vec<Blob> {
        forward(layer, &[bottom], &[])
    }

    #[test]
    fn forward_by_hand() {
        // (2, 3, 2): channels [0], [1, 2] at slice_point 1.
        let x = blob(
            &[2, 3, 2],
            &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.],
        );
        let tops = run(&mut slice(2, "slice_point = [1]"), x.clone());
        assert_eq!(tops[0].shape, vec![2, 1, 2]);
        assert_eq!(tops[0].data, vec![1., 2., 7., 8.]);
        assert_eq!(tops[1].shape, vec![2, 2, 2]);
        assert_eq!(tops[1].data, vec![3., 4., 5., 6., 9., 10., 11., 12.]);
        // Three equal pieces of the channels.
        let tops = run(&mut slice(3, ""), x.clone());
        assert_eq!(tops[2].data, vec![5., 6., 11., 12.]);
        // Axis 2 in two equal pieces.
        let tops = run(&mut slice(2, "axis = 2"), x);
        assert_eq!(tops[0].data, vec![1., 3., 5., 7., 9., 11.]);
        assert_eq!(tops[1].data, vec![2., 4., 6., 8., 10., 12.]);
    }

    /// Slice undoes Concat: concatenating the pieces gives the bottom back.
    #[test]
    fn concat_of_the_pieces_is_the_bottom() {
        let x = uniform_blob(&[2, 7, 3, 2], -1.0, 1.0, 5);
        let pieces = run(&mut slice(4, "slice_point = [2, 3, 6]"), x.clone());
        let mut concat = layer::<crate::config::layer_params::ConcatParams>("concat", "");
        let joined = forward(&mut concat, &pieces, &[]);
        assert_eq!(joined[0].shape, x.shape);
        assert_eq!(joined[0].data, x.data);
    }

    #[test]
    fn gradient_slice_points() {
        let bottom = uniform_blob(&[2, 5, 2, 3], -1.0, 1.0, 91);
        let mut l = slice(3, "slice_point = [1, 3]");
        GradientChecker::default().assert_passes(&mut l, &[bottom], &[true]);
    }

    #[test]
    fn gradient_equal_pieces_axis_3() {
        let bottom = uniform_blob(&[2, 3, 2, 4], -1.0, 1.0, 92);
        GradientChecker::default().assert_passes(&mut slice(2, "axis = 3"), &[bottom], &[true]);
    }

    #[test]
    fn rejects_bad_cuts() {
        assert!(params_error("slice", "slice_point = [2, 2]").contains("slice_point"));
        assert!(params_error("slice", "slice_point = [0]").contains("slice_point"));
        assert!(params_error("slice", "axis = 4").contains("axis"));
        let err = slice(2, "slice_point = [3]")
            .reshape(&[&[2, 3, 4]])
            .unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("slice_point") && err.contains("length 3"),
            "{err}"
        );
        let err = slice(3, "slice_point = [3]")
            .reshape(&[&[2, 5, 4]])
            .unwrap_err();
        assert!(err.to_string().contains("3 tops"), "{err}");
        let err = slice(2, "").reshape(&[&[2, 5]]).unwrap_err().to_string();
        assert!(err.contains("equal pieces"), "{err}");
    }
}
