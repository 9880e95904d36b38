//! `Bias`: Caffe's broadcast addition `top = bottom + bias`.
//!
//! Shapes as [`Scale`](crate::layers::scale): the bias has the shape `d[axis .. axis + num_axes]`
//! (`axis` default 1, `num_axes` default 1, −1 = to the last axis) and broadcasts over the rest;
//! top: the bottom's shape. With one bottom the bias is learnable (tensor `bias`, `filler`
//! default constant 0); with two, the second bottom is the bias and gets `Σ_{o,i} dtop`.

use crate::config::layer_params::BiasParams;
use crate::config::FillerConfig;
use crate::error::Result;
use crate::layers::scale::{broadcast, Broadcast};
use crate::layers::{Ctx, Layer};
use crate::params::ParamSpec;
use crate::tensor::Blob;

/// The bias layer; see the module docs.
#[derive(Debug, Clone)]
pub struct Bias {
    name: String,
    axis: usize,
    num_axes: i64,
    filler: FillerConfig,
    /// Whether the bias is the second bottom (fixed by the first reshape).
    bias_bottom: bool,
    shape: Vec<usize>,
    b: Broadcast,
}

impl Bias {
    /// The layer `name` with parameters `p`.
    pub fn new(name: &str, p: &BiasParams) -> Self {
        Bias {
            name: name.to_string(),
            axis: p.axis,
            num_axes: p.num_axes,
            filler: p.filler.clone(),
            bias_bottom: false,
            shape: Vec::new(),
            b: Broadcast::default(),
        }
    }
}

impl Layer for Bias {
    fn type_name(&self) -> &'static str {
        "bias"
    }

    /// Bottoms `(d0, …)` and optionally the bias; top `(d0, …)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let (b, shape) = broadcast(&self.name, self.axis, self.num_axes, bottoms)?;
        self.b = b;
        self.shape = shape;
        self.bias_bottom = bottoms.len() == 2;
        Ok(vec![bottoms[0].to_vec()])
    }

    /// `bias` of the broadcast shape (one bottom only).
    fn param_specs(&self) -> Vec<ParamSpec> {
        if self.bias_bottom {
            return Vec::new();
        }
        vec![ParamSpec {
            name: "bias".into(),
            shape: self.shape.clone(),
            filler: self.filler.clone(),
        }]
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], params: &[&[f32]], tops: &mut [Blob]) {
        let Broadcast { dim, inner, .. } = self.b;
        let bias = if self.bias_bottom {
            &bottoms[1].data[..]
        } else {
            params[0]
        };
        let x = &bottoms[0].data;
        for (row, (yr, xr)) in tops[0]
            .data
            .chunks_mut(inner)
            .zip(x.chunks(inner))
            .enumerate()
        {
            let c = bias[row % dim];
            for (y, &v) in yr.iter_mut().zip(xr) {
                *y = v + c;
            }
        }
    }

    /// `dbottom += dtop`; `dbias[s] += Σ dtop`.
    fn backward(
        &mut self,
        _ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        _params: &[&[f32]],
        param_diffs: &mut [&mut [f32]],
    ) {
        let Broadcast { dim, inner, .. } = self.b;
        let dy = &tops[0].diff;
        if propagate_down[0] {
            for (d, &g) in bottoms[0].diff.iter_mut().zip(dy) {
                *d += g;
            }
        }
        let target: Option<&mut [f32]> = if self.bias_bottom {
            (propagate_down[1]).then(|| &mut bottoms[1].diff[..])
        } else {
            Some(&mut *param_diffs[0])
        };
        if let Some(db) = target {
            for (row, dyr) in dy.chunks(inner).enumerate() {
                db[row % dim] += dyr.iter().sum::<f32>();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward};

    fn bias(extra: &str) -> Bias {
        from_config(
            Bias::new,
            &layer_config(&format!("name = \"b\"\ntype = \"bias\"\n{extra}")),
        )
    }

    #[test]
    fn forward_by_hand() {
        let x = blob(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let top = forward(&mut bias(""), &[x], &[&[10.0, -1.0]]);
        assert_eq!(top[0].data, vec![11.0, 1.0, 13.0, 3.0]);
    }

    #[test]
    fn gradient_one_bottom() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 61);
        let report = GradientChecker::default()
            .check(&mut bias("num_axes = 2"), &[x], &[true])
            .unwrap();
        report.assert_ok();
        assert_eq!(report.checked, 24 + 6);
    }

    #[test]
    fn gradient_two_bottoms() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 62);
        let b = uniform_blob(&[3], -1.0, 1.0, 63);
        GradientChecker::default()
            .check(&mut bias(""), &[x, b], &[true, true])
            .unwrap()
            .assert_ok();
    }
}
