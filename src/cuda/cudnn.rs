//! A thin safe layer over cuDNN's C API (`cudarc::cudnn::sys`, loaded at run time) for what the
//! convolution layer needs: [`Cudnn`], one handle per [`Gpu`](super::Gpu) bound to its compute
//! stream; RAII [`TensorDesc`], [`FilterDesc`] and [`ConvDesc`]; the choice of convolution
//! algorithms per shape ([`ConvAlgos::choose`]); and the forward, backward-data and
//! backward-filter calls.
//!
//! cuDNN is optional: nothing here is touched unless a net has a convolution layer, so a net
//! without one runs on a machine without libcudnn. [`Cudnn::new`] checks that the library loads
//! and exports every function used here, and otherwise answers an error naming the library
//! (a missing symbol would otherwise panic inside cudarc at the first call).
//!
//! Layouts: tensors are fully packed FP32, NCHW or channels-last NHWC (the
//! [`Layout`] of the net's blobs); filters are KCRS (`(num_output,
//! C/group, kh, kw)`, the CPU layer's weight layout) beside NCHW tensors and KRSC beside NHWC
//! ones, as cuDNN's channels-last kernels want.
//!
//! Math: for `math = "fp32"` convolutions use `CUDNN_FMA_MATH` (no TF32 tensor cores) and, with
//! `cluster.conv_exact` (the default), only the GEMM-like algorithms, whose rounding error is
//! that of a plain dot product (the FFT and Winograd algorithms trade accuracy for speed and
//! would not agree with the CPU to FP32 precision); for `math = "tf32"` every algorithm and
//! `CUDNN_TENSOR_OP_MATH` are allowed. `conv_exact` also prefers deterministic algorithms;
//! `conv_exact = false` takes the first usable one of the ranking whatever its kind, as PyTorch
//! does unless told otherwise.
//!
//! Choice ([`ConvAlgorithm`]): `measured` runs cuDNN's own benchmark of every candidate
//! three times per shape (`cudnnFind*`, host-blocking, at the first step of a shape) and
//! ranks the candidates by their median time; of the allowed ones (deterministic, when exact)
//! that fit the workspace limit, the first few within 1.5× of the fastest are timed again in
//! turns ([`median_times_in_turns`]: `cudnnFind*` times them one after the other, which ranked
//! kernels of similar speed differently from run to run) and the cheapest is kept (the larger
//! of its device and host times: [`super::path_timing::PathTime::cost_ms`]); `heuristic`
//! takes the first such one of cuDNN's ranking (`*_v7`), which costs no timing and is the same
//! every run. Each direction runs with the math type cuDNN reported for its algorithm (a
//! descriptor per direction): the legacy API picks the kernel by algorithm *and* math type, and
//! the tensor-core kernels of an algorithm are only reached with the math type they were ranked
//! or timed with.

use super::gpu_error;
use super::kernels::Kernels;
use super::layout::Layout;
use super::path_timing::{median_times_in_turns, zeroed_floats};
use crate::config::{ConvAlgorithm, MathMode};
use crate::error::{Error, Result};
use cudarc::cudnn::sys::{
    self, cudnnConvolutionBwdDataAlgo_t as BwdDataAlgo,
    cudnnConvolutionBwdFilterAlgo_t as BwdFilterAlgo, cudnnConvolutionFwdAlgo_t as FwdAlgo,
    cudnnDataType_t, cudnnMathType_t, cudnnStatus_t, cudnnTensorFormat_t,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, SyncOnDrop};
use std::ffi::c_void;
use std::sync::Arc;

/// The functions of libcudnn this module calls: checked once when a handle is created.
const SYMBOLS: &[&str] = &[
    "cudnnGetVersion",
    "cudnnCreate",
    "cudnnDestroy",
    "cudnnSetStream",
    "cudnnGetErrorString",
    "cudnnCreateTensorDescriptor",
    "cudnnSetTensor4dDescriptor",
    "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnSetFilter4dDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor",
    "cudnnSetConvolutionGroupCount",
    "cudnnSetConvolutionMathType",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnFindConvolutionForwardAlgorithm",
    "cudnnFindConvolutionBackwardDataAlgorithm",
    "cudnnFindConvolutionBackwardFilterAlgorithm",
    "cudnnGetConvolutionForwardWorkspaceSize",
    "cudnnGetConvolutionBackwardDataWorkspaceSize",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
    "cudnnConvolutionForward",
    "cudnnConvolutionBackwardData",
    "cudnnConvolutionBackwardFilter",
];

/// The largest workspace (bytes) an algorithm may ask for.
pub const WORKSPACE_LIMIT: usize = 256 << 20;

/// A cuDNN status as an error naming the call.
fn check(op: &str, status: cudnnStatus_t) -> Result<()> {
    if status == cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status.
    let text = unsafe {
        let p = sys::cudnnGetErrorString(status);
        if p.is_null() {
            format!("{status:?}")
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(Error::Device(format!("cuDNN {op}: {text}")))
}

fn int(op: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Device(format!("cuDNN {op}: dimension {v} exceeds int")))
}

/// Whether libcudnn can be loaded and exports every function used here; the error names the
/// library and what is missing.
pub fn load_check() -> Result<()> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Device(
            "CUDA: the cuDNN library (libcudnn.so.9 or libcudnn.so) cannot be loaded; the \
             convolution layer needs it: install cuDNN 9 and add the directory that holds it to \
             LD_LIBRARY_PATH"
                .into(),
        ));
    }
    if let Some(name) = SYMBOLS.iter().find(|name| !exports(name)) {
        return Err(Error::Device(format!(
            "CUDA: the loaded cuDNN library lacks `{name}`; cuDNN 8 or 9 is needed"
        )));
    }
    Ok(())
}

/// Whether the cuDNN library (present: [`load_check`]) exports the function `name`.
fn exports(name: &str) -> bool {
    // SAFETY: the caller has found the library present; looking a symbol up has no side effect,
    // and the pointer is never called through this type.
    unsafe { sys::culib().get::<*const c_void>(name.as_bytes()) }.is_ok()
}

/// A cuDNN handle bound to one replica's compute stream.
#[derive(Debug)]
pub struct Cudnn {
    raw: sys::cudnnHandle_t,
    /// Keeps the stream (and its context) alive as long as the handle.
    stream: Arc<CudaStream>,
    math: MathMode,
}

// SAFETY: the handle is used only by the thread that owns the `Gpu` (a replica's thread); cuDNN
// handles may move between threads as long as they are not used concurrently.
unsafe impl Send for Cudnn {}
// SAFETY: every call through `&Cudnn` goes to the one stream the handle is bound to, from the
// replica's thread; `Gpu` is never driven from two threads at once.
unsafe impl Sync for Cudnn {}

impl Cudnn {
    /// Loads cuDNN (see [`load_check`]), creates a handle in the stream's context and binds it
    /// to `stream`.
    pub fn new(stream: Arc<CudaStream>, math: MathMode) -> Result<Cudnn> {
        load_check()?;
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| gpu_error("bind the context for cuDNN", e))?;
        let mut raw: sys::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: `raw` is writable; the context is current.
        check("cudnnCreate", unsafe { sys::cudnnCreate(&mut raw) })?;
        let handle = Cudnn { raw, stream, math };
        // SAFETY: live handle and stream of the same context.
        check("cudnnSetStream", unsafe {
            sys::cudnnSetStream(handle.raw, handle.stream.cu_stream() as sys::cudaStream_t)
        })?;
        Ok(handle)
    }

    /// The library's version, e.g. 90100 for 9.1.0.
    pub fn version() -> usize {
        // SAFETY: a pure query of a loaded library (callers have a handle, so it is loaded).
        unsafe { sys::cudnnGetVersion() }
    }

    /// The stream every call of this handle runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn math(&self) -> MathMode {
        self.math
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: live handle, destroyed once.
        let _ = unsafe { sys::cudnnDestroy(self.raw) };
    }
}

/// cuDNN's name of a layout.
fn format(layout: Layout) -> cudnnTensorFormat_t {
    match layout {
        Layout::Nchw => cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
        Layout::Nhwc => cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
    }
}

/// What distinguishes the two 4-D descriptors, [`TensorDesc`] and [`FilterDesc`]: cuDNN's calls
/// that create, set (packed, of an element type, in a [`Layout`]) and destroy one.
pub trait DescKind {
    /// The opaque struct the descriptor points to.
    type Raw;
    /// The names of the create and set calls, in errors.
    const CALLS: [&'static str; 2];

    /// Creates a descriptor into `raw`.
    ///
    /// # Safety
    /// `raw` is writable.
    unsafe fn create(raw: *mut *mut Self::Raw) -> cudnnStatus_t;

    /// Sets the live descriptor `raw` to the four dimensions `dims` of element type `ty`, stored
    /// in `layout`.
    ///
    /// # Safety
    /// `raw` is live.
    unsafe fn set(
        raw: *mut Self::Raw,
        layout: Layout,
        ty: cudnnDataType_t,
        dims: [i32; 4],
    ) -> cudnnStatus_t;

    /// Destroys the live descriptor `raw`.
    ///
    /// # Safety
    /// `raw` is live, and not used afterwards.
    unsafe fn destroy(raw: *mut Self::Raw) -> cudnnStatus_t;
}

/// [`TensorDesc`]'s kind: `(n, c, h, w)` stored NCHW or NHWC.
#[derive(Debug)]
pub enum Tensor {}

/// [`FilterDesc`]'s kind: `(k, c, r, s)` = `(num_output, C/group, kh, kw)`, stored KCRS
/// (`Layout::Nchw`) or KRSC (`Layout::Nhwc`).
#[derive(Debug)]
pub enum Filter {}

impl DescKind for Tensor {
    type Raw = sys::cudnnTensorStruct;
    const CALLS: [&'static str; 2] = ["cudnnCreateTensorDescriptor", "cudnnSetTensor4dDescriptor"];

    unsafe fn create(raw: *mut sys::cudnnTensorDescriptor_t) -> cudnnStatus_t {
        sys::cudnnCreateTensorDescriptor(raw)
    }

    unsafe fn set(
        raw: sys::cudnnTensorDescriptor_t,
        l: Layout,
        ty: cudnnDataType_t,
        d: [i32; 4],
    ) -> cudnnStatus_t {
        sys::cudnnSetTensor4dDescriptor(raw, format(l), ty, d[0], d[1], d[2], d[3])
    }

    unsafe fn destroy(raw: sys::cudnnTensorDescriptor_t) -> cudnnStatus_t {
        sys::cudnnDestroyTensorDescriptor(raw)
    }
}

impl DescKind for Filter {
    type Raw = sys::cudnnFilterStruct;
    const CALLS: [&'static str; 2] = ["cudnnCreateFilterDescriptor", "cudnnSetFilter4dDescriptor"];

    unsafe fn create(raw: *mut sys::cudnnFilterDescriptor_t) -> cudnnStatus_t {
        sys::cudnnCreateFilterDescriptor(raw)
    }

    unsafe fn set(
        raw: sys::cudnnFilterDescriptor_t,
        l: Layout,
        ty: cudnnDataType_t,
        d: [i32; 4],
    ) -> cudnnStatus_t {
        sys::cudnnSetFilter4dDescriptor(raw, ty, format(l), d[0], d[1], d[2], d[3])
    }

    unsafe fn destroy(raw: sys::cudnnFilterDescriptor_t) -> cudnnStatus_t {
        sys::cudnnDestroyFilterDescriptor(raw)
    }
}

/// cuDNN's name of FP32, the element type of the layers' descriptors and the compute type of
/// every convolution.
pub(crate) const FLOAT: cudnnDataType_t = cudnnDataType_t::CUDNN_DATA_FLOAT;

/// A packed 4-D descriptor of kind `K` (FP32, but for the survey's), owning its cuDNN descriptor.
#[derive(Debug)]
pub struct Desc4<K: DescKind> {
    raw: *mut K::Raw,
    /// The four dimensions it describes.
    pub dims: [usize; 4],
}

/// A packed tensor descriptor `(n, c, h, w)`, NCHW or NHWC.
pub type TensorDesc = Desc4<Tensor>;

/// A filter descriptor `(k, c, r, s)` = `(num_output, C/group, kh, kw)`, KCRS or KRSC.
pub type FilterDesc = Desc4<Filter>;

// SAFETY: a descriptor is plain host memory owned by this value.
unsafe impl<K: DescKind> Send for Desc4<K> {}

impl<K: DescKind> Desc4<K> {
    /// An FP32 descriptor of `dims` stored in `layout`.
    pub fn new(dims: [usize; 4], layout: Layout) -> Result<Self> {
        Self::typed(dims, layout, FLOAT)
    }

    /// A descriptor of `dims` stored in `layout` with elements of type `ty` (the half types'
    /// survey, `cudnn::survey`).
    pub fn typed(dims: [usize; 4], layout: Layout, ty: cudnnDataType_t) -> Result<Self> {
        let [create, set] = K::CALLS;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is writable.
        check(create, unsafe { K::create(&mut raw) })?;
        let d = Desc4 { raw, dims };
        let ints = [
            int(set, dims[0])?,
            int(set, dims[1])?,
            int(set, dims[2])?,
            int(set, dims[3])?,
        ];
        // SAFETY: live descriptor.
        check(set, unsafe { K::set(d.raw, layout, ty, ints) })?;
        Ok(d)
    }

    /// Elements it describes.
    pub fn count(&self) -> usize {
        self.dims.iter().product()
    }
}

impl<K: DescKind> Drop for Desc4<K> {
    fn drop(&mut self) {
        // SAFETY: live descriptor, destroyed once.
        let _ = unsafe { K::destroy(self.raw) };
    }
}

/// The geometry of a 2-D convolution (Caffe's cross-correlation), per spatial axis `[h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    pub pad: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    pub group: usize,
}

/// A convolution descriptor: cross-correlation with FP32 accumulation, the group count and the
/// math type of the configured [`MathMode`].
#[derive(Debug)]
pub struct ConvDesc {
    raw: sys::cudnnConvolutionDescriptor_t,
    pub geometry: ConvGeometry,
    pub math: MathMode,
}

// SAFETY: as for `Desc4`.
unsafe impl Send for ConvDesc {}

impl ConvDesc {
    /// A descriptor in the default math type of `math`.
    pub fn new(geometry: ConvGeometry, math: MathMode) -> Result<ConvDesc> {
        ConvDesc::with_math_type(geometry, math, math_type(math))
    }

    /// A descriptor with an explicit cuDNN math type (the one an algorithm was chosen with).
    pub fn with_math_type(
        geometry: ConvGeometry,
        math: MathMode,
        math_type: cudnnMathType_t,
    ) -> Result<ConvDesc> {
        let mut raw: sys::cudnnConvolutionDescriptor_t = std::ptr::null_mut();
        // SAFETY: `raw` is writable.
        check("cudnnCreateConvolutionDescriptor", unsafe {
            sys::cudnnCreateConvolutionDescriptor(&mut raw)
        })?;
        let d = ConvDesc {
            raw,
            geometry,
            math,
        };
        let op = "cudnnSetConvolution2dDescriptor";
        let g = geometry;
        // SAFETY: live descriptor.
        check(op, unsafe {
            sys::cudnnSetConvolution2dDescriptor(
                d.raw,
                int(op, g.pad[0])?,
                int(op, g.pad[1])?,
                int(op, g.stride[0])?,
                int(op, g.stride[1])?,
                int(op, g.dilation[0])?,
                int(op, g.dilation[1])?,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                FLOAT,
            )
        })?;
        let op = "cudnnSetConvolutionGroupCount";
        // SAFETY: live descriptor.
        check(op, unsafe {
            sys::cudnnSetConvolutionGroupCount(d.raw, int(op, g.group)?)
        })?;
        // SAFETY: live descriptor.
        check("cudnnSetConvolutionMathType", unsafe {
            sys::cudnnSetConvolutionMathType(d.raw, math_type)
        })?;
        Ok(d)
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: live descriptor, destroyed once.
        let _ = unsafe { sys::cudnnDestroyConvolutionDescriptor(self.raw) };
    }
}

fn math_type(math: MathMode) -> cudnnMathType_t {
    match math.tf32_tensor_cores() {
        false => cudnnMathType_t::CUDNN_FMA_MATH,
        true => cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    }
}

/// cuDNN's `cudnnConvolution*AlgoPerf_t` with plain integers where the C struct has enums, so
/// that no value the library writes can be an invalid Rust enum.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawPerf {
    algo: i32,
    status: i32,
    time: f32,
    memory: usize,
    determinism: i32,
    math_type: i32,
    reserved: [i32; 3],
}

const _: () = assert!(
    std::mem::size_of::<RawPerf>() == std::mem::size_of::<sys::cudnnConvolutionFwdAlgoPerf_t>()
);
const _: () = assert!(
    std::mem::size_of::<RawPerf>() == std::mem::size_of::<sys::cudnnConvolutionBwdDataAlgoPerf_t>()
);
const _: () = assert!(
    std::mem::size_of::<RawPerf>()
        == std::mem::size_of::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>()
);

/// Maximum number of ranked algorithms asked for per direction.
const RANKED: usize = 16;

fn fwd_algo(v: i32) -> Option<FwdAlgo> {
    use FwdAlgo::*;
    Some(match v {
        0 => CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        1 => CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        2 => CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        3 => CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        4 => CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        5 => CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        6 => CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        7 => CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

fn bwd_data_algo(v: i32) -> Option<BwdDataAlgo> {
    use BwdDataAlgo::*;
    Some(match v {
        0 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        1 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
        2 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
        3 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
        4 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
        5 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

fn bwd_filter_algo(v: i32) -> Option<BwdFilterAlgo> {
    use BwdFilterAlgo::*;
    Some(match v {
        0 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        1 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        2 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
        3 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        4 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
        5 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        6 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
        _ => return None,
    })
}

/// Whether an algorithm (by its integer value) is allowed: any when not `exact`, and when
/// `exact` in FP32 only the GEMM-like ones (forward 0–3, backward-data 0–1, backward-filter
/// 0, 1, 3).
fn allowed(direction: usize, algo: i32, math: MathMode, exact: bool) -> bool {
    if math.tf32_tensor_cores() || !exact {
        return true;
    }
    match direction {
        0 => (0..=3).contains(&algo),
        1 => (0..=1).contains(&algo),
        _ => matches!(algo, 0 | 1 | 3),
    }
}

/// The candidates of a ranking (cuDNN's heuristic order, or measured time ascending) that may
/// run, in its order: successful, allowed and within the workspace limit; when `exact`, only
/// the deterministic ones where there are any, else the first such one alone.
fn eligible(direction: usize, ranked: &[RawPerf], math: MathMode, exact: bool) -> Vec<RawPerf> {
    let usable: Vec<RawPerf> = ranked
        .iter()
        .filter(|p| {
            p.status == cudnnStatus_t::CUDNN_STATUS_SUCCESS as i32
                && allowed(direction, p.algo, math, exact)
                && p.memory <= WORKSPACE_LIMIT
        })
        .copied()
        .collect();
    let preferred: Vec<RawPerf> = usable
        .iter()
        .filter(|p| p.determinism == 1 || !exact)
        .copied()
        .collect();
    if preferred.is_empty() {
        usable.into_iter().take(1).collect()
    } else {
        preferred
    }
}

/// How many of a direction's eligible candidates, the fastest first, `measured` times again.
const RETIMED: usize = 3;

/// Candidates whose median time from `cudnnFind*` exceeds the fastest's by more than this
/// factor are not timed again.
const RETIME_WITHIN: f32 = 1.5;

/// The candidates of `ranked` (measured, fastest first) worth timing again: the first
/// [`RETIMED`] within [`RETIME_WITHIN`] of the first.
fn near_fastest(ranked: &[RawPerf]) -> Vec<RawPerf> {
    let Some(first) = ranked.first() else {
        return Vec::new();
    };
    ranked
        .iter()
        .take(RETIMED)
        .filter(|p| p.time <= first.time * RETIME_WITHIN)
        .copied()
        .collect()
}

/// The cheapest of `candidates` of one direction (0 forward, 1 backward data, 2 backward
/// filter) of the convolution `descs`, timed in turns on zeroed scratch buffers of its shapes
/// (see [`median_times_in_turns`] and [`super::path_timing::PathTime::cost_ms`]); the only one
/// without timing. Synchronises.
fn fastest_candidate(
    (dnn, kernels): (&Cudnn, &Kernels),
    direction: usize,
    (x, w, y): (&TensorDesc, &FilterDesc, &TensorDesc),
    geometry: ConvGeometry,
    candidates: &[RawPerf],
) -> Result<Option<RawPerf>> {
    if candidates.len() < 2 {
        return Ok(candidates.first().copied());
    }
    let s = dnn.stream();
    let floats = |n: usize| zeroed_floats(s, n);
    let (mut xb, mut wb, mut yb) = (floats(x.count())?, floats(w.count())?, floats(y.count())?);
    let bytes = candidates
        .iter()
        .map(|p| p.memory)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut ws = s
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| gpu_error("allocate a cuDNN workspace to time algorithms", e))?;
    let descs = candidates
        .iter()
        .map(|p| ConvDesc::with_math_type(geometry, dnn.math, run_math_type(dnn.math, p.math_type)))
        .collect::<Result<Vec<_>>>()?;
    let (xp, _gx) = xb.device_ptr_mut(s);
    let (wp, _gw) = wb.device_ptr_mut(s);
    let (yp, _gy) = yb.device_ptr_mut(s);
    let (wsp, _gws) = ws.device_ptr_mut(s);
    let work = Workspace { ptr: wsp, bytes };
    let times = median_times_in_turns(s, kernels, candidates.len(), |i| {
        let (algo, conv) = (candidates[i].algo, &descs[i]);
        // SAFETY: scratch buffers of the descriptors' element counts and a workspace of the
        // largest size cuDNN reported for these candidates, all alive until the timing
        // synchronises.
        unsafe {
            match direction {
                0 => {
                    let algo = fwd_algo(algo).unwrap_or(FALLBACK.0);
                    conv_forward(dnn, (x, xp), (w, wp), (conv, algo), work, 0.0, (y, yp))
                }
                1 => {
                    let algo = bwd_data_algo(algo).unwrap_or(FALLBACK.1);
                    conv_backward_data(dnn, (w, wp), (y, yp), (conv, algo), work, 0.0, (x, xp))
                }
                _ => {
                    let algo = bwd_filter_algo(algo).unwrap_or(FALLBACK.2);
                    conv_backward_filter(dnn, (x, xp), (y, yp), (conv, algo), work, 0.0, (w, wp))
                }
            }
        }
    })?;
    let mut best = (candidates[0], f32::INFINITY);
    for (p, time) in candidates.iter().zip(times) {
        tracing::debug!(
            direction = DIRECTIONS[direction],
            algo = p.algo,
            math_type = p.math_type,
            find_ms = p.time,
            device_ms = time.device_ms,
            host_ms = time.host_ms,
            "cuDNN convolution algorithm timed again"
        );
        if time.cost_ms() < best.1 {
            best = (*p, time.cost_ms());
        }
    }
    Ok(Some(best.0))
}

/// The directions' names in the debug log.
const DIRECTIONS: [&str; 3] = ["forward", "backward data", "backward filter"];

/// The math type to run an algorithm with: FMA in `fp32` whatever cuDNN reports; in `tf32` and
/// the half modes the reported one, except that down-conversion to half precision is never allowed.
fn run_math_type(math: MathMode, reported: i32) -> cudnnMathType_t {
    use cudnnMathType_t::*;
    match (math.tf32_tensor_cores(), reported) {
        (false, _) => CUDNN_FMA_MATH,
        (true, 0) => CUDNN_DEFAULT_MATH,
        (true, 3) => CUDNN_FMA_MATH,
        (true, _) => CUDNN_TENSOR_OP_MATH,
    }
}

/// One direction's algorithm and the convolution descriptor (math type) to run it with.
#[derive(Debug)]
pub struct Chosen<A> {
    pub algo: A,
    pub conv: ConvDesc,
}

/// The algorithms of one convolution shape and the workspace (bytes) the largest needs.
#[derive(Debug)]
pub struct ConvAlgos {
    pub fwd: Chosen<FwdAlgo>,
    pub bwd_data: Chosen<BwdDataAlgo>,
    pub bwd_filter: Chosen<BwdFilterAlgo>,
    pub workspace: usize,
}

/// The conservative algorithms every shape supports, used when the ranking offers none.
const FALLBACK: (FwdAlgo, BwdDataAlgo, BwdFilterAlgo) = (
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
    BwdDataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
    BwdFilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
);

/// How many times `measured` has cuDNN time every candidate of a direction. One timing per
/// candidate (a single `cudnnFind*` call) ranks kernels of 0.1–0.4 ms differently from run to
/// run; the median of three keeps the choice, and the step time, steady.
const FIND_ROUNDS: usize = 3;

/// Merges the rankings of several timing rounds into one: each candidate (algorithm and math
/// type) with the median of its times and the largest workspace any round reported, fastest
/// first. A candidate that failed or was missing in any round counts as failed.
fn merge_rounds(rounds: &[Vec<RawPerf>]) -> Vec<RawPerf> {
    let success = cudnnStatus_t::CUDNN_STATUS_SUCCESS as i32;
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    let mut merged: Vec<RawPerf> = first
        .iter()
        .map(|p| {
            let same = |q: &&RawPerf| q.algo == p.algo && q.math_type == p.math_type;
            let runs: Vec<&RawPerf> = rounds.iter().filter_map(|r| r.iter().find(same)).collect();
            let mut merged = *p;
            if runs.len() < rounds.len() || runs.iter().any(|q| q.status != success) {
                merged.status = runs
                    .iter()
                    .map(|q| q.status)
                    .find(|&s| s != success)
                    .unwrap_or(-1);
                return merged;
            }
            let mut times: Vec<f32> = runs.iter().map(|q| q.time).collect();
            times.sort_by(f32::total_cmp);
            merged.time = times[times.len() / 2];
            merged.memory = runs.iter().map(|q| q.memory).max().unwrap_or(p.memory);
            merged
        })
        .collect();
    // Failed candidates last, in their first round's order.
    merged.sort_by(|a, b| {
        (a.status != success)
            .cmp(&(b.status != success))
            .then(a.time.total_cmp(&b.time))
    });
    merged
}

/// The candidates of one direction (0 forward, 1 backward data, 2 backward filter) for
/// `x * w -> y`, in cuDNN's heuristic order or timed (fastest first, the median of
/// [`FIND_ROUNDS`] timings each).
fn rank(
    dnn: &Cudnn,
    direction: usize,
    how: ConvAlgorithm,
    descs: (&TensorDesc, &FilterDesc, &ConvDesc, &TensorDesc),
) -> Result<Vec<RawPerf>> {
    match how {
        ConvAlgorithm::Heuristic => rank_once(dnn, direction, how, descs),
        ConvAlgorithm::Measured => {
            let rounds = (0..FIND_ROUNDS)
                .map(|_| rank_once(dnn, direction, how, descs))
                .collect::<Result<Vec<_>>>()?;
            Ok(merge_rounds(&rounds))
        }
    }
}

/// One ranking of a direction's candidates: cuDNN's heuristic order, or one timing of each.
fn rank_once(
    dnn: &Cudnn,
    direction: usize,
    how: ConvAlgorithm,
    (x, w, conv, y): (&TensorDesc, &FilterDesc, &ConvDesc, &TensorDesc),
) -> Result<Vec<RawPerf>> {
    use ConvAlgorithm::{Heuristic, Measured};
    let mut ranked = [RawPerf::default(); RANKED];
    let mut got: i32 = 0;
    let (h, n, out, got_p) = (dnn.raw, RANKED as i32, ranked.as_mut_ptr(), &mut got);
    let (x, w, c, y) = (x.raw, w.raw, conv.raw, y.raw);
    // SAFETY: live descriptors of one convolution; `ranked` holds RANKED entries laid out as the
    // C structs (asserted above). The Find calls allocate and free their own device buffers and
    // block the host until timed.
    let (op, status) = unsafe {
        match (direction, how) {
            (0, Heuristic) => (
                "cudnnGetConvolutionForwardAlgorithm_v7",
                sys::cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, c, y, n, got_p, out.cast()),
            ),
            (0, Measured) => (
                "cudnnFindConvolutionForwardAlgorithm",
                sys::cudnnFindConvolutionForwardAlgorithm(h, x, w, c, y, n, got_p, out.cast()),
            ),
            (1, Heuristic) => (
                "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                sys::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    h,
                    w,
                    y,
                    c,
                    x,
                    n,
                    got_p,
                    out.cast(),
                ),
            ),
            (1, Measured) => (
                "cudnnFindConvolutionBackwardDataAlgorithm",
                sys::cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, c, x, n, got_p, out.cast()),
            ),
            (_, Heuristic) => (
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                sys::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    h,
                    x,
                    y,
                    c,
                    w,
                    n,
                    got_p,
                    out.cast(),
                ),
            ),
            (_, Measured) => (
                "cudnnFindConvolutionBackwardFilterAlgorithm",
                sys::cudnnFindConvolutionBackwardFilterAlgorithm(
                    h,
                    x,
                    y,
                    c,
                    w,
                    n,
                    got_p,
                    out.cast(),
                ),
            ),
        }
    };
    check(op, status)?;
    Ok(ranked[..got.clamp(0, RANKED as i32) as usize].to_vec())
}

impl ConvAlgos {
    /// Chooses the forward, backward-data and backward-filter algorithms for `x * w -> y` (see
    /// the module docs), with a descriptor per direction in the math type each is to run with,
    /// and sizes their workspace. `Measured` blocks the host while cuDNN times the candidates
    /// (and `kernels` holds the stream while each timed run is enqueued).
    pub fn choose(
        (dnn, kernels): (&Cudnn, &Kernels),
        how: ConvAlgorithm,
        exact: bool,
        x: &TensorDesc,
        w: &FilterDesc,
        geometry: ConvGeometry,
        y: &TensorDesc,
    ) -> Result<ConvAlgos> {
        let math = dnn.math;
        let query = ConvDesc::new(geometry, math)?;
        let descs = (x, w, &query, y);
        let mut chosen = [(0i32, math_type(math)); 3];
        for (direction, slot) in chosen.iter_mut().enumerate() {
            let ranked = rank(dnn, direction, how, descs)?;
            let candidates = eligible(direction, &ranked, math, exact);
            let choice = match how {
                ConvAlgorithm::Heuristic => candidates.first().copied(),
                ConvAlgorithm::Measured => {
                    let near = near_fastest(&candidates);
                    fastest_candidate((dnn, kernels), direction, (x, w, y), geometry, &near)?
                }
            };
            if let Some(p) = choice {
                *slot = (p.algo, run_math_type(math, p.math_type));
                tracing::debug!(
                    direction = DIRECTIONS[direction],
                    algo = p.algo,
                    math_type = p.math_type,
                    deterministic = p.determinism == 1,
                    measured_ms = p.time,
                    "cuDNN convolution algorithm"
                );
            }
        }
        let desc = |d: usize| ConvDesc::with_math_type(geometry, math, chosen[d].1);
        let fwd = Chosen {
            algo: fwd_algo(chosen[0].0).unwrap_or(FALLBACK.0),
            conv: desc(0)?,
        };
        let bwd_data = Chosen {
            algo: bwd_data_algo(chosen[1].0).unwrap_or(FALLBACK.1),
            conv: desc(1)?,
        };
        let bwd_filter = Chosen {
            algo: bwd_filter_algo(chosen[2].0).unwrap_or(FALLBACK.2),
            conv: desc(2)?,
        };

        let (mut a, mut b, mut c) = (0usize, 0usize, 0usize);
        let (h, x, w, y) = (dnn.raw, x.raw, w.raw, y.raw);
        let (fc, dc, wc) = (fwd.conv.raw, bwd_data.conv.raw, bwd_filter.conv.raw);
        let (fa, da, wa) = (fwd.algo, bwd_data.algo, bwd_filter.algo);
        // SAFETY: live descriptors, writable sizes.
        check("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
            sys::cudnnGetConvolutionForwardWorkspaceSize(h, x, w, fc, y, fa, &mut a)
        })?;
        // SAFETY: as above.
        check("cudnnGetConvolutionBackwardDataWorkspaceSize", unsafe {
            sys::cudnnGetConvolutionBackwardDataWorkspaceSize(h, w, y, dc, x, da, &mut b)
        })?;
        // SAFETY: as above.
        check("cudnnGetConvolutionBackwardFilterWorkspaceSize", unsafe {
            sys::cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x, y, wc, w, wa, &mut c)
        })?;
        Ok(ConvAlgos {
            fwd,
            bwd_data,
            bwd_filter,
            workspace: a.max(b).max(c),
        })
    }
}

/// Device addresses and sizes of one call's buffers (raw, so that the layer can pass views of
/// blobs and of the flat parameters alike). The caller guarantees that every address holds the
/// elements its descriptor describes, on the handle's device, and stays alive for the call's
/// stream work.
#[derive(Debug, Clone, Copy)]
pub struct Workspace {
    pub ptr: u64,
    pub bytes: usize,
}

impl Workspace {
    /// The whole of `buf` as the workspace of calls on `s`, with the guard that orders `buf`'s
    /// later use after them: keep it alive while the calls are enqueued.
    pub fn of<'a>(buf: &'a mut CudaSlice<u8>, s: &'a CudaStream) -> (Self, SyncOnDrop<'a>) {
        let bytes = buf.len();
        let (ptr, guard) = buf.device_ptr_mut(s);
        (Workspace { ptr, bytes }, guard)
    }
}

/// Declares the safe-signature wrapper `$name` of the cuDNN convolution routine `$f` (the
/// forward and both backwards take the same parameters but for the types of the operands and of
/// the algorithm): `alpha = 1`, `$a` and `$b` the two operands it reads and `$out` the one it
/// writes, each a `(descriptor, device pointer)` pair, scaled by `beta` before the sum is added.
macro_rules! convolution_call {
    ($(#[$doc:meta])* $name:ident = $f:ident(
        $a:ident: $ad:ty, $b:ident: $bd:ty, $algo:ty
    ) -> $out:ident: $od:ty) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Every pointer must address the elements its descriptor describes on the handle's
        /// device (the workspace at least `ws.bytes` bytes), alive until the stream has run the
        /// call.
        pub unsafe fn $name(
            dnn: &Cudnn,
            $a: (&$ad, u64),
            $b: (&$bd, u64),
            (conv, algo): (&ConvDesc, $algo),
            ws: Workspace,
            beta: f32,
            $out: (&$od, u64),
        ) -> Result<()> {
            let alpha = 1.0f32;
            check(
                stringify!($f),
                sys::$f(
                    dnn.raw,
                    &alpha as *const f32 as *const c_void,
                    $a.0.raw,
                    $a.1 as *const c_void,
                    $b.0.raw,
                    $b.1 as *const c_void,
                    conv.raw,
                    algo,
                    ws.ptr as *mut c_void,
                    ws.bytes,
                    &beta as *const f32 as *const c_void,
                    $out.0.raw,
                    $out.1 as *mut c_void,
                ),
            )
        }
    };
}

convolution_call!(
    /// `y = conv(x, w) + beta · y`.
    conv_forward = cudnnConvolutionForward(x: TensorDesc, w: FilterDesc, FwdAlgo) -> y: TensorDesc
);

convolution_call!(
    /// `dx = conv_transpose(dy, w) + beta · dx`.
    conv_backward_data =
        cudnnConvolutionBackwardData(w: FilterDesc, dy: TensorDesc, BwdDataAlgo) -> dx: TensorDesc
);

convolution_call!(
    /// `dw = corr(x, dy) + beta · dw`.
    conv_backward_filter = cudnnConvolutionBackwardFilter(
        x: TensorDesc, dy: TensorDesc, BwdFilterAlgo
    ) -> dw: FilterDesc
);

pub mod graph;
#[cfg(test)]
mod survey;

#[cfg(test)]
mod tests {
    use super::*;

    /// The first of a ranking's eligible candidates: the choice without timing.
    fn pick(direction: usize, ranked: &[RawPerf], math: MathMode, exact: bool) -> Option<RawPerf> {
        eligible(direction, ranked, math, exact).first().copied()
    }

    /// A successful ranking entry.
    fn perf(algo: i32, determinism: i32, memory: usize) -> RawPerf {
        RawPerf {
            algo,
            status: 0,
            memory,
            determinism,
            ..Default::default()
        }
    }

    /// Runs without cuDNN: the FP32 filter keeps only the GEMM-like algorithms and prefers a
    /// deterministic one.
    #[test]
    fn fp32_choice_skips_fft_and_winograd_and_prefers_deterministic() {
        let ranked = [perf(6, 1, 0), perf(4, 1, 0), perf(0, 0, 0), perf(1, 1, 0)];
        assert_eq!(pick(0, &ranked, MathMode::Fp32, true).unwrap().algo, 1);
        assert_eq!(pick(0, &ranked, MathMode::Tf32, true).unwrap().algo, 6);
        let nondeterministic = [perf(5, 1, 0), perf(0, 0, 0)];
        assert_eq!(
            pick(1, &nondeterministic, MathMode::Fp32, true)
                .unwrap()
                .algo,
            0
        );
        let too_big = [perf(1, 1, WORKSPACE_LIMIT + 1)];
        assert!(pick(2, &too_big, MathMode::Fp32, true).is_none());
    }

    /// A timed entry.
    fn timed(algo: i32, math_type: i32, time: f32) -> RawPerf {
        RawPerf {
            algo,
            math_type,
            time,
            ..Default::default()
        }
    }

    /// Rounds merge into medians: a candidate that was fastest once by luck loses to one that
    /// is fast in most rounds; a failure in any round marks the candidate failed and ranks it
    /// last; the same algorithm in two math types stays two candidates.
    #[test]
    fn timing_rounds_rank_by_median() {
        let rounds = vec![
            vec![timed(1, 0, 0.10), timed(0, 0, 0.20), timed(1, 1, 0.30)],
            vec![timed(0, 0, 0.19), timed(1, 0, 0.25), timed(1, 1, 0.31)],
            vec![timed(0, 0, 0.21), timed(1, 1, 0.29), timed(1, 0, 0.26)],
        ];
        let merged = merge_rounds(&rounds);
        let order: Vec<(i32, i32, f32)> = merged
            .iter()
            .map(|p| (p.algo, p.math_type, p.time))
            .collect();
        assert_eq!(order, vec![(0, 0, 0.20), (1, 0, 0.25), (1, 1, 0.30)]);

        let mut failed = rounds.clone();
        failed[2][0].status = 7;
        let merged = merge_rounds(&failed);
        assert_eq!(merged.last().map(|p| (p.algo, p.status)), Some((0, 7)));
        assert_eq!(merged[0].algo, 1);

        let mut missing = rounds;
        missing[1].retain(|p| p.algo != 0);
        assert_ne!(merge_rounds(&missing)[2].status, 0);
        assert_eq!(merge_rounds(&missing)[2].algo, 0);
        assert!(merge_rounds(&[]).is_empty());
    }

    /// Exact FP32 keeps every deterministic GEMM-like candidate in the ranking's order; of a
    /// measured ranking only the first three within 1.5× of the fastest are timed again.
    #[test]
    fn candidates_timed_again_are_the_near_fastest() {
        let ranked = [
            perf(0, 1, 0),
            perf(6, 1, 0),
            perf(1, 1, 0),
            perf(2, 0, 0),
            perf(3, 1, 0),
        ];
        let algos = |v: Vec<RawPerf>| v.iter().map(|p| p.algo).collect::<Vec<_>>();
        assert_eq!(algos(eligible(0, &ranked, MathMode::Fp32, true)), [0, 1, 3]);
        assert_eq!(
            algos(eligible(0, &ranked, MathMode::Fp32, false)),
            [0, 6, 1, 2, 3]
        );
        let times = [0.10, 0.12, 0.149, 0.15, 0.16];
        let measured: Vec<RawPerf> = times
            .iter()
            .enumerate()
            .map(|(i, &t)| timed(i as i32, 0, t))
            .collect();
        assert_eq!(algos(near_fastest(&measured)), [0, 1, 2]);
        assert_eq!(algos(near_fastest(&measured[2..])), [2, 3, 4]);
        let far = [timed(0, 0, 0.10), timed(1, 0, 0.151), timed(2, 0, 0.12)];
        assert_eq!(algos(near_fastest(&far)), [0, 2]);
        assert!(near_fastest(&[]).is_empty());
    }

    /// Without `conv_exact` the first usable algorithm of the ranking is taken, FFT, Winograd and
    /// non-deterministic ones included; the workspace limit still holds.
    #[test]
    fn inexact_choice_takes_the_first_usable_algorithm() {
        let ranked = [perf(4, 0, 0), perf(1, 1, 0)];
        assert_eq!(pick(0, &ranked, MathMode::Fp32, false).unwrap().algo, 4);
        assert_eq!(pick(0, &ranked, MathMode::Tf32, false).unwrap().algo, 4);
        let too_big = [perf(5, 1, WORKSPACE_LIMIT + 1), perf(0, 0, 0)];
        assert_eq!(pick(2, &too_big, MathMode::Fp32, false).unwrap().algo, 0);
    }
}
