//! `EventClock`: the device time of labelled stretches of work on a stream, from a pair of timing
//! events around each — [`PhaseClock`], the phases of a training step (data copy, forward,
//! backward, exposed all-reduce, update), the net's per-layer clock, each layer's forward and
//! backward (`timeline::Name`; a fused chain is timed as one, at the layer that runs it), both on
//! the compute stream, and the GPU engine's bucket clock, each gradient bucket's all-reduce on
//! the communication stream ([`EventClock::time_on`]). Off by default: `p2ptrain bench` turns the
//! phase clock on, a timeline (`train --timeline`) and `bench --layers` all of them. An event
//! pair is cheap beside the kernels but not free, so `bench` times the step without the
//! per-layer one. Recording never waits for the device; reading a clock does (the timeline reads
//! once, after its window of iterations).

use super::{gpu_error, Gpu};
use crate::error::Result;
use crate::spans::Step;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

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
        Self::event_on(&gpu.compute)
    }

    /// Records a timing event on `stream`.
    fn event_on(stream: &CudaStream) -> Result<CudaEvent> {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu_error("record a timing event", e))
    }

    /// Runs `f`, which enqueues the work of `what` on the compute stream, between two events when
    /// recording.
    pub fn time<T>(&mut self, gpu: &Gpu, what: K, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.time_on(&gpu.compute, what, f)
    }

    /// [`Self::time`] for work that `f` enqueues on `stream` (a stream of the same device as the
    /// event the spans are measured from).
    pub fn time_on<T>(
        &mut self,
        stream: &CudaStream,
        what: K,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let Some(marks) = &mut self.marks else {
            return f();
        };
        let start = Self::event_on(stream)?;
        let r = f()?;
        let end = Self::event_on(stream)?;
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
