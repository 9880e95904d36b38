//! Launchers of the convolutional-net kernels (`kernels/cnn.cu`): copies and elementwise
//! products, Caffe's pooling kernels, dropout's counter-based mask, per-channel affine maps and
//! reductions, BatchNorm's statistics, softmax, power and absolute value.
//!
//! Shapes are in the docs of each method; a "channel view" `(outer, dim, inner)` of a blob has
//! the channel index `(i / inner) % dim`. As in the parent module, every method enqueues on the
//! stream it is given, checks buffer lengths (panicking on a caller's bug) and returns at once.

use super::{check_len, to_i32, Kernels, BLOCK};
use crate::cuda::gpu_error;
use crate::error::Result;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use std::sync::Arc;

/// The geometry of a 2-D pooling over `(N, channels, height, width)` into
/// `(N, channels, pooled_h, pooled_w)`, both stored NCHW or both NHWC, as the kernels' `PoolGeom`
/// struct (passed by value).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolGeom {
    pub channels: i32,
    pub height: i32,
    pub width: i32,
    pub pooled_h: i32,
    pub pooled_w: i32,
    pub kernel_h: i32,
    pub kernel_w: i32,
    pub stride_h: i32,
    pub stride_w: i32,
    pub pad_h: i32,
    pub pad_w: i32,
    /// 1 when both tensors are stored channels-last (NHWC), 0 for NCHW.
    pub nhwc: i32,
}

// SAFETY: `#[repr(C)]` of twelve i32, the layout of the C struct of the same fields.
unsafe impl DeviceRepr for PoolGeom {}

/// Shared memory `pool_backward_planes` and `max_pool_backward_scatter` may take per block: the
/// default limit, without opting in to more.
const PLANE_SHARED_LIMIT: usize = 48 << 10;

/// Elements of a pass of `pool_backward_planes` each thread takes at once: the constant of the
/// same name in cnn.cu.
const PLANE_RUN: usize = 4;

/// The most rounds `max_pool_backward_scatter` runs per plane (one barrier each); beyond them
/// (windows overlapping many times, as in global pooling) `pool_backward_planes` runs instead.
const SCATTER_ROUNDS_MAX: usize = 9;

impl PoolGeom {
    /// Elements of one sample of the bottom.
    fn bottom_per_sample(&self) -> usize {
        (self.channels * self.height * self.width) as usize
    }

    /// Elements of one sample of the top.
    fn top_per_sample(&self) -> usize {
        (self.channels * self.pooled_h * self.pooled_w) as usize
    }

    /// Elements of one `(n, c)` plane of the bottom and of the top.
    fn plane_areas(&self) -> (usize, usize) {
        (
            (self.height * self.width) as usize,
            (self.pooled_h * self.pooled_w) as usize,
        )
    }

    /// Threads per block of a plane kernel: enough warps for the larger of the bottom and top
    /// planes, at most `BLOCK`.
    fn plane_threads(&self) -> usize {
        let (area, pooled) = self.plane_areas();
        area.max(pooled).next_multiple_of(32).min(BLOCK as usize)
    }

    /// Shared-memory bytes of `pool_backward_planes` taking `per_pass` planes at a time:
    /// covering tables, divisors, the top gradient and argmax planes (the argmax planes are
    /// unused when averaging).
    fn plane_shared_bytes(&self, per_pass: usize) -> usize {
        let (_, pooled) = self.plane_areas();
        let (h, w, ph, pw) = (
            self.height as usize,
            self.width as usize,
            self.pooled_h as usize,
            self.pooled_w as usize,
        );
        4 * (2 * (h + w) + ph + pw + 2 * per_pass * pooled)
    }

    /// The planes `pool_backward_planes` takes per pass: as many as give each thread
    /// `PLANE_RUN` elements, fewer where their top planes would not fit in shared memory, at
    /// least one.
    fn planes_per_pass(&self) -> usize {
        let (area, _) = self.plane_areas();
        let mut per_pass = (PLANE_RUN * self.plane_threads() / area.max(1)).max(1);
        while per_pass > 1 && self.plane_shared_bytes(per_pass) > PLANE_SHARED_LIMIT {
            per_pass -= 1;
        }
        per_pass
    }

    /// The rounds of `max_pool_backward_scatter` per axis: the most windows that cover one
    /// pixel, `ceil(kernel / stride)`.
    fn scatter_rounds(&self) -> (usize, usize) {
        let per_axis = |k: i32, s: i32| (k as usize).div_ceil(s as usize);
        (
            per_axis(self.kernel_h, self.stride_h),
            per_axis(self.kernel_w, self.stride_w),
        )
    }

    /// Shared-memory bytes of `max_pool_backward_scatter`: covering tables, the top plane's
    /// argmax, round and gradient, the bottom plane's gradient.
    fn scatter_shared_bytes(&self) -> usize {
        let (area, pooled) = self.plane_areas();
        let (h, w) = (self.height as usize, self.width as usize);
        4 * (2 * (h + w) + 3 * pooled + area)
    }
}

impl Kernels {
    /// The launch of a plane kernel (`pool_backward_planes`, `max_pool_backward_scatter`) taking
    /// `bytes` of shared memory over `passes` groups of `(n, c)` planes of `g` (one block at a
    /// time each), or `None` where the generic kernel has to run: channels-last storage, or a
    /// plane too large for shared memory. A block has [`PoolGeom::plane_threads`] threads, and
    /// the grid fills one wave of such blocks.
    fn backward_plane_grid(
        &self,
        g: &PoolGeom,
        passes: usize,
        bytes: usize,
    ) -> Option<LaunchConfig> {
        if g.nhwc != 0 || bytes > PLANE_SHARED_LIMIT || passes == 0 {
            return None;
        }
        let threads = g.plane_threads();
        let wave = self.max_blocks as usize * BLOCK as usize / threads;
        Some(LaunchConfig {
            grid_dim: (passes.min(wave) as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: bytes as u32,
        })
    }

    /// `pool_backward_planes`'s launch over the `planes` planes of `g` and its planes per pass
    /// ([`PoolGeom::planes_per_pass`]), or `None` where the generic kernel has to run.
    fn pool_planes_grid(&self, g: &PoolGeom, planes: usize) -> Option<(LaunchConfig, i32)> {
        let per_pass = g.planes_per_pass();
        let passes = planes.div_ceil(per_pass);
        let cfg = self.backward_plane_grid(g, passes, g.plane_shared_bytes(per_pass))?;
        Some((cfg, per_pass as i32))
    }

    /// Stage 1 of a two-stage channel reduction over the view `(outer, dim, inner)`: its grid
    /// and the number of chunks each channel's values are split into (see `view_sums` in
    /// `cnn.cu`). For `inner > 1` a block of `BLOCK` threads per channel and chunk; for
    /// `inner == 1` (channels-last) a block of 32 × 8 threads per tile of 32 channels and chunk
    /// of rows. Enough blocks to fill the device a few times, none with fewer than a few
    /// thousand values.
    pub(super) fn grid_channel_sums(
        &self,
        (outer, dim, inner): (usize, usize, usize),
    ) -> (LaunchConfig, usize) {
        const MIN_CHUNK: usize = 4096;
        const TILE: usize = 32;
        let (blocks_y, per_block_row, block_dim) = if inner == 1 {
            (dim.div_ceil(TILE), TILE, (TILE as u32, 8, 1))
        } else {
            (dim, 1, (BLOCK, 1, 1))
        };
        let want = (4 * self.max_blocks as usize).div_ceil(blocks_y.max(1));
        let values = outer * inner * per_block_row;
        let splits = want.min(values.div_ceil(MIN_CHUNK)).clamp(1, 1024);
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, blocks_y as u32, 1),
            block_dim,
            shared_mem_bytes: 0,
        };
        (cfg, splits)
    }

    /// `y[b] (+)= x[b]ᵀ` for `batch` row-major `(rows, cols)` matrices `x`, each becoming
    /// `(cols, rows)`: NCHW ↔ NHWC (`rows = C, cols = H·W` or the reverse) and KCRS ↔ KRSC.
    #[allow(clippy::too_many_arguments)]
    pub fn transpose(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        batch: usize,
        (rows, cols): (usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "transpose";
        let n = batch * rows * cols;
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ri, ci) = (to_i32(op, rows), to_i32(op, cols));
        let acc = accumulate as i32;
        let batch = u32::try_from(batch)
            .ok()
            .filter(|&b| b <= 65_535)
            .unwrap_or_else(|| panic!("{op}: {batch} matrices exceed the grid"));
        let cfg = LaunchConfig {
            grid_dim: (cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, batch),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, s, transpose_batched, cfg, [in x, out y, &ri, &ci, &acc])
    }

    /// `dx (planes, h, w, inner) (+)= ` `t (planes, oh, ow, inner)` spread to the positions
    /// `(oy·sh, ox·sw)`, zero elsewhere: the data gradient of a strided 1 × 1 convolution
    /// without padding from `t = Wᵀ·dy` (NCHW: `planes = N·C`, `inner = 1`; NHWC: `planes = N`,
    /// `inner = C`).
    #[allow(clippy::too_many_arguments)]
    pub fn unstride_planes(
        &self,
        s: &CudaStream,
        t: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        (planes, oh, ow, inner): (usize, usize, usize, usize),
        (h, w): (usize, usize),
        (sh, sw): (usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "unstride_planes";
        let n = planes * h * w * inner;
        if n == 0 {
            return Ok(());
        }
        assert!(
            sh > 0 && sw > 0 && oh <= h.div_ceil(sh) && ow <= w.div_ceil(sw),
            "{op}: a ({oh}, {ow}) grid of strides ({sh}, {sw}) does not fit ({h}, {w})"
        );
        check_len(op, "t", t.len(), planes * oh * ow * inner);
        check_len(op, "dx", dx.len(), n);
        to_i32(op, n);
        let ints = [planes, oh, ow, h, w, sh, sw, inner].map(|v| to_i32(op, v));
        let [pi, ohi, owi, hi, wi, shi, swi, ii] = ints;
        let acc = accumulate as i32;
        launch!(
            self, s, unstride_planes, self.grid(n),
            [in t, out dx, &pi, &ohi, &owi, &hi, &wi, &shi, &swi, &ii, &acc]
        )
    }

    /// `dst[r·dst_stride + dst_off + c] (+)= src[r·src_stride + src_off + c]` for `r < rows`,
    /// `c < cols`.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_strided(
        &self,
        s: &CudaStream,
        src: &impl DevicePtr<f32>,
        dst: &mut impl DevicePtrMut<f32>,
        rows: usize,
        cols: usize,
        (src_stride, src_off): (usize, usize),
        (dst_stride, dst_off): (usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "copy_strided";
        if rows * cols == 0 {
            return Ok(());
        }
        check_len(
            op,
            "src",
            src.len(),
            (rows - 1) * src_stride + src_off + cols,
        );
        check_len(
            op,
            "dst",
            dst.len(),
            (rows - 1) * dst_stride + dst_off + cols,
        );
        let (r, c) = (to_i32(op, rows), to_i32(op, cols));
        to_i32(op, rows * cols);
        let (ss, so) = (to_i32(op, src_stride), to_i32(op, src_off));
        let (ds, doff) = (to_i32(op, dst_stride), to_i32(op, dst_off));
        to_i32(op, src.len().max(dst.len()));
        let acc = accumulate as i32;
        launch!(
            self, s, copy_strided, self.grid(rows * cols),
            [in src, out dst, &r, &c, &ss, &so, &ds, &doff, &acc]
        )
    }

    /// `y (+)= alpha · x` over `(n)`.
    pub fn scaled_copy(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        alpha: f32,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let op = "scaled_copy";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        let acc = accumulate as i32;
        launch!(self, s, scaled_copy, self.grid(n), [in x, out y, &alpha, &ni, &acc])
    }

    /// `y = a · b` over `(n)`.
    pub fn mul_into(
        &self,
        s: &CudaStream,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        let op = "mul_into";
        check_len(op, "a", a.len(), n);
        check_len(op, "b", b.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        launch!(self, s, mul_into, self.grid(n), [in a, in b, out y, &ni])
    }

    /// `y *= x` over `(n)`.
    pub fn mul_inplace(
        &self,
        s: &CudaStream,
        y: &mut impl DevicePtrMut<f32>,
        x: &impl DevicePtr<f32>,
        n: usize,
    ) -> Result<()> {
        let op = "mul_inplace";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        launch!(self, s, mul_inplace, self.grid(n), [out y, in x, &ni])
    }

    /// Eltwise MAX with bottom `k`: `k = 0` sets `y = x, mask = 0`; later bottoms replace where
    /// strictly greater (`mask = k`). `(n)` each.
    pub fn eltwise_max_step(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        mask: &mut CudaSlice<i32>,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let op = "eltwise_max_step";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        check_len(op, "mask", mask.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, ki) = (to_i32(op, n), to_i32(op, k));
        launch!(self, s, eltwise_max_step, self.grid(n), [in x, out y, out mask, &ki, &ni])
    }

    /// `dx (+)= mask == k ? dy : 0` over `(n)`.
    #[allow(clippy::too_many_arguments)]
    pub fn eltwise_max_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        mask: &CudaSlice<i32>,
        dx: &mut impl DevicePtrMut<f32>,
        k: usize,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let op = "eltwise_max_backward";
        check_len(op, "dy", dy.len(), n);
        check_len(op, "mask", mask.len(), n);
        check_len(op, "dx", dx.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, ki, acc) = (to_i32(op, n), to_i32(op, k), accumulate as i32);
        launch!(
            self, s, eltwise_max_backward, self.grid(n),
            [in dy, in mask, out dx, &ki, &ni, &acc]
        )
    }

    /// Max pooling forward over `batch` samples: `y (N, C, PH, PW)` and the argmax plane index
    /// `mask` (same shape) from `x (N, C, H, W)`; with `relu`, followed by a ReLU (a maximum
    /// that is not positive becomes 0 with no argmax, -1).
    #[allow(clippy::too_many_arguments)]
    pub fn max_pool_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        mask: &mut CudaSlice<i32>,
        batch: usize,
        g: PoolGeom,
        relu: bool,
    ) -> Result<()> {
        let op = "max_pool_forward";
        let top = batch * g.top_per_sample();
        check_len(op, "x", x.len(), batch * g.bottom_per_sample());
        check_len(op, "y", y.len(), top);
        check_len(op, "mask", mask.len(), top);
        if top == 0 {
            return Ok(());
        }
        let ti = to_i32(op, top);
        to_i32(op, batch * g.bottom_per_sample());
        let relu = i32::from(relu);
        launch!(self, s, max_pool_forward, self.grid(top), [in x, out y, out mask, &ti, &g, &relu])
    }

    /// Average pooling forward over `batch` samples (Caffe's divisor; see the kernel); with
    /// `relu_slope`, of the ReLU of `x` with that negative slope (a ReLU before the pooling).
    pub fn ave_pool_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        batch: usize,
        g: PoolGeom,
        relu_slope: Option<f32>,
    ) -> Result<()> {
        let op = "ave_pool_forward";
        let top = batch * g.top_per_sample();
        check_len(op, "x", x.len(), batch * g.bottom_per_sample());
        check_len(op, "y", y.len(), top);
        if top == 0 {
            return Ok(());
        }
        let ti = to_i32(op, top);
        to_i32(op, batch * g.bottom_per_sample());
        let (relu, slope) = (i32::from(relu_slope.is_some()), relu_slope.unwrap_or(0.0));
        launch!(self, s, ave_pool_forward, self.grid(top), [in x, out y, &ti, &g, &relu, &slope])
    }

    /// Max pooling backward: `dx (N, C, H, W) (+)=` the top diffs routed by `mask`. NCHW planes
    /// that fit in shared memory take `max_pool_backward_scatter` (or, where windows overlap
    /// more than `SCATTER_ROUNDS_MAX` times, `pool_backward_planes`), others the generic
    /// kernel; all three sum in the same order.
    #[allow(clippy::too_many_arguments)]
    pub fn max_pool_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        mask: &CudaSlice<i32>,
        dx: &mut impl DevicePtrMut<f32>,
        batch: usize,
        g: PoolGeom,
        accumulate: bool,
    ) -> Result<()> {
        let op = "max_pool_backward";
        let bottom = batch * g.bottom_per_sample();
        check_len(op, "dy", dy.len(), batch * g.top_per_sample());
        check_len(op, "mask", mask.len(), batch * g.top_per_sample());
        check_len(op, "dx", dx.len(), bottom);
        if bottom == 0 {
            return Ok(());
        }
        let bi = to_i32(op, bottom);
        let acc = accumulate as i32;
        let (dyp, _dy) = dy.device_ptr(s);
        let (mp, _m) = mask.device_ptr(s);
        let (dxp, _dx) = dx.device_ptr_mut(s);
        let planes = batch * g.channels as usize;
        let (rounds_h, rounds_w) = g.scatter_rounds();
        let scatter = (rounds_h * rounds_w <= SCATTER_ROUNDS_MAX)
            .then(|| self.backward_plane_grid(&g, planes, g.scatter_shared_bytes()))
            .flatten();
        if let Some(cfg) = scatter {
            let (pi, rh, rw) = (planes as i32, rounds_h as i32, rounds_w as i32);
            return launch!(
                self,
                s,
                max_pool_backward_scatter,
                cfg,
                [&dyp, &mp, &dxp, &pi, &g, &rh, &rw, &acc]
            );
        }
        if let Some((cfg, per_pass)) = self.pool_planes_grid(&g, planes) {
            // No ReLU: the bottom's values are never read.
            let (pi, average, no_x, relu, slope) = (planes as i32, 0i32, 0u64, 0i32, 0f32);
            return launch!(
                self,
                s,
                pool_backward_planes,
                cfg,
                [&dyp, &mp, &dxp, &pi, &g, &average, &acc, &no_x, &relu, &slope, &per_pass]
            );
        }
        launch!(
            self,
            s,
            max_pool_backward,
            self.grid(bottom),
            [&dyp, &mp, &dxp, &bi, &g, &acc]
        )
    }

    /// Average pooling backward: `dx (+)= Σ over covering windows of dy / pool_size`; with
    /// `relu = Some((x, slope))` (a ReLU before the pooling, `x` its input), times the ReLU's
    /// derivative at `x`.
    #[allow(clippy::too_many_arguments)]
    pub fn ave_pool_backward<X: DevicePtr<f32>>(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        batch: usize,
        g: PoolGeom,
        accumulate: bool,
        relu: Option<(&X, f32)>,
    ) -> Result<()> {
        let op = "ave_pool_backward";
        let bottom = batch * g.bottom_per_sample();
        check_len(op, "dy", dy.len(), batch * g.top_per_sample());
        check_len(op, "dx", dx.len(), bottom);
        if let Some((x, _)) = relu {
            check_len(op, "x", x.len(), bottom);
        }
        if bottom == 0 {
            return Ok(());
        }
        let bi = to_i32(op, bottom);
        let acc = accumulate as i32;
        let (dyp, _dy) = dy.device_ptr(s);
        let (dxp, _dx) = dx.device_ptr_mut(s);
        // Without a ReLU the bottom's values are never read.
        let (xp, _x) = match relu {
            Some((x, _)) => {
                let (p, guard) = x.device_ptr(s);
                (p, Some(guard))
            }
            None => (0u64, None),
        };
        let (relu_i, slope) = (i32::from(relu.is_some()), relu.map_or(0.0, |r| r.1));
        let planes = batch * g.channels as usize;
        if let Some((cfg, per_pass)) = self.pool_planes_grid(&g, planes) {
            // No argmax plane when averaging: the mask argument is never read.
            let (pi, average, no_mask) = (planes as i32, 1i32, 0u64);
            return launch!(
                self,
                s,
                pool_backward_planes,
                cfg,
                [&dyp, &no_mask, &dxp, &pi, &g, &average, &acc, &xp, &relu_i, &slope, &per_pass]
            );
        }
        launch!(
            self,
            s,
            ave_pool_backward,
            self.grid(bottom),
            [&dyp, &dxp, &bi, &g, &acc, &xp, &relu_i, &slope]
        )
    }

    /// Dropout forward over `(n)` = samples × `per_sample`: `y = u ≥ ratio ? x · scale : 0`,
    /// `u` the contract's hash of `(seed, iter, first_sample + sample, element)`, the element
    /// numbered in NCHW order: `chans > 0` says the samples are stored channels-last with
    /// `chans` channels per pixel, 0 that they are stored in that order.
    #[allow(clippy::too_many_arguments)]
    pub fn dropout_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
        (per_sample, chans): (usize, usize),
        (seed, iter, first_sample): (u64, u64, u64),
        ratio: f32,
        scale: f32,
    ) -> Result<()> {
        let op = "dropout_forward";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, pi) = (to_i32(op, n), to_i32(op, per_sample.max(1)));
        let chans = to_i32(op, chans);
        launch!(
            self, s, dropout_forward, self.grid(n),
            [in x, out y, &ni, &pi, &chans, &seed, &iter, &first_sample, &ratio, &scale]
        )
    }

    /// Dropout backward: `dx (+)= u ≥ ratio ? dy · scale : 0` with the forward's mask.
    #[allow(clippy::too_many_arguments)]
    pub fn dropout_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        (per_sample, chans): (usize, usize),
        (seed, iter, first_sample): (u64, u64, u64),
        ratio: f32,
        scale: f32,
        accumulate: bool,
    ) -> Result<()> {
        let op = "dropout_backward";
        check_len(op, "dy", dy.len(), n);
        check_len(op, "dx", dx.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, pi) = (to_i32(op, n), to_i32(op, per_sample.max(1)));
        let chans = to_i32(op, chans);
        let acc = accumulate as i32;
        launch!(
            self, s, dropout_backward, self.grid(n),
            [in dy, out dx, &ni, &pi, &chans, &seed, &iter, &first_sample, &ratio, &scale, &acc]
        )
    }

    /// `out[d] (+)= Σ_{o,i} a · (b or 1)` at `(o, d, i)` of the view `(outer, dim, inner)`, in
    /// double with a fixed summation tree. `use_b = false` ignores `b`.
    #[allow(clippy::too_many_arguments)]
    pub fn channel_reduce(
        &self,
        s: &Arc<CudaStream>,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        use_b: bool,
        out: &mut impl DevicePtrMut<f32>,
        (outer, dim, inner): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "channel_reduce";
        let n = outer * dim * inner;
        check_len(op, "a", a.len(), n);
        if use_b {
            check_len(op, "b", b.len(), n);
        }
        check_len(op, "out", out.len(), dim);
        if dim == 0 {
            return Ok(());
        }
        to_i32(op, n);
        let (o, d, i) = (to_i32(op, outer), to_i32(op, dim), to_i32(op, inner));
        let (hb, acc) = (use_b as i32, accumulate as i32);
        let (grid, splits) = self.grid_channel_sums((outer, dim, inner));
        let sp = to_i32(op, splits);
        // Stream-ordered scratch (the context's memory pool), freed in stream order on drop.
        let mut partial = s
            .alloc_zeros::<f64>(dim * splits)
            .map_err(|e| gpu_error("channel_reduce scratch", e))?;
        {
            let (pp, _p) = partial.device_ptr_mut(s);
            launch!(self, s, channel_reduce, grid, [in a, in b, &hb, &pp, &o, &d, &i, &sp])?;
        }
        let (pp, _p) = partial.device_ptr(s);
        launch!(self, s, channel_reduce_finish, self.grid_rows(dim), [&pp, out out, &d, &sp, &acc])
    }

    /// Both sums of a Scale layer's gradient in one pass over a channel view
    /// `(outer, dim, inner)`: `out[d] (+)= Σ a·b`, `out[dim + d] (+)= Σ a` (`out` at least
    /// `2·dim`); the same chunking, and so the same values, as two [`Kernels::channel_reduce`]
    /// calls.
    pub fn channel_reduce_pair(
        &self,
        s: &Arc<CudaStream>,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
        (outer, dim, inner): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "channel_reduce_pair";
        let n = outer * dim * inner;
        check_len(op, "a", a.len(), n);
        check_len(op, "b", b.len(), n);
        check_len(op, "out", out.len(), 2 * dim);
        if dim == 0 {
            return Ok(());
        }
        to_i32(op, n);
        let (o, d, i) = (to_i32(op, outer), to_i32(op, dim), to_i32(op, inner));
        let (grid, splits) = self.grid_channel_sums((outer, dim, inner));
        let sp = to_i32(op, splits);
        let (has_b, acc) = (1i32, accumulate as i32);
        let mut partial = s
            .alloc_zeros::<f64>(2 * dim * splits)
            .map_err(|e| gpu_error("channel_reduce_pair scratch", e))?;
        {
            let (pp, _p) = partial.device_ptr_mut(s);
            launch!(self, s, bn_sums, grid, [in a, in b, &has_b, &pp, &o, &d, &i, &sp])?;
        }
        let (pp, _p) = partial.device_ptr(s);
        launch!(self, s, pair_reduce_finish, self.grid_rows(dim), [&pp, out out, &d, &sp, &acc])
    }

    /// `y = x · scale[d] + bias[d]` over `(n)` viewed as `(n / (dim·inner), dim, inner)`; an
    /// absent `scale` or `bias` is skipped.
    #[allow(clippy::too_many_arguments)]
    pub fn channel_affine(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        scale: Option<&CudaView<'_, f32>>,
        bias: Option<&CudaView<'_, f32>>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
        (dim, inner): (usize, usize),
    ) -> Result<()> {
        let op = "channel_affine";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        for (what, v) in [("scale", scale), ("bias", bias)] {
            if let Some(v) = v {
                check_len(op, what, v.len(), dim);
            }
        }
        if n == 0 {
            return Ok(());
        }
        let (ni, d, i) = (to_i32(op, n), to_i32(op, dim), to_i32(op, inner));
        // An absent operand passes x's address, never read (its flag is 0).
        let (sp, _s) = match scale {
            Some(v) => v.device_ptr(s),
            None => x.device_ptr(s),
        };
        let (bp, _b) = match bias {
            Some(v) => v.device_ptr(s),
            None => x.device_ptr(s),
        };
        let (hs, hb) = (scale.is_some() as i32, bias.is_some() as i32);
        launch!(
            self, s, channel_affine, self.grid(n),
            [in x, &sp, &hs, &bp, &hb, out y, &ni, &d, &i]
        )
    }

    /// `y += bias[d]` in place over `(n)` viewed as `(n / (dim·inner), dim, inner)` (a
    /// convolution's bias: `dim` output channels of `inner` pixels).
    pub fn channel_bias_inplace(
        &self,
        s: &CudaStream,
        y: &mut impl DevicePtrMut<f32>,
        bias: &CudaView<'_, f32>,
        n: usize,
        (dim, inner): (usize, usize),
    ) -> Result<()> {
        let op = "channel_bias_inplace";
        check_len(op, "y", y.len(), n);
        check_len(op, "bias", bias.len(), dim);
        if n == 0 {
            return Ok(());
        }
        let (ni, d, i) = (to_i32(op, n), to_i32(op, dim), to_i32(op, inner));
        let (yp, _y) = y.device_ptr_mut(s);
        // channel_affine reads x[i] before it writes y[i]: x = y is its in-place form; the
        // scale operand is absent (flag 0, never read).
        let (no, yes) = (0i32, 1i32);
        launch!(
            self, s, channel_affine, self.grid(n),
            [&yp, &yp, &no, in bias, &yes, &yp, &ni, &d, &i]
        )
    }

    /// `dx (+)= dy · scale[d]` over `(n)` viewed as `(·, dim, inner)`.
    #[allow(clippy::too_many_arguments)]
    pub fn channel_scale_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        scale: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        (dim, inner): (usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "channel_scale_backward";
        check_len(op, "dy", dy.len(), n);
        check_len(op, "scale", scale.len(), dim);
        check_len(op, "dx", dx.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, d, i) = (to_i32(op, n), to_i32(op, dim), to_i32(op, inner));
        let acc = accumulate as i32;
        launch!(
            self, s, channel_scale_backward, self.grid(n),
            [in dy, in scale, out dx, &ni, &d, &i, &acc]
        )
    }

    /// BatchNorm sums over `a (N, C, S)`: `sums (2C + 1)` = `[Σ a (C), Σ a·b (C), N·S]`, with
    /// `b = a` when `b` is `None`; per channel in double.
    pub fn bn_sums(
        &self,
        s: &Arc<CudaStream>,
        a: &impl DevicePtr<f32>,
        b: Option<&CudaView<'_, f32>>,
        sums: &mut CudaSlice<f64>,
        (n, c, sp): (usize, usize, usize),
    ) -> Result<()> {
        let op = "bn_sums";
        let count = n * c * sp;
        check_len(op, "a", a.len(), count);
        if let Some(b) = b {
            check_len(op, "b", b.len(), count);
        }
        check_len(op, "sums", sums.len(), 2 * c + 1);
        if c == 0 {
            return Ok(());
        }
        to_i32(op, count);
        let (ni, ci, si) = (to_i32(op, n), to_i32(op, c), to_i32(op, sp));
        let (bp, _b) = match b {
            Some(v) => v.device_ptr(s),
            None => a.device_ptr(s),
        };
        let hb = b.is_some() as i32;
        let (grid, splits) = self.grid_channel_sums((n, c, sp));
        let spl = to_i32(op, splits);
        let per = to_i32(op, n * sp);
        let mut partial = s
            .alloc_zeros::<f64>(2 * c * splits)
            .map_err(|e| gpu_error("bn_sums scratch", e))?;
        {
            let (pp, _p) = partial.device_ptr_mut(s);
            launch!(self, s, bn_sums, grid, [in a, &bp, &hb, &pp, &ni, &ci, &si, &spl])?;
        }
        let (pp, _p) = partial.device_ptr(s);
        launch!(self, s, bn_sums_finish, self.grid_rows(c), [&pp, out sums, &ci, &spl, &per])
    }

    /// Batch statistics `mean, var, inv_std (C)` from `sums (2C + 1)` of x and x².
    #[allow(clippy::too_many_arguments)]
    pub fn bn_batch_stats(
        &self,
        s: &CudaStream,
        sums: &CudaSlice<f64>,
        c: usize,
        eps: f32,
        mean: &mut CudaSlice<f32>,
        var: &mut CudaSlice<f32>,
        inv_std: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "bn_batch_stats";
        check_len(op, "sums", sums.len(), 2 * c + 1);
        for (what, len) in [
            ("mean", mean.len()),
            ("var", var.len()),
            ("inv_std", inv_std.len()),
        ] {
            check_len(op, what, len, c);
        }
        if c == 0 {
            return Ok(());
        }
        let ci = to_i32(op, c);
        launch!(
            self, s, bn_batch_stats, self.grid(c),
            [in sums, &ci, &eps, out mean, out var, out inv_std]
        )
    }

    /// Global statistics `mean, var, inv_std (C)` from `params (2C + 1)` = running mean, running
    /// variance, factor.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_global_stats(
        &self,
        s: &CudaStream,
        params: &impl DevicePtr<f32>,
        c: usize,
        eps: f32,
        mean: &mut CudaSlice<f32>,
        var: &mut CudaSlice<f32>,
        inv_std: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "bn_global_stats";
        check_len(op, "params", params.len(), 2 * c + 1);
        for (what, len) in [
            ("mean", mean.len()),
            ("var", var.len()),
            ("inv_std", inv_std.len()),
        ] {
            check_len(op, what, len, c);
        }
        if c == 0 {
            return Ok(());
        }
        let ci = to_i32(op, c);
        launch!(
            self, s, bn_global_stats, self.grid(c),
            [in params, &ci, &eps, out mean, out var, out inv_std]
        )
    }

    /// `y = (x − mean[c]) · inv_std[c]` over `(N, C, S)`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_normalize(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        mean: &CudaSlice<f32>,
        inv_std: &CudaSlice<f32>,
        y: &mut impl DevicePtrMut<f32>,
        (n, c, sp): (usize, usize, usize),
    ) -> Result<()> {
        let op = "bn_normalize";
        let count = n * c * sp;
        check_len(op, "x", x.len(), count);
        check_len(op, "y", y.len(), count);
        check_len(op, "mean", mean.len(), c);
        check_len(op, "inv_std", inv_std.len(), c);
        if count == 0 {
            return Ok(());
        }
        let (ni, ci, si) = (to_i32(op, count), to_i32(op, c), to_i32(op, sp));
        launch!(
            self, s, bn_normalize, self.grid(count),
            [in x, in mean, in inv_std, out y, &ni, &ci, &si]
        )
    }

    /// The running statistics update of a training forward, in `params (2C + 1)`, with the count
    /// `m = sums[2C]` for the variance correction `m / (m − 1)`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_update_running(
        &self,
        s: &CudaStream,
        params: &mut impl DevicePtrMut<f32>,
        mean: &CudaSlice<f32>,
        var: &CudaSlice<f32>,
        sums: &CudaSlice<f64>,
        c: usize,
        maf: f32,
    ) -> Result<()> {
        let op = "bn_update_running";
        check_len(op, "params", params.len(), 2 * c + 1);
        check_len(op, "mean", mean.len(), c);
        check_len(op, "var", var.len(), c);
        check_len(op, "sums", sums.len(), 2 * c + 1);
        if c == 0 {
            return Ok(());
        }
        let ci = to_i32(op, c);
        launch!(
            self, s, bn_update_running, self.grid(c),
            [out params, in mean, in var, in sums, &ci, &maf]
        )
    }

    /// Batch-statistics backward over `(N, C, S)`: `dx (+)= (dy − mean(dy) − mean(dy·y)·y) ·
    /// inv_std`, the means from `sums (2C + 1)` = `[Σ dy, Σ dy·y, m]`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        y: &impl DevicePtr<f32>,
        sums: &CudaSlice<f64>,
        inv_std: &CudaSlice<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        (n, c, sp): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "bn_backward";
        let count = n * c * sp;
        check_len(op, "dy", dy.len(), count);
        check_len(op, "y", y.len(), count);
        check_len(op, "dx", dx.len(), count);
        check_len(op, "sums", sums.len(), 2 * c + 1);
        check_len(op, "inv_std", inv_std.len(), c);
        if count == 0 {
            return Ok(());
        }
        let (ni, ci, si) = (to_i32(op, count), to_i32(op, c), to_i32(op, sp));
        let acc = accumulate as i32;
        launch!(
            self, s, bn_backward, self.grid(count),
            [in dy, in y, in sums, in inv_std, out dx, &ni, &ci, &si, &acc]
        )
    }

    /// Global-statistics backward: `dx (+)= dy · inv_std[c]` over `(N, C, S)`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_backward_global(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        inv_std: &CudaSlice<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        (n, c, sp): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "bn_backward_global";
        let count = n * c * sp;
        check_len(op, "dy", dy.len(), count);
        check_len(op, "dx", dx.len(), count);
        check_len(op, "inv_std", inv_std.len(), c);
        if count == 0 {
            return Ok(());
        }
        let (ni, ci, si) = (to_i32(op, count), to_i32(op, c), to_i32(op, sp));
        let acc = accumulate as i32;
        launch!(
            self, s, bn_backward_global, self.grid(count),
            [in dy, in inv_std, out dx, &ni, &ci, &si, &acc]
        )
    }

    /// Softmax over the channels of `x (outer, channels, inner)` into `y` (same shape).
    pub fn softmax_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        (outer, channels, inner): (usize, usize, usize),
    ) -> Result<()> {
        let op = "softmax_forward";
        let n = outer * channels * inner;
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        to_i32(op, n);
        let (o, c, i) = (to_i32(op, outer), to_i32(op, channels), to_i32(op, inner));
        launch!(self, s, softmax_forward, self.grid(outer * inner), [in x, out y, &o, &c, &i])
    }

    /// Softmax backward from the top's data: `dx (+)= (dy − Σ_c dy·y) · y`.
    pub fn softmax_backward(
        &self,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        (outer, channels, inner): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "softmax_backward";
        let n = outer * channels * inner;
        for (what, len) in [("y", y.len()), ("dy", dy.len()), ("dx", dx.len())] {
            check_len(op, what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        to_i32(op, n);
        let (o, c, i) = (to_i32(op, outer), to_i32(op, channels), to_i32(op, inner));
        let acc = accumulate as i32;
        launch!(
            self, s, softmax_backward, self.grid(outer * inner),
            [in y, in dy, out dx, &o, &c, &i, &acc]
        )
    }

    /// `y = (shift + scale · x)^power` over `(n)`; `(power, scale, shift)`.
    pub fn power_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
        (power, scale, shift): (f32, f32, f32),
    ) -> Result<()> {
        let op = "power_forward";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        launch!(self, s, power_forward, self.grid(n), [in x, out y, &ni, &power, &scale, &shift])
    }

    /// `dx (+)= dy · power · scale · (shift + scale · x)^(power − 1)` over `(n)`.
    #[allow(clippy::too_many_arguments)]
    pub fn power_backward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        (power, scale, shift): (f32, f32, f32),
        accumulate: bool,
    ) -> Result<()> {
        let op = "power_backward";
        for (what, len) in [("x", x.len()), ("dy", dy.len()), ("dx", dx.len())] {
            check_len(op, what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        let acc = accumulate as i32;
        launch!(
            self, s, power_backward, self.grid(n),
            [in x, in dy, out dx, &ni, &power, &scale, &shift, &acc]
        )
    }

    /// `y = |x|` over `(n)`.
    pub fn abs_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        self.unary("abs_forward", &self.abs_forward, s, x, y, n)
    }

    /// `dx (+)= sign(x) · dy` over `(n)`, from the bottom's data `x`.
    pub fn abs_backward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.unary_backward(
            "abs_backward",
            &self.abs_backward,
            s,
            x,
            dy,
            dx,
            n,
            accumulate,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(size: i32, kernel: i32, stride: i32, pooled: i32) -> PoolGeom {
        PoolGeom {
            channels: 32,
            height: size,
            width: size,
            pooled_h: pooled,
            pooled_w: pooled,
            kernel_h: kernel,
            kernel_w: kernel,
            stride_h: stride,
            stride_w: stride,
            ..PoolGeom::default()
        }
    }

    /// Runs without a GPU: the scatter kernel's rounds bound the windows covering one pixel, and
    /// cifar10_quick's max pooling (3 × 3, stride 2, on 32 × 32) takes it in 2 × 2 rounds and
    /// 7.7 KB of shared memory, while a global pooling's 8 × 8 window overlaps too often.
    #[test]
    fn scatter_rounds_bound_the_covering_windows() {
        let quick = geom(32, 3, 2, 16);
        assert_eq!(quick.scatter_rounds(), (2, 2));
        assert_eq!(quick.scatter_shared_bytes(), 4 * (2 * 64 + 3 * 256 + 1024));
        assert!(quick.scatter_shared_bytes() <= PLANE_SHARED_LIMIT);
        assert_eq!(geom(8, 2, 2, 4).scatter_rounds(), (1, 1));
        let global = geom(8, 8, 1, 1);
        let (h, w) = global.scatter_rounds();
        assert!(h * w > SCATTER_ROUNDS_MAX);
        // The most windows covering one position, counted, never exceed the rounds.
        for (size, kernel, stride) in [(32i32, 3i32, 2i32), (9, 3, 1), (11, 5, 2), (8, 2, 2)] {
            let pooled = (size - kernel + stride - 1) / stride + 1;
            let g = geom(size, kernel, stride, pooled);
            let most = (0..size)
                .map(|x| {
                    (0..pooled)
                        .filter(|p| p * stride <= x && x < p * stride + kernel)
                        .count()
                })
                .max()
                .unwrap();
            assert!(most <= g.scatter_rounds().0, "{size} {kernel} {stride}");
        }
    }

    /// Runs without a GPU: the plane kernel's passes give each thread `PLANE_RUN` elements —
    /// cifar10_quick's average poolings (16 × 16 and 8 × 8 planes) four planes a pass, its 32 ×
    /// 32 planes one, 1 × 1 planes `PLANE_RUN` · 32 (a warp's worth each) — and stay within
    /// shared memory wherever one plane a pass does.
    #[test]
    fn plane_passes_fill_the_threads_within_shared_memory() {
        let pool2 = geom(16, 3, 2, 8);
        assert_eq!((pool2.plane_threads(), pool2.planes_per_pass()), (256, 4));
        let pool3 = geom(8, 3, 2, 4);
        assert_eq!((pool3.plane_threads(), pool3.planes_per_pass()), (64, 4));
        assert_eq!(geom(32, 3, 2, 16).planes_per_pass(), 1);
        assert_eq!(geom(1, 1, 1, 1).planes_per_pass(), PLANE_RUN * 32);
        for size in 1..=64 {
            for (kernel, stride) in [(1, 1), (2, 2), (3, 1), (3, 2), (5, 3)] {
                let g = geom(size, kernel, stride, (size - 1) / stride + 1);
                let per_pass = g.planes_per_pass();
                assert!(per_pass >= 1);
                if g.plane_shared_bytes(1) <= PLANE_SHARED_LIMIT {
                    assert!(
                        g.plane_shared_bytes(per_pass) <= PLANE_SHARED_LIMIT,
                        "{g:?}"
                    );
                }
            }
        }
    }
}
