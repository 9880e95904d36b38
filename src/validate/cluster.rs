//! `[cluster]`: bucket size, replicas and threads per rank, deadlines, local SGD's period and
//! outer rule, the gradient wire type against the sync mode, and mixed precision (`math`, loss
//! scaling) against the backend and the sync mode.

use super::*;
use crate::config::{BackendKind, LossScale, MathMode, ReduceDtype, ReduceTransport, SyncMode};

impl Validator<'_> {
    pub(super) fn cluster(&self) -> Result<()> {
        let mb = self.cfg.cluster.bucket_mb;
        if !(mb.is_finite() && mb > 0.0) {
            return Err(self.err(
                "cluster.bucket_mb",
                format!("must be a positive number of MiB, got {mb}"),
            ));
        }
        let t = self.cfg.cluster.collective_timeout_s;
        if !(t.is_finite() && t > 0.0 && t <= 1e9) {
            return Err(self.err(
                "cluster.collective_timeout_s",
                format!("must be a number of seconds > 0 (at most 1e9), got {t}"),
            ));
        }
        let r = self.cfg.cluster.replicas_per_rank;
        if r == 0 || r > MAX_REPLICAS_PER_RANK {
            return Err(self.err(
                "cluster.replicas_per_rank",
                format!("must be between 1 and {MAX_REPLICAS_PER_RANK}, got {r}"),
            ));
        }
        let t = self.cfg.cluster.threads_per_replica;
        if t.saturating_mul(r) > MAX_WORKER_THREADS {
            return Err(self.err(
                "cluster.threads_per_replica",
                format!(
                    "{t} threads × {r} replicas per rank exceeds the limit of \
                     {MAX_WORKER_THREADS} worker threads per rank (0 = the node's cores)"
                ),
            ));
        }
        if let Some(n) = self.cfg.cluster.world_size {
            self.at_least_one("cluster.world_size", n as u64)?;
        }
        self.local_sgd()?;
        self.reduce_dtype()?;
        self.mixed_precision()
    }

    /// The loss-scaling keys' ranges; a dynamic scale needs every replica to judge the same
    /// averaged gradient, which local SGD's own steps are not.
    fn mixed_precision(&self) -> Result<()> {
        let c = &self.cfg.cluster;
        if let Some(LossScale::Fixed(s)) = c.loss_scale {
            self.positive("cluster.loss_scale", s)?;
        }
        self.positive("cluster.loss_scale_init", c.loss_scale_init)?;
        self.at_least_one(
            "cluster.loss_scale_growth_interval",
            c.loss_scale_growth_interval,
        )?;
        let b = c.loss_scale_backoff;
        if !(b > 0.0 && b < 1.0) {
            return Err(self.err(
                "cluster.loss_scale_backoff",
                format!("must be in (0, 1), got {b}"),
            ));
        }
        let dynamic = match c.loss_scale {
            Some(LossScale::Dynamic) => true,
            Some(LossScale::Fixed(_)) => false,
            None => c.math == MathMode::Fp16,
        };
        if dynamic && c.sync == SyncMode::LocalSgd {
            let key = match c.loss_scale {
                Some(_) => "cluster.loss_scale",
                None => "cluster.math",
            };
            return Err(self.err(
                key,
                "dynamic loss scaling (the default with math = \"fp16\") needs every replica to \
                 judge the same averaged gradient, and local SGD's replicas step on their own: \
                 set cluster.loss_scale to a fixed number (or sync = \"allreduce\")",
            ));
        }
        Ok(())
    }

    /// `reduce_dtype = "bf16"` rounds gradients on the wire; local SGD's averagings carry
    /// parameters (or their deltas), which must not be rounded to 8 significant bits, and its
    /// steps between them communicate little: the two are not combined.
    fn reduce_dtype(&self) -> Result<()> {
        let c = &self.cfg.cluster;
        if c.reduce_dtype == ReduceDtype::Bf16 && c.sync == SyncMode::LocalSgd {
            return Err(self.err(
                "cluster.reduce_dtype",
                "\"bf16\" applies to synchronous training's gradient all-reduce only; with \
                 cluster.sync = \"local_sgd\" the replicas average parameters, which bf16 would \
                 round to 8 significant bits: use reduce_dtype = \"fp32\" (or sync = \"allreduce\")",
            ));
        }
        self.reduce_transport()
    }

    /// `reduce_transport = "copy_engines"` carries the bfloat16 wire between GPUs; whether every
    /// replica is on one host with peer access is found when the GPUs are opened.
    fn reduce_transport(&self) -> Result<()> {
        let c = &self.cfg.cluster;
        if c.reduce_transport != ReduceTransport::CopyEngines {
            return Ok(());
        }
        if c.reduce_dtype != ReduceDtype::Bf16 {
            return Err(self.err(
                "cluster.reduce_transport",
                "\"copy_engines\" carries the bfloat16 gradient wire: set cluster.reduce_dtype = \
                 \"bf16\" as well (or reduce_transport = \"nccl\")",
            ));
        }
        if c.backend == BackendKind::Cpu {
            return Err(self.err(
                "cluster.reduce_transport",
                "\"copy_engines\" moves gradients between GPUs: it needs cluster.backend = \
                 \"cuda\" (or \"auto\" on a machine with GPUs)",
            ));
        }
        Ok(())
    }

    /// Local SGD's keys (checked whatever `sync` says: a value out of range is a mistake either
    /// way); `node_ranks` against the world size is the plan's.
    fn local_sgd(&self) -> Result<()> {
        let c = &self.cfg.cluster;
        self.at_least_one("cluster.sync_period", c.sync_period)?;
        self.positive("cluster.outer_lr", c.outer_lr)?;
        self.fraction("cluster.outer_momentum", c.outer_momentum)
    }
}
