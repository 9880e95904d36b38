//! [`GpuBlob`]: an activation tensor and its gradient in device memory, row-major with the batch
//! first, `(N, ...)` — the device twin of `crate::tensor::Blob`.
//!
//! A blob is allocated for the largest batch it has held; a smaller batch changes only its
//! logical shape, so changing the batch between train and test passes allocates nothing.

use super::{gpu_error, Gpu};
use crate::error::Result;
use crate::tensor::Blob;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

/// Data and diff of one activation on the device, each at least `count()` floats.
#[derive(Debug)]
pub struct GpuBlob {
    /// The logical shape `(N, ...)`; a scalar (a loss) has shape `[]` and one element.
    pub shape: Vec<usize>,
    /// `(capacity)` floats; the first `count()` are the blob's.
    pub data: CudaSlice<f32>,
    /// `(capacity)` floats; the first `count()` are the blob's gradient.
    pub diff: CudaSlice<f32>,
}

impl GpuBlob {
    /// A zeroed blob of `shape`, with room for `capacity` elements (at least its count).
    pub fn new(gpu: &Gpu, shape: &[usize], capacity: usize) -> Result<GpuBlob> {
        let count: usize = shape.iter().product();
        let cap = capacity.max(count).max(1);
        let alloc = || {
            gpu.compute
                .alloc_zeros::<f32>(cap)
                .map_err(|e| gpu_error(&format!("allocate a blob of {cap} floats"), e))
        };
        Ok(GpuBlob {
            shape: shape.to_vec(),
            data: alloc()?,
            diff: alloc()?,
        })
    }

    /// A device copy of a host blob (data and diff).
    pub fn from_host(gpu: &Gpu, blob: &Blob) -> Result<GpuBlob> {
        let mut b = GpuBlob::new(gpu, &blob.shape, blob.count())?;
        let n = blob.count();
        gpu.compute
            .memcpy_htod(&blob.data[..n], &mut b.data.slice_mut(..n))
            .map_err(|e| gpu_error("copy a blob to the device", e))?;
        gpu.compute
            .memcpy_htod(&blob.diff[..n], &mut b.diff.slice_mut(..n))
            .map_err(|e| gpu_error("copy a blob's diff to the device", e))?;
        Ok(b)
    }

    /// A host copy (data and diff of the logical shape). Synchronises with the compute stream.
    pub fn to_host(&self, gpu: &Gpu) -> Result<Blob> {
        let n = self.count();
        let mut b = Blob::new(&self.shape);
        // Waited for first: a copy into pageable memory blocks without a deadline.
        gpu.synchronize()?;
        gpu.compute
            .memcpy_dtoh(&self.data.slice(..n), &mut b.data[..])
            .map_err(|e| gpu_error("copy a blob to the host", e))?;
        gpu.compute
            .memcpy_dtoh(&self.diff.slice(..n), &mut b.diff[..])
            .map_err(|e| gpu_error("copy a blob's diff to the host", e))?;
        gpu.synchronize()?;
        Ok(b)
    }

    /// Number of elements of the logical shape.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements the allocation holds.
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    /// Changes the logical shape. Reallocates (zeroed) only when the new count exceeds the
    /// capacity; contents are unspecified afterwards either way.
    pub fn reshape(&mut self, gpu: &Gpu, shape: &[usize]) -> Result<()> {
        let count: usize = shape.iter().product();
        if count > self.capacity() {
            *self = GpuBlob::new(gpu, shape, count)?;
        } else {
            self.shape = shape.to_vec();
        }
        Ok(())
    }

    /// The data of the logical shape, `(count)`.
    pub fn data(&self) -> CudaView<'_, f32> {
        self.data.slice(..self.count())
    }

    /// The data of the logical shape, writable.
    pub fn data_mut(&mut self) -> CudaViewMut<'_, f32> {
        let n = self.count();
        self.data.slice_mut(..n)
    }

    /// The gradient of the logical shape, `(count)`.
    pub fn diff(&self) -> CudaView<'_, f32> {
        self.diff.slice(..self.count())
    }

    /// The gradient of the logical shape, writable.
    pub fn diff_mut(&mut self) -> CudaViewMut<'_, f32> {
        let n = self.count();
        self.diff.slice_mut(..n)
    }
}
