//! The GPU side of `p2ptrain bench-allreduce` ([`super`]): one replica's device buffer, stream
//! and NCCL communicator, timed between CUDA events on that stream.

use super::Endpoint;
use crate::cuda::nccl::{NcclComm, NcclId};
use crate::error::{Error, Result};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError};
use std::sync::Arc;

fn cuda(op: &str, device: usize) -> impl Fn(DriverError) -> Error + '_ {
    move |e| Error::Device(format!("CUDA {op} on device {device}: {e}"))
}

/// One GPU replica of the benchmark. Create it on the replica's thread (it holds the
/// communicator, which is not `Send`).
pub struct GpuEndpoint {
    device: usize,
    stream: Arc<CudaStream>,
    comm: NcclComm,
    buf: CudaSlice<f32>,
    start: CudaEvent,
    end: CudaEvent,
}

impl GpuEndpoint {
    /// Opens device `device` with its own stream, joins the communicator `id` as universal rank
    /// `rank` of `size`, and allocates a buffer of `max_count` floats.
    pub fn new(
        device: usize,
        rank: usize,
        size: usize,
        id: NcclId,
        max_count: usize,
    ) -> Result<Self> {
        let ctx = CudaContext::new(device).map_err(cuda("open device", device))?;
        let stream = ctx.new_stream().map_err(cuda("create a stream", device))?;
        let comm = NcclComm::from_id(stream.clone(), rank, size, id)?;
        let buf = stream
            .alloc_zeros::<f32>(max_count.max(1))
            .map_err(cuda("allocate the buffer", device))?;
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx
            .new_event(timing)
            .map_err(cuda("create an event", device))?;
        let end = ctx
            .new_event(timing)
            .map_err(cuda("create an event", device))?;
        Ok(GpuEndpoint {
            device,
            stream,
            comm,
            buf,
            start,
            end,
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda("synchronize", self.device))
    }

    /// Waits for the last all-reduce and ends the communicator cleanly (see
    /// [`NcclComm::finish`]).
    pub fn finish(self) -> Result<()> {
        self.synchronize()?;
        self.comm.finish()
    }

    /// Enqueues one all-reduce of the first `count` floats.
    fn enqueue(&mut self, count: usize) -> Result<()> {
        self.comm
            .all_reduce_avg(&mut self.buf, 0..count, &self.stream)
    }
}

impl Endpoint for GpuEndpoint {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn load(&mut self, values: &[f32]) -> Result<()> {
        self.stream
            .memcpy_htod(values, &mut self.buf.slice_mut(..values.len()))
            .map_err(cuda("copy to device", self.device))?;
        self.synchronize()
    }

    fn all_reduce(&mut self, count: usize) -> Result<()> {
        self.enqueue(count)?;
        self.synchronize()?;
        self.comm.check()
    }

    fn read(&mut self, out: &mut [f32]) -> Result<()> {
        self.stream
            .memcpy_dtoh(&self.buf.slice(..out.len()), out)
            .map_err(cuda("copy to host", self.device))?;
        self.synchronize()
    }

    fn time(&mut self, count: usize, warmup: usize, iters: usize) -> Result<f64> {
        for _ in 0..warmup {
            self.enqueue(count)?;
        }
        self.synchronize()?;
        // A barrier: a synchronising NCCL sum returns once every replica has joined it.
        self.comm.sum_f64(&mut [0.0])?;
        self.start
            .record(&self.stream)
            .map_err(cuda("record an event", self.device))?;
        for _ in 0..iters {
            self.enqueue(count)?;
        }
        self.end
            .record(&self.stream)
            .map_err(cuda("record an event", self.device))?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(cuda("read the events", self.device))?;
        self.comm.check()?;
        Ok(f64::from(ms) * 1e-3 / iters.max(1) as f64)
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<()> {
        self.comm.sum_f64(values)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{sizes, sweep};
    use super::*;
    use crate::cuda::test_util::skip_loudly;

    /// The whole check-then-time sweep on one GPU (a communicator of one).
    #[test]
    fn sweep_on_one_gpu() {
        if !(crate::cuda::available() && crate::cuda::nccl::nccl_available()) {
            let name = format!("{}::sweep_on_one_gpu", module_path!());
            skip_loudly(&format!("SKIPPED (no CUDA device or no NCCL): {name}"));
            return;
        }
        let sizes = sizes(4, 1 << 20, 8).unwrap();
        let mut ep = GpuEndpoint::new(0, 0, 1, NcclId::new().unwrap(), 1 << 18).unwrap();
        let s = sweep(&mut ep, &sizes, 1, 3).unwrap();
        assert_eq!(s.wrong, None);
        assert_eq!(s.rows.len(), sizes.len());
        assert!(s.rows.iter().all(|r| r.seconds > 0.0));
        ep.finish().unwrap();
    }
}
