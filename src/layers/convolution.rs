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

use crate::config::layer_params::ConvolutionParams;
use crate::config::FillerConfig;
use crate::error::{Error, Result};
use crate::layers::spatial::{Geometry, Pair};
use crate::layers::{one_bottom, Ctx, Layer};
use crate::params::ParamSpec;
use crate::tensor::Blob;
use rayon::prelude::*;

/// Floats the column and output buffers of one chunk of samples may take together (8 MiB: a
/// chunk stays in cache between its im2col and its GEMM).
pub const COLUMN_BUDGET: usize = 1 << 21;

/// The convolution layer; see the module docs.
#[derive(Debug, Clone)]
pub struct Convolution {
    name: String,
    num_output: usize,
    bias_term: bool,
    group: usize,
    kernel: Pair,
    stride: Pair,
    pad: Pair,
    dilation: Pair,
    weight_filler: FillerConfig,
    bias_filler: FillerConfig,
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
    /// Floats a chunk's buffers may take ([`COLUMN_BUDGET`]; smaller in tests).
    column_budget: usize,
}

impl Convolution {
    /// The layer `name` with parameters `p`.
    pub fn new(name: &str, p: &ConvolutionParams) -> Self {
        Convolution {
            name: name.to_string(),
            num_output: p.num_output,
            bias_term: p.bias_term,
            group: p.group,
            kernel: p.kernel,
            stride: p.stride,
            pad: p.pad,
            dilation: p.dilation,
            weight_filler: p.weight_filler.clone(),
            bias_filler: p.bias_filler.clone(),
            channels: None,
            num: 0,
            geometry: Geometry::default(),
            col: Vec::new(),
            out: Vec::new(),
            ones: Vec::new(),
            column_budget: COLUMN_BUDGET,
        }
    }
}

impl Convolution {
    /// Floats one sample takes in the chunk buffers.
    fn floats_per_sample(&self) -> usize {
        let g = self.geometry;
        (g.col_rows() + self.num_output) * g.col_cols()
    }

    /// Samples per chunk: as many as fit the column budget, at least 1, at most the batch.
    fn chunk(&self) -> usize {
        (self.column_budget / self.floats_per_sample().max(1)).clamp(1, self.num.max(1))
    }

    /// Sizes the buffers for chunks of `samples`; allocates only when they grow (reshape itself
    /// allocates nothing, so that validation can call it freely).
    fn buffers(&mut self, samples: usize) {
        let g = self.geometry;
        let ld = samples * g.col_cols();
        for (buf, rows) in [
            (&mut self.col, g.col_rows()),
            (&mut self.out, self.num_output),
        ] {
            if buf.len() < rows * ld {
                buf.resize(rows * ld, 0.0);
            }
        }
        if self.ones.len() < ld {
            self.ones.resize(ld, 1.0);
        }
    }
}

/// `col (C·kh·kw, S·P)` = the columns under `g` of samples `first..first + S` of
/// `images (N, C, H, W)`, side by side; rows in parallel on the rayon pool when `parallel`.
fn columns(
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
fn add_columns(
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
        let shape = one_bottom(&self.name, bottoms)?;
        let &[n, c, h, w] = shape else {
            return err(format!(
                "takes a bottom (N, C, H, W), got {shape:?} (2-D convolution only)"
            ));
        };
        if c % self.group != 0 {
            return err(format!(
                "`group` {} does not divide the {c} channels of the bottom",
                self.group
            ));
        }
        match self.channels {
            Some(c0) if c0 != c => {
                return err(format!(
                    "bottom {shape:?} has {c} channels, the weight expects {c0}"
                ))
            }
            _ => self.channels = Some(c),
        }
        let mut output = [0; 2];
        for (a, size) in [h, w].into_iter().enumerate() {
            let span = self.dilation[a] * (self.kernel[a] - 1) + 1;
            let padded = size + 2 * self.pad[a];
            if padded < span {
                return err(format!(
                    "the kernel spans {span} pixels, more than the padded input ({padded}) of bottom {shape:?}"
                ));
            }
            output[a] = (padded - span) / self.stride[a] + 1;
        }
        self.geometry = Geometry {
            channels: c,
            input: [h, w],
            kernel: self.kernel,
            stride: self.stride,
            pad: self.pad,
            dilation: self.dilation,
            output,
        };
        self.num = n;
        Ok(vec![vec![n, self.num_output, output[0], output[1]]])
    }

    /// `weight` `(num_output, C/group, kh, kw)`, then `bias` `(num_output)` if `bias_term`.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let c = self.channels.unwrap_or(0) / self.group;
        let mut specs = vec![ParamSpec {
            name: "weight".into(),
            shape: vec![self.num_output, c, self.kernel[0], self.kernel[1]],
            filler: self.weight_filler.clone(),
        }];
        if self.bias_term {
            specs.push(ParamSpec {
                name: "bias".into(),
                shape: vec![self.num_output],
                filler: self.bias_filler.clone(),
            });
        }
        specs
    }

    fn forward(&mut self, ctx: &Ctx, bottoms: &[Blob], params: &[&[f32]], tops: &mut [Blob]) {
        let g = self.geometry;
        let (groups, p) = (self.group, g.col_cols());
        let m = self.num_output / groups;
        let k = g.col_rows() / groups;
        let out_len = self.num_output * p;
        let chunk = self.chunk();
        let parallel = ctx.cpu.threads > 1;
        self.buffers(chunk);
        let mut first = 0;
        while first < self.num {
            let samples = chunk.min(self.num - first);
            let ld = samples * p;
            columns(
                &g,
                &mut self.col,
                &bottoms[0].data,
                first,
                samples,
                parallel,
            );
            for gi in 0..groups {
                ctx.cpu.gemm(
                    false,
                    false,
                    m,
                    ld,
                    k,
                    1.0,
                    &params[0][gi * m * k..(gi + 1) * m * k],
                    &self.col[gi * k * ld..(gi + 1) * k * ld],
                    0.0,
                    &mut self.out[gi * m * ld..(gi + 1) * m * ld],
                );
            }
            // Sample j's channel r is row r's columns j·P..(j+1)·P, plus the bias.
            let top = &mut tops[0].data[first * out_len..(first + samples) * out_len];
            for (j, sample) in top.chunks_exact_mut(out_len).enumerate() {
                for (r, plane) in sample.chunks_exact_mut(p).enumerate() {
                    let src = &self.out[r * ld + j * p..r * ld + (j + 1) * p];
                    match self.bias_term {
                        true => {
                            let b = params[1][r];
                            plane.iter_mut().zip(src).for_each(|(d, &v)| *d = v + b);
                        }
                        false => plane.copy_from_slice(src),
                    }
                }
            }
            first += samples;
        }
    }

    fn backward(
        &mut self,
        ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        params: &[&[f32]],
        param_diffs: &mut [&mut [f32]],
    ) {
        let g = self.geometry;
        let (groups, p) = (self.group, g.col_cols());
        let m = self.num_output / groups;
        let k = g.col_rows() / groups;
        let out_len = self.num_output * p;
        let weight = params[0];
        let chunk = self.chunk();
        let parallel = ctx.cpu.threads > 1;
        self.buffers(chunk);
        let bottom = &mut bottoms[0];
        let mut first = 0;
        while first < self.num {
            let samples = chunk.min(self.num - first);
            let ld = samples * p;
            // dy (num_output, S·P): sample j's channel r in row r, columns j·P..(j+1)·P.
            let dtop = &tops[0].diff[first * out_len..(first + samples) * out_len];
            for (j, sample) in dtop.chunks_exact(out_len).enumerate() {
                for (r, plane) in sample.chunks_exact(p).enumerate() {
                    self.out[r * ld + j * p..r * ld + (j + 1) * p].copy_from_slice(plane);
                }
            }
            let dy = &self.out[..self.num_output * ld];
            if self.bias_term {
                ctx.cpu.gemm(
                    false,
                    false,
                    self.num_output,
                    1,
                    ld,
                    1.0,
                    dy,
                    &self.ones[..ld],
                    1.0,
                    param_diffs[1],
                );
            }
            columns(&g, &mut self.col, &bottom.data, first, samples, parallel);
            for gi in 0..groups {
                ctx.cpu.gemm(
                    false,
                    true,
                    m,
                    k,
                    ld,
                    1.0,
                    &dy[gi * m * ld..(gi + 1) * m * ld],
                    &self.col[gi * k * ld..(gi + 1) * k * ld],
                    1.0,
                    &mut param_diffs[0][gi * m * k..(gi + 1) * m * k],
                );
            }
            if propagate_down[0] {
                for gi in 0..groups {
                    ctx.cpu.gemm(
                        true,
                        false,
                        k,
                        ld,
                        m,
                        1.0,
                        &weight[gi * m * k..(gi + 1) * m * k],
                        &dy[gi * m * ld..(gi + 1) * m * ld],
                        0.0,
                        &mut self.col[gi * k * ld..(gi + 1) * k * ld],
                    );
                }
                add_columns(&g, &self.col, &mut bottom.diff, first, samples, parallel);
            }
            first += samples;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::config::Phase;
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::test_util::ctx;

    fn conv(extra: &str) -> Convolution {
        from_config(
            Convolution::new,
            &layer_config(&format!("name = \"conv\"\ntype = \"convolution\"\n{extra}")),
        )
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
        let mut top = vec![Blob::new(&tops[0])];
        top[0].data.fill(f32::NAN);
        let cpu = Cpu::new(1);
        let with_bias = specs.len() == 2;
        let params: Vec<&[f32]> = if with_bias { vec![&w, &b] } else { vec![&w] };
        layer.forward(
            &ctx(&cpu, Phase::Train),
            std::slice::from_ref(&x),
            &params,
            &mut top,
        );
        let g = layer.geometry;
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
        let tops = layer.reshape(&[&[1, 1, 3, 3]]).unwrap();
        let mut x = Blob::new(&[1, 1, 3, 3]);
        x.data = (1..=9).map(|v| v as f32).collect();
        let mut top = vec![Blob::new(&tops[0])];
        let cpu = Cpu::new(1);
        layer.forward(
            &ctx(&cpu, Phase::Train),
            &[x],
            &[&[1.0; 4], &[0.5]],
            &mut top,
        );
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

    fn gradient(extra: &str, shape: [usize; 4]) {
        let bottom = uniform_blob(&shape, -1.0, 1.0, 31);
        let mut layer = conv(extra);
        let report = GradientChecker::default()
            .check(&mut layer, &[bottom], &[true])
            .unwrap();
        report.assert_ok();
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
        let mut top = vec![Blob::new(&tops[0])];
        top[0].diff = uniform_blob(&tops[0], -1.0, 1.0, 44).data;
        let cpu = Cpu::new(threads);
        let mut bottoms = [x];
        layer.forward(&ctx(&cpu, Phase::Train), &bottoms, &[&w, &b], &mut top);
        let (mut dw, mut db) = (vec![1.0; w.len()], vec![1.0; b.len()]);
        layer.backward(
            &ctx(&cpu, Phase::Train),
            &top,
            &[true],
            &mut bottoms,
            &[&w, &b],
            &mut [&mut dw, &mut db],
        );
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
            layer.column_budget = samples * layer.floats_per_sample();
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
        layer.column_budget = 2 * layer.floats_per_sample();
        let report = GradientChecker::default()
            .check(&mut layer, &[bottom], &[true])
            .unwrap();
        report.assert_ok();
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
        let new = |extra: &str| {
            layer_config(&format!("name = \"c\"\ntype = \"convolution\"\n{extra}"))
                .params()
                .unwrap_err()
                .to_string()
        };
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
