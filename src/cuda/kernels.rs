//! The GPU backend's own kernels: one CUDA C source ([`SOURCE`], the file `kernels.cu` beside
//! this one) with every elementwise, reduction and update kernel the GPU layers and the GPU
//! solver need, compiled by NVRTC once per process and compute capability, loaded once per
//! context into [`Kernels`], and launched through typed methods that check buffer lengths.
//!
//! The source is compiled to PTX for the virtual architecture `compute_XY` of the device (the
//! driver turns it into machine code for the exact chip when the module is loaded) with
//! `--fmad=false`, so that multiply-adds round like the CPU code and the update rules match the
//! CPU solver bit for bit.
//!
//! Every method enqueues on the stream it is given and returns at once; nothing synchronises.
//! Lengths are in elements; a method panics when a buffer is shorter than the elements it is
//! asked to touch (a bug in the caller, never a data error).

use super::gpu_error;
use crate::error::{Error, Result};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The CUDA C source of every kernel: `kernels.cu` (elementwise, loss, update) followed by
/// `kernels/cnn.cu` (the convolutional-net layers), compiled as one program.
pub const SOURCE: &str = concat!(include_str!("kernels.cu"), include_str!("kernels/cnn.cu"));

/// Threads per block of the grid-stride kernels; a multiple of the warp size.
const BLOCK: u32 = 256;
/// Rows per block of the one-warp-per-row kernels (`BLOCK / 32`).
const ROWS_PER_BLOCK: usize = (BLOCK / 32) as usize;
/// Resident blocks per multiprocessor that one wave of a grid-stride kernel aims for.
const BLOCKS_PER_SM: u32 = 8;

/// Declares the kernels: the fields of [`Kernels`], [`KERNEL_NAMES`] and the loader, from one
/// list, so that a name cannot be loaded without being checked against the source.
macro_rules! kernel_set {
    ($($name:ident),* $(,)?) => {
        /// The loaded kernels of one context, with the launch geometry of its device.
        #[derive(Debug)]
        pub struct Kernels {
            $($name: CudaFunction,)*
            /// Blocks of one full wave of a grid-stride kernel on this device.
            max_blocks: u32,
            /// Resident blocks of each of [`IMPLICIT_WGRAD_TILES`]'s kernels on the whole
            /// device.
            implicit_wgrad_slots: [usize; IMPLICIT_WGRAD_TILES.len()],
        }

        /// The names of every kernel [`Kernels`] loads from [`SOURCE`].
        pub const KERNEL_NAMES: &[&str] = &[$(stringify!($name)),*];

        impl Kernels {
            fn from_module(module: &Arc<CudaModule>, max_blocks: u32) -> Result<Kernels> {
                Ok(Kernels {
                    $($name: module
                        .load_function(stringify!($name))
                        .map_err(|e| gpu_error(concat!("load kernel ", stringify!($name)), e))?,)*
                    max_blocks,
                    implicit_wgrad_slots: [1; IMPLICIT_WGRAD_TILES.len()],
                })
            }
        }
    };
}

kernel_set!(
    hold_stream,
    fill,
    scale,
    axpy,
    relu_forward,
    relu_backward,
    sigmoid_forward,
    sigmoid_backward,
    tanh_forward,
    tanh_backward,
    bias_add,
    softmax_loss_forward,
    loss_finalize,
    softmax_loss_backward,
    accuracy_rows,
    accuracy_finalize,
    weighted_sum,
    loss_slot,
    poison_gradient,
    sumsq_partial,
    clip_scale,
    sgd_update,
    nesterov_update,
    adagrad_update,
    rmsprop_update,
    adam_update,
    copy_strided,
    unstride_planes,
    transpose_batched,
    scaled_copy,
    mul_into,
    mul_inplace,
    eltwise_max_step,
    eltwise_max_backward,
    max_pool_forward,
    ave_pool_forward,
    max_pool_backward,
    ave_pool_backward,
    pool_backward_planes,
    max_pool_backward_scatter,
    dropout_forward,
    dropout_backward,
    channel_reduce,
    channel_reduce_finish,
    pair_reduce_finish,
    bn_scale_relu_forward,
    bn_scale_relu_sums,
    bn_scale_relu_finish,
    bn_scale_relu_backward,
    sum2_relu_forward,
    sum2_relu_backward,
    im2col_batch,
    wgrad_partial_4x8_w2,
    wgrad_partial_4x8_w3,
    wgrad_partial_4x8_w4,
    wgrad_partial_4x8_w5,
    wgrad_partial_8x8_w2,
    wgrad_partial_8x8_w3,
    wgrad_partial_8x8_w4,
    wgrad_sum_partials,
    conv_forward_direct,
    direct_sum_splits,
    swap_outer,
    channel_affine,
    channel_scale_backward,
    bn_sums,
    bn_sums_finish,
    bn_batch_stats,
    bn_global_stats,
    bn_normalize,
    bn_update_running,
    bn_backward,
    bn_backward_global,
    softmax_forward,
    softmax_backward,
    power_forward,
    power_backward,
    abs_forward,
    abs_backward,
);

/// The one way every launcher starts a kernel: launches `$func` of `$k` on `$stream` with
/// `$cfg` and the arguments in the kernel's parameter order, mapping an error to one naming the
/// kernel. An argument is `in BUF` (a `DevicePtr` read by the kernel), `out BUF` (a
/// `DevicePtrMut` it writes) or a reference to a value that lives until the launch returns; the
/// device pointers of `in` and `out` buffers are taken on `$stream` and held until the launch
/// has been enqueued. The form `launch!(function F, NAME, stream, cfg, [args])` launches the
/// `CudaFunction` reference `F` instead, for a kernel picked at run time among several of the
/// same parameter list.
macro_rules! launch {
    ($k:expr, $stream:expr, $func:ident, $cfg:expr, [$($args:tt)*]) => {
        launch!(@bind &$k.$func, stringify!($func), $stream, $cfg, [] [$($args)*])
    };
    (function $f:expr, $name:expr, $stream:expr, $cfg:expr, [$($args:tt)*]) => {
        launch!(@bind $f, $name, $stream, $cfg, [] [$($args)*])
    };
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*] []) => {{
        let mut builder = $s.launch_builder($f);
        $(builder.arg($done);)*
        // SAFETY: the arguments match the kernel's parameter list in SOURCE, in order and type
        // (device pointers are passed as 64-bit addresses), and the caller checked that every
        // buffer holds the elements the kernel touches.
        unsafe { builder.launch($cfg) }
            .map(|_| ())
            .map_err(|e| gpu_error(&format!("launch {}", $name), e))
    }};
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*]
        [in $x:expr $(, $($rest:tt)*)?]) => {{
        let (ptr, _guard) = $x.device_ptr($s);
        launch!(@bind $f, $name, $s, $cfg, [$($done,)* &ptr] [$($($rest)*)?])
    }};
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*]
        [out $x:expr $(, $($rest:tt)*)?]) => {{
        let (ptr, _guard) = $x.device_ptr_mut($s);
        launch!(@bind $f, $name, $s, $cfg, [$($done,)* &ptr] [$($($rest)*)?])
    }};
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*]
        [$arg:expr $(, $($rest:tt)*)?]) => {
        launch!(@bind $f, $name, $s, $cfg, [$($done,)* $arg] [$($($rest)*)?])
    };
}

mod cnn;
mod fused;
mod im2col;
pub use cnn::PoolGeom;
pub use fused::BnScaleRelu;
pub use im2col::{ConvGeom, DirectTile, WgradTile, IMPLICIT_WGRAD_TILES};

/// The flat-buffer description of an update step shared by every rule: `w` and `g` `(n)`, the
/// tensors' `ends` `(spans)` (ascending, the last equal to `n`), per-tensor `lr_mult` and
/// `decay_mult` `(spans)`, and the device scalar `scale` `(1)` that multiplies the raw gradient.
pub struct UpdateArgs<'a> {
    pub w: &'a mut CudaSlice<f32>,
    pub g: &'a mut CudaSlice<f32>,
    pub n: usize,
    pub ends: &'a CudaSlice<i64>,
    pub lr_mult: &'a CudaSlice<f32>,
    pub decay_mult: &'a CudaSlice<f32>,
    pub spans: usize,
    pub scale: &'a CudaSlice<f32>,
    /// The iteration's learning rate (before `lr_mult`).
    pub lr: f32,
    pub weight_decay: f32,
    /// L1 instead of L2 regularisation.
    pub l1: bool,
}

/// The rule-specific part of an update step and its history buffers `(n)`.
pub enum Rule<'a> {
    Sgd {
        momentum: f32,
        v: &'a mut CudaSlice<f32>,
    },
    Nesterov {
        momentum: f32,
        v: &'a mut CudaSlice<f32>,
    },
    Adagrad {
        delta: f32,
        h: &'a mut CudaSlice<f32>,
    },
    Rmsprop {
        rho: f32,
        delta: f32,
        h: &'a mut CudaSlice<f32>,
    },
    Adam {
        beta1: f32,
        beta2: f32,
        eps: f32,
        /// `√(1 − β₂ᵗ) / (1 − β₁ᵗ)`.
        correction: f32,
        m: &'a mut CudaSlice<f32>,
        v: &'a mut CudaSlice<f32>,
    },
}

fn check_len(op: &str, what: &str, have: usize, need: usize) {
    assert!(
        have >= need,
        "{op}: `{what}` holds {have} elements, {need} needed"
    );
}

fn to_i32(op: &str, n: usize) -> i32 {
    i32::try_from(n).unwrap_or_else(|_| panic!("{op}: {n} elements exceed the kernel's int range"))
}

impl Kernels {
    /// Compiles [`SOURCE`] for the device of `ctx` (once per process and compute capability)
    /// and loads every kernel into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| gpu_error("query compute capability", e))?;
        let ptx = compiled_ptx(major, minor)?;
        let module = ctx
            .load_module(Ptx::from_src(ptx.as_str()))
            .map_err(|e| gpu_error(&format!("load the kernel module for sm_{major}{minor}"), e))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| gpu_error("query the multiprocessor count", e))?;
        let sms = sms.max(1) as u32;
        let mut kernels = Kernels::from_module(&module, sms * BLOCKS_PER_SM)?;
        let mut slots = [1; IMPLICIT_WGRAD_TILES.len()];
        for (slot, tile) in slots.iter_mut().zip(IMPLICIT_WGRAD_TILES) {
            let kernel = kernels
                .wgrad_partial_kernel(tile)
                .expect("every tile has a kernel");
            let per_sm = kernel
                .occupancy_max_active_blocks_per_multiprocessor(tile.threads() as u32, 0, None)
                .map_err(|e| gpu_error("query the weight-gradient kernels' occupancy", e))?;
            *slot = (per_sm.max(1) * sms) as usize;
        }
        kernels.implicit_wgrad_slots = slots;
        Ok(kernels)
    }

    /// One wave of `BLOCK`-thread blocks over `n` elements (at least one block).
    fn grid(&self, n: usize) -> LaunchConfig {
        let blocks = n
            .div_ceil(BLOCK as usize)
            .clamp(1, self.max_blocks as usize) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One warp per row over `rows` rows.
    fn grid_rows(&self, rows: usize) -> LaunchConfig {
        let blocks = rows
            .div_ceil(ROWS_PER_BLOCK)
            .clamp(1, self.max_blocks as usize) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// A single block (the final step of a reduction).
    fn single_block() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One warp, of which thread 0 works (scalar bookkeeping).
    fn single_thread() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The number of partial sums [`Kernels::sumsq_partial`] writes for `n` elements.
    pub fn sumsq_parts(&self, n: usize) -> usize {
        self.grid(n).grid_dim.0 as usize
    }

    /// Keeps `s` busy for `ns` nanoseconds of device time (`hold_stream`, one thread): work
    /// enqueued behind it starts no sooner.
    pub fn hold_stream(&self, s: &CudaStream, ns: u64) -> Result<()> {
        let ns = i64::try_from(ns).unwrap_or(i64::MAX);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, s, hold_stream, one, [&ns])
    }

    /// `x[..n] = value`.
    pub fn fill(
        &self,
        s: &CudaStream,
        x: &mut impl DevicePtrMut<f32>,
        value: f32,
        n: usize,
    ) -> Result<()> {
        check_len("fill", "x", x.len(), n);
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, fill, self.grid(n), [out x, &value, &n64])
    }

    /// `x[..n] *= alpha`.
    pub fn scale(
        &self,
        s: &CudaStream,
        x: &mut impl DevicePtrMut<f32>,
        alpha: f32,
        n: usize,
    ) -> Result<()> {
        check_len("scale", "x", x.len(), n);
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, scale, self.grid(n), [out x, &alpha, &n64])
    }

    /// `y[..n] += alpha · x[..n]`.
    pub fn axpy(
        &self,
        s: &CudaStream,
        alpha: f32,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        check_len("axpy", "x", x.len(), n);
        check_len("axpy", "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, axpy, self.grid(n), [in x, out y, &alpha, &n64])
    }

    /// `y = x > 0 ? x : slope · x` over `(n)`.
    pub fn relu_forward(
        &self,
        s: &CudaStream,
        slope: f32,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        check_len("relu_forward", "x", x.len(), n);
        check_len("relu_forward", "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32("relu_forward", n);
        launch!(self, s, relu_forward, self.grid(n), [in x, out y, &slope, &ni])
    }

    /// `dx (+)= dy · (x > 0 ? 1 : slope)` over `(n)`; overwrites unless `accumulate`.
    #[allow(clippy::too_many_arguments)]
    pub fn relu_backward(
        &self,
        s: &CudaStream,
        slope: f32,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        for (what, len) in [("x", x.len()), ("dy", dy.len()), ("dx", dx.len())] {
            check_len("relu_backward", what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32("relu_backward", n);
        let acc = accumulate as i32;
        launch!(self, s, relu_backward, self.grid(n), [in x, in dy, out dx, &slope, &ni, &acc])
    }

    /// `y = 1 / (1 + e^(−x))` over `(n)`.
    pub fn sigmoid_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        self.unary("sigmoid_forward", &self.sigmoid_forward, s, x, y, n)
    }

    /// `dx (+)= dy · y · (1 − y)` over `(n)`, from the top's data `y`.
    pub fn sigmoid_backward(
        &self,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.unary_backward(
            "sigmoid_backward",
            &self.sigmoid_backward,
            s,
            y,
            dy,
            dx,
            n,
            accumulate,
        )
    }

    /// `y = tanh(x)` over `(n)`.
    pub fn tanh_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        self.unary("tanh_forward", &self.tanh_forward, s, x, y, n)
    }

    /// `dx (+)= dy · (1 − y²)` over `(n)`, from the top's data `y`.
    pub fn tanh_backward(
        &self,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.unary_backward(
            "tanh_backward",
            &self.tanh_backward,
            s,
            y,
            dy,
            dx,
            n,
            accumulate,
        )
    }

    /// A kernel `(const float* x, float* y, int n)`.
    fn unary(
        &self,
        op: &str,
        f: &CudaFunction,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        launch!(function f, op, s, self.grid(n), [in x, out y, &ni])
    }

    /// A kernel `(const float* y, const float* dy, float* dx, int n, int accumulate)`.
    #[allow(clippy::too_many_arguments)]
    fn unary_backward(
        &self,
        op: &str,
        f: &CudaFunction,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        for (what, len) in [("y", y.len()), ("dy", dy.len()), ("dx", dx.len())] {
            check_len(op, what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        let (ni, acc) = (to_i32(op, n), accumulate as i32);
        launch!(function f, op, s, self.grid(n), [in y, in dy, out dx, &ni, &acc])
    }

    /// `y (rows, cols) += b (cols)` on every row.
    pub fn bias_add(
        &self,
        s: &CudaStream,
        y: &mut impl DevicePtrMut<f32>,
        b: &impl DevicePtr<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        check_len("bias_add", "y", y.len(), rows * cols);
        check_len("bias_add", "b", b.len(), cols);
        if rows * cols == 0 {
            return Ok(());
        }
        let (r, c) = (to_i32("bias_add", rows), to_i32("bias_add", cols));
        to_i32("bias_add", rows * cols);
        launch!(self, s, bias_add, self.grid(rows * cols), [out y, in b, &r, &c])
    }

    /// Softmax with loss, forward: `prob (rows, classes)` = the softmax of each row of
    /// `x (rows, classes)`, then `loss (1)` = the mean over counted rows of
    /// `−ln max(p[label], f32::MIN_POSITIVE)` and `valid (1)` = the counted rows. A row counts
    /// unless its label is `ignore` or not a class. `row_loss` `(rows)` and `row_valid`
    /// `(rows)` are scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn softmax_loss_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        labels: &impl DevicePtr<f32>,
        prob: &mut impl DevicePtrMut<f32>,
        row_loss: &mut impl DevicePtrMut<f64>,
        row_valid: &mut impl DevicePtrMut<f32>,
        loss: &mut impl DevicePtrMut<f32>,
        valid: &mut impl DevicePtrMut<f32>,
        rows: usize,
        classes: usize,
        ignore: Option<f32>,
    ) -> Result<()> {
        let op = "softmax_loss_forward";
        check_len(op, "x", x.len(), rows * classes);
        check_len(op, "labels", labels.len(), rows);
        check_len(op, "prob", prob.len(), rows * classes);
        check_len(op, "row_loss", row_loss.len(), rows);
        check_len(op, "row_valid", row_valid.len(), rows);
        check_len(op, "loss", loss.len(), 1);
        check_len(op, "valid", valid.len(), 1);
        let (r, c) = (to_i32(op, rows), to_i32(op, classes));
        to_i32(op, rows * classes);
        let (has_ignore, ignore) = (ignore.is_some() as i32, ignore.unwrap_or(0.0));
        let (rlp, _rl) = row_loss.device_ptr_mut(s);
        let (rvp, _rv) = row_valid.device_ptr_mut(s);
        if rows > 0 {
            launch!(
                self, s, softmax_loss_forward, self.grid_rows(rows),
                [in x, in labels, out prob, &rlp, &rvp, &r, &c, &has_ignore, &ignore]
            )?;
        }
        launch!(
            self, s, loss_finalize, Kernels::single_block(),
            [&rlp, &rvp, &r, out loss, out valid]
        )
    }

    /// Softmax with loss, backward: `dx (rows, classes) (+)= w / max(V, 1) · (prob − onehot)`
    /// on counted rows, with `w = top_diff[0]` and `V = valid[0]` read on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn softmax_loss_backward(
        &self,
        s: &CudaStream,
        prob: &impl DevicePtr<f32>,
        labels: &impl DevicePtr<f32>,
        top_diff: &impl DevicePtr<f32>,
        valid: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        rows: usize,
        classes: usize,
        ignore: Option<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let op = "softmax_loss_backward";
        check_len(op, "prob", prob.len(), rows * classes);
        check_len(op, "labels", labels.len(), rows);
        check_len(op, "top_diff", top_diff.len(), 1);
        check_len(op, "valid", valid.len(), 1);
        check_len(op, "dx", dx.len(), rows * classes);
        if rows * classes == 0 {
            return Ok(());
        }
        let (r, c) = (to_i32(op, rows), to_i32(op, classes));
        to_i32(op, rows * classes);
        let (has_ignore, ignore) = (ignore.is_some() as i32, ignore.unwrap_or(0.0));
        let acc = accumulate as i32;
        launch!(
            self, s, softmax_loss_backward, self.grid(rows * classes),
            [in prob, in labels, in top_diff, in valid, out dx, &r, &c, &has_ignore, &ignore, &acc]
        )
    }

    /// Top-k accuracy: `out (1)` = the fraction of the `rows` rows of `x (rows, classes)` whose
    /// label has fewer than `top_k` classes scoring strictly higher; rows whose label is
    /// `ignore` (or not a class) count in the denominator, never as correct. `row_correct`
    /// `(rows)` is scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn accuracy(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        labels: &impl DevicePtr<f32>,
        row_correct: &mut impl DevicePtrMut<f32>,
        out: &mut impl DevicePtrMut<f32>,
        rows: usize,
        classes: usize,
        top_k: usize,
        ignore: Option<f32>,
    ) -> Result<()> {
        let op = "accuracy";
        check_len(op, "x", x.len(), rows * classes);
        check_len(op, "labels", labels.len(), rows);
        check_len(op, "row_correct", row_correct.len(), rows);
        check_len(op, "out", out.len(), 1);
        let (r, c, k) = (to_i32(op, rows), to_i32(op, classes), to_i32(op, top_k));
        to_i32(op, rows * classes);
        let (has_ignore, ignore) = (ignore.is_some() as i32, ignore.unwrap_or(0.0));
        let (rcp, _rc) = row_correct.device_ptr_mut(s);
        if rows > 0 {
            launch!(
                self, s, accuracy_rows, self.grid_rows(rows),
                [in x, in labels, &rcp, &r, &c, &k, &has_ignore, &ignore]
            )?;
        }
        launch!(self, s, accuracy_finalize, Kernels::single_block(), [&rcp, &r, out out])
    }

    /// `dst[0] = (reset ? 0 : dst[0]) + weight · src[0]`.
    pub fn weighted_sum(
        &self,
        s: &CudaStream,
        src: &impl DevicePtr<f32>,
        weight: f32,
        dst: &mut impl DevicePtrMut<f32>,
        reset: bool,
    ) -> Result<()> {
        check_len("weighted_sum", "src", src.len(), 1);
        check_len("weighted_sum", "dst", dst.len(), 1);
        let reset = reset as i32;
        launch!(self, s, weighted_sum, Kernels::single_thread(), [in src, &weight, out dst, &reset])
    }

    /// `slots[slot] = (reset ? 0 : slots[slot]) + loss[0]`, in double.
    pub fn loss_slot(
        &self,
        s: &CudaStream,
        loss: &impl DevicePtr<f32>,
        slots: &mut impl DevicePtrMut<f64>,
        slot: usize,
        reset: bool,
    ) -> Result<()> {
        check_len("loss_slot", "loss", loss.len(), 1);
        check_len("loss_slot", "slots", slots.len(), slot + 1);
        let (slot, reset) = (to_i32("loss_slot", slot), reset as i32);
        launch!(self, s, loss_slot, Kernels::single_thread(), [in loss, out slots, &slot, &reset])
    }

    /// `diff_at[0] = NaN` where `loss[0]` (an iteration's summed loss, in double) is not finite:
    /// a replica's non-finite loss reaches every replica through the gradient all-reduce.
    pub fn poison_gradient(
        &self,
        s: &CudaStream,
        loss: &impl DevicePtr<f64>,
        diff_at: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        check_len("poison_gradient", "loss", loss.len(), 1);
        check_len("poison_gradient", "diff_at", diff_at.len(), 1);
        launch!(self, s, poison_gradient, Kernels::single_thread(), [in loss, out diff_at])
    }

    /// `partials[b]` = the sum of squares of block `b`'s share of `x[..n]`, in double, for
    /// `b < sumsq_parts(n)`.
    pub fn sumsq_partial(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        n: usize,
        partials: &mut impl DevicePtrMut<f64>,
    ) -> Result<()> {
        check_len("sumsq_partial", "x", x.len(), n);
        check_len(
            "sumsq_partial",
            "partials",
            partials.len(),
            self.sumsq_parts(n),
        );
        let n64 = n as i64;
        launch!(self, s, sumsq_partial, self.grid(n), [in x, &n64, out partials])
    }

    /// `scale[0] = normalise`, times `clip / norm` when `parts > 0` and
    /// `norm = √(Σ partials[..parts]) · normalise` exceeds `clip`. Where that sum of squares is
    /// not finite, iteration `iter` is recorded in `steps` (`[count, first, last]`, `first` and
    /// `last` −1 until one), and `scale[0]` is NaN, which makes the update kernels apply nothing;
    /// with `latch`, so is it at every iteration after one was recorded.
    #[allow(clippy::too_many_arguments)]
    pub fn clip_scale(
        &self,
        s: &CudaStream,
        partials: &impl DevicePtr<f64>,
        parts: usize,
        normalise: f64,
        clip: f64,
        scale: &mut impl DevicePtrMut<f32>,
        steps: &mut impl DevicePtrMut<i64>,
        iter: u64,
        latch: bool,
    ) -> Result<()> {
        check_len("clip_scale", "partials", partials.len(), parts);
        check_len("clip_scale", "scale", scale.len(), 1);
        check_len("clip_scale", "steps", steps.len(), 3);
        let parts = to_i32("clip_scale", parts);
        let (iter, latch) = (iter.min(i64::MAX as u64) as i64, latch as i32);
        launch!(
            self, s, clip_scale, Kernels::single_block(),
            [in partials, &parts, &normalise, &clip, out scale, out steps, &iter, &latch]
        )
    }

    /// One update step of `rule` over the flat buffers of `a` (see `crate::solver::Solver::apply`
    /// for the formulas, which the kernels follow operation for operation).
    pub fn update(&self, s: &CudaStream, a: UpdateArgs<'_>, rule: Rule<'_>) -> Result<()> {
        let op = "update";
        check_len(op, "w", a.w.len(), a.n);
        check_len(op, "g", a.g.len(), a.n);
        check_len(op, "ends", a.ends.len(), a.spans);
        check_len(op, "lr_mult", a.lr_mult.len(), a.spans);
        check_len(op, "decay_mult", a.decay_mult.len(), a.spans);
        check_len(op, "scale", a.scale.len(), 1);
        if a.n == 0 || a.spans == 0 {
            return Ok(());
        }
        let cfg = self.grid(a.n);
        let n64 = a.n as i64;
        let spans = to_i32(op, a.spans);
        let l1 = a.l1 as i32;
        let (lr, wd) = (a.lr, a.weight_decay);
        // Launches the rule's kernel with the arguments every rule shares (UPDATE_PARAMS in
        // SOURCE), then the rule's own.
        macro_rules! launch_rule {
            ($func:ident, [$($extra:tt)*]) => {
                launch!(
                    self, s, $func, cfg,
                    [
                        out a.w, out a.g, &n64, in a.ends, in a.lr_mult, in a.decay_mult, &spans,
                        in a.scale, &lr, &wd, &l1, $($extra)*
                    ]
                )
            };
        }
        match rule {
            Rule::Sgd { momentum, v } => {
                check_len(op, "v", v.len(), a.n);
                launch_rule!(sgd_update, [out v, &momentum])
            }
            Rule::Nesterov { momentum, v } => {
                check_len(op, "v", v.len(), a.n);
                launch_rule!(nesterov_update, [out v, &momentum])
            }
            Rule::Adagrad { delta, h } => {
                check_len(op, "h", h.len(), a.n);
                launch_rule!(adagrad_update, [out h, &delta])
            }
            Rule::Rmsprop { rho, delta, h } => {
                check_len(op, "h", h.len(), a.n);
                launch_rule!(rmsprop_update, [out h, &rho, &delta])
            }
            Rule::Adam {
                beta1,
                beta2,
                eps,
                correction,
                m,
                v,
            } => {
                check_len(op, "m", m.len(), a.n);
                check_len(op, "v", v.len(), a.n);
                launch_rule!(adam_update, [out m, out v, &beta1, &beta2, &eps, &correction])
            }
        }
    }
}

/// PTX of [`SOURCE`] per compute capability, compiled at most once per process.
fn compiled_ptx(major: i32, minor: i32) -> Result<Arc<String>> {
    /// PTX by compute capability `(major, minor)`.
    type PtxCache = Mutex<HashMap<(i32, i32), Arc<String>>>;
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // A panic while compiling cannot leave the map half-written, so a poisoned lock is usable.
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ptx) = map.get(&(major, minor)) {
        return Ok(ptx.clone());
    }
    let ptx = Arc::new(compile(&format!("compute_{major}{minor}"))?);
    map.insert((major, minor), ptx.clone());
    Ok(ptx)
}

/// Compiles [`SOURCE`] to PTX for the virtual architecture `arch` (e.g. `compute_90`).
pub fn compile(arch: &str) -> Result<String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Device(
            "CUDA: the NVRTC library (libnvrtc.so) cannot be loaded; add the directory that \
             holds it to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let opts = CompileOptions {
        fmad: Some(false),
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("kernels.cu".into()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
        CompileError::CompileError { log, .. } => gpu_error(
            &format!("NVRTC compile of kernels.cu for {arch}"),
            log.to_string_lossy(),
        ),
        other => gpu_error(&format!("NVRTC compile of kernels.cu for {arch}"), other),
    })?;
    Ok(ptx.to_src())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs without a GPU: every kernel the host loads is defined in the source, so a typo
    /// fails here rather than at load time on a GPU machine.
    #[test]
    fn source_defines_every_loaded_kernel() {
        assert!(!SOURCE.trim().is_empty());
        for name in KERNEL_NAMES {
            let decl = format!("extern \"C\" __global__ void {name}(");
            assert_eq!(
                SOURCE.matches(&decl).count(),
                1,
                "kernels.cu must define `{name}` exactly once"
            );
        }
        let defined = SOURCE.matches("extern \"C\" __global__ void ").count();
        assert_eq!(
            defined,
            KERNEL_NAMES.len(),
            "a kernel in kernels.cu is never loaded"
        );
    }

    /// Compiles the source with NVRTC where the library is present (it needs no GPU), and says
    /// so loudly where it is not.
    #[test]
    fn source_compiles_with_nvrtc() {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            crate::cuda::test_util::skip_loudly(concat!(
                "SKIPPED (no NVRTC library): ",
                module_path!(),
                "::source_compiles_with_nvrtc"
            ));
            return;
        }
        let ptx = compile("compute_80").unwrap_or_else(|e| panic!("{e}"));
        for name in KERNEL_NAMES {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "the PTX lacks the entry `{name}`"
            );
        }
    }
}
