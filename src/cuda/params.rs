//! [`GpuParams`]: every learnable tensor of a replica in one contiguous device allocation for the
//! data and one for the gradient, in the layout of `crate::params::Params` (tensors in layer
//! order, so a layer's tensors form one span), so that a broadcast or an all-reduce is one call
//! over one buffer and a layer's gradient is one contiguous range.
//!
//! Host copies go through pageable memory: a host-to-device copy returns once the driver has
//! staged the host buffer (so the caller may reuse it at once), a device-to-host copy once it
//! has completed; both are rare (start, snapshots, tests).
//!
//! The data is written only through [`GpuParams::data_mut`] and its siblings, which move
//! [`GpuParams::version`]: mixed precision keeps copies of the weights and tells by the version
//! whether they still hold what the data holds (`crate::cuda::net`).

use super::{gpu_error, Gpu};
use crate::error::{Error, Result};
use crate::params::{ParamSpan, Params};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use std::ops::Range;

/// Flat parameter and gradient buffers of one replica on its device.
#[derive(Debug)]
pub struct GpuParams {
    /// `(len)` learnable floats (at least one element is allocated, so `data.len()` may exceed
    /// [`GpuParams::len`] for a net without learnable tensors).
    data: CudaSlice<f32>,
    /// `(len)` gradient floats, same layout.
    pub diff: CudaSlice<f32>,
    /// Where each tensor lives, as laid out by `Params::new`.
    pub spans: Vec<ParamSpan>,
    len: usize,
    /// Moved by every writable borrow of `data`.
    version: u64,
}

impl GpuParams {
    /// Zeroed buffers for `spans`, whose offsets and lengths must already be laid out
    /// (as `Params::new` does).
    pub fn new(gpu: &Gpu, spans: Vec<ParamSpan>) -> Result<GpuParams> {
        let len = spans.last().map_or(0, |s| s.offset + s.len);
        let alloc = |what: &str| {
            gpu.compute
                .alloc_zeros::<f32>(len.max(1))
                .map_err(|e| gpu_error(&format!("allocate the {what} of {len} parameters"), e))
        };
        Ok(GpuParams {
            data: alloc("data")?,
            diff: alloc("gradient")?,
            spans,
            len,
            version: 0,
        })
    }

    /// A device copy of `params` (data and diff).
    pub fn from_host(gpu: &Gpu, params: &Params) -> Result<GpuParams> {
        let mut p = GpuParams::new(gpu, params.spans.clone())?;
        p.copy_from_host(gpu, params)?;
        Ok(p)
    }

    /// Number of learnable floats.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Indices into `spans` of the tensors of `layer`.
    pub fn layer_spans(&self, layer: usize) -> Range<usize> {
        crate::params::layer_spans(&self.spans, layer)
    }

    /// The flat range covered by the tensors of `layer` (empty if it has none).
    pub fn layer_range(&self, layer: usize) -> Range<usize> {
        crate::params::layer_range(&self.spans, layer)
    }

    /// The `(len)` learnable floats (the buffer may hold more, see the field).
    pub fn data(&self) -> &CudaSlice<f32> {
        &self.data
    }

    /// The learnable floats, writable; moves [`GpuParams::version`].
    pub fn data_mut(&mut self) -> &mut CudaSlice<f32> {
        self.version += 1;
        &mut self.data
    }

    /// The learnable floats and their gradient, both writable (an update step); moves
    /// [`GpuParams::version`].
    pub fn data_and_diff_mut(&mut self) -> (&mut CudaSlice<f32>, &mut CudaSlice<f32>) {
        self.version += 1;
        (&mut self.data, &mut self.diff)
    }

    /// The learnable floats, and their gradient writable (a backward pass).
    pub fn data_and_diff(&mut self) -> (&CudaSlice<f32>, &mut CudaSlice<f32>) {
        (&self.data, &mut self.diff)
    }

    /// A number that changes whenever the data may have been written: equal versions mean
    /// the same data.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// All `(len)` parameters.
    pub fn data_view(&self) -> CudaView<'_, f32> {
        self.data.slice(..self.len)
    }

    /// All `(len)` gradients, writable (for the all-reduce).
    pub fn diff_view_mut(&mut self) -> CudaViewMut<'_, f32> {
        self.diff.slice_mut(..self.len)
    }

    /// Zeroes the gradient (start of an iteration; backward accumulates). Enqueued on the
    /// compute stream.
    pub fn zero_grad(&mut self, gpu: &Gpu) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        gpu.compute
            .memset_zeros(&mut self.diff.slice_mut(..self.len))
            .map_err(|e| gpu_error("zero the gradient", e))
    }

    /// A host copy of data and diff. Synchronises with the compute stream.
    pub fn to_host(&self, gpu: &Gpu) -> Result<Params> {
        let mut p = Params {
            data: vec![0.0; self.len],
            diff: vec![0.0; self.len],
            spans: self.spans.clone(),
        };
        if self.len > 0 {
            // Waited for first: a copy into pageable memory blocks without a deadline.
            gpu.synchronize()?;
            gpu.compute
                .memcpy_dtoh(&self.data.slice(..self.len), &mut p.data[..])
                .map_err(|e| gpu_error("copy the parameters to the host", e))?;
            gpu.compute
                .memcpy_dtoh(&self.diff.slice(..self.len), &mut p.diff[..])
                .map_err(|e| gpu_error("copy the gradient to the host", e))?;
        }
        gpu.synchronize()?;
        Ok(p)
    }

    /// Replaces data and diff by the host's. `params` must have this layout's length; an empty
    /// `params.diff` leaves the device gradient as it is.
    pub fn copy_from_host(&mut self, gpu: &Gpu, params: &Params) -> Result<()> {
        if params.data.len() != self.len
            || !(params.diff.is_empty() || params.diff.len() == self.len)
        {
            return Err(Error::Device(format!(
                "CUDA: host parameters of {} floats (diff {}) do not fit the net's {}",
                params.data.len(),
                params.diff.len(),
                self.len
            )));
        }
        if self.len == 0 {
            return Ok(());
        }
        let len = self.len;
        gpu.compute
            .memcpy_htod(&params.data[..], &mut self.data_mut().slice_mut(..len))
            .map_err(|e| gpu_error("copy the parameters to the device", e))?;
        if !params.diff.is_empty() {
            gpu.compute
                .memcpy_htod(&params.diff[..], &mut self.diff.slice_mut(..self.len))
                .map_err(|e| gpu_error("copy the gradient to the device", e))?;
        }
        Ok(())
    }
}
