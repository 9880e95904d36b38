//! Tests of [`Solver::apply`]: every rule against hand-computed values over a few steps, the
//! per-tensor multipliers, L1 against L2, clipping and `iter_size` normalisation.

use super::*;
use crate::config::LrPolicy;

/// `base_lr = 0.1`, `max_iter = 100`, the rest at the config file's defaults (SGD, no momentum,
/// no decay, no clipping, `iter_size = 1`).
fn cfg(solver_type: SolverType) -> SolverConfig {
    let mut c: SolverConfig = toml::from_str("base_lr = 0.1\nmax_iter = 100").unwrap();
    c.solver_type = solver_type;
    c
}

/// Tensors `t0`, `t1`, … of one layer (so laid out back to back) of the given lengths and
/// `(lr_mult, decay_mult)`, weights set to `w`.
fn params(tensors: &[(usize, f32, f32)], w: &[f32]) -> Params {
    let mut p = Params::of_tensors(tensors, |_| 0);
    p.data.copy_from_slice(w);
    p
}

fn assert_close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-6 * w.abs().max(1.0);
        assert!(
            ((g as f64) - w).abs() <= tol,
            "element {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

/// Runs `steps` iterations from iteration 0, the diff set to `grads[k]` before step `k`.
fn run(solver: &mut Solver, p: &mut Params, grads: &[&[f32]]) {
    let cpu = Cpu::default();
    for (iter, g) in grads.iter().enumerate() {
        zero_grad(p);
        p.diff.copy_from_slice(g);
        solver.apply(&cpu, iter as u64, p);
    }
}

#[test]
fn sgd_with_momentum_three_steps() {
    let mut c = cfg(SolverType::Sgd);
    c.momentum = 0.9;
    let mut p = params(&[(2, 1.0, 1.0)], &[1.0, -2.0]);
    let mut s = Solver::new(&c, p.len());
    let g: &[f32] = &[0.5, 1.0];
    // v1 = 0.1·g = (0.05, 0.1);                w1 = (0.95, −2.1)
    run(&mut s, &mut p, &[g]);
    assert_close(&p.data, &[0.95, -2.1]);
    assert_close(&s.history()[0], &[0.05, 0.1]);
    // v2 = 0.9·v1 + 0.1·g = (0.095, 0.19);     w2 = (0.855, −2.29)
    // v3 = 0.9·v2 + 0.1·g = (0.1355, 0.271);   w3 = (0.7195, −2.561)
    let mut p = params(&[(2, 1.0, 1.0)], &[1.0, -2.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[g, g, g]);
    assert_close(&p.data, &[0.7195, -2.561]);
    assert_close(&s.history()[0], &[0.1355, 0.271]);
}

#[test]
fn nesterov_three_steps() {
    let mut c = cfg(SolverType::Nesterov);
    c.momentum = 0.9;
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    let g: &[f32] = &[0.5];
    // v1 = 0.05;   w1 = 1 − (1.9·0.05 − 0)               = 0.905
    run(&mut s, &mut p, &[g]);
    assert_close(&p.data, &[0.905]);
    // v2 = 0.095;  w2 = 0.905 − (1.9·0.095 − 0.9·0.05)    = 0.7695
    run(&mut s, &mut p, &[g]);
    assert_close(&p.data, &[0.7695]);
    // v3 = 0.1355; w3 = 0.7695 − (1.9·0.1355 − 0.9·0.095) = 0.59755
    run(&mut s, &mut p, &[g]);
    assert_close(&p.data, &[0.59755]);
    assert_close(&s.history()[0], &[0.1355]);
}

#[test]
fn adagrad_three_steps() {
    let mut c = cfg(SolverType::Adagrad);
    c.delta = 0.1;
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    // g = 2:  h = 4;  w = 1 − 0.1·2/(2 + 0.1)          = 0.904761904...
    run(&mut s, &mut p, &[&[2.0]]);
    assert_close(&p.data, &[0.904_761_904_761_904_8]);
    // g = 1:  h = 5;  w −= 0.1·1/(√5 + 0.1)            → 0.861954931...
    // g = −1: h = 6;  w −= 0.1·(−1)/(√6 + 0.1)         → 0.901178466...
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[2.0], &[1.0], &[-1.0]]);
    assert_close(&p.data, &[0.901_178_466_202_864_6]);
    assert_close(&s.history()[0], &[6.0]);
}

#[test]
fn rmsprop_three_steps() {
    let mut c = cfg(SolverType::Rmsprop);
    c.rms_decay = 0.9;
    c.delta = 0.1;
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    // g = 2:  h = 0.1·4 = 0.4;             w = 1 − 0.2/(√0.4 + 0.1)  = 0.726945881...
    run(&mut s, &mut p, &[&[2.0]]);
    assert_close(&p.data, &[0.726_945_881_008_371_3]);
    // g = 1:  h = 0.9·0.4 + 0.1 = 0.46;    w −= 0.1/(√0.46 + 0.1)    → 0.598449659...
    run(&mut s, &mut p, &[&[1.0]]);
    assert_close(&p.data, &[0.598_449_659_161_143_1]);
    // g = −1: h = 0.9·0.46 + 0.1 = 0.514;  w += 0.1/(√0.514 + 0.1)   → 0.720857979...
    run(&mut s, &mut p, &[&[-1.0]]);
    assert_close(&p.data, &[0.720_857_979_232_055_2]);
    assert_close(&s.history()[0], &[0.514]);
}

#[test]
fn adam_three_steps() {
    let mut c = cfg(SolverType::Adam);
    c.momentum = 0.9;
    c.momentum2 = 0.999;
    c.delta = 1e-8;
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    assert_eq!(s.history().len(), 2);
    assert_eq!(s.history_names(), ["m", "v"]);
    let cpu = Cpu::default();
    // t = 1, g = 2: m = 0.2, v = 0.004, correction = √0.001/0.1 = 0.316227766...
    //               w = 1 − 0.1·0.316227766·0.2/(√0.004 + 1e-8) = 0.900000016...
    p.diff.copy_from_slice(&[2.0]);
    s.apply(&cpu, 0, &mut p);
    assert_close(&p.data, &[0.900_000_015_811_385_7]);
    assert_close(&s.history()[0], &[0.2]);
    assert_close(&s.history()[1], &[0.004]);
    // t = 2, g = 1:  m = 0.28,  v = 0.004996,    correction = √(1 − 0.999²)/(1 − 0.9²)
    p.diff.copy_from_slice(&[1.0]);
    s.apply(&cpu, 1, &mut p);
    assert_close(&p.data, &[0.806_782_065_118_530_7]);
    // t = 3, g = −1: m = 0.152, v = 0.005991004, correction = √(1 − 0.999³)/(1 − 0.9³)
    p.diff.copy_from_slice(&[-1.0]);
    s.apply(&cpu, 2, &mut p);
    assert_close(&p.data, &[0.767_111_546_316_909_4]);
    assert_close(&s.history()[0], &[0.152]);
    assert_close(&s.history()[1], &[0.005_991_004]);
}

#[test]
fn lr_mult_and_decay_mult_apply_per_tensor() {
    let mut c = cfg(SolverType::Sgd);
    c.weight_decay = 0.1;
    // t0: lr_mult 1, decay_mult 1; t1: lr_mult 2, decay_mult 0; t2: lr_mult 0 (frozen).
    let mut p = params(
        &[(1, 1.0, 1.0), (1, 2.0, 0.0), (1, 0.0, 1.0)],
        &[1.0, 3.0, 5.0],
    );
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[0.5, 0.5, 0.5]]);
    // t0: g = 0.5 + 0.1·1 = 0.6; w = 1 − 0.1·0.6 = 0.94
    // t1: g = 0.5;               w = 3 − 0.2·0.5 = 2.9
    // t2: g = 0.5 + 0.1·5 = 1.0; w = 5 − 0·1.0   = 5
    assert_close(&p.diff, &[0.6, 0.5, 1.0]);
    assert_close(&p.data, &[0.94, 2.9, 5.0]);
}

#[test]
fn l1_adds_sign_l2_adds_weight() {
    let w = [2.0, -2.0, 0.0];
    let mut c = cfg(SolverType::Sgd);
    c.base_lr = 1.0;
    c.weight_decay = 0.5;

    let mut p = params(&[(3, 1.0, 1.0)], &w);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[0.0; 3]]);
    // L2: g = 0.5·w = (1, −1, 0)
    assert_close(&p.diff, &[1.0, -1.0, 0.0]);
    assert_close(&p.data, &[1.0, -1.0, 0.0]);

    c.regularization_type = Regularization::L1;
    let mut p = params(&[(3, 1.0, 1.0)], &w);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[0.0; 3]]);
    // L1: g = 0.5·sign(w) = (0.5, −0.5, 0); sign(0) = 0 leaves a zero weight at zero
    assert_close(&p.diff, &[0.5, -0.5, 0.0]);
    assert_close(&p.data, &[1.5, -1.5, 0.0]);
}

#[test]
fn clipping_scales_global_norm_to_exactly_clip() {
    let mut c = cfg(SolverType::Sgd);
    c.base_lr = 1.0;
    c.clip_gradients = 1.0;
    // The norm is over all tensors together: ‖(3, 4)‖ = 5, so each tensor is scaled by 1/5.
    let mut p = params(&[(1, 1.0, 1.0), (1, 1.0, 1.0)], &[0.0, 0.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[3.0, 4.0]]);
    assert_close(&p.diff, &[0.6, 0.8]);
    let norm = Cpu::default().sumsq(&p.diff).sqrt();
    assert!((norm - 1.0).abs() < 1e-6, "clipped norm {norm}");
    assert_close(&p.data, &[-0.6, -0.8]);

    // Below the threshold nothing changes.
    c.clip_gradients = 10.0;
    let mut p = params(&[(1, 1.0, 1.0), (1, 1.0, 1.0)], &[0.0, 0.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[3.0, 4.0]]);
    assert_eq!(p.diff, [3.0, 4.0]);
}

#[test]
fn clipping_applies_before_regularisation() {
    let mut c = cfg(SolverType::Sgd);
    c.base_lr = 1.0;
    c.clip_gradients = 1.0;
    c.weight_decay = 1.0;
    let mut p = params(&[(2, 1.0, 1.0)], &[1.0, 0.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[3.0, 4.0]]);
    // clip (3, 4) → (0.6, 0.8), then + 1·w = (1.6, 0.8)
    assert_close(&p.diff, &[1.6, 0.8]);
}

#[test]
fn iter_size_normalises_the_accumulated_gradient() {
    let mut c = cfg(SolverType::Sgd);
    c.base_lr = 1.0;
    c.iter_size = 4;
    let mut p = params(&[(2, 1.0, 1.0)], &[0.0, 0.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[4.0, 8.0]]);
    assert_close(&p.diff, &[1.0, 2.0]);
    assert_close(&p.data, &[-1.0, -2.0]);
}

#[test]
fn clip_threshold_applies_to_the_normalised_gradient() {
    let mut c = cfg(SolverType::Sgd);
    c.iter_size = 2;
    c.clip_gradients = 2.5;
    let mut p = params(&[(2, 1.0, 1.0)], &[0.0, 0.0]);
    let mut s = Solver::new(&c, p.len());
    // (6, 8) / 2 = (3, 4), norm 5 > 2.5 → (1.5, 2)
    run(&mut s, &mut p, &[&[6.0, 8.0]]);
    assert_close(&p.diff, &[1.5, 2.0]);
}

#[test]
fn apply_returns_and_uses_the_scheduled_rate() {
    let mut c = cfg(SolverType::Sgd);
    c.lr_policy = LrPolicy::Step;
    c.gamma = 0.5;
    c.stepsize = 10;
    let cpu = Cpu::default();
    let mut p = params(&[(1, 1.0, 1.0)], &[0.0]);
    let mut s = Solver::new(&c, p.len());
    p.diff[0] = 1.0;
    assert_eq!(s.apply(&cpu, 0, &mut p), 0.1);
    assert_close(&p.data, &[-0.1]);
    p.diff[0] = 1.0;
    assert_eq!(s.apply(&cpu, 10, &mut p), 0.05);
    assert_close(&p.data, &[-0.15]);
}

#[test]
fn apply_leaves_diff_and_zero_grad_clears_it() {
    let c = cfg(SolverType::Sgd);
    let mut p = params(&[(2, 1.0, 1.0)], &[0.0, 0.0]);
    let mut s = Solver::new(&c, p.len());
    p.diff.copy_from_slice(&[1.0, 2.0]);
    s.apply(&Cpu::default(), 0, &mut p);
    assert_eq!(p.diff, [1.0, 2.0]);
    zero_grad(&mut p);
    assert_eq!(p.diff, [0.0, 0.0]);
}

#[test]
fn restored_history_continues_the_run() {
    let mut c = cfg(SolverType::Sgd);
    c.momentum = 0.9;
    let g: &[f32] = &[0.5, 1.0];
    let mut p = params(&[(2, 1.0, 1.0)], &[1.0, -2.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[g]);

    let mut resumed = Solver::new(&c, p.len());
    assert_eq!(resumed.history_names(), ["momentum"]);
    resumed.history_mut()[0].copy_from_slice(&s.history()[0]);
    let mut q = p.clone();
    let cpu = Cpu::default();
    p.diff.copy_from_slice(g);
    q.diff.copy_from_slice(g);
    s.apply(&cpu, 1, &mut p);
    resumed.apply(&cpu, 1, &mut q);
    assert_eq!(p.data, q.data);
}

#[test]
#[should_panic(expected = "built for 3 parameters, got 2")]
fn wrong_parameter_count_panics() {
    let c = cfg(SolverType::Sgd);
    let mut p = params(&[(2, 1.0, 1.0)], &[0.0, 0.0]);
    let mut s = Solver::new(&c, 3);
    s.apply(&Cpu::default(), 0, &mut p);
}

#[test]
fn adadelta_two_steps_as_caffe() {
    let mut c = cfg(SolverType::Adadelta);
    c.momentum = 0.9;
    c.delta = 0.01;
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    assert_eq!(s.history_names(), ["h", "u"]);
    // h = 0.4;  s = 2·√0.01/√0.41;  u = 0.1·s²;  w = 1 − 0.1·s
    run(&mut s, &mut p, &[&[2.0]]);
    assert_close(&p.data, &[0.968_765_247_622_278_8]);
    assert_close(&s.history()[1], &[0.009_756_097_560_975_611]);
    // g = −1: h = 0.46;  s = −√(u + 0.01)/√0.47;  u = 0.9·u + 0.1·s²
    run(&mut s, &mut p, &[&[-1.0]]);
    assert_close(&p.data, &[0.989_267_503_627_347]);
    assert_close(&s.history()[0], &[0.46]);
    assert_close(&s.history()[1], &[0.012_983_912_817_851_585]);
}

#[test]
fn adamw_decays_the_weight_not_the_gradient() {
    let mut c = cfg(SolverType::Adamw);
    c.momentum = 0.9;
    c.momentum2 = 0.999;
    c.weight_decay = 0.5;
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    // m = 0.05, v = 0.00025; w = 1 − 0.1·0.5·1 − 0.1·√0.001/0.1·m/(√v + ε)
    run(&mut s, &mut p, &[&[0.5]]);
    assert_close(&p.data, &[0.850_000_063_245_513_1]);
    assert_close(&p.diff, &[0.5]);
    assert_close(&s.history()[0], &[0.05]);
    let mut p = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&c, p.len());
    run(&mut s, &mut p, &[&[0.5], &[0.5]]);
    assert_close(&p.data, &[0.707_500_104_815_762_3]);
    assert_close(&s.history()[1], &[0.000_499_75]);
    // Adam with the same decay puts it into the moments instead: another result.
    let mut adam = c.clone();
    adam.solver_type = SolverType::Adam;
    let mut q = params(&[(1, 1.0, 1.0)], &[1.0]);
    let mut s = Solver::new(&adam, q.len());
    run(&mut s, &mut q, &[&[0.5]]);
    assert_close(&q.diff, &[1.0]);
}
