//! `P2PSync`: one replica on its own thread — its `Engine` (net, parameters, solver,
//! communicator) and its data shard. At start it takes the parameters of universal rank 0; each
//! iteration it runs forward and backward over `iter_size` sub-batches, all-reduces and averages
//! the gradient, and applies the same update as every other replica. Universal rank 0 also logs,
//! writes metrics and snapshots; the test pass and the displayed loss are global. A step whose
//! loss or averaged gradient is not finite stops every replica at the same iteration, or is
//! skipped by all of them (`crate::solver::non_finite`).
//!
//! Under local SGD (`super::local_sgd`) a step averages its gradient over the replicas its
//! [`Schedule`] says (a node's, or none) and the replicas average their parameters every
//! `sync_period` steps. Where they agree (after an averaging, or a synchronous step that the
//! [`AgreementSchedule`] names) the loop agrees on signals and reads the refused-step record;
//! in between it exchanges nothing but what the user asked for (display, tests, snapshots,
//! `verify_interval`), so that a signal is acted on at the next agreement. Tests and snapshot
//! weights take the replicas' mean parameters; a snapshot also carries every replica's own state
//! (`crate::resume`).

use super::agreement::AgreementSchedule;
use super::engine::Engine;
use super::fault::{InjectedPanic, INJECT_PERTURB};
use super::local_sgd::{AfterStep, GradientScope, Schedule, Traffic};
use super::scores::SharedScores;
use super::timeline::Timeline;
use super::timing::StepTimes;
use crate::config::{CorruptMode, NonFiniteMode, Phase, Plan};
use crate::data::{self, DataSplit, TrainReader};
use crate::dist::nodes::Nodes;
use crate::error::Result;
use crate::metrics::MetricsLog;
use crate::net::{weighted_loss, PassCtx};
use crate::output_folder::OutputLock;
use crate::resume::{self, Lineage, ReplicasApart, SaveState, SolverState};
use crate::signals::{self, Decision, Effects, SignalWatch};
use crate::solver::non_finite::{self, NonFiniteSteps, INJECT_NAN};
use crate::spans::{ReplicaTrace, Step};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tracing::info;

/// The test metric counting unreadable records skipped, job-wide, since the start
/// (`data.on_corrupt = "skip"`).
pub const SKIPPED_RECORDS: &str = "skipped_records";

/// What universal rank 0 writes, and where.
pub struct Outputs {
    pub dir: PathBuf,
    pub metrics: MetricsLog,
    /// Draws progress on stdout (rank 0, terminal only).
    pub progress: Option<indicatif::ProgressBar>,
    /// The snapshots this run (and the runs it resumed from) wrote: the only ones
    /// `snapshot_keep` deletes.
    pub lineage: Lineage,
    /// Held while the run writes into `dir`, so that no second job writes there too.
    pub _lock: OutputLock,
}

/// The result of a test pass, global over all replicas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TestResult {
    pub loss: f64,
    /// First accuracy output, exact correct/total.
    pub accuracy: Option<f64>,
    /// Every non-loss output by name.
    pub outputs: Vec<(String, f64)>,
    pub samples: u64,
}

/// What a replica reports when it finishes.
#[derive(Debug, Clone, Default)]
pub struct ReplicaReport {
    pub iterations: u64,
    pub seconds: f64,
    pub last_test: Option<TestResult>,
    pub last_loss: Option<f64>,
    pub snapshots: Vec<PathBuf>,
    /// Mean seconds per iteration of each step phase (bench mode), averaged over replicas.
    pub step_seconds: Option<[f64; 5]>,
    /// Which clock measured `step_seconds`.
    pub step_clock: &'static str,
    /// Per layer, mean milliseconds per iteration over replicas (`bench --layers`), in net order;
    /// layers that never ran on their own (absorbed into a fused chain) are left out.
    pub layer_ms: Option<Vec<LayerTime>>,
    /// Recorded timelines (`--timeline`): this replica's; the manager gathers its process's here.
    pub traces: Vec<ReplicaTrace>,
    /// Stopped early by a signal, with this exit code (see `signals`).
    pub stopped: Option<i32>,
    /// The iteration training started from (a resumed run's snapshot; else 0).
    pub first_iteration: u64,
    /// What this replica handed to all-reduces of gradients and parameters (bench: the timed
    /// iterations only).
    pub traffic: Traffic,
    /// Replicas in the job and in this replica's node (local SGD's node scope; else 1), for
    /// the bytes a ring all-reduce sends.
    pub replicas: usize,
    pub node_replicas: usize,
    /// `predict`: one JSON line per input of this replica's shard, in input order (the manager
    /// gathers its process's here).
    pub predictions: Vec<String>,
}

/// One layer's mean device (or host) time per iteration, from `bench --layers`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerTime {
    /// The layer's name; a fused chain's names joined by `+`.
    pub name: String,
    pub forward_ms: f64,
    /// `None` where the layer ran no backward.
    pub backward_ms: Option<f64>,
}

/// One replica.
pub struct P2PSync<E: Engine> {
    plan: Arc<Plan>,
    data: DataSplit,
    engine: E,
    outputs: Option<Outputs>,
    /// Record a timeline of this many iterations (`--timeline-iters`).
    timeline_iters: Option<u64>,
    /// The state a resumed run starts from.
    resume: Option<Arc<SolverState>>,
    /// The refused steps the loop has seen (and, in `skip` mode, logged).
    non_finite_seen: NonFiniteSteps,
    /// Where a replica's loss is made NaN (`INJECT_NAN`), if anywhere.
    inject_nan: Option<InjectedPanic>,
    /// Which replicas average what, step by step (local SGD; every replica every step else).
    schedule: Schedule,
    /// The nodes of local SGD's node scope.
    nodes: Option<Arc<Nodes>>,
    /// What this replica handed to all-reduces.
    traffic: Traffic,
    /// Unreadable training records this replica has skipped (`data.on_corrupt = "skip"`).
    skipped_records: u64,
}

impl<E: Engine> P2PSync<E> {
    pub fn new(plan: Arc<Plan>, data: DataSplit, engine: E, outputs: Option<Outputs>) -> Self {
        P2PSync {
            schedule: Schedule::new(&plan.config.cluster, 0),
            nodes: None,
            traffic: Traffic::new(plan.config.cluster.reduce_dtype.bytes()),
            plan,
            data,
            engine,
            outputs,
            timeline_iters: None,
            resume: None,
            non_finite_seen: NonFiniteSteps::default(),
            inject_nan: None,
            skipped_records: 0,
        }
    }

    /// Records a timeline of the first `iters` iterations of training.
    pub fn with_timeline(mut self, iters: Option<u64>) -> Self {
        self.timeline_iters = iters;
        self
    }

    /// Starts training from a snapshot's state instead of iteration 0.
    pub fn resume_from(mut self, state: Option<Arc<SolverState>>) -> Self {
        self.resume = state;
        self
    }

    /// The nodes of local SGD's node scope (for the replica checks).
    pub fn with_nodes(mut self, nodes: Option<Arc<Nodes>>) -> Self {
        self.nodes = nodes;
        self
    }

    /// The replicas of this replica's node (1 without nodes).
    fn node_replicas(&self) -> usize {
        let k = self.plan.replicas_per_rank;
        match &self.nodes {
            Some(n) => n.place(self.engine.rank() / k.max(1)).1 * k,
            None => 1,
        }
    }

    /// Restores the solver history and loss window of a resumed run; returns the first
    /// iteration to run and the first micro-batch to read.
    fn restore(&mut self) -> Result<(u64, u64)> {
        let Some(state) = self.resume.clone() else {
            return Ok((0, 0));
        };
        let s = &self.plan.config.solver;
        let slots = state.loss_slots(s.average_loss, s.iter_size);
        let cluster = &self.plan.config.cluster;
        if let Some(ls) = &state.loss_scale {
            self.engine.restore_loss_scale(ls)?;
        }
        match &state.apart {
            Some(apart) => {
                let r = self.engine.rank();
                self.engine.restore_state(&apart.history[r], &slots)?;
                self.engine
                    .restore_apart(Some(&apart.params[r]), &apart.outer)?;
                self.schedule = Schedule::new(cluster, apart.last_sync);
            }
            None => {
                self.engine.restore_state(&state.history, &slots)?;
                self.schedule = Schedule::new(cluster, state.iter);
            }
        }
        let micro = (self.plan.config.data.batch_size * self.engine.size()) as u64;
        if state.data_position % micro != 0 && self.engine.rank() == 0 {
            tracing::warn!(
                "the data stream resumes at record {} instead of {} (the global batch changed)",
                state.data_position / micro * micro,
                state.data_position
            );
        }
        Ok((state.iter, state.data_position / micro))
    }

    /// Agrees with every replica on what the signals received so far ask for (see `signals`):
    /// the job-wide maximum of each signal's count, through one all-reduce of `4 × replicas`
    /// floats (`slots`, reused), skipped with one replica.
    fn agree_on_signals(
        &mut self,
        watch: &mut SignalWatch,
        effects: &Effects,
        slots: &mut [f64],
    ) -> Result<Decision> {
        let max = if self.engine.size() > 1 {
            slots.fill(0.0);
            let r = self.engine.rank();
            slots[4 * r..4 * r + 4].copy_from_slice(&watch.counts());
            self.engine.sum_scores(slots)?;
            signals::slot_max(slots)
        } else {
            watch.counts()
        };
        Ok(effects.decide(&watch.agreed(&max)))
    }

    /// At the end of the agreement schedule's probe, sets its interval from every replica's mean
    /// step time (a collective, at the same iteration on every replica); nothing alone.
    fn time_agreements(&mut self, agreements: &mut AgreementSchedule, iter: u64) -> Result<()> {
        if self.engine.size() < 2 {
            return Ok(());
        }
        if let Some(mine) = agreements.after_agreement(iter, Instant::now()) {
            let mut sum = [mine];
            self.engine.sum_scores(&mut sum)?;
            let mean = sum[0] / self.engine.size() as f64;
            agreements.set_interval(mean);
            if self.outputs.is_some() {
                info!(
                    "signals agreed every {} iteration(s) from iteration {} (mean step {:.3} ms)",
                    agreements.interval(),
                    iter + 1,
                    mean * 1e3
                );
            }
        }
        Ok(())
    }

    /// Compares a bit-exact hash of the parameters across every replica (a collective) and
    /// fails, naming the first diverging universal rank, when they differ. Under local SGD,
    /// what must agree: the outer state everywhere, and the parameters everywhere right after an
    /// averaging, else among each node's replicas (node scope).
    fn verify_replicas(&mut self, done: u64) -> Result<()> {
        use super::verify::{check, check_among, gather_slots, hash_params, hashes};
        let every = self.plan.config.cluster.verify_interval;
        if every == 0 || !done.is_multiple_of(every) {
            return Ok(());
        }
        let (rank, size) = (self.engine.rank(), self.engine.size());
        let mut slots = gather_slots(self.engine.params_hash()?, rank, size);
        if !self.schedule.is_local() {
            self.engine.sum_scores(&mut slots)?;
            return check(&hashes(&slots), done);
        }
        let outer = hash_params(&self.engine.outer_state()?.concat());
        slots.extend(gather_slots(outer, rank, size));
        self.engine.sum_scores(&mut slots)?;
        let (params, outer) = slots.split_at(2 * size);
        let (params, all) = (hashes(params), (0..size).collect::<Vec<_>>());
        check_among(
            &all,
            &hashes(outer),
            done,
            "local SGD outer state",
            "replicas",
        )?;
        if self.schedule.in_sync(done) {
            return check(&params, done);
        }
        let Some(nodes) = &self.nodes else {
            return Ok(()); // every replica on its own until the next averaging
        };
        let k = self.plan.replicas_per_rank;
        for node in 0..nodes.count() {
            let ranks: Vec<usize> = (0..size)
                .filter(|&u| nodes.of_replica(u, k) == node)
                .collect();
            check_among(
                &ranks,
                &params,
                done,
                "parameters",
                &format!("replicas of node {node}"),
            )?;
        }
        Ok(())
    }

    fn reader(&self, first_micro_batch: u64) -> TrainReader {
        let cfg = &self.plan.config;
        TrainReader::start(
            self.data.train.clone(),
            cfg.solver.random_seed,
            cfg.data.shuffle,
            cfg.data.batch_size,
            self.engine.rank(),
            self.engine.size(),
            first_micro_batch,
            cfg.data.prefetch,
            self.data.transform.clone(),
        )
    }

    /// One iteration: forward/backward over `iter_size` sub-batches, all-reduce (over the
    /// replicas the schedule says), update. Returns the learning rate used.
    fn step(&mut self, iter: u64, reader: &mut TrainReader, times: &mut StepTimes) -> Result<f32> {
        let s = &self.plan.config.solver;
        let slot = (iter % s.average_loss) as usize;
        let scope = self.schedule.scope(iter);
        self.engine.set_gradient_scope(scope);
        let reduced = match scope {
            GradientScope::All if self.engine.size() > 1 => scope,
            GradientScope::Node if self.node_replicas() > 1 => scope,
            _ => GradientScope::Own,
        };
        self.traffic.gradient(reduced, self.engine.param_count());
        self.engine.zero_grad()?;
        for sub in 0..s.iter_size {
            let batch = times.time(Step::Data, || reader.next())?;
            self.engine.load_pixels(&batch.data, &batch.labels)?;
            let ctx = PassCtx {
                phase: Phase::Train,
                iter,
                first_sample: batch.first_position,
            };
            self.skipped_records += batch.skipped;
            reader.recycle(batch);
            let engine = &mut self.engine;
            times.time(Step::Forward, || engine.forward_train(ctx, slot, sub == 0))?;
            let here = Some(InjectedPanic {
                rank: engine.rank(),
                iter,
            });
            if sub + 1 == s.iter_size && self.inject_nan == here {
                engine.inject_nan_loss(slot)?;
            }
            times.time(Step::Backward, || engine.backward(ctx))?;
        }
        let engine = &mut self.engine;
        times.time(Step::AllReduce, || engine.all_reduce_gradients())?;
        times.time(Step::Update, || engine.update(iter))
    }

    /// Ends step `iter` as the schedule says: averages the parameters when it is time. Returns
    /// whether the replicas agree after it (always, without local SGD).
    fn after_step(&mut self, iter: u64, times: &mut StepTimes) -> Result<bool> {
        match self.schedule.after_step(iter) {
            AfterStep::Synchronous => Ok(true),
            AfterStep::Apart => Ok(false),
            AfterStep::Average => {
                self.count_parameter_average();
                let engine = &mut self.engine;
                times.average(|| engine.average_params())?;
                Ok(true)
            }
        }
    }

    /// Counts one all-reduce of the parameters (or their deltas) over every replica.
    fn count_parameter_average(&mut self) {
        if self.engine.size() > 1 {
            self.traffic.parameters += self.engine.param_count() as u64;
        }
    }

    /// Runs `f` on the replicas' mean parameters when they are apart after `done` steps (each
    /// replica's own are put back after), else on its own: a collective.
    fn on_mean_params<T>(
        &mut self,
        done: u64,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        if self.schedule.in_sync(done) {
            return f(self);
        }
        self.count_parameter_average();
        self.engine.hold_mean_params(true)?;
        let out = f(self)?;
        self.engine.hold_mean_params(false)?;
        Ok(out)
    }

    /// The displayed loss after iteration `iter`: the mean over the global batch, averaged over
    /// the last `average_loss` iterations (a collective).
    fn global_loss(&mut self, iter: u64) -> Result<f64> {
        let s = &self.plan.config.solver;
        let valid = (iter + 1).min(s.average_loss) as usize;
        let window = self.engine.loss_window()?;
        let mine = window[..valid].iter().sum::<f64>() / (valid as f64 * s.iter_size as f64);
        let mut sum = [mine];
        self.engine.sum_scores(&mut sum)?;
        Ok(sum[0] / self.engine.size() as f64)
    }

    /// Trains for `max_iter` iterations with tests, display and snapshots as configured (from a
    /// snapshot's iteration when resumed), stopping early when a signal asks for it.
    pub fn train(mut self) -> Result<ReplicaReport> {
        self.engine.broadcast_params()?;
        let s = self.plan.config.solver.clone();
        let (first_iter, first_micro_batch) = self.restore()?;
        let mut reader = self.reader(first_micro_batch);
        let mut report = ReplicaReport {
            first_iteration: first_iter,
            replicas: self.engine.size(),
            node_replicas: self.node_replicas(),
            ..Default::default()
        };
        let timeline = match self.timeline_iters {
            Some(n) => Some(Timeline::start(&mut self.engine, n)?),
            None => None,
        };
        let mut times = StepTimes::new(false).with_timeline(timeline);
        let started = Instant::now();
        let mut last_display = (started, first_iter);
        let fault = InjectedPanic::from_env();
        let perturb = InjectedPanic::from_var(INJECT_PERTURB);
        self.inject_nan = InjectedPanic::from_var(INJECT_NAN);
        let local = self.engine.rank() % self.plan.replicas_per_rank.max(1);
        let mut watch = SignalWatch::new(local == 0);
        let effects = Effects::new(&s);
        let mut signal_slots = vec![0.0; 4 * self.engine.size()];
        let mut agreements = AgreementSchedule::new(first_iter);
        for iter in first_iter..s.max_iter {
            crate::dist::deadline::set_iteration(iter);
            InjectedPanic::check(fault, self.engine.rank(), iter);
            if let Some(tl) = times.timeline() {
                tl.begin_iter(iter, &mut self.engine)?;
            }
            if perturb
                == Some(InjectedPanic {
                    rank: self.engine.rank(),
                    iter,
                })
            {
                self.engine.perturb_param()?;
            }
            if s.test_interval > 0
                && iter % s.test_interval == 0
                && (iter > 0 || s.test_initialization)
            {
                let test = |me: &mut Self| me.on_mean_params(iter, |me| me.test(iter));
                report.last_test = Some(times.test(|| test(&mut self))?);
            }
            let lr = self.step(iter, &mut reader, &mut times)?;
            let in_sync = self.after_step(iter, &mut times)?;
            if s.display > 0 && iter % s.display == 0 {
                let loss = self.global_loss(iter)?;
                self.look_at_non_finite()?;
                report.last_loss = Some(loss);
                let now = Instant::now();
                let samples = (iter + 1 - last_display.1) * self.plan.global_batch as u64;
                let rate = samples as f64 / (now - last_display.0).as_secs_f64().max(1e-9);
                last_display = (now, iter + 1);
                self.log_train(iter, loss, lr, rate, (now - started).as_secs_f64())?;
            }
            let done = iter + 1;
            self.verify_replicas(done)?;
            // Replicas apart (local SGD) exchange nothing: signals wait for the next averaging.
            // In step, they agree where the schedule says.
            let agrees = in_sync && (self.schedule.is_local() || agreements.due(iter));
            let decision = match agrees {
                true => self.agree_on_signals(&mut watch, &effects, &mut signal_slots)?,
                false => Decision::default(),
            };
            if agrees && !self.schedule.is_local() {
                self.time_agreements(&mut agreements, iter)?;
            }
            if decision.stop.is_some() {
                signals::note_stop_decided();
            }
            // Where the host has just waited for the device anyway: after every step where it
            // always does (the CPU), else after an agreement among replicas (on GPUs, ordered
            // after the step).
            if in_sync && (self.engine.host_waits_each_step() || (agrees && self.engine.size() > 1))
            {
                self.look_at_non_finite()?;
            }
            if decision != Decision::default() {
                info!(
                    "replica {}: signal agreed after iteration {done}: {decision:?}",
                    self.engine.rank()
                );
            }
            if done == s.max_iter {
                break; // the final snapshot follows
            }
            if (s.snapshot > 0 && done % s.snapshot == 0) || decision.snapshot {
                self.snapshot(done, &mut report)?;
            }
            if let Some(code) = decision.stop {
                self.look_at_non_finite()?;
                if self.outputs.is_some() {
                    tracing::warn!(
                        "stopping after iteration {done} on a signal (exit code {code})"
                    );
                }
                report.iterations = done;
                report.stopped = Some(code);
                return self.finish_run(report, reader, times, started);
            }
        }
        report.iterations = s.max_iter;
        let test = |me: &mut Self| me.on_mean_params(s.max_iter, |me| me.test(s.max_iter));
        report.last_test = Some(times.test(|| test(&mut self))?);
        self.snapshot(s.max_iter, &mut report)?;
        self.finish_run(report, reader, times, started)
    }

    /// Ends training: the progress bar, the timeline, the reader, a last barrier, the engine.
    fn finish_run(
        mut self,
        mut report: ReplicaReport,
        reader: TrainReader,
        mut times: StepTimes,
        started: Instant,
    ) -> Result<ReplicaReport> {
        report.seconds = started.elapsed().as_secs_f64();
        report.traffic = self.traffic;
        if let Some(bar) = self.outputs.as_ref().and_then(|o| o.progress.as_ref()) {
            bar.finish_and_clear();
        }
        if let Some(tl) = times.take_timeline() {
            report.traces.push(tl.finish(&mut self.engine)?);
        }
        drop(reader);
        self.engine.barrier()?;
        self.engine.finish()?;
        Ok(report)
    }

    /// Reads the engine's record of refused steps (see `crate::solver::non_finite`): in `stop` mode fails
    /// once there is one; in `skip` mode universal rank 0 logs the new ones and counts them in
    /// `metrics.jsonl`. Every replica calls it at the same iterations and reads the same record.
    fn look_at_non_finite(&mut self) -> Result<()> {
        let mut now = self.engine.non_finite_steps()?;
        if self.schedule.is_local() {
            // Between averagings each replica refuses its own steps: the job's record is theirs
            // together (a collective).
            let mut slots = now.slots(self.engine.rank(), self.engine.size());
            self.engine.sum_scores(&mut slots)?;
            now = now.merged(&slots);
        }
        if self.plan.config.solver.non_finite == NonFiniteMode::Stop {
            return now.stop_error().map_or(Ok(()), Err);
        }
        let new = now.count - self.non_finite_seen.count;
        if let (Some(out), Some(last)) = (&mut self.outputs, now.last.filter(|_| new > 0)) {
            let line = format!(
                "iteration {last}: the loss or the averaged gradient is not finite; {new} \
                 update(s) skipped ({} in all)",
                now.count
            );
            match &out.progress {
                Some(bar) => bar.suspend(|| tracing::warn!("{line}")),
                None => tracing::warn!("{line}"),
            }
            out.metrics.skip(last, new, now.count)?;
        }
        self.non_finite_seen = now;
        Ok(())
    }

    /// Universal rank 0 logs a display line and writes it to `metrics.jsonl`.
    fn log_train(&mut self, iter: u64, loss: f64, lr: f32, rate: f64, elapsed: f64) -> Result<()> {
        let loss_scale = self.engine.loss_scale()?;
        let Some(out) = &mut self.outputs else {
            return Ok(());
        };
        let mut line = format!("iter {iter}: loss {loss:.6}, lr {lr:.6e}, {rate:.0} samples/s");
        if let Some(ls) = &loss_scale {
            line += &format!(
                ", loss scale {} ({} overflow step(s) skipped)",
                ls.scale, ls.skipped
            );
        }
        match &out.progress {
            Some(bar) => {
                bar.set_position(iter + 1);
                bar.set_message(format!("loss {loss:.4}"));
                bar.suspend(|| info!("{line}"));
            }
            None => info!("{line}"),
        }
        out.metrics
            .train(iter, loss, lr, rate, elapsed, loss_scale.as_ref())
    }

    /// Runs `warmup` untimed and `iters` timed iterations (no tests, no snapshots) and reports
    /// the step split averaged over all replicas; with `layers`, then `iters` more iterations
    /// with each layer's passes timed (kept apart, so that the timing events do not weigh on
    /// the step's figures).
    pub fn bench(mut self, warmup: u64, iters: u64, layers: bool) -> Result<ReplicaReport> {
        self.engine.broadcast_params()?;
        let mut reader = self.reader(0);
        let mut times = StepTimes::new(true);
        self.steps(0..warmup, &mut reader, &mut times)?;
        self.engine.barrier()?;
        times.reset();
        self.traffic = Traffic::new(self.traffic.gradient_width as usize);
        self.engine.time_device_phases(true);
        let started = Instant::now();
        self.steps(warmup..warmup + iters, &mut reader, &mut times)?;
        let traffic = self.traffic;
        let last = warmup + iters.max(1) - 1;
        let loss = self.global_loss(last)?;
        let seconds = started.elapsed().as_secs_f64();
        // A device's own clock where there is one (CUDA events), else the host's.
        let device = self.engine.device_phase_seconds()?;
        let step_clock = if device.is_some() {
            "device (CUDA events)"
        } else {
            "host"
        };
        let mut split = device.unwrap_or(times.seconds);
        self.engine.time_device_phases(false);
        self.engine.sum_scores(&mut split)?;
        let n = self.engine.size() as f64;
        for v in &mut split {
            *v /= n * iters.max(1) as f64;
        }
        let layer_ms = if layers {
            Some(self.time_layers(warmup + iters, iters, &mut reader, &mut times)?)
        } else {
            None
        };
        drop(reader);
        let (replicas, node_replicas) = (self.engine.size(), self.node_replicas());
        self.engine.finish()?;
        Ok(ReplicaReport {
            iterations: iters,
            seconds,
            last_loss: Some(loss),
            step_seconds: Some(split),
            step_clock,
            layer_ms,
            traffic,
            replicas,
            node_replicas,
            ..Default::default()
        })
    }

    /// Runs the training steps of `iters` (bench mode: no tests, display or snapshots).
    fn steps(
        &mut self,
        iters: std::ops::Range<u64>,
        reader: &mut TrainReader,
        times: &mut StepTimes,
    ) -> Result<()> {
        for iter in iters {
            crate::dist::deadline::set_iteration(iter);
            self.step(iter, reader, times)?;
            self.after_step(iter, times)?;
        }
        Ok(())
    }

    /// Runs `iters` iterations from `first` with the engine's per-layer spans on and returns
    /// each layer's mean time per iteration over every replica (a collective).
    fn time_layers(
        &mut self,
        first: u64,
        iters: u64,
        reader: &mut TrainReader,
        times: &mut StepTimes,
    ) -> Result<Vec<LayerTime>> {
        self.engine.barrier()?;
        self.engine.start_spans(Instant::now(), iters)?;
        self.steps(first..first + iters, reader, times)?;
        let Some(log) = self.engine.take_spans()? else {
            return Ok(Vec::new());
        };
        let mut sums = log.layer_sums();
        self.engine.sum_scores(&mut sums)?;
        let per_iter = 1e3 / (self.engine.size() as f64 * iters.max(1) as f64);
        Ok(log
            .layer_names
            .iter()
            .zip(sums.chunks_exact(4))
            .filter(|(_, s)| s[1] > 0.0)
            .map(|(name, s)| LayerTime {
                name: name.clone(),
                forward_ms: s[0] * per_iter,
                backward_ms: (s[3] > 0.0).then(|| s[2] * per_iter),
            })
            .collect())
    }

    /// `p2ptrain test`: the test pass alone, reported and logged as the test of iteration
    /// `iter` (the weights' iteration) is during training; no update, no snapshot.
    pub fn score(mut self, iter: u64) -> Result<ReplicaReport> {
        self.engine.broadcast_params()?;
        let started = Instant::now();
        let result = self.test(iter)?;
        self.engine.barrier()?;
        self.engine.finish()?;
        Ok(ReplicaReport {
            iterations: iter,
            seconds: started.elapsed().as_secs_f64(),
            last_test: Some(result),
            first_iteration: iter,
            ..Default::default()
        })
    }

    /// `p2ptrain predict`: the test-phase forward over this replica's contiguous shard of
    /// `job.inputs` (the data split's test half), in test batches; the top-k classes of each
    /// input as JSON lines, in input order.
    pub fn predict(mut self, job: &crate::predict::Job) -> Result<ReplicaReport> {
        self.engine.broadcast_params()?;
        let started = Instant::now();
        let cfg = &self.plan.config;
        let tb = cfg.data.test_batch_size.unwrap_or(cfg.data.batch_size);
        let n = job.inputs.len();
        let shard = data::test_shard(n, self.engine.rank(), self.engine.size());
        let (mut batch, mut labels) = (Vec::new(), Vec::new());
        let mut lines = Vec::with_capacity(shard.len());
        for range in data::test_batches(shard, tb, None) {
            data::fill_test_batch(
                self.data.test.as_ref(),
                &self.data.transform,
                range.clone(),
                &mut batch,
                &mut labels,
            )?;
            self.engine.set_batch(range.len())?;
            self.engine.load_batch(&batch, &labels)?;
            let ctx = PassCtx {
                phase: Phase::Test,
                iter: 0,
                first_sample: range.start as u64,
            };
            let (shape, scores) = self.engine.forward_blob(ctx, &job.classifier.blob)?;
            let classes = scores.len() / range.len().max(1);
            if shape.first() != Some(&range.len()) || shape.iter().skip(2).any(|&d| d != 1) {
                return Err(crate::error::Error::net(
                    &job.classifier.blob,
                    format!("has shape {shape:?}: class scores (N, classes) are expected"),
                ));
            }
            for (i, row) in range.zip(scores.chunks_exact(classes)) {
                let top = crate::predict::top_k(row, job.classifier.probabilities, job.top_k);
                lines.push(crate::predict::json_line(&job.inputs.key(i), &top));
            }
        }
        self.engine.barrier()?;
        self.engine.finish()?;
        Ok(ReplicaReport {
            seconds: started.elapsed().as_secs_f64(),
            predictions: lines,
            ..Default::default()
        })
    }

    /// Tests on the whole test set (or `test_iter` batches per replica), split across replicas;
    /// global sums give exact correct/total.
    fn test(&mut self, iter: u64) -> Result<TestResult> {
        let plan = self.plan.clone();
        let cfg = &plan.config;
        let tb = cfg.data.test_batch_size.unwrap_or(cfg.data.batch_size);
        let shard = data::test_shard(self.data.test.len(), self.engine.rank(), self.engine.size());
        let mut names: Vec<String> = vec!["samples".into(), "loss".into()];
        let mut scores: Option<SharedScores> = None;
        let (mut data, mut labels) = (Vec::new(), Vec::new());
        let mut skipped = self.skipped_records;
        for range in data::test_batches(shard, tb, cfg.solver.test_iter) {
            skipped += data::fill_test_batch(
                self.data.test.as_ref(),
                &self.data.transform,
                range.clone(),
                &mut data,
                &mut labels,
            )?;
            let n = range.len();
            self.engine.set_batch(n)?;
            self.engine.load_batch(&data, &labels)?;
            let outputs = self.engine.forward_test(PassCtx {
                phase: Phase::Test,
                iter,
                first_sample: range.start as u64,
            })?;
            let sc = scores.get_or_insert_with(|| {
                names.extend(
                    outputs
                        .iter()
                        .filter(|o| !o.is_loss)
                        .map(|o| o.name.clone()),
                );
                SharedScores::new(names.clone())
            });
            sc.add(0, n as f64);
            let loss = weighted_loss(&outputs);
            sc.add(1, loss * n as f64);
            for (i, o) in outputs.iter().filter(|o| !o.is_loss).enumerate() {
                // Accuracy tops are fractions of the batch: back to exact counts.
                sc.add(2 + i, (o.value as f64 * n as f64).round());
            }
        }
        let mut scores = match scores {
            Some(s) => s,
            None => self.empty_test_scores(iter)?,
        };
        self.engine.set_batch(cfg.data.batch_size)?;
        scores.reduce(&mut self.engine)?;
        let total = scores.get(0).max(1.0);
        let mut outputs: Vec<(String, f64)> = (2..scores.names().len())
            .map(|i| (scores.names()[i].clone(), scores.get(i) / total))
            .collect();
        let accuracy = outputs.first().map(|o| o.1);
        if cfg.data.on_corrupt == CorruptMode::Skip {
            // Training records skipped so far and test records skipped in this pass, job-wide.
            let mut count = [skipped as f64];
            self.engine.sum_scores(&mut count)?;
            outputs.push((SKIPPED_RECORDS.to_string(), count[0]));
        }
        let result = TestResult {
            loss: scores.get(1) / total,
            accuracy,
            outputs,
            samples: scores.get(0) as u64,
        };
        if let Some(out) = &mut self.outputs {
            let acc = result
                .accuracy
                .map(|a| format!(", accuracy {a:.4}"))
                .unwrap_or_default();
            let skips = result
                .outputs
                .iter()
                .find(|o| o.0 == SKIPPED_RECORDS)
                .map(|o| format!(", {} unreadable records skipped so far", o.1))
                .unwrap_or_default();
            let line = format!(
                "iter {iter}: test loss {:.6}{acc} over {} samples{skips}",
                result.loss, result.samples
            );
            match &out.progress {
                Some(bar) => bar.suspend(|| info!("{line}")),
                None => info!("{line}"),
            }
            let extra = &result.outputs[1.min(result.outputs.len())..];
            out.metrics
                .test(iter, result.loss, result.accuracy, extra)?;
        }
        Ok(result)
    }

    /// The score list of a replica whose test shard is empty (more replicas than test records):
    /// the names come from a forward over one zero record so that every replica contributes the
    /// same list to the reduction; its counts stay zero.
    fn empty_test_scores(&mut self, iter: u64) -> Result<SharedScores> {
        let size = data::record_size(self.data.test.as_ref());
        self.engine.set_batch(1)?;
        self.engine.load_batch(&vec![0.0; size], &[0.0])?;
        let outputs = self.engine.forward_test(PassCtx {
            phase: Phase::Test,
            iter,
            first_sample: 0,
        })?;
        let mut names: Vec<String> = vec!["samples".into(), "loss".into()];
        names.extend(
            outputs
                .iter()
                .filter(|o| !o.is_loss)
                .map(|o| o.name.clone()),
        );
        Ok(SharedScores::new(names))
    }

    /// The displayed-loss window after `done` iterations, global: `(iteration, loss averaged over
    /// the replicas and sub-batches)` for the last `average_loss` iterations (a collective).
    fn global_loss_window(&mut self, done: u64) -> Result<Vec<(u64, f64)>> {
        let s = &self.plan.config.solver;
        let (avg, iter_size) = (s.average_loss.max(1), s.iter_size.max(1) as f64);
        let slots = self.engine.loss_window()?;
        let iters: Vec<u64> = (done.saturating_sub(avg)..done).collect();
        let mut values: Vec<f64> = iters
            .iter()
            .map(|j| slots[(j % avg) as usize] / iter_size)
            .collect();
        self.engine.sum_scores(&mut values)?;
        let n = self.engine.size() as f64;
        Ok(iters
            .into_iter()
            .zip(values)
            .map(|(j, v)| (j, v / n))
            .collect())
    }

    /// A snapshot after `iter` iterations (every replica calls it at the same iteration): universal
    /// rank 0 writes `<prefix>_iter_<iter>.safetensors` (weights) and `.solverstate` (solver
    /// history, data position, loss window; see `resume`) into the output directory, then deletes
    /// the run's own snapshots (its lineage's) beyond `snapshot_keep`.
    fn snapshot(&mut self, iter: u64, report: &mut ReplicaReport) -> Result<()> {
        let window = self.global_loss_window(iter)?;
        self.look_at_non_finite()?;
        // Every replica holds the same weights (or, under local SGD, checks its own), so every
        // one reaches the same verdict.
        let params = self.engine.params_to_host()?;
        non_finite::check_weights(&params, iter)?;
        let apart = match self.schedule.is_local() {
            true => self.gather_apart(&params.data)?,
            false => None,
        };
        let params = match self.schedule.is_local() {
            true => self.on_mean_params(iter, |me| me.engine.params_to_host())?,
            false => params,
        };
        if self.outputs.is_none() {
            return Ok(());
        }
        let history = match apart {
            Some(_) => Vec::new(),
            None => self.engine.solver_history()?,
        };
        let history_names = self.engine.history_names();
        let loss_scale = self.engine.loss_scale()?;
        let Some(out) = &mut self.outputs else {
            return Ok(());
        };
        let state = SaveState {
            iter,
            history_names,
            history: &history,
            loss_window: &window,
            train_records: self.data.train.len(),
            lineage: &out.lineage.id,
            apart: apart.as_ref(),
            loss_scale,
        };
        let files = resume::save(&out.dir, &self.plan, &params, &state)?;
        info!("snapshot {}", files.weights.display());
        let weights = files.weights.clone();
        let keep = self.plan.config.solver.snapshot_keep;
        for old in out.lineage.add_and_prune(files, keep) {
            tracing::debug!("snapshot_keep: removed {}", old.display());
            report.snapshots.retain(|p| p != &old);
        }
        report.snapshots.push(weights);
        Ok(())
    }

    /// Local SGD's snapshot state (a collective): every replica's own parameters `own` and
    /// solver history, gathered on universal rank 0 (`None` elsewhere) through one broadcast
    /// from each replica in turn, with the outer state and the last agreement.
    fn gather_apart(&mut self, own: &[f32]) -> Result<Option<ReplicasApart>> {
        let mut buffers = vec![own.to_vec()];
        buffers.extend(self.engine.solver_history()?);
        let (me, size) = (self.engine.rank(), self.engine.size());
        let mut gathered: Vec<Vec<Vec<f32>>> = Vec::new();
        for root in 0..size {
            let mut theirs = Vec::with_capacity(buffers.len());
            for mine in &buffers {
                let mut buf = match root == me {
                    true => mine.clone(),
                    false => vec![0.0; mine.len()],
                };
                self.engine.broadcast_host(&mut buf, root)?;
                theirs.push(buf);
            }
            if me == 0 {
                gathered.push(theirs);
            }
        }
        let outer = self.engine.outer_state()?;
        if me != 0 {
            return Ok(None);
        }
        let (params, history) = gathered.into_iter().map(|mut b| (b.remove(0), b)).unzip();
        Ok(Some(ReplicasApart {
            last_sync: self.schedule.last_sync(),
            params,
            history,
            outer,
        }))
    }
}
