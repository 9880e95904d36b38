//! `Softmax`: Caffe's softmax over `axis` (default 1). The bottom `(d0, …)` is viewed as
//! `(outer, C, inner)` with `C = d_axis`; each of the `outer·inner` fibres along `C` is normalised
//! (stably, after subtracting its maximum). Top: the bottom's shape.
//! Backward: `dx = y ⊙ (dy − Σ_c dy·y)` per fibre.

use crate::config::layer_params::SoftmaxParams;
use crate::error::Result;
use crate::layers::{check_axis, one_bottom, AxisView, BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The softmax layer; see the module docs. Its state: the bottom viewed as `(outer, C, inner)`.
    pub type Softmax = CpuLayer<SoftmaxParams, AxisView>;
}

impl Layer for Softmax {
    fn type_name(&self) -> &'static str {
        "softmax"
    }

    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        let axis = self.settings.axis;
        check_axis(&self.name, axis, shape)?;
        self.state = AxisView::around(shape, axis..axis + 1);
        Ok(vec![shape.to_vec()])
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let AxisView {
            outer,
            dim: c,
            inner,
        } = self.state;
        let x = &pass.bottoms[0].data;
        let y = &mut pass.tops[0].data;
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| (o * c + k) * inner + i;
                let max = (0..c).map(|k| x[at(k)]).fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for k in 0..c {
                    let e = (x[at(k)] - max).exp();
                    y[at(k)] = e;
                    sum += e;
                }
                for k in 0..c {
                    y[at(k)] /= sum;
                }
            }
        }
    }

    fn backward(&mut self, pass: BackwardPass<'_>) {
        let Some((top, bottom)) = pass.top_and_bottom() else {
            return;
        };
        let AxisView {
            outer,
            dim: c,
            inner,
        } = self.state;
        let (y, dy, dx) = (&top.data, &top.diff, &mut bottom.diff);
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| (o * c + k) * inner + i;
                let dot: f32 = (0..c).map(|k| dy[at(k)] * y[at(k)]).sum();
                for k in 0..c {
                    dx[at(k)] += y[at(k)] * (dy[at(k)] - dot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    #[test]
    fn forward_by_hand() {
        // Axis 1 of (1, 2, 2): fibres (0, ln 3) and (1, 1).
        let x = blob(&[1, 2, 2], &[0.0, 1.0, 3f32.ln(), 1.0]);
        let top = forward(&mut layer::<SoftmaxParams>("softmax", ""), &[x], &[]);
        let want = [0.25, 0.5, 0.75, 0.5];
        for (a, b) in top[0].data.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{:?}", top[0].data);
        }
    }

    #[test]
    fn gradient_axis_1_and_2() {
        for keys in ["", "axis = 2"] {
            let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 93);
            let mut softmax = layer::<SoftmaxParams>("softmax", keys);
            GradientChecker::default().assert_passes(&mut softmax, &[x], &[true]);
        }
    }
}
