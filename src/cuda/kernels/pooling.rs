//! Launchers of the pooling kernels (`pooling.cu`), Caffe's max and average pooling: the
//! generic kernels over any layout, and the NCHW plane kernels that take a whole `(n, c)` plane
//! into shared memory where it fits.
//!
//! The bottom's and the top's values and gradients are stored as the launchers' type parameter
//! `T` says ([`StoredElem`]): FP32, or bit patterns of the half type of [`PoolGeom::half`]
//! (the kernels' `_h` twins, which compute the same numbers).

use super::{check_len, half_arg, to_i32, Kernels, StoredElem, BLOCK};
use crate::error::Result;
use crate::precision::Half;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};

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
    /// The half type of mixed precision whose rounding the kernels apply to what they read and
    /// write (`half_arg`: 0 none, 1 bf16, 2 fp16; see pooling.cu).
    pub half: i32,
}

// SAFETY: `#[repr(C)]` of thirteen i32, the layout of the C struct of the same fields.
unsafe impl DeviceRepr for PoolGeom {}

/// Shared memory `pool_backward_planes` and `max_pool_backward_scatter` may take per block: the
/// default limit, without opting in to more.
const PLANE_SHARED_LIMIT: usize = 48 << 10;

/// Elements of a pass of `pool_backward_planes` each thread takes at once: the constant of the
/// same name in pooling.cu.
const PLANE_RUN: usize = 4;

/// The most rounds `max_pool_backward_scatter` runs per plane (one barrier each); beyond them
/// (windows overlapping many times, as in global pooling) `pool_backward_planes` runs instead.
const SCATTER_ROUNDS_MAX: usize = 9;

impl PoolGeom {
    /// The same geometry, its kernels rounding to `half` (none: FP32).
    pub fn rounding_to(self, half: Option<Half>) -> PoolGeom {
        PoolGeom {
            half: half_arg(half),
            ..self
        }
    }

    /// Panics where tensors stored as `T` are half-type bit patterns but the kernels have no
    /// half type to widen them by (a bug of the caller).
    fn check_stored<T: StoredElem>(&self, op: &str) {
        assert!(
            !T::HALF || self.half != 0,
            "{op}: half-type tensors without their half type"
        );
    }

    /// Whether max pooling over tensors stored as `T` at the device addresses `ptrs` takes the
    /// `_h8` kernels, eight channels a thread: half-type bit patterns stored channels-last, a
    /// multiple of 8 channels, every buffer 16-byte aligned.
    fn by_eight<T: StoredElem>(&self, ptrs: &[CUdeviceptr]) -> bool {
        T::HALF && self.nhwc != 0 && self.channels % 8 == 0 && ptrs.iter().all(|p| p % 16 == 0)
    }

    /// Elements of `batch` samples of the bottom.
    fn bottom_len(&self, batch: usize) -> usize {
        batch * (self.channels * self.height * self.width) as usize
    }

    /// Elements of `batch` samples of the top.
    fn top_len(&self, batch: usize) -> usize {
        batch * (self.channels * self.pooled_h * self.pooled_w) as usize
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

    /// Max pooling backward: `dx (N, C, H, W) (+)=` the top diffs routed by `mask`. NCHW planes
    /// that fit in shared memory take `max_pool_backward_scatter` (or, where windows overlap
    /// more than `SCATTER_ROUNDS_MAX` times, `pool_backward_planes`), channels-last half-type
    /// tensors of a multiple of 8 channels `max_pool_backward_h8` ([`PoolGeom::by_eight`]),
    /// others the generic kernel; all four sum in the same order. `dy` and `dx` stored as `T`.
    #[allow(clippy::too_many_arguments)]
    pub fn max_pool_backward<T: StoredElem>(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<T>,
        mask: &CudaSlice<i32>,
        dx: &mut impl DevicePtrMut<T>,
        batch: usize,
        g: PoolGeom,
        accumulate: bool,
    ) -> Result<()> {
        let op = "max_pool_backward";
        g.check_stored::<T>(op);
        let bottom = g.bottom_len(batch);
        check_len(op, "dy", dy.len(), g.top_len(batch));
        check_len(op, "mask", mask.len(), g.top_len(batch));
        check_len(op, "dx", dx.len(), bottom);
        if bottom == 0 {
            return Ok(());
        }
        let bi = to_i32(op, bottom);
        let acc = accumulate as i32;
        let ptrs = [
            dy.device_ptr(s).0,
            mask.device_ptr(s).0,
            dx.device_ptr_mut(s).0,
        ];
        if g.by_eight::<T>(&ptrs) {
            let groups = bi / 8;
            return launch!(
                self, s, max_pool_backward_h8, self.grid(bottom / 8),
                [in dy, in mask, out dx, &groups, &g, &acc]
            );
        }
        let planes = batch * g.channels as usize;
        let (rounds_h, rounds_w) = g.scatter_rounds();
        let scatter = (rounds_h * rounds_w <= SCATTER_ROUNDS_MAX)
            .then(|| self.backward_plane_grid(&g, planes, g.scatter_shared_bytes()))
            .flatten();
        if let Some(cfg) = scatter {
            let (pi, rh, rw) = (planes as i32, rounds_h as i32, rounds_w as i32);
            return launch!(
                self, s, max_pool_backward_scatter | max_pool_backward_scatter_h for T, cfg,
                [in dy, in mask, out dx, &pi, &g, &rh, &rw, &acc]
            );
        }
        if let Some((cfg, per_pass)) = self.pool_planes_grid(&g, planes) {
            // No ReLU: the bottom's values are never read.
            let (pi, average, no_x, relu, slope) = (planes as i32, 0i32, 0u64, 0i32, 0f32);
            return launch!(
                self, s, pool_backward_planes | pool_backward_planes_h for T, cfg,
                [in dy, in mask, out dx, &pi, &g, &average, &acc, &no_x, &relu, &slope, &per_pass]
            );
        }
        launch!(
            self, s, max_pool_backward | max_pool_backward_h for T, self.grid(bottom),
            [in dy, in mask, out dx, &bi, &g, &acc]
        )
    }

    /// Average pooling backward: `dx (+)= Σ over covering windows of dy / pool_size`; with
    /// `relu = Some((x, slope))` (a ReLU before the pooling, `x` its input), times the ReLU's
    /// derivative at `x`. `dy`, `dx` and `x` stored as `T`.
    #[allow(clippy::too_many_arguments)]
    pub fn ave_pool_backward<T: StoredElem, X: DevicePtr<T>>(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<T>,
        dx: &mut impl DevicePtrMut<T>,
        batch: usize,
        g: PoolGeom,
        accumulate: bool,
        relu: Option<(&X, f32)>,
    ) -> Result<()> {
        let op = "ave_pool_backward";
        g.check_stored::<T>(op);
        let bottom = g.bottom_len(batch);
        check_len(op, "dy", dy.len(), g.top_len(batch));
        check_len(op, "dx", dx.len(), bottom);
        if let Some((x, _)) = relu {
            check_len(op, "x", x.len(), bottom);
        }
        if bottom == 0 {
            return Ok(());
        }
        let bi = to_i32(op, bottom);
        let acc = accumulate as i32;
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
                self, s, pool_backward_planes | pool_backward_planes_h for T, cfg,
                [in dy, &no_mask, out dx, &pi, &g, &average, &acc, &xp, &relu_i, &slope, &per_pass]
            );
        }
        launch!(
            self, s, ave_pool_backward | ave_pool_backward_h for T, self.grid(bottom),
            [in dy, out dx, &bi, &g, &acc, &xp, &relu_i, &slope]
        )
    }

    /// Max pooling forward over `batch` samples: `y (N, C, PH, PW)` and the argmax plane index
    /// `mask` (same shape) from `x (N, C, H, W)`; with `relu`, followed by a ReLU (a maximum
    /// that is not positive becomes 0 with no argmax, -1). `x` and `y` stored as `T`; channels-last
    /// half-type tensors of a multiple of 8 channels take `max_pool_forward_h8`
    /// ([`PoolGeom::by_eight`]), the same results.
    #[allow(clippy::too_many_arguments)]
    pub fn max_pool_forward<T: StoredElem>(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<T>,
        y: &mut impl DevicePtrMut<T>,
        mask: &mut impl DevicePtrMut<i32>,
        batch: usize,
        g: PoolGeom,
        relu: bool,
    ) -> Result<()> {
        let op = "max_pool_forward";
        g.check_stored::<T>(op);
        let Some(top) = forward_count(
            op,
            &g,
            batch,
            x.len(),
            &[("y", y.len()), ("mask", mask.len())],
        ) else {
            return Ok(());
        };
        let relu = i32::from(relu);
        let ptrs = [
            x.device_ptr(s).0,
            y.device_ptr_mut(s).0,
            mask.device_ptr_mut(s).0,
        ];
        if g.by_eight::<T>(&ptrs) {
            let groups = top / 8;
            return launch!(
                self, s, max_pool_forward_h8, self.grid(top as usize / 8),
                [in x, out y, out mask, &groups, &g, &relu]
            );
        }
        launch!(
            self, s, max_pool_forward | max_pool_forward_h for T, self.grid(top as usize),
            [in x, out y, out mask, &top, &g, &relu]
        )
    }

    /// Average pooling forward over `batch` samples (Caffe's divisor; see the kernel); with
    /// `relu_slope`, of the ReLU of `x` with that negative slope (a ReLU before the pooling).
    /// `x` and `y` stored as `T`.
    pub fn ave_pool_forward<T: StoredElem>(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<T>,
        y: &mut impl DevicePtrMut<T>,
        batch: usize,
        g: PoolGeom,
        relu_slope: Option<f32>,
    ) -> Result<()> {
        let op = "ave_pool_forward";
        g.check_stored::<T>(op);
        let Some(top) = forward_count(op, &g, batch, x.len(), &[("y", y.len())]) else {
            return Ok(());
        };
        let (relu, slope) = (i32::from(relu_slope.is_some()), relu_slope.unwrap_or(0.0));
        launch!(
            self, s, ave_pool_forward | ave_pool_forward_h for T, self.grid(top as usize),
            [in x, out y, &top, &g, &relu, &slope]
        )
    }
}

/// The checks of a forward kernel over `batch` samples of `g`: the bottom holds `x_len ≥`
/// its elements, every top buffer of `tops` `(name, elements)` the top's (panics otherwise), and
/// both counts are within `int`'s range. The top's count as the kernel's `int`, or `None` when
/// there is nothing to launch.
fn forward_count(
    op: &str,
    g: &PoolGeom,
    batch: usize,
    x_len: usize,
    tops: &[(&str, usize)],
) -> Option<i32> {
    let top = g.top_len(batch);
    check_len(op, "x", x_len, g.bottom_len(batch));
    for &(what, len) in tops {
        check_len(op, what, len, top);
    }
    if top == 0 {
        return None;
    }
    to_i32(op, g.bottom_len(batch));
    Some(to_i32(op, top))
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
