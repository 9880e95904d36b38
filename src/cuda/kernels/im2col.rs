//! Launch wrappers of the convolution's own kernels (source in cnn.cu). Weight gradient by GEMM:
//! [`Kernels::im2col_batch`] lays a batch out as one matrix and [`Kernels::swap_outer`] brings
//! the top's gradient into the matching order, so that
//! `dW (K, C·kh·kw) = swap(dy) (K, N·OH·OW) · colᵀ` is one cuBLAS GEMM. Implicit:
//! [`Kernels::implicit_wgrad`] computes the same product without the column matrix, gathering
//! its values from the input tile by tile, in a fixed split over `N·OH·OW`. Forward:
//! [`Kernels::conv_forward_direct`] computes a convolution with few input channels directly from
//! shared memory, bias included.

use super::{check_len, to_i32, Kernels, BLOCK};
use crate::cuda::gpu_error;
use crate::error::Result;
use cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};

/// `wgrad_partial`'s tile of `dW` (`WG_K` rows of K × `WG_C` columns of C·kh·kw; `WG_C` is also
/// its threads per block) and its step along `N·OH·OW`: the constants of the same names in
/// cnn.cu.
const WG_K: usize = 32;
const WG_C: usize = 128;
const WG_J: usize = 32;

/// The blocks `wgrad_partial` aims for, a few per multiprocessor of any current device. A
/// constant rather than a device's count, so that the split over `N·OH·OW`, and with it the
/// rounding of the result, depends on the shape alone.
const WG_TARGET_BLOCKS: usize = 1024;

/// `conv_forward_direct`'s tile: output channels and rows per block (32 columns, one per lane),
/// and its block size (one warp per 8 channels): the constants of the same names in cnn.cu.
const DF_K: usize = 32;
const DF_ROWS: usize = 8;
const DF_THREADS: u32 = 128;

/// Shared memory `conv_forward_direct` may take per block: the default limit, without opting in
/// to more.
const DIRECT_SHARED_LIMIT: usize = 48 << 10;

/// A convolution's geometry as the kernels' `ConvGeom` (passed by value): input `(n, c, h, w)`,
/// kernel `kh × kw`, padding, stride and dilation per axis, output `oh × ow`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConvGeom {
    pub n: i32,
    pub c: i32,
    pub h: i32,
    pub w: i32,
    pub kh: i32,
    pub kw: i32,
    pub ph: i32,
    pub pw: i32,
    pub sh: i32,
    pub sw: i32,
    pub dh: i32,
    pub dw: i32,
    pub oh: i32,
    pub ow: i32,
}

// SAFETY: `#[repr(C)]` of fourteen i32, the layout of the C struct of the same fields.
unsafe impl DeviceRepr for ConvGeom {}

impl ConvGeom {
    /// Rows of the column matrix and columns of the weight as a matrix: `C·kh·kw`.
    fn filter_rows(&self) -> usize {
        [self.c, self.kh, self.kw]
            .iter()
            .map(|&v| v as usize)
            .product()
    }

    /// Columns of the column matrix: `N·OH·OW`.
    fn positions(&self) -> usize {
        [self.n, self.oh, self.ow]
            .iter()
            .map(|&v| v as usize)
            .product()
    }

    /// Elements of the column matrix: `(C·kh·kw, N·OH·OW)`; `None` beyond the kernels' int range.
    pub fn col_len(&self) -> Option<usize> {
        self.filter_rows()
            .checked_mul(self.positions())
            .filter(|&len| i32::try_from(len).is_ok())
    }

    /// Elements of the top `(n, k, oh, ow)` for `k` outputs.
    fn output_len(&self, k: usize) -> usize {
        self.positions() * k
    }

    /// Columns of the implicit weight gradient's product: `C·kh·kw`, plus the bias's column of
    /// ones `with_bias`.
    fn implicit_wgrad_columns(&self, with_bias: bool) -> usize {
        self.filter_rows() + usize::from(with_bias)
    }

    /// Whether [`Kernels::implicit_wgrad`] computes the bias gradient at no extra cost: its
    /// column of ones falls in the unused columns of the last tile of `dW` (`C·kh·kw` not a
    /// multiple of the tile's width).
    pub fn implicit_wgrad_fuses_bias(&self) -> bool {
        !self.filter_rows().is_multiple_of(WG_C)
    }

    /// The split of [`Kernels::implicit_wgrad`] for `k` outputs: `(chunk, chunks)`, chunks of
    /// `chunk` values of `N·OH·OW` (a multiple of the kernel's step) such that the tiles of `dW`
    /// times the chunks come near [`WG_TARGET_BLOCKS`].
    fn implicit_wgrad_split(&self, (k, with_bias): (usize, bool)) -> (usize, usize) {
        let j_total = self.positions();
        let tiles = k.div_ceil(WG_K) * self.implicit_wgrad_columns(with_bias).div_ceil(WG_C);
        let wanted = WG_TARGET_BLOCKS.div_ceil(tiles.max(1)).max(1);
        let chunk = j_total.div_ceil(wanted).next_multiple_of(WG_J).max(WG_J);
        (chunk, j_total.div_ceil(chunk).max(1))
    }

    /// Floats of scratch [`Kernels::implicit_wgrad`] needs for `k` outputs, with the bias
    /// gradient where `with_bias` (the chunks' partial sums), or `None` where an index of its
    /// kernels would leave the int range.
    pub fn implicit_wgrad_scratch(&self, (k, with_bias): (usize, bool)) -> Option<usize> {
        let (_, chunks) = self.implicit_wgrad_split((k, with_bias));
        let columns = self.implicit_wgrad_columns(with_bias);
        let partial = chunks.checked_mul(k)?.checked_mul(columns)?;
        let fits = |n: usize| i32::try_from(n).is_ok();
        (fits(self.input_len()) && fits(self.output_len(k)) && fits(partial)).then_some(partial)
    }

    /// `conv_forward_direct`'s input tile of one channel, `(rows, columns)`: what `DF_ROWS`
    /// output rows and 32 output columns see through the kernel's extent and stride.
    fn direct_input_tile(&self) -> (usize, usize) {
        let u = |v: i32| v as usize;
        let extent = |k: i32, d: i32| u(k - 1) * u(d) + 1;
        (
            (DF_ROWS - 1) * u(self.sh) + extent(self.kh, self.dh),
            31 * u(self.sw) + extent(self.kw, self.dw),
        )
    }

    /// Shared-memory bytes of [`Kernels::conv_forward_direct`] for `k` outputs — the filters of
    /// a block's `DF_K` channels and its input tile of every channel — or `None` where they
    /// exceed the default 48 KiB or the grid or an index its range.
    pub fn direct_forward_shared(&self, k: usize) -> Option<usize> {
        let (rows, cols) = self.direct_input_tile();
        let floats = self.filter_rows() * DF_K + self.c as usize * rows * cols;
        let bytes = floats.checked_mul(4)?;
        let blocks = (self.n as usize).checked_mul(k.div_ceil(DF_K))?;
        let fits = |n: usize| i32::try_from(n).is_ok();
        let grid_ok = fits(blocks)
            && (self.oh as usize).div_ceil(DF_ROWS) <= 65_535
            && (self.ow as usize).div_ceil(32) <= 65_535;
        (bytes <= DIRECT_SHARED_LIMIT && grid_ok && fits(k * self.filter_rows() + k))
            .then_some(bytes)
    }

    fn input_len(&self) -> usize {
        [self.n, self.c, self.h, self.w]
            .iter()
            .map(|&v| v as usize)
            .product()
    }
}

impl Kernels {
    /// `col (C·kh·kw, N, OH·OW)` of the batch `x (N, C, H, W)`; see cnn.cu.
    ///
    /// # Panics
    /// If the column matrix exceeds the kernels' int range ([`ConvGeom::col_len`]) or a buffer
    /// is too short.
    pub fn im2col_batch(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        geom: ConvGeom,
        col: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let op = "im2col_batch";
        let len = geom
            .col_len()
            .unwrap_or_else(|| panic!("{op}: the column matrix exceeds the int range"));
        check_len(op, "x", x.len(), geom.input_len());
        check_len(op, "col", col.len(), len);
        if len == 0 {
            return Ok(());
        }
        let (xp, _x) = x.device_ptr(s);
        let (cp, _c) = col.device_ptr_mut(s);
        launch!(self, s, im2col_batch, self.grid(len), [&xp, &cp, &geom])
    }

    /// `dw (K, C·kh·kw) (+)=` the weight gradient of an ungrouped convolution for the batch
    /// `x (N, C, H, W)` and the top gradient `dy (N, K, OH, OW)`, both NCHW, without a column
    /// matrix: `wgrad_partial` sums fixed chunks of `N·OH·OW` per tile of `dw` into `partial`
    /// ([`ConvGeom::implicit_wgrad_scratch`] floats), then `wgrad_sum_partials` adds the chunks
    /// in order (`dw = sum + beta · dw`; beta 0 never reads `dw`). Deterministic. With
    /// `with_bias`, `dw` continues with the bias gradient `(K)`, computed in the same products
    /// (see [`ConvGeom::implicit_wgrad_fuses_bias`]).
    ///
    /// # Panics
    /// If a buffer is too short or the shape leaves the kernels' int range (`None` from
    /// [`ConvGeom::implicit_wgrad_scratch`]).
    #[allow(clippy::too_many_arguments)]
    pub fn implicit_wgrad(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        geom: ConvGeom,
        (k, with_bias): (usize, bool),
        partial: &mut impl DevicePtrMut<f32>,
        beta: f32,
        dw: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let op = "implicit_wgrad";
        let scratch = geom
            .implicit_wgrad_scratch((k, with_bias))
            .unwrap_or_else(|| panic!("{op}: the shape exceeds the int range"));
        let columns = geom.implicit_wgrad_columns(with_bias);
        check_len(op, "x", x.len(), geom.input_len());
        check_len(op, "dy", dy.len(), geom.output_len(k));
        check_len(op, "partial", partial.len(), scratch);
        check_len(op, "dw", dw.len(), k * columns);
        if k * geom.filter_rows() == 0 {
            return Ok(());
        }
        let (chunk, chunks) = geom.implicit_wgrad_split((k, with_bias));
        let (ki, chunk_i, chunks_i) = (to_i32(op, k), to_i32(op, chunk), to_i32(op, chunks));
        let (n, bias_i) = (to_i32(op, k * columns), i32::from(with_bias));
        let (xp, _x) = x.device_ptr(s);
        let (dyp, _dy) = dy.device_ptr(s);
        let (pp, _p) = partial.device_ptr_mut(s);
        let (dwp, _dw) = dw.device_ptr_mut(s);
        let tiles = LaunchConfig {
            grid_dim: (
                columns.div_ceil(WG_C) as u32,
                k.div_ceil(WG_K) as u32,
                chunks as u32,
            ),
            block_dim: (WG_C as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            s,
            wgrad_partial,
            tiles,
            [&xp, &dyp, &pp, &geom, &ki, &chunk_i, &bias_i]
        )?;
        // `wgrad_sum_partials` takes blocks of eight warps (`BLOCK` threads), 32 sums each.
        let sums = LaunchConfig {
            grid_dim: (
                (k * columns).div_ceil(32).min(self.max_blocks as usize) as u32,
                1,
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            s,
            wgrad_sum_partials,
            sums,
            [&pp, &dwp, &n, &chunks_i, &beta]
        )
    }

    /// `y (N, K, OH, OW) = conv(x (N, C, H, W), weight)` (+ bias) of an ungrouped NCHW
    /// convolution, computed directly from shared memory (`conv_forward_direct`): `params` holds
    /// the weight `(K, C, kh, kw)` and, where `has_bias`, the bias `(K)` after it (the layer's
    /// parameters as they lie in the flat buffer). Each output is one FP32 sum in a fixed order,
    /// so results repeat bit for bit.
    ///
    /// # Panics
    /// If a buffer is too short or the shape does not fit the kernel (`None` from
    /// [`ConvGeom::direct_forward_shared`]).
    #[allow(clippy::too_many_arguments)]
    pub fn conv_forward_direct(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        params: &impl DevicePtr<f32>,
        has_bias: bool,
        geom: ConvGeom,
        k: usize,
        y: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let op = "conv_forward_direct";
        let bytes = geom
            .direct_forward_shared(k)
            .unwrap_or_else(|| panic!("{op}: the shape does not fit the kernel"));
        check_len(op, "x", x.len(), geom.input_len());
        check_len(
            op,
            "params",
            params.len(),
            k * (geom.filter_rows() + usize::from(has_bias)),
        );
        check_len(op, "y", y.len(), geom.output_len(k));
        if geom.output_len(k) == 0 {
            return Ok(());
        }
        let (tile_rows, tile_cols) = geom.direct_input_tile();
        let (ki, bias) = (to_i32(op, k), i32::from(has_bias));
        let (rows_i, cols_i) = (to_i32(op, tile_rows), to_i32(op, tile_cols));
        let (xp, _x) = x.device_ptr(s);
        let (pp, _p) = params.device_ptr(s);
        let (yp, _y) = y.device_ptr_mut(s);
        let cfg = LaunchConfig {
            grid_dim: (
                (geom.n as usize * k.div_ceil(DF_K)) as u32,
                (geom.oh as usize).div_ceil(DF_ROWS) as u32,
                (geom.ow as usize).div_ceil(32) as u32,
            ),
            block_dim: (DF_THREADS, 1, 1),
            shared_mem_bytes: bytes as u32,
        };
        launch!(
            self,
            s,
            conv_forward_direct,
            cfg,
            [&xp, &pp, &bias, &yp, &geom, &ki, &rows_i, &cols_i]
        )
    }

    /// `y (b, a, p) = x (a, b, p)`.
    pub fn swap_outer(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        (a, b, p): (usize, usize, usize),
    ) -> Result<()> {
        let op = "swap_outer";
        let n = a * b * p;
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        to_i32(op, n);
        let (ai, bi, pi) = (to_i32(op, a), to_i32(op, b), to_i32(op, p));
        let (xp, _x) = x.device_ptr(s);
        let (yp, _y) = y.device_ptr_mut(s);
        launch!(self, s, swap_outer, self.grid(n), [&xp, &yp, &ai, &bi, &pi])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(n: i32, c: i32, hw: i32, kernel: i32, pad: i32) -> ConvGeom {
        let out = hw + 2 * pad - kernel + 1;
        ConvGeom {
            n,
            c,
            h: hw,
            w: hw,
            kh: kernel,
            kw: kernel,
            ph: pad,
            pw: pad,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            oh: out,
            ow: out,
        }
    }

    /// Runs without a GPU: the direct forward takes a net's first convolutions (cifar10_quick's,
    /// ResNet-50's 7 × 7 stride-2 one) and refuses filter banks or tiles beyond its shared memory
    /// (cifar10_quick's second convolution, 32 input channels).
    #[test]
    fn direct_forward_takes_first_convolutions_only() {
        let quick1 = geom(512, 3, 32, 5, 2);
        // 75 filter rows × 32 channels, 3 channels × 12 × 36 input values.
        assert_eq!(
            quick1.direct_forward_shared(32),
            Some(4 * (75 * 32 + 3 * 12 * 36))
        );
        let resnet1 = ConvGeom {
            sh: 2,
            sw: 2,
            oh: 112,
            ow: 112,
            ..geom(64, 3, 224, 7, 3)
        };
        assert_eq!(resnet1.direct_input_tile(), (21, 69));
        assert!(resnet1.direct_forward_shared(64).is_some());
        assert_eq!(geom(512, 32, 16, 5, 2).direct_forward_shared(32), None);
    }

    /// Runs without a GPU: the implicit weight gradient's chunks are whole steps that cover
    /// `N·OH·OW` exactly once with none empty, come near the target number of blocks, and
    /// depend on the shape alone; its scratch is refused beyond the int range.
    #[test]
    fn implicit_wgrad_split_covers_the_reduction() {
        // cifar10_quick's three convolutions at batch 512, a one-sample one and a tiny one.
        for (g, k) in [
            (geom(512, 3, 32, 5, 2), 32),
            (geom(512, 32, 16, 5, 2), 32),
            (geom(512, 32, 8, 5, 2), 64),
            (geom(1, 64, 56, 3, 1), 64),
            (geom(1, 1, 3, 3, 0), 1),
        ] {
            let j_total = (g.n * g.oh * g.ow) as usize;
            let rows = (g.c * g.kh * g.kw) as usize;
            let (chunk, chunks) = g.implicit_wgrad_split((k, false));
            assert_eq!(chunk % WG_J, 0, "{g:?}");
            assert!(
                chunks * chunk >= j_total && (chunks - 1) * chunk < j_total,
                "{g:?}"
            );
            let blocks = chunks * k.div_ceil(WG_K) * rows.div_ceil(WG_C);
            assert!(blocks <= 2 * WG_TARGET_BLOCKS, "{g:?}: {blocks} blocks");
            assert_eq!(
                g.implicit_wgrad_scratch((k, false)),
                Some(chunks * k * rows)
            );
            // The bias's column falls in the last tile (rows 75, 800 and 800, 576, 9): the
            // same split, one more column of partial sums.
            assert!(g.implicit_wgrad_fuses_bias(), "{g:?}");
            assert_eq!(g.implicit_wgrad_split((k, true)), (chunk, chunks));
            let partial = chunks * k * (rows + 1);
            assert_eq!(g.implicit_wgrad_scratch((k, true)), Some(partial));
        }
        // 128 filter rows fill their tile: a bias column would take a tile of its own.
        assert!(!geom(8, 128, 8, 1, 0).implicit_wgrad_fuses_bias());
        let huge = geom(4096, 256, 64, 3, 1);
        assert_eq!(huge.implicit_wgrad_scratch((256, false)), None);
    }
}
