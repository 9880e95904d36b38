//! `LocalGroup`: the replicas of one process reducing through shared memory.
//!
//! Each replica publishes its buffer into its own slot; after a barrier, replica `i` sums chunk `i`
//! of every slot in slot order (so the result does not depend on thread timing) into the shared
//! result; the process leader (local replica 0) may then combine the result with other processes;
//! finally every replica copies the result out. Phases are separated by barriers, so the locks
//! below are never contended; they only make the sharing safe.
//!
//! The barrier has a deadline (`[cluster] collective_timeout_s`): a replica that waits longer
//! names the local replicas that did not arrive and aborts the job — unless the leader is inside
//! an MPI collective, whose own deadline then reports the missing ranks.

use super::deadline::{self, Wait};
use std::ops::{AddAssign, Range};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::Duration;

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

/// A barrier of `k` threads whose waits time out, knowing who arrived.
struct TimedBarrier {
    state: Mutex<BarrierState>,
    turn: Condvar,
}

struct BarrierState {
    /// Which replicas have arrived in the current generation.
    arrived: Vec<bool>,
    count: usize,
    generation: u64,
}

impl TimedBarrier {
    fn new(k: usize) -> Self {
        TimedBarrier {
            state: Mutex::new(BarrierState {
                arrived: vec![false; k],
                count: 0,
                generation: 0,
            }),
            turn: Condvar::new(),
        }
    }

    /// Waits until all `k` replicas arrived, or until `limit` passed: then `Err` with the local
    /// indices of the replicas that did not arrive. `patient()` asked at expiry may extend the
    /// wait by another `limit`.
    fn wait(
        &self,
        local: usize,
        limit: Duration,
        patient: impl Fn() -> bool,
    ) -> std::result::Result<(), Vec<usize>> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let generation = s.generation;
        s.arrived[local] = true;
        s.count += 1;
        if s.count == s.arrived.len() {
            s.count = 0;
            s.arrived.iter_mut().for_each(|a| *a = false);
            s.generation += 1;
            self.turn.notify_all();
            return Ok(());
        }
        let mut wait = Wait::with_limit(limit);
        while s.generation == generation {
            let left = wait.remaining();
            if left.is_zero() {
                if patient() {
                    wait = Wait::with_limit(limit);
                    continue;
                }
                let missing = (0..s.arrived.len()).filter(|&i| !s.arrived[i]).collect();
                return Err(missing);
            }
            s = self
                .turn
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

/// The replicas of one process.
pub struct LocalGroup {
    k: usize,
    barrier: TimedBarrier,
    /// Set while the leader waits in an MPI collective (its deadline reports then).
    leader_in_mpi: AtomicBool,
    pub(crate) f32s: LocalReducer<f32>,
    pub(crate) f64s: LocalReducer<f64>,
    /// The bfloat16 gradient wire (`super::wire`): its sums round at every addition.
    pub(crate) bf16s: LocalReducer<half::bf16>,
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
            barrier: TimedBarrier::new(k),
            leader_in_mpi: AtomicBool::new(false),
            f32s: LocalReducer::new(k),
            f64s: LocalReducer::new(k),
            bf16s: LocalReducer::new(k),
        }
    }

    /// Number of local replicas.
    pub fn len(&self) -> usize {
        self.k
    }

    pub fn is_empty(&self) -> bool {
        self.k == 0
    }

    /// Waits for every local replica; `local` is the caller's index, `op` the collective (for
    /// the report when the deadline passes).
    pub fn wait(&self, local: usize, op: &str) {
        let started = Wait::new();
        let patient = || self.leader_in_mpi.load(Ordering::Relaxed);
        if let Err(missing) = self.barrier.wait(local, deadline::timeout(), patient) {
            let names: Vec<String> = missing.iter().map(|i| i.to_string()).collect();
            let what = format!(
                "local replica(s) {} of this process did not arrive (stuck in their own work)",
                names.join(", ")
            );
            deadline::expire(op, &started, Some(what));
        }
    }

    /// Runs `f` (the leader's MPI collective) with the local waits deferring to its deadline.
    pub(crate) fn in_mpi<R>(&self, f: impl FnOnce() -> R) -> R {
        self.leader_in_mpi.store(true, Ordering::Relaxed);
        let r = f();
        self.leader_in_mpi.store(false, Ordering::Relaxed);
        r
    }

    /// Sums `buf` over the local replicas into the shared result (phases 1–2). Every local
    /// replica calls it with its index; on return the result chunks hold the sum.
    pub(crate) fn reduce_into_chunks<T: Copy + Default + AddAssign>(
        &self,
        r: &LocalReducer<T>,
        local: usize,
        buf: &[T],
        op: &str,
    ) {
        {
            let mut slot = r.slots[local].write().expect("local slot poisoned");
            slot.clear();
            slot.extend_from_slice(buf);
        }
        self.wait(local, op);
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
        self.wait(local, op);
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
    pub(crate) fn copy_out<T: Copy, U>(
        &self,
        r: &LocalReducer<T>,
        local: usize,
        op: &str,
        buf: &mut [U],
        f: impl Fn(T) -> U,
    ) {
        let mut start = 0;
        for c in &r.chunks {
            let c = c.read().expect("local chunk poisoned");
            for (b, v) in buf[start..start + c.len()].iter_mut().zip(c.iter()) {
                *b = f(*v);
            }
            start += c.len();
        }
        self.wait(local, op);
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
    pub(crate) fn read_published(&self, local: usize, op: &str, buf: &mut [f32]) {
        buf.copy_from_slice(&self.f32s.slots[0].read().expect("local slot poisoned"));
        self.wait(local, op);
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
                        g.reduce_into_chunks(&g.f32s, i, &buf.clone(), "test");
                        g.copy_out(&g.f32s, i, "test", &mut buf, |v| v);
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

    #[test]
    fn a_barrier_wait_times_out_naming_who_did_not_arrive() {
        let b = TimedBarrier::new(3);
        let limit = Duration::from_millis(50);
        assert_eq!(b.wait(1, limit, || false), Err(vec![0, 2]));
        // The timed-out arrival stays counted: the two others complete the generation.
        let b = Arc::new(b);
        let other = {
            let b = b.clone();
            std::thread::spawn(move || b.wait(0, Duration::from_secs(60), || false))
        };
        assert_eq!(b.wait(2, Duration::from_secs(60), || false), Ok(()));
        assert_eq!(other.join().unwrap(), Ok(()));
    }

    #[test]
    fn a_patient_barrier_waits_past_its_limit() {
        let b = Arc::new(TimedBarrier::new(2));
        let late = {
            let b = b.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                b.wait(1, Duration::from_secs(60), || false)
            })
        };
        assert_eq!(b.wait(0, Duration::from_millis(10), || true), Ok(()));
        assert_eq!(late.join().unwrap(), Ok(()));
    }
}
