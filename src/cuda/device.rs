//! [`Gpu`]: one CUDA device as a replica uses it — its context, its own compute stream (never the
//! legacy default stream, so that communication on other streams can overlap), a cuBLAS handle
//! bound to that stream in the configured math mode, the loaded [`Kernels`], and a cuDNN handle
//! on the same stream created on first use ([`Gpu::cudnn`], so that nets without convolutions
//! never load cuDNN), and a side stream with its own cuDNN and cuBLAS handles for the
//! convolutions' weight gradients ([`Gpu::side`], likewise on first use) — plus row-major GEMM
//! and GEMV wrappers over cuBLAS with the semantics of `crate::backend::Cpu::gemm`.
//!
//! Stream ordering is explicit: [`Gpu::new`] turns cudarc's per-buffer event tracking off for
//! the context, so a buffer used on another stream (NCCL's) must be ordered with events recorded
//! on [`Gpu::compute`] by whoever launches that work. Without this, every buffer use would also
//! record and wait on events, and a communication stream reading one span of the gradient buffer
//! would serialise with the backward pass writing another span of it.

use super::cudnn::Cudnn;
use super::gpu_error;
use super::kernels::Kernels;
use crate::config::{ConvAlgorithm, GpuLayout, MathMode};
use crate::dist::deadline::{self, Wait};
use crate::error::{Error, Result};
use crate::precision::Half;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, Gemv, GemvConfig, StridedBatchedConfig};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::sync::{Arc, Mutex, OnceLock};

/// One device, as one replica drives it. Not meant to be shared between replicas: each builds
/// its own on its own thread.
#[derive(Debug)]
pub struct Gpu {
    /// CUDA device ordinal.
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    /// The stream every forward, backward and update kernel of this replica runs on.
    pub compute: Arc<CudaStream>,
    /// cuBLAS bound to `compute`, in the math mode of the config.
    pub blas: CudaBlas,
    pub kernels: Arc<Kernels>,
    pub math: MathMode,
    /// How convolution layers choose cuDNN algorithms (measured unless the config says otherwise).
    pub conv_algorithm: ConvAlgorithm,
    /// Whether convolutions keep to exact, deterministic algorithms (`cluster.conv_exact`).
    pub conv_exact: bool,
    /// How nets on this device store 4-D activations (`cluster.gpu_layout`; see
    /// [`crate::cuda::layout`]).
    pub layout: GpuLayout,
    /// In mixed precision, the products per converted value from which an inner product runs
    /// its GEMMs on half-type operands
    /// ([`HALF_OPERANDS_MIN_PRODUCTS`](crate::cuda::layers::inner_product::HALF_OPERANDS_MIN_PRODUCTS);
    /// 0 takes them everywhere).
    pub half_operands_min_products: usize,
    /// cuDNN bound to `compute`, created by the first [`Gpu::cudnn`].
    dnn: OnceLock<Cudnn>,
    /// A second stream of this device with its own cuDNN and cuBLAS handles, created by the
    /// first [`Gpu::side`]: convolutions' weight gradients run there beside their data gradients.
    side: OnceLock<Side>,
    /// The convolutions' GEMM weight-gradient scratch (column matrix, swapped top gradient),
    /// shared by every convolution of the replica: they use it one after another (on `compute`
    /// or the side stream, each joined before the next convolution's backward).
    conv_scratch: Mutex<[Option<CudaSlice<f32>>; 2]>,
    /// Recorded on `compute` and polled where the host waits for the device
    /// ([`Gpu::synchronize`]).
    idle: CudaEvent,
}

/// The second stream of a [`Gpu`] and its handles ([`Gpu::side`]).
#[derive(Debug)]
pub struct Side {
    /// cuDNN bound to the side stream ([`Cudnn::stream`] is the stream).
    pub dnn: Cudnn,
    /// cuBLAS bound to the side stream, in the device's math mode.
    pub blas: CudaBlas,
}

impl Side {
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.dnn.stream()
    }
}

/// Waits until `event` has completed, polling it under the collective deadline
/// ([`crate::dist::deadline`]). A blocking wait (`cuEventSynchronize`, `cuStreamSynchronize`)
/// would never return when the awaited work is ordered after a collective whose peer has
/// stopped; at the deadline this names the silent ranks and ends the job (NCCL communicators are
/// aborted on the way, see [`crate::dist::abort_hooks`]). `op` names the awaited work.
pub fn wait_for_event(event: &CudaEvent, op: &str) -> Result<()> {
    let mut wait = Wait::new();
    loop {
        if event
            .try_is_complete()
            .map_err(|e| gpu_error(&format!("wait for {op}"), e))?
        {
            return Ok(());
        }
        if !wait.pause() {
            deadline::expire(op, &wait, None);
        }
    }
}

/// A cuBLAS handle on `stream`: TF32 tensor-core math where `math` has it
/// ([`MathMode::tf32_tensor_cores`]), FP32 otherwise.
fn blas_on(stream: Arc<CudaStream>, math: MathMode) -> Result<CudaBlas> {
    let blas = CudaBlas::new(stream).map_err(|e| gpu_error("create a cuBLAS handle", e))?;
    let mode = match math.tf32_tensor_cores() {
        false => cublasMath_t::CUBLAS_DEFAULT_MATH,
        true => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
    };
    // SAFETY: the handle is valid for the lifetime of `blas`.
    unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) }
        .result()
        .map_err(|e| gpu_error("cublasSetMathMode", e))?;
    Ok(blas)
}

fn op(trans: bool) -> cublasOperation_t {
    if trans {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

fn dim(op_name: &str, n: usize) -> i32 {
    i32::try_from(n).unwrap_or_else(|_| panic!("{op_name}: dimension {n} exceeds cuBLAS's int"))
}

/// cuBLAS's (column-major) configuration of the row-major product `c (m, n) = alpha · op(a)
/// (m, k) · op(b) (k, n) + beta · c`, all packed: the column-major `cᵀ = op(b)ᵀ · op(a)ᵀ`, so
/// the call takes `b` before `a`.
fn row_major_gemm(
    op_name: &str,
    (trans_a, trans_b): (bool, bool),
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    beta: f32,
) -> GemmConfig<f32> {
    GemmConfig {
        transa: op(trans_b),
        transb: op(trans_a),
        m: dim(op_name, n),
        n: dim(op_name, m),
        k: dim(op_name, k),
        alpha,
        lda: dim(op_name, if trans_b { k } else { n }),
        ldb: dim(op_name, if trans_a { m } else { k }),
        beta,
        ldc: dim(op_name, n),
    }
}

impl Gpu {
    /// Opens device `ordinal`: retains its primary context, creates the compute stream and a
    /// cuBLAS handle on it (TF32 tensor-core math where the mode has it, plain FP32 otherwise),
    /// and loads the kernels (compiling them with NVRTC on the first device of an architecture).
    pub fn new(ordinal: usize, math: MathMode) -> Result<Gpu> {
        let count = super::device_count()?;
        if ordinal >= count {
            return Err(Error::Device(format!(
                "CUDA: device {ordinal} requested, {count} present"
            )));
        }
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Device(
                "CUDA: the cuBLAS library (libcublas.so) cannot be loaded; add the directory \
                 that holds it to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| gpu_error(&format!("open device {ordinal}"), e))?;
        // SAFETY: nothing has been allocated in this context object yet; every later use of a
        // buffer on a stream other than `compute` is ordered by explicit events (module docs).
        unsafe { ctx.disable_event_tracking() };
        let compute = ctx
            .new_stream()
            .map_err(|e| gpu_error("create the compute stream", e))?;
        let blas = blas_on(compute.clone(), math)?;
        let kernels = Arc::new(Kernels::load(&ctx)?);
        let idle = ctx
            .new_event(None)
            .map_err(|e| gpu_error("create the host-wait event", e))?;
        Ok(Gpu {
            ordinal,
            ctx,
            compute,
            blas,
            kernels,
            math,
            conv_algorithm: ConvAlgorithm::Measured,
            conv_exact: true,
            layout: GpuLayout::Nchw,
            half_operands_min_products: super::layers::inner_product::HALF_OPERANDS_MIN_PRODUCTS,
            dnn: OnceLock::new(),
            side: OnceLock::new(),
            conv_scratch: Mutex::new([None, None]),
            idle,
        })
    }

    /// The cuDNN handle of this device, bound to the compute stream in the configured math mode;
    /// loads cuDNN and creates the handle on the first call. An error naming the library where
    /// cuDNN is missing.
    pub fn cudnn(&self) -> Result<&Cudnn> {
        if let Some(h) = self.dnn.get() {
            return Ok(h);
        }
        let h = Cudnn::new(self.compute.clone(), self.math)?;
        Ok(self.dnn.get_or_init(|| h))
    }

    /// The device's side stream and its handles, in the configured math mode, for work that may
    /// run beside the compute stream's; created (cuDNN loaded) on the first call.
    pub fn side(&self) -> Result<&Side> {
        if let Some(side) = self.side.get() {
            return Ok(side);
        }
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| gpu_error("create the side stream", e))?;
        let blas = blas_on(stream.clone(), self.math)?;
        let dnn = Cudnn::new(stream, self.math)?;
        Ok(self.side.get_or_init(|| Side { dnn, blas }))
    }

    /// Runs `f` on the shared convolution scratch, grown to at least `col` and `dyt` floats. The
    /// convolutions use it one after another, on the compute stream or the side stream; a growth
    /// (at a plan's creation, or when the batch grows) first waits for the whole device, so that
    /// no stream still uses the old buffers when they are freed.
    pub(crate) fn with_conv_scratch<R>(
        &self,
        (col, dyt): (usize, usize),
        f: impl FnOnce(&mut CudaSlice<f32>, &mut CudaSlice<f32>) -> Result<R>,
    ) -> Result<R> {
        let mut guard = self
            .conv_scratch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let [a, b] = &mut *guard;
        let grows =
            |buf: &Option<CudaSlice<f32>>, n: usize| buf.as_ref().is_none_or(|s| s.len() < n);
        if grows(a, col) || grows(b, dyt) {
            self.ctx
                .synchronize()
                .map_err(|e| gpu_error("wait for the device before growing scratch", e))?;
        }
        for (buf, n) in [(&mut *a, col), (&mut *b, dyt)] {
            if grows(buf, n) {
                // SAFETY: scratch; every user writes what it reads.
                let fresh = unsafe { self.compute.alloc::<f32>(n.max(1)) }.map_err(|e| {
                    gpu_error(&format!("allocate {n} floats of convolution scratch"), e)
                })?;
                *buf = Some(fresh);
            }
        }
        f(
            a.as_mut().expect("allocated"),
            b.as_mut().expect("allocated"),
        )
    }

    /// The device's name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|_| "unknown CUDA device".into())
    }

    /// Makes this device's context current on the calling thread. Kernel launches and copies do
    /// this themselves; cuBLAS calls do not, so the net and the solver call it once per pass.
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| gpu_error("bind the context to this thread", e))
    }

    /// Waits for everything enqueued on the compute stream, polling under the collective
    /// deadline ([`wait_for_event`]): that work may wait on a collective of a stopped peer.
    pub fn synchronize(&self) -> Result<()> {
        self.idle
            .record(&self.compute)
            .map_err(|e| gpu_error("record the host-wait event", e))?;
        wait_for_event(&self.idle, "device work (compute stream)")
    }

    /// `c = alpha · op(a) · op(b) + beta · c`, all row-major, as `crate::backend::Cpu::gemm`
    /// with `trans = (trans_a, trans_b)` and `dims = (m, n, k)`: `op(a)` is `(m, k)`, `op(b)` is
    /// `(k, n)`, `c` is `(m, n)`; with `trans_a`, `a` is stored `(k, m)`; with `trans_b`, `b` is
    /// stored `(n, k)`. `beta = 0` ignores the old contents of
    /// `c`. Enqueued on the compute stream.
    ///
    /// cuBLAS is column-major and a row-major `(r, c)` matrix is its column-major transpose, so
    /// this computes `cᵀ (n, m) = op(b)ᵀ · op(a)ᵀ`: cuBLAS's A is our `b`, its B our `a`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        trans: (bool, bool),
        dims: (usize, usize, usize),
        alpha: f32,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        beta: f32,
        c: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let on = (&self.blas, &*self.compute);
        self.gemm_on(on, trans, dims, alpha, a, b, beta, c)
    }

    /// [`Gpu::gemm`] through the cuBLAS handle `blas` bound to `stream` (the compute stream's or
    /// the side stream's).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_on(
        &self,
        (blas, stream): (&CudaBlas, &CudaStream),
        (trans_a, trans_b): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        beta: f32,
        c: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let lens = (a.len(), b.len());
        if let Some(done) = self.trivial_gemm("gemm", stream, lens, (m, n, k), beta, c) {
            return done;
        }
        let cfg = row_major_gemm("gemm", (trans_a, trans_b), (m, n, k), alpha, beta);
        // SAFETY: the asserts above bound every element the strides reach.
        unsafe { blas.gemm(cfg, b, a, c) }.map_err(|e| {
            gpu_error(
                &format!("cublasSgemm (m {m}, n {n}, k {k}, trans_a {trans_a}, trans_b {trans_b})"),
                e,
            )
        })
    }

    /// [`Gpu::gemm`] with half-type operands on the compute stream: `a` and `b` hold the bit
    /// patterns of `half` values (bf16 or fp16), the products accumulate in FP32
    /// (`CUBLAS_COMPUTE_32F`) on tensor cores, and `c` stays FP32 — the products of mixed
    /// precision (`crate::precision`) at half the operand bytes and twice the tensor-core rate
    /// of TF32.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_half(
        &self,
        half: Half,
        (trans_a, trans_b): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        a: &impl DevicePtr<u16>,
        b: &impl DevicePtr<u16>,
        beta: f32,
        c: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let (stream, lens) = (&*self.compute, (a.len(), b.len()));
        if let Some(done) = self.trivial_gemm("gemm_half", stream, lens, (m, n, k), beta, c) {
            return done;
        }
        let cfg = row_major_gemm("gemm_half", (trans_a, trans_b), (m, n, k), alpha, beta);
        let operand = match half {
            Half::Bf16 => cudaDataType_t::CUDA_R_16BF,
            Half::Fp16 => cudaDataType_t::CUDA_R_16F,
        };
        let (a, _a) = a.device_ptr(stream);
        let (b, _b) = b.device_ptr(stream);
        let (c, _c) = c.device_ptr_mut(stream);
        // SAFETY: the handle is bound to `stream`, on which the pointers are valid; the asserts
        // above bound every element the strides reach; alpha and beta are host scalars read
        // during the call (the handle's default pointer mode).
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cfg.transa,
                cfg.transb,
                cfg.m,
                cfg.n,
                cfg.k,
                (&cfg.alpha) as *const f32 as *const _,
                b as *const _,
                operand,
                cfg.lda,
                a as *const _,
                operand,
                cfg.ldb,
                (&cfg.beta) as *const f32 as *const _,
                c as *mut _,
                cudaDataType_t::CUDA_R_32F,
                cfg.ldc,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| {
            gpu_error(
                &format!(
                    "cublasGemmEx {half:?} (m {m}, n {n}, k {k}, trans_a {trans_a}, trans_b {trans_b})"
                ),
                e,
            )
        })
    }

    /// What every GEMM checks first: panics where an operand of `a_len`, `b_len` or `c`'s
    /// elements is shorter than `(m, k)`, `(k, n)` or `(m, n)`; `Some` of the result where no
    /// product is left to run (an empty `c`, or `k = 0`, which leaves `beta · c` on `stream`).
    fn trivial_gemm(
        &self,
        op: &str,
        stream: &CudaStream,
        (a_len, b_len): (usize, usize),
        (m, n, k): (usize, usize, usize),
        beta: f32,
        c: &mut impl DevicePtrMut<f32>,
    ) -> Option<Result<()>> {
        assert!(a_len >= m * k, "{op}: a has {a_len} < {m}·{k}");
        assert!(b_len >= k * n, "{op}: b has {b_len} < {k}·{n}");
        assert!(c.len() >= m * n, "{op}: c has {} < {m}·{n}", c.len());
        if m == 0 || n == 0 {
            return Some(Ok(()));
        }
        (k == 0).then(|| self.scale_without_product(stream, c, beta, m * n))
    }

    /// `c = beta · c` over `len` elements, as a product with an empty inner dimension leaves it
    /// (`beta` 0 writes zeros without reading `c`).
    fn scale_without_product(
        &self,
        stream: &CudaStream,
        c: &mut impl DevicePtrMut<f32>,
        beta: f32,
        len: usize,
    ) -> Result<()> {
        if beta == 0.0 {
            self.kernels.fill(stream, c, 0.0, len)
        } else {
            self.kernels.scale(stream, c, beta, len)
        }
    }

    /// [`Gpu::gemm_on`] for `batch` independent products, the i-th reading `a` at `i · stride_a`,
    /// `b` at `i · stride_b` and writing `c` at `i · stride_c` (a stride of 0 shares one matrix
    /// among all products): one cuBLAS call.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_batched_on(
        &self,
        (blas, stream): (&CudaBlas, &CudaStream),
        (trans_a, trans_b): (bool, bool),
        (m, n, k): (usize, usize, usize),
        (batch, stride_a, stride_b, stride_c): (usize, usize, usize, usize),
        (alpha, a, b): (f32, &impl DevicePtr<f32>, &impl DevicePtr<f32>),
        beta: f32,
        c: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let last = batch.saturating_sub(1);
        let need = |stride: usize, len: usize| last * stride + len;
        assert!(
            a.len() >= need(stride_a, m * k),
            "gemm_batched: a has {}",
            a.len()
        );
        assert!(
            b.len() >= need(stride_b, k * n),
            "gemm_batched: b has {}",
            b.len()
        );
        assert!(
            c.len() >= need(stride_c, m * n),
            "gemm_batched: c has {}",
            c.len()
        );
        assert!(
            batch <= 1 || stride_c >= m * n,
            "gemm_batched: products would overlap in c"
        );
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return self.scale_without_product(stream, c, beta, need(stride_c, m * n));
        }
        let long = |v: usize| i64::try_from(v).expect("gemm_batched: a stride beyond i64");
        let cfg = StridedBatchedConfig {
            gemm: row_major_gemm("gemm_batched", (trans_a, trans_b), (m, n, k), alpha, beta),
            batch_size: dim("gemm_batched", batch),
            stride_a: long(stride_b),
            stride_b: long(stride_a),
            stride_c: long(stride_c),
        };
        // SAFETY: the asserts above bound every element the strides reach.
        unsafe { blas.gemm_strided_batched(cfg, b, a, c) }.map_err(|e| {
            gpu_error(
                &format!("cublasSgemmStridedBatched (batch {batch}, m {m}, n {n}, k {k})"),
                e,
            )
        })
    }

    /// `y (cols) = alpha · aᵀ · x + beta · y` with `a (rows, cols)` row-major and `x (rows)`:
    /// with `x` a ones vector, `y` gets `alpha` times the column sums of `a` (the bias gradient).
    /// Enqueued on the compute stream.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_t(
        &self,
        rows: usize,
        cols: usize,
        alpha: f32,
        a: &impl DevicePtr<f32>,
        x: &impl DevicePtr<f32>,
        beta: f32,
        y: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        assert!(
            a.len() >= rows * cols,
            "gemv_t: a has {} < {rows}·{cols}",
            a.len()
        );
        assert!(x.len() >= rows, "gemv_t: x has {} < {rows}", x.len());
        assert!(y.len() >= cols, "gemv_t: y has {} < {cols}", y.len());
        if cols == 0 {
            return Ok(());
        }
        if rows == 0 {
            return self.scale_without_product(&self.compute, y, beta, cols);
        }
        // Row-major a (rows, cols) is column-major (cols, rows) with leading dimension cols:
        // y = A · x without transposition.
        let cfg = GemvConfig {
            trans: cublasOperation_t::CUBLAS_OP_N,
            m: dim("gemv", cols),
            n: dim("gemv", rows),
            alpha,
            lda: dim("gemv", cols),
            incx: 1,
            beta,
            incy: 1,
        };
        // SAFETY: the asserts above bound every element the strides reach.
        unsafe { self.blas.gemv(cfg, a, x, y) }
            .map_err(|e| gpu_error(&format!("cublasSgemv (rows {rows}, cols {cols})"), e))
    }
}
