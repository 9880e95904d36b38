//! One test body for every GPU layer: build the CPU layer and the GPU layer from the same
//! `[[layer]]` table, give both the same random bottoms, parameters, top diffs and pre-existing
//! gradients, and compare the tops, the bottom diffs (accumulated and overwritten) and the
//! parameter diffs (accumulated and overwritten). A layer that can run channels-last is checked
//! twice: on NCHW blobs and on NHWC ones (converted on the host on the way in and out).
//!
//! For the layers that run on half-type blobs, [`half_blobs_match_fp32_blobs`] compares the layer
//! on half-type blobs with the same layer on FP32 blobs in mixed precision, bit for bit; and
//! [`net_of`] gives the graph whose nodes build a fused chain.

use super::{build, BackwardPass, ForwardPass, GpuCtx, GpuLayer, Grad, LayerBlobs, StatePass};
use crate::backend::Cpu;
use crate::config::{LayerConfig, Phase};
use crate::cuda::blob::{Elem, GpuBlob};
use crate::cuda::layout::{convert, runs_channels_last, Layout};
use crate::cuda::test_util::assert_close;
use crate::cuda::Gpu;
use crate::layers::gradient_check::{label_blob, layer_config, uniform_blob};
use crate::layers::{self, Ctx};
use crate::net::Net;
use crate::params::ParamSpan;
use crate::precision::Half;
use crate::tensor::Blob;
use cudarc::driver::CudaSlice;

/// Relative tolerance of the layer comparisons (FP32 on both sides).
const RTOL: f32 = 1e-5;

/// A layer and the bottom shapes to test it on.
pub(crate) struct LayerCase {
    pub cfg: LayerConfig,
    pub bottoms: Vec<Vec<usize>>,
    /// Bottom 1 holds labels in `[0, classes)` instead of uniform values (classifier layers).
    pub labels: Option<usize>,
    /// Label positions replaced by this value (to exercise `ignore_label`).
    pub ignored: Option<(f32, Vec<usize>)>,
    /// The loss weight a loss layer's top diff holds.
    pub loss_weight: f32,
    /// Fixed data of bottoms 0 and 1 instead of random values (hand-made cases; the second is
    /// ignored for a layer of one bottom).
    pub fixed: Option<(Vec<f32>, Vec<f32>)>,
}

impl LayerCase {
    pub fn new(toml_text: &str, bottoms: Vec<Vec<usize>>) -> LayerCase {
        LayerCase {
            cfg: layer_config(toml_text),
            bottoms,
            labels: None,
            ignored: None,
            loss_weight: 1.0,
            fixed: None,
        }
    }

    /// Bottom 1 holds labels of `classes` classes.
    pub fn with_labels(mut self, classes: usize) -> LayerCase {
        self.labels = Some(classes);
        self
    }

    /// Labels at `rows` become `value`.
    pub fn with_ignored(mut self, value: f32, rows: Vec<usize>) -> LayerCase {
        self.ignored = Some((value, rows));
        self
    }

    pub fn with_loss_weight(mut self, w: f32) -> LayerCase {
        self.loss_weight = w;
        self
    }
}

fn upload(gpu: &Gpu, v: &[f32]) -> CudaSlice<f32> {
    let mut padded = v.to_vec();
    if padded.is_empty() {
        padded.push(0.0);
    }
    gpu.compute.clone_htod(&padded).unwrap()
}

fn download(gpu: &Gpu, v: &CudaSlice<f32>, n: usize) -> Vec<f32> {
    let out = gpu.compute.clone_dtoh(&v.slice(..n)).unwrap();
    gpu.synchronize().unwrap();
    out
}

/// The CPU twin of `gctx` (a CPU of one thread, no reducer), for the CPU reference layer.
pub(crate) fn cpu_ctx<'a>(cpu: &'a Cpu, gctx: &GpuCtx<'_>) -> Ctx<'a> {
    Ctx {
        cpu,
        phase: gctx.phase,
        iter: gctx.iter,
        seed: gctx.seed,
        first_sample: gctx.first_sample,
        reducer: None,
    }
}

/// What one GPU layer runs on in a test: its blobs (the bottoms, then the tops), and its
/// parameters and their gradient `(param_len)` on the device.
pub(crate) struct Fixture {
    pub blobs: Vec<GpuBlob>,
    pub bottoms: Vec<usize>,
    pub tops: Vec<usize>,
    pub params: CudaSlice<f32>,
    pub param_diff: CudaSlice<f32>,
    pub param_len: usize,
}

impl Fixture {
    /// `blobs` of which the last `tops` are the tops; `params` and `param_diff` of one length.
    pub fn new(gpu: &Gpu, blobs: Vec<GpuBlob>, tops: usize, params: &[f32], diff: &[f32]) -> Self {
        assert_eq!(params.len(), diff.len(), "parameters and their gradient");
        let nb = blobs.len() - tops;
        Fixture {
            bottoms: (0..nb).collect(),
            tops: (nb..blobs.len()).collect(),
            blobs,
            params: upload(gpu, params),
            param_diff: upload(gpu, diff),
            param_len: params.len(),
        }
    }

    /// Runs `layer`'s forward in `ctx`.
    pub fn forward(&mut self, gpu: &Gpu, ctx: &GpuCtx<'_>, layer: &mut dyn GpuLayer) {
        layer
            .forward(ForwardPass {
                gpu,
                ctx,
                blobs: LayerBlobs::new(&mut self.blobs, &self.bottoms, &self.tops),
                params: self.params.slice(..self.param_len),
                half: None,
            })
            .unwrap();
    }

    /// Runs `layer`'s update of its state in the parameters.
    pub fn update_state(&mut self, gpu: &Gpu, ctx: &GpuCtx<'_>, layer: &mut dyn GpuLayer) {
        let params = self.params.slice_mut(..self.param_len);
        layer.update_state(StatePass { gpu, ctx, params }).unwrap();
    }

    /// Runs `layer`'s backward in `ctx`, the bottoms' diffs as `grads` says and the parameters'
    /// as `param_grad` says.
    pub fn backward(
        &mut self,
        (gpu, ctx): (&Gpu, &GpuCtx<'_>),
        layer: &mut dyn GpuLayer,
        grads: &[Grad],
        param_grad: Grad,
    ) {
        layer
            .backward(BackwardPass {
                gpu,
                ctx,
                blobs: LayerBlobs::new(&mut self.blobs, &self.bottoms, &self.tops),
                grads,
                params: self.params.slice(..self.param_len),
                half: None,
                param_grad,
                param_diff: self.param_diff.slice_mut(..self.param_len),
            })
            .unwrap();
    }

    /// The parameters' gradient on the host.
    pub fn param_diff(&self, gpu: &Gpu) -> Vec<f32> {
        download(gpu, &self.param_diff, self.param_len)
    }
}

/// Runs `case` on the CPU and the GPU from the same random state drawn from `seed` and asserts
/// that they agree (see the module docs).
pub(crate) fn check_against_cpu(gpu: &Gpu, case: &LayerCase, seed: u64) {
    check_against_cpu_rtol(gpu, case, seed, RTOL);
}

/// [`check_against_cpu`] with another relative tolerance (TF32 math).
pub(crate) fn check_against_cpu_rtol(gpu: &Gpu, case: &LayerCase, seed: u64, rtol: f32) {
    check_in_layout(gpu, case, seed, rtol, Layout::Nchw);
    // Whether the layer runs channels-last depends on its bottom count (Scale, Bias).
    let mut wired = case.cfg.clone();
    wired.bottom = (0..case.bottoms.len()).map(|i| format!("b{i}")).collect();
    if runs_channels_last(&wired) {
        check_in_layout(gpu, case, seed, rtol, Layout::Nhwc);
    }
}

/// A host blob (NCHW) on the device in `layout`.
fn to_device(gpu: &Gpu, b: &Blob, layout: Layout) -> GpuBlob {
    let mut stored = b.clone();
    stored.data = convert(&b.data, &b.shape, Layout::Nchw, layout);
    stored.diff = convert(&b.diff, &b.shape, Layout::Nchw, layout);
    GpuBlob::from_host(gpu, &stored).unwrap()
}

/// A device blob stored in `layout` back on the host as NCHW.
fn to_host(gpu: &Gpu, b: &GpuBlob, layout: Layout) -> Blob {
    let mut host = b.to_host(gpu).unwrap();
    host.data = convert(&host.data, &host.shape, layout, Layout::Nchw);
    host.diff = convert(&host.diff, &host.shape, layout, Layout::Nchw);
    host
}

/// One run of [`check_against_cpu`] with the GPU layer's blobs stored in `layout`.
fn check_in_layout(gpu: &Gpu, case: &LayerCase, seed: u64, rtol: f32, layout: Layout) {
    let name = &format!("{} ({layout:?})", case.cfg.name);
    let gctx = GpuCtx::local(Phase::Train, 0, 1, 0);
    let cpu = Cpu::new(1);
    let ctx = cpu_ctx(&cpu, &gctx);
    let mut cpu_layer = layers::build_from_config(&case.cfg).unwrap();
    let shapes: Vec<&[usize]> = case.bottoms.iter().map(Vec::as_slice).collect();
    let top_shapes = cpu_layer.reshape(&shapes).unwrap();
    let mut gpu_layer = build(
        gpu,
        &case.cfg.name,
        &case.cfg.params().unwrap(),
        &shapes,
        layout,
        None,
        false,
    )
    .unwrap();

    // Bottoms with random data and random pre-existing diffs.
    let mut bottoms: Vec<Blob> = case
        .bottoms
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut b = match case.labels {
                Some(classes) if i == 1 => {
                    let mut l = label_blob(s.iter().product(), classes, seed + 10 + i as u64);
                    l.shape = s.clone();
                    l
                }
                _ => uniform_blob(s, -2.0, 2.0, seed + 10 + i as u64),
            };
            b.diff = uniform_blob(s, -1.0, 1.0, seed + 20 + i as u64).data;
            b
        })
        .collect();
    if let Some((b0, b1)) = &case.fixed {
        bottoms[0].data.clone_from(b0);
        if let Some(b) = bottoms.get_mut(1) {
            b.data.clone_from(b1);
        }
    }
    if let Some((value, rows)) = &case.ignored {
        for &r in rows {
            bottoms[1].data[r] = *value;
        }
    }
    let propagate: Vec<bool> = (0..bottoms.len())
        .map(|i| !(case.labels.is_some() && i == 1))
        .collect();

    // Parameters and pre-existing parameter gradients, flat in spec order.
    let specs = cpu_layer.param_specs();
    let p_len: usize = specs
        .iter()
        .map(|s| s.shape.iter().product::<usize>())
        .sum();
    let p_data = uniform_blob(&[p_len], -1.0, 1.0, seed + 30).data;
    let p_diff0 = uniform_blob(&[p_len], -1.0, 1.0, seed + 31).data;
    let views = |flat: &[f32]| -> Vec<Vec<f32>> {
        let mut off = 0;
        specs
            .iter()
            .map(|s| {
                let n: usize = s.shape.iter().product();
                off += n;
                flat[off - n..off].to_vec()
            })
            .collect()
    };

    // CPU forward.
    let mut cpu_tops: Vec<Blob> = top_shapes.iter().map(|s| Blob::new(s)).collect();
    let p_views = views(&p_data);
    let p_refs: Vec<&[f32]> = p_views.iter().map(Vec::as_slice).collect();
    cpu_layer.forward(layers::ForwardPass {
        ctx: &ctx,
        bottoms: &bottoms,
        params: &p_refs,
        tops: &mut cpu_tops,
    });

    // GPU forward: blobs = bottoms then tops; tops start as NaN to catch unwritten elements.
    let mut blobs: Vec<GpuBlob> = bottoms.iter().map(|b| to_device(gpu, b, layout)).collect();
    for s in &top_shapes {
        let mut t = GpuBlob::new(gpu, s, 0).unwrap();
        let n = t.count();
        gpu.kernels
            .fill(&gpu.compute, &mut t.data, f32::NAN, n)
            .unwrap();
        blobs.push(t);
    }
    let mut gpu_run = Fixture::new(gpu, blobs, top_shapes.len(), &p_data, &p_diff0);
    gpu_run.forward(gpu, &gctx, gpu_layer.as_mut());
    for (j, &t) in gpu_run.tops.iter().enumerate() {
        let got = to_host(gpu, &gpu_run.blobs[t], layout);
        assert_eq!(got.shape, top_shapes[j], "{name}: top {j} shape");
        assert_close(
            &format!("{name}: top {j} data"),
            &got.data,
            &cpu_tops[j].data,
            rtol,
        );
    }
    if !cpu_layer.has_backward() {
        return;
    }

    // Top diffs: the loss weight for a loss, random otherwise.
    for (j, t) in cpu_tops.iter_mut().enumerate() {
        if cpu_layer.is_loss() {
            t.diff.fill(case.loss_weight);
        } else {
            t.diff = uniform_blob(&t.shape, -1.0, 1.0, seed + 40 + j as u64).data;
        }
        let n = t.count();
        let gt = &mut gpu_run.blobs[gpu_run.tops[j]];
        let stored = convert(&t.diff, &t.shape, Layout::Nchw, layout);
        gpu.compute
            .memcpy_htod(&stored[..n], &mut gt.diff.slice_mut(..n))
            .unwrap();
    }

    // Accumulating backward: the CPU contract.
    let mut cpu_bottoms = bottoms.clone();
    let mut p_diff_views = views(&p_diff0);
    let mut p_diff_refs: Vec<&mut [f32]> = p_diff_views.iter_mut().map(Vec::as_mut_slice).collect();
    cpu_layer.backward(layers::BackwardPass {
        ctx: &ctx,
        tops: &cpu_tops,
        propagate_down: &propagate,
        bottoms: &mut cpu_bottoms,
        params: &p_refs,
        param_diffs: &mut p_diff_refs,
    });
    let cpu_p_diff: Vec<f32> = p_diff_views.concat();
    let grads: Vec<Grad> = propagate
        .iter()
        .map(|&p| if p { Grad::Accumulate } else { Grad::Skip })
        .collect();
    let run = (gpu, &gctx);
    gpu_run.backward(run, gpu_layer.as_mut(), &grads, Grad::Accumulate);
    for (i, want) in cpu_bottoms.iter().enumerate() {
        let got = to_host(gpu, &gpu_run.blobs[i], layout);
        assert_close(
            &format!("{name}: bottom {i} diff (accumulated)"),
            &got.diff,
            &want.diff,
            rtol,
        );
    }
    assert_close(
        &format!("{name}: parameter diff"),
        &gpu_run.param_diff(gpu),
        &cpu_p_diff,
        rtol,
    );

    // Overwriting backward (bottoms and parameters): equals the CPU's accumulation into zeroed
    // diffs; the old GPU diffs are NaN so that any read of them shows.
    let mut cpu_zeroed = bottoms.clone();
    for b in &mut cpu_zeroed {
        b.diff.fill(0.0);
    }
    let mut scratch: Vec<Vec<f32>> = specs
        .iter()
        .map(|s| vec![0.0; s.shape.iter().product()])
        .collect();
    let mut scratch_refs: Vec<&mut [f32]> = scratch.iter_mut().map(Vec::as_mut_slice).collect();
    cpu_layer.backward(layers::BackwardPass {
        ctx: &ctx,
        tops: &cpu_tops,
        propagate_down: &propagate,
        bottoms: &mut cpu_zeroed,
        params: &p_refs,
        param_diffs: &mut scratch_refs,
    });
    let grads: Vec<Grad> = propagate
        .iter()
        .map(|&p| if p { Grad::Overwrite } else { Grad::Skip })
        .collect();
    for (i, &p) in propagate.iter().enumerate() {
        if p {
            let b = &mut gpu_run.blobs[i];
            let n = b.count();
            gpu.kernels
                .fill(&gpu.compute, &mut b.diff, f32::NAN, n)
                .unwrap();
        }
    }
    gpu.kernels
        .fill(&gpu.compute, &mut gpu_run.param_diff, f32::NAN, p_len)
        .unwrap();
    gpu_run.backward(run, gpu_layer.as_mut(), &grads, Grad::Overwrite);
    for (i, &p) in propagate.iter().enumerate() {
        if p {
            let got = to_host(gpu, &gpu_run.blobs[i], layout);
            assert_close(
                &format!("{name}: bottom {i} diff (overwritten)"),
                &got.diff,
                &cpu_zeroed[i].diff,
                rtol,
            );
        }
    }
    assert_close(
        &format!("{name}: parameter diff (overwritten)"),
        &gpu_run.param_diff(gpu),
        &scratch.concat(),
        rtol,
    );
}

/// `layer_matches_cpu!(test_name, toml_text, bottom_shapes, seed);`: a test `test_name` that
/// runs [`check_against_cpu`] on the layer `toml_text` describes over `bottom_shapes`, with FP32
/// math, or skips loudly where there is no GPU. Several such tests in one table:
/// `layer_matches_cpu! { test_name: toml_text, bottom_shapes, seed; … }`.
macro_rules! layer_matches_cpu {
    ($test:ident, $toml:expr, $bottoms:expr, $seed:expr) => {
        #[test]
        fn $test() {
            let name = concat!(module_path!(), "::", stringify!($test));
            let math = $crate::config::MathMode::Fp32;
            if let Some(gpu) = $crate::cuda::test_util::gpu_for_test(name, math) {
                let case = $crate::cuda::layers::testing::LayerCase::new($toml, $bottoms);
                $crate::cuda::layers::testing::check_against_cpu(&gpu, &case, $seed);
            }
        }
    };
    ($($test:ident: $toml:expr, $bottoms:expr, $seed:expr;)+) => {
        $($crate::cuda::layers::testing::layer_matches_cpu!($test, $toml, $bottoms, $seed);)+
    };
}
pub(crate) use layer_matches_cpu;

/// The graph and parameter layout of a net around `layers` (`[[layer]]` tables reading the blob
/// `data` of synthetic records of `record = [C, H, W]`), for tests that build a fused chain from
/// its nodes. The tables should end in a loss, as a trainable net does.
pub(crate) fn net_of(layers: &str, record: [usize; 3]) -> (Net, Vec<ParamSpan>) {
    let [c, h, w] = record;
    let text = format!(
        "data = {{ format = \"synthetic\", shape = [{c}, {h}, {w}], classes = 10, batch_size = 2 }}\n\
         solver = {{ base_lr = 0.1, max_iter = 1 }}\n{layers}"
    );
    let (cfg, _) = crate::validate::load_str("t.toml", &text, std::path::Path::new("."), &[])
        .unwrap_or_else(|e| panic!("bad test net: {e}"));
    let (graph, params) = Net::build(&cfg, record, 1).unwrap();
    (graph, params.spans)
}

/// A layer on half-type blobs against the same layer on FP32 blobs, both in mixed precision:
/// see [`half_blobs_match_fp32_blobs`].
pub(crate) struct HalfBlobsCase {
    /// Names the case in failures.
    pub what: String,
    pub half: Half,
    pub phase: Phase,
    pub bottoms: Vec<Vec<usize>>,
    pub tops: Vec<Vec<usize>>,
    /// The layer's view of the flat parameters.
    pub params: Vec<f32>,
    /// The backward passes, in turn: what happens to each bottom's diff and to the parameters'
    /// gradient. Before each, the bottoms' diffs and the parameter gradient hold the same random
    /// values (accumulated into) or NaN (to be overwritten).
    pub backward: Vec<(Vec<Grad>, Grad)>,
    pub seed: u64,
}

/// Writes `values` into `b`'s values (or, `diff`, its gradient) as `b` stores them: FP32, or the
/// half type's bit patterns (rounded).
fn write_stored(gpu: &Gpu, b: &mut GpuBlob, diff: bool, values: &[f32]) {
    let s = &gpu.compute;
    match b.elem() {
        Elem::F32 => {
            let mut dst = if diff { b.diff_mut() } else { b.data_mut() };
            s.memcpy_htod(values, &mut dst).unwrap();
        }
        Elem::Half(h) => {
            let bits: Vec<u16> = values.iter().map(|&v| h.bits(v)).collect();
            let mut dst = if diff {
                b.half_diff_mut()
            } else {
                b.half_data_mut()
            };
            s.memcpy_htod(&bits, &mut dst).unwrap();
        }
    }
}

/// `b`'s values (or, `diff`, its gradient) on the host, half-type ones widened.
fn read_stored(gpu: &Gpu, b: &GpuBlob, diff: bool) -> Vec<f32> {
    let s = &gpu.compute;
    gpu.synchronize().unwrap();
    let values = match b.elem() {
        Elem::F32 => s
            .clone_dtoh(&if diff { b.diff() } else { b.data() })
            .unwrap(),
        Elem::Half(h) => {
            let bits = if diff { b.half_diff() } else { b.half_data() };
            let bits = s.clone_dtoh(&bits).unwrap();
            gpu.synchronize().unwrap();
            bits.into_iter().map(|x| h.widen(x)).collect()
        }
    };
    gpu.synchronize().unwrap();
    values
}

/// The random state both runs of [`half_blobs_match_fp32_blobs`] start from.
struct HalfBlobsInputs {
    bottoms: Vec<Vec<f32>>,
    bottom_diffs: Vec<Vec<f32>>,
    top_diffs: Vec<Vec<f32>>,
    param_diff: Vec<f32>,
}

/// One run of `layer` on blobs stored as `elem`: every top and, after each backward pass, every
/// bottom's diff and the parameter gradient, named.
fn half_blobs_run(
    gpu: &Gpu,
    case: &HalfBlobsCase,
    layer: &mut dyn GpuLayer,
    elem: Elem,
    inputs: &HalfBlobsInputs,
) -> Vec<(String, Vec<f32>)> {
    let ctx = GpuCtx::local(case.phase, 0, 1, 0);
    let shapes = case.bottoms.iter().chain(&case.tops);
    let mut blobs: Vec<GpuBlob> = shapes
        .map(|s| GpuBlob::new_as(gpu, s, 0, elem).unwrap())
        .collect();
    for (b, x) in blobs.iter_mut().zip(&inputs.bottoms) {
        write_stored(gpu, b, false, x);
    }
    // Tops start as NaN, so that an element the layer leaves unwritten shows.
    for b in &mut blobs[case.bottoms.len()..] {
        let nan = vec![f32::NAN; b.count()];
        write_stored(gpu, b, false, &nan);
    }
    let mut run = Fixture::new(
        gpu,
        blobs,
        case.tops.len(),
        &case.params,
        &inputs.param_diff,
    );
    run.forward(gpu, &ctx, layer);
    let mut out = Vec::new();
    for (j, &t) in run.tops.iter().enumerate() {
        out.push((format!("top {j}"), read_stored(gpu, &run.blobs[t], false)));
        write_stored(gpu, &mut run.blobs[t], true, &inputs.top_diffs[j]);
    }
    for (k, (grads, param_grad)) in case.backward.iter().enumerate() {
        for (i, g) in grads.iter().enumerate() {
            let diff = match g {
                Grad::Overwrite => vec![f32::NAN; inputs.bottom_diffs[i].len()],
                _ => inputs.bottom_diffs[i].clone(),
            };
            write_stored(gpu, &mut run.blobs[i], true, &diff);
        }
        let param_diff = match param_grad {
            Grad::Overwrite => vec![f32::NAN; case.params.len()],
            _ => inputs.param_diff.clone(),
        };
        if !param_diff.is_empty() {
            let mut dst = run.param_diff.slice_mut(..param_diff.len());
            gpu.compute.memcpy_htod(&param_diff, &mut dst).unwrap();
        }
        run.backward((gpu, &ctx), layer, grads, *param_grad);
        let pass = format!("backward {k} ({grads:?}, parameters {param_grad:?})");
        for i in 0..grads.len() {
            let diff = read_stored(gpu, &run.blobs[i], true);
            out.push((format!("{pass}: bottom {i} diff"), diff));
        }
        out.push((format!("{pass}: parameter diff"), run.param_diff(gpu)));
    }
    out
}

/// Runs the layer `build(half_blobs)` makes (rounding to `case.half`, as the net builds it in
/// mixed precision) on FP32 blobs and on half-type blobs, from the same half-type bottoms, top
/// diffs and pre-existing bottom diffs and the same parameters, and asserts that the tops, the
/// bottom diffs of every backward pass (widened) and the parameter gradients are the same bits;
/// and that the tops and bottom diffs on FP32 blobs are half-type values without NaN (the layer
/// rounds itself and writes every element).
pub(crate) fn half_blobs_match_fp32_blobs(
    gpu: &Gpu,
    case: &HalfBlobsCase,
    build: impl Fn(bool) -> Box<dyn GpuLayer>,
) {
    let h = case.half;
    let mut seed = case.seed;
    let mut rounded = |shape: &[usize], lo: f32, hi: f32| {
        seed += 1;
        let mut v = uniform_blob(shape, lo, hi, seed).data;
        h.round_slice(&mut v);
        v
    };
    let inputs = HalfBlobsInputs {
        bottoms: case.bottoms.iter().map(|s| rounded(s, -2.0, 2.0)).collect(),
        bottom_diffs: case.bottoms.iter().map(|s| rounded(s, -1.0, 1.0)).collect(),
        top_diffs: case.tops.iter().map(|s| rounded(s, -1.0, 1.0)).collect(),
        param_diff: uniform_blob(&[case.params.len()], -1.0, 1.0, case.seed + 100).data,
    };
    let fp32 = half_blobs_run(gpu, case, build(false).as_mut(), Elem::F32, &inputs);
    let half = half_blobs_run(gpu, case, build(true).as_mut(), Elem::Half(h), &inputs);
    let what = &case.what;
    for ((name, want), (_, got)) in fp32.iter().zip(&half) {
        assert_eq!(got.len(), want.len(), "{what}: {name}: lengths differ");
        if !name.ends_with("parameter diff") {
            let bad = want.iter().position(|&v| v.is_nan() || !h.holds(v));
            if let Some(i) = bad {
                panic!(
                    "{what}: {name} on FP32 blobs: element {i}, {}, not a half-type value",
                    want[i]
                );
            }
        }
        let differ: Vec<usize> = (0..want.len())
            .filter(|&i| want[i].to_bits() != got[i].to_bits())
            .collect();
        if let Some(&i) = differ.first() {
            panic!(
                "{what}: {name}: {} of {} elements differ; at {i}: FP32 blobs {} ({:#010x}), \
                 half-type blobs {} ({:#010x})",
                differ.len(),
                want.len(),
                want[i],
                want[i].to_bits(),
                got[i],
                got[i].to_bits()
            );
        }
    }
}
