//! `CpuEngine`: a replica on the CPU backend — the `Net` with its flat `Params`, the `Solver`,
//! and a `CpuComm` — behind the `Engine` seam.

use super::engine::{Engine, PassCtx};
use super::reducer::CommReducer;
use crate::backend::Cpu;
use crate::config::{Config, Phase};
use crate::dist::{Communicator, CpuComm};
use crate::error::Result;
use crate::layers::Ctx;
use crate::net::{weighted_loss, Net, Output};
use crate::params::Params;
use crate::solver::Solver;

/// One CPU replica.
pub struct CpuEngine {
    cpu: Cpu,
    net: Net,
    params: Params,
    solver: Solver,
    comm: CpuComm,
    seed: u64,
    /// One slot per iteration of the `average_loss` window: the sum of its sub-batch losses.
    loss_slots: Vec<f64>,
    /// Scratch of the cross-replica statistics (sync BatchNorm), reused between passes.
    reduce_scratch: Vec<f64>,
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
        Ok(CpuEngine {
            cpu,
            net,
            solver: Solver::new(&cfg.solver, params.len()),
            params,
            comm,
            seed: cfg.solver.random_seed,
            loss_slots: vec![0.0; cfg.solver.average_loss as usize],
            reduce_scratch: Vec::new(),
        })
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

    fn broadcast_params(&mut self) -> Result<()> {
        self.comm.broadcast(&mut self.params.data, 0)
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

    fn zero_grad(&mut self) -> Result<()> {
        crate::solver::zero_grad(&mut self.params);
        Ok(())
    }

    fn forward_train(&mut self, c: PassCtx, slot: usize, first: bool) -> Result<()> {
        debug_assert_eq!(c.phase, Phase::Train);
        let multi = self.comm.size() > 1;
        let reducer = CommReducer::new(&mut self.comm, &mut self.reduce_scratch);
        let ctx = layer_ctx(&self.cpu, self.seed, c, multi.then_some(&reducer as _));
        let outputs = self.net.forward(&ctx, &mut self.params);
        reducer.finish()?;
        let loss = weighted_loss(&outputs);
        let s = &mut self.loss_slots[slot];
        *s = if first { loss } else { *s + loss };
        Ok(())
    }

    fn backward(&mut self, c: PassCtx) -> Result<()> {
        let multi = self.comm.size() > 1;
        let reducer = CommReducer::new(&mut self.comm, &mut self.reduce_scratch);
        let ctx = layer_ctx(&self.cpu, self.seed, c, multi.then_some(&reducer as _));
        self.net.backward(&ctx, &mut self.params, &mut |_| {});
        reducer.finish()?;
        Ok(())
    }

    fn forward_test(&mut self, c: PassCtx) -> Result<Vec<Output>> {
        // Test passes never communicate: replicas may run different numbers of test batches.
        let ctx = layer_ctx(&self.cpu, self.seed, c, None);
        Ok(self.net.forward(&ctx, &mut self.params))
    }

    fn all_reduce_gradients(&mut self) -> Result<()> {
        if self.comm.size() == 1 {
            // The average over one replica is its own gradient.
            return Ok(());
        }
        self.comm.all_reduce_avg(&mut self.params.diff)
    }

    fn update(&mut self, iter: u64) -> Result<f32> {
        Ok(self.solver.apply(&self.cpu, iter, &mut self.params))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;
    use crate::dist::local::LocalGroup;
    use std::path::Path;
    use std::sync::Arc;

    const CONFIG: &str = r#"
[data]
format = "digits"
batch_size = 4
[solver]
base_lr = 0.1
max_iter = 1
[[layer]]
name = "ip"
type = "inner_product"
bottom = ["data"]
top = ["ip"]
num_output = 10
[[layer]]
name = "loss"
type = "softmax_with_loss"
bottom = ["ip", "label"]
top = ["loss"]
"#;

    /// Whatever each replica starts from, after `broadcast_params` all hold universal rank 0's
    /// parameters (design decision 5: rank 0 is broadcast at start regardless).
    #[test]
    fn every_replica_starts_from_rank_zeros_parameters() {
        let (cfg, _) = load_str("t.toml", CONFIG, Path::new("."), &[]).unwrap();
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
