//! `LayerClock`: the device time of each layer's forward and backward, from a pair of timing
//! events recorded on the compute stream around each layer's work (a fused chain is timed as one,
//! at the layer that runs it). Off by default; a timeline (`train --timeline`) and
//! `bench --layers` turn it on. An event pair per layer and pass is cheap beside the kernels but
//! not free, so `bench` times the step without it. Reading it synchronises.

use super::phase_clock::PhaseClock;
use super::{gpu_error, Gpu};
use crate::error::Result;
use crate::parallel::timeline::Name;
use cudarc::driver::CudaEvent;

/// Event pairs per layer pass, in the order they were enqueued; `None` while off.
#[derive(Default)]
pub struct LayerClock {
    marks: Option<Vec<(Name, CudaEvent, CudaEvent)>>,
}

impl LayerClock {
    /// Starts or stops recording; forgets what was recorded.
    pub fn set(&mut self, on: bool) {
        self.marks = on.then(Vec::new);
    }

    /// Runs `f`, which enqueues the work of `pass` (`Name::Forward(i)` or `Name::Backward(i)`)
    /// on the compute stream, between two events when recording.
    pub fn time<T>(&mut self, gpu: &Gpu, pass: Name, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let Some(marks) = &mut self.marks else {
            return f();
        };
        let start = PhaseClock::event(gpu)?;
        let r = f()?;
        let end = PhaseClock::event(gpu)?;
        marks.push((pass, start, end));
        Ok(r)
    }

    /// Each recorded pass as (name, start, duration) in milliseconds, the start measured from
    /// `zero` (an earlier event of the compute stream); clears the record and keeps recording.
    pub fn spans(&mut self, zero: &CudaEvent) -> Result<Vec<(Name, f64, f64)>> {
        let Some(marks) = &mut self.marks else {
            return Ok(Vec::new());
        };
        let read = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b)
                .map(|ms| ms as f64)
                .map_err(|e| gpu_error("read a timing event", e))
        };
        marks
            .drain(..)
            .map(|(name, start, end)| Ok((name, read(zero, &start)?, read(&start, &end)?)))
            .collect()
    }
}
