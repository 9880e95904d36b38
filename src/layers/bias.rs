//! `Bias`: Caffe's broadcast addition `top = bottom + bias`.
//!
//! Shapes as [`Scale`](crate::layers::scale) (the [`Broadcast`] rules): the bias has the shape
//! `d[axis .. axis + num_axes]` (`axis` default 1, `num_axes` default 1, −1 = to the last axis)
//! and broadcasts over the rest; top: the bottom's shape. With one bottom the bias is learnable
//! (tensor `bias`, `filler` default constant 0); with two, the second bottom is the bias and gets
//! `Σ_{o,i} dtop`.

use crate::config::layer_params::BiasParams;
use crate::error::Result;
use crate::layers::broadcast::Broadcast;
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};
use crate::params::ParamSpec;

cpu_layer! {
    /// The bias layer; see the module docs.
    pub type Bias = CpuLayer<BiasParams, Broadcast>;
}

impl Layer for Bias {
    fn type_name(&self) -> &'static str {
        "bias"
    }

    /// Bottoms `(d0, …)` and optionally the bias; top `(d0, …)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let axes = (self.settings.axis, self.settings.num_axes);
        self.state.reshape(&self.name, axes, bottoms)
    }

    /// `bias` of the broadcast shape (one bottom only).
    fn param_specs(&self) -> Vec<ParamSpec> {
        match self.state.from_bottom {
            true => Vec::new(),
            false => vec![self.state.spec("bias", &self.settings.filler)],
        }
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let Broadcast { dim, inner, .. } = self.state;
        let bias = match self.state.from_bottom {
            true => &pass.bottoms[1].data[..],
            false => pass.params[0],
        };
        let x = &pass.bottoms[0].data;
        let rows = pass.tops[0].data.chunks_mut(inner).zip(x.chunks(inner));
        for (row, (yr, xr)) in rows.enumerate() {
            let c = bias[row % dim];
            for (y, &v) in yr.iter_mut().zip(xr) {
                *y = v + c;
            }
        }
    }

    /// `dbottom += dtop`; `dbias[s] += Σ dtop`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let (dy, propagate_down, bottoms) = (&pass.tops[0].diff, pass.propagate_down, pass.bottoms);
        if propagate_down[0] {
            for (d, &g) in bottoms[0].diff.iter_mut().zip(dy) {
                *d += g;
            }
        }
        let db: Option<&mut [f32]> = match self.state.from_bottom {
            true => propagate_down[1].then(|| &mut bottoms[1].diff[..]),
            false => Some(&mut *pass.param_diffs[0]),
        };
        if let Some(db) = db {
            self.state.add_row_sums(dy, db);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};

    fn bias(keys: &str) -> Bias {
        layer::<BiasParams>("bias", keys)
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
        let report =
            GradientChecker::default().assert_passes(&mut bias("num_axes = 2"), &[x], &[true]);
        assert_eq!(report.checked, 24 + 6);
    }

    #[test]
    fn gradient_two_bottoms() {
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 62);
        let b = uniform_blob(&[3], -1.0, 1.0, 63);
        GradientChecker::default().assert_passes(&mut bias(""), &[x, b], &[true, true]);
    }
}
