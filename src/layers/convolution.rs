//! `Convolution`: Caffe's 2-D convolution (cross-correlation) through `im2col` and GEMM, with
//! `group`, `dilation`, `pad`, `stride` and an optional bias.
//!
//! Shapes: bottom `(N, C, H, W)`, top `(N, num_output, OH, OW)` with
//! `OH = (H + 2·ph − (dh·(kh − 1) + 1)) / sh + 1` (floor), likewise `OW`.
//!
//! Learnable tensors, in order: `weight` `(num_output, C/group, kh, kw)` (PyTorch's layout),
//! filled by `weight_filler` (default xavier), and `bias` `(num_output)` when `bias_term`
//! (default true), filled by `bias_filler` (default constant 0). `C` is fixed by the first reshape.
//!
//! The batch is processed in chunks of `S` samples (as many as [`COLUMN_BUDGET`] allows, at least
//! one), whose columns lie side by side: with `M = num_output/group`, `K = C/group·kh·kw`,
//! `P = OH·OW`, per group `g` one GEMM `out_g (M, S·P) = W_g (M, K) · col_g (K, S·P)` where
//! `col = im2col` of the chunk's samples (sample `j` in columns `j·P..(j+1)·P`); the outputs are
//! then copied to the top with the bias added. Backward gathers the top's gradient as
//! `dy (num_output, S·P)`, recomputes `col`, and computes `db += dy · ones`,
//! `dW_g += dy_g · col_gᵀ`, `dcol_g = W_gᵀ · dy_g` and `dbottom += col2im(dcol)` per sample.
//! Large GEMMs keep the cores busy where one GEMM per sample (Caffe's way) would be too small to
//! share. The buffers are kept in the layer and reused across steps.

use crate::backend::Cpu;
use crate::config::layer_params::ConvolutionParams;
use crate::error::{Error, Result};
use crate::layers::spatial::{image_bottom, Geometry};
use crate::layers::{weight_and_bias, BackwardPass, CpuLayer, ForwardPass, Layer};
use crate::params::ParamSpec;
use rayon::prelude::*;

/// Floats the column and output buffers of one chunk of samples may take together (8 MiB: a
/// chunk stays in cache between its im2col and its GEMM).
pub const COLUMN_BUDGET: usize = 1 << 21;

cpu_layer! {
    /// The convolution layer; see the module docs.
    pub type Convolution = CpuLayer<ConvolutionParams, Columns>;
}

/// The geometry of the current bottom and the buffers of its passes, kept and reused.
#[derive(Debug, Clone, Default)]
pub struct Columns {
    /// Input channels, fixed by the first reshape.
    channels: Option<usize>,
    /// Batch of the current bottom.
    num: usize,
    geometry: Geometry,
    /// `(C·kh·kw, S·OH·OW)` columns of a chunk of `S` samples (backward: also their gradient).
    col: Vec<f32>,
    /// `(num_output, S·OH·OW)` the chunk's outputs (forward) or top gradient (backward).
    out: Vec<f32>,
    /// `(S·OH·OW)` ones for the bias gradient.
    ones: Vec<f32>,
    /// Floats a chunk's buffers may take; `None`: [`COLUMN_BUDGET`] (smaller in tests).
    pub(crate) column_budget: Option<usize>,
}

/// The GEMM sizes of one pass: per group, the weight `W_g (M, K)` with `M = num_output/group`
/// and `K = C/group·kh·kw`; `P = OH·OW` outputs per sample, `S` samples per chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemms {
    pub groups: usize,
    pub m: usize,
    pub k: usize,
    pub p: usize,
    pub chunk: usize,
    /// Whether im2col and col2im spread over the rayon pool.
    pub parallel: bool,
}

impl Gemms {
    /// `(first, S)` of each chunk of a batch of `num` samples.
    pub(crate) fn chunks(&self, num: usize) -> impl Iterator<Item = (usize, usize)> {
        let chunk = self.chunk;
        (0..num)
            .step_by(chunk)
            .map(move |first| (first, chunk.min(num - first)))
    }

    /// Group `gi`'s block of a matrix of `rows` rows per group and `cols` columns.
    pub(crate) fn block(&self, gi: usize, rows: usize, cols: usize) -> std::ops::Range<usize> {
        gi * rows * cols..(gi + 1) * rows * cols
    }

    /// `C_g ← op(A_g)·op(B_g) + beta·C_g` for every group `g`, each group's block of `a`, `b`
    /// and `c` after the previous group's (see [`GroupGemm`]).
    pub(crate) fn per_group(&self, cpu: &Cpu, g: GroupGemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        for gi in 0..self.groups {
            cpu.gemm(
                g.trans_a,
                g.trans_b,
                g.m,
                g.n,
                g.k,
                1.0,
                &a[self.block(gi, g.m, g.k)],
                &b[self.block(gi, g.k, g.n)],
                g.beta,
                &mut c[self.block(gi, g.m, g.n)],
            );
        }
    }
}

/// One group's product in [`Gemms::per_group`]: `op(A_g)` is `(m, k)`, `op(B_g)` `(k, n)` and
/// `C_g` `(m, n)`, `op` transposing where `trans_a` / `trans_b` say.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupGemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub beta: f32,
}

impl Columns {
    /// The columns of a layer whose input has `channels` channels (fixed by the first call:
    /// an error naming `layer` when they change) under `geometry`, for a batch of `num`.
    pub(crate) fn set(
        &mut self,
        layer: &str,
        channels: usize,
        geometry: Geometry,
        num: usize,
    ) -> Result<()> {
        match self.channels {
            Some(c0) if c0 != channels => {
                return Err(Error::net(
                    layer,
                    format!("the bottom has {channels} channels, the weight expects {c0}"),
                ))
            }
            _ => self.channels = Some(channels),
        }
        self.geometry = geometry;
        self.num = num;
        Ok(())
    }

    /// The channels of the first call (0 before it).
    pub(crate) fn channels(&self) -> usize {
        self.channels.unwrap_or(0)
    }

    pub(crate) fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Floats one sample takes in the chunk buffers, with `out_rows` rows of outputs.
    fn floats_per_sample(&self, out_rows: usize) -> usize {
        let g = self.geometry;
        (g.col_rows() + out_rows) * g.col_cols()
    }

    /// Samples per chunk: as many as fit the column budget, at least 1, at most the batch.
    fn chunk(&self, out_rows: usize) -> usize {
        let budget = self.column_budget.unwrap_or(COLUMN_BUDGET);
        (budget / self.floats_per_sample(out_rows).max(1)).clamp(1, self.num.max(1))
    }

    /// The sizes of a pass on `cpu` whose GEMMs have `out_rows` rows of outputs (`M·groups`)
    /// against the columns, with the buffers sized for its chunks: they grow only here, never
    /// in reshape, so that validation can reshape freely.
    pub(crate) fn prepare(&mut self, out_rows: usize, groups: usize, cpu: &Cpu) -> Gemms {
        let g = self.geometry;
        let sizes = Gemms {
            groups,
            m: out_rows / groups,
            k: g.col_rows() / groups,
            p: g.col_cols(),
            chunk: self.chunk(out_rows),
            parallel: cpu.threads > 1,
        };
        let ld = sizes.chunk * sizes.p;
        for (buf, rows) in [(&mut self.col, g.col_rows()), (&mut self.out, out_rows)] {
            if buf.len() < rows * ld {
                buf.resize(rows * ld, 0.0);
            }
        }
        if self.ones.len() < ld {
            self.ones.resize(ld, 1.0);
        }
        sizes
    }

    /// The column buffer and the output rows of a pass, both mutable.
    pub(crate) fn buffers(&mut self) -> (&mut [f32], &mut [f32]) {
        (&mut self.col, &mut self.out)
    }
}

impl Convolution {
    /// Floats one sample takes in the chunk buffers.
    #[cfg(test)]
    fn floats_per_sample(&self) -> usize {
        self.state.floats_per_sample(self.settings.num_output)
    }

    /// Samples per chunk: as many as fit the column budget, at least 1, at most the batch.
    #[cfg(test)]
    fn chunk(&self) -> usize {
        self.state.chunk(self.settings.num_output)
    }

    /// The sizes of a pass on `cpu`, with the buffers sized for its chunks.
    fn prepare(&mut self, cpu: &Cpu) -> Gemms {
        let s = &self.settings;
        self.state.prepare(s.num_output, s.group, cpu)
    }
}

/// `rows (R, S·P)` ← the chunk of samples `(S, R, P)`: sample `j`'s channel `r` in row `r`,
/// columns `j·P..(j+1)·P` (the layout of the GEMMs' outputs).
pub(crate) fn gather_rows(chunk: &[f32], rows: &mut [f32], r_len: usize, p: usize) {
    let ld = chunk.len() / r_len;
    for (j, sample) in chunk.chunks_exact(r_len * p).enumerate() {
        for (r, plane) in sample.chunks_exact(p).enumerate() {
            rows[r * ld + j * p..r * ld + (j + 1) * p].copy_from_slice(plane);
        }
    }
}

/// The chunk of samples `(S, R, P)` ← `rows (R, S·P)` (laid out as [`gather_rows`] reads them)
/// plus `bias[r]` where given; `+=` instead with `add`.
pub(crate) fn scatter_rows(
    rows: &[f32],
    chunk: &mut [f32],
    (r_len, p): (usize, usize),
    bias: Option<&[f32]>,
    add: bool,
) {
    let ld = chunk.len() / r_len;
    for (j, sample) in chunk.chunks_exact_mut(r_len * p).enumerate() {
        for (r, plane) in sample.chunks_exact_mut(p).enumerate() {
            let src = &rows[r * ld + j * p..r * ld + (j + 1) * p];
            let b = bias.map_or(0.0, |b| b[r]);
            match add {
                true => plane.iter_mut().zip(src).for_each(|(d, &v)| *d += v + b),
                false => plane.iter_mut().zip(src).for_each(|(d, &v)| *d = v + b),
            }
        }
    }
}

/// `col (C·kh·kw, S·P)` = the columns under `g` of samples `first..first + S` of
/// `images (N, C, H, W)`, side by side; rows in parallel on the rayon pool when `parallel`.
pub(crate) fn columns(
    g: &Geometry,
    col: &mut [f32],
    images: &[f32],
    first: usize,
    samples: usize,
    parallel: bool,
) {
    let (in_len, p) = (g.channels * g.input[0] * g.input[1], g.col_cols());
    let ld = samples * p;
    let fill_row = |(r, row): (usize, &mut [f32])| {
        for (j, dst) in row.chunks_exact_mut(p).enumerate() {
            let n = first + j;
            g.im2col_row(r, &images[n * in_len..(n + 1) * in_len], dst);
        }
    };
    let rows = &mut col[..g.col_rows() * ld];
    if parallel {
        rows.par_chunks_mut(ld).enumerate().for_each(fill_row);
    } else {
        rows.chunks_mut(ld).enumerate().for_each(fill_row);
    }
}

/// `images (N, C, H, W) += col2im(col)` for samples `first..first + S`, whose columns lie side
/// by side in `col (C·kh·kw, S·P)`; samples in parallel on the rayon pool when `parallel`.
pub(crate) fn add_columns(
    g: &Geometry,
    col: &[f32],
    images: &mut [f32],
    first: usize,
    samples: usize,
    parallel: bool,
) {
    let (in_len, p) = (g.channels * g.input[0] * g.input[1], g.col_cols());
    let ld = samples * p;
    let add_sample = |(j, image): (usize, &mut [f32])| {
        for r in 0..g.col_rows() {
            g.col2im_row_add(r, &col[r * ld + j * p..r * ld + (j + 1) * p], image);
        }
    };
    let chunk = &mut images[first * in_len..(first + samples) * in_len];
    if parallel {
        chunk
            .par_chunks_mut(in_len)
            .enumerate()
            .for_each(add_sample);
    } else {
        chunk.chunks_mut(in_len).enumerate().for_each(add_sample);
    }
}

impl Layer for Convolution {
    fn type_name(&self) -> &'static str {
        "convolution"
    }

    /// One bottom `(N, C, H, W)`; top `(N, num_output, OH, OW)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let err = |msg: String| Err(Error::net(&self.name, msg));
        let shape @ [n, c, h, w] = image_bottom(&self.name, "convolution", bottoms)?;
        let s = &self.settings;
        if c % s.group != 0 {
            return err(format!(
                "`group` {} does not divide the {c} channels of the bottom",
                s.group
            ));
        }
        let mut output = [0; 2];
        for (a, size) in [h, w].into_iter().enumerate() {
            let span = s.dilation[a] * (s.kernel[a] - 1) + 1;
            let padded = size + 2 * s.pad[a];
            if padded < span {
                return err(format!(
                    "the kernel spans {span} pixels, more than the padded input ({padded}) of bottom {shape:?}"
                ));
            }
            output[a] = (padded - span) / s.stride[a] + 1;
        }
        let geometry = Geometry {
            channels: c,
            input: [h, w],
            kernel: s.kernel,
            stride: s.stride,
            pad: s.pad,
            dilation: s.dilation,
            output,
        };
        self.state.set(&self.name, c, geometry, n)?;
        Ok(vec![vec![n, s.num_output, output[0], output[1]]])
    }

    /// `weight` `(num_output, C/group, kh, kw)`, then `bias` `(num_output)` if `bias_term`.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let s = &self.settings;
        let c = self.state.channels.unwrap_or(0) / s.group;
        weight_and_bias(
            vec![s.num_output, c, s.kernel[0], s.kernel[1]],
            &s.weight_filler,
            s.bias_term.then_some(&s.bias_filler),
        )
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let gemms = self.prepare(pass.ctx.cpu);
        let Gemms { m, k, p, .. } = gemms;
        let (g, weight) = (self.state.geometry, pass.params[0]);
        let out_len = self.settings.num_output * p;
        for (first, samples) in gemms.chunks(self.state.num) {
            let ld = samples * p;
            let images = &pass.bottoms[0].data;
            columns(
                &g,
                &mut self.state.col,
                images,
                first,
                samples,
                gemms.parallel,
            );
            gemms.per_group(
                pass.ctx.cpu,
                GroupGemm {
                    trans_a: false,
                    trans_b: false,
                    m,
                    n: ld,
                    k,
                    beta: 0.0,
                },
                weight,
                &self.state.col,
                &mut self.state.out,
            );
            // Sample j's channel r is row r's columns j·P..(j+1)·P, plus the bias.
            let top = &mut pass.tops[0].data[first * out_len..(first + samples) * out_len];
            let bias = self.settings.bias_term.then(|| pass.params[1]);
            let out = &self.state.out[..self.settings.num_output * ld];
            scatter_rows(out, top, (self.settings.num_output, p), bias, false);
        }
    }

    fn backward(&mut self, pass: BackwardPass<'_>) {
        let gemms = self.prepare(pass.ctx.cpu);
        let Gemms { m, k, p, .. } = gemms;
        let (g, cpu, weight) = (self.state.geometry, pass.ctx.cpu, pass.params[0]);
        let (tops, param_diffs) = (pass.tops, pass.param_diffs);
        let num_output = self.settings.num_output;
        let out_len = num_output * p;
        let bottom = &mut pass.bottoms[0];
        for (first, samples) in gemms.chunks(self.state.num) {
            let ld = samples * p;
            // dy (num_output, S·P): sample j's channel r in row r, columns j·P..(j+1)·P.
            let dtop = &tops[0].diff[first * out_len..(first + samples) * out_len];
            gather_rows(dtop, &mut self.state.out[..num_output * ld], num_output, p);
            let dy = &self.state.out[..num_output * ld];
            if self.settings.bias_term {
                let ones = &self.state.ones[..ld];
                cpu.gemm(
                    false,
                    false,
                    num_output,
                    1,
                    ld,
                    1.0,
                    dy,
                    ones,
                    1.0,
                    param_diffs[1],
                );
            }
            columns(
                &g,
                &mut self.state.col,
                &bottom.data,
                first,
                samples,
                gemms.parallel,
            );
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
                dy,
                &self.state.col,
                param_diffs[0],
            );
            if pass.propagate_down[0] {
                gemms.per_group(
                    cpu,
                    GroupGemm {
                        trans_a: true,
                        trans_b: false,
                        m: k,
                        n: ld,
                        k: m,
                        beta: 0.0,
                    },
                    weight,
                    dy,
                    &mut self.state.col,
                );
                let parallel = gemms.parallel;
                add_columns(
                    &g,
                    &self.state.col,
                    &mut bottom.diff,
                    first,
                    samples,
                    parallel,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Phase;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, ctx, forward, forward_in, layer, params_error};
    use crate::tensor::Blob;

    fn conv(keys: &str) -> Convolution {
        layer::<ConvolutionParams>("convolution", keys)
    }

    /// A direct 6-loop convolution with groups: `(N, C, H, W)` → `(N, M, OH, OW)`.
    #[allow(clippy::too_many_arguments)]
    fn direct(
        x: &Blob,
        w: &[f32],
        b: Option<&[f32]>,
        m: usize,
        group: usize,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
        out: [usize; 2],
    ) -> Vec<f32> {
        let [n, c, h, wd] = x.shape[..] else { panic!() };
        let (cg, mg) = (c / group, m / group);
        let mut y = vec![0.0f64; n * m * out[0] * out[1]];
        for ni in 0..n {
            for mi in 0..m {
                let gi = mi / mg;
                for oy in 0..out[0] {
                    for ox in 0..out[1] {
                        let mut acc = b.map_or(0.0, |b| b[mi] as f64);
                        for ci in 0..cg {
                            for ki in 0..k[0] {
                                for kj in 0..k[1] {
                                    let iy = (oy * s[0] + ki * d[0]) as isize - p[0] as isize;
                                    let ix = (ox * s[1] + kj * d[1]) as isize - p[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xc = gi * cg + ci;
                                    let xv = x.data
                                        [((ni * c + xc) * h + iy as usize) * wd + ix as usize];
                                    let wv = w[((mi * cg + ci) * k[0] + ki) * k[1] + kj];
                                    acc += xv as f64 * wv as f64;
                                }
                            }
                        }
                        y[((ni * m + mi) * out[0] + oy) * out[1] + ox] = acc;
                    }
                }
            }
        }
        y.into_iter().map(|v| v as f32).collect()
    }

    fn against_direct(extra: &str, shape: [usize; 4], m: usize, group: usize, seed: u64) {
        let mut layer = conv(&format!("num_output = {m}\n{extra}"));
        let tops = layer.reshape(&[&shape]).unwrap();
        let specs = layer.param_specs();
        let w = uniform_blob(&specs[0].shape, -1.0, 1.0, seed).data;
        let b = uniform_blob(&[m], -1.0, 1.0, seed + 1).data;
        let x = uniform_blob(&shape, -1.0, 1.0, seed + 2);
        let with_bias = specs.len() == 2;
        let params: Vec<&[f32]> = if with_bias { vec![&w, &b] } else { vec![&w] };
        let top = forward(&mut layer, std::slice::from_ref(&x), &params);
        assert_eq!(top[0].shape, tops[0]);
        let g = layer.state.geometry;
        let want = direct(
            &x,
            &w,
            with_bias.then_some(&b[..]),
            m,
            group,
            g.kernel,
            g.stride,
            g.pad,
            g.dilation,
            g.output,
        );
        assert_eq!(top[0].data.len(), want.len());
        for (i, (a, e)) in top[0].data.iter().zip(&want).enumerate() {
            assert!((a - e).abs() < 1e-4, "{extra}: [{i}] {a} vs {e}");
        }
    }

    #[test]
    fn output_size_follows_caffe() {
        let mut layer = conv("num_output = 4\nkernel_size = 3\npad = 1\nstride = 2");
        assert_eq!(
            layer.reshape(&[&[2, 3, 7, 8]]).unwrap(),
            vec![vec![2, 4, 4, 4]]
        );
        let mut layer = conv("num_output = 4\nkernel_size = [3, 2]\ndilation = 2");
        // span 5 × 3: (7 − 5) + 1 = 3, (8 − 3) + 1 = 6.
        assert_eq!(
            layer.reshape(&[&[1, 2, 7, 8]]).unwrap(),
            vec![vec![1, 4, 3, 6]]
        );
        let specs = layer.param_specs();
        assert_eq!(specs[0].shape, vec![4, 2, 3, 2]);
        assert_eq!(specs[1].shape, vec![4]);
    }

    #[test]
    fn forward_by_hand() {
        // 1×1×3×3 input, 2×2 kernel of ones, bias 0.5: each output is a 2×2 window sum + 0.5.
        let mut layer = conv("num_output = 1\nkernel_size = 2");
        let x = blob(
            &[1, 1, 3, 3],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        );
        let top = forward(&mut layer, &[x], &[&[1.0; 4], &[0.5]]);
        assert_eq!(top[0].data, vec![12.5, 16.5, 24.5, 28.5]);
    }

    #[test]
    fn forward_matches_a_direct_loop() {
        against_direct("kernel_size = 3", [2, 3, 5, 6], 4, 1, 1);
        against_direct("kernel_size = 3\npad = 1", [2, 3, 5, 6], 4, 1, 2);
        against_direct(
            "kernel_size = [3, 2]\nstride = [2, 1]\npad = [1, 0]",
            [1, 2, 7, 5],
            3,
            1,
            3,
        );
        against_direct(
            "kernel_size = 3\ndilation = 2\npad = 2",
            [2, 2, 6, 6],
            2,
            1,
            4,
        );
        against_direct(
            "kernel_size = 2\ngroup = 2\nbias_term = false",
            [2, 4, 4, 5],
            6,
            2,
            5,
        );
    }

    fn gradient(keys: &str, shape: [usize; 4]) {
        let bottom = uniform_blob(&shape, -1.0, 1.0, 31);
        let report = GradientChecker::default().assert_passes(&mut conv(keys), &[bottom], &[true]);
        assert!(report.checked > 0);
    }

    #[test]
    fn gradient_plain() {
        gradient("num_output = 3\nkernel_size = 3", [2, 2, 5, 5]);
    }

    #[test]
    fn gradient_pad_and_stride() {
        gradient(
            "num_output = 3\nkernel_size = 3\npad = 1\nstride = 2",
            [2, 2, 6, 5],
        );
    }

    #[test]
    fn gradient_rectangular_kernel_and_dilation() {
        gradient(
            "num_output = 2\nkernel_size = [2, 3]\ndilation = [2, 1]\npad = [1, 2]",
            [1, 3, 6, 5],
        );
    }

    #[test]
    fn one_by_one_kernels_match_a_direct_loop() {
        against_direct("kernel_size = 1", [2, 4, 3, 5], 6, 1, 6);
        against_direct("kernel_size = 1\ngroup = 2", [2, 4, 3, 5], 6, 2, 7);
        against_direct("kernel_size = 1\nstride = 2", [1, 2, 5, 5], 3, 1, 8);
        gradient("num_output = 4\nkernel_size = 1\ngroup = 2", [2, 4, 3, 3]);
    }

    /// Top, bottom gradient and parameter gradients of one forward and backward of `layer` on
    /// fixed random inputs (the parameter gradients accumulate onto ones, as over micro-batches).
    fn pass(layer: &mut Convolution, shape: [usize; 4], threads: usize) -> [Vec<f32>; 4] {
        let tops = layer.reshape(&[&shape]).unwrap();
        let specs = layer.param_specs();
        let w = uniform_blob(&specs[0].shape, -1.0, 1.0, 41).data;
        let b = uniform_blob(&specs[1].shape, -1.0, 1.0, 42).data;
        let mut x = uniform_blob(&shape, -1.0, 1.0, 43);
        x.diff.fill(0.5);
        let cpu = Cpu::new(threads);
        let ctx = ctx(&cpu, Phase::Train);
        let mut bottoms = [x];
        let mut top = forward_in(&ctx, layer, &bottoms, &[&w, &b]);
        top[0].diff = uniform_blob(&tops[0], -1.0, 1.0, 44).data;
        let (mut dw, mut db) = (vec![1.0; w.len()], vec![1.0; b.len()]);
        layer.backward(BackwardPass {
            ctx: &ctx,
            tops: &top,
            propagate_down: &[true],
            bottoms: &mut bottoms,
            params: &[&w, &b],
            param_diffs: &mut [&mut dw, &mut db],
        });
        let [x] = bottoms;
        [top.remove(0).data, x.diff, dw, db]
    }

    /// The batch in chunks of 1, 2 (the last one short) and 5 samples, on 1 and 2 threads: the
    /// same results to rounding (the chunks change only the order of the weight-gradient sums).
    #[test]
    fn chunks_and_threads_change_nothing_but_rounding() {
        let extra = "num_output = 4\nkernel_size = 3\npad = 1\nstride = 2\ngroup = 2";
        let shape = [5, 2, 7, 6];
        let mut whole = conv(extra);
        let want = pass(&mut whole, shape, 1);
        assert_eq!(whole.chunk(), 5);
        for (samples, threads) in [(1, 1), (2, 2), (2, 1), (5, 2)] {
            let mut layer = conv(extra);
            layer.reshape(&[&shape]).unwrap();
            layer.state.column_budget = Some(samples * layer.floats_per_sample());
            assert_eq!(layer.chunk(), samples);
            let got = pass(&mut layer, shape, threads);
            for (what, (g, w)) in ["top", "bottom diff", "weight diff", "bias diff"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                assert_eq!(g.len(), w.len());
                for (i, (a, e)) in g.iter().zip(w).enumerate() {
                    assert!(
                        (a - e).abs() <= 1e-5 * e.abs().max(1.0),
                        "chunks of {samples}, {threads} threads: {what}[{i}] {a} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn gradient_in_chunks_of_two() {
        let bottom = uniform_blob(&[3, 2, 5, 4], -1.0, 1.0, 32);
        let mut layer = conv("num_output = 3\nkernel_size = 3\npad = 1");
        layer.reshape(&[&[3, 2, 5, 4]]).unwrap();
        layer.state.column_budget = Some(2 * layer.floats_per_sample());
        let report = GradientChecker::default().assert_passes(&mut layer, &[bottom], &[true]);
        assert!(report.checked > 0);
    }

    #[test]
    fn gradient_groups_without_bias() {
        gradient(
            "num_output = 4\nkernel_size = 2\ngroup = 2\nbias_term = false",
            [2, 4, 4, 4],
        );
    }

    #[test]
    fn rejects_bad_settings() {
        let new = |keys: &str| params_error("convolution", keys);
        assert!(new("kernel_size = 3").contains("num_output"));
        assert!(new("num_output = 2").contains("kernel_size"));
        assert!(new("num_output = 2\nkernel_size = 0").contains("kernel_size"));
        assert!(new("num_output = 2\nkernel_size = 1\nstride = 0").contains("stride"));
        assert!(new("num_output = 3\nkernel_size = 1\ngroup = 2").contains("group"));
        let mut layer = conv("num_output = 2\nkernel_size = 1\ngroup = 2");
        assert!(layer.reshape(&[&[1, 3, 4, 4]]).is_err());
        assert!(layer.reshape(&[&[1, 4, 4]]).is_err());
        let mut big = conv("num_output = 2\nkernel_size = 5");
        let err = big.reshape(&[&[1, 1, 4, 4]]).unwrap_err().to_string();
        assert!(err.contains("spans 5"), "{err}");
        let mut fixed = conv("num_output = 2\nkernel_size = 1");
        fixed.reshape(&[&[1, 2, 4, 4]]).unwrap();
        assert!(fixed.reshape(&[&[3, 2, 5, 5]]).is_ok());
        assert!(fixed.reshape(&[&[3, 3, 5, 5]]).is_err());
    }
}
