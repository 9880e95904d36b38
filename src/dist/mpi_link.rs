//! `MpiLink`: the one MPI communicator through which a process's leader replica exchanges
//! reductions and broadcasts with the other processes. Every operation is an immediate
//! (non-blocking) collective polled under the deadline of [`super::deadline`]: on expiry the
//! process names the collective and the silent ranks and aborts the job.

use super::deadline::{self, Wait};
use half::bf16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation, UserOperation};
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator as _, SimpleCommunicator};

/// A duplicate of `MPI_COMM_WORLD` owned by the leader replica thread of a process.
pub struct MpiLink {
    comm: SimpleCommunicator,
    scratch_f32: Vec<f32>,
    scratch_f64: Vec<f64>,
    scratch_u16: Vec<u16>,
}

// SAFETY: `SimpleCommunicator` is a handle that MPI allows any thread to use once the library
// was initialised with `MPI_THREAD_SERIALIZED` or higher, which `Bootstrap::init` checks. The link
// moves to the leader thread once and only that thread calls MPI through it.
unsafe impl Send for MpiLink {}

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
            scratch_u16: Vec::new(),
        }
    }

    /// Number of processes.
    pub fn size(&self) -> usize {
        self.comm.size() as usize
    }

    /// `buf ← Σ over processes of buf` (MPI has no in-place all-reduce here: one scratch copy).
    /// `op` names the collective in a deadline report.
    pub fn sum_f32(&mut self, buf: &mut [f32], op: &str) {
        self.scratch_f32.clear();
        self.scratch_f32.extend_from_slice(buf);
        let (comm, send) = (&self.comm, &self.scratch_f32[..]);
        mpi::request::scope(|scope| {
            complete(
                comm.immediate_all_reduce_into(scope, send, buf, SystemOperation::sum()),
                op,
            )
        });
    }

    /// `buf ← Σ over processes of buf`.
    pub fn sum_f64(&mut self, buf: &mut [f64], op: &str) {
        self.scratch_f64.clear();
        self.scratch_f64.extend_from_slice(buf);
        let (comm, send) = (&self.comm, &self.scratch_f64[..]);
        mpi::request::scope(|scope| {
            complete(
                comm.immediate_all_reduce_into(scope, send, buf, SystemOperation::sum()),
                op,
            )
        });
    }

    /// `buf ← Σ over processes of buf` in bfloat16 (the gradient wire, `super::wire`): 2 bytes
    /// an element on the wire, every addition rounded as NCCL's bfloat16 sum rounds it (an MPI
    /// operation of its own over the values' bits; MPI has no bfloat16 type).
    pub fn sum_bf16(&mut self, buf: &mut [bf16], op: &str) {
        let add = UserOperation::commutative(|x, y| {
            let x = x
                .downcast::<u16>()
                .expect("the bfloat16 sum runs on 16-bit words");
            let y = y
                .downcast::<u16>()
                .expect("the bfloat16 sum runs on 16-bit words");
            super::wire::add_into(x.reinterpret_cast(), y.reinterpret_cast_mut());
        });
        self.scratch_u16.clear();
        self.scratch_u16.extend_from_slice(buf.reinterpret_cast());
        let (comm, send) = (&self.comm, &self.scratch_u16[..]);
        let recv = buf.reinterpret_cast_mut();
        mpi::request::scope(|scope| {
            complete(comm.immediate_all_reduce_into(scope, send, recv, &add), op)
        });
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
