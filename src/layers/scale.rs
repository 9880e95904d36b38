//! `Scale`: Caffe's broadcast multiplication `top = bottom ⊙ scale (+ bias)`.
//!
//! Shapes: bottom `(d0, …)`; the scale has the shape `d[axis .. axis + num_axes]` (`axis`
//! default 1, `num_axes` default 1, −1 = to the last axis, 0 = a scalar) and is broadcast over
//! the outer axes `d[..axis]` and the inner ones after it. Viewing the bottom as
//! `(outer, dim, inner)`: `top[o, s, i] = bottom[o, s, i] · scale[s] (+ bias[s])`. Top: the bottom's
//! shape.
//!
//! With one bottom the scale is learnable (`filler`, default constant 1), plus a learnable bias
//! when `bias_term` (default false; `bias_filler`, default constant 0): tensors `scale`, `bias`.
//! With two bottoms the second is the scale (its shape gives `num_axes`) and receives the
//! gradient `Σ_{o,i} dtop · bottom`; the optional bias stays learnable.

use crate::config::layer_params::ScaleParams;
use crate::config::FillerConfig;
use crate::error::{Error, Result};
use crate::layers::{Ctx, Layer};
use crate::params::ParamSpec;
use crate::tensor::Blob;

/// How a `(dim)` tensor broadcasts over a bottom viewed as `(outer, dim, inner)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Broadcast {
    pub outer: usize,
    pub dim: usize,
    pub inner: usize,
}

/// The broadcast of Scale and Bias: with one bottom, the axes `axis .. axis + num_axes` of it;
/// with two, the second bottom's shape must equal the first's from `axis`. Returns the
/// broadcast and the shape of the broadcast tensor.
pub(crate) fn broadcast(
    name: &str,
    axis: usize,
    num_axes: i64,
    bottoms: &[&[usize]],
) -> Result<(Broadcast, Vec<usize>)> {
    let err = |msg: String| Err(Error::net(name, msg));
    let shape = match bottoms {
        [s] | [s, _] => *s,
        _ => return err(format!("takes 1 or 2 bottoms, got {}", bottoms.len())),
    };
    if axis >= shape.len() {
        return err(format!(
            "`axis` {axis} is out of range for bottom {shape:?}"
        ));
    }
    let tensor: Vec<usize> = match bottoms {
        [_, second] => {
            let end = axis + second.len();
            if end > shape.len() || shape[axis..end] != **second {
                return err(format!(
                    "the second bottom {second:?} must match the first bottom {shape:?} from axis {axis}"
                ));
            }
            second.to_vec()
        }
        _ => {
            let end = match num_axes {
                -1 => shape.len(),
                n if n >= 0 && axis + n as usize <= shape.len() => axis + n as usize,
                n => {
                    return err(format!(
                        "`num_axes` {n} is out of range for bottom {shape:?} from axis {axis}"
                    ))
                }
            };
            shape[axis..end].to_vec()
        }
    };
    let end = axis + tensor.len();
    Ok((
        Broadcast {
            outer: shape[..axis].iter().product(),
            dim: tensor.iter().product(),
            inner: shape[end..].iter().product(),
        },
        tensor,
    ))
}

/// The scale layer; see the module docs.
#[derive(Debug, Clone)]
pub struct Scale {
    name: String,
    axis: usize,
    num_axes: i64,
    filler: FillerConfig,
    bias_term: bool,
    bias_filler: FillerConfig,
    /// Whether the scale is the second bottom (fixed by the first reshape).
    scale_bottom: bool,
    shape: Vec<usize>,
    b: Broadcast,
}

impl Scale {
    /// The layer `name` with parameters `p`.
    pub fn new(name: &str, p: &ScaleParams) -> Self {
        Scale {
            name: name.to_string(),
            axis: p.axis,
            num_axes: p.num_axes,
            filler: p.filler.clone(),
            bias_term: p.bias_term,
            bias_filler: p.bias_filler.clone(),
            scale_bottom: false,
            shape: Vec::new(),
            b: Broadcast::default(),
        }
    }
}

impl Layer for Scale {
    fn type_name(&self) -> &'static str {
        "scale"
    }

    /// Bottoms `(d0, …)` and optionally the scale; top `(d0, …)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let (b, shape) = broadcast(&self.name, self.axis, self.num_axes, bottoms)?;
        self.b = b;
        self.shape = shape;
        self.scale_bottom = bottoms.len() == 2;
        Ok(vec![bottoms[0].to_vec()])
    }

    /// `scale` (one bottom only), then `bias` when `bias_term`; both of the broadcast shape.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let mut specs = Vec::new();
        if !self.scale_bottom {
            specs.push(ParamSpec {
                name: "scale".into(),
                shape: self.shape.clone(),
                filler: self.filler.clone(),
            });
        }
        if self.bias_term {
            specs.push(ParamSpec {
                name: "bias".into(),
                shape: self.shape.clone(),
                filler: self.bias_filler.clone(),
            });
        }
        specs
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], params: &[&[f32]], tops: &mut [Blob]) {
        let Broadcast { dim, inner, .. } = self.b;
        let (scale, bias) = if self.scale_bottom {
            (&bottoms[1].data[..], params.first().copied())
        } else {
            (params[0], params.get(1).copied())
        };
        let x = &bottoms[0].data;
        let y = &mut tops[0].data;
        for (row, (yr, xr)) in y.chunks_mut(inner).zip(x.chunks(inner)).enumerate() {
            let s = row % dim;
            let (a, c) = (scale[s], bias.map_or(0.0, |b| b[s]));
            for (yv, &xv) in yr.iter_mut().zip(xr) {
                *yv = xv * a + c;
            }
        }
    }

    /// `dbottom += dtop · scale`; `dscale[s] += Σ dtop · bottom`; `dbias[s] += Σ dtop`.
    fn backward(
        &mut self,
        _ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        params: &[&[f32]],
        param_diffs: &mut [&mut [f32]],
    ) {
        let Broadcast { dim, inner, .. } = self.b;
        let dy = &tops[0].diff;
        let (first, rest) = bottoms.split_at_mut(1);
        let x = &mut first[0];
        let learn_scale = !self.scale_bottom;
        let want_scale = learn_scale || propagate_down.get(1) == Some(&true);
        for (row, (dyr, xr)) in dy.chunks(inner).zip(x.data.chunks(inner)).enumerate() {
            let s = row % dim;
            if want_scale {
                let g: f32 = dyr.iter().zip(xr).map(|(a, b)| a * b).sum();
                if learn_scale {
                    param_diffs[0][s] += g;
                } else {
                    rest[0].diff[s] += g;
                }
            }
            if self.bias_term {
                let k = learn_scale as usize;
                param_diffs[k][s] += dyr.iter().sum::<f32>();
            }
        }
        if propagate_down[0] {
            let scale = if learn_scale {
                params[0]
            } else {
                &rest[0].data[..]
            };
            for (row, (dxr, dyr)) in x.diff.chunks_mut(inner).zip(dy.chunks(inner)).enumerate() {
                let a = scale[row % dim];
                for (d, &g) in dxr.iter_mut().zip(dyr) {
                    *d += g * a;
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

    fn scale(extra: &str) -> Scale {
        from_config(
            Scale::new,
            &layer_config(&format!("name = \"s\"\ntype = \"scale\"\n{extra}")),
        )
    }

    #[test]
    fn forward_by_hand() {
        // (1, 2, 3) scaled per channel by [2, −1], bias [0.5, 1].
        let x = blob(&[1, 2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let mut layer = scale("bias_term = true");
        let top = forward(&mut layer, &[x], &[&[2.0, -1.0], &[0.5, 1.0]]);
        assert_eq!(top[0].data, vec![2.5, 4.5, 6.5, -3.0, -4.0, -5.0]);
        assert_eq!(layer.param_specs()[0].shape, vec![2]);
        assert_eq!(layer.param_specs()[0].filler.value, 1.0);
    }

    #[test]
    fn broadcast_shapes() {
        let mut layer = scale("num_axes = 2");
        layer.reshape(&[&[2, 3, 4, 5]]).unwrap();
        assert_eq!(layer.param_specs()[0].shape, vec![3, 4]);
        let mut layer = scale("axis = 2\nnum_axes = -1");
        layer.reshape(&[&[2, 3, 4, 5]]).unwrap();
        assert_eq!(layer.param_specs()[0].shape, vec![4, 5]);
        let mut layer = scale("num_axes = 0");
        layer.reshape(&[&[2, 3]]).unwrap();
        assert_eq!(layer.param_specs()[0].shape, Vec::<usize>::new());
        assert!(scale("num_axes = 4").reshape(&[&[2, 3, 4]]).is_err());
        assert!(scale("").reshape(&[&[2, 3, 4], &[4]]).is_err());
        assert!(scale("").reshape(&[&[2, 3, 4], &[3, 4]]).is_ok());
    }

    #[test]
    fn gradient_one_bottom() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 51);
        GradientChecker::default()
            .check(&mut scale(""), &[x], &[true])
            .unwrap()
            .assert_ok();
    }

    #[test]
    fn gradient_one_bottom_with_bias_over_two_axes() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 52);
        let report = GradientChecker::default()
            .check(&mut scale("num_axes = 2\nbias_term = true"), &[x], &[true])
            .unwrap();
        report.assert_ok();
        assert_eq!(report.checked, 24 + 6 + 6);
    }

    #[test]
    fn gradient_two_bottoms() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 53);
        let s = uniform_blob(&[3, 2], -1.0, 1.0, 54);
        let report = GradientChecker::default()
            .check(&mut scale("bias_term = true"), &[x, s], &[true, true])
            .unwrap();
        report.assert_ok();
        assert_eq!(report.checked, 24 + 6 + 6);
    }
}
