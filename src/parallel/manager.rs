//! `P2PManager`: one per process. Owns the resolved plan, the data and the initial parameters,
//! starts one `P2PSync` thread per local replica with its engine (CPU, or a GPU with an NCCL
//! communicator; under local SGD's node scope, a second one over the node), joins them and
//! reports. A replica that fails ends the whole job (its peers may be waiting in a collective).

use super::cpu_engine::CpuEngine;
use super::engine::Engine;
use super::gpu_engine::{GpuEngine, NodeClique};
use super::sync::{Outputs, P2PSync, ReplicaReport};
use crate::backend::Cpu;
use crate::config::Plan;
use crate::data::DataSplit;
use crate::dist::bootstrap::run_replicas;
use crate::dist::nodes::Nodes;
use crate::dist::Bootstrap;
use crate::error::Result;
use crate::params::Params;
use crate::resume::SolverState;
use std::sync::Arc;

/// What the replicas do.
#[derive(Debug, Clone)]
pub enum Mode {
    Train,
    /// The test pass alone, logged as iteration `iter` (`p2ptrain test`).
    Test {
        iter: u64,
    },
    /// Class probabilities of inputs (`p2ptrain predict`).
    Predict(Arc<crate::predict::Job>),
    /// `layers`: then `iters` more iterations timing each layer.
    Bench {
        warmup: u64,
        iters: u64,
        layers: bool,
    },
}

/// The outcome of a run, as seen by this process's first replica.
pub type RunReport = ReplicaReport;

/// Where the replicas of this process compute.
#[derive(Debug, Clone, Copy)]
pub enum Devices {
    /// The CPU, with this many GEMM threads per replica.
    Cpu { threads_per_replica: usize },
    /// GPUs `first_ordinal + i` for local replica `i`, joined into the NCCL clique `nccl_id`.
    Cuda {
        first_ordinal: usize,
        nccl_id: crate::cuda::nccl::NcclId,
    },
}

/// The per-process manager of local replicas.
pub struct P2PManager {
    pub plan: Arc<Plan>,
    pub data: DataSplit,
    /// Parameters every replica starts from (filled from the seed or `--weights`).
    pub initial: Arc<Params>,
    pub devices: Devices,
    /// Record a timeline of this many training iterations (`--timeline`).
    pub timeline_iters: Option<u64>,
    /// The solver state of `--resume` (the weights are in `initial`).
    pub resume: Option<Arc<SolverState>>,
    /// The nodes of local SGD's node scope (`None` otherwise).
    pub nodes: Option<Arc<Nodes>>,
    /// On GPUs under local SGD's node scope, the NCCL clique of this process's node.
    pub node_nccl_id: Option<crate::cuda::nccl::NcclId>,
}

/// Runs `mode` on one replica.
fn drive<E: Engine>(sync: P2PSync<E>, mode: Mode) -> Result<RunReport> {
    match mode {
        Mode::Train => sync.train(),
        Mode::Test { iter } => sync.score(iter),
        Mode::Predict(job) => sync.predict(&job),
        Mode::Bench {
            warmup,
            iters,
            layers,
        } => sync.bench(warmup, iters, layers),
    }
}

impl P2PManager {
    /// Runs `mode` on every local replica. `outputs` goes to universal rank 0 (this process's
    /// replica 0 when this is MPI rank 0).
    pub fn run(self, boot: &Bootstrap, mode: Mode, outputs: Option<Outputs>) -> Result<RunReport> {
        let k = self.plan.replicas_per_rank;
        let (rank, size) = (boot.rank, boot.size);
        let shape = self.data.input_shape();
        let mut outputs = outputs;
        let watchdog = crate::dist::heartbeat::watch_progress();
        let mut reports = match self.devices {
            Devices::Cpu {
                threads_per_replica,
            } => {
                let comms: Vec<_> = match &self.nodes {
                    Some(nodes) => boot
                        .cpu_comms_with_nodes(k, nodes)
                        .into_iter()
                        .map(|(all, node)| (all, Some(node)))
                        .collect(),
                    None => boot.cpu_comms(k).into_iter().map(|c| (c, None)).collect(),
                };
                let inputs = comms
                    .into_iter()
                    .map(|comms| (comms, outputs.take()))
                    .collect();
                run_replicas(rank, "p2psync", inputs, |_, ((comm, node), out)| {
                    let cpu = Cpu::new(threads_per_replica);
                    let engine =
                        CpuEngine::new(&self.plan.config, shape, comm, cpu, &self.initial)?
                            .with_node_comm(node);
                    self.drive(engine, out, mode.clone())
                })
            }
            Devices::Cuda {
                first_ordinal,
                nccl_id,
            } => {
                let inputs = (0..k).map(|_| outputs.take()).collect();
                let place = self.nodes.as_ref().map(|n| n.place(rank));
                run_replicas(rank, "p2psync", inputs, |local, out| {
                    let universal = rank * k + local;
                    let clique = place.zip(self.node_nccl_id).map(|((i, n), id)| NodeClique {
                        rank: i * k + local,
                        size: n * k,
                        id,
                    });
                    let engine = GpuEngine::new(
                        &self.plan.config,
                        shape,
                        first_ordinal + local,
                        universal,
                        size * k,
                        nccl_id,
                        &self.initial,
                    )?
                    .with_node_clique(clique)?;
                    if local == 0 {
                        tracing::info!(
                            "replica {universal} on GPU {} ({})",
                            first_ordinal + local,
                            engine.device_name()
                        );
                    }
                    self.drive(engine, out, mode.clone())
                })
            }
        };
        drop(watchdog);
        let traces: Vec<_> = reports
            .iter_mut()
            .flat_map(|r| r.traces.drain(..))
            .collect();
        let predictions: Vec<_> = reports
            .iter_mut()
            .flat_map(|r| r.predictions.drain(..))
            .collect();
        let mut first = reports.swap_remove(0);
        first.traces = traces;
        first.predictions = predictions;
        Ok(first)
    }

    /// Runs `mode` on one replica's engine.
    fn drive<E: Engine>(&self, engine: E, out: Option<Outputs>, mode: Mode) -> Result<RunReport> {
        let sync = P2PSync::new(self.plan.clone(), self.data.clone(), engine, out)
            .with_timeline(self.timeline_iters)
            .resume_from(self.resume.clone())
            .with_nodes(self.nodes.clone());
        drive(sync, mode)
    }
}
