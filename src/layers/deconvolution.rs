//! `Deconvolution`: Caffe's transposed 2-D convolution, with a convolution's keys (`group`,
//! `dilation`, `pad`, `stride`, an optional bias). Its forward is the data gradient of the
//! convolution that maps its top's shape to its bottom's, and its data gradient that
//! convolution's forward (Caffe's `DeconvolutionLayer`).
//!
//! Shapes: bottom `(N, C, H, W)`, top `(N, num_output, OH, OW)` with
//! `OH = sh·(H − 1) + dh·(kh − 1) + 1 − 2·ph` (at least 1), likewise `OW`.
//!
//! Learnable tensors, in order: `weight` `(C, num_output/group, kh, kw)` (Caffe's: the weight
//! of that convolution, whose outputs are this layer's inputs), filled by `weight_filler`
//! (default xavier), and `bias` `(num_output)` when `bias_term` (default true), filled by
//! `bias_filler` (default constant 0). `C` is fixed by the first reshape.
//!
//! Computed with the convolution's column helpers ([`crate::layers::convolution`]) over the
//! geometry of that convolution (its input the top image, its output the bottom's `H × W`), in
//! chunks of `S` samples: with `M = C/group`, `K = num_output/group·kh·kw`, `P = H·W`, per
//! group `g`, forward `col_g (K, S·P) = W_gᵀ · x_g` and `top = col2im(col) + bias`; backward
//! `col = im2col(dtop)`, `dW_g += x_g · col_gᵀ`, `dx_g += W_g · col_g` and `db += Σ dtop`.

use crate::config::layer_params::{ConvolutionParams, DeconvolutionParams};
use crate::error::{Error, Result};
use crate::layers::convolution::{
    add_columns, columns, gather_rows, scatter_rows, Columns, GroupGemm,
};
use crate::layers::spatial::{image_bottom, Geometry};
use crate::layers::{weight_and_bias, BackwardPass, CpuLayer, ForwardPass, Layer};
use crate::params::ParamSpec;

cpu_layer! {
    /// The deconvolution layer; see the module docs.
    pub type Deconvolution = CpuLayer<DeconvolutionParams, Columns>;
}

impl DeconvolutionParams {
    /// The top's size along spatial axis `a` for a bottom of `size` there, or `None` when the
    /// padding leaves nothing (Caffe's rule for the transposed convolution).
    pub fn out_size(&self, a: usize, size: usize) -> Option<usize> {
        let s = &self.0;
        let extent = s.dilation[a] * (s.kernel[a] - 1) + 1;
        (s.stride[a] * (size.max(1) - 1) + extent)
            .checked_sub(2 * s.pad[a])
            .filter(|&o| o > 0)
    }
}

impl Layer for Deconvolution {
    fn type_name(&self) -> &'static str {
        "deconvolution"
    }

    /// One bottom `(N, C, H, W)` with `C` a multiple of `group`; top `(N, num_output, OH, OW)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape @ [n, c, h, w] = image_bottom(&self.name, "deconvolution", bottoms)?;
        let s: &ConvolutionParams = &self.settings.0;
        if c % s.group != 0 {
            return Err(Error::net(
                &self.name,
                format!(
                    "`group` {} does not divide the {c} channels of the bottom",
                    s.group
                ),
            ));
        }
        let mut output = [0; 2];
        for (a, size) in [h, w].into_iter().enumerate() {
            output[a] = self.settings.out_size(a, size).ok_or_else(|| {
                Error::net(
                    &self.name,
                    format!(
                        "`pad` {:?} leaves no output for bottom {shape:?} (the top would be \
                         stride·(size − 1) + kernel extent − 2·pad)",
                        s.pad
                    ),
                )
            })?;
        }
        // The convolution from the top's image to the bottom's.
        let geometry = Geometry {
            channels: s.num_output,
            input: output,
            kernel: s.kernel,
            stride: s.stride,
            pad: s.pad,
            dilation: s.dilation,
            output: [h, w],
        };
        self.state.set(&self.name, c, geometry, n)?;
        Ok(vec![vec![n, s.num_output, output[0], output[1]]])
    }

    /// `weight` `(C, num_output/group, kh, kw)`, then `bias` `(num_output)` if `bias_term`.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let s = &self.settings.0;
        let mut specs = weight_and_bias(
            vec![
                self.state.channels(),
                s.num_output / s.group,
                s.kernel[0],
                s.kernel[1],
            ],
            &s.weight_filler,
            None,
        );
        if s.bias_term {
            specs.push(ParamSpec::new("bias", vec![s.num_output], &s.bias_filler));
        }
        specs
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let s = &self.settings.0;
        let (channels, geometry) = (self.state.channels(), self.state.geometry());
        let gemms = self.state.prepare(channels, s.group, pass.ctx.cpu);
        let (m, k, p) = (gemms.m, gemms.k, gemms.p);
        let (x, weight) = (&pass.bottoms[0].data, pass.params[0]);
        let top = &mut pass.tops[0].data;
        let (in_len, out_len) = (
            channels * p,
            s.num_output * geometry.input[0] * geometry.input[1],
        );
        let num = x.len() / in_len.max(1);
        let (col, rows) = self.state.buffers();
        for (first, samples) in gemms.chunks(num) {
            let ld = samples * p;
            let chunk = &x[first * in_len..(first + samples) * in_len];
            gather_rows(chunk, &mut rows[..channels * ld], channels, p);
            gemms.per_group(
                pass.ctx.cpu,
                GroupGemm {
                    trans_a: true,
                    trans_b: false,
                    m: k,
                    n: ld,
                    k: m,
                    beta: 0.0,
                },
                weight,
                rows,
                &mut col[..],
            );
            let images = &mut top[first * out_len..(first + samples) * out_len];
            match s.bias_term {
                true => {
                    let planes = images.chunks_exact_mut(out_len / s.num_output);
                    let bias = pass.params[1].iter().cycle();
                    planes.zip(bias).for_each(|(plane, &b)| plane.fill(b));
                }
                false => images.fill(0.0),
            }
            add_columns(&geometry, col, top, first, samples, gemms.parallel);
        }
    }

    fn backward(&mut self, pass: BackwardPass<'_>) {
        let s = &self.settings.0;
        let (channels, geometry) = (self.state.channels(), self.state.geometry());
        let gemms = self.state.prepare(channels, s.group, pass.ctx.cpu);
        let (m, k, p) = (gemms.m, gemms.k, gemms.p);
        let (cpu, weight, param_diffs) = (pass.ctx.cpu, pass.params[0], pass.param_diffs);
        let dtop = &pass.tops[0].diff;
        let bottom = &mut pass.bottoms[0];
        let (in_len, out_len) = (
            channels * p,
            s.num_output * geometry.input[0] * geometry.input[1],
        );
        if s.bias_term {
            let planes = dtop.chunks_exact(out_len / s.num_output);
            let db = (0..s.num_output).cycle();
            for (plane, c) in planes.zip(db) {
                param_diffs[1][c] += plane.iter().map(|&g| g as f64).sum::<f64>() as f32;
            }
        }
        let num = bottom.data.len() / in_len.max(1);
        let (col, rows) = self.state.buffers();
        for (first, samples) in gemms.chunks(num) {
            let ld = samples * p;
            columns(&geometry, col, dtop, first, samples, gemms.parallel);
            let chunk = &bottom.data[first * in_len..(first + samples) * in_len];
            gather_rows(chunk, &mut rows[..channels * ld], channels, p);
            gemms.per_group(
                cpu,
                GroupGemm {
                    trans_a: false,
                    trans_b: true,
                    m,
                    n: k,
                    k: ld,
                    beta: 1.0,
                },
                rows,
                col,
                param_diffs[0],
            );
            if pass.propagate_down[0] {
                gemms.per_group(
                    cpu,
                    GroupGemm {
                        trans_a: false,
                        trans_b: false,
                        m,
                        n: ld,
                        k,
                        beta: 0.0,
                    },
                    weight,
                    col,
                    &mut rows[..],
                );
                let dx = &mut bottom.diff[first * in_len..(first + samples) * in_len];
                scatter_rows(&rows[..channels * ld], dx, (channels, p), None, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer, params_error};
    use crate::tensor::Blob;

    fn deconv(keys: &str) -> Deconvolution {
        layer::<DeconvolutionParams>("deconvolution", keys)
    }

    /// The transposed convolution by its definition, in f64: every input pixel `(c, y, x)`
    /// spreads `x · w[c, o, i, j]` onto the output pixel `(y·s − p + i·d, x·s − p + j·d)` of
    /// channel `g·(M/group) + o` of its group `g`.
    fn direct(
        x: &Blob,
        w: &[f32],
        b: Option<&[f32]>,
        p: &ConvolutionParams,
        out: [usize; 2],
    ) -> Vec<f32> {
        let [n, c, h, wd] = x.shape[..] else { panic!() };
        let (m, g) = (p.num_output, p.group);
        let (cg, mg) = (c / g, m / g);
        let [kh, kw] = p.kernel;
        let mut y = vec![0.0f64; n * m * out[0] * out[1]];
        for ni in 0..n {
            for mi in 0..m {
                let bias = b.map_or(0.0, |b| b[mi] as f64);
                y[(ni * m + mi) * out[0] * out[1]..][..out[0] * out[1]].fill(bias);
            }
            for ci in 0..c {
                let gi = ci / cg;
                for iy in 0..h {
                    for ix in 0..wd {
                        let v = x.data[((ni * c + ci) * h + iy) * wd + ix] as f64;
                        for o in 0..mg {
                            for i in 0..kh {
                                for j in 0..kw {
                                    let oy = (iy * p.stride[0] + i * p.dilation[0]) as isize
                                        - p.pad[0] as isize;
                                    let ox = (ix * p.stride[1] + j * p.dilation[1]) as isize
                                        - p.pad[1] as isize;
                                    if oy < 0
                                        || ox < 0
                                        || oy >= out[0] as isize
                                        || ox >= out[1] as isize
                                    {
                                        continue;
                                    }
                                    let mi = gi * mg + o;
                                    let wv = w[((ci * mg + o) * kh + i) * kw + j] as f64;
                                    y[((ni * m + mi) * out[0] + oy as usize) * out[1]
                                        + ox as usize] += v * wv;
                                }
                            }
                        }
                    }
                }
            }
        }
        y.into_iter().map(|v| v as f32).collect()
    }

    fn against_direct(keys: &str, shape: [usize; 4], seed: u64) {
        let mut l = deconv(keys);
        let tops = l.reshape(&[&shape]).unwrap();
        let specs = l.param_specs();
        let w = uniform_blob(&specs[0].shape, -1.0, 1.0, seed).data;
        let b = specs
            .get(1)
            .map(|s| uniform_blob(&s.shape, -1.0, 1.0, seed + 1).data);
        let x = uniform_blob(&shape, -1.0, 1.0, seed + 2);
        let params: Vec<&[f32]> = std::iter::once(&w[..]).chain(b.as_deref()).collect();
        let top = forward(&mut l, std::slice::from_ref(&x), &params);
        assert_eq!(top[0].shape, tops[0]);
        let out = [tops[0][2], tops[0][3]];
        let want = direct(&x, &w, b.as_deref(), &l.settings.0, out);
        assert_eq!(top[0].data.len(), want.len());
        for (i, (a, e)) in top[0].data.iter().zip(&want).enumerate() {
            assert!((a - e).abs() < 1e-4, "{keys}: [{i}] {a} vs {e}");
        }
    }

    #[test]
    fn output_size_and_weight_follow_caffe() {
        // 2·(4 − 1) + 3 − 2 = 7; 2·(5 − 1) + 2·(3 − 1) + 1 − 0 = 13.
        let mut l = deconv("num_output = 6\nkernel_size = 3\nstride = 2\npad = [1, 0]\ndilation = [1, 2]\ngroup = 2");
        assert_eq!(
            l.reshape(&[&[2, 4, 4, 5]]).unwrap(),
            vec![vec![2, 6, 7, 13]]
        );
        let specs = l.param_specs();
        assert_eq!(specs[0].shape, vec![4, 3, 3, 3]);
        assert_eq!(specs[1].shape, vec![6]);
    }

    #[test]
    fn forward_by_hand() {
        // One 2×2 input, a 2×2 kernel of ones, stride 2: each pixel becomes a 2×2 block.
        let mut l = deconv("num_output = 1\nkernel_size = 2\nstride = 2");
        let x = blob(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let top = forward(&mut l, &[x], &[&[1.0; 4], &[0.5]]);
        assert_eq!(top[0].shape, vec![1, 1, 4, 4]);
        let want = [
            1., 1., 2., 2., 1., 1., 2., 2., 3., 3., 4., 4., 3., 3., 4., 4.,
        ];
        let want: Vec<f32> = want.iter().map(|v| v + 0.5).collect();
        assert_eq!(top[0].data, want);
        // Stride 1 overlaps: the centre of a 3×3 output of a 2×2 input gets all four pixels.
        let mut l = deconv("num_output = 1\nkernel_size = 2\nbias_term = false");
        let x = blob(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let top = forward(&mut l, &[x], &[&[1.0; 4]]);
        assert_eq!(top[0].data, vec![1., 3., 2., 4., 10., 6., 3., 7., 4.]);
    }

    #[test]
    fn forward_matches_a_direct_loop() {
        against_direct("num_output = 3\nkernel_size = 3", [2, 2, 3, 4], 1);
        against_direct(
            "num_output = 4\nkernel_size = 3\nstride = 2\npad = 1",
            [2, 3, 4, 3],
            2,
        );
        against_direct("num_output = 2\nkernel_size = [2, 3]\nstride = [1, 2]\npad = [0, 1]\ndilation = [2, 1]", [1, 2, 3, 3], 3);
        against_direct(
            "num_output = 6\nkernel_size = 2\nstride = 2\ngroup = 2\nbias_term = false",
            [2, 4, 3, 2],
            4,
        );
        against_direct(
            "num_output = 4\nkernel_size = 1\nstride = 3\ngroup = 4",
            [1, 4, 2, 2],
            5,
        );
    }

    fn gradient(keys: &str, shape: [usize; 4]) {
        let bottom = uniform_blob(&shape, -1.0, 1.0, 33);
        let report =
            GradientChecker::default().assert_passes(&mut deconv(keys), &[bottom], &[true]);
        assert!(report.checked > 0);
    }

    #[test]
    fn gradient_plain() {
        gradient("num_output = 3\nkernel_size = 3", [2, 2, 3, 3]);
    }

    #[test]
    fn gradient_stride_pad_and_group() {
        gradient(
            "num_output = 4\nkernel_size = 3\nstride = 2\npad = 1\ngroup = 2",
            [2, 4, 3, 2],
        );
    }

    #[test]
    fn gradient_dilation_without_bias() {
        gradient("num_output = 2\nkernel_size = [2, 3]\ndilation = [2, 1]\npad = [1, 0]\nbias_term = false", [1, 3, 3, 4]);
    }

    /// Batches split into chunks of one sample give the batch's results.
    #[test]
    fn gradient_in_chunks_of_one() {
        let mut l = deconv("num_output = 2\nkernel_size = 3\nstride = 2");
        l.reshape(&[&[3, 2, 3, 3]]).unwrap();
        l.state.column_budget = Some(1);
        let bottom = uniform_blob(&[3, 2, 3, 3], -1.0, 1.0, 34);
        GradientChecker::default().assert_passes(&mut l, &[bottom], &[true]);
    }

    /// Caffe's upsampling recipe: factor 2, `kernel_size = 4`, `stride = 2`, `pad = 1`,
    /// `group = C`, the bilinear filler: a constant image stays constant away from the border,
    /// and a row 0, 1, 2 becomes 0, 0.25, 0.75, 1.25, 1.75, 1.5 (interpolated, the last one
    /// cut by the zero padding).
    #[test]
    fn bilinear_upsampling_interpolates() {
        let keys = "num_output = 2\nkernel_size = 4\nstride = 2\npad = 1\ngroup = 2\nbias_term = false\nweight_filler = { type = \"bilinear\" }";
        let mut l = deconv(keys);
        l.reshape(&[&[1, 2, 1, 3]]).unwrap();
        let spec = &l.param_specs()[0];
        let mut w = vec![0.0; spec.shape.iter().product()];
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
        crate::layers::filler::fill(&spec.filler, &spec.shape, &mut rng, &mut w);
        let x = blob(&[1, 2, 1, 3], &[0.0, 1.0, 2.0, 5.0, 5.0, 5.0]);
        let top = forward(&mut l, &[x], &[&w]);
        assert_eq!(top[0].shape, vec![1, 2, 2, 6]);
        // Row 0 of channel 0 (one input row: the vertical weight is 0.75 on both output rows).
        let row: Vec<f32> = top[0].data[..6].iter().map(|v| v / 0.75).collect();
        assert_eq!(row, vec![0.0, 0.25, 0.75, 1.25, 1.75, 1.5]);
        let inner: Vec<f32> = top[0].data[12 + 1..12 + 5]
            .iter()
            .map(|v| v / 0.75)
            .collect();
        assert_eq!(inner, vec![5.0; 4]);
        let err = params_error(
            "deconvolution",
            "num_output = 2\nkernel_size = [4, 2]\nweight_filler = { type = \"bilinear\" }",
        );
        assert!(
            err.contains("weight_filler.type") && err.contains("square"),
            "{err}"
        );
        let err = params_error(
            "deconvolution",
            "num_output = 2\nkernel_size = 4\nbias_filler = { type = \"bilinear\" }",
        );
        assert!(err.contains("bias_filler.type"), "{err}");
    }

    #[test]
    fn rejects_bad_settings() {
        let new = |keys: &str| params_error("deconvolution", keys);
        assert!(new("kernel_size = 3").contains("num_output"));
        let err = new("num_output = 2");
        assert!(
            err.contains("kernel_size") && err.contains("deconvolution"),
            "{err}"
        );
        assert!(new("num_output = 3\nkernel_size = 1\ngroup = 2").contains("group"));
        let mut l = deconv("num_output = 2\nkernel_size = 1\ngroup = 2");
        assert!(l.reshape(&[&[1, 3, 4, 4]]).is_err());
        let mut l = deconv("num_output = 2\nkernel_size = 1\npad = 1");
        let err = l.reshape(&[&[1, 2, 2, 2]]).unwrap_err().to_string();
        assert!(err.contains("`pad`"), "{err}");
        let mut fixed = deconv("num_output = 2\nkernel_size = 1");
        fixed.reshape(&[&[1, 2, 4, 4]]).unwrap();
        assert!(fixed.reshape(&[&[3, 3, 4, 4]]).is_err());
    }
}
