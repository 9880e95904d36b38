//! `Lrn`: Caffe's local response normalisation. Bottom `(N, C, H, W)`; top the same shape.
//!
//! Each value `x_i` is divided by a power of the sum of squares over a window `W(i)` of
//! `local_size` (odd, `2p + 1`) centred on it, clipped at the edges:
//!
//! - `across_channels` (default): the channels `c − p ..= c + p` at the same position,
//!   `s_i = k + (alpha / local_size) · Σ_{j∈W(i)} x_j²`;
//! - `within_channel`: the `local_size × local_size` square around `(h, w)` in channel `c`,
//!   `s_i = 1 + alpha · (Σ_{j∈W(i)} x_j²) / local_size²` (Caffe's average pooling over the
//!   padded square divides by the full `local_size²`; `k` takes no part, as in Caffe);
//!
//! and `y_i = x_i · s_i^(−beta)`. Written as `s_i = k' + c · (Σ x_j² / d)` with `(k', c, d)` =
//! `(k, alpha / local_size, 1)` or `(1, alpha, local_size²)`.
//!
//! Backward (the windows are symmetric): `dx_i += dy_i · s_i^(−beta) − (2 · beta · c / d) · x_i ·
//! Σ_{j∈W(i)} dy_j · y_j / s_j`. The sums run over the window in index order (channel, or row
//! then column), in f32, as the GPU kernels run them.

use crate::config::layer_params::LrnParams;
use crate::config::NormRegion;
use crate::error::{Error, Result};
use crate::layers::{one_bottom, BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// Local response normalisation; see the module docs.
    pub type Lrn = CpuLayer<LrnParams, Scales>;
}

/// The bottom's shape and the `s` of the last forward.
#[derive(Debug, Clone, Default)]
pub struct Scales {
    /// `(N, C, H, W)`.
    shape: [usize; 4],
    /// `(N, C, H, W)` denominators `s` before the power.
    scale: Vec<f32>,
}

impl LrnParams {
    /// `(k', c, d)` of the module docs: `s = k' + c · (Σ x² / d)`.
    pub fn scale_terms(&self) -> (f32, f32, f32) {
        let n = self.local_size as f32;
        match self.norm_region {
            NormRegion::AcrossChannels => (self.k, self.alpha / n, 1.0),
            NormRegion::WithinChannel => (1.0, self.alpha, n * n),
        }
    }

    /// `2 · beta · c / d`, the factor of the window sum in the backward.
    pub fn gradient_factor(&self) -> f32 {
        let (_, c, d) = self.scale_terms();
        2.0 * self.beta * c / d
    }
}

impl Lrn {
    /// Calls `f` with the flat index of every value of the window of value `i`, in index order.
    fn window(&self, i: usize, mut f: impl FnMut(usize)) {
        let [_, c, h, w] = self.state.shape;
        let p = self.settings.local_size / 2;
        let range = |at: usize, len: usize| at.saturating_sub(p)..(at + p + 1).min(len);
        let (x, rest) = (i % w, i / w);
        let (y, rest) = (rest % h, rest / h);
        let (ch, n) = (rest % c, rest / c);
        match self.settings.norm_region {
            NormRegion::AcrossChannels => {
                for cj in range(ch, c) {
                    f(((n * c + cj) * h + y) * w + x);
                }
            }
            NormRegion::WithinChannel => {
                for yj in range(y, h) {
                    for xj in range(x, w) {
                        f(((n * c + ch) * h + yj) * w + xj);
                    }
                }
            }
        }
    }
}

impl Layer for Lrn {
    fn type_name(&self) -> &'static str {
        "lrn"
    }

    /// One bottom `(N, C, H, W)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        let &[n, c, h, w] = shape else {
            return Err(Error::net(
                &self.name,
                format!("needs a 4-D (N, C, H, W) bottom, got {shape:?}"),
            ));
        };
        self.state.shape = [n, c, h, w];
        self.state.scale.resize(n * c * h * w, 0.0);
        Ok(vec![shape.to_vec()])
    }

    /// `s_i = k' + c · (Σ_{W(i)} x² / d)`, `y_i = x_i · s_i^(−beta)`.
    fn forward(&mut self, pass: ForwardPass<'_>) {
        let (k, c, d) = self.settings.scale_terms();
        let beta = self.settings.beta;
        let x = &pass.bottoms[0].data;
        let mut scale = std::mem::take(&mut self.state.scale);
        for (i, (s, y)) in scale.iter_mut().zip(&mut pass.tops[0].data).enumerate() {
            let mut sum = 0.0f32;
            self.window(i, |j| sum += x[j] * x[j]);
            *s = k + c * (sum / d);
            *y = x[i] * s.powf(-beta);
        }
        self.state.scale = scale;
    }

    /// `dx_i += dy_i · s_i^(−beta) − (2·beta·c/d) · x_i · Σ_{W(i)} dy_j · y_j / s_j`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let Some((top, bottom)) = pass.top_and_bottom() else {
            return;
        };
        let (beta, factor) = (self.settings.beta, self.settings.gradient_factor());
        let (y, dy, s) = (&top.data, &top.diff, &self.state.scale);
        for (i, dx) in bottom.diff.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            self.window(i, |j| acc += dy[j] * y[j] / s[j]);
            *dx += dy[i] * s[i].powf(-beta) - factor * bottom.data[i] * acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer, params_error};

    fn lrn(keys: &str) -> Lrn {
        layer::<LrnParams>("lrn", keys)
    }

    /// `x · s^(−beta)` for the window values `window` around `x`, with `(k', c, d)`.
    fn by_hand(x: f32, window: &[f32], (k, c, d): (f32, f32, f32), beta: f32) -> f32 {
        let sum: f32 = window.iter().map(|v| v * v).sum();
        x * (k + c * (sum / d)).powf(-beta)
    }

    #[test]
    fn across_channels_by_hand() {
        // (1, 4, 1, 1), local_size 3: channel 0 sees channels 0..=1, channel 2 sees 1..=3.
        let x = [1.0, 2.0, -3.0, 0.5];
        let keys = "local_size = 3\nalpha = 0.3\nbeta = 0.6\nk = 2.0";
        let top = forward(&mut lrn(keys), &[blob(&[1, 4, 1, 1], &x)], &[]);
        let terms = (2.0, 0.1, 1.0);
        let want = [
            by_hand(1.0, &x[0..2], terms, 0.6),
            by_hand(2.0, &x[0..3], terms, 0.6),
            by_hand(-3.0, &x[1..4], terms, 0.6),
            by_hand(0.5, &x[2..4], terms, 0.6),
        ];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs(),
                "{:?} vs {want:?}",
                top[0].data
            );
        }
    }

    #[test]
    fn within_channel_by_hand() {
        // (1, 1, 2, 3), local_size 3: the corner (0, 0) sees rows 0..=1, columns 0..=1; the
        // window sum is divided by 9 however much of it lies outside; k plays no part.
        let x = [1.0, -2.0, 3.0, 0.5, 1.5, -1.0];
        let keys =
            "local_size = 3\nalpha = 2.0\nbeta = 0.75\nk = 5.0\nnorm_region = \"within_channel\"";
        let top = forward(&mut lrn(keys), &[blob(&[1, 1, 2, 3], &x)], &[]);
        let terms = (1.0, 2.0, 9.0);
        let corner = by_hand(1.0, &[1.0, -2.0, 0.5, 1.5], terms, 0.75);
        let middle = by_hand(-2.0, &x, terms, 0.75);
        assert!((top[0].data[0] - corner).abs() <= 1e-6 * corner.abs());
        assert!((top[0].data[1] - middle).abs() <= 1e-6 * middle.abs());
    }

    #[test]
    fn defaults_are_caffes() {
        let p = crate::layers::gradient_check::layer_config("name = \"l\"\ntype = \"lrn\"");
        let crate::config::LayerParams::Lrn(p) = p.params().unwrap() else {
            panic!("not lrn")
        };
        assert_eq!(
            (p.local_size, p.alpha, p.beta, p.k, p.norm_region),
            (5, 1.0, 0.75, 1.0, NormRegion::AcrossChannels)
        );
    }

    /// Caffe's LRN test shape (2, 7, 3, 3).
    fn check(keys: &str) {
        let x = uniform_blob(&[2, 7, 3, 3], -1.0, 1.0, 71);
        let report = GradientChecker::default().assert_passes(&mut lrn(keys), &[x], &[true]);
        assert!(report.checked > 100, "{report}");
    }

    #[test]
    fn gradient_across_channels() {
        check("");
        check("local_size = 3\nalpha = 0.5\nbeta = 1.5\nk = 2.0");
    }

    #[test]
    fn gradient_within_channel() {
        check("norm_region = \"within_channel\"");
        check("norm_region = \"within_channel\"\nlocal_size = 3\nalpha = 4.0\nbeta = 0.5");
    }

    #[test]
    fn bad_settings_are_named() {
        assert!(params_error("lrn", "local_size = 4").contains("`local_size`"));
        assert!(params_error("lrn", "local_size = 0").contains("`local_size`"));
        assert!(params_error("lrn", "beta = nan").contains("`beta`"));
        assert!(params_error("lrn", "k = inf").contains("`k`"));
        assert!(params_error("lrn", "top_k = 1").contains("`top_k`"));
        assert!(lrn("").reshape(&[&[2, 3]]).is_err());
    }
}
