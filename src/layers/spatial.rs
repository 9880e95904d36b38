//! Spatial geometry shared by Convolution and Pooling (their `[h, w]` keys are resolved in
//! [`crate::config::layer_params`]): their image bottom `(N, C, H, W)`, and Caffe's
//! `im2col`/`col2im` for one sample, one column-buffer row at a time (so that a batch's columns
//! can be laid side by side).
//!
//! Column layout (Caffe's): for an image `(C, H, W)`, a kernel `(kh, kw)` and an output
//! `(OH, OW)`, the column buffer is `(C·kh·kw, OH·OW)` row-major; row `(c·kh + i)·kw + j` holds
//! the input pixel `(c, oy·sh − ph + i·dh, ox·sw − pw + j·dw)` at column `oy·OW + ox` (0 outside
//! the image).

pub use crate::config::layer_params::Pair;
use crate::error::{Error, Result};
use crate::layers::one_bottom;

/// The one bottom `(N, C, H, W)` of the 2-D layer `layer` of type `kind`, or an error naming
/// the layer.
pub(crate) fn image_bottom(layer: &str, kind: &str, bottoms: &[&[usize]]) -> Result<[usize; 4]> {
    match *one_bottom(layer, bottoms)? {
        [n, c, h, w] => Ok([n, c, h, w]),
        ref shape => Err(Error::net(
            layer,
            format!("takes a bottom (N, C, H, W), got {shape:?} (2-D {kind} only)"),
        )),
    }
}

/// The geometry of one 2-D sliding window over `(C, H, W)` images.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Geometry {
    pub channels: usize,
    pub input: Pair,
    pub kernel: Pair,
    pub stride: Pair,
    pub pad: Pair,
    pub dilation: Pair,
    pub output: Pair,
}

impl Geometry {
    /// Rows of the column buffer: `C·kh·kw`.
    pub fn col_rows(&self) -> usize {
        self.channels * self.kernel[0] * self.kernel[1]
    }

    /// Columns of the column buffer: `OH·OW`.
    pub fn col_cols(&self) -> usize {
        self.output[0] * self.output[1]
    }

    /// Walks row `r = (c·kh + i)·kw + j` of the column buffer one output row at a time:
    /// `f(oy, window)` for output row `oy`, where `window` is `None` when the kernel row lies in
    /// the padding, else `Some(InputRow)`: the columns `lo..hi` of this output row read the input
    /// pixels `first + (ox − lo)·sw` (the others are padding).
    #[inline]
    fn for_each_in_row(&self, r: usize, mut f: impl FnMut(usize, Option<InputRow>)) {
        let [h, w] = self.input;
        let [kh, kw] = self.kernel;
        let (c, ki, kj) = (r / (kh * kw), r / kw % kh, r % kw);
        let sw = self.stride[1];
        // ix = ox·sw + x0 lies in [0, w) for ox in lo..hi.
        let x0 = (kj * self.dilation[1]) as isize - self.pad[1] as isize;
        let lo = if x0 >= 0 {
            0
        } else {
            (-x0 as usize).div_ceil(sw)
        };
        let hi = if w as isize > x0 {
            ((w as isize - x0 - 1) as usize / sw + 1).min(self.output[1])
        } else {
            0
        };
        let lo = lo.min(hi);
        // The input column output column `lo` reads (inside the image when lo < hi).
        let x_first = (x0 + (lo * sw) as isize).max(0) as usize;
        for oy in 0..self.output[0] {
            let iy = (oy * self.stride[0] + ki * self.dilation[0]) as isize - self.pad[0] as isize;
            let window = (iy >= 0 && iy < h as isize).then(|| InputRow {
                first: (c * h + iy as usize) * w + x_first,
                step: sw,
                lo,
                hi,
            });
            f(oy, window);
        }
    }

    /// Row `r` of `im2col(image (C, H, W))` into `dst (OH·OW)`.
    pub fn im2col_row(&self, r: usize, image: &[f32], dst: &mut [f32]) {
        let ow = self.output[1];
        self.for_each_in_row(r, |oy, window| {
            let dst = &mut dst[oy * ow..(oy + 1) * ow];
            let Some(InputRow {
                first,
                step,
                lo,
                hi,
            }) = window
            else {
                dst.fill(0.0);
                return;
            };
            dst[..lo].fill(0.0);
            dst[hi..].fill(0.0);
            if lo == hi {
                return;
            }
            if step == 1 {
                dst[lo..hi].copy_from_slice(&image[first..first + hi - lo]);
            } else {
                let src = image[first..].iter().step_by(step);
                dst[lo..hi].iter_mut().zip(src).for_each(|(d, &v)| *d = v);
            }
        });
    }

    /// `image (C, H, W) +=` row `r` of the columns, `src (OH·OW)`, at the pixels it was read from.
    pub fn col2im_row_add(&self, r: usize, src: &[f32], image: &mut [f32]) {
        let ow = self.output[1];
        self.for_each_in_row(r, |oy, window| {
            if let Some(InputRow {
                first,
                step,
                lo,
                hi,
            }) = window.filter(|w| w.lo < w.hi)
            {
                let src = &src[oy * ow + lo..oy * ow + hi];
                let dst = image[first..].iter_mut().step_by(step);
                dst.zip(src).for_each(|(d, &v)| *d += v);
            }
        });
    }
}

/// The input pixels one output row of one column-buffer row reads; see
/// [`Geometry::for_each_in_row`].
#[derive(Debug, Clone, Copy)]
struct InputRow {
    /// Flat index of the pixel output column `lo` reads (meaningful when `lo < hi`).
    first: usize,
    /// Pixels between the reads of neighbouring output columns (the horizontal stride).
    step: usize,
    /// The output columns that read inside the image (`lo ≤ hi`, possibly none).
    lo: usize,
    hi: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `col (C·kh·kw, OH·OW) = im2col(image (C, H, W))`, row by row.
    fn im2col(g: &Geometry, image: &[f32], col: &mut [f32]) {
        let rows = col.chunks_exact_mut(g.col_cols()).enumerate();
        rows.for_each(|(r, dst)| g.im2col_row(r, image, dst));
    }

    fn geometry(k: usize, s: usize, p: usize, d: usize) -> Geometry {
        let input = [3, 4];
        let span = d * (k - 1) + 1;
        let out = |i: usize| (i + 2 * p - span) / s + 1;
        Geometry {
            channels: 2,
            input,
            kernel: [k; 2],
            stride: [s; 2],
            pad: [p; 2],
            dilation: [d; 2],
            output: [out(input[0]), out(input[1])],
        }
    }

    #[test]
    fn im2col_by_hand() {
        // One channel 2×2, kernel 2×2, pad 1, stride 1: output 3×3; row (0,0) reads
        // pixel (oy−1, ox−1).
        let g = Geometry {
            channels: 1,
            input: [2, 2],
            kernel: [2, 2],
            stride: [1, 1],
            pad: [1, 1],
            dilation: [1, 1],
            output: [3, 3],
        };
        let image = [1.0, 2.0, 3.0, 4.0];
        let mut col = vec![f32::NAN; g.col_rows() * g.col_cols()];
        im2col(&g, &image, &mut col);
        assert_eq!(&col[..9], &[0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 3.0, 4.0]);
        assert_eq!(&col[27..], &[1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
    }

    /// `(kernel, stride, pad, dilation)` of the tested geometries over a 2×3×4 input, including
    /// kernels wider than the input and strides that skip the right edge.
    const GEOMETRIES: [(usize, usize, usize, usize); 7] = [
        (3, 1, 1, 1),
        (2, 2, 0, 1),
        (2, 1, 1, 2),
        (3, 2, 2, 1),
        (5, 1, 4, 1),
        (3, 3, 2, 2),
        (1, 2, 0, 1),
    ];

    /// im2col of every geometry against its definition, entry by entry, for two samples placed
    /// side by side row by row (as the convolution lays out a chunk).
    #[test]
    fn im2col_matches_its_definition_side_by_side() {
        for (k, s, p, d) in GEOMETRIES {
            let g = geometry(k, s, p, d);
            let (rows, cols) = (g.col_rows(), g.col_cols());
            let n_in = 2 * 3 * 4;
            let images: Vec<f32> = (0..2 * n_in).map(|i| i as f32 + 1.0).collect();
            let ld = 2 * cols;
            let mut col = vec![f32::NAN; rows * ld];
            for (r, row) in col.chunks_exact_mut(ld).enumerate() {
                for (j, dst) in row.chunks_exact_mut(cols).enumerate() {
                    g.im2col_row(r, &images[j * n_in..(j + 1) * n_in], dst);
                }
            }
            for j in 0..2 {
                for r in 0..rows {
                    let (c, ki, kj) = (r / (k * k), r / k % k, r % k);
                    for q in 0..cols {
                        let (oy, ox) = (q / g.output[1], q % g.output[1]);
                        let iy = (oy * s + ki * d) as isize - p as isize;
                        let ix = (ox * s + kj * d) as isize - p as isize;
                        let inside = (0..3).contains(&iy) && (0..4).contains(&ix);
                        let want = if inside {
                            images[j * n_in + (c * 3 + iy as usize) * 4 + ix as usize]
                        } else {
                            0.0
                        };
                        let got = col[r * ld + j * cols + q];
                        assert_eq!(got, want, "k{k} s{s} p{p} d{d}: sample {j} row {r} col {q}");
                    }
                }
            }
        }
    }

    /// col2im is the adjoint of im2col: ⟨im2col(x), c⟩ = ⟨x, col2im(c)⟩.
    #[test]
    fn col2im_is_the_adjoint() {
        for (k, s, p, d) in GEOMETRIES {
            let g = geometry(k, s, p, d);
            let n_in = 2 * 3 * 4;
            let n_col = g.col_rows() * g.col_cols();
            let x: Vec<f32> = (0..n_in).map(|i| (i as f32 * 0.37).sin()).collect();
            let c: Vec<f32> = (0..n_col).map(|i| (i as f32 * 0.71).cos()).collect();
            let mut col = vec![0.0; n_col];
            im2col(&g, &x, &mut col);
            let mut back = vec![0.0; n_in];
            for (r, src) in c.chunks_exact(g.col_cols()).enumerate() {
                g.col2im_row_add(r, src, &mut back);
            }
            let lhs: f64 = col.iter().zip(&c).map(|(a, b)| (a * b) as f64).sum();
            let rhs: f64 = x.iter().zip(&back).map(|(a, b)| (a * b) as f64).sum();
            assert!((lhs - rhs).abs() < 1e-4, "{k} {s} {p} {d}: {lhs} vs {rhs}");
        }
    }
}
