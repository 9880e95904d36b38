//! `CommReducer`: the [`Reducer`] that layers see in `Ctx` (sync BatchNorm's per-channel sums),
//! implemented over a replica's [`Communicator`] for the duration of one pass.
//!
//! Fixed order: each replica writes its buffer `(n)` into its own slot of a zeroed `(size, n)`
//! scratch, one f64 all-reduce sum turns that into every replica's buffer everywhere (adding
//! zeros is exact, whatever order the local group or MPI adds in), and the slots are then added
//! in universal-rank order. The result is bitwise the same on every replica and for every
//! grouping of the replicas into processes. Cost: `size × n` f64 per call; BatchNorm calls it
//! with `2C + 1` values per layer and pass (forward and backward).

use crate::dist::Communicator;
use crate::error::{Error, Result};
use crate::layers::Reducer;
use std::cell::RefCell;

/// A communicator lent to the layers of one pass. Failures are kept and returned by `finish`.
pub struct CommReducer<'a> {
    comm: RefCell<&'a mut dyn Communicator>,
    scratch: RefCell<&'a mut Vec<f64>>,
    error: RefCell<Option<Error>>,
}

impl<'a> CommReducer<'a> {
    /// Lends `comm` for one pass; `scratch` is the engine's reusable buffer.
    pub fn new(comm: &'a mut dyn Communicator, scratch: &'a mut Vec<f64>) -> Self {
        CommReducer {
            comm: RefCell::new(comm),
            scratch: RefCell::new(scratch),
            error: RefCell::new(None),
        }
    }

    /// The first communication failure of the pass, if any.
    pub fn finish(self) -> Result<()> {
        match self.error.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Reducer for CommReducer<'_> {
    fn sum_f64(&self, buf: &mut [f64]) {
        if self.error.borrow().is_some() {
            return;
        }
        let mut comm = self.comm.borrow_mut();
        let (rank, size, n) = (comm.rank(), comm.size(), buf.len());
        let mut scratch = self.scratch.borrow_mut();
        scratch.clear();
        scratch.resize(size * n, 0.0);
        scratch[rank * n..(rank + 1) * n].copy_from_slice(buf);
        if let Err(e) = comm.all_reduce_sum_f64(&mut scratch[..]) {
            *self.error.borrow_mut() = Some(Error::Comm(format!(
                "replica {rank}: cross-replica statistics: {e}"
            )));
            return;
        }
        buf.fill(0.0);
        for slot in scratch.chunks_exact(n.max(1)).take(size) {
            for (b, &v) in buf.iter_mut().zip(slot) {
                *b += v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::local::LocalGroup;
    use crate::dist::CpuComm;
    use std::sync::Arc;

    /// Every replica gets the rank-ordered sum, bit for bit the same, and a value that a
    /// different order of addition would round differently comes out as rank order gives it.
    #[test]
    fn sums_in_rank_order_on_every_replica() {
        let k = 3;
        let group = Arc::new(LocalGroup::new(k));
        let values = [1.0f64, 2f64.powi(53), -(2f64.powi(53))];
        let handles: Vec<_> = (0..k)
            .map(|i| {
                let g = group.clone();
                std::thread::spawn(move || {
                    let mut comm = CpuComm::new(g, i, 0, 1, None);
                    let mut scratch = Vec::new();
                    let r = CommReducer::new(&mut comm, &mut scratch);
                    let mut buf = vec![values[i], i as f64];
                    r.sum_f64(&mut buf);
                    r.finish().unwrap();
                    buf
                })
            })
            .collect();
        for h in handles {
            // Rank order: (1 + 2^53) rounds to 2^53, minus 2^53 gives 0 (the reverse order gives 1).
            assert_eq!(h.join().unwrap(), vec![0.0, 3.0]);
        }
    }
}
