//! `P2PSync`: one replica on its own thread — its `Engine` (net, parameters, solver,
//! communicator) and its data shard. At start it takes the parameters of universal rank 0; each
//! iteration it runs forward and backward over `iter_size` sub-batches, all-reduces and averages
//! the gradient, and applies the same update as every other replica. Universal rank 0 also logs,
//! writes metrics and snapshots; the test pass and the displayed loss are global.

use super::engine::{Engine, PassCtx};
use super::fault::InjectedPanic;
use super::scores::SharedScores;
use super::timing::{Phase as Step, StepTimes};
use crate::config::{Phase, Plan};
use crate::data::{self, Augment, DataSplit, TrainReader};
use crate::error::Result;
use crate::metrics::MetricsLog;
use crate::net::weighted_loss;
use crate::snapshot;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tracing::info;

/// What universal rank 0 writes, and where.
pub struct Outputs {
    pub dir: PathBuf,
    pub metrics: MetricsLog,
    /// Draws progress on stdout (rank 0, terminal only).
    pub progress: Option<indicatif::ProgressBar>,
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
}

/// One replica.
pub struct P2PSync<E: Engine> {
    plan: Arc<Plan>,
    data: DataSplit,
    engine: E,
    outputs: Option<Outputs>,
}

impl<E: Engine> P2PSync<E> {
    pub fn new(plan: Arc<Plan>, data: DataSplit, engine: E, outputs: Option<Outputs>) -> Self {
        P2PSync {
            plan,
            data,
            engine,
            outputs,
        }
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
            Augment {
                shift: cfg.data.shift,
                seed: cfg.solver.random_seed,
                fill: -cfg.data.mean * cfg.data.scale,
            },
        )
    }

    /// One iteration: forward/backward over `iter_size` sub-batches, all-reduce, update.
    /// Returns the learning rate used.
    fn step(&mut self, iter: u64, reader: &mut TrainReader, times: &mut StepTimes) -> Result<f32> {
        let s = &self.plan.config.solver;
        let slot = (iter % s.average_loss) as usize;
        self.engine.zero_grad()?;
        for sub in 0..s.iter_size {
            let batch = times.time(Step::Data, || reader.next())?;
            self.engine.load_batch(&batch.data, &batch.labels)?;
            let ctx = PassCtx {
                phase: Phase::Train,
                iter,
                first_sample: batch.first_position,
            };
            reader.recycle(batch);
            let engine = &mut self.engine;
            times.time(Step::Forward, || engine.forward_train(ctx, slot, sub == 0))?;
            times.time(Step::Backward, || engine.backward(ctx))?;
        }
        let engine = &mut self.engine;
        times.time(Step::AllReduce, || engine.all_reduce_gradients())?;
        times.time(Step::Update, || engine.update(iter))
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

    /// Trains for `max_iter` iterations with tests, display and snapshots as configured.
    pub fn train(mut self) -> Result<ReplicaReport> {
        self.engine.broadcast_params()?;
        let s = self.plan.config.solver.clone();
        let mut reader = self.reader(0);
        let mut report = ReplicaReport::default();
        let mut times = StepTimes::new(false);
        let started = Instant::now();
        let mut last_display = (started, 0u64);
        let fault = InjectedPanic::from_env();
        for iter in 0..s.max_iter {
            crate::dist::deadline::set_iteration(iter);
            InjectedPanic::check(fault, self.engine.rank(), iter);
            if s.test_interval > 0
                && iter % s.test_interval == 0
                && (iter > 0 || s.test_initialization)
            {
                report.last_test = Some(self.test(iter)?);
            }
            let lr = self.step(iter, &mut reader, &mut times)?;
            if s.display > 0 && iter % s.display == 0 {
                let loss = self.global_loss(iter)?;
                report.last_loss = Some(loss);
                let now = Instant::now();
                let samples = (iter + 1 - last_display.1) * self.plan.global_batch as u64;
                let rate = samples as f64 / (now - last_display.0).as_secs_f64().max(1e-9);
                last_display = (now, iter + 1);
                if let Some(out) = &mut self.outputs {
                    let elapsed = (now - started).as_secs_f64();
                    let line =
                        format!("iter {iter}: loss {loss:.6}, lr {lr:.6e}, {rate:.0} samples/s");
                    match &out.progress {
                        Some(bar) => {
                            bar.set_position(iter + 1);
                            bar.set_message(format!("loss {loss:.4}"));
                            bar.suspend(|| info!("{line}"));
                        }
                        None => info!("{line}"),
                    }
                    out.metrics.train(iter, loss, lr, rate, elapsed)?;
                }
            }
            let done = iter + 1;
            if s.snapshot > 0 && done % s.snapshot == 0 && done < s.max_iter {
                self.snapshot(done, &mut report)?;
            }
        }
        report.iterations = s.max_iter;
        report.seconds = started.elapsed().as_secs_f64();
        if let Some(bar) = self.outputs.as_ref().and_then(|o| o.progress.as_ref()) {
            bar.finish_and_clear();
        }
        report.last_test = Some(self.test(s.max_iter)?);
        self.snapshot(s.max_iter, &mut report)?;
        drop(reader);
        self.engine.barrier()?;
        self.engine.finish()?;
        Ok(report)
    }

    /// Runs `warmup` untimed and `iters` timed iterations (no tests, no snapshots) and reports
    /// the step split averaged over all replicas.
    pub fn bench(mut self, warmup: u64, iters: u64) -> Result<ReplicaReport> {
        self.engine.broadcast_params()?;
        let mut reader = self.reader(0);
        let mut times = StepTimes::new(true);
        for iter in 0..warmup {
            self.step(iter, &mut reader, &mut times)?;
        }
        self.engine.barrier()?;
        times.reset();
        self.engine.time_device_phases(true);
        let started = Instant::now();
        for iter in warmup..warmup + iters {
            crate::dist::deadline::set_iteration(iter);
            self.step(iter, &mut reader, &mut times)?;
        }
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
        drop(reader);
        self.engine.finish()?;
        Ok(ReplicaReport {
            iterations: iters,
            seconds,
            last_loss: Some(loss),
            step_seconds: Some(split),
            step_clock,
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
        for range in data::test_batches(shard, tb, cfg.solver.test_iter) {
            data::fill_test_batch(
                self.data.test.as_ref(),
                range.clone(),
                &mut data,
                &mut labels,
            );
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
        let outputs: Vec<(String, f64)> = (2..scores.names().len())
            .map(|i| (scores.names()[i].clone(), scores.get(i) / total))
            .collect();
        let result = TestResult {
            loss: scores.get(1) / total,
            accuracy: outputs.first().map(|o| o.1),
            outputs,
            samples: scores.get(0) as u64,
        };
        if let Some(out) = &mut self.outputs {
            let acc = result
                .accuracy
                .map(|a| format!(", accuracy {a:.4}"))
                .unwrap_or_default();
            let line = format!(
                "iter {iter}: test loss {:.6}{acc} over {} samples",
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

    /// Universal rank 0 writes `<prefix>_iter_<iter>.safetensors` into the output directory.
    fn snapshot(&mut self, iter: u64, report: &mut ReplicaReport) -> Result<()> {
        if self.outputs.is_none() {
            return Ok(());
        }
        let params = self.engine.params_to_host()?;
        let Some(out) = &self.outputs else {
            return Ok(());
        };
        let prefix = &self.plan.config.solver.snapshot_prefix;
        let path = out.dir.join(format!("{prefix}_iter_{iter}.safetensors"));
        let meta = vec![
            ("iter".to_string(), iter.to_string()),
            (
                "fingerprint".to_string(),
                format!("{:016x}", self.plan.fingerprint),
            ),
        ];
        snapshot::save_weights(&path, &params, &meta)?;
        info!("snapshot {}", path.display());
        report.snapshots.push(path);
        Ok(())
    }
}
