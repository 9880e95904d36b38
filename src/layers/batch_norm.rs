//! `BatchNorm` (Caffe's, without the affine part: a `scale` layer with `bias_term = true`
//! follows, as in Caffe's ResNets). Bottom `(N, C, ...)`, top of the same shape; statistics per
//! channel `c` over the `m = N·H·W` values of the batch (`H·W` = product of the axes after C).
//!
//! State: three tensors in the flat parameters, Caffe's order — running mean `(C)`, running
//! variance `(C)`, moving-average factor `(1)` — all starting at 0. They are not learnable
//! (`has_state()`: the net fixes lr_mult = decay_mult = 0); `update_state` moves them after a
//! train forward with batch statistics:
//! `factor ← factor·maf + 1`, `mean_r ← mean_r·maf + mean`, `var_r ← var_r·maf + m/(m−1)·var`.
//!
//! - Batch statistics (train phase unless `use_global_stats = true`): `mean = Σx/m`,
//!   `var = Σx²/m − mean²` (biased), sums in f64; `y = (x − mean)/√(var + eps)`. Backward:
//!   `dx = (dy − mean(dy) − mean(dy·y)·y)/√(var + eps)`, means over the same m values.
//! - Global statistics (test phase unless `use_global_stats = false`): with `s = 1/factor`
//!   (0 when factor is 0), `y = (x − s·mean_r)/√(s·var_r + eps)`; backward `dx = dy/√(var + eps)`.
//! - `sync = true`: in train passes the per-channel sums `(Σx, Σx², m)` of forward and
//!   `(Σdy, Σdy·y, m)` of backward are summed over every replica of the job through
//!   `Ctx::reducer` (rank-ordered, identical on every replica), so that N replicas × batch b
//!   normalise exactly as 1 replica × batch N·b and every replica's running statistics agree.
//!   Without `sync` (or with one replica) the statistics are the replica's own batch's; the
//!   running averages then differ between replicas, and snapshots save universal rank 0's.

use crate::config::layer_params::BatchNormParams;
use crate::config::{FillerConfig, Phase};
use crate::error::{Error, Result};
use crate::layers::{one_bottom, BackwardPass, CpuLayer, Ctx, ForwardPass, Layer, Reducer};
use crate::params::ParamSpec;

cpu_layer! {
    /// Batch normalisation; see the module docs.
    pub type BatchNorm = CpuLayer<BatchNormParams, Statistics>;
}

/// The statistics BatchNorm keeps between its passes.
#[derive(Debug, Clone, Default)]
pub struct Statistics {
    channels: usize,
    /// Product of the axes after C.
    spatial: usize,
    /// Mean and variance `(C)` of the last forward (batch or global).
    mean: Vec<f32>,
    var: Vec<f32>,
    /// `1/√(var + eps)` `(C)`.
    inv_std: Vec<f32>,
    /// Number of values the last batch statistics were taken over (all replicas with sync).
    count: f64,
    /// Whether the last forward took batch statistics in a train pass (state update pending).
    pending: bool,
    /// Per-channel sums `(2C + 1)`: two sums per channel, then the count.
    sums: Vec<f64>,
}

impl BatchNorm {
    fn global_stats(&self, ctx: &Ctx) -> bool {
        self.settings
            .use_global_stats
            .unwrap_or(ctx.phase == Phase::Test)
    }

    /// The pass's sums over every replica, when `sync` is on.
    fn reducer<'c>(&self, ctx: &Ctx<'c>) -> Option<&'c dyn Reducer> {
        ctx.reducer.filter(|_| self.settings.sync)
    }
}

impl Statistics {
    /// Per-channel `(Σa, Σa·b)` over the batch into `sums`, with the count last; summed over
    /// every replica by `reducer` when there is one.
    fn channel_sums(&mut self, reducer: Option<&dyn Reducer>, a: &[f32], b: &[f32]) {
        let (c, hw) = (self.channels, self.spatial);
        self.sums.fill(0.0);
        let (s1, rest) = self.sums.split_at_mut(c);
        let (s2, m) = rest.split_at_mut(c);
        for (i, (av, bv)) in a.chunks_exact(hw).zip(b.chunks_exact(hw)).enumerate() {
            let ch = i % c;
            let (mut p, mut q) = (0.0f64, 0.0f64);
            for (&x, &y) in av.iter().zip(bv) {
                p += x as f64;
                q += x as f64 * y as f64;
            }
            s1[ch] += p;
            s2[ch] += q;
        }
        m[0] = (a.len() / c) as f64;
        if let Some(r) = reducer {
            r.sum_f64(&mut self.sums);
        }
    }
}

impl Layer for BatchNorm {
    fn type_name(&self) -> &'static str {
        "batch_norm"
    }

    /// One bottom `(N, C, ...)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = match one_bottom(&self.name, bottoms)? {
            s if s.len() >= 2 && s[1] > 0 => s.to_vec(),
            s => {
                return Err(Error::net(
                    &self.name,
                    format!("needs a bottom (N, C, ...) with C ≥ 1, got {s:?}"),
                ))
            }
        };
        let (c, st) = (shape[1], &mut self.state);
        if st.channels != 0 && st.channels != c {
            return Err(Error::net(
                &self.name,
                format!("the channel count changed from {} to {c}", st.channels),
            ));
        }
        st.channels = c;
        st.spatial = shape[2..].iter().product();
        for v in [&mut st.mean, &mut st.var, &mut st.inv_std] {
            v.resize(c, 0.0);
        }
        st.sums.resize(2 * c + 1, 0.0);
        Ok(vec![shape])
    }

    /// Running mean `(C)`, running variance `(C)`, moving-average factor `(1)`; all 0 at start.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let zero = FillerConfig::constant(0.0);
        let spec = |name: &str, n: usize| ParamSpec::new(name, vec![n], &zero);
        let c = self.state.channels;
        vec![spec("mean", c), spec("variance", c), spec("factor", 1)]
    }

    fn has_state(&self) -> bool {
        true
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let (ctx, params) = (pass.ctx, pass.params);
        let (global, reducer) = (self.global_stats(ctx), self.reducer(ctx));
        let (eps, st) = (self.settings.eps, &mut self.state);
        let c = st.channels;
        let x = &pass.bottoms[0].data;
        st.pending = false;
        if global {
            let factor = params[2][0];
            let s = if factor == 0.0 { 0.0 } else { 1.0 / factor };
            for (m, &r) in st.mean.iter_mut().zip(params[0]) {
                *m = r * s;
            }
            for (v, &r) in st.var.iter_mut().zip(params[1]) {
                *v = r * s;
            }
        } else {
            st.channel_sums(reducer, x, x);
            let m = st.sums[2 * c];
            st.count = m;
            for ch in 0..c {
                let mean = st.sums[ch] / m;
                let var = (st.sums[c + ch] / m - mean * mean).max(0.0);
                st.mean[ch] = mean as f32;
                st.var[ch] = var as f32;
            }
            st.pending = ctx.phase == Phase::Train;
        }
        for ch in 0..c {
            st.inv_std[ch] = 1.0 / (st.var[ch] + eps).sqrt();
        }
        let hw = st.spatial;
        for (i, (ys, xs)) in pass.tops[0]
            .data
            .chunks_exact_mut(hw)
            .zip(x.chunks_exact(hw))
            .enumerate()
        {
            let (mean, inv) = (st.mean[i % c], st.inv_std[i % c]);
            for (y, &x) in ys.iter_mut().zip(xs) {
                *y = (x - mean) * inv;
            }
        }
    }

    /// Batch statistics: `dx += (dy − mean(dy) − mean(dy·y)·y)/√(var + eps)`; global:
    /// `dx += dy/√(var + eps)`. The state tensors get no gradient.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let ctx = pass.ctx;
        let Some((top, bottom)) = pass.top_and_bottom() else {
            return;
        };
        let (global, reducer) = (self.global_stats(ctx), self.reducer(ctx));
        let st = &mut self.state;
        let (c, hw) = (st.channels, st.spatial);
        let (y, dy, dx) = (&top.data, &top.diff, &mut bottom.diff);
        if global {
            for (i, (dxs, dys)) in dx.chunks_exact_mut(hw).zip(dy.chunks_exact(hw)).enumerate() {
                let inv = st.inv_std[i % c];
                for (d, &g) in dxs.iter_mut().zip(dys) {
                    *d += g * inv;
                }
            }
            return;
        }
        st.channel_sums(reducer, dy, y);
        let m = st.sums[2 * c];
        for (i, ((dxs, dys), ys)) in dx
            .chunks_exact_mut(hw)
            .zip(dy.chunks_exact(hw))
            .zip(y.chunks_exact(hw))
            .enumerate()
        {
            let ch = i % c;
            let mean_dy = (st.sums[ch] / m) as f32;
            let mean_dyy = (st.sums[c + ch] / m) as f32;
            let inv = st.inv_std[ch];
            for ((d, &g), &y) in dxs.iter_mut().zip(dys).zip(ys) {
                *d += (g - mean_dy - mean_dyy * y) * inv;
            }
        }
    }

    /// After a train forward with batch statistics: Caffe's moving averages (module docs).
    fn update_state(&mut self, _ctx: &Ctx, state: &mut [&mut [f32]]) {
        let (maf, st) = (self.settings.moving_average_fraction, &mut self.state);
        if !std::mem::take(&mut st.pending) {
            return;
        }
        let m = st.count;
        let correction = if m > 1.0 { (m / (m - 1.0)) as f32 } else { 1.0 };
        let [mean_r, var_r, factor] = state else {
            unreachable!("batch_norm has three state tensors")
        };
        factor[0] = factor[0] * maf + 1.0;
        for ch in 0..st.channels {
            mean_r[ch] = mean_r[ch] * maf + st.mean[ch];
            var_r[ch] = var_r[ch] * maf + correction * st.var[ch];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::dist::local::LocalGroup;
    use crate::dist::CpuComm;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{forward_in, layer};
    use crate::parallel::reducer::CommReducer;
    use crate::tensor::Blob;
    use std::sync::Arc;

    fn bn(keys: &str) -> BatchNorm {
        layer::<BatchNormParams>("batch_norm", keys)
    }

    fn ctx<'a>(
        cpu: &'a Cpu,
        phase: Phase,
        reducer: Option<&'a dyn crate::layers::Reducer>,
    ) -> Ctx<'a> {
        Ctx {
            reducer,
            ..crate::layers::test_util::ctx(cpu, phase)
        }
    }

    /// Forward then `update_state`; returns the top.
    fn step(layer: &mut BatchNorm, c: &Ctx, x: &Blob, state: &mut [Vec<f32>]) -> Blob {
        let params: Vec<&[f32]> = state.iter().map(|s| s.as_slice()).collect();
        let top = forward_in(c, layer, std::slice::from_ref(x), &params).remove(0);
        let mut views: Vec<&mut [f32]> = state.iter_mut().map(|s| s.as_mut_slice()).collect();
        layer.update_state(c, &mut views);
        top
    }

    /// Per-channel (mean, biased variance) of `x` `(N, C, HW)` computed directly, in f64.
    fn stats(x: &Blob) -> Vec<(f64, f64)> {
        let (n, c) = (x.shape[0], x.shape[1]);
        let hw = x.count() / (n * c);
        (0..c)
            .map(|ch| {
                let v: Vec<f64> = (0..n)
                    .flat_map(|i| x.data[(i * c + ch) * hw..(i * c + ch + 1) * hw].to_vec())
                    .map(|v| v as f64)
                    .collect();
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / v.len() as f64;
                (mean, var)
            })
            .collect()
    }

    /// Train forward normalises each channel to mean 0 and variance var/(var+eps).
    #[test]
    fn train_forward_normalises_each_channel() {
        let cpu = Cpu::new(1);
        let mut layer = bn("");
        let x = uniform_blob(&[4, 3, 5, 2], -2.0, 3.0, 9);
        let mut state = vec![vec![0.0; 3], vec![0.0; 3], vec![0.0]];
        let y = step(&mut layer, &ctx(&cpu, Phase::Train, None), &x, &mut state);
        for ((mean, var), (xm, xv)) in stats(&y).into_iter().zip(stats(&x)) {
            assert!(mean.abs() < 1e-6, "mean {mean}");
            assert!((var - xv / (xv + 1e-5)).abs() < 1e-5, "var {var}");
            assert!(xm.abs() > 0.0);
        }
    }

    /// Two train steps move the state exactly as Caffe's formula says; a test pass and a train
    /// pass with use_global_stats leave it alone.
    #[test]
    fn running_averages_follow_the_formula() {
        let cpu = Cpu::new(1);
        let maf = 0.9f32;
        let mut layer = bn(&format!("moving_average_fraction = {maf}"));
        let mut state = vec![vec![0.0; 2], vec![0.0; 2], vec![0.0]];
        let mut expect = [vec![0.0f32; 2], vec![0.0f32; 2], vec![0.0f32]];
        for seed in [1, 2] {
            let x = uniform_blob(&[3, 2, 4], -1.0, 2.0, seed);
            step(&mut layer, &ctx(&cpu, Phase::Train, None), &x, &mut state);
            let m = 12.0f32;
            expect[2][0] = expect[2][0] * maf + 1.0;
            for (ch, (mean, var)) in stats(&x).into_iter().enumerate() {
                expect[0][ch] = expect[0][ch] * maf + mean as f32;
                expect[1][ch] = expect[1][ch] * maf + m / (m - 1.0) * var as f32;
            }
            for (got, want) in state.iter().zip(&expect) {
                for (g, w) in got.iter().zip(want) {
                    assert!((g - w).abs() < 1e-5, "{state:?} vs {expect:?}");
                }
            }
        }
        assert_eq!(state[2][0], 0.9 + 1.0);
        let before = state.clone();
        let x = uniform_blob(&[3, 2, 4], -1.0, 2.0, 3);
        step(&mut layer, &ctx(&cpu, Phase::Test, None), &x, &mut state);
        let mut global = bn("use_global_stats = true");
        step(&mut global, &ctx(&cpu, Phase::Train, None), &x, &mut state);
        assert_eq!(state, before);
        // A test pass with use_global_stats = false uses batch statistics but still does not
        // move the state.
        let mut batch_in_test = bn("use_global_stats = false");
        step(
            &mut batch_in_test,
            &ctx(&cpu, Phase::Test, None),
            &x,
            &mut state,
        );
        assert_eq!(state, before);
    }

    /// The test phase normalises with the running statistics divided by the factor; a zero
    /// factor means mean 0 and variance 0.
    #[test]
    fn test_phase_uses_the_scaled_running_statistics() {
        let cpu = Cpu::new(1);
        let mut layer = bn("eps = 0.001");
        let x = uniform_blob(&[2, 2, 3], -1.0, 2.0, 4);
        let mut state = vec![vec![0.5, -1.0], vec![2.0, 0.5], vec![2.0]];
        let y = step(&mut layer, &ctx(&cpu, Phase::Test, None), &x, &mut state);
        for (i, (&y, &x)) in y.data.iter().zip(&x.data).enumerate() {
            let ch = (i / 3) % 2;
            let (mean, var) = (state[0][ch] / 2.0, state[1][ch] / 2.0);
            let want = (x - mean) / (var + 0.001f32).sqrt();
            assert!((y - want).abs() < 1e-5, "{y} vs {want}");
        }
        let mut zero = vec![vec![0.5, -1.0], vec![2.0, 0.5], vec![0.0]];
        let y = step(&mut layer, &ctx(&cpu, Phase::Test, None), &x, &mut zero);
        for (&y, &x) in y.data.iter().zip(&x.data) {
            assert!((y - x / 0.001f32.sqrt()).abs() < 1e-3 * y.abs().max(1.0));
        }
    }

    /// Batch statistics: the gradient includes the terms through the mean and the variance.
    #[test]
    fn gradient_check_with_batch_statistics() {
        for shape in [&[3, 2, 3, 2][..], &[5, 4]] {
            let mut layer = bn("eps = 0.001");
            let x = uniform_blob(shape, -1.0, 1.0, 11);
            let checker = GradientChecker {
                step: 1e-3,
                threshold: 2e-3,
                ..Default::default()
            };
            let r = checker.assert_passes(&mut layer, &[x], &[true]);
            assert!(r.checked > 0);
        }
    }

    #[test]
    fn gradient_check_with_global_statistics() {
        let mut layer = bn("use_global_stats = true");
        let x = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 12);
        let state = vec![vec![0.3, -0.2, 0.1], vec![1.5, 0.4, 2.0], vec![1.5]];
        GradientChecker::default()
            .check_with_params(&mut layer, &[x], state, &[true])
            .unwrap()
            .assert_ok();
    }

    /// Two replicas with sync, each on half the batch, give the single-replica full-batch top,
    /// bottom gradient and running statistics; without sync they do not.
    #[test]
    fn sync_over_two_replicas_equals_one_replica_with_the_whole_batch() {
        let x = uniform_blob(&[4, 3, 2, 2], -1.0, 2.0, 13);
        let dy = uniform_blob(&[4, 3, 2, 2], -1.0, 1.0, 14).data;
        let run = |layer: &mut BatchNorm, c: &Ctx, x: &Blob, dy: &[f32]| {
            let mut state = vec![vec![0.0; 3], vec![0.0; 3], vec![0.0]];
            let mut top = step(layer, c, x, &mut state);
            top.diff.copy_from_slice(dy);
            let mut bottom = vec![x.clone()];
            bottom[0].diff.fill(0.0);
            layer.backward(BackwardPass {
                ctx: c,
                tops: &[top.clone()],
                propagate_down: &[true],
                bottoms: &mut bottom,
                params: &[],
                param_diffs: &mut [],
            });
            (top.data, bottom.pop().unwrap().diff, state)
        };
        let cpu = Cpu::new(1);
        let whole = run(&mut bn(""), &ctx(&cpu, Phase::Train, None), &x, &dy);
        for sync in [true, false] {
            let group = Arc::new(LocalGroup::new(2));
            let halves: Vec<_> = (0..2)
                .map(|r| {
                    let g = group.clone();
                    let mut part = Blob::new(&[2, 3, 2, 2]);
                    part.data.copy_from_slice(&x.data[r * 24..(r + 1) * 24]);
                    let dy = dy[r * 24..(r + 1) * 24].to_vec();
                    std::thread::spawn(move || {
                        let mut comm = CpuComm::new(g, r, 0, 1, None);
                        let mut scratch = Vec::new();
                        let red = CommReducer::new(&mut comm, &mut scratch);
                        let cpu = Cpu::new(1);
                        let mut layer = bn(&format!("sync = {sync}"));
                        let out = run(&mut layer, &ctx(&cpu, Phase::Train, Some(&red)), &part, &dy);
                        red.finish().unwrap();
                        out
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| (p - q).abs() < 1e-5);
            let top: Vec<f32> = [halves[0].0.clone(), halves[1].0.clone()].concat();
            let dx: Vec<f32> = [halves[0].1.clone(), halves[1].1.clone()].concat();
            let same = close(&top, &whole.0)
                && close(&dx, &whole.1)
                && (0..3).all(|k| close(&halves[0].2[k], &whole.2[k]))
                && halves[0].2 == halves[1].2;
            assert_eq!(same, sync, "sync = {sync}");
        }
    }

    /// Through the net: the state tensors get lr_mult = decay_mult = 0, a train forward moves
    /// them, backward leaves their gradient at zero, and no update rule (with momentum history
    /// and weight decay) changes them.
    mod in_the_net {
        use crate::backend::Cpu;
        use crate::config::{Phase, SolverType};
        use crate::layers::test_util::{in_place, net_around};
        use crate::layers::Ctx;
        use crate::net::Net;
        use crate::solver::Solver;
        use crate::validate::load_str;
        use std::path::Path;

        #[test]
        fn state_is_moved_by_forward_only() {
            let middle = [
                in_place("bn", "batch_norm", "moving_average_fraction = 0.5"),
                in_place("drop", "dropout", ""),
            ];
            let text = net_around(&middle.concat());
            let (mut cfg, _) = load_str("t.toml", &text, Path::new("."), &[]).unwrap();
            // Momentum history and weight decay, which must not move the state either.
            cfg.solver.momentum = 0.9;
            cfg.solver.weight_decay = 0.01;
            for kind in [
                SolverType::Sgd,
                SolverType::Nesterov,
                SolverType::Adam,
                SolverType::Rmsprop,
            ] {
                cfg.solver.solver_type = kind;
                let (mut net, mut params) = Net::build(&cfg, [1, 8, 8], 4).unwrap();
                Net::init_params(&mut params, 3);
                let names: Vec<_> = params.spans.iter().map(|s| s.full_name.as_str()).collect();
                assert_eq!(
                    names,
                    [
                        "ip.weight",
                        "ip.bias",
                        "bn.mean",
                        "bn.variance",
                        "bn.factor"
                    ]
                );
                let state = params.spans[2].offset..params.spans[4].range().end;
                for s in &params.spans[2..] {
                    assert_eq!((s.lr_mult, s.decay_mult), (0.0, 0.0), "{}", s.full_name);
                }
                assert!(params.data[state.clone()].iter().all(|&v| v == 0.0));
                let cpu = Cpu::new(1);
                let ctx = Ctx {
                    seed: 3,
                    ..crate::layers::test_util::ctx(&cpu, Phase::Train)
                };
                let (d, l) = net.inputs_mut();
                d.iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = (i % 7) as f32 / 7.0);
                l.copy_from_slice(&[0.0, 3.0, 5.0, 9.0]);
                let mut solver = Solver::new(&cfg.solver, params.len());
                let mut last = params.data[state.clone()].to_vec();
                for iter in 0..3 {
                    params.diff.fill(0.0);
                    net.forward(&ctx, &mut params);
                    let moved = params.data[state.clone()].to_vec();
                    assert_ne!(moved, last, "the forward moves the state");
                    assert_eq!(moved[20], [1.0, 1.5, 1.75][iter], "factor");
                    net.backward(&ctx, &mut params, &mut |_| {});
                    assert!(params.diff[state.clone()].iter().all(|&g| g == 0.0));
                    assert!(params.diff[..state.start].iter().any(|&g| g != 0.0));
                    let w0 = params.data[..state.start].to_vec();
                    solver.apply(&cpu, iter as u64, &mut params);
                    assert_eq!(
                        params.data[state.clone()],
                        moved[..],
                        "{kind:?} moved the state"
                    );
                    assert_ne!(
                        params.data[..state.start],
                        w0[..],
                        "the weights are learned"
                    );
                    last = moved;
                }
                // A test pass uses the running statistics and leaves them alone.
                let test = Ctx {
                    phase: Phase::Test,
                    ..ctx
                };
                net.forward(&test, &mut params);
                assert_eq!(params.data[state.clone()], last[..]);
            }
        }
    }

    /// Validation of the Dropout and BatchNorm keys, through the config loader.
    mod config_checks {
        use crate::layers::test_util::{in_place, net_around};
        use crate::validate::load_str;
        use std::path::Path;

        /// The config text of a net with the layer `x` of type `kind` and the keys `keys`
        /// between the inner product and the loss.
        fn text(kind: &str, keys: &str) -> String {
            net_around(&in_place("x", kind, keys))
        }

        /// The result of loading [`text`].
        fn load(kind: &str, keys: &str) -> crate::error::Result<crate::config::Config> {
            load_str("t.toml", &text(kind, keys), Path::new("."), &[]).map(|(cfg, _)| cfg)
        }

        #[test]
        fn valid_layers_pass() {
            for (kind, keys) in [
                ("dropout", ""),
                ("dropout", "dropout_ratio = 0.0"),
                ("batch_norm", ""),
                (
                    "batch_norm",
                    "moving_average_fraction = 1.0\neps = 1e-3\nsync = true",
                ),
                ("batch_norm", "use_global_stats = true"),
            ] {
                load(kind, keys).unwrap_or_else(|e| panic!("{kind} {keys:?}: {e}"));
            }
        }

        /// The error names the file, line and column of the key.
        #[test]
        fn an_error_names_the_position_of_the_key() {
            let line = 1 + text("dropout", "dropout_ratio = 1.0")
                .lines()
                .position(|l| l.starts_with("dropout_ratio"))
                .unwrap();
            let e = load("dropout", "dropout_ratio = 1.0")
                .unwrap_err()
                .to_string();
            let want = format!("t.toml:{line}:1: `layer[1].dropout_ratio`");
            assert!(e.starts_with(&want), "{e:?} does not start with {want:?}");
        }

        #[test]
        fn out_of_range_values_name_the_key() {
            for (kind, keys, want) in [
                ("dropout", "dropout_ratio = 1.0", "`layer[1].dropout_ratio`: must lie in [0, 1), got 1"),
                ("dropout", "dropout_ratio = -0.1", "`layer[1].dropout_ratio`: must lie in [0, 1)"),
                ("batch_norm", "moving_average_fraction = 0.0", "`layer[1].moving_average_fraction`: must lie in (0, 1], got 0"),
                ("batch_norm", "moving_average_fraction = 1.5", "must lie in (0, 1], got 1.5"),
                ("batch_norm", "eps = 0.0", "`layer[1].eps`: must be a finite number > 0, got 0"),
                ("batch_norm", "lr_mult = [0, 0, 0]", "`layer[1].lr_mult`: `lr_mult` does not apply to batch_norm: its tensors (running mean, variance, factor) are statistics"),
                ("batch_norm", "decay_mult = [0]", "`layer[1].decay_mult`: `decay_mult` does not apply to batch_norm"),
                ("dropout", "eps = 0.1", "`layer[1].eps`: `eps` does not apply to a layer of type dropout"),
            ] {
                let e = load(kind, keys).err().unwrap_or_else(|| panic!("{kind} {keys:?} was accepted"));
                assert_eq!(e.exit_code(), 2);
                let e = e.to_string();
                assert!(e.contains(want), "{kind} {keys:?}: {e:?} lacks {want:?}");
            }
        }
    }
}
