//! `P2PSync`: one replica on its own thread — its net, parameters, solver and data shard. At start
//! it takes the parameters of universal rank 0; each iteration it runs forward and backward over
//! `iter_size` sub-batches, all-reduces and averages the gradient, and applies the same update
//! as every other replica. Universal rank 0 also logs, tests, snapshots and writes metrics.

use super::scores::SharedScores;
use super::timing::{Phase as Step, StepTimes};
use crate::backend::Cpu;
use crate::config::{Phase, Plan};
use crate::data::{self, Augment, DataSplit, TrainReader};
use crate::dist::Communicator;
use crate::error::Result;
use crate::layers::Ctx;
use crate::metrics::MetricsLog;
use crate::net::Net;
use crate::params::Params;
use crate::snapshot;
use crate::solver::Solver;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tracing::info;

/// What universal rank 0 writes, and where.
pub struct Outputs {
    pub dir: PathBuf,
    pub metrics: MetricsLog,
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
}

/// One replica.
pub struct P2PSync<C: Communicator> {
    plan: Arc<Plan>,
    data: DataSplit,
    comm: C,
    cpu: Cpu,
    net: Net,
    params: Params,
    solver: Solver,
    outputs: Option<Outputs>,
}

impl<C: Communicator> P2PSync<C> {
    /// Builds the replica's net and solver, with parameters copied from `initial` (every
    /// replica gets the same; universal rank 0's are broadcast anyway in `start`).
    pub fn new(
        plan: Arc<Plan>,
        data: DataSplit,
        comm: C,
        cpu: Cpu,
        initial: &Params,
        outputs: Option<Outputs>,
    ) -> Result<Self> {
        let cfg = &plan.config;
        let (net, mut params) = Net::build(cfg, data.train.record_shape(), cfg.data.batch_size)?;
        params.data.copy_from_slice(&initial.data);
        let solver = Solver::new(&cfg.solver, params.len());
        Ok(P2PSync {
            plan,
            data,
            comm,
            cpu,
            net,
            params,
            solver,
            outputs,
        })
    }

    /// Takes universal rank 0's parameters.
    fn start(&mut self) -> Result<()> {
        self.comm.broadcast(&mut self.params.data, 0)
    }

    fn reader(&self, first_micro_batch: u64) -> TrainReader {
        let cfg = &self.plan.config;
        TrainReader::start(
            self.data.train.clone(),
            cfg.solver.random_seed,
            cfg.data.shuffle,
            cfg.data.batch_size,
            self.comm.rank(),
            self.comm.size(),
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
    /// Returns this replica's mean loss over the sub-batches.
    fn step(
        &mut self,
        iter: u64,
        reader: &mut TrainReader,
        times: &mut StepTimes,
    ) -> Result<(f64, f32)> {
        let s = &self.plan.config.solver;
        let seed = s.random_seed;
        self.params.diff.fill(0.0);
        let mut loss = 0.0;
        for _ in 0..s.iter_size {
            let batch = times.time(Step::Data, || reader.next())?;
            let (data, labels) = self.net.inputs_mut();
            data.copy_from_slice(&batch.data);
            labels.copy_from_slice(&batch.labels);
            let ctx = Ctx {
                cpu: &self.cpu,
                phase: Phase::Train,
                iter,
                seed,
                first_sample: batch.first_position,
            };
            reader.recycle(batch);
            let outputs = times.time(Step::Forward, || self.net.forward(&ctx, &mut self.params));
            loss += outputs
                .iter()
                .filter(|o| o.is_loss)
                .map(|o| o.value as f64)
                .sum::<f64>();
            times.time(Step::Backward, || {
                self.net.backward(&ctx, &mut self.params, &mut |_| {})
            });
        }
        let comm = &mut self.comm;
        let diff = &mut self.params.diff;
        times.time(Step::AllReduce, || comm.all_reduce_avg(diff))?;
        let lr = times.time(Step::Update, || {
            self.solver.apply(&self.cpu, iter, &mut self.params)
        });
        Ok((loss / s.iter_size as f64, lr))
    }

    /// Trains for `max_iter` iterations with tests, display and snapshots as configured.
    pub fn train(mut self) -> Result<ReplicaReport> {
        self.start()?;
        let s = self.plan.config.solver.clone();
        let mut reader = self.reader(0);
        let mut report = ReplicaReport::default();
        let mut times = StepTimes::new(false);
        let mut window: std::collections::VecDeque<f64> = Default::default();
        let started = Instant::now();
        let mut last_display = (started, 0u64);
        for iter in 0..s.max_iter {
            if s.test_interval > 0
                && iter % s.test_interval == 0
                && (iter > 0 || s.test_initialization)
            {
                report.last_test = Some(self.test(iter)?);
            }
            let (loss, lr) = self.step(iter, &mut reader, &mut times)?;
            window.push_back(loss);
            if window.len() as u64 > s.average_loss {
                window.pop_front();
            }
            if s.display > 0 && iter % s.display == 0 {
                let mut scores = SharedScores::new(vec!["loss".into()]);
                scores.add(0, window.iter().sum::<f64>() / window.len() as f64);
                scores.reduce(&mut self.comm)?;
                let global_loss = scores.get(0) / self.comm.size() as f64;
                report.last_loss = Some(global_loss);
                let now = Instant::now();
                let samples = (iter + 1 - last_display.1) * self.plan.global_batch as u64;
                let rate = samples as f64 / (now - last_display.0).as_secs_f64().max(1e-9);
                last_display = (now, iter + 1);
                if let Some(out) = &mut self.outputs {
                    let elapsed = (now - started).as_secs_f64();
                    info!("iter {iter}: loss {global_loss:.6}, lr {lr:.6e}, {rate:.0} samples/s");
                    out.metrics.train(iter, global_loss, lr, rate, elapsed)?;
                }
            }
            let done = iter + 1;
            if s.snapshot > 0 && done % s.snapshot == 0 && done < s.max_iter {
                self.snapshot(done, &mut report)?;
            }
        }
        report.iterations = s.max_iter;
        report.seconds = started.elapsed().as_secs_f64();
        report.last_test = Some(self.test(s.max_iter)?);
        self.snapshot(s.max_iter, &mut report)?;
        drop(reader);
        self.comm.barrier()?;
        Ok(report)
    }

    /// Runs `warmup` untimed and `iters` timed iterations (no tests, no snapshots) and reports
    /// the step split averaged over all replicas.
    pub fn bench(mut self, warmup: u64, iters: u64) -> Result<ReplicaReport> {
        self.start()?;
        let mut reader = self.reader(0);
        let mut times = StepTimes::new(true);
        for iter in 0..warmup {
            self.step(iter, &mut reader, &mut times)?;
        }
        self.comm.barrier()?;
        times.reset();
        let started = Instant::now();
        let mut loss = 0.0;
        for iter in warmup..warmup + iters {
            loss = self.step(iter, &mut reader, &mut times)?.0;
        }
        self.comm.barrier()?;
        let seconds = started.elapsed().as_secs_f64();
        let mut scores = SharedScores::new((0..6).map(|i| format!("t{i}")).collect());
        for (i, t) in times.seconds.iter().enumerate() {
            scores.add(i, *t);
        }
        scores.add(5, loss);
        scores.reduce(&mut self.comm)?;
        let n = self.comm.size() as f64;
        let mut step_seconds = [0.0; 5];
        for (i, v) in step_seconds.iter_mut().enumerate() {
            *v = scores.get(i) / n / iters.max(1) as f64;
        }
        drop(reader);
        Ok(ReplicaReport {
            iterations: iters,
            seconds,
            last_loss: Some(scores.get(5) / n),
            step_seconds: Some(step_seconds),
            ..Default::default()
        })
    }

    /// Tests on the whole test set (or `test_iter` batches per replica), split across replicas;
    /// global sums give exact correct/total.
    fn test(&mut self, iter: u64) -> Result<TestResult> {
        let cfg = &self.plan.config;
        let tb = cfg.data.test_batch_size.unwrap_or(cfg.data.batch_size);
        let shard = data::test_shard(self.data.test.len(), self.comm.rank(), self.comm.size());
        let mut names: Vec<String> = vec!["samples".into(), "loss".into()];
        let mut scores: Option<SharedScores> = None;
        let mut start = shard.start;
        let mut batches = 0u64;
        let (mut data, mut labels) = (Vec::new(), Vec::new());
        while start < shard.end && cfg.solver.test_iter.is_none_or(|cap| batches < cap) {
            let end = (start + tb).min(shard.end);
            data::fill_test_batch(self.data.test.as_ref(), start..end, &mut data, &mut labels);
            let n = end - start;
            self.net.set_batch(n)?;
            let (d, l) = self.net.inputs_mut();
            d.copy_from_slice(&data);
            l.copy_from_slice(&labels);
            let ctx = Ctx {
                cpu: &self.cpu,
                phase: Phase::Test,
                iter,
                seed: cfg.solver.random_seed,
                first_sample: start as u64,
            };
            let outputs = self.net.forward(&ctx, &mut self.params);
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
            let loss: f64 = outputs
                .iter()
                .filter(|o| o.is_loss)
                .map(|o| o.value as f64)
                .sum();
            sc.add(1, loss * n as f64);
            for (i, o) in outputs.iter().filter(|o| !o.is_loss).enumerate() {
                // Accuracy tops are fractions of the batch: back to exact counts.
                sc.add(2 + i, (o.value as f64 * n as f64).round());
            }
            start = end;
            batches += 1;
        }
        self.net.set_batch(cfg.data.batch_size)?;
        let mut scores = match scores {
            Some(s) => s,
            None => self.empty_test_scores()?,
        };
        scores.reduce(&mut self.comm)?;
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
                .map(|a| format!(", accuracy {:.4}", a))
                .unwrap_or_default();
            info!(
                "iter {iter}: test loss {:.6}{acc} over {} samples",
                result.loss, result.samples
            );
            out.metrics.test(
                iter,
                result.loss,
                result.accuracy,
                &result.outputs[1.min(result.outputs.len())..],
            )?;
        }
        Ok(result)
    }

    /// The score list of a replica whose test shard is empty: the names come from a dry forward
    /// over one record so that every replica contributes the same list to the reduction.
    fn empty_test_scores(&mut self) -> Result<SharedScores> {
        let cfg = &self.plan.config;
        self.net.set_batch(1)?;
        let ctx = Ctx {
            cpu: &self.cpu,
            phase: Phase::Test,
            iter: 0,
            seed: cfg.solver.random_seed,
            first_sample: 0,
        };
        let (_, l) = self.net.inputs_mut();
        l.fill(0.0);
        let outputs = self.net.forward(&ctx, &mut self.params);
        self.net.set_batch(cfg.data.batch_size)?;
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
        snapshot::save_weights(&path, &self.params, &meta)?;
        info!("snapshot {}", path.display());
        report.snapshots.push(path);
        Ok(())
    }
}
