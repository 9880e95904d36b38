//! `P2PManager`: one per process. Owns the resolved plan, the data and the initial parameters,
//! starts one `P2PSync` thread per local replica with its `Communicator`, joins them and reports.
//! A replica that fails ends the whole job (its peers may be waiting in a collective).

use super::cpu_engine::CpuEngine;
use super::sync::{Outputs, P2PSync, ReplicaReport};
use crate::backend::Cpu;
use crate::config::Plan;
use crate::data::DataSplit;
use crate::dist::bootstrap::{abort_job, report_error};
use crate::dist::local::LocalGroup;
use crate::dist::{Bootstrap, CpuComm};
use crate::error::Result;
use crate::params::Params;
use std::sync::Arc;

/// What the replicas do.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Train,
    Bench { warmup: u64, iters: u64 },
}

/// The outcome of a run, as seen by this process's first replica.
pub type RunReport = ReplicaReport;

/// The per-process manager of local replicas.
pub struct P2PManager {
    pub plan: Arc<Plan>,
    pub data: DataSplit,
    /// Parameters every replica starts from (filled from the seed or `--weights`).
    pub initial: Arc<Params>,
    /// GEMM threads per replica.
    pub threads_per_replica: usize,
}

impl P2PManager {
    /// Runs `mode` on every local replica. `outputs` goes to universal rank 0 (this process's
    /// replica 0 when this is MPI rank 0).
    pub fn run(self, boot: &Bootstrap, mode: Mode, outputs: Option<Outputs>) -> Result<RunReport> {
        let k = self.plan.replicas_per_rank;
        let group = Arc::new(LocalGroup::new(k));
        let mut outputs = outputs;
        let handles: Vec<_> = (0..k)
            .map(|local| {
                let plan = self.plan.clone();
                let data = self.data.clone();
                let initial = self.initial.clone();
                let group = group.clone();
                let link = (local == 0 && boot.size > 1).then(|| boot.link());
                let out = if local == 0 { outputs.take() } else { None };
                let (rank, size) = (boot.rank, boot.size);
                let cpu = Cpu::new(self.threads_per_replica);
                std::thread::Builder::new()
                    .name(format!("p2psync-{local}"))
                    .spawn(move || {
                        let comm = CpuComm::new(group, local, rank, size, link);
                        let universal = rank * k + local;
                        let run = || -> Result<RunReport> {
                            let shape = data.train.record_shape();
                            let engine = CpuEngine::new(&plan.config, shape, comm, cpu, &initial)?;
                            let sync = P2PSync::new(plan, data, engine, out);
                            match mode {
                                Mode::Train => sync.train(),
                                Mode::Bench { warmup, iters } => sync.bench(warmup, iters),
                            }
                        };
                        match run() {
                            Ok(r) => r,
                            Err(e) => {
                                // Peers may be inside a collective: end the whole job.
                                report_error(rank, &e);
                                tracing::error!("replica {universal} failed; aborting the job");
                                abort_job(e.exit_code())
                            }
                        }
                    })
                    .expect("spawning a replica thread")
            })
            .collect();
        let mut reports: Vec<RunReport> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| abort_job(1)))
            .collect();
        Ok(reports.swap_remove(0))
    }
}
