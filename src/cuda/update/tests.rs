//! Tests of [`GpuSolver`]: every rule against the CPU [`Solver`] over several steps from the
//! same weights and gradients, with per-tensor multipliers, L1 and L2 decay, `iter_size`
//! normalisation, and clipping both engaged and not; and a non-finite gradient, which applies
//! nothing.

use super::*;
use crate::backend::Cpu;
use crate::config::{FillerConfig, LrPolicy};
use crate::cuda::test_util::{assert_close, gpu_or_skip};
use crate::params::Params;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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

/// Tensors of the given lengths and `(lr_mult, decay_mult)`, weights uniform in [−1, 1).
fn params(tensors: &[(usize, f32, f32)], seed: u64) -> Params {
    let spans = tensors
        .iter()
        .enumerate()
        .map(|(i, &(len, lr_mult, decay_mult))| ParamSpan {
            layer: i,
            full_name: format!("t{i}"),
            shape: vec![len],
            offset: 0,
            len: 0,
            lr_mult,
            decay_mult,
            filler: FillerConfig::constant(0.0),
        })
        .collect();
    let mut p = Params::new(spans);
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
/// update kernel walks several elements and crosses tensor boundaries.
const TENSORS: &[(usize, f32, f32)] = &[
    (1000, 1.0, 1.0),
    (37, 2.0, 0.0),
    (0, 3.0, 3.0),
    (700_001, 0.5, 1.0),
    (5, 1.0, 2.5),
];

/// Runs `steps` iterations of `cfg` on the CPU and the GPU from the same weights, the diff set
/// to the same random gradient (times `grad_scale`) before each, and compares the learning
/// rates, the weights, the effective gradients and the history after every step.
fn compare(gpu: &Gpu, cfg: &SolverConfig, steps: u64, grad_scale: f32, seed: u64) {
    let cpu = Cpu::default();
    let mut host = params(TENSORS, seed);
    let n = host.len();
    let mut cpu_solver = Solver::new(cfg, n);
    let mut dev = GpuParams::from_host(gpu, &host).unwrap();
    let mut gpu_solver = GpuSolver::new(gpu, cfg, &host.spans).unwrap();
    assert_eq!(gpu_solver.history_names(), cpu_solver.history_names());
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    for iter in 0..steps {
        let mut grad: Vec<f32> = (0..n)
            .map(|_| rng.gen_range(-1.0f32..1.0) * grad_scale)
            .collect();
        zero_gaps(&host.spans, &mut grad);
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

const RULES: [SolverType; 5] = [
    SolverType::Sgd,
    SolverType::Nesterov,
    SolverType::Adagrad,
    SolverType::Rmsprop,
    SolverType::Adam,
];

/// The hyper-parameters of each rule set away from their defaults.
fn rule_cfg(rule: SolverType) -> SolverConfig {
    let mut c = cfg(rule);
    c.momentum = match rule {
        SolverType::Adam => 0.9,
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
