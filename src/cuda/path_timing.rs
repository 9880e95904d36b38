//! Median device times of alternative ways to compute the same thing on one stream — cuDNN's
//! candidate algorithms and the project's own convolution kernels — for the `measured` choices
//! of [`crate::cuda::cudnn`] and the convolution layer.
//!
//! The alternatives take turns, run by run, after one untimed run of each: a clock still rising
//! from idle, or another stream's work, weighs on all of them alike, where timing one after the
//! other favoured whichever ran last. Each alternative's median device time of [`TIMED_RUNS`]
//! runs, each timed on its own by a pair of events, keeps one slow run from deciding.
//!
//! Each run waits on the device behind [`Kernels::hold_stream`] while the host enqueues it, so
//! that its device time is the device's alone (a run that the device began before the host had
//! enqueued all of it is timed again behind a hold twice as long); the host's time to enqueue
//! it is measured on its own, and the least of the runs is kept: the host's noise (a thread
//! descheduled, cold caches) only ever adds to it. Its median had ranged over 0.05–0.11 ms for
//! one cuDNN call in five runs of one binary, and the run where it passed the 0.106 ms of device
//! time of a kernel twice as slow on the device chose that kernel (cifar10_quick's conv3
//! forward, 0.045 ms of device time on cuDNN). A path costs a step the larger of the two ([`PathTime::cost_ms`]):
//! with the host running ahead (large batches) its device time, but where the host is what
//! the device waits on (small batches), a path of several launches with host-side set-up
//! (cuDNN's FFT algorithms) can cost more host time than device time. Timed simply as it was
//! enqueued, a path counted a mix of the two.

use super::gpu_error;
use super::kernels::Kernels;
use crate::error::Result;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use std::sync::Arc;
use std::time::Instant;

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

/// One alternative's median device time and least host time over its timed runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathTime {
    /// Milliseconds of device time from its first launch to the end of its last.
    pub device_ms: f32,
    /// Milliseconds the host took to enqueue it.
    pub host_ms: f32,
}

impl PathTime {
    /// What the path costs a step: the larger of its device and host times.
    pub fn cost_ms(&self) -> f32 {
        self.device_ms.max(self.host_ms)
    }
}

/// The times ([`PathTime`]) of `count` alternatives, `run(i)` enqueuing alternative `i` on
/// `stream`, timed in turns, each run behind a hold of the stream by `kernels` (see the module
/// docs). Synchronises.
pub fn median_times_in_turns(
    stream: &CudaStream,
    kernels: &Kernels,
    count: usize,
    mut run: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<PathTime>> {
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
    let mut times = vec![
        (
            Vec::with_capacity(TIMED_RUNS),
            Vec::with_capacity(TIMED_RUNS)
        );
        count
    ];
    for _ in 0..TIMED_RUNS {
        for (i, (device, host)) in times.iter_mut().enumerate() {
            loop {
                kernels.hold_stream(stream, hold_ns)?;
                record(&start)?;
                let enqueue = Instant::now();
                run(i)?;
                let host_ms = enqueue.elapsed().as_secs_f32() * 1e3;
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
                device.push(
                    start
                        .elapsed_ms(&end)
                        .map_err(|e| gpu_error("read a timing event", e))?,
                );
                host.push(host_ms);
                break;
            }
        }
    }
    let median = |mut t: Vec<f32>| {
        t.sort_by(f32::total_cmp);
        t[TIMED_RUNS / 2]
    };
    let least = |t: Vec<f32>| t.into_iter().fold(f32::INFINITY, f32::min);
    Ok(times
        .into_iter()
        .map(|(device, host)| PathTime {
            device_ms: median(device),
            host_ms: least(host),
        })
        .collect())
}
