//! Tests of [`GpuNet`]: the backward plan (runs without a GPU), and on a GPU the whole net of
//! `tests/configs/equivalence.toml` against the CPU [`Net`] — outputs, parameter gradients,
//! the layer-done order, a smaller batch, and a few full training steps with the solvers.

use super::*;
use crate::backend::Cpu;
use crate::config::{GpuLayout, MathMode};
use crate::cuda::test_util::{assert_close, gpu_or_skip};
use crate::cuda::update::GpuSolver;
use crate::layers::gradient_check::uniform_blob;
use crate::layers::Ctx;
use crate::solver::Solver;
use crate::validate::load_str;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

/// Gradients of the whole net agree to this relative tolerance (FP32, different summation
/// orders through three layers).
const RTOL: f32 = 1e-4;

/// Relative tolerances of a comparison with the CPU net: losses, and the tensors (gradients,
/// weights, running statistics).
#[derive(Clone, Copy)]
struct Tolerance {
    loss: f32,
    tensors: f32,
}

/// FP32 against FP32.
const FP32: Tolerance = Tolerance {
    loss: 1e-5,
    tensors: RTOL,
};

/// bf16 against the CPU's bf16 rounding: a sum taken in another order lands on the other side
/// of a rounding boundary now and then, one bf16 step (2⁻⁸ relative) in that element, which the
/// layers after it carry on.
const BF16: Tolerance = Tolerance {
    loss: 2e-3,
    tensors: 1e-2,
};

const RECORD: [usize; 3] = [1, 8, 8];

/// `tests/configs/equivalence.toml`, embedded so that the test binary runs from any directory
/// (on a GPU machine without the source tree).
fn equivalence_config() -> Config {
    let text = include_str!("../../../tests/configs/equivalence.toml");
    config_of("equivalence.toml", text)
}

/// A batch of `n` digit-like records in [0, 1) and labels in [0, 10).
fn batch(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    batch_of(n, RECORD, seed)
}

/// A batch of `n` records of shape `record` with values in [0, 1) and labels in [0, 10).
fn batch_of(n: usize, record: [usize; 3], seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let len: usize = record.iter().product();
    let data = (0..n * len).map(|_| rng.gen_range(0.0..1.0)).collect();
    let labels = (0..n).map(|_| rng.gen_range(0..10) as f32).collect();
    (data, labels)
}

fn ctx(cpu: &Cpu, phase: Phase) -> Ctx<'_> {
    Ctx {
        cpu,
        phase,
        iter: 0,
        seed: 7,
        first_sample: 0,
        reducer: None,
    }
}

/// The GPU pass of [`ctx`].
fn pass(phase: Phase) -> PassCtx {
    PassCtx {
        phase,
        iter: 0,
        first_sample: 0,
    }
}

/// Losses agree closely; accuracies of a batch of `n` to within one sample, since two scores
/// a rounding apart may rank differently (the layer tests check the counting itself exactly).
fn assert_outputs(what: &str, got: &[Output], want: &[Output], n: usize) {
    assert_outputs_at(what, got, want, n, FP32.loss);
}

/// [`assert_outputs`] with losses compared at `loss_rtol`.
fn assert_outputs_at(what: &str, got: &[Output], want: &[Output], n: usize, loss_rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((&g.name, g.is_loss), (&w.name, w.is_loss), "{what}");
        if w.is_loss {
            assert_close(
                &format!("{what}: {}", w.name),
                &[g.value],
                &[w.value],
                loss_rtol,
            );
        } else {
            let (gc, wc) = (
                crate::layers::accuracy::count_from_fraction(g.value, n),
                crate::layers::accuracy::count_from_fraction(w.value, n),
            );
            assert!(
                gc.abs_diff(wc) <= 1,
                "{what}: {} {gc}/{n} vs {wc}/{n}",
                w.name
            );
        }
    }
}

/// Runs without a GPU: the staging copy is exact on both sides of the parallel threshold,
/// including a last piece shorter than the others.
#[test]
fn staging_copy_copies_every_float() {
    for n in [
        0,
        5,
        PARALLEL_COPY_MIN - 1,
        PARALLEL_COPY_MIN + COPY_PIECE / 2 + 3,
    ] {
        let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let mut dst = vec![f32::NAN; n];
        copy_to_staging(&mut dst, &src);
        assert_eq!(dst, src, "{n} floats");
    }
}

/// The training phase's backward plan of `graph` with parameters `spans`, run as `slots` say.
fn train_plan(graph: &Net, spans: &[ParamSpan], slots: &[Slot]) -> BackwardPlan {
    let reads = fusion::reads_of(graph, slots);
    BackwardPlan::new(graph, Phase::Train, spans, slots, &reads)
}

#[test]
fn plan_of_the_equivalence_net_overwrites_every_gradient() {
    let cfg = equivalence_config();
    let (graph, layout) = Net::build(&cfg, RECORD, 4).unwrap();
    let slots = vec![Slot::Own; graph.len()];
    let train = train_plan(&graph, &layout.spans, &slots);
    // Every activation gradient has one contributor and the loss top starts at its weight,
    // so nothing is zero-filled.
    assert!(train.zero.is_empty(), "{train:?}");
    assert_eq!(train.loss_tops.len(), 1);
    assert_eq!(train.loss_tops[0].1, 1.0);
    // ip1 reads data: no gradient; the others overwrite; the loss skips its labels.
    assert_eq!(train.grads[0], vec![Grad::Skip]);
    for i in 1..5 {
        assert_eq!(train.grads[i], vec![Grad::Overwrite], "layer {i}");
    }
    assert_eq!(train.grads[5], vec![Grad::Overwrite, Grad::Skip]);
    // Accuracy layers have no backward.
    assert_eq!(train.grads[6], vec![Grad::Skip, Grad::Skip]);
    assert!(train.idle_param_layers.is_empty());
}

#[test]
fn plan_overwrites_from_the_last_consumer_and_zeroes_idle_parameters() {
    let text = include_str!("testdata/two_consumers_and_a_test_probe.toml");
    let cfg: Config = toml::from_str(text).unwrap();
    let (graph, layout) = Net::build(&cfg, RECORD, 4).unwrap();
    let slots = vec![Slot::Own; graph.len()];
    let plan = train_plan(&graph, &layout.spans, &slots);
    // `ip` has two contributors: `b`, whose backward runs first, overwrites its gradient and
    // `a` adds to it. The probe's top needs a gradient nobody writes in training: zeroed.
    let probe = graph.node(5).tops[0];
    assert_eq!(plan.zero, vec![probe]);
    assert_eq!(plan.grads[1], vec![Grad::Accumulate]);
    assert_eq!(plan.grads[2], vec![Grad::Overwrite]);
    assert_eq!(plan.grads[3][0], Grad::Overwrite);
    let weights: Vec<f32> = plan.loss_tops.iter().map(|&(_, w)| w).collect();
    assert_eq!(weights, vec![1.0, 0.5]);
    // The test-phase probe has parameters but no backward in training.
    assert_eq!(plan.idle_param_layers, vec![5]);
}

/// In the residual net, `cat` feeds the Scale and the grouped convolution: the convolution's
/// backward runs first and overwrites; the fused sum → ReLU chain runs at its ReLU's turn.
#[test]
fn plan_of_the_residual_net_overwrites_from_the_convolution() {
    let text = include_str!("../../../tests/configs/cnn_equivalence.toml");
    let cfg: Config = load_str("t.toml", text, Path::new("."), &[]).unwrap().0;
    let (graph, layout) = Net::build(&cfg, RECORD, 4).unwrap();
    let slots = fusion::plan(&graph, &layout.spans, false);
    let at = |name: &str| {
        (0..graph.len())
            .find(|&i| graph.layer_name(i) == name)
            .unwrap()
    };
    assert!(matches!(slots[at("sum")], Slot::Head { .. }));
    let plan = train_plan(&graph, &layout.spans, &slots);
    assert!(plan.zero.is_empty(), "{plan:?}");
    assert_eq!(plan.grads[at("conv_c")], vec![Grad::Overwrite]);
    assert_eq!(plan.grads[at("scale")], vec![Grad::Accumulate]);
    assert_eq!(
        plan.grads[at("sum")],
        vec![Grad::Overwrite, Grad::Overwrite]
    );
}

/// Forward and backward of the net of `cfg` (on `RECORD`s) at batch `n` on both backends from
/// the same weights and batch; compares outputs, the gradient, the layer-done order and the loss
/// slot.
fn compare_pass(gpu: &Gpu, cfg: &Config, net: &mut GpuNet, n: usize, seed: u64) {
    let cpu = Cpu::new(1);
    let (mut cpu_net, mut params) = Net::build(cfg, RECORD, n).unwrap();
    Net::init_params(&mut params, seed);
    net.set_batch(gpu, n).unwrap();
    net.params_from_host(gpu, &params).unwrap();
    let (data, labels) = batch(n, seed + 1);
    let (d, l) = cpu_net.inputs_mut();
    d.copy_from_slice(&data);
    l.copy_from_slice(&labels);
    net.load_batch(gpu, &data, &labels).unwrap();

    // Train: forward, backward.
    let want = cpu_net.forward(&ctx(&cpu, Phase::Train), &mut params);
    let mut cpu_order = Vec::new();
    cpu_net.backward(&ctx(&cpu, Phase::Train), &mut params, &mut |i| {
        cpu_order.push(i)
    });
    net.params.zero_grad(gpu).unwrap();
    net.forward(gpu, pass(Phase::Train), None).unwrap();
    net.add_loss_to_slot(gpu, 0, true).unwrap();
    net.add_loss_to_slot(gpu, 0, false).unwrap();
    let mut gpu_order = Vec::new();
    net.backward(gpu, None, &mut |i, _| gpu_order.push(i))
        .unwrap();
    assert_eq!(gpu_order, cpu_order);
    let got = net.outputs(gpu).unwrap();
    assert_outputs(&format!("batch {n}, train"), &got, &want, n);
    let window = net.loss_window(gpu).unwrap();
    assert_eq!(
        window[0],
        2.0 * got[0].value as f64,
        "the slot sums two passes"
    );
    let grads = net.params_to_host(gpu).unwrap();
    assert_close(
        &format!("batch {n}: parameter gradient"),
        &grads.diff,
        &params.diff,
        RTOL,
    );
    assert_eq!(grads.data, params.data);

    // Test: loss and both accuracies.
    let want = cpu_net.forward(&ctx(&cpu, Phase::Test), &mut params);
    net.forward(gpu, pass(Phase::Test), None).unwrap();
    assert_outputs(
        &format!("batch {n}, test"),
        &net.outputs(gpu).unwrap(),
        &want,
        n,
    );
}

#[test]
fn equivalence_net_matches_cpu() {
    let gpu = gpu_or_skip!("equivalence_net_matches_cpu");
    let cfg = equivalence_config();
    let mut net = GpuNet::new(&cfg, RECORD, 64, &gpu).unwrap();
    compare_pass(&gpu, &cfg, &mut net, 64, 801);
    // A smaller batch reuses the allocations; a larger one grows them.
    compare_pass(&gpu, &cfg, &mut net, 23, 802);
    compare_pass(&gpu, &cfg, &mut net, 100, 803);
}

#[test]
fn training_steps_match_cpu() {
    let gpu = gpu_or_skip!("training_steps_match_cpu");
    let cfg = equivalence_config();
    let n = 32;
    let cpu = Cpu::new(1);
    let (mut cpu_net, mut params) = Net::build(&cfg, RECORD, n).unwrap();
    Net::init_params(&mut params, 811);
    let mut cpu_solver = Solver::new(&cfg.solver, params.len());
    let mut net = GpuNet::new(&cfg, RECORD, n, &gpu).unwrap();
    net.params_from_host(&gpu, &params).unwrap();
    let mut gpu_solver = GpuSolver::new(&gpu, &cfg.solver, &net.params.spans).unwrap();
    for iter in 0..5u64 {
        let (data, labels) = batch(n, 820 + iter);
        let (d, l) = cpu_net.inputs_mut();
        d.copy_from_slice(&data);
        l.copy_from_slice(&labels);
        crate::solver::zero_grad(&mut params);
        cpu_net.forward(&ctx(&cpu, Phase::Train), &mut params);
        cpu_net.backward(&ctx(&cpu, Phase::Train), &mut params, &mut |_| {});
        let cpu_lr = cpu_solver.apply(&cpu, iter, &mut params);

        // No zero_grad: the first backward of an iteration overwrites the gradient, which
        // holds the last step's effective gradient here.
        net.load_batch(&gpu, &data, &labels).unwrap();
        net.forward(&gpu, pass(Phase::Train), None).unwrap();
        net.backward_first(&gpu, None, &mut |_, _| {}).unwrap();
        let gpu_lr = gpu_solver.apply(&gpu, iter, &mut net.params).unwrap();
        assert_eq!(gpu_lr, cpu_lr);
    }
    let got = net.params_to_host(&gpu).unwrap();
    assert_close("weights after 5 steps", &got.data, &params.data, RTOL);
}

/// The equivalence net on `gpu` at batch `n`, with the weights of `seed`.
fn equivalence_net(gpu: &Gpu, n: usize, seed: u64) -> GpuNet {
    let cfg = equivalence_config();
    let (_, mut params) = Net::build(&cfg, RECORD, n).unwrap();
    Net::init_params(&mut params, seed);
    let mut net = GpuNet::new(&cfg, RECORD, n, gpu).unwrap();
    net.params_from_host(gpu, &params).unwrap();
    net
}

/// Batches loaded back to back, each followed by its forward with no host synchronisation, each
/// reach their own pass: the copy of a batch into the device buffers of an earlier one waits for
/// that batch's passes, and each pass waits for its own copy. A backlog of GEMMs queued on the
/// compute stream first holds the passes back while the host loads them all, so a missing order
/// shows as a pass computed on another batch's inputs: the first layer's output of each pass,
/// saved on the device after it, must equal that of the same batch run alone.
#[test]
fn inputs_copied_ahead_reach_their_own_pass() {
    let gpu = gpu_or_skip!("inputs_copied_ahead_reach_their_own_pass");
    let n = 4096;
    let mut net = equivalence_net(&gpu, n, 831);
    let top = net.graph.node(0).tops[0];
    let batches: Vec<_> = (0..6).map(|k| batch(n, 840 + k)).collect();
    // Each batch alone: load, forward, wait, read the first layer's output.
    let mut alone = Vec::new();
    for (data, labels) in &batches {
        net.load_batch(&gpu, data, labels).unwrap();
        net.forward(&gpu, pass(Phase::Train), None).unwrap();
        let out = gpu.compute.clone_dtoh(&net.blob(top).data()).unwrap();
        gpu.synchronize().unwrap();
        alone.push(out);
    }
    // About 10 ms of work on the compute stream (40 GEMMs of 2048³) ahead of the passes.
    let m = 2048;
    let a = gpu.compute.alloc_zeros::<f32>(m * m).unwrap();
    let mut c = gpu.compute.alloc_zeros::<f32>(m * m).unwrap();
    for _ in 0..40 {
        gpu.gemm((false, false), (m, m, m), 1.0, &a, &a, 0.0, &mut c)
            .unwrap();
    }
    let len = net.blob(top).count();
    let mut saved: Vec<_> = (0..batches.len())
        .map(|_| gpu.compute.alloc_zeros::<f32>(len).unwrap())
        .collect();
    for ((data, labels), out) in batches.iter().zip(&mut saved) {
        net.load_batch(&gpu, data, labels).unwrap();
        net.forward(&gpu, pass(Phase::Train), None).unwrap();
        gpu.compute.memcpy_dtod(&net.blob(top).data(), out).unwrap();
    }
    for (k, (out, want)) in saved.iter().zip(&alone).enumerate() {
        let got = gpu.compute.clone_dtoh(out).unwrap();
        gpu.synchronize().unwrap();
        assert!(
            got == *want,
            "batch {k}: its pass did not read its own inputs"
        );
    }
}

/// The layer clock times each train layer's forward once, in net order, then the backward of each
/// layer that has one, in reverse order, every span starting after the previous one ends.
#[test]
fn layer_clock_times_every_layer_pass_in_order() {
    let gpu = gpu_or_skip!("layer_clock_times_every_layer_pass_in_order");
    let n = 16;
    let mut net = equivalence_net(&gpu, n, 851);
    let (data, labels) = batch(n, 852);
    net.load_batch(&gpu, &data, &labels).unwrap();
    net.layer_clock.set(true);
    let zero = EventClock::<Name>::event(&gpu).unwrap();
    net.forward(&gpu, pass(Phase::Train), None).unwrap();
    net.backward_first(&gpu, None, &mut |_, _| {}).unwrap();
    let spans = net.layer_clock.spans(&zero).unwrap();
    let runs = |i: &usize| net.graph.node(*i).runs_in(Phase::Train);
    let layers = net.layers.len();
    let forward = (0..layers).filter(runs).map(|i| Name::Forward(i as u32));
    let backward = (0..layers)
        .rev()
        .filter(|i| runs(i) && net.graph.node(*i).needs_backward)
        .map(|i| Name::Backward(i as u32));
    let want: Vec<Name> = forward.chain(backward).collect();
    let got: Vec<Name> = spans.iter().map(|s| s.0).collect();
    assert_eq!(got, want);
    let mut end = 0.0f64;
    for &(name, start, dur) in &spans {
        assert!(
            dur >= 0.0 && start >= end - 1e-3,
            "{name:?} at {start} ms after {end} ms"
        );
        end = start + dur;
    }
    assert_eq!(net.span_names().len(), layers);
}

#[test]
fn tf32_math_stays_close_to_fp32() {
    let gpu = gpu_or_skip!("tf32_math_stays_close_to_fp32", MathMode::Tf32);
    let cfg = equivalence_config();
    let n = 64;
    let cpu = Cpu::new(1);
    let (mut cpu_net, mut params) = Net::build(&cfg, RECORD, n).unwrap();
    Net::init_params(&mut params, 831);
    let (data, labels) = batch(n, 832);
    let (d, l) = cpu_net.inputs_mut();
    d.copy_from_slice(&data);
    l.copy_from_slice(&labels);
    let want = cpu_net.forward(&ctx(&cpu, Phase::Train), &mut params);
    let mut net = GpuNet::new(&cfg, RECORD, n, &gpu).unwrap();
    net.params_from_host(&gpu, &params).unwrap();
    net.load_batch(&gpu, &data, &labels).unwrap();
    net.forward(&gpu, pass(Phase::Train), None).unwrap();
    let got = net.outputs(&gpu).unwrap();
    // TF32 keeps 10 mantissa bits: the loss moves by about 1e-3 relative, not more.
    assert_close("tf32 loss", &[got[0].value], &[want[0].value], 1e-2);
}

#[test]
fn rejects_a_layer_reading_one_blob_twice() {
    let text = include_str!("testdata/one_blob_read_twice.toml");
    // Config validation rejects this net already (scores against 10 classes); the graph the GPU
    // net takes its wiring from refuses it too, for configs that were not validated.
    let cfg: Config = toml::from_str(text).unwrap();
    let err = Net::build(&cfg, RECORD, 4)
        .err()
        .expect("an error")
        .to_string();
    assert!(err.contains("acc") && err.contains("twice"), "{err}");
    Net::build(&equivalence_config(), RECORD, 4).unwrap();
}

/// `tests/configs/cnn_bn_dropout.toml` (convolution, synced BatchNorm + Scale, max and average
/// pooling, Dropout), embedded like [`equivalence_config`].
fn cnn_config() -> Config {
    config_of("cnn_bn_dropout.toml", CNN_TOML)
}

/// `tests/configs/cnn_bn_dropout.toml`, and its ReLU after the first Scale.
const CNN_TOML: &str = include_str!("../../../tests/configs/cnn_bn_dropout.toml");
const CNN_RELU1: &str =
    "[[layer]]\nname = \"relu1\"\ntype = \"relu\"\nbottom = [\"conv1\"]\ntop = [\"conv1\"]\n";

/// The config of TOML `text`, named `name` in errors.
fn config_of(name: &str, text: &str) -> Config {
    load_str(name, text, Path::new("."), &[]).unwrap().0
}

/// The CNN against the CPU net over a few training steps (dropout masks keyed by iteration and
/// sample position, BatchNorm's running statistics moved by each forward): the first step's
/// loss and gradient, then the weights and running statistics after every step, then a test
/// pass with the global statistics.
#[test]
fn cnn_training_steps_match_cpu() {
    let mut gpu = gpu_or_skip!("cnn_training_steps_match_cpu");
    // bn1 → scale1 → relu1 run fused, and so do relu2 → pool2 (average).
    let cfg = cnn_config();
    let chains = [(1, 3), relu_and_pool(&cfg, "relu2")];
    cnn_steps_match_cpu(&mut gpu, &cfg, RECORD, &chains);
}

/// `math = "bf16"`: the CNN (convolutions, synced BatchNorm, Scale, poolings, Dropout, the
/// inner product on half-type operands) against the CPU's bf16 rounding over a few training
/// steps, on three-channel records, NCHW and channels-last, with the chains fused as in FP32
/// (bn1 → scale1 → relu1 rounding each member's result in its kernels, relu2 → pool2). The
/// first gradient is several times closer to the CPU's bf16 one than to its FP32 one, so the
/// GPU rounds where the CPU does.
#[test]
fn bf16_cnn_training_steps_match_the_cpu_rounding() {
    half_cnn_training_steps_match_the_cpu_rounding(MathMode::Bf16);
}

/// [`bf16_cnn_training_steps_match_the_cpu_rounding`] in fp16 (at a loss scale of 1: the net's
/// rounding alone, at the bf16 tolerance, which fp16's three more bits keep well inside).
#[test]
fn fp16_cnn_training_steps_match_the_cpu_rounding() {
    half_cnn_training_steps_match_the_cpu_rounding(MathMode::Fp16);
}

/// The fused chains of the FP32 tests in mixed precision, against the CPU's rounding over a few
/// training steps in both layouts and both half types: BatchNorm → Scale without a ReLU and with
/// a leaky one (whose leak the kernels round), max pooling → ReLU, and the residual sum → ReLU.
/// A ReLU of slope 0.1 before an average pooling stays unfused (the CPU rounds its top).
#[test]
fn half_fused_chains_match_the_cpu_rounding() {
    let name = concat!(module_path!(), "::half_fused_chains_match_the_cpu_rounding");
    let relu2 = "name = \"relu2\"\ntype = \"relu\"\n";
    let pool1 = "kernel_size = 2\nstride = 2\n";
    let after_pool =
        "\n[[layer]]\nname = \"relu1\"\ntype = \"relu\"\nbottom = [\"pool1\"]\ntop = [\"pool1\"]\n";
    let leaky1 = CNN_RELU1.replace(
        "type = \"relu\"\n",
        "type = \"relu\"\nnegative_slope = 0.1\n",
    );
    assert!(CNN_TOML.contains(CNN_RELU1) && CNN_TOML.contains(relu2) && CNN_TOML.contains(pool1));
    let no_relu = config_of("no_relu.toml", &CNN_TOML.replace(CNN_RELU1, ""));
    let leaky = config_of("leaky.toml", &CNN_TOML.replace(CNN_RELU1, &leaky1));
    let after = config_of(
        "relu_after_pool.toml",
        &CNN_TOML
            .replace(CNN_RELU1, "")
            .replacen(pool1, &format!("{pool1}{after_pool}"), 1)
            .replace(relu2, &format!("{relu2}negative_slope = 0.1\n")),
    );
    let pool = after.layers.iter().position(|l| l.name == "pool1").unwrap();
    // A max pooling whose windows overlap (a gradient summed from several tops, then rounded)
    // and an average pooling alone.
    let relu2_layer = format!("[[layer]]\n{relu2}bottom = [\"conv2\"]\ntop = [\"conv2\"]\n");
    assert!(CNN_TOML.contains(&relu2_layer));
    let overlap = config_of(
        "overlapping_pools.toml",
        &CNN_TOML
            .replace(&relu2_layer, "")
            .replacen(pool1, "kernel_size = 3\nstride = 2\n", 1),
    );
    let residual = config_of(
        "cnn_equivalence.toml",
        include_str!("../../../tests/configs/cnn_equivalence.toml"),
    );
    let sum = residual
        .layers
        .iter()
        .position(|l| l.name == "sum")
        .unwrap();
    let cases: [(&Config, Vec<(usize, usize)>); 5] = [
        (&no_relu, vec![(1, 2), relu_and_pool(&no_relu, "relu2")]),
        (&overlap, vec![(1, 3)]),
        (&leaky, vec![(1, 3), relu_and_pool(&leaky, "relu2")]),
        (&after, vec![(1, 2), (pool, pool + 1)]),
        (&residual, vec![(sum, sum + 1)]),
    ];
    for math in [MathMode::Bf16, MathMode::Fp16] {
        let Some(mut gpu) = crate::cuda::test_util::gpu_for_test(name, math) else {
            return;
        };
        for (cfg, chains) in &cases {
            let cfg = in_half_type(cfg, math);
            for layout in [GpuLayout::Nchw, GpuLayout::Nhwc] {
                gpu.layout = layout;
                cnn_steps_match_cpu_in(&gpu, &cfg, RECORD, chains, BF16);
            }
        }
    }
}

/// A frozen BatchNorm (`use_global_stats = true` in training, as a fine-tune freezes one) in the
/// fused bn1 → scale1 → relu1 chain, against the CPU over a few training steps: in FP32, and in
/// bf16 and fp16 against the CPU's rounding, in both layouts. Its backward finds the ReLU's mask
/// from the bottom and the running statistics (the top is not read), and the statistics do not
/// move ([`freeze_statistics`] starts them away from zero).
#[test]
fn frozen_batch_norm_chain_trains_as_the_cpu() {
    let name = concat!(
        module_path!(),
        "::frozen_batch_norm_chain_trains_as_the_cpu"
    );
    let bn1 = "name = \"bn1\"\ntype = \"batch_norm\"\n";
    assert!(CNN_TOML.contains(bn1) && CNN_TOML.contains(CNN_RELU1));
    let frozen = config_of(
        "frozen_bn1.toml",
        &CNN_TOML.replace(bn1, &format!("{bn1}use_global_stats = true\n")),
    );
    let chains = [(1, 3), relu_and_pool(&frozen, "relu2")];
    let mut gpu = gpu_or_skip!("frozen_batch_norm_chain_trains_as_the_cpu");
    cnn_steps_match_cpu(&mut gpu, &frozen, RECORD, &chains);
    half_steps_match_the_cpu_rounding(name, &frozen, &chains);
}

/// `cfg` in the half-type `math` at a loss scale of 1: fp16 scales the loss by default, and the
/// CPU net is driven here without its engine, which scales, so both sides run unscaled
/// (crate::cuda::update's tests check the scaling).
fn in_half_type(cfg: &Config, math: MathMode) -> Config {
    let mut cfg = cfg.clone();
    cfg.cluster.math = math;
    cfg.cluster.loss_scale = Some(crate::config::LossScale::Fixed(1.0));
    cfg
}

/// `cfg` in bf16 and fp16 ([`in_half_type`]) against the CPU's rounding over a few training
/// steps, in both layouts, with the chains `fused` ([`cnn_steps_match_cpu_in`]); the test
/// `name` skips (loudly) without a GPU.
fn half_steps_match_the_cpu_rounding(name: &str, cfg: &Config, fused: &[(usize, usize)]) {
    for math in [MathMode::Bf16, MathMode::Fp16] {
        let Some(mut gpu) = crate::cuda::test_util::gpu_for_test(name, math) else {
            return;
        };
        let cfg = in_half_type(cfg, math);
        for layout in [GpuLayout::Nchw, GpuLayout::Nhwc] {
            gpu.layout = layout;
            cnn_steps_match_cpu_in(&gpu, &cfg, RECORD, fused, BF16);
        }
    }
}

/// The net of the config `text` (named `file`) in bf16 and fp16 at a loss scale of 1, in each
/// layout of `expected`: it runs on half-type blobs exactly the layers listed for that layout
/// (by name) and over a few training steps trains the CPU's numbers at the half-type tolerance;
/// `chains` are the (first, last) layers of the chains the GPU net fuses.
fn trains_on_half_blobs_as_the_cpu(
    name: &str,
    (file, text): (&str, &str),
    chains: &[(&str, &str)],
    expected: &[(GpuLayout, &[&str])],
) {
    for math in [MathMode::Bf16, MathMode::Fp16] {
        let Some(mut gpu) = crate::cuda::test_util::gpu_for_test(name, math) else {
            return;
        };
        let cfg = in_half_type(&config_of(file, text), math);
        let at = |name: &str| cfg.layers.iter().position(|l| l.name == name).unwrap();
        let chains: Vec<(usize, usize)> = chains.iter().map(|&(a, b)| (at(a), at(b))).collect();
        for &(layout, want) in expected {
            gpu.layout = layout;
            let net = GpuNet::new(&cfg, [3, 8, 8], 16, &gpu).unwrap();
            let on_half: Vec<&str> = (0..cfg.layers.len())
                .filter(|&i| net.storage.on_half[i])
                .map(|i| cfg.layers[i].name.as_str())
                .collect();
            assert_eq!(on_half, want, "{math:?}, {layout:?}");
            drop(net);
            cnn_steps_match_cpu_in(&gpu, &cfg, [3, 8, 8], &chains, BF16);
        }
    }
}

/// A residual block whose convolutions have no bias runs on half-type blobs in bf16 and fp16:
/// every convolution, chain (the projection's BatchNorm → Scale fused with the residual sum and
/// its ReLU) and pooling (the convolutions through cuDNN's graph API on half-type
/// tensors, their weight gradients rounded to the half type as the CPU's), the inner product
/// and the loss in FP32 behind one conversion; over a few training steps it trains the CPU's
/// numbers at the half-type tolerance, in either layout.
#[test]
fn half_type_blobs_train_as_the_cpu_rounding() {
    let name = concat!(
        module_path!(),
        "::half_type_blobs_train_as_the_cpu_rounding"
    );
    let text = include_str!("testdata/half_residual.toml");
    let chains = [("bn1", "relu1"), ("bn2", "scale2"), ("bn3", "sum_relu")];
    let on_half = [
        "conv1",
        "bn1",
        "pool1",
        "branch",
        "bn2",
        "projection",
        "bn3",
        "pool2",
    ];
    let expected = [
        (GpuLayout::Nchw, &on_half[..]),
        (GpuLayout::Nhwc, &on_half[..]),
    ];
    trains_on_half_blobs_as_the_cpu(name, ("half_residual.toml", text), &chains, &expected);
}

/// An inception-like join in bf16 and fp16: a max pooling and a convolution read the output of
/// an NCHW-only concat, and the pooling, which rounds its own bottom gradient, adds it to the
/// convolution's. Channels-last, the pooling runs NCHW on the concat's output itself (the
/// storage plan: no copy between its rounding and the sum's), the convolution through a copy;
/// every layer on FP32 blobs. Over a few training steps it trains the CPU's numbers at the
/// half-type tolerance, in either layout.
#[test]
fn a_pooling_beside_a_convolution_on_a_concat_trains_as_the_cpu_rounding() {
    let name = concat!(
        module_path!(),
        "::a_pooling_beside_a_convolution_on_a_concat_trains_as_the_cpu_rounding"
    );
    let text = include_str!("testdata/pooling_reads_a_shared_concat.toml");
    let expected = [(GpuLayout::Nchw, &[][..]), (GpuLayout::Nhwc, &[][..])];
    let file = ("pooling_reads_a_shared_concat.toml", text);
    trains_on_half_blobs_as_the_cpu(name, file, &[], &expected);
}

/// Runs without a GPU. In bf16, the convolution `h` of `half_after_fp32.toml` reads the FP32
/// output of a ReLU, its one reader, through a half-type copy: in backward the copy's gradient,
/// widened, overwrites the ReLU's, half-type values that the net does not round again. The
/// inner product's FP32 copy of the pooling's output (half-type in NCHW, relaid channels-last)
/// is no such widening.
#[test]
fn a_widened_half_copy_overwrites_its_blobs_gradient_with_half_values() {
    let text = include_str!("testdata/half_after_fp32.toml");
    let cfg = config_of("half_after_fp32.toml", text);
    let record = [3, 8, 8];
    let (graph, layout) = Net::build(&cfg, record, 1).unwrap();
    let mut shapers: Vec<_> = (cfg.layers.iter())
        .map(|l| crate::layers::build_from_config(l).unwrap())
        .collect();
    let shapes = infer_shapes(&graph, &mut shapers, record, 4).unwrap();
    let slots = fusion::plan(&graph, &layout.spans, true);
    let capable: Vec<bool> = (0..graph.len())
        .map(|i| storage::runs_on_half_blobs(&graph, &slots, i, true))
        .collect();
    let at = |name: &str| {
        (0..graph.len())
            .find(|&i| graph.layer_name(i) == name)
            .unwrap()
    };
    for channels_last in [false, true] {
        let half = Some((crate::precision::Half::Bf16, &capable[..]));
        let storage = StoragePlan::new(&cfg.layers, &graph, &shapes, &slots, channels_last, half);
        let on_half: Vec<&str> = (0..graph.len())
            .filter(|&i| storage.on_half[i])
            .map(|i| graph.layer_name(i))
            .collect();
        // Channels-last, the pooling's output would need both conversions for the NCHW-only
        // inner product: the pooling runs on FP32 blobs.
        let want: &[&str] = match channels_last {
            false => &["h", "bn", "pool"],
            true => &["h", "bn"],
        };
        assert_eq!(on_half, want, "channels-last {channels_last}");
        let plan = train_plan(&graph, &layout.spans, &slots).through_copies(&storage.conversions);
        let copy_of = |layer: &str| {
            let c = storage.conversions.iter().find(|c| c.layer == at(layer));
            c.unwrap_or_else(|| panic!("{layer} reads no copy")).copy
        };
        assert!(storage.widens_over(copy_of("h"), &plan.converted));
        assert!(!storage.widens_over(copy_of("ip"), &plan.converted));
    }
}

/// A half-type convolution after FP32 layers in bf16 and fp16 (`half_after_fp32.toml`): after a
/// training step the gradient its half-type copy widened into the ReLU's FP32 blob holds
/// half-type values without the net's rounding pass (and is not all zero), and over a few
/// training steps the net trains the CPU's numbers at the half-type tolerance, in either layout.
#[test]
fn a_half_type_convolution_after_fp32_layers_trains_as_the_cpu_rounding() {
    let name = concat!(
        module_path!(),
        "::a_half_type_convolution_after_fp32_layers_trains_as_the_cpu_rounding"
    );
    let text = include_str!("testdata/half_after_fp32.toml");
    let record = [3, 8, 8];
    for math in [MathMode::Bf16, MathMode::Fp16] {
        let Some(mut gpu) = crate::cuda::test_util::gpu_for_test(name, math) else {
            return;
        };
        let cfg = in_half_type(&config_of("half_after_fp32.toml", text), math);
        let half = crate::precision::Half::of(math).unwrap();
        for layout in [GpuLayout::Nchw, GpuLayout::Nhwc] {
            gpu.layout = layout;
            let mut net = GpuNet::new(&cfg, record, 16, &gpu).unwrap();
            let (_, mut params) = Net::build(&cfg, record, 16).unwrap();
            Net::init_params(&mut params, cfg.solver.random_seed);
            net.params_from_host(&gpu, &params).unwrap();
            let (data, labels) = batch_of(16, record, 4401);
            net.load_batch(&gpu, &data, &labels).unwrap();
            net.forward(&gpu, pass(Phase::Train), None).unwrap();
            net.backward_first(&gpu, None, &mut |_, _| {}).unwrap();
            let relu = (0..net.graph.len())
                .find(|&i| net.graph.layer_name(i) == "relu")
                .unwrap();
            let blob = &net.blobs[net.graph.node(relu).tops[0]];
            let diff = gpu.compute.clone_dtoh(&blob.diff).unwrap();
            let diff = &diff[..blob.count()];
            let odd = diff.iter().position(|&v| !half.holds(v));
            assert_eq!(odd, None, "{math:?}, {layout:?}: {diff:?}");
            assert!(diff.iter().any(|&v| v != 0.0), "{math:?}, {layout:?}");
        }
    }
    let expected = [
        (GpuLayout::Nchw, &["h", "bn", "pool"][..]),
        (GpuLayout::Nhwc, &["h", "bn"][..]),
    ];
    let chains = [("bn", "relu_h")];
    trains_on_half_blobs_as_the_cpu(name, ("half_after_fp32.toml", text), &chains, &expected);
}

/// cifar10_quick's pattern at a small size in bf16 and fp16: channels-last, convolutions with a
/// bias run on half-type blobs (the bias added in cuDNN's plan to the FP32 products before the
/// top's one rounding, its gradient summed from the half-type top gradient), with the pooling
/// fused with its ReLU between them; in NCHW on FP32 blobs. Over a few training steps it trains
/// the CPU's numbers at the half-type tolerance, in either layout.
#[test]
fn convolutions_with_bias_train_on_half_blobs_as_the_cpu_rounding() {
    let name = concat!(
        module_path!(),
        "::convolutions_with_bias_train_on_half_blobs_as_the_cpu_rounding"
    );
    let text = include_str!("testdata/half_biased.toml");
    let chains = [("pool1", "relu1"), ("relu2", "pool2")];
    // In NCHW the convolutions with a bias stay on FP32 blobs, and so the poolings between them
    // (`convolution::runs_on_half_blobs`). Channels-last, pool2's output would need both
    // conversions for the NCHW-only inner product, so relu2 → pool2 runs on FP32 blobs.
    let expected = [
        (GpuLayout::Nchw, &[][..]),
        (GpuLayout::Nhwc, &["conv1", "pool1", "conv2"][..]),
    ];
    trains_on_half_blobs_as_the_cpu(name, ("half_biased.toml", text), &chains, &expected);
}

/// Two batches' backwards into one gradient in bf16 (`backward_first` on batch A, then
/// `backward` on batch B, which accumulates): the CNN's convolutions (with bias) round each
/// backward's weight gradient to the half type before adding it. Batch A alone gives
/// a weight gradient of half-type values and a bias gradient that is not rounded; A then B gives
/// exactly the sum of A's and B's own gradients — not a half-type value everywhere, as a rounded
/// sum would be — and the CPU net's gradient at the half-type tolerance, in both layouts.
#[test]
fn accumulated_convolution_gradients_round_as_the_cpu_in_bf16() {
    let name = concat!(
        module_path!(),
        "::accumulated_convolution_gradients_round_as_the_cpu_in_bf16"
    );
    let Some(mut gpu) = crate::cuda::test_util::gpu_for_test(name, MathMode::Bf16) else {
        return;
    };
    let mut cfg = cnn_config();
    cfg.cluster.math = MathMode::Bf16;
    let (record, n) = ([1, 8, 8], 16);
    let half = crate::precision::Half::Bf16;
    let batches = [batch_of(n, record, 900), batch_of(n, record, 901)];
    for layout in [GpuLayout::Nchw, GpuLayout::Nhwc] {
        gpu.layout = layout;
        let cpu = Cpu::new(1);
        let (mut cpu_net, mut params) = Net::build(&cfg, record, n).unwrap();
        Net::init_params(&mut params, cfg.solver.random_seed);
        let mut net = GpuNet::new(&cfg, record, n, &gpu).unwrap();
        net.params_from_host(&gpu, &params).unwrap();
        crate::solver::zero_grad(&mut params);
        // The GPU net keys dropout's masks by the run's seed, as the CPU net by the context's.
        let ctx = Ctx {
            seed: cfg.solver.random_seed,
            ..ctx(&cpu, Phase::Train)
        };
        // The GPU gradient of the batches `which`, in order, accumulated.
        let mut gpu_gradient = |which: &[usize]| {
            for (k, &b) in which.iter().enumerate() {
                let (data, labels) = &batches[b];
                net.load_batch(&gpu, data, labels).unwrap();
                net.forward(&gpu, pass(Phase::Train), None).unwrap();
                match k {
                    0 => net.backward_first(&gpu, None, &mut |_, _| {}).unwrap(),
                    _ => net.backward(&gpu, None, &mut |_, _| {}).unwrap(),
                }
            }
            net.params_to_host(&gpu).unwrap().diff
        };
        let (a, b, both) = (
            gpu_gradient(&[0]),
            gpu_gradient(&[1]),
            gpu_gradient(&[0, 1]),
        );
        for (data, labels) in &batches {
            let (d, l) = cpu_net.inputs_mut();
            d.copy_from_slice(data);
            l.copy_from_slice(labels);
            cpu_net.forward(&ctx, &mut params);
            cpu_net.backward(&ctx, &mut params, &mut |_| {});
        }
        let what = format!("{layout:?}: the gradient of two backwards");
        assert_close(&what, &both, &params.diff, BF16.tensors);
        let (weight, bias) = (
            params.find("conv1.weight").unwrap().range(),
            params.find("conv1.bias").unwrap().range(),
        );
        assert!(
            a[weight.clone()].iter().all(|&g| half.holds(g)),
            "{layout:?}: conv1's weight gradient of one backward is rounded"
        );
        assert!(
            !a[bias].iter().all(|&g| half.holds(g)),
            "{layout:?}: conv1's bias gradient is not rounded"
        );
        let sums: Vec<f32> = weight.clone().map(|i| a[i] + b[i]).collect();
        assert_eq!(
            both[weight.clone()],
            sums[..],
            "{layout:?}: conv1's weight gradient of two backwards, the sum of each one's"
        );
        assert!(
            !both[weight].iter().all(|&g| half.holds(g)),
            "{layout:?}: conv1's weight gradient of two backwards is not rounded after the sum"
        );
    }
}

fn half_cnn_training_steps_match_the_cpu_rounding(math: MathMode) {
    let name = format!(
        "{}::{math:?}_cnn_training_steps_match_the_cpu_rounding",
        module_path!()
    );
    let Some(mut gpu) = crate::cuda::test_util::gpu_for_test(&name, math) else {
        return;
    };
    let cfg = in_half_type(&cnn_config(), math);
    let at = |name: &str| cfg.layers.iter().position(|l| l.name == name).unwrap();
    let ip = at("ip1");
    // ip1 (144 → 10) is too narrow for half-type operands to pay
    // (crate::cuda::layers::inner_product::half_operands_pay): its GEMMs stay TF32, as the other
    // tests here run it. This one runs it on half-type operands.
    let narrow = GpuNet::new(&cfg, [3, 8, 8], 16, &gpu).unwrap();
    let rounding = narrow.rounding.as_ref().unwrap();
    assert!(rounding
        .operands(ip, narrow.params.layer_range(ip))
        .is_none());
    gpu.half_operands_min_products = 0;
    let net = GpuNet::new(&cfg, [3, 8, 8], 16, &gpu).unwrap();
    let rounding = net.rounding.as_ref().unwrap();
    assert!(rounding.operands(ip, net.params.layer_range(ip)).is_some());
    assert!(rounding
        .operands(at("conv1"), net.params.layer_range(at("conv1")))
        .is_none());
    // The fused bn1 → scale1 → relu1 (its slot is bn1's), pool1 and relu2 → pool2 (average)
    // round their own tops, and the first and last their bottoms as they read them: conv1's and
    // conv2's tops are not rounded. ip1's is.
    let rounded: Vec<bool> = ["conv1", "bn1", "pool1", "conv2", "relu2", "ip1", "loss"]
        .map(|l| rounding.plan.rounds_tops[at(l)])
        .to_vec();
    assert_eq!(rounded, [false, false, false, false, false, true, false]);
    for layer in ["bn1", "pool1", "relu2"] {
        assert!(rounding.plan.rounds_itself[at(layer)], "{layer}");
    }
    // conv2 leaves its bottom's gradient for pool1, which wrote the blob, to round.
    let pool1_top = net.graph.node(at("conv2")).bottoms[0];
    assert_eq!(rounding.plan.diff_left_by[pool1_top], Some(at("conv2")));
    // pool1's backward leaves the gradient of the chain's top for the chain to round.
    let chain_top = net.graph.node(at("pool1")).bottoms[0];
    assert_eq!(rounding.plan.diff_left_by[chain_top], Some(at("pool1")));
    let conv1 = net.graph.node(at("bn1")).bottoms[0];
    assert_eq!(
        rounding.plan.diff_left_by[conv1], None,
        "its writer, conv1, does not round it"
    );
    let chains = [(1, 3), relu_and_pool(&cfg, "relu2")];
    for layout in [GpuLayout::Nchw, GpuLayout::Nhwc] {
        gpu.layout = layout;
        cnn_steps_match_cpu_in(&gpu, &cfg, [3, 8, 8], &chains, BF16);
        let to_half = first_gradient_gap(&gpu, &cfg, &cfg);
        let to_fp32 = first_gradient_gap(&gpu, &cfg, &cnn_config());
        assert!(
            4.0 * to_half < to_fp32,
            "{math:?}, {layout:?}: the gradient is {to_half:e} from the CPU's {math:?} one and \
             {to_fp32:e} from its FP32 one"
        );
    }
}

/// Where mixed precision's values hold half-type values, which decides where a layer may take
/// half-type operands (without a GPU): the input and every top but a loss's or a reported
/// layer's; not the labels; a storage copy as the blob it was converted from.
#[test]
fn half_values_are_the_rounded_tops_and_the_input() {
    let cfg = cnn_config();
    let (graph, _) = Net::build(&cfg, [3, 8, 8], 4).unwrap();
    let blob = |name: &str| graph.blob_named(name).unwrap();
    let layer = |name: &str| cfg.layers.iter().position(|l| l.name == name).unwrap();
    let copy = Conversion {
        layer: layer("ip1"),
        slot: 0,
        from: blob("pool2"),
        copy: graph.blob_count(),
    };
    let values = rounding::HalfValues::new(&graph, &[copy]);
    for name in ["conv1", "pool1", "conv2", "pool2", "ip1"] {
        assert!(values.blobs[blob(name)], "{name}");
    }
    for name in ["loss", "accuracy"] {
        assert!(!values.blobs[blob(name)], "{name}");
        assert!(!values.tops[layer(name)], "{name}");
    }
    assert!(values.tops[layer("ip1")] && values.tops[layer("drop1")]);
    assert!(values.blobs[DATA] && !values.blobs[LABEL]);
    assert_eq!(values.blobs.len(), graph.blob_count() + 1);
    assert!(values.blobs[graph.blob_count()], "the copy of pool2");
    assert!(values.all(&[DATA, graph.blob_count()]));
    assert!(!values.all(&[blob("ip1"), LABEL]));
}

/// The [`rounding::LayerTraits`] the GPU layers of `graph` report in mixed precision under the
/// fusion plan `slots`, written out by hand from the layers' kinds: the BatchNorm and residual
/// chains round themselves and what they read, a max pooling (alone or before its ReLU) and a
/// ReLU of slope 0 keep half-type values, the inner product takes half-type operands.
fn traits_by_hand(graph: &Net, slots: &[Slot]) -> Vec<rounding::LayerTraits> {
    use crate::config::layer_params::LayerParams;
    use crate::config::PoolMethod;
    let max_pool =
        |p: &LayerParams| matches!(p, LayerParams::Pooling(p) if p.method == PoolMethod::Max);
    (0..graph.len())
        .map(|i| {
            let params = graph.node(i).params;
            let head = matches!(slots[i], Slot::Head { .. });
            // The fused chains, and the poolings (alone or heading a chain with a ReLU).
            let chain =
                head && matches!(
                    params,
                    LayerParams::BatchNorm(_) | LayerParams::Eltwise(_) | LayerParams::Relu(_)
                ) || matches!(params, LayerParams::Pooling(_));
            let relu0 = matches!(params, LayerParams::Relu(r) if r.negative_slope == 0.0);
            rounding::LayerTraits {
                forward_keeps_half: max_pool(params) || relu0 && !head,
                backward_keeps_half: relu0 && !head,
                takes_half_operands: matches!(params, LayerParams::InnerProduct(_)),
                rounds_itself: chain,
                rounds_on_load: chain,
            }
        })
        .collect()
}

/// A net of the config file `text`, its `[data]` replaced by synthetic `shape` records at
/// batch 8, and its mixed-precision fusion and rounding plans from [`traits_by_hand`]: the
/// graph, each layer's slot, traits and running layer, and the rounding plan.
fn half_plan_of(
    file: &str,
    text: &str,
    shape: [usize; 3],
) -> (
    Net,
    Vec<Slot>,
    Vec<rounding::LayerTraits>,
    Vec<usize>,
    rounding::RoundingPlan,
) {
    let (start, end) = (text.find("[data]").unwrap(), text.find("[solver]").unwrap());
    let synthetic = format!(
        "[data]\nformat = \"synthetic\"\nshape = {shape:?}\nclasses = 10\nbatch_size = 8\n\n"
    );
    let cfg = config_of(
        file,
        &format!("{}{synthetic}{}", &text[..start], &text[end..]),
    );
    let (graph, layout) = Net::build(&cfg, shape, 1).unwrap();
    let slots = fusion::plan(&graph, &layout.spans, true);
    let runs_at: Vec<usize> = (slots.iter().enumerate())
        .map(|(i, s)| match s {
            Slot::Absorbed { head } => *head,
            _ => i,
        })
        .collect();
    let bottoms: Vec<Vec<usize>> = (fusion::reads_of(&graph, &slots).iter())
        .map(|r| r.iter().map(|r| r.blob).collect())
        .collect();
    let traits = traits_by_hand(&graph, &slots);
    let plan = rounding::RoundingPlan::new(&graph, &traits, &runs_at, &bottoms, &[]);
    (graph, slots, traits, runs_at, plan)
}

/// Without a GPU: cifar10_quick's rounding plan in mixed precision leaves its convolutions'
/// tops for the poolings (fused with their ReLUs) to round as they read them, and the gradients
/// the convolutions and the first inner product send back to a pooling for the pooling: of the
/// rounding passes, only the inner products' tops and the gradient between them are left.
#[test]
fn cifar10_quick_leaves_its_roundings_to_the_poolings() {
    let text = include_str!("../../../config/cifar10_quick.toml");
    let (graph, slots, _, _, plan) = half_plan_of("cifar10_quick.toml", text, [3, 32, 32]);
    let at = |name: &str| {
        (0..graph.len())
            .find(|&i| graph.node(i).name == name)
            .unwrap()
    };
    for conv in ["conv1", "conv2", "conv3"] {
        assert!(!plan.rounds_tops[at(conv)], "{conv}: a pooling rounds it");
    }
    for head in ["pool1", "relu2", "relu3"] {
        assert!(
            matches!(slots[at(head)], Slot::Head { .. }),
            "{head} heads a chain"
        );
        assert!(
            plan.rounds_itself[at(head)] && !plan.rounds_tops[at(head)],
            "{head}"
        );
    }
    assert!(plan.rounds_tops[at("ip1")] && plan.rounds_tops[at("ip2")]);
    for (reader, writer) in [("conv2", "pool1"), ("conv3", "pool2"), ("ip1", "pool3")] {
        let b = graph.node(at(reader)).bottoms[0];
        assert_eq!(
            plan.diff_left_by[b],
            Some(at(reader)),
            "{reader} leaves its bottom's gradient to {writer}"
        );
    }
    let ip1_top = graph.node(at("ip2")).bottoms[0];
    assert_eq!(
        plan.diff_left_by[ip1_top], None,
        "ip1 rounds nothing it reads"
    );
}

/// Without a GPU: ResNet-20's rounding plan in mixed precision leaves every convolution's top
/// for the BatchNorm chain after it to round, and every gradient on its way back to a chain for
/// the chain: the diff of a blob that two layers read is left unrounded by the first of them in
/// net order (which adds to it last), and rounded after the other.
#[test]
fn resnet_tops_and_gradients_are_left_to_the_chains_that_read_them() {
    let text = include_str!("../../../config/resnet20.toml");
    let (graph, slots, traits, runs_at, plan) = half_plan_of("resnet20.toml", text, [3, 32, 32]);
    let kind = |i: usize| graph.node(i).params.kind();
    let convolutions: Vec<usize> = (0..graph.len())
        .filter(|&i| kind(i) == crate::config::LayerKind::Convolution)
        .collect();
    assert_eq!(
        convolutions.len(),
        21,
        "ResNet-20's convolutions, projections included"
    );
    for &i in &convolutions {
        assert!(
            !plan.rounds_tops[i],
            "{}: its chain rounds it",
            graph.node(i).name
        );
    }
    let mut shared = 0;
    for &i in &convolutions {
        let b = graph.node(i).bottoms[0];
        let mut readers: Vec<usize> = (0..graph.len())
            .filter(|&j| graph.node(j).bottoms.contains(&b))
            .collect();
        readers.sort();
        let writer = (0..graph.len()).find(|&j| graph.node(j).tops.contains(&b));
        let rounds_on_load = writer.is_some_and(|w| traits[runs_at[w]].rounds_on_load);
        let want = rounds_on_load.then_some(runs_at[readers[0]]);
        assert_eq!(
            plan.diff_left_by[b],
            want,
            "the diff of {}'s bottom",
            graph.node(i).name
        );
        shared += (readers.len() > 1 && want.is_some()) as usize;
    }
    assert!(
        shared >= 6,
        "blobs read by two layers, left by the first: {shared}"
    );
    // The chains round themselves; the input and the inner product stay as without chains.
    for i in 0..graph.len() {
        if matches!(slots[i], Slot::Head { .. }) && traits[i].rounds_itself {
            assert!(plan.rounds_itself[i] && !plan.rounds_tops[i]);
        }
    }
}

/// `max |g − c| / max |c|` between the first training gradient of the GPU net of `cfg` and that
/// of the CPU net of `cpu_cfg`, from the same weights and batch of three-channel records.
fn first_gradient_gap(gpu: &Gpu, cfg: &Config, cpu_cfg: &Config) -> f32 {
    let (n, record) = (16, [3, 8, 8]);
    let cpu = Cpu::new(1);
    let (mut cpu_net, mut params) = Net::build(cpu_cfg, record, n).unwrap();
    Net::init_params(&mut params, 7);
    let (data, labels) = batch_of(n, record, 9);
    let (d, l) = cpu_net.inputs_mut();
    d.copy_from_slice(&data);
    l.copy_from_slice(&labels);
    // The GPU net keys dropout's masks by the config's seed.
    let ctx = Ctx {
        seed: cfg.solver.random_seed,
        ..ctx(&cpu, Phase::Train)
    };
    crate::solver::zero_grad(&mut params);
    cpu_net.forward(&ctx, &mut params);
    cpu_net.backward(&ctx, &mut params, &mut |_| {});
    let mut net = GpuNet::new(cfg, record, n, gpu).unwrap();
    net.params_from_host(gpu, &params).unwrap();
    net.load_batch(gpu, &data, &labels).unwrap();
    net.forward(gpu, pass(Phase::Train), None).unwrap();
    net.backward_first(gpu, None, &mut |_, _| {}).unwrap();
    let got = net.params_to_host(gpu).unwrap().diff;
    let scale = params.diff.iter().fold(0f32, |m, v| m.max(v.abs()));
    let gap = got
        .iter()
        .zip(&params.diff)
        .fold(0f32, |m, (g, c)| m.max((g - c).abs()));
    gap / scale
}

/// The chain of the ReLU `relu` and the pooling after it, as the GPU net reports it.
fn relu_and_pool(cfg: &Config, relu: &str) -> (usize, usize) {
    let i = cfg.layers.iter().position(|l| l.name == relu).unwrap();
    assert_eq!(cfg.layers[i + 1].kind, crate::config::LayerKind::Pooling);
    (i, i + 1)
}

/// As [`cnn_training_steps_match_cpu`] on three-channel records, whose channels-last input the
/// net transposes as each batch arrives (one-channel records lie the same in both layouts).
#[test]
fn cnn_on_three_channel_records_matches_cpu() {
    let mut gpu = gpu_or_skip!("cnn_on_three_channel_records_matches_cpu");
    let cfg = cnn_config();
    let chains = [(1, 3), relu_and_pool(&cfg, "relu2")];
    cnn_steps_match_cpu(&mut gpu, &cfg, [3, 8, 8], &chains);
}

/// As [`cnn_training_steps_match_cpu`] without the ReLU after the Scale: the fused chain is
/// BatchNorm → Scale (as before a residual sum), besides relu2 → pool2.
#[test]
fn cnn_with_batch_norm_and_scale_fused_without_relu_matches_cpu() {
    let mut gpu = gpu_or_skip!("cnn_with_batch_norm_and_scale_fused_without_relu_matches_cpu");
    assert!(
        CNN_TOML.contains(CNN_RELU1),
        "the config has relu1 as expected"
    );
    let cfg = config_of("no_relu.toml", &CNN_TOML.replace(CNN_RELU1, ""));
    let chains = [(1, 2), relu_and_pool(&cfg, "relu2")];
    cnn_steps_match_cpu(&mut gpu, &cfg, RECORD, &chains);
}

/// As [`cnn_training_steps_match_cpu`] with the ReLU moved from before the max pooling to after
/// it (as in cifar10_quick): the pooling and the ReLU run fused, BatchNorm → Scale as before. Its
/// inputs are normalised and shifted, so many windows have no positive maximum. relu2, fused
/// with the average pooling after it, leaks here (slope 0.1).
#[test]
fn max_pooling_fused_with_its_relu_matches_cpu() {
    let mut gpu = gpu_or_skip!("max_pooling_fused_with_its_relu_matches_cpu");
    let pool1 = "kernel_size = 2\nstride = 2\n";
    assert!(
        CNN_TOML.contains(CNN_RELU1) && CNN_TOML.contains(pool1),
        "the config is as expected"
    );
    let after_pool =
        "\n[[layer]]\nname = \"relu1\"\ntype = \"relu\"\nbottom = [\"pool1\"]\ntop = [\"pool1\"]\n";
    let relu2 = "name = \"relu2\"\ntype = \"relu\"\n";
    assert!(CNN_TOML.contains(relu2));
    let text = CNN_TOML
        .replace(CNN_RELU1, "")
        .replacen(pool1, &format!("{pool1}{after_pool}"), 1)
        .replace(relu2, &format!("{relu2}negative_slope = 0.1\n"));
    let cfg = config_of("relu_after_pool.toml", &text);
    let pool = cfg.layers.iter().position(|l| l.name == "pool1").unwrap();
    assert_eq!(cfg.layers[pool + 1].name, "relu1");
    let chains = [(1, 2), (pool, pool + 1), relu_and_pool(&cfg, "relu2")];
    cnn_steps_match_cpu(&mut gpu, &cfg, RECORD, &chains);
}

/// The convolutional topology-equivalence net (concat, scale, a weighted residual sum followed by
/// a ReLU, grouped and strided convolutions): its sum and ReLU run fused.
#[test]
fn residual_sum_fused_with_its_relu_matches_cpu() {
    let mut gpu = gpu_or_skip!("residual_sum_fused_with_its_relu_matches_cpu");
    let text = include_str!("../../../tests/configs/cnn_equivalence.toml");
    let cfg = config_of("cnn_equivalence.toml", text);
    let sum = cfg.layers.iter().position(|l| l.name == "sum").unwrap();
    cnn_steps_match_cpu(&mut gpu, &cfg, RECORD, &[(sum, sum + 1)]);
}

/// `testdata/residual_chains.toml`, and its fused chains: the first block's BatchNorm → Scale →
/// ReLU, then in each residual block BatchNorm → Scale → sum → ReLU (block a reading the
/// gradient reaching its Scale off the shortcut's, block b writing it into scratch and adding
/// the shortcut's).
fn residual_chains() -> (Config, Vec<(usize, usize)>) {
    let text = include_str!("testdata/residual_chains.toml");
    let cfg = config_of("residual_chains.toml", text);
    let at = |name: &str| cfg.layers.iter().position(|l| l.name == name).unwrap();
    let chains = vec![
        (at("bn1"), at("relu1")),
        (at("bn2"), at("relu_a")),
        (at("bn3"), at("relu_b")),
    ];
    (cfg, chains)
}

/// A net of fused chains (BatchNorm chains with and without their residual sums) changes its
/// batch, as a test pass of another batch size does: smaller, then larger than the first, each
/// train and test pass against the CPU's.
#[test]
fn fused_chains_run_at_another_batch() {
    let gpu = gpu_or_skip!("fused_chains_run_at_another_batch");
    let (cfg, _) = residual_chains();
    let mut net = GpuNet::new(&cfg, RECORD, 16, &gpu).unwrap();
    for (n, seed) in [(16, 861), (7, 862), (40, 863)] {
        compare_pass(&gpu, &cfg, &mut net, n, seed);
    }
}

/// BatchNorm → Scale fused with the residual sum and ReLU after it trains the CPU's numbers in
/// FP32, in both layouts: the shortcut first or second among the sum's bottoms, equal
/// coefficients and not, the shortcut's gradient overwritten by the chain or added to.
#[test]
fn batch_norm_chains_fused_with_their_residual_sums_match_cpu() {
    let mut gpu = gpu_or_skip!("batch_norm_chains_fused_with_their_residual_sums_match_cpu");
    let (cfg, chains) = residual_chains();
    cnn_steps_match_cpu(&mut gpu, &cfg, RECORD, &chains);
}

/// [`batch_norm_chains_fused_with_their_residual_sums_match_cpu`] in bf16 and fp16, against the
/// CPU's rounding.
#[test]
fn half_batch_norm_chains_with_residual_sums_match_the_cpu_rounding() {
    let name = concat!(
        module_path!(),
        "::half_batch_norm_chains_with_residual_sums_match_the_cpu_rounding"
    );
    let (cfg, chains) = residual_chains();
    half_steps_match_the_cpu_rounding(name, &cfg, &chains);
}

/// The fused BatchNorm → Scale → ReLU chain, residual sum → ReLU and BatchNorm → Scale → sum →
/// ReLU on tensors large enough that their kernels run the four-elements-a-thread loop
/// (`grid_stride_by_four`), not only its tail, in both layouts: the CNN on 3 × 128 × 128 records
/// (the chain over 16 × 8 × 128 × 128 values), the convolutional equivalence net on
/// 1 × 192 × 192 (the sum over 16 × 16 × 96 × 96) and the residual chains on 1 × 96 × 96.
#[test]
fn fused_chains_match_cpu_on_tensors_beyond_one_wave() {
    let mut gpu = gpu_or_skip!("fused_chains_match_cpu_on_tensors_beyond_one_wave");
    let four_waves = 4 * gpu.kernels.wave_threads();
    for (values, what) in [(16 * 8 * 128 * 128, "chain"), (16 * 16 * 96 * 96, "sum")] {
        assert!(
            values > four_waves,
            "the {what}'s {values} values fill fewer than four waves of {} threads",
            four_waves / 4
        );
    }
    let cfg = cnn_config();
    let chains = [(1, 3), relu_and_pool(&cfg, "relu2")];
    cnn_steps_match_cpu(&mut gpu, &cfg, [3, 128, 128], &chains);
    let text = include_str!("../../../tests/configs/cnn_equivalence.toml");
    let cfg = config_of("cnn_equivalence.toml", text);
    let sum = cfg.layers.iter().position(|l| l.name == "sum").unwrap();
    cnn_steps_match_cpu(&mut gpu, &cfg, [1, 192, 192], &[(sum, sum + 1)]);
    // BatchNorm chains fused with their residual sums, over 16 × 8 × 96 × 96 values.
    let (cfg, chains) = residual_chains();
    cnn_steps_match_cpu(&mut gpu, &cfg, [1, 96, 96], &chains);
}

/// A CNN of ELU, PReLU (per channel and shared), LRN (both regions), a softmax loss beside a
/// weighted Euclidean loss on the same features, and an ArgMax in the test phase, against the
/// CPU net: the slopes' gradients and updates, both losses' weights, and ArgMax's top kept out
/// of the reported outputs (the outputs are compared one for one).
#[test]
fn cnn_of_elu_prelu_lrn_arg_max_and_euclidean_loss_matches_cpu() {
    let layer = |name: &str, kind: &str, bottoms: &str, top: &str, keys: &str| {
        format!("[[layer]]\nname = \"{name}\"\ntype = \"{kind}\"\nbottom = [{bottoms}]\ntop = [\"{top}\"]\n{keys}\n\n")
    };
    let text = [
        "[data]\nformat = \"digits\"\nbatch_size = 16\nscale = 0.00390625\n\n\
         [solver]\nbase_lr = 0.05\nmomentum = 0.9\nweight_decay = 5e-4\nmax_iter = 4\nrandom_seed = 7\n\n"
            .to_string(),
        layer("conv1", "convolution", "\"data\"", "conv1", "num_output = 6\nkernel_size = 3\npad = 1"),
        layer("norm1", "lrn", "\"conv1\"", "norm1", "local_size = 3\nalpha = 0.5"),
        layer("prelu1", "prelu", "\"norm1\"", "norm1", ""),
        layer("pool1", "pooling", "\"norm1\"", "pool1", "kernel_size = 2\nstride = 2"),
        layer("elu1", "elu", "\"pool1\"", "pool1", "alpha = 0.7"),
        layer("norm2", "lrn", "\"pool1\"", "norm2", "local_size = 3\nalpha = 2.0\nnorm_region = \"within_channel\""),
        layer("prelu2", "prelu", "\"norm2\"", "norm2", "channel_shared = true"),
        layer("ip", "inner_product", "\"norm2\"", "ip", "num_output = 10"),
        layer("reg", "inner_product", "\"norm2\"", "reg", "num_output = 1"),
        layer("loss", "softmax_with_loss", "\"ip\", \"label\"", "loss", ""),
        layer("reg_loss", "euclidean_loss", "\"reg\", \"label\"", "reg_loss", "loss_weight = 0.1"),
        layer("amax", "arg_max", "\"ip\"", "amax", "top_k = 2\nphase = \"test\""),
        layer("accuracy", "accuracy", "\"ip\", \"label\"", "accuracy", "phase = \"test\""),
    ]
    .concat();
    // Validated (and its CPU net built) before the GPU is looked for, so everywhere.
    let cfg = config_of("more_kinds.toml", &text);
    Net::build(&cfg, RECORD, 16).unwrap();
    let mut gpu = gpu_or_skip!("cnn_of_elu_prelu_lrn_arg_max_and_euclidean_loss_matches_cpu");
    cnn_steps_match_cpu(&mut gpu, &cfg, RECORD, &[]);
}

/// A CNN config against the CPU net on records of shape `record`, with the GPU's activations
/// NCHW and then channels-last; `fused` are the (first, last) layers of the chains the GPU net is
/// expected to fuse.
fn cnn_steps_match_cpu(gpu: &mut Gpu, cfg: &Config, record: [usize; 3], fused: &[(usize, usize)]) {
    for layout in [GpuLayout::Nchw, GpuLayout::Nhwc] {
        gpu.layout = layout;
        cnn_steps_match_cpu_in(gpu, cfg, record, fused, FP32);
    }
}

/// Gives each BatchNorm of `cfg` that trains on its running statistics (`use_global_stats =
/// true`) the statistics a fine-tune starts from: means in [−0.5, 0.5], variances in [0.5, 2]
/// and the factor 1, where the zeros it is initialised with would normalise by √eps alone.
fn freeze_statistics(cfg: &Config, params: &mut Params) {
    for (layer, l) in cfg.layers.iter().enumerate() {
        if l.use_global_stats != Some(true) {
            continue;
        }
        for (i, span) in params.spans.iter().filter(|s| s.layer == layer).enumerate() {
            // [mean (C), variance (C), factor (1)]
            let seed = 870 + (layer * 3 + i) as u64;
            let values = match i {
                0 => uniform_blob(&[span.len], -0.5, 0.5, seed).data,
                1 => uniform_blob(&[span.len], 0.5, 2.0, seed).data,
                _ => vec![1.0; span.len],
            };
            params.data[span.range()].copy_from_slice(&values);
        }
    }
}

/// [`cnn_steps_match_cpu`] in the layout `gpu` is set to, compared at `tol`.
fn cnn_steps_match_cpu_in(
    gpu: &Gpu,
    cfg: &Config,
    record: [usize; 3],
    fused: &[(usize, usize)],
    tol: Tolerance,
) {
    let n = 16;
    let cpu = Cpu::new(1);
    let (mut cpu_net, mut params) = Net::build(cfg, record, n).unwrap();
    Net::init_params(&mut params, cfg.solver.random_seed);
    freeze_statistics(cfg, &mut params);
    let mut cpu_solver = Solver::new(&cfg.solver, params.len());
    let mut net = GpuNet::new(cfg, record, n, gpu).unwrap();
    assert_eq!(net.fused_chains(), fused);
    let nhwc = (0..net.blob_count()).any(|b| net.blob_layout(b) == Layout::Nhwc);
    assert_eq!(
        nhwc,
        gpu.layout == GpuLayout::Nhwc,
        "channels-last blobs exactly when asked for"
    );
    net.params_from_host(gpu, &params).unwrap();
    let mut gpu_solver = GpuSolver::new(gpu, &cfg.solver, &net.params.spans).unwrap();
    let seed = cfg.solver.random_seed;
    for iter in 0..4u64 {
        let (data, labels) = batch_of(n, record, 840 + iter);
        let (d, l) = cpu_net.inputs_mut();
        d.copy_from_slice(&data);
        l.copy_from_slice(&labels);
        let pass = PassCtx {
            phase: Phase::Train,
            iter,
            first_sample: 1000 + iter * n as u64,
        };
        let ctx = Ctx {
            cpu: &cpu,
            phase: Phase::Train,
            iter,
            seed,
            first_sample: pass.first_sample,
            reducer: None,
        };
        crate::solver::zero_grad(&mut params);
        let want = cpu_net.forward(&ctx, &mut params);
        cpu_net.backward(&ctx, &mut params, &mut |_| {});

        net.load_batch(gpu, &data, &labels).unwrap();
        net.forward(gpu, pass, None).unwrap();
        net.backward_first(gpu, None, &mut |_, _| {}).unwrap();
        if iter == 0 {
            let got = net.outputs(gpu).unwrap();
            assert_outputs_at("cnn, first step", &got, &want, n, tol.loss);
            let grads = net.params_to_host(gpu).unwrap();
            assert_close(
                "cnn: first gradient",
                &grads.diff,
                &params.diff,
                tol.tensors,
            );
            assert_close(
                "cnn: running statistics",
                &grads.data,
                &params.data,
                tol.tensors,
            );
        }
        let cpu_lr = cpu_solver.apply(&cpu, iter, &mut params);
        // Through the net, which hands mixed precision's copies of the weights to the update:
        // the next forward pass reads what the update wrote into them.
        let gpu_lr = net
            .update_weights(|p, copies, _| gpu_solver.apply_scaled(gpu, iter, p, copies, None))
            .unwrap();
        assert_eq!(gpu_lr, cpu_lr);
        let got = net.params_to_host(gpu).unwrap();
        assert_close(
            &format!("cnn: weights and statistics after step {iter}"),
            &got.data,
            &params.data,
            tol.tensors,
        );
    }
    let test = PassCtx {
        phase: Phase::Test,
        iter: 4,
        first_sample: 0,
    };
    let ctx = Ctx {
        cpu: &cpu,
        phase: Phase::Test,
        iter: 4,
        seed,
        first_sample: 0,
        reducer: None,
    };
    let want = cpu_net.forward(&ctx, &mut params);
    net.forward(gpu, test, None).unwrap();
    let got = net.outputs(gpu).unwrap();
    assert_outputs_at("cnn, test", &got, &want, n, tol.loss);
}

/// A net of the routing layers and a deconvolution: Input (with the labels as a second top),
/// a strided convolution, Split, Deconvolution, Slice, Silence and two losses.
const ROUTING_TOML: &str = r#"
data = { format = "digits", batch_size = 16, scale = 0.0625 }
solver = { base_lr = 0.01, momentum = 0.9, max_iter = 4 }
[[layer]]
name = "input"
type = "input"
top = ["data", "label"]
shape = [16, 1, 8, 8]
[[layer]]
name = "conv1"
type = "convolution"
bottom = ["data"]
top = ["conv1"]
num_output = 4
kernel_size = 3
stride = 2
pad = 1
[[layer]]
name = "split"
type = "split"
bottom = ["conv1"]
top = ["s1", "s2"]
[[layer]]
name = "up"
type = "deconvolution"
bottom = ["s1"]
top = ["up"]
num_output = 3
kernel_size = 4
stride = 2
pad = 1
weight_filler = { type = "gaussian", std = 0.1 }
bias_filler = { type = "uniform", min = -0.5, max = 0.5 }
[[layer]]
name = "cut"
type = "slice"
bottom = ["up"]
top = ["u1", "u2"]
slice_point = [1]
[[layer]]
name = "quiet"
type = "silence"
bottom = ["u1"]
[[layer]]
name = "ip"
type = "inner_product"
bottom = ["u2"]
top = ["ip"]
num_output = 10
[[layer]]
name = "ip2"
type = "inner_product"
bottom = ["s2"]
top = ["ip2"]
num_output = 10
[[layer]]
name = "loss"
type = "softmax_with_loss"
bottom = ["ip", "label"]
top = ["loss"]
[[layer]]
name = "loss2"
type = "softmax_with_loss"
bottom = ["ip2", "label"]
top = ["loss2"]
loss_weight = 0.5
"#;

/// Input, Split, Deconvolution, Slice and Silence in a net: the GPU's training steps are the
/// CPU's, NCHW and channels-last (where deconvolution and slice read NCHW copies).
#[test]
fn routing_layers_and_deconvolution_train_as_on_the_cpu() {
    let mut gpu = gpu_or_skip!("routing_layers_and_deconvolution_train_as_on_the_cpu");
    let cfg = config_of("routing.toml", ROUTING_TOML);
    cnn_steps_match_cpu(&mut gpu, &cfg, RECORD, &[]);
}

/// The 8-bit input path: `load_batch_u8` leaves in the data blob exactly the floats the CPU
/// normalises the batch to (what `load_batch` of those floats leaves), at the full batch and a
/// smaller one, through both staging slots, with the labels copied alike.
#[test]
fn a_u8_batch_is_normalised_on_the_device_as_on_the_cpu() {
    let gpu = gpu_or_skip!("a_u8_batch_is_normalised_on_the_device_as_on_the_cpu");
    let cfg = equivalence_config();
    let mut net = GpuNet::new(&cfg, RECORD, 6, &gpu).unwrap();
    let plane = RECORD[1] * RECORD[2];
    let normalize = crate::data::Normalize {
        mean: vec![33.7],
        scale: 0.017_124_7,
        plane,
    };
    for (n, seed) in [(6, 1u64), (6, 2), (3, 3), (6, 4)] {
        net.set_batch(&gpu, n).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let pixels: Vec<u8> = (0..n * plane).map(|_| rng.gen()).collect();
        let labels: Vec<f32> = (0..n).map(|_| rng.gen_range(0..10) as f32).collect();
        let mut floats = vec![0.0; pixels.len()];
        normalize.apply(&pixels, &mut floats);
        net.load_batch_u8(&gpu, &pixels, &normalize, &labels)
            .unwrap();
        let got = gpu.compute.clone_dtoh(&net.blob(DATA).data()).unwrap();
        let got_labels = gpu.compute.clone_dtoh(&net.blob(LABEL).data()).unwrap();
        net.load_batch(&gpu, &floats, &labels).unwrap();
        let want = gpu.compute.clone_dtoh(&net.blob(DATA).data()).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "batch of {n}, seed {seed}");
        // One channel: the data blob holds the batch in the host's order in either layout.
        assert_eq!(bits(&got), bits(&floats), "batch of {n}, seed {seed}");
        assert_eq!(got_labels, labels);
    }
}

/// The first 8-bit batches allocate the slots' device pixel buffers: their zeroing is ordered
/// before the copy into them whatever else the compute stream is busy with (held here for
/// 20 ms), so the pixels copied in stay there.
#[test]
fn a_first_u8_batch_is_not_zeroed_behind_a_busy_compute_stream() {
    let gpu = gpu_or_skip!("a_first_u8_batch_is_not_zeroed_behind_a_busy_compute_stream");
    let cfg = equivalence_config();
    let n = 6;
    let mut net = GpuNet::new(&cfg, RECORD, n, &gpu).unwrap();
    let plane = RECORD[1] * RECORD[2];
    let normalize = crate::data::Normalize {
        mean: vec![0.0],
        scale: 1.0,
        plane,
    };
    gpu.synchronize().unwrap();
    for slot in 0..2 {
        let pixels: Vec<u8> = (0..n * plane).map(|i| (i % 251 + 1) as u8).collect();
        let labels = vec![1.0; n];
        gpu.kernels.hold_stream(&gpu.compute, 20_000_000).unwrap();
        net.load_batch_u8(&gpu, &pixels, &normalize, &labels)
            .unwrap();
        gpu.synchronize().unwrap();
        net.copy.synchronize().unwrap();
        let staged = &net.staging[slot].pixels.as_ref().unwrap().device;
        let got = net.copy.clone_dtoh(staged).unwrap();
        assert_eq!(
            &got[..pixels.len()],
            &pixels[..],
            "slot {slot}: the staged pixels"
        );
    }
}
