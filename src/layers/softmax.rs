//! `Softmax`: Caffe's softmax over `axis` (default 1). The bottom `(d0, …)` is viewed as
//! `(outer, C, inner)` with `C = d_axis`; each of the `outer·inner` fibres along `C` is normalised
//! (stably, after subtracting its maximum). Top: the bottom's shape.
//! Backward: `dx = y ⊙ (dy − Σ_c dy·y)` per fibre.

use crate::config::layer_params::SoftmaxParams;
use crate::error::{Error, Result};
use crate::layers::{one_bottom, Ctx, Layer};
use crate::tensor::Blob;

/// The softmax layer; see the module docs.
#[derive(Debug, Clone)]
pub struct Softmax {
    name: String,
    axis: usize,
    outer: usize,
    channels: usize,
    inner: usize,
}

impl Softmax {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`SoftmaxParams`]).
    pub fn new(name: &str, p: &SoftmaxParams) -> Self {
        Softmax {
            name: name.to_string(),
            axis: p.axis,
            outer: 0,
            channels: 0,
            inner: 0,
        }
    }
}

impl Layer for Softmax {
    fn type_name(&self) -> &'static str {
        "softmax"
    }

    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        if self.axis >= shape.len() {
            return Err(Error::net(
                &self.name,
                format!("`axis` {} is out of range for bottom {shape:?}", self.axis),
            ));
        }
        self.outer = shape[..self.axis].iter().product();
        self.channels = shape[self.axis];
        self.inner = shape[self.axis + 1..].iter().product();
        Ok(vec![shape.to_vec()])
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        let (c, inner) = (self.channels, self.inner);
        let x = &bottoms[0].data;
        let y = &mut tops[0].data;
        for o in 0..self.outer {
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
        let (c, inner) = (self.channels, self.inner);
        let (y, dy) = (&tops[0].data, &tops[0].diff);
        let dx = &mut bottoms[0].diff;
        for o in 0..self.outer {
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
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward};

    fn softmax(extra: &str) -> Softmax {
        from_config(
            Softmax::new,
            &layer_config(&format!("name = \"s\"\ntype = \"softmax\"\n{extra}")),
        )
    }

    #[test]
    fn forward_by_hand() {
        // Axis 1 of (1, 2, 2): fibres (0, ln 3) and (1, 1).
        let x = blob(&[1, 2, 2], &[0.0, 1.0, 3f32.ln(), 1.0]);
        let top = forward(&mut softmax(""), &[x], &[]);
        let want = [0.25, 0.5, 0.75, 0.5];
        for (a, b) in top[0].data.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{:?}", top[0].data);
        }
    }

    #[test]
    fn gradient_axis_1_and_2() {
        for extra in ["", "axis = 2"] {
            let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 93);
            GradientChecker::default()
                .check(&mut softmax(extra), &[x], &[true])
                .unwrap()
                .assert_ok();
        }
    }
}
