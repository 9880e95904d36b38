//! `MpiLink`: the one MPI communicator through which a process's leader replica exchanges
//! reductions and broadcasts with the other processes.

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::topology::{Communicator as _, SimpleCommunicator};

/// A duplicate of `MPI_COMM_WORLD` owned by the leader replica thread of a process.
pub struct MpiLink {
    comm: SimpleCommunicator,
    scratch_f32: Vec<f32>,
    scratch_f64: Vec<f64>,
}

// SAFETY: `SimpleCommunicator` is a handle that MPI allows any thread to use once the library
// was initialised with `MPI_THREAD_SERIALIZED` or higher, which `Bootstrap::init` checks. The link
// moves to the leader thread once and only that thread calls MPI through it.
unsafe impl Send for MpiLink {}

impl MpiLink {
    pub fn new(comm: SimpleCommunicator) -> Self {
        MpiLink {
            comm,
            scratch_f32: Vec::new(),
            scratch_f64: Vec::new(),
        }
    }

    /// Number of processes.
    pub fn size(&self) -> usize {
        self.comm.size() as usize
    }

    /// `buf ← Σ over processes of buf` (MPI has no in-place all-reduce here: one scratch copy).
    pub fn sum_f32(&mut self, buf: &mut [f32]) {
        self.scratch_f32.clear();
        self.scratch_f32.extend_from_slice(buf);
        self.comm
            .all_reduce_into(&self.scratch_f32[..], buf, SystemOperation::sum());
    }

    /// `buf ← Σ over processes of buf`.
    pub fn sum_f64(&mut self, buf: &mut [f64]) {
        self.scratch_f64.clear();
        self.scratch_f64.extend_from_slice(buf);
        self.comm
            .all_reduce_into(&self.scratch_f64[..], buf, SystemOperation::sum());
    }

    /// Broadcasts `buf` from process `root`.
    pub fn broadcast_f32(&mut self, buf: &mut [f32], root: usize) {
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
    }

    pub fn barrier(&mut self) {
        self.comm.barrier();
    }
}
