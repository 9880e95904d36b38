//! [`GpuBlob`]: an activation tensor and its gradient in device memory, row-major with the batch
//! first, `(N, ...)` — the device twin of `crate::tensor::Blob`.
//!
//! A blob is allocated for the largest batch it has held; a smaller batch changes only its
//! logical shape, so changing the batch between train and test passes allocates nothing.
//!
//! In mixed precision a blob may be stored in the half type ([`Elem::Half`]): its values and
//! gradient are then the bit patterns of [`GpuBlob::half`], and its FP32 `data` and `diff` hold one
//! unused float each, so that a layer reading a half-type blob as FP32 fails its length check
//! instead of reading garbage. Which blobs are stored so is the net's storage plan's decision
//! (`crate::cuda::net::storage`); a layer is told at build whether its blobs are.

use super::{gpu_error, Gpu};
use crate::error::Result;
use crate::precision::Half;
use crate::tensor::Blob;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

/// How a blob's values and gradient are stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    /// Bit patterns of the half type (bf16 or fp16), two bytes an element.
    Half(Half),
}

/// The half-type storage of a blob stored as [`Elem::Half`].
#[derive(Debug)]
pub struct HalfBlob {
    pub ty: Half,
    /// `(capacity)` bit patterns; the first `count()` are the blob's values.
    pub data: CudaSlice<u16>,
    /// `(capacity)` bit patterns; the first `count()` are the blob's gradient.
    pub diff: CudaSlice<u16>,
}

/// Data and diff of one activation on the device, each at least `count()` elements.
#[derive(Debug)]
pub struct GpuBlob {
    /// The logical shape `(N, ...)`; a scalar (a loss) has shape `[]` and one element.
    pub shape: Vec<usize>,
    /// `(capacity)` floats; the first `count()` are the blob's. One unused float for a
    /// half-type blob.
    pub data: CudaSlice<f32>,
    /// `(capacity)` floats; the first `count()` are the blob's gradient. One unused float for a
    /// half-type blob.
    pub diff: CudaSlice<f32>,
    /// The values and gradient of a blob stored in the half type; `None` for an FP32 blob.
    pub half: Option<HalfBlob>,
}

/// `(n)` zeroed elements of `T` on the compute stream.
fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    n: usize,
) -> Result<CudaSlice<T>> {
    gpu.compute.alloc_zeros::<T>(n).map_err(|e| {
        let bytes = n * std::mem::size_of::<T>();
        gpu_error(&format!("allocate a blob of {bytes} bytes"), e)
    })
}

impl GpuBlob {
    /// A zeroed FP32 blob of `shape`, with room for `capacity` elements (at least its count).
    pub fn new(gpu: &Gpu, shape: &[usize], capacity: usize) -> Result<GpuBlob> {
        GpuBlob::new_as(gpu, shape, capacity, Elem::F32)
    }

    /// A zeroed blob of `shape` stored as `elem`, with room for `capacity` elements (at least
    /// its count).
    pub fn new_as(gpu: &Gpu, shape: &[usize], capacity: usize, elem: Elem) -> Result<GpuBlob> {
        let count: usize = shape.iter().product();
        let cap = capacity.max(count).max(1);
        let (floats, half) = match elem {
            Elem::F32 => (cap, None),
            Elem::Half(ty) => (
                1,
                Some(HalfBlob {
                    ty,
                    data: zeros(gpu, cap)?,
                    diff: zeros(gpu, cap)?,
                }),
            ),
        };
        Ok(GpuBlob {
            shape: shape.to_vec(),
            data: zeros(gpu, floats)?,
            diff: zeros(gpu, floats)?,
            half,
        })
    }

    /// How the blob is stored.
    pub fn elem(&self) -> Elem {
        match &self.half {
            Some(h) => Elem::Half(h.ty),
            None => Elem::F32,
        }
    }

    /// The half-type storage.
    ///
    /// # Panics
    /// If the blob is stored in FP32 (a layer built for half-type blobs given FP32 ones: a bug
    /// of the storage plan).
    fn half_storage(&self) -> &HalfBlob {
        self.half
            .as_ref()
            .expect("a half-type view of a blob stored in FP32")
    }

    fn half_storage_mut(&mut self) -> &mut HalfBlob {
        self.half
            .as_mut()
            .expect("a half-type view of a blob stored in FP32")
    }

    /// The half-type values of the logical shape, `(count)` bit patterns. Panics unless the
    /// blob is stored in the half type.
    pub fn half_data(&self) -> CudaView<'_, u16> {
        self.half_storage().data.slice(..self.count())
    }

    /// [`GpuBlob::half_data`], writable.
    pub fn half_data_mut(&mut self) -> CudaViewMut<'_, u16> {
        let n = self.count();
        self.half_storage_mut().data.slice_mut(..n)
    }

    /// The half-type gradient of the logical shape, `(count)` bit patterns. Panics unless the
    /// blob is stored in the half type.
    pub fn half_diff(&self) -> CudaView<'_, u16> {
        self.half_storage().diff.slice(..self.count())
    }

    /// [`GpuBlob::half_diff`], writable.
    pub fn half_diff_mut(&mut self) -> CudaViewMut<'_, u16> {
        let n = self.count();
        self.half_storage_mut().diff.slice_mut(..n)
    }

    /// A device copy of a host blob (data and diff) stored as `elem` (rounded to a half type).
    pub fn from_host_as(gpu: &Gpu, blob: &Blob, elem: Elem) -> Result<GpuBlob> {
        let Elem::Half(ty) = elem else {
            return GpuBlob::from_host(gpu, blob);
        };
        let mut b = GpuBlob::new_as(gpu, &blob.shape, blob.count(), elem)?;
        let n = blob.count();
        let bits = |v: &[f32]| -> Vec<u16> { v[..n].iter().map(|&x| ty.bits(x)).collect() };
        let h = b.half_storage_mut();
        gpu.compute
            .memcpy_htod(&bits(&blob.data), &mut h.data.slice_mut(..n))
            .map_err(|e| gpu_error("copy a blob to the device", e))?;
        gpu.compute
            .memcpy_htod(&bits(&blob.diff), &mut h.diff.slice_mut(..n))
            .map_err(|e| gpu_error("copy a blob's diff to the device", e))?;
        Ok(b)
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

    /// A host copy (data and diff of the logical shape; half-type values widened).
    /// Synchronises with the compute stream.
    pub fn to_host(&self, gpu: &Gpu) -> Result<Blob> {
        let n = self.count();
        let mut b = Blob::new(&self.shape);
        // Waited for first: a copy into pageable memory blocks without a deadline.
        gpu.synchronize()?;
        if let Some(h) = &self.half {
            let widened = |bits: &CudaSlice<u16>, what: &str| -> Result<Vec<f32>> {
                let bits = gpu
                    .compute
                    .clone_dtoh(&bits.slice(..n))
                    .map_err(|e| gpu_error(what, e))?;
                Ok(bits.into_iter().map(|v| h.ty.widen(v)).collect())
            };
            b.data = widened(&h.data, "copy a blob to the host")?;
            b.diff = widened(&h.diff, "copy a blob's diff to the host")?;
            gpu.synchronize()?;
            return Ok(b);
        }
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
        match &self.half {
            Some(h) => h.data.len(),
            None => self.data.len(),
        }
    }

    /// Changes the logical shape. Reallocates (zeroed, stored as before) only when the new count
    /// exceeds the capacity; contents are unspecified afterwards either way.
    pub fn reshape(&mut self, gpu: &Gpu, shape: &[usize]) -> Result<()> {
        let count: usize = shape.iter().product();
        if count > self.capacity() {
            *self = GpuBlob::new_as(gpu, shape, count, self.elem())?;
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
