//! Tests of [`GpuSolver`]: every rule against the CPU [`Solver`] over several steps from the
//! same weights and gradients, with per-tensor multipliers, L1 and L2 decay, `iter_size`
//! normalisation, clipping both engaged and not, and the cosine policy with warmup; a snapshot
//! of either solver resumed by the other; a non-finite gradient, which applies nothing; and the
//! update bucket by bucket, lean or not, which is the update of the whole gradient (a lean part
//! leaves a non-finite element and applies the elements beside it).

use super::*;
use crate::backend::Cpu;
use crate::config::{LrPolicy, Plan};
use crate::cuda::test_util::{assert_close, gpu_or_skip};
use crate::params::Params;
use cudarc::driver::{CudaEvent, CudaStream};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// Both sides run the same f32 operations; only the clipping norm is summed in another order.
const RTOL: f32 = 1e-6;

/// `base_lr = 0.05`, step policy (γ = 0.5 every 2 iterations), the given rule.
fn cfg(solver_type: SolverType) -> SolverConfig {
    let mut c: SolverConfig = toml::from_str(
        "base_lr = 0.05\nmax_iter = 100\nlr_policy = \"step\"\ngamma = 0.5\nstepsize = 2",
    )
    .unwrap();
    c.solver_type = solver_type;
    c
}

/// Tensors of the given lengths and `(lr_mult, decay_mult)`, one layer each, weights uniform in
/// [−1, 1).
fn params(tensors: &[(usize, f32, f32)], seed: u64) -> Params {
    let mut p = Params::of_tensors(tensors, |i| i);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    p.data
        .iter_mut()
        .for_each(|w| *w = rng.gen_range(-1.0..1.0));
    // A few exact zeros, where L1's sign is 0.
    for w in p.data.iter_mut().step_by(97) {
        *w = 0.0;
    }
    zero_gaps(&p.spans, &mut p.data);
    p
}

/// Zeroes the alignment gaps between layers (as `Params::new` leaves them).
fn zero_gaps(spans: &[ParamSpan], buf: &mut [f32]) {
    let mut inside = vec![false; buf.len()];
    for s in spans {
        inside[s.range()].iter_mut().for_each(|b| *b = true);
    }
    for (v, _) in buf.iter_mut().zip(&inside).filter(|(_, &i)| !i) {
        *v = 0.0;
    }
}

/// Several tensors with distinct multipliers, one large enough that every thread of the
/// update kernel walks several elements and crosses tensor boundaries, and that a whole update
/// takes four of a thread's elements at a time before its tail (beyond four waves of threads on
/// a GPU of up to 160 SMs; [`every_rule_matches_cpu_beyond_four_waves`] sizes its tensors by
/// the device).
const TENSORS: &[(usize, f32, f32)] = &[
    (1000, 1.0, 1.0),
    (37, 2.0, 0.0),
    (0, 3.0, 3.0),
    (1_400_001, 0.5, 1.0),
    (5, 1.0, 2.5),
];

/// A random gradient for `p`, uniform in [−`scale`, `scale`), zero in the gaps between layers.
fn gradient(rng: &mut ChaCha8Rng, p: &Params, scale: f32) -> Vec<f32> {
    let mut grad: Vec<f32> = (0..p.len())
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect();
    zero_gaps(&p.spans, &mut grad);
    grad
}

/// Runs `steps` iterations of `cfg` on the CPU and the GPU from the same weights, the diff set
/// to the same random gradient (times `grad_scale`) before each, and compares the learning
/// rates, the weights, the effective gradients and the history after every step.
fn compare(gpu: &Gpu, cfg: &SolverConfig, steps: u64, grad_scale: f32, seed: u64) {
    compare_on(gpu, TENSORS, cfg, steps, grad_scale, seed);
}

/// [`compare`] on parameters of the tensors `tensors` (`(len, lr_mult, decay_mult)`).
fn compare_on(
    gpu: &Gpu,
    tensors: &[(usize, f32, f32)],
    cfg: &SolverConfig,
    steps: u64,
    grad_scale: f32,
    seed: u64,
) {
    let cpu = Cpu::default();
    let mut host = params(tensors, seed);
    let n = host.len();
    let mut cpu_solver = Solver::new(cfg, n);
    let mut dev = GpuParams::from_host(gpu, &host).unwrap();
    let mut gpu_solver = GpuSolver::new(gpu, cfg, &host.spans).unwrap();
    assert_eq!(gpu_solver.history_names(), cpu_solver.history_names());
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    for iter in 0..steps {
        let grad = gradient(&mut rng, &host, grad_scale);
        host.diff.copy_from_slice(&grad);
        let cpu_lr = cpu_solver.apply(&cpu, iter, &mut host);
        gpu.compute
            .memcpy_htod(&grad[..], &mut dev.diff.slice_mut(..n))
            .unwrap();
        let gpu_lr = gpu_solver.apply(gpu, iter, &mut dev).unwrap();
        assert_eq!(gpu_lr, cpu_lr, "iteration {iter}: learning rate");
        let got = dev.to_host(gpu).unwrap();
        let what = |x: &str| format!("{:?} iteration {iter}: {x}", cfg.solver_type);
        assert_close(&what("weights"), &got.data, &host.data, RTOL);
        let mut gaps = got.data.clone();
        zero_gaps(&host.spans, &mut gaps);
        assert_eq!(
            gaps,
            got.data,
            "{}",
            what("the gaps between layers stay zero")
        );
        assert_close(&what("effective gradient"), &got.diff, &host.diff, RTOL);
        let history = gpu_solver.history_to_host(gpu).unwrap();
        for (j, (g, c)) in history.iter().zip(cpu_solver.history()).enumerate() {
            assert_close(&what(&format!("history {j}")), g, c, RTOL);
        }
    }
}

const RULES: [SolverType; 7] = [
    SolverType::Sgd,
    SolverType::Nesterov,
    SolverType::Adagrad,
    SolverType::Rmsprop,
    SolverType::Adam,
    SolverType::Adamw,
    SolverType::Adadelta,
];

/// The hyper-parameters of each rule set away from their defaults.
fn rule_cfg(rule: SolverType) -> SolverConfig {
    let mut c = cfg(rule);
    c.momentum = match rule {
        SolverType::Adam | SolverType::Adamw => 0.9,
        SolverType::Adadelta => 0.95,
        _ => 0.8,
    };
    c.momentum2 = 0.99;
    c.delta = 1e-6;
    c.rms_decay = 0.95;
    c
}

#[test]
fn every_rule_matches_cpu_with_l2_decay() {
    let gpu = gpu_or_skip!("every_rule_matches_cpu_with_l2_decay");
    for (i, rule) in RULES.into_iter().enumerate() {
        let mut c = rule_cfg(rule);
        c.weight_decay = 5e-3;
        compare(&gpu, &c, 5, 1.0, 700 + i as u64);
    }
}

#[test]
fn every_rule_matches_cpu_with_l1_decay() {
    let gpu = gpu_or_skip!("every_rule_matches_cpu_with_l1_decay");
    for (i, rule) in RULES.into_iter().enumerate() {
        let mut c = rule_cfg(rule);
        c.weight_decay = 1e-2;
        c.regularization_type = Regularization::L1;
        compare(&gpu, &c, 4, 1.0, 710 + i as u64);
    }
}

#[test]
fn every_rule_matches_cpu_with_clipping_and_iter_size() {
    let gpu = gpu_or_skip!("every_rule_matches_cpu_with_clipping_and_iter_size");
    for (i, rule) in RULES.into_iter().enumerate() {
        let mut c = rule_cfg(rule);
        c.weight_decay = 1e-3;
        c.iter_size = 3;
        // ‖g / iter_size‖ ≈ √(4n/3) / 3 ≈ 320 ≫ 1: clipping engages every step.
        c.clip_gradients = 1.0;
        compare(&gpu, &c, 4, 2.0, 720 + i as u64);
    }
}

/// The learning rate is the host's (`crate::solver::learning_rate`), passed to the kernels each
/// step: the cosine policy and the linear warmup reach the GPU rules as they reach the CPU ones,
/// past the end of the warmup and of `max_iter`.
#[test]
fn every_rule_matches_cpu_under_cosine_with_warmup() {
    let gpu = gpu_or_skip!("every_rule_matches_cpu_under_cosine_with_warmup");
    for (i, rule) in RULES.into_iter().enumerate() {
        let mut c = rule_cfg(rule);
        c.weight_decay = 5e-3;
        c.lr_policy = LrPolicy::Cosine;
        c.warmup_iter = 3;
        c.max_iter = 5;
        compare(&gpu, &c, 6, 1.0, 760 + i as u64);
    }
}

/// Beyond four waves of threads the update reads four of a thread's elements before it
/// computes them (`UPDATE_ELEMENTS_IN_FLIGHT` in `solver.cu`), then takes the rest one at a
/// time: every rule still matches the CPU, over tensors whose boundaries fall inside a group of
/// four and in the tail, with both decays.
#[test]
fn every_rule_matches_cpu_beyond_four_waves() {
    let gpu = gpu_or_skip!("every_rule_matches_cpu_beyond_four_waves");
    let wave = gpu.kernels.wave_threads();
    let tensors = [
        (4 * wave + 1001, 1.0, 1.0),
        (37, 2.0, 0.0),
        (wave / 2 + 3, 0.5, 1.0),
        (3 * wave + 7, 1.0, 2.5),
    ];
    for (i, rule) in RULES.into_iter().enumerate() {
        let mut c = rule_cfg(rule);
        c.weight_decay = 5e-3;
        if i % 2 == 1 {
            c.regularization_type = Regularization::L1;
        }
        compare_on(&gpu, &tensors, &c, 3, 1.0, 780 + i as u64);
    }
}

#[test]
fn clipping_below_the_threshold_only_normalises() {
    let gpu = gpu_or_skip!("clipping_below_the_threshold_only_normalises");
    let mut c = rule_cfg(SolverType::Sgd);
    c.iter_size = 2;
    c.clip_gradients = 1e6;
    compare(&gpu, &c, 3, 1.0, 730);
}

#[test]
fn history_round_trips_through_the_host() {
    let gpu = gpu_or_skip!("history_round_trips_through_the_host");
    let host = params(&[(10, 1.0, 1.0), (3, 1.0, 1.0)], 740);
    let mut s = GpuSolver::new(&gpu, &rule_cfg(SolverType::Adam), &host.spans).unwrap();
    let h = vec![(0..host.len()).map(|i| i as f32).collect::<Vec<_>>(); 2];
    s.history_from_host(&gpu, &h).unwrap();
    assert_eq!(s.history_to_host(&gpu).unwrap(), h);
    assert!(s.history_from_host(&gpu, &h[..1]).is_err());
}

/// The envelope of the resume tests' snapshots: the plan of `tests/configs/equivalence.toml` for
/// one process running `rule` (its net is not used; the snapshot holds the test's own tensors).
fn resume_plan(rule: &str) -> Plan {
    let text = include_str!("../../../tests/configs/equivalence.toml");
    let sets = [format!("solver.type=\"{rule}\"")];
    let (c, source) =
        crate::validate::load_str("equivalence.toml", text, std::path::Path::new("."), &sets)
            .unwrap();
    Plan::new(c, source, 1).unwrap()
}

/// Writes a snapshot of iteration `iter` (weights `params`, solver history `history` under
/// `names`) into `dir` and reads it back for a solver that keeps `names_back`.
fn through_a_snapshot(
    dir: &std::path::Path,
    plan: &Plan,
    (params, names, history): (&Params, &[&str], &[Vec<f32>]),
    iter: u64,
    names_back: &[&str],
) -> (Params, Vec<Vec<f32>>) {
    const RECORDS: usize = 1000;
    let state = crate::resume::SaveState {
        iter,
        history_names: names,
        history,
        loss_window: &[],
        train_records: RECORDS,
        lineage: "resume-test",
        apart: None,
        loss_scale: None,
    };
    let files = crate::resume::save(dir, plan, params, &state).unwrap();
    let mut back = Params::new(params.spans.clone());
    let loaded = crate::resume::load(
        &files,
        plan,
        &mut back,
        names_back,
        RECORDS,
        crate::resume::ResumeRules::default(),
    )
    .unwrap();
    assert_eq!(loaded.iter, iter);
    (back, loaded.history)
}

/// A snapshot of the GPU solver, taken after `K` steps, resumes on the CPU solver, and one of the
/// CPU solver on the GPU: the history goes through the solver-state file under the names both
/// solvers keep, and either resumed run ends where the uninterrupted CPU run does.
#[test]
fn a_snapshot_of_either_solver_resumes_on_the_other() {
    let gpu = gpu_or_skip!("a_snapshot_of_either_solver_resumes_on_the_other");
    const K: u64 = 3;
    const STEPS: u64 = 6;
    let cpu = Cpu::default();
    let dir = tempfile::tempdir().unwrap();
    for (i, rule) in RULES.into_iter().enumerate() {
        let plan = resume_plan(crate::config::name_of(&rule).as_str());
        let mut c = rule_cfg(rule);
        c.weight_decay = 5e-3;
        let seed = 770 + i as u64;
        let start = params(&[(3000, 1.0, 1.0), (37, 2.0, 0.5)], seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
        let grads: Vec<Vec<f32>> = (0..STEPS)
            .map(|_| gradient(&mut rng, &start, 1.0))
            .collect();
        let cpu_steps = |p: &mut Params, s: &mut Solver, iters: std::ops::Range<u64>| {
            for iter in iters {
                p.diff.copy_from_slice(&grads[iter as usize]);
                s.apply(&cpu, iter, p);
            }
        };
        let gpu_steps = |p: &mut GpuParams, s: &mut GpuSolver, iters: std::ops::Range<u64>| {
            for iter in iters {
                let g = &grads[iter as usize];
                gpu.compute
                    .memcpy_htod(&g[..], &mut p.diff.slice_mut(..g.len()))
                    .unwrap();
                s.apply(&gpu, iter, p).unwrap();
            }
        };
        let what = |x: &str| format!("{rule:?}: {x}");

        // The uninterrupted run.
        let mut straight = start.clone();
        let mut straight_solver = Solver::new(&c, start.len());
        cpu_steps(&mut straight, &mut straight_solver, 0..STEPS);

        // GPU to the snapshot, CPU after it.
        let mut dev = GpuParams::from_host(&gpu, &start).unwrap();
        let mut on_gpu = GpuSolver::new(&gpu, &c, &start.spans).unwrap();
        gpu_steps(&mut dev, &mut on_gpu, 0..K);
        let mut on_cpu = Solver::new(&c, start.len());
        let (mut host, history) = through_a_snapshot(
            dir.path(),
            &plan,
            (
                &dev.to_host(&gpu).unwrap(),
                on_gpu.history_names(),
                &on_gpu.history_to_host(&gpu).unwrap(),
            ),
            K,
            on_cpu.history_names(),
        );
        on_cpu.history_mut().clone_from_slice(&history);
        cpu_steps(&mut host, &mut on_cpu, K..STEPS);
        assert_close(
            &what("GPU then CPU: weights"),
            &host.data,
            &straight.data,
            RTOL,
        );
        for (j, (h, want)) in on_cpu
            .history()
            .iter()
            .zip(straight_solver.history())
            .enumerate()
        {
            assert_close(&what(&format!("GPU then CPU: history {j}")), h, want, RTOL);
        }

        // CPU to the snapshot, GPU after it.
        let mut host = start.clone();
        let mut on_cpu = Solver::new(&c, start.len());
        cpu_steps(&mut host, &mut on_cpu, 0..K);
        let mut on_gpu = GpuSolver::new(&gpu, &c, &start.spans).unwrap();
        let (host, history) = through_a_snapshot(
            dir.path(),
            &plan,
            (&host, on_cpu.history_names(), on_cpu.history()),
            K,
            on_gpu.history_names(),
        );
        let mut dev = GpuParams::from_host(&gpu, &host).unwrap();
        on_gpu.history_from_host(&gpu, &history).unwrap();
        gpu_steps(&mut dev, &mut on_gpu, K..STEPS);
        let got = dev.to_host(&gpu).unwrap();
        assert_close(
            &what("CPU then GPU: weights"),
            &got.data,
            &straight.data,
            RTOL,
        );
        let history = on_gpu.history_to_host(&gpu).unwrap();
        for (j, (h, want)) in history.iter().zip(straight_solver.history()).enumerate() {
            assert_close(&what(&format!("CPU then GPU: history {j}")), h, want, RTOL);
        }
    }
}

#[test]
fn no_parameters_is_a_no_op() {
    let gpu = gpu_or_skip!("no_parameters_is_a_no_op");
    let mut p = GpuParams::new(&gpu, Vec::new()).unwrap();
    let mut c = cfg(SolverType::Adam);
    c.lr_policy = LrPolicy::Fixed;
    let mut s = GpuSolver::new(&gpu, &c, &[]).unwrap();
    assert_eq!(s.apply(&gpu, 0, &mut p).unwrap(), 0.05);
}

/// Applies one step of `grad` (the diff's first `grad.len()` values; the rest zero) at `iter` and
/// returns the weights and history after it.
fn step_with(
    gpu: &Gpu,
    solver: &mut GpuSolver,
    dev: &mut GpuParams,
    grad: &[f32],
    iter: u64,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut diff = vec![0.0f32; dev.len()];
    diff[..grad.len()].copy_from_slice(grad);
    gpu.compute
        .memcpy_htod(&diff[..], &mut dev.diff.slice_mut(..dev.len()))
        .unwrap();
    solver.apply(gpu, iter, dev).unwrap();
    (
        dev.to_host(gpu).unwrap().data,
        solver.history_to_host(gpu).unwrap(),
    )
}

/// A step whose gradient holds a NaN or an infinity changes neither the weights nor the history
/// and is recorded; `stop` refuses every step after it, `skip` only that one (the CPU engine's
/// rule, `crate::solver::non_finite`).
#[test]
fn a_non_finite_gradient_applies_no_update_and_is_recorded() {
    let gpu = gpu_or_skip!("a_non_finite_gradient_applies_no_update_and_is_recorded");
    for mode in [NonFiniteMode::Stop, NonFiniteMode::Skip] {
        let host = params(&[(300, 1.0, 1.0), (7, 1.0, 1.0)], 750);
        let mut c = rule_cfg(SolverType::Sgd);
        c.weight_decay = 1e-3;
        c.non_finite = mode;
        let mut dev = GpuParams::from_host(&gpu, &host).unwrap();
        let mut s = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
        let good = vec![0.25f32; 300];
        let before = step_with(&gpu, &mut s, &mut dev, &good, 0);
        assert_ne!(before.0, host.data, "{mode:?}: a finite step updates");
        for (iter, bad) in [(1, f32::NAN), (2, f32::INFINITY)] {
            let mut grad = good.clone();
            grad[123] = bad;
            let after = step_with(&gpu, &mut s, &mut dev, &grad, iter);
            assert_eq!(
                after, before,
                "{mode:?}: iteration {iter} changed the state"
            );
        }
        let steps = s.non_finite_steps(&gpu).unwrap();
        assert_eq!(
            (steps.count, steps.first, steps.last),
            (2, Some(1), Some(2)),
            "{mode:?}"
        );
        let later = step_with(&gpu, &mut s, &mut dev, &good, 3);
        match mode {
            NonFiniteMode::Stop => assert_eq!(later, before, "stop: later steps refused"),
            NonFiniteMode::Skip => assert_ne!(later, before, "skip: training goes on"),
        }
    }
}

/// Loss scaling on the device against the CPU's `LossScaler` and solver, step for step, from a
/// dynamic scale of 8 growing every 3 good steps, with clipping engaged: a gradient `scale`
/// times the true one is judged, skipped on an overflow (weights, history and the refused-step
/// record unchanged, the scale halved, the skip counted), and otherwise unscaled and applied
/// (only the clipping norm is summed in another order). A fixed scale leaves a non-finite
/// gradient to `non_finite` as FP32 does.
#[test]
fn a_scaled_gradient_is_judged_unscaled_and_applied_as_on_the_cpu() {
    use crate::config::{ClusterConfig, LossScale, MathMode};
    use crate::cuda::loss_scale::DeviceLossScale;
    use crate::solver::loss_scale::{LossScaler, Verdict};
    let gpu = gpu_or_skip!("a_scaled_gradient_is_judged_unscaled_and_applied_as_on_the_cpu");
    let cluster = ClusterConfig {
        math: MathMode::Fp16,
        loss_scale_init: 8.0,
        loss_scale_growth_interval: 3,
        ..Default::default()
    };
    let cpu = Cpu::default();
    let mut host = params(&[(3000, 1.0, 1.0), (17, 2.0, 0.0)], 760);
    let mut c = rule_cfg(SolverType::Sgd);
    c.clip_gradients = 0.5;
    c.weight_decay = 1e-3;
    let n = host.len();
    let mut cpu_solver = Solver::new(&c, n);
    let mut scaler = LossScaler::new(&cluster);
    let mut dev = GpuParams::from_host(&gpu, &host).unwrap();
    let mut gpu_solver = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
    let mut device_scale = DeviceLossScale::new(&gpu, &scaler).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(761);
    let overflows = [1, 5, 6];
    for iter in 0..10u64 {
        let mut grad = gradient(&mut rng, &host, 1.0);
        grad.iter_mut().for_each(|g| *g *= scaler.scale());
        if overflows.contains(&iter) {
            grad[41] = f32::INFINITY;
        }
        host.diff.copy_from_slice(&grad);
        let step_scale = scaler.scale();
        let verdict = scaler.verdict(!overflows.contains(&iter));
        if verdict == Verdict::Apply {
            LossScaler::unscale(step_scale, &mut host.diff);
            cpu_solver.apply(&cpu, iter, &mut host);
        }
        gpu.compute
            .memcpy_htod(&grad[..], &mut dev.diff.slice_mut(..n))
            .unwrap();
        gpu_solver
            .apply_scaled(&gpu, iter, &mut dev, None, Some(&mut device_scale))
            .unwrap();
        let got = dev.to_host(&gpu).unwrap();
        let what = format!("iteration {iter} ({verdict:?}): weights");
        assert_close(&what, &got.data, &host.data, RTOL);
        assert_eq!(
            device_scale.state(&gpu).unwrap(),
            scaler.state(),
            "iteration {iter}: loss scale"
        );
    }
    assert_eq!(scaler.state().unwrap().skipped, 3);
    assert_eq!(gpu_solver.non_finite_steps(&gpu).unwrap().count, 0);

    // A fixed scale: an overflow is a refused step of `non_finite`, the scale never moves.
    let fixed = LossScaler::new(&ClusterConfig {
        loss_scale: Some(LossScale::Fixed(1024.0)),
        ..cluster.clone()
    });
    let mut fixed_scale = DeviceLossScale::new(&gpu, &fixed).unwrap();
    let before = dev.to_host(&gpu).unwrap().data;
    let mut grad = vec![1.0f32; n];
    grad[3] = f32::NAN;
    gpu.compute
        .memcpy_htod(&grad[..], &mut dev.diff.slice_mut(..n))
        .unwrap();
    gpu_solver
        .apply_scaled(&gpu, 10, &mut dev, None, Some(&mut fixed_scale))
        .unwrap();
    assert_eq!(dev.to_host(&gpu).unwrap().data, before);
    assert_eq!(gpu_solver.non_finite_steps(&gpu).unwrap().count, 1);
    assert_eq!(fixed_scale.state(&gpu).unwrap(), fixed.state());
}

/// Splits `0..n` into parts at `cuts` and lists them in a gradient bucket's launch order (the
/// highest offsets first).
fn parts_in_launch_order(n: usize, cuts: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut bounds = vec![0];
    bounds.extend(cuts.iter().copied().filter(|&c| c > 0 && c < n));
    bounds.push(n);
    bounds.windows(2).rev().map(|w| w[0]..w[1]).collect()
}

/// Part `i` (in launch order) of an iteration's update, its gradient in the gradient buffer.
fn gradient_part(range: &std::ops::Range<usize>, i: usize) -> Part<'static> {
    Part {
        range: range.clone(),
        later: i > 0,
        sum: None,
        copies: None,
        lean: false,
    }
}

/// [`gradient_part`], lean (as the engine's update behind the backward).
fn lean_part(range: &std::ops::Range<usize>, i: usize) -> Part<'static> {
    Part {
        lean: true,
        ..gradient_part(range, i)
    }
}

/// A stream of its own for the parts of an update (as the engine's update stream), and an event
/// to order it with the compute stream both ways ([`join`]).
fn update_stream(gpu: &Gpu) -> (Arc<CudaStream>, CudaEvent) {
    let stream = gpu.ctx.new_stream().unwrap();
    let event = gpu.ctx.new_event(None).unwrap();
    (stream, event)
}

/// Makes `waiter` wait for the work enqueued on `on` so far, through `event`.
fn join(event: &CudaEvent, on: &CudaStream, waiter: &CudaStream) {
    event.record(on).unwrap();
    waiter.wait(event).unwrap();
}

/// The update bucket by bucket is the update of the whole gradient, bit for bit, for every rule
/// (with L2 decay and `iter_size` normalisation), with parts cut inside tensors and between
/// them; so are lean parts on a stream of their own, which leave the raw gradient in the
/// gradient buffer.
#[test]
fn an_update_in_parts_is_the_update_of_the_whole() {
    let gpu = gpu_or_skip!("an_update_in_parts_is_the_update_of_the_whole");
    let host = params(TENSORS, 31);
    let n = host.len();
    let parts = parts_in_launch_order(n, &[500, 1040, 300_000, 700_000]);
    let (stream, event) = update_stream(&gpu);
    for rule in RULES {
        let mut c = rule_cfg(rule);
        c.weight_decay = 1e-3;
        c.iter_size = 2;
        let mut whole = GpuParams::from_host(&gpu, &host).unwrap();
        let mut split = GpuParams::from_host(&gpu, &host).unwrap();
        let mut lean = GpuParams::from_host(&gpu, &host).unwrap();
        let mut whole_solver = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
        let mut split_solver = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
        let mut lean_solver = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
        assert!(split_solver.updates_by_part(None), "{rule:?}");
        let mut rng = ChaCha8Rng::seed_from_u64(32);
        for iter in 0..3 {
            let grad = gradient(&mut rng, &host, 0.5);
            for p in [&mut whole, &mut split, &mut lean] {
                gpu.compute
                    .memcpy_htod(&grad[..], &mut p.diff.slice_mut(..n))
                    .unwrap();
            }
            let lr = whole_solver.apply(&gpu, iter, &mut whole).unwrap();
            join(&event, &gpu.compute, &stream);
            for (i, part) in parts.iter().enumerate() {
                let got = split_solver
                    .apply_part(
                        &gpu,
                        &gpu.compute,
                        iter,
                        &mut split,
                        gradient_part(part, i),
                        None,
                    )
                    .unwrap();
                assert_eq!(got, lr);
                let got = lean_solver
                    .apply_part(&gpu, &stream, iter, &mut lean, lean_part(part, i), None)
                    .unwrap();
                assert_eq!(got, lr);
            }
            join(&event, &stream, &gpu.compute);
            let (a, b) = (whole.to_host(&gpu).unwrap(), split.to_host(&gpu).unwrap());
            let l = lean.to_host(&gpu).unwrap();
            assert_eq!(a.data, b.data, "{rule:?} iteration {iter}: weights");
            assert_eq!(a.data, l.data, "{rule:?} iteration {iter}: weights, lean");
            assert_eq!(
                a.diff, b.diff,
                "{rule:?} iteration {iter}: effective gradient"
            );
            assert_eq!(
                l.diff, grad,
                "{rule:?} iteration {iter}: lean, raw gradient"
            );
            let (ha, hb, hl) = (
                whole_solver.history_to_host(&gpu).unwrap(),
                split_solver.history_to_host(&gpu).unwrap(),
                lean_solver.history_to_host(&gpu).unwrap(),
            );
            assert_eq!(ha, hb, "{rule:?} iteration {iter}: history");
            assert_eq!(ha, hl, "{rule:?} iteration {iter}: history, lean");
        }
        assert_eq!(lean_solver.non_finite_steps(&gpu).unwrap().count, 0);
    }
}

/// The update runs in parts only where the result cannot differ from the whole gradient's: not
/// with clipping (the global norm), `skip` (every weight of a refused step kept) or a dynamic
/// loss scale (its state moves once a step); a fixed scale is the same in every part.
#[test]
fn an_update_runs_in_parts_only_where_the_result_cannot_differ() {
    let plain = rule_cfg(SolverType::Sgd);
    assert!(updates_by_part(&plain, None));
    let mut clipped = plain.clone();
    clipped.clip_gradients = 1.0;
    assert!(!updates_by_part(&clipped, None));
    let mut skipping = plain.clone();
    skipping.non_finite = NonFiniteMode::Skip;
    assert!(!updates_by_part(&skipping, None));
    let dynamic = LossScaleRule::Dynamic {
        growth_interval: 2000,
        backoff: 0.5,
    };
    assert!(!updates_by_part(&plain, Some(dynamic)));
    assert!(updates_by_part(&plain, Some(LossScaleRule::Fixed)));
    assert!(updates_by_part(&plain, Some(LossScaleRule::Off)));
}

/// Judged in parts under `stop`, lean or not: a non-finite part records its iteration once,
/// however many parts of it follow; where its first element is not finite in the first part
/// launched (where a non-finite loss puts its NaN), nothing of the step is applied; every later
/// step is refused.
#[test]
fn a_non_finite_part_records_its_step_once_and_stops_the_rest() {
    let gpu = gpu_or_skip!("a_non_finite_part_records_its_step_once_and_stops_the_rest");
    let host = params(&[(300, 1.0, 1.0), (7, 1.0, 1.0), (500, 1.0, 1.0)], 751);
    let n = host.len();
    let parts = parts_in_launch_order(n, &[150, 400]);
    let c = rule_cfg(SolverType::Sgd);
    for (bad_part, lean) in (0..parts.len()).flat_map(|b| [(b, false), (b, true)]) {
        let mut dev = GpuParams::from_host(&gpu, &host).unwrap();
        let mut s = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
        let mut step = |grad: &[f32], iter: u64| {
            gpu.compute
                .memcpy_htod(grad, &mut dev.diff.slice_mut(..n))
                .unwrap();
            for (i, part) in parts.iter().enumerate() {
                let part = Part {
                    lean,
                    ..gradient_part(part, i)
                };
                s.apply_part(&gpu, &gpu.compute, iter, &mut dev, part, None)
                    .unwrap();
            }
            dev.to_host(&gpu).unwrap().data
        };
        let what = format!("bad part {bad_part}, lean {lean}");
        let good = vec![0.25f32; n];
        let before = step(&good, 0);
        let mut bad = good.clone();
        bad[parts[bad_part].start] = f32::NAN;
        bad[parts[parts.len() - 1].start] = f32::INFINITY;
        let after = step(&bad, 1);
        if bad_part == 0 {
            assert_eq!(
                after, before,
                "{what}: a non-finite first part applies nothing"
            );
        }
        for (i, part) in parts.iter().enumerate().filter(|&(i, _)| i > bad_part) {
            assert_eq!(
                after[part.clone()],
                before[part.clone()],
                "{what}: part {i} after the bad one"
            );
        }
        let start = parts[bad_part].start;
        assert_eq!(
            after[start], before[start],
            "{what}: the non-finite element"
        );
        assert!(after.iter().all(|w| w.is_finite()), "{what}");
        assert_eq!(
            step(&good, 2),
            after,
            "{what}: stop refuses every later step"
        );
        let steps = s.non_finite_steps(&gpu).unwrap();
        assert_eq!(
            (steps.count, steps.first, steps.last),
            (1, Some(1), Some(1)),
            "{what}"
        );
    }
}

/// A lean part judges each element: non-finite elements inside the first part (not its first)
/// and inside a later one are left as they were and record their iteration once; the elements
/// beside them in their part are applied as a part that is not lean applies them, and the parts
/// after the first non-finite one are refused.
#[test]
fn a_lean_part_leaves_its_non_finite_elements_and_applies_the_rest() {
    let gpu = gpu_or_skip!("a_lean_part_leaves_its_non_finite_elements_and_applies_the_rest");
    let host = params(&[(300, 1.0, 1.0), (7, 1.0, 1.0), (500, 1.0, 1.0)], 753);
    let n = host.len();
    let parts = parts_in_launch_order(n, &[150, 400]);
    let c = rule_cfg(SolverType::Adam);
    let good: Vec<f32> = (0..n).map(|i| 0.01 * (i % 17) as f32 - 0.08).collect();
    let mut bad = good.clone();
    let holes = [parts[0].start + 5, parts[0].start + 9, parts[1].start + 20];
    bad[holes[0]] = f32::NAN;
    bad[holes[1]] = f32::NEG_INFINITY;
    bad[holes[2]] = f32::INFINITY;
    let (mut reference, mut dev) = (
        GpuParams::from_host(&gpu, &host).unwrap(),
        GpuParams::from_host(&gpu, &host).unwrap(),
    );
    let mut a = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
    let mut b = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
    for (p, grad) in [(&mut reference, &good), (&mut dev, &bad)] {
        gpu.compute
            .memcpy_htod(&grad[..], &mut p.diff.slice_mut(..n))
            .unwrap();
    }
    for (i, part) in parts.iter().enumerate() {
        a.apply_part(
            &gpu,
            &gpu.compute,
            4,
            &mut reference,
            lean_part(part, i),
            None,
        )
        .unwrap();
        b.apply_part(&gpu, &gpu.compute, 4, &mut dev, lean_part(part, i), None)
            .unwrap();
    }
    let (want, got) = (
        reference.to_host(&gpu).unwrap().data,
        dev.to_host(&gpu).unwrap().data,
    );
    for i in 0..n {
        let expected = match i {
            _ if holes.contains(&i) => host.data[i],
            _ if parts[0].contains(&i) => want[i],
            _ => host.data[i], // refused after the first part's non-finite elements
        };
        assert_eq!(got[i].to_bits(), expected.to_bits(), "element {i}");
    }
    assert_ne!(
        want[parts[0].start], host.data[parts[0].start],
        "the reference moved"
    );
    let steps = b.non_finite_steps(&gpu).unwrap();
    assert_eq!(
        (steps.count, steps.first, steps.last),
        (1, Some(4), Some(4))
    );
}

/// An update reading the bfloat16 wire's sum (widened and averaged as it is read) is the update
/// of the gradient `from_bf16_scaled` writes, bit for bit, for every rule, lean or not, and a
/// NaN in the sum is refused as one in the gradient.
#[test]
fn an_update_reading_the_wire_sum_is_the_update_of_the_unpacked_gradient() {
    use crate::cuda::kernels::WireSum;
    let gpu = gpu_or_skip!("an_update_reading_the_wire_sum_is_the_update_of_the_unpacked_gradient");
    let (s, k) = (&gpu.compute, &gpu.kernels);
    let host = params(TENSORS, 41);
    let n = host.len();
    let parts = parts_in_launch_order(n, &[1000, 400_000]);
    let scale = 1.0 / 3.0;
    for (rule, lean) in RULES.iter().flat_map(|&r| [(r, false), (r, true)]) {
        let mut c = rule_cfg(rule);
        c.weight_decay = 1e-3;
        let mut unpacked = GpuParams::from_host(&gpu, &host).unwrap();
        let mut reading = GpuParams::from_host(&gpu, &host).unwrap();
        let mut a = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
        let mut b = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        for iter in 0..3 {
            let grad = gradient(&mut rng, &host, 0.5);
            let mut bits: Vec<u16> = grad
                .iter()
                .map(|&g| crate::dist::wire::to_wire(g).to_bits())
                .collect();
            if iter == 1 {
                bits[parts[1].start + 3] = 0x7fc0; // a NaN in a later part
            }
            let bits = s.clone_htod(&bits).unwrap();
            k.from_bf16_scaled(s, &bits, &mut unpacked.diff.slice_mut(..n), scale, n)
                .unwrap();
            // The other side's gradient buffer holds something else: only the sum is read.
            s.memcpy_htod(&grad[..], &mut reading.diff.slice_mut(..n))
                .unwrap();
            for (i, range) in parts.iter().enumerate() {
                let part = Part {
                    lean,
                    ..gradient_part(range, i)
                };
                a.apply_part(&gpu, s, iter, &mut unpacked, part, None)
                    .unwrap();
                let reads_sum = Part {
                    sum: Some(WireSum { bits: &bits, scale }),
                    lean,
                    ..gradient_part(range, i)
                };
                b.apply_part(&gpu, s, iter, &mut reading, reads_sum, None)
                    .unwrap();
            }
            let (x, y) = (
                unpacked.to_host(&gpu).unwrap(),
                reading.to_host(&gpu).unwrap(),
            );
            assert_eq!(
                x.data, y.data,
                "{rule:?} lean {lean} iteration {iter}: weights"
            );
            // A refused part leaves the gradient buffer as it was: only iteration 0 writes all;
            // a lean update writes none.
            if iter == 0 && !lean {
                assert_eq!(
                    x.diff, y.diff,
                    "{rule:?} lean {lean} iteration {iter}: effective gradient"
                );
            }
            assert_eq!(
                a.history_to_host(&gpu).unwrap(),
                b.history_to_host(&gpu).unwrap(),
                "{rule:?} lean {lean} iteration {iter}: history"
            );
        }
        let (ra, rb) = (
            a.non_finite_steps(&gpu).unwrap(),
            b.non_finite_steps(&gpu).unwrap(),
        );
        assert_eq!((rb.count, rb.first), (1, Some(1)), "{rule:?} lean {lean}");
        assert_eq!((ra.count, ra.first, ra.last), (rb.count, rb.first, rb.last));
    }
}

/// An update handed mixed precision's copies of the weights writes, for every rule and both half
/// types, whole and in parts (lean or not): the new weights (the same bits as without copies), each
/// [`WeightCopy::Rounded`] tensor's weights rounded as `Half::round` rounds, each
/// [`WeightCopy::Half`] tensor's as half-type bit patterns of the same values, and nothing
/// elsewhere; a refused step (a NaN in the gradient) writes no copy.
#[test]
fn an_update_writes_the_rounded_copies_of_the_new_weights() {
    use crate::cuda::kernels::{WeightCopies, WeightCopy};
    use crate::precision::Half;
    let gpu = gpu_or_skip!("an_update_writes_the_rounded_copies_of_the_new_weights");
    let s = &gpu.compute;
    let host = params(TENSORS, 51);
    let n = host.len();
    let kinds = [
        WeightCopy::Rounded,
        WeightCopy::Half,
        WeightCopy::Kept,
        WeightCopy::Half,
        WeightCopy::Rounded,
    ];
    let table: Vec<i32> = kinds.iter().map(|&k| k as i32).collect();
    let kinds_on_device = s.clone_htod(&table).unwrap();
    let parts = parts_in_launch_order(n, &[600, 1020, 400_000]);
    const UNWRITTEN: (f32, u16) = (-12345.0, 0xabcd);
    for rule in RULES {
        for half in [Half::Bf16, Half::Fp16] {
            let mut c = rule_cfg(rule);
            c.weight_decay = 1e-3;
            let mut plain = GpuParams::from_host(&gpu, &host).unwrap();
            let mut copying = GpuParams::from_host(&gpu, &host).unwrap();
            let mut a = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
            let mut b = GpuSolver::new(&gpu, &c, &host.spans).unwrap();
            let mut rounded = s.clone_htod(&vec![UNWRITTEN.0; n]).unwrap();
            let mut bits = s.clone_htod(&vec![UNWRITTEN.1; n]).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(52);
            let mut before: Option<(Vec<f32>, Vec<u16>)> = None;
            for iter in 0..4 {
                let mut grad = gradient(&mut rng, &host, 0.5);
                if iter == 3 {
                    grad[7] = f32::NAN;
                }
                for p in [&mut plain, &mut copying] {
                    s.memcpy_htod(&grad[..], &mut p.diff.slice_mut(..n))
                        .unwrap();
                }
                a.apply(&gpu, iter, &mut plain).unwrap();
                let mut copies = WeightCopies {
                    rounded: &mut rounded,
                    half: Some(&mut bits),
                    kinds: &kinds_on_device,
                    fp16: half == Half::Fp16,
                };
                match iter {
                    1 | 2 => {
                        for (i, range) in parts.iter().enumerate() {
                            let part = Part {
                                copies: Some(copies.reborrow()),
                                lean: iter == 2,
                                ..gradient_part(range, i)
                            };
                            b.apply_part(&gpu, s, iter, &mut copying, part, None)
                                .unwrap();
                        }
                    }
                    _ => {
                        b.apply_scaled(&gpu, iter, &mut copying, Some(copies), None)
                            .unwrap();
                    }
                }
                let what = format!("{rule:?} {half:?} iteration {iter}");
                let (x, y) = (plain.to_host(&gpu).unwrap(), copying.to_host(&gpu).unwrap());
                assert_eq!(x.data, y.data, "{what}: weights");
                let got = (
                    s.clone_dtoh(&rounded).unwrap(),
                    s.clone_dtoh(&bits).unwrap(),
                );
                if iter == 3 {
                    assert_eq!(
                        Some(&got),
                        before.as_ref(),
                        "{what}: a refused step's copies"
                    );
                    continue;
                }
                let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan();
                for (span, kind) in host.spans.iter().zip(kinds) {
                    for i in span.range() {
                        let want = half.round(y.data[i]);
                        let widened = match half {
                            Half::Bf16 => half::bf16::from_bits(got.1[i]).to_f32(),
                            Half::Fp16 => half::f16::from_bits(got.1[i]).to_f32(),
                        };
                        let (r, h) = (got.0[i], got.1[i]);
                        let ok = match kind {
                            WeightCopy::Rounded => same(r, want) && h == UNWRITTEN.1,
                            WeightCopy::Half => r == UNWRITTEN.0 && same(widened, want),
                            WeightCopy::Kept => r == UNWRITTEN.0 && h == UNWRITTEN.1,
                        };
                        assert!(
                            ok,
                            "{what}: {kind:?} element {i}: {r:e}, {h:#x}, want {want:e}"
                        );
                    }
                }
                before = Some(got);
            }
        }
    }
}
