//! Median device times of alternative ways to compute the same thing on one stream — cuDNN's
//! candidate algorithms and the project's own convolution kernels — for the `measured` choices
//! of [`crate::cuda::cudnn`] and the convolution layer.
//!
//! The alternatives take turns, run by run, after one untimed run of each: a clock still rising
//! from idle, or another stream's work, weighs on all of them alike, where timing one after the
//! other favoured whichever ran last. Each alternative's median of [`TIMED_RUNS`] runs, each
//! timed on its own by a pair of events, keeps one slow run from deciding.
//!
//! Each run waits on the device behind [`Kernels::hold_stream`] while the host enqueues it, so
//! that its time is the device's alone: timed as it was enqueued, a path of several launches
//! (cuDNN's FFT algorithms, several kernels and their host-side set-up) also counted the host's
//! time between its launches, which inside a training step, with the host running ahead, it
//! does not cost. A run that the device began before the host had enqueued all of it is timed
//! again behind a hold twice as long.

use super::gpu_error;
use super::kernels::Kernels;
use crate::error::Result;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use std::sync::Arc;

/// Timed runs of each alternative.
pub const TIMED_RUNS: usize = 5;

/// The first hold ahead of a timed run, and the longest (nanoseconds of device time).
const HOLD_NS: (u64, u64) = (100_000, 12_800_000);

/// `n` zeroed floats (at least one) on `stream`: a scratch operand to time the alternatives on.
pub fn zeroed_floats(stream: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<f32>> {
    stream
        .alloc_zeros::<f32>(n.max(1))
        .map_err(|e| gpu_error("allocate a buffer to time alternative paths", e))
}

/// Median milliseconds of `count` alternatives, `run(i)` enqueuing alternative `i` on `stream`,
/// timed in turns, each run behind a hold of the stream by `kernels` (see the module docs).
/// Synchronises.
pub fn median_ms_in_turns(
    stream: &CudaStream,
    kernels: &Kernels,
    count: usize,
    mut run: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<f32>> {
    let event = || {
        stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu_error("create a timing event", e))
    };
    let record = |e: &CudaEvent| {
        e.record(stream)
            .map_err(|e| gpu_error("record a timing event", e))
    };
    for i in 0..count {
        run(i)?;
    }
    let (start, end) = (event()?, event()?);
    let mut hold_ns = HOLD_NS.0;
    let mut times = vec![Vec::with_capacity(TIMED_RUNS); count];
    for _ in 0..TIMED_RUNS {
        for (i, alternative) in times.iter_mut().enumerate() {
            loop {
                kernels.hold_stream(stream, hold_ns)?;
                record(&start)?;
                run(i)?;
                record(&end)?;
                // Already started: the device may have waited on the host within the run.
                let raced = start
                    .try_is_complete()
                    .map_err(|e| gpu_error("query a timing event", e))?;
                end.synchronize()
                    .map_err(|e| gpu_error("wait for a timing event", e))?;
                if raced && hold_ns < HOLD_NS.1 {
                    hold_ns *= 2;
                    continue;
                }
                alternative.push(
                    start
                        .elapsed_ms(&end)
                        .map_err(|e| gpu_error("read a timing event", e))?,
                );
                break;
            }
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f32::total_cmp);
            t[TIMED_RUNS / 2]
        })
        .collect())
}
