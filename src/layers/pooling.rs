//! `Pooling`: Caffe's 2-D max and average pooling, optionally global.
//!
//! Shapes: bottom `(N, C, H, W)`, top `(N, C, OH, OW)` with Caffe's ceil rule
//! `OH = ceil((H + 2·ph − kh) / sh) + 1`, minus 1 when `ph > 0` and the last window would start at
//! or beyond `H + ph` (`(OH − 1)·sh ≥ H + ph`); likewise `OW`. `global_pooling` takes the whole
//! `H×W` as the kernel, with pad 0 and stride 1 (top `(N, C, 1, 1)`).
//!
//! Window of output `(oy, ox)`: rows `[oy·sh − ph, oy·sh − ph + kh)`.
//! - `max`: the largest input of the window clipped to the image; the first maximum (row-major)
//!   wins ties and is the one that receives the gradient (its index is kept, Caffe's mask). As
//!   in Caffe (and the GPU kernels) the search starts from `−f32::MAX` with no index: a window
//!   with nothing above it (all `−inf` or NaN) gives `−f32::MAX` and passes no gradient.
//! - `ave`: the sum of the clipped window divided by the size of the window clipped to
//!   `[−pad, H + pad)` (padding counts, the part beyond `H + pad` does not), exactly as Caffe.

use crate::config::layer_params::PoolingParams;
use crate::config::PoolMethod;
use crate::error::{Error, Result};
use crate::layers::spatial::{image_bottom, Pair};
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The pooling layer; see the module docs.
    pub type Pooling = CpuLayer<PoolingParams, Windows>;
}

/// The windows over the current bottom, and where the maxima of the last forward were.
#[derive(Debug, Clone, Default)]
pub struct Windows {
    /// The settings' kernel, or the whole image with `global_pooling`.
    kernel: Pair,
    /// `(N·C)` planes of the current bottom.
    planes: usize,
    input: Pair,
    output: Pair,
    /// Max: for each top element, the index within its input plane of the winning input, or
    /// [`NO_MAXIMUM`].
    argmax: Vec<u32>,
}

/// The argmax of a max-pooling window with no input above `−f32::MAX` (Caffe's mask −1).
const NO_MAXIMUM: u32 = u32::MAX;

/// Caffe's pooled size of one axis; `None` when the window does not fit.
pub fn pooled_size(input: usize, kernel: usize, stride: usize, pad: usize) -> Option<usize> {
    let padded = input + 2 * pad;
    if padded < kernel {
        return None;
    }
    let mut out = (padded - kernel).div_ceil(stride) + 1;
    if pad > 0 && (out - 1) * stride >= input + pad {
        out -= 1;
    }
    Some(out)
}

impl Pooling {
    /// The clipped window of output `o` on one axis: `(start, end, divisor extent)`.
    #[inline]
    fn window(&self, a: usize, o: usize) -> (usize, usize, usize) {
        let (pad, input) = (self.settings.pad[a], self.state.input[a]);
        let start = (o * self.settings.stride[a]) as isize - pad as isize;
        let end_padded = (start + self.state.kernel[a] as isize).min((input + pad) as isize);
        let extent = (end_padded - start) as usize;
        let end = end_padded.min(input as isize) as usize;
        (start.max(0) as usize, end, extent)
    }
}

impl Layer for Pooling {
    fn type_name(&self) -> &'static str {
        "pooling"
    }

    /// One bottom `(N, C, H, W)`; top `(N, C, OH, OW)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let err = |msg: String| Err(Error::net(&self.name, msg));
        let shape @ [n, c, h, w] = image_bottom(&self.name, "pooling", bottoms)?;
        let PoolingParams {
            global,
            stride,
            pad,
            ..
        } = self.settings;
        let kernel = if global { [h, w] } else { self.settings.kernel };
        let mut output = [0; 2];
        for (a, size) in [h, w].into_iter().enumerate() {
            match pooled_size(size, kernel[a], stride[a], pad[a]) {
                Some(o) => output[a] = o,
                None => {
                    return err(format!(
                        "the kernel {kernel:?} is larger than the padded input of bottom {shape:?}"
                    ))
                }
            }
        }
        if (h * w) as u64 > u32::MAX as u64 {
            return err(format!("bottom {shape:?}: an image plane is too large"));
        }
        let st = &mut self.state;
        (st.kernel, st.planes, st.input, st.output) = (kernel, n * c, [h, w], output);
        Ok(vec![vec![n, c, output[0], output[1]]])
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let ([h, w], [oh, ow]) = (self.state.input, self.state.output);
        let method = self.settings.method;
        let x = &pass.bottoms[0].data;
        let y = &mut pass.tops[0].data;
        if method == PoolMethod::Max {
            // A no-op after the first step at a given batch size.
            self.state.argmax.resize(y.len(), 0);
        }
        for p in 0..self.state.planes {
            let plane = &x[p * h * w..(p + 1) * h * w];
            for oy in 0..oh {
                let (y0, y1, ey) = self.window(0, oy);
                for ox in 0..ow {
                    let (x0, x1, ex) = self.window(1, ox);
                    let t = (p * oh + oy) * ow + ox;
                    match method {
                        PoolMethod::Max => {
                            let (mut best, mut at) = (-f32::MAX, NO_MAXIMUM as usize);
                            for iy in y0..y1 {
                                for ix in x0..x1 {
                                    let v = plane[iy * w + ix];
                                    if v > best {
                                        best = v;
                                        at = iy * w + ix;
                                    }
                                }
                            }
                            y[t] = best;
                            self.state.argmax[t] = at as u32;
                        }
                        PoolMethod::Ave => {
                            let mut sum = 0.0;
                            for iy in y0..y1 {
                                sum += plane[iy * w + x0..iy * w + x1].iter().sum::<f32>();
                            }
                            y[t] = sum / (ey * ex) as f32;
                        }
                    }
                }
            }
        }
    }

    /// Max: `dx[argmax] += dy`; ave: every input of the window gets `dy / divisor`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let Some((top, bottom)) = pass.top_and_bottom() else {
            return;
        };
        let ([h, w], [oh, ow]) = (self.state.input, self.state.output);
        let (dy, dx) = (&top.diff, &mut bottom.diff);
        for p in 0..self.state.planes {
            let plane = &mut dx[p * h * w..(p + 1) * h * w];
            for oy in 0..oh {
                let (y0, y1, ey) = self.window(0, oy);
                for ox in 0..ow {
                    let t = (p * oh + oy) * ow + ox;
                    match self.settings.method {
                        PoolMethod::Max => {
                            let at = self.state.argmax[t];
                            if at != NO_MAXIMUM {
                                plane[at as usize] += dy[t];
                            }
                        }
                        PoolMethod::Ave => {
                            let (x0, x1, ex) = self.window(1, ox);
                            let g = dy[t] / (ey * ex) as f32;
                            for iy in y0..y1 {
                                plane[iy * w + x0..iy * w + x1]
                                    .iter_mut()
                                    .for_each(|v| *v += g);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::GradientChecker;
    use crate::layers::test_util::{self, layer, params_error};
    use crate::tensor::Blob;

    fn pool(keys: &str) -> Pooling {
        layer::<PoolingParams>("pooling", keys)
    }

    fn forward(layer: &mut Pooling, x: Blob) -> Blob {
        test_util::forward(layer, &[x], &[]).remove(0)
    }

    /// Distinct values (a shuffled ramp) so that max pooling has no ties.
    fn distinct_blob(shape: &[usize], seed: u64) -> Blob {
        let mut b = Blob::new(shape);
        let n = b.count();
        let mut order: Vec<usize> = (0..n).collect();
        let mut s = seed;
        for i in (1..n).rev() {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        for (v, o) in b.data.iter_mut().zip(order) {
            // Steps of 2/n ≫ the checker's step of 0.01 for the sizes used here.
            *v = -1.0 + 2.0 * o as f32 / n as f32;
        }
        b
    }

    #[test]
    fn pooled_size_follows_caffe() {
        assert_eq!(pooled_size(28, 2, 2, 0), Some(14));
        assert_eq!(pooled_size(32, 3, 2, 0), Some(16)); // ceil(29/2) + 1
        assert_eq!(pooled_size(5, 2, 2, 0), Some(3)); // ceil rule keeps a partial window
        assert_eq!(pooled_size(4, 3, 2, 1), Some(3)); // ceil(3/2)+1 = 3; (3−1)·2 = 4 < 4+1
        assert_eq!(pooled_size(5, 3, 2, 1), Some(3));
        assert_eq!(pooled_size(6, 2, 2, 1), Some(4)); // 4, (4−1)·2 = 6 ≥ 7? no
        assert_eq!(pooled_size(4, 2, 2, 1), Some(3));
        assert_eq!(pooled_size(1, 2, 2, 1), Some(1)); // ceil(1/2)+1 = 2; (2−1)·2 = 2 ≥ 1+1: 1
        assert_eq!(pooled_size(3, 3, 3, 2), Some(2)); // ceil(4/3)+1 = 3; (3−1)·3 = 6 ≥ 3+2: 2
        assert_eq!(pooled_size(2, 3, 1, 0), None);
    }

    #[test]
    fn max_forward_by_hand() {
        let mut x = Blob::new(&[1, 1, 3, 4]);
        x.data = vec![
            1.0, 5.0, 2.0, 0.0, //
            3.0, 4.0, 8.0, 7.0, //
            9.0, 6.0, -1.0, -2.0,
        ];
        let top = forward(&mut pool("kernel_size = 2\nstride = 2"), x.clone());
        // ceil((3−2)/2)+1 = 2 rows: the second window is clipped to row 2.
        assert_eq!(top.shape, vec![1, 1, 2, 2]);
        assert_eq!(top.data, vec![5.0, 8.0, 9.0, -1.0]);
    }

    #[test]
    fn ave_forward_by_hand_with_padding() {
        // 1×1×2×2 of ones, kernel 2, stride 2, pad 1: output 2×2 (ceil(2/2)+1 = 2; (2−1)·2 = 2
        // < 2 + 1). Window (0,0) covers rows −1..1: one pixel, divisor 2·2 = 4.
        let mut x = Blob::new(&[1, 1, 2, 2]);
        x.data = vec![1.0, 2.0, 3.0, 4.0];
        let top = forward(
            &mut pool("pool = \"ave\"\nkernel_size = 2\nstride = 2\npad = 1"),
            x,
        );
        assert_eq!(top.shape, vec![1, 1, 2, 2]);
        assert_eq!(top.data, vec![0.25, 0.5, 0.75, 1.0]);
        // Kernel 3, stride 2, pad 1 on 4 wide: 3 outputs. Window 0 spans −1..2 (divisor 3,
        // padding counts), window 1 spans 1..4, window 2 spans 3..6 cut at 4 + pad = 5
        // (divisor 2, holding the one pixel 4).
        let mut x = Blob::new(&[1, 1, 1, 4]);
        x.data = vec![1.0, 2.0, 3.0, 4.0];
        let top = forward(
            &mut pool("pool = \"ave\"\nkernel_size = [1, 3]\nstride = [1, 2]\npad = [0, 1]"),
            x,
        );
        assert_eq!(top.shape, vec![1, 1, 1, 3]);
        assert_eq!(top.data, vec![1.0, 3.0, 2.0]);
    }

    #[test]
    fn global_pooling_by_hand() {
        let mut x = Blob::new(&[2, 1, 2, 3]);
        x.data = (0..12).map(|v| v as f32).collect();
        let top = forward(
            &mut pool("global_pooling = true\npool = \"ave\""),
            x.clone(),
        );
        assert_eq!(top.shape, vec![2, 1, 1, 1]);
        assert_eq!(top.data, vec![2.5, 8.5]);
        let top = forward(&mut pool("global_pooling = true"), x);
        assert_eq!(top.data, vec![5.0, 11.0]);
    }

    #[test]
    fn max_ties_go_to_the_first() {
        let mut layer = pool("kernel_size = 2");
        let mut x = Blob::new(&[1, 1, 2, 2]);
        x.data = vec![1.0, 3.0, 3.0, 0.0];
        let top = forward(&mut layer, x.clone());
        assert_eq!(top.data, vec![3.0]);
        let mut bottoms = vec![x];
        let mut t = top;
        t.diff = vec![1.0];
        test_util::backward(&mut layer, &[t], &[true], &mut bottoms, &[], &mut []);
        assert_eq!(bottoms[0].diff, vec![0.0, 1.0, 0.0, 0.0]);
    }

    /// A window with nothing above `−f32::MAX` (−inf, NaN, `−f32::MAX` itself) gives
    /// `−f32::MAX` and passes no gradient, as Caffe's mask −1; a NaN beside a number loses to it.
    #[test]
    fn max_of_a_window_without_numbers_is_minus_float_max() {
        let mut layer = pool("kernel_size = 2");
        let mut x = Blob::new(&[1, 3, 2, 2]);
        let inf = f32::INFINITY;
        x.data = [
            [-inf, -inf, -inf, -inf],
            [f32::NAN, -inf, -f32::MAX, f32::NAN],
            [f32::NAN, -inf, -2.0, f32::NAN],
        ]
        .concat();
        let top = forward(&mut layer, x.clone());
        assert_eq!(top.data, vec![-f32::MAX, -f32::MAX, -2.0]);
        let mut bottoms = vec![x];
        let mut t = top;
        t.diff = vec![1.0, 2.0, 3.0];
        test_util::backward(&mut layer, &[t], &[true], &mut bottoms, &[], &mut []);
        let mut want = vec![0.0; 12];
        want[10] = 3.0;
        assert_eq!(bottoms[0].diff, want);
    }

    /// Max and average pooling, padded, strided, rectangular and global, each at a shape of
    /// its own (distinct values: no ties within the step).
    #[test]
    fn gradients() {
        for (keys, shape) in [
            ("kernel_size = 2\nstride = 2", [2, 2, 4, 5]),
            ("kernel_size = 3\nstride = 2", [1, 2, 7, 6]),
            ("kernel_size = 3\nstride = 2\npad = 1", [2, 2, 5, 6]),
            (
                "pool = \"ave\"\nkernel_size = 3\nstride = 2\npad = 1",
                [2, 2, 5, 6],
            ),
            (
                "pool = \"ave\"\nkernel_size = [2, 3]\nstride = [1, 2]",
                [1, 3, 4, 7],
            ),
            ("global_pooling = true", [2, 3, 3, 4]),
            ("global_pooling = true\npool = \"ave\"", [2, 3, 3, 4]),
        ] {
            let bottom = distinct_blob(&shape, 41);
            let report = GradientChecker::default()
                .check(&mut pool(keys), &[bottom], &[true])
                .unwrap();
            assert!(report.is_ok() && report.checked > 0, "{keys:?}: {report}");
        }
    }

    #[test]
    fn rejects_bad_settings() {
        let new = |keys: &str| params_error("pooling", keys);
        assert!(new("stride = 2").contains("kernel_size"));
        assert!(new("kernel_size = 2\npad = 2").contains("pad"));
        assert!(new("kernel_size = 2\nstride = 0").contains("stride"));
        assert!(new("global_pooling = true\nkernel_size = 2").contains("global_pooling"));
        assert!(pool("kernel_size = 2").reshape(&[&[1, 4, 4]]).is_err());
        assert!(pool("kernel_size = 5").reshape(&[&[1, 1, 4, 4]]).is_err());
    }
}
