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
use crate::error::Result;
use crate::layers::broadcast::Broadcast;
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};
use crate::params::ParamSpec;

cpu_layer! {
    /// The scale layer; see the module docs.
    pub type Scale = CpuLayer<ScaleParams, Broadcast>;
}

impl Layer for Scale {
    fn type_name(&self) -> &'static str {
        "scale"
    }

    /// Bottoms `(d0, …)` and optionally the scale; top `(d0, …)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let axes = (self.settings.axis, self.settings.num_axes);
        self.state.reshape(&self.name, axes, bottoms)
    }

    /// `scale` (one bottom only), then `bias` when `bias_term`; both of the broadcast shape.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let s = &self.settings;
        let scale = (!self.state.from_bottom).then(|| self.state.spec("scale", &s.filler));
        let bias = s.bias_term.then(|| self.state.spec("bias", &s.bias_filler));
        scale.into_iter().chain(bias).collect()
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let Broadcast { dim, inner, .. } = self.state;
        let (scale, bias) = match self.state.from_bottom {
            true => (&pass.bottoms[1].data[..], pass.params.first().copied()),
            false => (pass.params[0], pass.params.get(1).copied()),
        };
        let x = &pass.bottoms[0].data;
        let y = &mut pass.tops[0].data;
        for (row, (yr, xr)) in y.chunks_mut(inner).zip(x.chunks(inner)).enumerate() {
            let s = row % dim;
            let (a, c) = (scale[s], bias.map_or(0.0, |b| b[s]));
            for (yv, &xv) in yr.iter_mut().zip(xr) {
                *yv = xv * a + c;
            }
        }
    }

    /// `dbottom += dtop · scale`; `dscale[s] += Σ dtop · bottom`; `dbias[s] += Σ dtop`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let Broadcast { dim, inner, .. } = self.state;
        let (dy, propagate_down, param_diffs) =
            (&pass.tops[0].diff, pass.propagate_down, pass.param_diffs);
        let (first, rest) = pass.bottoms.split_at_mut(1);
        let x = &mut first[0];
        let learn_scale = !self.state.from_bottom;
        let want_scale = learn_scale || propagate_down.get(1) == Some(&true);
        if want_scale {
            let ds = match learn_scale {
                true => &mut *param_diffs[0],
                false => &mut rest[0].diff[..],
            };
            for (row, (dyr, xr)) in dy.chunks(inner).zip(x.data.chunks(inner)).enumerate() {
                ds[row % dim] += dyr.iter().zip(xr).map(|(a, b)| a * b).sum::<f32>();
            }
        }
        if self.settings.bias_term {
            self.state
                .add_row_sums(dy, param_diffs[learn_scale as usize]);
        }
        if propagate_down[0] {
            let scale = match learn_scale {
                true => pass.params[0],
                false => &rest[0].data[..],
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
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    fn scale(keys: &str) -> Scale {
        layer::<ScaleParams>("scale", keys)
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
        GradientChecker::default().assert_passes(&mut scale(""), &[x], &[true]);
    }

    #[test]
    fn gradient_one_bottom_with_bias_over_two_axes() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 52);
        let mut layer = scale("num_axes = 2\nbias_term = true");
        let report = GradientChecker::default().assert_passes(&mut layer, &[x], &[true]);
        assert_eq!(report.checked, 24 + 6 + 6);
    }

    #[test]
    fn gradient_two_bottoms() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 53);
        let s = uniform_blob(&[3, 2], -1.0, 1.0, 54);
        let mut layer = scale("bias_term = true");
        let report = GradientChecker::default().assert_passes(&mut layer, &[x, s], &[true, true]);
        assert_eq!(report.checked, 24 + 6 + 6);
    }
}
