//! Communication between replicas: the `Communicator` seam (broadcast, all-reduce-average, sums of
//! scores, barrier) that every replica thread talks through, its CPU implementation (local threads
//! reduce through shared memory, one thread per process talks to MPI), the MPI bootstrap, and the
//! deadline and heartbeat that keep every wait bounded.
//!
//! Universal rank of a replica = MPI rank × replicas_per_rank + local index.

pub mod abort_hooks;
pub mod bootstrap;
pub mod cpu;
pub mod deadline;
pub mod heartbeat;
pub mod launch_env;
pub mod local;
pub mod mpi_link;
pub mod nodes;
pub mod wire;

pub use bootstrap::Bootstrap;
pub use cpu::CpuComm;

use crate::error::Result;

/// Collective operations over all replicas of the job. Every replica must call the same
/// operations in the same order with buffers of the same length.
pub trait Communicator {
    /// Universal rank of this replica.
    fn rank(&self) -> usize;
    /// Number of replicas in the job.
    fn size(&self) -> usize;
    /// Copies `buf` of universal rank `root` into every replica's `buf`.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()>;
    /// Replaces `buf` by the element-wise mean of all replicas' `buf`.
    fn all_reduce_avg(&mut self, buf: &mut [f32]) -> Result<()>;
    /// Replaces `buf` by the element-wise sum of all replicas' `buf` (scores, counters).
    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()>;
    /// Returns once every replica has called it.
    fn barrier(&mut self) -> Result<()>;
}
