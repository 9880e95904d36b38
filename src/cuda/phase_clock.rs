//! `PhaseClock`: the device time of each phase of a training step (data copy, forward, backward,
//! exposed all-reduce, update), from pairs of timing events recorded on the compute stream. Off
//! by default; `p2ptrain bench` turns it on, and so does a timeline (`spans`). Reading it
//! synchronises.

use super::{gpu_error, Gpu};
use crate::error::Result;
use crate::parallel::timing::Phase;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;

/// Event pairs per phase, summed when read.
#[derive(Default)]
pub struct PhaseClock {
    on: bool,
    marks: Vec<(Phase, CudaEvent, CudaEvent)>,
}

impl PhaseClock {
    /// Starts or stops recording; forgets what was recorded.
    pub fn set(&mut self, on: bool) {
        self.on = on;
        self.marks.clear();
    }

    /// Records a timing event on the compute stream.
    pub fn event(gpu: &Gpu) -> Result<CudaEvent> {
        gpu.compute
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu_error("record a timing event", e))
    }

    /// Runs `f`, which enqueues the work of `phase` on the compute stream, between two events.
    pub fn time<T>(&mut self, gpu: &Gpu, phase: Phase, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !self.on {
            return f();
        }
        let start = Self::event(gpu)?;
        let r = f()?;
        let end = Self::event(gpu)?;
        self.marks.push((phase, start, end));
        Ok(r)
    }

    /// Each recorded phase as (phase, start, duration) in milliseconds, the start measured from
    /// `zero` (an earlier event of the compute stream); clears the record.
    pub fn spans(&mut self, zero: &CudaEvent) -> Result<Vec<(Phase, f64, f64)>> {
        let read = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b)
                .map(|ms| ms as f64)
                .map_err(|e| gpu_error("read a timing event", e))
        };
        self.marks
            .drain(..)
            .map(|(phase, start, end)| Ok((phase, read(zero, &start)?, read(&start, &end)?)))
            .collect()
    }

    /// Seconds per phase (in `Phase::ALL` order) since recording started; clears the record.
    pub fn seconds(&mut self) -> Result<[f64; 5]> {
        let mut out = [0.0; 5];
        for (phase, start, end) in self.marks.drain(..) {
            let ms = start
                .elapsed_ms(&end)
                .map_err(|e| gpu_error("read a timing event", e))?;
            out[phase as usize] += ms as f64 / 1e3;
        }
        Ok(out)
    }
}
