//! `CpuEngine`: a replica on the CPU backend — the `Net` with its flat `Params`, the `Solver`,
//! and a `CpuComm` (and, for local SGD's node scope, a second one over its node) — behind the
//! `Engine` seam. The gradient all-reduce runs in the type of `cluster.reduce_dtype` (FP32, or
//! the bfloat16 wire of `crate::dist::wire`). Local SGD's outer state (anchor and momentum, Nesterov only) lives here as
//! host vectors; the formulas are `super::local_sgd`'s.

use super::engine::Engine;
use super::local_sgd::{self, GradientScope, Outer, OuterRun};
use super::reducer::CommReducer;
use crate::backend::Cpu;
use crate::config::{Config, NonFiniteMode, Phase, ReduceDtype};
use crate::data::Normalize;
use crate::dist::{Communicator, CpuComm};
use crate::error::{Error, Result};
use crate::layers::Ctx;
use crate::net::{weighted_loss, Net, Output, PassCtx};
use crate::params::Params;
use crate::solver::loss_scale::{LossScaleState, LossScaler, Verdict};
use crate::solver::non_finite::{self, NonFiniteSteps};
use crate::solver::{learning_rate, Solver};
use crate::spans::{Name, SpanLog, Track};
use std::time::Instant;

/// One CPU replica.
pub struct CpuEngine {
    cpu: Cpu,
    net: Net,
    params: Params,
    solver: Solver,
    comm: CpuComm,
    /// The element type gradients are all-reduced in (`cluster.reduce_dtype`).
    wire: ReduceDtype,
    seed: u64,
    /// One slot per iteration of the `average_loss` window: the sum of its sub-batch losses.
    loss_slots: Vec<f64>,
    iter_size: u64,
    /// Per-layer spans, while a timeline records them.
    spans: Option<SpanLog>,
    /// Scratch of the cross-replica statistics (sync BatchNorm), reused between passes.
    reduce_scratch: Vec<f64>,
    /// The loss slot and the iteration of the current step.
    slot: usize,
    iter: u64,
    /// `[solver] non_finite`.
    non_finite_mode: NonFiniteMode,
    /// The steps refused so far.
    non_finite: NonFiniteSteps,
    /// Loss scaling (`cluster.loss_scale`; dynamic by default with `math = "fp16"`).
    scaler: LossScaler,
    /// Local SGD: the communicator over this replica's node (`sync_scope = "node"`).
    node_comm: Option<CpuComm>,
    /// Which replicas average the current iteration's gradient.
    scope: GradientScope,
    /// Local SGD's outer rule, its coefficients per stretch of the parameters (Nesterov), and
    /// its state `(n)` each: the anchor and the momentum (empty for the plain average).
    outer: Outer,
    outer_runs: Vec<OuterRun>,
    anchor: Vec<f32>,
    outer_momentum: Vec<f32>,
    /// This replica's own parameters while the mean is held in their place.
    own: Vec<f32>,
}

impl CpuEngine {
    /// Builds the replica's net for `record_shape` (C, H, W), starting from `initial`.
    pub fn new(
        cfg: &Config,
        record_shape: [usize; 3],
        comm: CpuComm,
        cpu: Cpu,
        initial: &Params,
    ) -> Result<Self> {
        let (net, mut params) = Net::build(cfg, record_shape, cfg.data.batch_size)?;
        params.data.copy_from_slice(&initial.data);
        let outer = Outer::of(&cfg.cluster);
        let outer_runs = match outer {
            Outer::Nesterov { lr, momentum } => {
                local_sgd::outer_runs(&params.spans, params.len(), lr, momentum)
            }
            Outer::Average => Vec::new(),
        };
        let outer_len = if outer_runs.is_empty() {
            0
        } else {
            params.len()
        };
        Ok(CpuEngine {
            cpu,
            net,
            solver: Solver::new(&cfg.solver, params.len()),
            params,
            comm,
            wire: cfg.cluster.reduce_dtype,
            seed: cfg.solver.random_seed,
            loss_slots: vec![0.0; cfg.solver.average_loss as usize],
            iter_size: cfg.solver.iter_size,
            spans: None,
            reduce_scratch: Vec::new(),
            slot: 0,
            iter: 0,
            non_finite_mode: cfg.solver.non_finite,
            non_finite: NonFiniteSteps::default(),
            scaler: LossScaler::new(&cfg.cluster),
            node_comm: None,
            scope: GradientScope::All,
            outer,
            outer_runs,
            anchor: vec![0.0; outer_len],
            outer_momentum: vec![0.0; outer_len],
            own: Vec::new(),
        })
    }

    /// Adds the communicator over this replica's node (local SGD's `sync_scope = "node"`).
    pub fn with_node_comm(mut self, node_comm: Option<CpuComm>) -> Self {
        self.node_comm = node_comm;
        self
    }
}

/// The layers' context of a pass; `reducer` only for train passes of a multi-replica job.
fn layer_ctx<'a>(
    cpu: &'a Cpu,
    seed: u64,
    c: PassCtx,
    reducer: Option<&'a dyn crate::layers::Reducer>,
) -> Ctx<'a> {
    Ctx {
        cpu,
        phase: c.phase,
        iter: c.iter,
        seed,
        first_sample: c.first_sample,
        reducer,
    }
}

impl Engine for CpuEngine {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn param_count(&self) -> usize {
        self.params.len()
    }

    fn broadcast_params(&mut self) -> Result<()> {
        self.comm.broadcast(&mut self.params.data, 0)?;
        // The outer rule starts from the parameters every replica starts from.
        if !self.anchor.is_empty() {
            self.anchor.copy_from_slice(&self.params.data);
        }
        Ok(())
    }

    fn set_batch(&mut self, n: usize) -> Result<()> {
        self.net.set_batch(n)
    }

    fn load_batch(&mut self, data: &[f32], labels: &[f32]) -> Result<()> {
        let (d, l) = self.net.inputs_mut();
        d.copy_from_slice(data);
        l.copy_from_slice(labels);
        Ok(())
    }

    fn load_batch_u8(
        &mut self,
        pixels: &[u8],
        normalize: &Normalize,
        labels: &[f32],
    ) -> Result<()> {
        let (d, l) = self.net.inputs_mut();
        normalize.apply(pixels, d);
        l.copy_from_slice(labels);
        Ok(())
    }

    fn zero_grad(&mut self) -> Result<()> {
        crate::solver::zero_grad(&mut self.params);
        Ok(())
    }

    fn forward_train(&mut self, c: PassCtx, slot: usize, first: bool) -> Result<()> {
        debug_assert_eq!(c.phase, Phase::Train);
        let multi = self.comm.size() > 1;
        let reducer = CommReducer::new(&mut self.comm, &mut self.reduce_scratch);
        let ctx = layer_ctx(&self.cpu, self.seed, c, multi.then_some(&reducer as _));
        let outputs = forward(&mut self.net, &ctx, &mut self.params, &mut self.spans);
        reducer.finish()?;
        let loss = weighted_loss(&outputs);
        (self.slot, self.iter) = (slot, c.iter);
        let s = &mut self.loss_slots[slot];
        *s = if first { loss } else { *s + loss };
        Ok(())
    }

    fn backward(&mut self, c: PassCtx) -> Result<()> {
        let multi = self.comm.size() > 1;
        let reducer = CommReducer::new(&mut self.comm, &mut self.reduce_scratch);
        let ctx = layer_ctx(&self.cpu, self.seed, c, multi.then_some(&reducer as _));
        self.net.set_loss_scale(self.scaler.scale());
        match &mut self.spans {
            None => self.net.backward(&ctx, &mut self.params, &mut |_| {}),
            Some(log) => self.net.backward_traced(
                &ctx,
                &mut self.params,
                &mut |_| {},
                Some(&mut |i, start, end| {
                    log.push(Name::Backward(i as u32), Track::Host, start, end, c.iter)
                }),
            ),
        }
        reducer.finish()?;
        Ok(())
    }

    fn forward_test(&mut self, c: PassCtx) -> Result<Vec<Output>> {
        // Test passes never communicate: replicas may run different numbers of test batches.
        let ctx = layer_ctx(&self.cpu, self.seed, c, None);
        Ok(forward(
            &mut self.net,
            &ctx,
            &mut self.params,
            &mut self.spans,
        ))
    }

    fn forward_blob(&mut self, c: PassCtx, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let b = self
            .net
            .blob_named(name)
            .ok_or_else(|| crate::error::Error::net(name, "no layer writes a blob of this name"))?;
        self.forward_test(c)?;
        let shape = self.net.blob_shape(b).to_vec();
        let n = shape.iter().product();
        Ok((shape, self.net.blob_data(b)[..n].to_vec()))
    }

    fn all_reduce_gradients(&mut self) -> Result<()> {
        // A non-finite loss reaches every replica through the averaged gradient.
        if !self.loss_slots[self.slot].is_finite() {
            if let Some(g) = self.params.diff.first_mut() {
                *g = f32::NAN;
            }
        }
        let comm = match self.scope {
            GradientScope::All => &mut self.comm,
            GradientScope::Node => match &mut self.node_comm {
                Some(c) => c,
                None => return Ok(()),
            },
            GradientScope::Own => return Ok(()),
        };
        if comm.size() == 1 {
            // The average over one replica is its own gradient (nothing on the wire).
            return Ok(());
        }
        let (diff, start) = (&mut self.params.diff, Instant::now());
        match self.wire {
            ReduceDtype::Fp32 => comm.all_reduce_avg(diff)?,
            ReduceDtype::Bf16 => comm.all_reduce_avg_bf16(diff)?,
        }
        // The whole gradient is one bucket here (the CPU has no backward to overlap it with).
        if let Some(log) = &mut self.spans {
            let bytes = (diff.len() * self.wire.bytes()) as u64;
            let name = Name::Bucket { index: 0, bytes };
            log.push(name, Track::Host, start, Instant::now(), self.iter);
        }
        Ok(())
    }

    fn set_gradient_scope(&mut self, scope: GradientScope) {
        self.scope = scope;
    }

    fn average_params(&mut self) -> Result<()> {
        let alone = self.comm.size() == 1;
        if self.outer == Outer::Average {
            return match alone {
                true => Ok(()),
                false => self.comm.all_reduce_avg(&mut self.params.data),
            };
        }
        // The gradient buffer is free after the update: it holds the delta.
        let (data, delta) = (&self.params.data, &mut self.params.diff);
        local_sgd::delta_from_anchor(&self.anchor, data, delta);
        if !alone {
            self.comm.all_reduce_avg(delta)?;
        }
        for run in &self.outer_runs {
            let r = run.range.clone();
            local_sgd::nesterov_step(
                run.lr,
                run.momentum,
                &delta[r.clone()],
                &mut self.outer_momentum[r.clone()],
                &mut self.anchor[r],
            );
        }
        self.params.data.copy_from_slice(&self.anchor);
        Ok(())
    }

    fn hold_mean_params(&mut self, on: bool) -> Result<()> {
        if !on {
            self.params.data.copy_from_slice(&self.own);
            return Ok(());
        }
        self.own.clear();
        self.own.extend_from_slice(&self.params.data);
        match self.comm.size() {
            1 => Ok(()),
            _ => self.comm.all_reduce_avg(&mut self.params.data),
        }
    }

    fn outer_state(&mut self) -> Result<Vec<Vec<f32>>> {
        Ok(match self.anchor.is_empty() {
            true => Vec::new(),
            false => vec![self.anchor.clone(), self.outer_momentum.clone()],
        })
    }

    fn restore_apart(&mut self, params: Option<&[f32]>, outer: &[Vec<f32>]) -> Result<()> {
        let n = self.params.len();
        let fits = |v: &[f32]| v.len() == n;
        if !params.is_none_or(fits) || !outer.iter().all(|v| fits(v)) {
            return Err(Error::Comm(format!(
                "restoring a replica's state of another size than its {n} parameters"
            )));
        }
        if let Some(p) = params {
            self.params.data.copy_from_slice(p);
        }
        match outer {
            [anchor, momentum] if !self.anchor.is_empty() => {
                self.anchor.copy_from_slice(anchor);
                self.outer_momentum.copy_from_slice(momentum);
            }
            _ if !self.anchor.is_empty() => self.anchor.copy_from_slice(&self.params.data),
            _ => {}
        }
        Ok(())
    }

    fn broadcast_host(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        self.comm.broadcast(buf, root)
    }

    fn update(&mut self, iter: u64) -> Result<f32> {
        let bad = non_finite::first_non_finite(&self.params.diff);
        // The averaged gradient is the same bits on every replica: so is the verdict.
        let step_scale = self.scaler.scale();
        match self.scaler.verdict(bad.is_none()) {
            Verdict::Overflow => return Ok(learning_rate(self.solver.config(), iter)),
            Verdict::Apply => LossScaler::unscale(step_scale, &mut self.params.diff),
            Verdict::NonFinite => {}
        }
        if let Some(at) = bad {
            let (params, rank) = (&self.params, self.comm.rank());
            let loss_finite = self.loss_slots[self.slot].is_finite();
            self.non_finite.record(iter, || {
                if loss_finite {
                    non_finite::name_element(params, at, "the averaged gradient")
                } else {
                    format!("the loss of replica {rank}")
                }
            });
        }
        if self.non_finite.refuses(self.non_finite_mode, bad.is_none()) {
            return Ok(learning_rate(self.solver.config(), iter));
        }
        Ok(self.solver.apply(&self.cpu, iter, &mut self.params))
    }

    fn non_finite_steps(&mut self) -> Result<NonFiniteSteps> {
        Ok(self.non_finite.clone())
    }

    fn inject_nan_loss(&mut self, slot: usize) -> Result<()> {
        self.loss_slots[slot] = f64::NAN;
        Ok(())
    }

    fn loss_window(&mut self) -> Result<Vec<f64>> {
        Ok(self.loss_slots.clone())
    }

    fn sum_scores(&mut self, values: &mut [f64]) -> Result<()> {
        self.comm.all_reduce_sum_f64(values)
    }

    fn barrier(&mut self) -> Result<()> {
        self.comm.barrier()
    }

    fn params_to_host(&mut self) -> Result<Params> {
        Ok(self.params.clone())
    }

    fn solver_history(&mut self) -> Result<Vec<Vec<f32>>> {
        Ok(self.solver.history().to_vec())
    }

    fn history_names(&self) -> &'static [&'static str] {
        self.solver.history_names()
    }

    fn restore_state(&mut self, history: &[Vec<f32>], loss_slots: &[f64]) -> Result<()> {
        let mine = self.solver.history_mut();
        if mine.len() != history.len() || mine.iter().zip(history).any(|(a, b)| a.len() != b.len())
        {
            return Err(Error::Comm(format!(
                "restoring {} history buffer(s) into a solver with {}",
                history.len(),
                mine.len()
            )));
        }
        for (dst, src) in mine.iter_mut().zip(history) {
            dst.copy_from_slice(src);
        }
        self.loss_slots.clear();
        self.loss_slots.extend_from_slice(loss_slots);
        Ok(())
    }

    fn loss_scale(&mut self) -> Result<Option<LossScaleState>> {
        Ok(self.scaler.state())
    }

    fn restore_loss_scale(&mut self, state: &LossScaleState) -> Result<()> {
        self.scaler.restore(state);
        Ok(())
    }

    fn params_hash(&mut self) -> Result<u64> {
        Ok(super::verify::hash_params(&self.params.data))
    }

    fn perturb_param(&mut self) -> Result<()> {
        if let Some(w) = self.params.data.first_mut() {
            *w = next_float(*w);
        }
        Ok(())
    }

    fn start_spans(&mut self, origin: Instant, iters: u64) -> Result<()> {
        let layers = self.net.len();
        // Forward and backward per layer and sub-batch, plus room for a few test batches.
        let capacity = (iters * self.iter_size) as usize * 2 * layers + 64 * layers;
        let mut log = SpanLog::with_capacity(origin, capacity);
        log.layer_names = (0..layers)
            .map(|i| self.net.layer_name(i).to_string())
            .collect();
        self.spans = Some(log);
        Ok(())
    }

    fn take_spans(&mut self) -> Result<Option<SpanLog>> {
        Ok(self.spans.take())
    }
}

/// The float after `x` (a one-ulp change).
pub(crate) fn next_float(x: f32) -> f32 {
    if x == 0.0 {
        f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() + 1)
    } else {
        f32::from_bits(x.to_bits() - 1)
    }
}

/// The net's forward, recording per-layer spans into `spans` when there is a log.
fn forward(
    net: &mut Net,
    ctx: &Ctx,
    params: &mut Params,
    spans: &mut Option<SpanLog>,
) -> Vec<Output> {
    match spans {
        None => net.forward(ctx, params),
        Some(log) => net.forward_traced(
            ctx,
            params,
            Some(&mut |i, start, end| {
                log.push(Name::Forward(i as u32), Track::Host, start, end, ctx.iter)
            }),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::local::LocalGroup;
    use crate::layers::test_util::net_around;
    use crate::validate::load_str;
    use std::path::Path;
    use std::sync::Arc;

    /// Whatever each replica starts from, after `broadcast_params` all hold universal rank 0's
    /// parameters (design decision 5: rank 0 is broadcast at start regardless).
    #[test]
    fn every_replica_starts_from_rank_zeros_parameters() {
        let (cfg, _) = load_str("t.toml", &net_around(""), Path::new("."), &[]).unwrap();
        let cfg = Arc::new(cfg);
        let k = 3;
        let group = Arc::new(LocalGroup::new(k));
        let handles: Vec<_> = (0..k)
            .map(|i| {
                let (cfg, group) = (cfg.clone(), group.clone());
                std::thread::spawn(move || {
                    let (_, mut initial) = Net::build(&cfg, [1, 8, 8], 4).unwrap();
                    initial
                        .data
                        .iter_mut()
                        .enumerate()
                        .for_each(|(j, v)| *v = (i * 1000 + j) as f32);
                    let comm = CpuComm::new(group, i, 0, 1, None);
                    let mut e =
                        CpuEngine::new(&cfg, [1, 8, 8], comm, Cpu::new(1), &initial).unwrap();
                    assert_eq!(e.params_to_host().unwrap().data[0], (i * 1000) as f32);
                    e.broadcast_params().unwrap();
                    e.params_to_host().unwrap().data
                })
            })
            .collect();
        let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let expect: Vec<f32> = (0..results[0].len()).map(|j| j as f32).collect();
        for r in results {
            assert_eq!(r, expect);
        }
    }
}
