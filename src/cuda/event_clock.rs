//! `EventClock`: the device time of labelled stretches of work on the compute stream, from a pair
//! of timing events around each — [`PhaseClock`], the phases of a training step (data copy,
//! forward, backward, exposed all-reduce, update), and the net's per-layer clock, each layer's
//! forward and backward (`timeline::Name`; a fused chain is timed as one, at the layer that runs
//! it). Off by default: `p2ptrain bench` turns the phase clock on, a timeline (`train
//! --timeline`) and `bench --layers` both. An event pair is cheap beside the kernels but not
//! free, so `bench` times the step without the per-layer one. Reading a clock synchronises.

use super::{gpu_error, Gpu};
use crate::error::Result;
use crate::spans::Step;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;

/// Event pairs per labelled stretch `K`, in the order they were enqueued; `None` while off.
pub struct EventClock<K> {
    marks: Option<Vec<(K, CudaEvent, CudaEvent)>>,
}

/// The step phases' clock.
pub type PhaseClock = EventClock<Step>;

impl<K> Default for EventClock<K> {
    fn default() -> Self {
        EventClock { marks: None }
    }
}

impl<K: Copy> EventClock<K> {
    /// Starts or stops recording; forgets what was recorded.
    pub fn set(&mut self, on: bool) {
        self.marks = on.then(Vec::new);
    }

    /// Records a timing event on the compute stream.
    pub fn event(gpu: &Gpu) -> Result<CudaEvent> {
        gpu.compute
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu_error("record a timing event", e))
    }

    /// Runs `f`, which enqueues the work of `what` on the compute stream, between two events when
    /// recording.
    pub fn time<T>(&mut self, gpu: &Gpu, what: K, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let Some(marks) = &mut self.marks else {
            return f();
        };
        let start = Self::event(gpu)?;
        let r = f()?;
        let end = Self::event(gpu)?;
        marks.push((what, start, end));
        Ok(r)
    }

    /// Each recorded stretch as (label, start, duration) in milliseconds, the start measured from
    /// `zero` (an earlier event of the compute stream); clears the record and keeps recording.
    pub fn spans(&mut self, zero: &CudaEvent) -> Result<Vec<(K, f64, f64)>> {
        self.drain()
            .map(|(what, start, end)| {
                Ok((what, elapsed_ms(zero, &start)?, elapsed_ms(&start, &end)?))
            })
            .collect()
    }

    fn drain(&mut self) -> impl Iterator<Item = (K, CudaEvent, CudaEvent)> + '_ {
        self.marks.iter_mut().flat_map(|m| m.drain(..))
    }
}

impl PhaseClock {
    /// Seconds per phase (in `Step::ALL` order) since recording started; clears the record.
    pub fn seconds(&mut self) -> Result<[f64; 5]> {
        let mut out = [0.0; 5];
        for (phase, start, end) in self.drain() {
            out[phase as usize] += elapsed_ms(&start, &end)? / 1e3;
        }
        Ok(out)
    }
}

/// Milliseconds from event `a` to event `b`; waits for `b`.
fn elapsed_ms(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    a.elapsed_ms(b)
        .map(|ms| ms as f64)
        .map_err(|e| gpu_error("read a timing event", e))
}
