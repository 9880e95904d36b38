//! Spatial geometry shared by Convolution and Pooling: reading `kernel_size`/`stride`/`pad`/
//! `dilation` (one value or one per axis, 2-D only), and Caffe's `im2col`/`col2im` for one sample.
//!
//! Column layout (Caffe's): for an image `(C, H, W)`, a kernel `(kh, kw)` and an output
//! `(OH, OW)`, the column buffer is `(C·kh·kw, OH·OW)` row-major; row `(c·kh + i)·kw + j` holds
//! the input pixel `(c, oy·sh − ph + i·dh, ox·sw − pw + j·dw)` at column `oy·OW + ox` (0 outside
//! the image).

use crate::config::Dims;
use crate::error::{Error, Result};

/// A per-axis `(h, w)` pair.
pub type Pair = [usize; 2];

/// `key` of layer `name` as an `(h, w)` pair: `default` when absent; an error when a list has
/// other than 1 or 2 values.
pub fn pair(name: &str, key: &str, dims: &Option<Dims>, default: usize) -> Result<Pair> {
    match dims {
        None => Ok([default; 2]),
        Some(d) => match d.per_axis(2) {
            Some(v) => Ok([v[0], v[1]]),
            None => Err(Error::net(
                name,
                format!("`{key}` takes 1 or 2 values (2-D only)"),
            )),
        },
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

    /// Whether the column buffer equals the image (a 1×1 kernel, stride 1, no pad).
    pub fn is_identity(&self) -> bool {
        self.kernel == [1, 1] && self.stride == [1, 1] && self.pad == [0, 0]
    }

    /// Walks every `(row, column, input index or None)` of the column buffer; `f` gets the
    /// flat column-buffer index and the flat input index (within the sample) or `None` for padding.
    #[inline]
    fn for_each(&self, mut f: impl FnMut(usize, Option<usize>)) {
        let [h, w] = self.input;
        let [kh, kw] = self.kernel;
        let [oh, ow] = self.output;
        let mut idx = 0;
        for c in 0..self.channels {
            for ki in 0..kh {
                for kj in 0..kw {
                    for oy in 0..oh {
                        let iy = (oy * self.stride[0] + ki * self.dilation[0]) as isize
                            - self.pad[0] as isize;
                        if iy < 0 || iy >= h as isize {
                            for _ in 0..ow {
                                f(idx, None);
                                idx += 1;
                            }
                            continue;
                        }
                        let row = (c * h + iy as usize) * w;
                        for ox in 0..ow {
                            let ix = (ox * self.stride[1] + kj * self.dilation[1]) as isize
                                - self.pad[1] as isize;
                            if ix < 0 || ix >= w as isize {
                                f(idx, None);
                            } else {
                                f(idx, Some(row + ix as usize));
                            }
                            idx += 1;
                        }
                    }
                }
            }
        }
    }

    /// `col (C·kh·kw, OH·OW) = im2col(image (C, H, W))`.
    pub fn im2col(&self, image: &[f32], col: &mut [f32]) {
        self.for_each(|i, src| col[i] = src.map_or(0.0, |s| image[s]));
    }

    /// `image (C, H, W) += col2im(col (C·kh·kw, OH·OW))`: each column entry is added back to
    /// the pixel it was read from (padding entries are dropped).
    pub fn col2im_add(&self, col: &[f32], image: &mut [f32]) {
        self.for_each(|i, dst| {
            if let Some(d) = dst {
                image[d] += col[i];
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        g.im2col(&image, &mut col);
        assert_eq!(&col[..9], &[0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 3.0, 4.0]);
        assert_eq!(&col[27..], &[1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
    }

    /// col2im is the adjoint of im2col: ⟨im2col(x), c⟩ = ⟨x, col2im(c)⟩.
    #[test]
    fn col2im_is_the_adjoint() {
        for (k, s, p, d) in [(3, 1, 1, 1), (2, 2, 0, 1), (2, 1, 1, 2), (3, 2, 2, 1)] {
            let g = geometry(k, s, p, d);
            let n_in = 2 * 3 * 4;
            let n_col = g.col_rows() * g.col_cols();
            let x: Vec<f32> = (0..n_in).map(|i| (i as f32 * 0.37).sin()).collect();
            let c: Vec<f32> = (0..n_col).map(|i| (i as f32 * 0.71).cos()).collect();
            let mut col = vec![0.0; n_col];
            g.im2col(&x, &mut col);
            let mut back = vec![0.0; n_in];
            g.col2im_add(&c, &mut back);
            let lhs: f64 = col.iter().zip(&c).map(|(a, b)| (a * b) as f64).sum();
            let rhs: f64 = x.iter().zip(&back).map(|(a, b)| (a * b) as f64).sum();
            assert!((lhs - rhs).abs() < 1e-4, "{k} {s} {p} {d}: {lhs} vs {rhs}");
        }
    }

    #[test]
    fn pair_reads_one_or_two_values() {
        assert_eq!(pair("c", "pad", &None, 0).unwrap(), [0, 0]);
        assert_eq!(pair("c", "pad", &Some(Dims::One(2)), 0).unwrap(), [2, 2]);
        let two = Some(Dims::PerAxis(vec![1, 3]));
        assert_eq!(pair("c", "stride", &two, 1).unwrap(), [1, 3]);
        let three = Some(Dims::PerAxis(vec![1, 2, 3]));
        let err = pair("c", "stride", &three, 1).unwrap_err().to_string();
        assert!(err.contains("stride") && err.contains("2-D"), "{err}");
    }
}
