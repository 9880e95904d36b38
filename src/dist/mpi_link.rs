//! `MpiLink`: the one MPI communicator through which a process's leader replica exchanges
//! reductions and broadcasts with the other processes. Every operation is an immediate
//! (non-blocking) collective polled under the deadline of [`super::deadline`]: on expiry the
//! process names the collective and the silent ranks and aborts the job.

use super::deadline::{self, Wait};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::request::{Request, Scope};
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

/// `buf ← Σ over the processes of `comm` of buf`, sending a copy of `buf` kept in `scratch`.
fn sum_through<T: Equivalence + Copy>(
    comm: &SimpleCommunicator,
    scratch: &mut Vec<T>,
    buf: &mut [T],
    op: &str,
) {
    scratch.clear();
    scratch.extend_from_slice(buf);
    let send = &scratch[..];
    mpi::request::scope(|scope| {
        complete(
            comm.immediate_all_reduce_into(scope, send, buf, SystemOperation::sum()),
            op,
        )
    });
}

/// Polls `req` until it completes; past the deadline, reports collective `op` and aborts the job
/// (so an incomplete request is never dropped).
pub fn complete<'a, D: ?Sized, S: Scope<'a>>(mut req: Request<'a, D, S>, op: &str) {
    let mut wait = Wait::new();
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        if !wait.pause() {
            deadline::expire(op, &wait, None);
        }
    }
}

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
    /// `op` names the collective in a deadline report.
    pub fn sum_f32(&mut self, buf: &mut [f32], op: &str) {
        sum_through(&self.comm, &mut self.scratch_f32, buf, op);
    }

    /// `buf ← Σ over processes of buf`.
    pub fn sum_f64(&mut self, buf: &mut [f64], op: &str) {
        sum_through(&self.comm, &mut self.scratch_f64, buf, op);
    }

    /// Broadcasts `buf` from process `root`.
    pub fn broadcast_f32(&mut self, buf: &mut [f32], root: usize, op: &str) {
        let root = self.comm.process_at_rank(root as i32);
        mpi::request::scope(|scope| complete(root.immediate_broadcast_into(scope, buf), op));
    }

    /// Waits for every process.
    pub fn barrier(&mut self, op: &str) {
        complete(self.comm.immediate_barrier(), op);
    }
}
