//! `CpuComm`: the `Communicator` of one replica on the CPU backend. Local replicas reduce through
//! a shared `LocalGroup`; the leader (local index 0) combines the processes' sums through MPI;
//! the result fans back out to the local replicas. Every wait is under the collective deadline
//! and names its collective (`gradient all-reduce`, `score sum`, `parameter broadcast`,
//! `barrier`) when it expires. The gradient all-reduce also runs on the bfloat16 wire
//! ([`CpuComm::all_reduce_avg_bf16`], `[cluster] reduce_dtype = "bf16"`), rounding where the
//! GPU backend rounds.

use super::local::{LocalGroup, LocalReducer};
use super::mpi_link::MpiLink;
use super::{wire, Communicator};
use crate::error::Result;
use half::bf16;
use std::ops::AddAssign;
use std::sync::Arc;

/// One replica's endpoint.
pub struct CpuComm {
    group: Arc<LocalGroup>,
    local: usize,
    rank: usize,
    size: usize,
    /// Present on the leader replica of a multi-process job.
    mpi: Option<MpiLink>,
    gathered_f32: Vec<f32>,
    gathered_f64: Vec<f64>,
    /// This replica's gradient on the bfloat16 wire, and the leader's gathered sums.
    wire: Vec<bf16>,
    gathered_bf16: Vec<bf16>,
}

impl CpuComm {
    /// The endpoint of local replica `local` of process `process` (of `processes`), which hosts
    /// `group.len()` replicas. Only local replica 0 gets the `MpiLink`.
    pub fn new(
        group: Arc<LocalGroup>,
        local: usize,
        process: usize,
        processes: usize,
        mpi: Option<MpiLink>,
    ) -> Self {
        let k = group.len();
        assert!(local < k);
        assert_eq!(
            mpi.is_some(),
            local == 0 && processes > 1,
            "MPI link on leader only"
        );
        CpuComm {
            rank: process * k + local,
            size: processes * k,
            group,
            local,
            mpi,
            gathered_f32: Vec::new(),
            gathered_f64: Vec::new(),
            wire: Vec::new(),
            gathered_bf16: Vec::new(),
        }
    }

    /// [`Communicator::all_reduce_avg`] on the bfloat16 wire: `buf` is rounded to bfloat16
    /// ([`wire::to_wire`]), summed in bfloat16 (the local replicas in slot order, then over the
    /// processes by MPI, each addition rounded: [`wire::add`]), and the sum comes back as FP32
    /// times `1/replicas` ([`wire::from_wire_scaled`]). With two replicas, whatever their split
    /// into processes, this is what NCCL's bfloat16 sum gives the GPU backend, bit for bit.
    pub fn all_reduce_avg_bf16(&mut self, buf: &mut [f32]) -> Result<()> {
        wire::round_into(buf, &mut self.wire);
        let (g, mpi) = (&self.group, self.mpi.as_mut());
        let gathered = &mut self.gathered_bf16;
        sum(
            g,
            &g.bf16s,
            self.local,
            (&self.wire, gathered),
            mpi,
            GRADIENTS,
        );
        let inv = 1.0 / self.size as f32;
        g.copy_out(&g.bf16s, self.local, GRADIENTS, buf, |v| {
            wire::from_wire_scaled(v, inv)
        });
        Ok(())
    }
}

/// The collective of a gradient all-reduce, as its deadline report names it.
const GRADIENTS: &str = "gradient all-reduce";

/// The element types a process's leader sums with the other processes' (through its
/// [`MpiLink`]).
trait ProcessSum: Copy + Default + AddAssign {
    fn sum_over_processes(link: &mut MpiLink, values: &mut [Self], op: &str);
}

impl ProcessSum for f32 {
    fn sum_over_processes(link: &mut MpiLink, values: &mut [f32], op: &str) {
        link.sum_f32(values, op)
    }
}

impl ProcessSum for f64 {
    fn sum_over_processes(link: &mut MpiLink, values: &mut [f64], op: &str) {
        link.sum_f64(values, op)
    }
}

impl ProcessSum for bf16 {
    fn sum_over_processes(link: &mut MpiLink, values: &mut [bf16], op: &str) {
        link.sum_bf16(values, op)
    }
}

/// The sum of `input` over every replica through `r`: the local replicas' sums (phases 1–2),
/// and the processes' combined by the leader through `mpi` and `gathered` (phase 3). The caller
/// then copies the result out (`LocalGroup::copy_out`, phase 4).
fn sum<T: ProcessSum>(
    g: &LocalGroup,
    r: &LocalReducer<T>,
    local: usize,
    (input, gathered): (&[T], &mut Vec<T>),
    mpi: Option<&mut MpiLink>,
    op: &str,
) {
    g.reduce_into_chunks(r, local, input, op);
    if let Some(mpi) = mpi {
        g.gather_chunks(r, gathered);
        g.in_mpi(|| T::sum_over_processes(mpi, gathered, op));
        g.scatter_chunks(r, gathered);
    }
    g.wait(local, op);
}

impl Communicator for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        const OP: &str = "parameter broadcast";
        let (k, local) = (self.group.len(), self.local);
        if self.rank == root {
            self.group.publish(buf);
        }
        self.group.wait(local, OP);
        if let Some(mpi) = &mut self.mpi {
            let g = &self.group;
            g.in_mpi(|| {
                g.with_published(|shared| {
                    shared.resize(buf.len(), 0.0);
                    mpi.broadcast_f32(shared, root / k, OP);
                })
            });
        }
        self.group.wait(local, OP);
        self.group.read_published(local, OP, buf);
        Ok(())
    }

    fn all_reduce_avg(&mut self, buf: &mut [f32]) -> Result<()> {
        let (g, mpi) = (&self.group, self.mpi.as_mut());
        let gathered = &mut self.gathered_f32;
        sum(g, &g.f32s, self.local, (&*buf, gathered), mpi, GRADIENTS);
        let inv = 1.0 / self.size as f32;
        g.copy_out(&g.f32s, self.local, GRADIENTS, buf, |v| v * inv);
        Ok(())
    }

    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
        const OP: &str = "score sum";
        let (g, mpi) = (&self.group, self.mpi.as_mut());
        sum(
            g,
            &g.f64s,
            self.local,
            (&*buf, &mut self.gathered_f64),
            mpi,
            OP,
        );
        g.copy_out(&g.f64s, self.local, OP, buf, |v| v);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        const OP: &str = "barrier";
        self.group.wait(self.local, OP);
        if let Some(mpi) = &mut self.mpi {
            self.group.in_mpi(|| mpi.barrier(OP));
        }
        self.group.wait(self.local, OP);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on `k` local replicas of a single process and returns their results in order.
    fn on_replicas<R: Send + 'static>(
        k: usize,
        f: impl Fn(CpuComm) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let group = Arc::new(LocalGroup::new(k));
        let f = Arc::new(f);
        let handles: Vec<_> = (0..k)
            .map(|i| {
                let (g, f) = (group.clone(), f.clone());
                std::thread::spawn(move || f(CpuComm::new(g, i, 0, 1, None)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn average_and_broadcast_over_local_replicas() {
        let out = on_replicas(4, |mut c| {
            let r = c.rank() as f32;
            let mut g = vec![r, 2.0 * r, 1.0];
            c.all_reduce_avg(&mut g).unwrap();
            let mut w = vec![r; 5];
            c.broadcast(&mut w, 2).unwrap();
            let mut s = vec![c.rank() as f64, 1.0];
            c.all_reduce_sum_f64(&mut s).unwrap();
            c.barrier().unwrap();
            (g, w, s)
        });
        for (g, w, s) in out {
            assert_eq!(g, vec![1.5, 3.0, 1.0]);
            assert_eq!(w, vec![2.0; 5]);
            assert_eq!(s, vec![6.0, 4.0]);
        }
    }

    #[test]
    fn buffers_shorter_than_the_replica_count() {
        let out = on_replicas(3, |mut c| {
            let mut g = vec![c.rank() as f32 * 3.0];
            c.all_reduce_avg(&mut g).unwrap();
            g
        });
        assert!(out.iter().all(|g| g == &vec![3.0]));
    }
}
