//! `LocalGroup`: the replicas of one process reducing through shared memory.
//!
//! Each replica publishes its buffer into its own slot; after a barrier, replica `i` sums chunk `i`
//! of every slot in slot order (so the result does not depend on thread timing) into the shared
//! result; the process leader (local replica 0) may then combine the result with other processes;
//! finally every replica copies the result out. Phases are separated by barriers, so the locks
//! below are never contended; they only make the sharing safe.

use std::ops::{AddAssign, Range};
use std::sync::{Barrier, RwLock};

/// Shared buffers of one element type for `k` local replicas.
pub struct LocalReducer<T> {
    slots: Vec<RwLock<Vec<T>>>,
    /// Result, one chunk per replica so that chunks are written in parallel.
    chunks: Vec<RwLock<Vec<T>>>,
}

impl<T: Copy + Default + AddAssign> LocalReducer<T> {
    fn new(k: usize) -> Self {
        LocalReducer {
            slots: (0..k).map(|_| RwLock::new(Vec::new())).collect(),
            chunks: (0..k).map(|_| RwLock::new(Vec::new())).collect(),
        }
    }
}

/// The replicas of one process.
pub struct LocalGroup {
    k: usize,
    barrier: Barrier,
    pub(crate) f32s: LocalReducer<f32>,
    pub(crate) f64s: LocalReducer<f64>,
}

/// The chunk of `0..n` that replica `i` of `k` reduces.
pub fn chunk(n: usize, i: usize, k: usize) -> Range<usize> {
    let base = n / k;
    let extra = n % k;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

impl LocalGroup {
    /// A group of `k` replicas.
    pub fn new(k: usize) -> Self {
        LocalGroup {
            k,
            barrier: Barrier::new(k),
            f32s: LocalReducer::new(k),
            f64s: LocalReducer::new(k),
        }
    }

    /// Number of local replicas.
    pub fn len(&self) -> usize {
        self.k
    }

    pub fn is_empty(&self) -> bool {
        self.k == 0
    }

    /// Waits for every local replica.
    pub fn wait(&self) {
        self.barrier.wait();
    }

    /// Sums `buf` over the local replicas into the shared result (phases 1–2). Every local
    /// replica calls it with its index; on return the result chunks hold the sum.
    pub(crate) fn reduce_into_chunks<T: Copy + Default + AddAssign>(
        &self,
        r: &LocalReducer<T>,
        local: usize,
        buf: &[T],
    ) {
        {
            let mut slot = r.slots[local].write().expect("local slot poisoned");
            slot.clear();
            slot.extend_from_slice(buf);
        }
        self.wait();
        let range = chunk(buf.len(), local, self.k);
        {
            let mut out = r.chunks[local].write().expect("local chunk poisoned");
            out.clear();
            out.extend_from_slice(&r.slots[0].read().expect("local slot poisoned")[range.clone()]);
            for slot in &r.slots[1..] {
                let slot = slot.read().expect("local slot poisoned");
                for (o, v) in out.iter_mut().zip(&slot[range.clone()]) {
                    *o += *v;
                }
            }
        }
        self.wait();
    }

    /// Gives the leader the whole result as one vector (for a cross-process reduction).
    pub(crate) fn gather_chunks<T: Copy>(&self, r: &LocalReducer<T>, out: &mut Vec<T>) {
        out.clear();
        for c in &r.chunks {
            out.extend_from_slice(&c.read().expect("local chunk poisoned"));
        }
    }

    /// The leader writes the combined result back into the chunks.
    pub(crate) fn scatter_chunks<T: Copy>(&self, r: &LocalReducer<T>, from: &[T]) {
        let mut start = 0;
        for c in &r.chunks {
            let mut c = c.write().expect("local chunk poisoned");
            let len = c.len();
            c.copy_from_slice(&from[start..start + len]);
            start += len;
        }
    }

    /// Copies the result out into `buf`, mapping each element through `f` (phase 4), then waits
    /// so that the shared buffers may be reused.
    pub(crate) fn copy_out<T: Copy>(&self, r: &LocalReducer<T>, buf: &mut [T], f: impl Fn(T) -> T) {
        let mut start = 0;
        for c in &r.chunks {
            let c = c.read().expect("local chunk poisoned");
            for (b, v) in buf[start..start + c.len()].iter_mut().zip(c.iter()) {
                *b = f(*v);
            }
            start += c.len();
        }
        self.wait();
    }

    /// Replica `local` (the root) publishes `buf` in slot 0 of the f32 buffers; others wait.
    pub(crate) fn publish(&self, buf: &[f32]) {
        let mut slot = self.f32s.slots[0].write().expect("local slot poisoned");
        slot.clear();
        slot.extend_from_slice(buf);
    }

    /// Runs `f` on the published buffer (slot 0), e.g. to broadcast it across processes.
    pub(crate) fn with_published(&self, f: impl FnOnce(&mut Vec<f32>)) {
        f(&mut self.f32s.slots[0].write().expect("local slot poisoned"));
    }

    /// Copies the published buffer into `buf`, then waits so that slot 0 may be reused.
    pub(crate) fn read_published(&self, buf: &mut [f32]) {
        buf.copy_from_slice(&self.f32s.slots[0].read().expect("local slot poisoned"));
        self.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn chunks_cover_exactly_once() {
        for n in [0, 1, 5, 17, 100] {
            for k in 1..6 {
                let mut next = 0;
                for i in 0..k {
                    let c = chunk(n, i, k);
                    assert_eq!(c.start, next);
                    next = c.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn local_sum_is_in_slot_order_and_reaches_everyone() {
        let k = 3;
        let group = Arc::new(LocalGroup::new(k));
        let handles: Vec<_> = (0..k)
            .map(|i| {
                let g = group.clone();
                std::thread::spawn(move || {
                    let mut buf: Vec<f32> = (0..10).map(|j| (i * 100 + j) as f32).collect();
                    for _ in 0..3 {
                        g.reduce_into_chunks(&g.f32s, i, &buf.clone());
                        g.copy_out(&g.f32s, &mut buf, |v| v);
                        let expect: Vec<f32> = (0..10).map(|j| (300 + 3 * j) as f32).collect();
                        assert_eq!(buf, expect);
                        buf = (0..10).map(|j| (i * 100 + j) as f32).collect();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
