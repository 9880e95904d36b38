//! Launch wrappers of the convolution's own kernels (source in cnn.cu). Weight gradient by GEMM:
//! [`Kernels::im2col_batch`] lays a batch out as one matrix and [`Kernels::swap_outer`] brings
//! the top's gradient into the matching order, so that
//! `dW (K, C·kh·kw) = swap(dy) (K, N·OH·OW) · colᵀ` is one cuBLAS GEMM. Implicit:
//! [`Kernels::implicit_wgrad`] computes the same product without the column matrix, gathering
//! its values from the input tile by tile, in a fixed split over `N·OH·OW`. Direct:
//! [`Kernels::conv_forward_direct`] computes a convolution from shared memory, a chunk of input
//! channels at a time, bias included ([`ConvGeom::direct_tile`] says how it covers a shape), and
//! with the filters flipped a stride-1 convolution's data gradient
//! ([`ConvGeom::data_gradient_geom`]).

use super::{check_len, to_i32, Kernels, BLOCK};
use crate::error::Result;
use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};

/// `wgrad_partial_*`'s rows of K per tile of `dW` and its step along `N·OH·OW` (the chunks'
/// unit): the constants of the same names in cnn.cu.
const WG_K: usize = 32;
const WG_J: usize = 32;

/// A tile shape of the implicit weight gradient (`wgrad_partial_<rows>x8_w<warps>` in cnn.cu):
/// blocks of `warps` warps, each thread adding a `rows × 8` sub-tile of `dW`, so that a block
/// owns 32 rows of `dW` by [`WgradTile::columns`] columns of `C·kh·kw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgradTile {
    /// Warps per block.
    pub warps: usize,
    /// Rows of `dW` per thread: 4 or 8.
    pub rows: usize,
}

impl WgradTile {
    /// Columns of `C·kh·kw` per tile: `8 · rows · warps`.
    pub const fn columns(self) -> usize {
        8 * self.rows * self.warps
    }

    /// Threads per block.
    pub const fn threads(self) -> usize {
        32 * self.warps
    }
}

/// The tiles the implicit weight gradient's kernels come in: sub-tiles of 4 × 8 in tiles 64,
/// 96, 128 and 160 columns wide, and of 8 × 8 (fewer shared-memory reads per multiply-add, the
/// kernel's bound) 128, 192 and 256 wide, so that a tile can fit `C·kh·kw` (cifar10_quick's
/// first convolution, 75 + 1 columns, in 96).
pub const IMPLICIT_WGRAD_TILES: [WgradTile; 7] = [
    WgradTile { warps: 2, rows: 4 },
    WgradTile { warps: 3, rows: 4 },
    WgradTile { warps: 4, rows: 4 },
    WgradTile { warps: 5, rows: 4 },
    WgradTile { warps: 2, rows: 8 },
    WgradTile { warps: 3, rows: 8 },
    WgradTile { warps: 4, rows: 8 },
];

/// The most waves of resident blocks the implicit weight gradient's grid is split into: more
/// chunks of `N·OH·OW` shorten the last wave's idle tail but add partial sums to write and add.
const WG_MAX_WAVES: usize = 4;

/// What a block of `wgrad_partial_*` costs besides its steps, in steps: building its column
/// table, its first loads and writing its partial sums.
const WG_BLOCK_OVERHEAD_STEPS: usize = 2;

/// `conv_forward_direct`'s output channels per block and output rows per thread, and its block
/// size (one warp per 8 channels): the constants of the same names in cnn.cu.
const DF_K: usize = 32;
const DF_ROWS: usize = 8;
const DF_THREADS: u32 = 128;

/// The warps `conv_forward_direct` aims for, about four per scheduler of a current device: a
/// grid with fewer splits its input channels ([`DirectTile::splits`]). A constant rather than a
/// device's count, so that the split, and with it the rounding of the result, depends on the
/// shape alone.
const DIRECT_TARGET_WARPS: usize = 2048;

/// Shared memory `conv_forward_direct` may take per block: the default limit, without opting in
/// to more.
const DIRECT_SHARED_LIMIT: usize = 48 << 10;

/// The least spacing of `at_least..at_least + 32` between the rows of lanes of
/// `conv_forward_direct`'s warps (`lane_cols` lanes per row, `sw` floats apart) in shared memory
/// (`row_offset(spacing)` floats from one row of lanes to the next) at which one load of a warp
/// finds no shared-memory bank holding more of its distinct words than at any other spacing.
fn least_conflicting(
    at_least: usize,
    (lane_cols, sw): (usize, usize),
    row_offset: impl Fn(usize) -> usize,
) -> usize {
    const BANKS: usize = 32;
    let conflicts = |spacing: usize| {
        let mut words: [usize; 32] = std::array::from_fn(|lane| {
            (lane / lane_cols) * row_offset(spacing) + (lane % lane_cols) * sw
        });
        words.sort_unstable();
        let mut per_bank = [0usize; BANKS];
        for (i, &w) in words.iter().enumerate() {
            if i == 0 || w != words[i - 1] {
                per_bank[w % BANKS] += 1;
            }
        }
        per_bank.into_iter().max().unwrap_or(0)
    };
    (at_least..at_least + BANKS)
        .min_by_key(|&p| (conflicts(p), p))
        .unwrap_or(at_least)
}

/// The row pitch of `conv_forward_direct`'s input tile of `columns` columns with one sample per
/// block, warps of `lane_cols` lanes per row of lanes and stride `(sh, sw)` (lane `(r, c)` at
/// `4·r·sh·pitch + c·sw`), against bank conflicts ([`least_conflicting`]). cifar10_quick's second
/// convolution (20 columns, 2 rows of 16 lanes) needs no padding: 80 floats apart, its two rows
/// of lanes fall on disjoint banks.
fn direct_pitch(columns: usize, lane_cols: usize, sh: usize, sw: usize) -> usize {
    least_conflicting(columns, (lane_cols, sw), |pitch| 4 * sh * pitch)
}

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

/// How [`Kernels::conv_forward_direct`] covers one convolution (see [`ConvGeom::direct_tile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectTile {
    /// Output columns a warp's lanes span (32, 16 or 8), with `32 / lane_cols` rows of lanes.
    pub lane_cols: usize,
    /// Samples per block: 1, the rows of lanes then covering `4 · 32 / lane_cols` rows apiece
    /// of one sample's plane; or `32 / lane_cols`, one sample per row of lanes, for planes
    /// shorter than that.
    pub samples: usize,
    /// Input channels staged in shared memory at once.
    pub c_chunk: usize,
    /// One channel's input tile, `(rows, columns)`.
    pub input: (usize, usize),
    /// Floats from one row of the input tile to the next in shared memory (at least its
    /// columns), chosen against shared-memory bank conflicts.
    pub pitch: usize,
    /// Floats from one sample's staged channels to the next (at least `c_chunk` tiles), chosen
    /// against bank conflicts where a block has several samples.
    pub sample_pitch: usize,
    /// Ranges of input channels summed by blocks of their own (1: none), each of
    /// `split_channels` (whole chunks), where the grid alone would keep too few warps busy.
    pub splits: usize,
    /// Input channels per split.
    pub split_channels: usize,
    /// Floats of scratch for the splits' sums: `splits` outputs, 0 without splits.
    pub partial_len: usize,
    /// Dynamic shared memory per block.
    pub shared_bytes: usize,
    /// The launch's grid: `(⌈N / samples⌉ · ⌈K / 32⌉ · splits, row tiles, column tiles)`.
    pub grid: (usize, usize, usize),
}

/// [`DirectTile`] as `conv_forward_direct` takes it (the C struct `DirectShape`, by value).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DirectShape {
    k_total: i32,
    c_chunk: i32,
    lane_cols: i32,
    in_rows: i32,
    in_cols: i32,
    pitch: i32,
    samples: i32,
    sample_pitch: i32,
    splits: i32,
    split_channels: i32,
}

// SAFETY: `#[repr(C)]` of ten i32, the layout of the C struct of the same fields.
unsafe impl DeviceRepr for DirectShape {}

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

    /// Whether [`Kernels::implicit_wgrad`] in tiles `tile` computes the bias gradient at no
    /// extra cost: its column of ones falls in the unused columns of the last tile of `dW`
    /// (`C·kh·kw` not a multiple of the tile's columns).
    pub fn implicit_wgrad_fuses_bias(&self, tile: WgradTile) -> bool {
        !self.filter_rows().is_multiple_of(tile.columns())
    }

    /// The split of [`Kernels::implicit_wgrad`] for `k` outputs (`with_bias`: and the bias's
    /// column) in tiles `tile`, on a device that holds `slots` such blocks at once:
    /// `(chunk, chunks)`, chunks of `chunk` values of `N·OH·OW` (whole steps of the kernel). The
    /// grid (tiles × chunks) is fitted to whole waves of `slots`: of the splits into one to
    /// [`WG_MAX_WAVES`] waves, the one whose waves times steps per block (plus
    /// [`WG_BLOCK_OVERHEAD_STEPS`]) is least, and of equals the one with fewer chunks. A grid
    /// of two waves and three blocks spends a third wave on those three (cifar10_quick's second
    /// convolution at batch 512 in tiles of 96 columns, 9 tiles × 147 chunks on 660 slots).
    /// The split decides the order of the sums, so the result's rounding depends on the shape,
    /// the tile and the device's occupancy, and repeats bit for bit where all three are the same.
    pub fn implicit_wgrad_split(
        &self,
        (k, with_bias): (usize, bool),
        tile: WgradTile,
        slots: usize,
    ) -> (usize, usize) {
        let steps_total = self.positions().div_ceil(WG_J).max(1);
        let tiles = k.div_ceil(WG_K)
            * self
                .implicit_wgrad_columns(with_bias)
                .div_ceil(tile.columns());
        let (tiles, slots) = (tiles.max(1), slots.max(1));
        let (_, chunks, steps) = (1..=WG_MAX_WAVES)
            .map(|waves| {
                let wanted = (waves * slots / tiles).clamp(1, steps_total);
                let steps = steps_total.div_ceil(wanted);
                let chunks = steps_total.div_ceil(steps);
                let rounds = (tiles * chunks).div_ceil(slots);
                (rounds * (steps + WG_BLOCK_OVERHEAD_STEPS), chunks, steps)
            })
            .min()
            .expect("at least one wave");
        (steps * WG_J, chunks)
    }

    /// Floats of scratch [`Kernels::implicit_wgrad`] needs for `k` outputs, with the bias
    /// gradient where `with_bias` (the chunks' partial sums), split as
    /// [`ConvGeom::implicit_wgrad_split`] says for `tile` and `slots`, or `None` where an index
    /// of its kernels would leave the int range.
    pub fn implicit_wgrad_scratch(
        &self,
        outputs: (usize, bool),
        tile: WgradTile,
        slots: usize,
    ) -> Option<usize> {
        let (k, with_bias) = outputs;
        let (_, chunks) = self.implicit_wgrad_split(outputs, tile, slots);
        let columns = self.implicit_wgrad_columns(with_bias);
        let partial = chunks.checked_mul(k)?.checked_mul(columns)?;
        let fits = |n: usize| i32::try_from(n).is_ok();
        (fits(self.input_len()) && fits(self.output_len(k)) && fits(partial)).then_some(partial)
    }

    /// How [`Kernels::conv_forward_direct`] covers this convolution with `k` outputs, or `None`
    /// where it does not fit: a channel's filters and input tile beyond the shared memory, more
    /// than half of a block's rows idle (planes too small for a warp), or the grid or an index
    /// beyond its range. A block takes one sample, or one per row of lanes where that leaves
    /// fewer rows idle (planes shorter than a block's rows: cifar10_quick's third convolution,
    /// 8 × 8, in 4 samples of 8 rows instead of 1 of 32). Where the grid has fewer warps than
    /// the kernel aims for (`DIRECT_TARGET_WARPS`), its input channels are split over more
    /// blocks.
    pub fn direct_tile(&self, k: usize) -> Option<DirectTile> {
        let u = |v: i32| v as usize;
        let (oh, ow) = (u(self.oh), u(self.ow));
        let lane_cols = match ow {
            0..=8 => 8,
            9..=16 => 16,
            _ => 32,
        };
        let lane_rows = 32 / lane_cols;
        let idle = |rows: usize| oh.div_ceil(rows) * rows - oh;
        let samples = if idle(DF_ROWS) < idle(DF_ROWS * lane_rows) {
            lane_rows
        } else {
            1
        };
        let block_rows = DF_ROWS * lane_rows / samples;
        if oh.div_ceil(block_rows) * block_rows > 2 * oh.max(1) {
            return None;
        }
        let extent = |k: i32, d: i32| u(k - 1) * u(d) + 1;
        let input = (
            (block_rows - 1) * u(self.sh) + extent(self.kh, self.dh),
            (lane_cols - 1) * u(self.sw) + extent(self.kw, self.dw),
        );
        // With a sample per row of lanes, a warp's rows of lanes are samples apart, not rows.
        let pitch = if samples == 1 {
            direct_pitch(input.1, lane_cols, u(self.sh), u(self.sw))
        } else {
            input.1
        };
        // A sample's padding against bank conflicts stays under 32 floats.
        let padding = (samples - 1) * 32;
        let filters = u(self.kh) * u(self.kw) * DF_K;
        let per_channel = filters + samples * input.0 * pitch;
        let widest = (DIRECT_SHARED_LIMIT / 4).saturating_sub(padding) / per_channel;
        if widest == 0 {
            return None;
        }
        // Chunks of equal width: fewer passes, and no shared memory kept for a short last one.
        let c = u(self.c).max(1);
        let c_chunk = c.div_ceil(c.div_ceil(widest));
        let staged = c_chunk * input.0 * pitch;
        let sample_pitch = if samples == 1 {
            staged
        } else {
            least_conflicting(staged, (lane_cols, u(self.sw)), |spacing| spacing)
        };
        let shared_floats = c_chunk * filters + (samples - 1) * sample_pitch + staged;
        let tiles = [
            u(self.n).div_ceil(samples),
            k.div_ceil(DF_K),
            oh.div_ceil(block_rows),
            ow.div_ceil(lane_cols),
        ];
        let warps = tiles
            .iter()
            .try_fold(DF_THREADS as usize / 32, |w, &t| w.checked_mul(t))?;
        // Splits of whole chunks, none empty.
        let chunks = c.div_ceil(c_chunk);
        let wanted = DIRECT_TARGET_WARPS.div_ceil(warps.max(1)).clamp(1, chunks);
        let chunks_per_split = chunks.div_ceil(wanted);
        let splits = chunks.div_ceil(chunks_per_split);
        let partial_len = if splits > 1 {
            splits.checked_mul(self.output_len(k))?
        } else {
            0
        };
        let grid = (
            (tiles[0] * tiles[1]).checked_mul(splits)?,
            tiles[2],
            tiles[3],
        );
        let fits = |n: usize| i32::try_from(n).is_ok();
        let ok = fits(grid.0)
            && fits(partial_len)
            && grid.1 <= 65_535
            && grid.2 <= 65_535
            && fits(self.filter_rows().checked_mul(k)?)
            && fits(self.input_len())
            && fits(self.output_len(k));
        ok.then_some(DirectTile {
            lane_cols,
            samples,
            c_chunk,
            input,
            pitch,
            sample_pitch,
            splits,
            split_channels: chunks_per_split * c_chunk,
            partial_len,
            shared_bytes: 4 * shared_floats,
            grid,
        })
    }

    /// The data gradient of this convolution with `k` outputs as the forward of another:
    /// `dx (N, C, H, W)` = the convolution of `dy (N, K, OH, OW)` with the filters flipped in
    /// both axes and their channel axes swapped, padded by `extent − 1 − pad` per axis. `None`
    /// where the stride is not 1 or the padding exceeds `extent − 1`.
    pub fn data_gradient_geom(&self, k: usize) -> Option<ConvGeom> {
        let (ph, pw) = (
            (self.kh - 1) * self.dh - self.ph,
            (self.kw - 1) * self.dw - self.pw,
        );
        let k = i32::try_from(k).ok()?;
        (self.sh == 1 && self.sw == 1 && ph >= 0 && pw >= 0).then_some(ConvGeom {
            c: k,
            h: self.oh,
            w: self.ow,
            ph,
            pw,
            oh: self.h,
            ow: self.w,
            ..*self
        })
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
        launch!(self, s, im2col_batch, self.grid(len), [in x, out col, &geom])
    }

    /// Blocks of `tile`'s kernel this device holds at once (its occupancy times the
    /// multiprocessors; 1 for a tile it has no kernel of).
    pub fn implicit_wgrad_slots(&self, tile: WgradTile) -> usize {
        IMPLICIT_WGRAD_TILES
            .iter()
            .position(|&t| t == tile)
            .map_or(1, |i| self.implicit_wgrad_slots[i])
    }

    /// Floats of scratch [`Kernels::implicit_wgrad`] needs for `outputs` (`(k, with_bias)`) in
    /// tiles `tile` on this device, or `None` where the shape leaves its kernels' int range
    /// ([`ConvGeom::implicit_wgrad_scratch`]).
    pub fn implicit_wgrad_scratch(
        &self,
        geom: &ConvGeom,
        outputs: (usize, bool),
        tile: WgradTile,
    ) -> Option<usize> {
        geom.implicit_wgrad_scratch(outputs, tile, self.implicit_wgrad_slots(tile))
    }

    /// The kernel of `tile`, where it is one of [`IMPLICIT_WGRAD_TILES`].
    pub(in crate::cuda) fn wgrad_partial_kernel(&self, tile: WgradTile) -> Option<&CudaFunction> {
        Some(match (tile.rows, tile.warps) {
            (4, 2) => &self.wgrad_partial_4x8_w2,
            (4, 3) => &self.wgrad_partial_4x8_w3,
            (4, 4) => &self.wgrad_partial_4x8_w4,
            (4, 5) => &self.wgrad_partial_4x8_w5,
            (8, 2) => &self.wgrad_partial_8x8_w2,
            (8, 3) => &self.wgrad_partial_8x8_w3,
            (8, 4) => &self.wgrad_partial_8x8_w4,
            _ => return None,
        })
    }

    /// `dw (K, C·kh·kw) (+)=` the weight gradient of an ungrouped convolution for the batch
    /// `x (N, C, H, W)` and the top gradient `dy (N, K, OH, OW)`, both NCHW, without a column
    /// matrix: the kernel of `tile` (one of [`IMPLICIT_WGRAD_TILES`]) sums fixed chunks of
    /// `N·OH·OW` per tile of `dw` into `partial` ([`Kernels::implicit_wgrad_scratch`] floats),
    /// then `wgrad_sum_partials` adds the chunks in order (`dw = sum + beta · dw`; beta 0 never
    /// reads `dw`). Deterministic: the same bit for bit for the same shape and tile on the same
    /// kind of device (the chunks are fitted to the device's waves,
    /// [`ConvGeom::implicit_wgrad_split`]). With `with_bias`, `dw` continues with the bias
    /// gradient `(K)`, computed in the same products (see
    /// [`ConvGeom::implicit_wgrad_fuses_bias`]).
    ///
    /// # Panics
    /// If a buffer is too short, `tile` is not one of [`IMPLICIT_WGRAD_TILES`] or the shape
    /// leaves the kernels' int range (`None` from [`Kernels::implicit_wgrad_scratch`]).
    #[allow(clippy::too_many_arguments)]
    pub fn implicit_wgrad(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        geom: ConvGeom,
        (k, with_bias): (usize, bool),
        tile: WgradTile,
        partial: &mut impl DevicePtrMut<f32>,
        beta: f32,
        dw: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let op = "implicit_wgrad";
        let func = self
            .wgrad_partial_kernel(tile)
            .unwrap_or_else(|| panic!("{op}: no kernel of {tile:?} ({IMPLICIT_WGRAD_TILES:?})"));
        let scratch = self
            .implicit_wgrad_scratch(&geom, (k, with_bias), tile)
            .unwrap_or_else(|| panic!("{op}: the shape exceeds the int range"));
        let columns = geom.implicit_wgrad_columns(with_bias);
        check_len(op, "x", x.len(), geom.input_len());
        check_len(op, "dy", dy.len(), geom.output_len(k));
        check_len(op, "partial", partial.len(), scratch);
        check_len(op, "dw", dw.len(), k * columns);
        if k * geom.filter_rows() == 0 {
            return Ok(());
        }
        let (chunk, chunks) =
            geom.implicit_wgrad_split((k, with_bias), tile, self.implicit_wgrad_slots(tile));
        let (ki, chunk_i, chunks_i) = (to_i32(op, k), to_i32(op, chunk), to_i32(op, chunks));
        let (n, bias_i) = (to_i32(op, k * columns), i32::from(with_bias));
        let (pp, _p) = partial.device_ptr_mut(s);
        let tiles = LaunchConfig {
            grid_dim: (
                columns.div_ceil(tile.columns()) as u32,
                k.div_ceil(WG_K) as u32,
                chunks as u32,
            ),
            block_dim: (tile.threads() as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // Every wgrad_partial_* kernel takes the same parameters.
        launch!(
            function func, format!("wgrad_partial ({tile:?})"), s, tiles,
            [in x, in dy, &pp, &geom, &ki, &chunk_i, &bias_i]
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
        launch!(self, s, wgrad_sum_partials, sums, [&pp, out dw, &n, &chunks_i, &beta])
    }

    /// `y (N, K, OH, OW) (+)= conv(x (N, C, H, W), weight)` (+ bias) of an ungrouped NCHW
    /// convolution, computed directly from shared memory (`conv_forward_direct`). `wt` holds the
    /// weight `(K, C, kh, kw)` transposed, `(C·kh·kw, K)`; with `flip`, a data gradient's
    /// filters instead: the layer's weight `(C, K, kh, kw)` (its `K` this call's `C`) with each
    /// of its `C` blocks transposed, `(C, kh·kw, K)`, read flipped in both spatial axes (see
    /// [`ConvGeom::data_gradient_geom`]). `bias (K)` is added where given, and `y`'s old values
    /// where `accumulate`. Each output is one FP32 sum in a fixed order, so results repeat bit
    /// for bit; where the tile splits the input channels, the splits' sums go to `partial` (at
    /// least [`DirectTile::partial_len`]) and `direct_sum_splits` adds them in order. `tile` is
    /// [`ConvGeom::direct_tile`] of `geom` and `k`, computed once by the caller (its pitch is a
    /// search, not to be repeated every step).
    ///
    /// # Panics
    /// If a buffer is too short (in debug builds also if `tile` is not the shape's).
    #[allow(clippy::too_many_arguments)]
    pub fn conv_forward_direct(
        &self,
        s: &CudaStream,
        (x, wt, bias): (
            &impl DevicePtr<f32>,
            &impl DevicePtr<f32>,
            Option<&CudaView<'_, f32>>,
        ),
        (geom, tile): (ConvGeom, &DirectTile),
        k: usize,
        (flip, accumulate): (bool, bool),
        partial: &mut impl DevicePtrMut<f32>,
        y: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let op = "conv_forward_direct";
        debug_assert_eq!(
            Some(*tile),
            geom.direct_tile(k),
            "{op}: a tile of another shape"
        );
        check_len(op, "x", x.len(), geom.input_len());
        check_len(op, "wt", wt.len(), k * geom.filter_rows());
        if let Some(b) = bias {
            check_len(op, "bias", b.len(), k);
        }
        check_len(op, "partial", partial.len(), tile.partial_len);
        let count = geom.output_len(k);
        check_len(op, "y", y.len(), count);
        if count == 0 {
            return Ok(());
        }
        let [k_total, c_chunk, lane_cols, in_rows, in_cols, pitch] = [
            k,
            tile.c_chunk,
            tile.lane_cols,
            tile.input.0,
            tile.input.1,
            tile.pitch,
        ]
        .map(|v| to_i32(op, v));
        let [samples, sample_pitch, splits, split_channels] = [
            tile.samples,
            tile.sample_pitch,
            tile.splits,
            tile.split_channels,
        ]
        .map(|v| to_i32(op, v));
        let shape = DirectShape {
            k_total,
            c_chunk,
            lane_cols,
            in_rows,
            in_cols,
            pitch,
            samples,
            sample_pitch,
            splits,
            split_channels,
        };
        let [has_bias, flip, accumulate] = [bias.is_some(), flip, accumulate].map(i32::from);
        // Without a bias the kernels read none: any valid pointer stands in.
        let (bp, _b) = match bias {
            Some(b) => b.device_ptr(s),
            None => wt.device_ptr(s),
        };
        let (yp, _y) = y.device_ptr_mut(s);
        let (pp, _p) = partial.device_ptr_mut(s);
        let cfg = LaunchConfig {
            grid_dim: (tile.grid.0 as u32, tile.grid.1 as u32, tile.grid.2 as u32),
            block_dim: (DF_THREADS, 1, 1),
            shared_mem_bytes: tile.shared_bytes as u32,
        };
        // With splits, the kernel writes the splits' sums to `partial` instead of `y`.
        let out = if tile.splits > 1 { &pp } else { &yp };
        launch!(
            self, s, conv_forward_direct, cfg,
            [in x, in wt, &bp, &has_bias, &flip, &accumulate, out, &geom, &shape]
        )?;
        if tile.splits == 1 {
            return Ok(());
        }
        let (count_i, plane) = (to_i32(op, count), to_i32(op, (geom.oh * geom.ow) as usize));
        launch!(
            self,
            s,
            direct_sum_splits,
            self.grid(count),
            [
                &pp,
                &bp,
                &has_bias,
                &accumulate,
                &yp,
                &count_i,
                &splits,
                &plane,
                &k_total
            ]
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
        launch!(self, s, swap_outer, self.grid(n), [in x, out y, &ai, &bi, &pi])
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

    /// Runs without a GPU: the direct kernel's tiles — a net's first convolutions
    /// (cifar10_quick's, ResNet-50's 7 × 7 stride-2 one) in one chunk of channels and warps of
    /// 32 columns; cifar10_quick's second in four chunks of 8 channels and warps of 2 rows × 16
    /// columns; its third (8 × 8 planes) with 4 samples per block, one per row of 8 lanes, their
    /// staged channels 8 floats of padding apart, and its input channels split where the grid
    /// is small; none for planes of 2 rows.
    #[test]
    fn direct_tiles_fit_shared_memory_and_planes() {
        let quick1 = geom(512, 3, 32, 5, 2);
        // 25 taps × 32 channels of filters and 12 × 36 input values per channel.
        let want = DirectTile {
            lane_cols: 32,
            samples: 1,
            c_chunk: 3,
            input: (12, 36),
            pitch: 36,
            sample_pitch: 3 * 12 * 36,
            splits: 1,
            split_channels: 3,
            partial_len: 0,
            shared_bytes: 4 * 3 * (25 * 32 + 12 * 36),
            grid: (512, 4, 1),
        };
        assert_eq!(quick1.direct_tile(32), Some(want));
        let resnet1 = ConvGeom {
            sh: 2,
            sw: 2,
            oh: 112,
            ow: 112,
            ..geom(64, 3, 224, 7, 3)
        };
        let tile = resnet1.direct_tile(64).unwrap();
        assert_eq!(
            (tile.input, tile.c_chunk, tile.grid),
            ((21, 69), 3, (128, 14, 4))
        );
        let quick2 = geom(512, 32, 16, 5, 2);
        let want = DirectTile {
            lane_cols: 16,
            samples: 1,
            c_chunk: 8,
            input: (20, 20),
            pitch: 20,
            sample_pitch: 8 * 20 * 20,
            splits: 1,
            split_channels: 32,
            partial_len: 0,
            shared_bytes: 4 * 8 * (25 * 32 + 20 * 20),
            grid: (512, 1, 1),
        };
        assert_eq!(quick2.direct_tile(32), Some(want));
        // 25 × 32 filters and 4 samples × 12 × 12 inputs per channel fit 8 channels; 8 × 144
        // floats per sample is a multiple of 32, so 8 more put the 4 samples' rows of lanes on
        // 4 disjoint groups of banks. 128 × 2 blocks of 4 warps are half the target: the 4
        // chunks of channels in 2 splits of 2.
        let quick3 = geom(512, 32, 8, 5, 2);
        let want = DirectTile {
            lane_cols: 8,
            samples: 4,
            c_chunk: 8,
            input: (12, 12),
            pitch: 12,
            sample_pitch: 8 * 144 + 8,
            splits: 2,
            split_channels: 16,
            partial_len: 2 * 512 * 64 * 64,
            shared_bytes: 4 * (8 * 25 * 32 + 3 * (8 * 144 + 8) + 8 * 144),
            grid: (128 * 2 * 2, 1, 1),
        };
        assert_eq!(quick3.direct_tile(64), Some(want));
        // Its data gradient: 128 blocks, a quarter of the target; 8 chunks in 4 splits.
        let dgrad3 = quick3.data_gradient_geom(64).unwrap();
        let tile = dgrad3.direct_tile(32).unwrap();
        assert_eq!(
            (tile.c_chunk, tile.splits, tile.split_channels, tile.grid),
            (8, 4, 16, (128 * 4, 1, 1))
        );
        assert_eq!(tile.partial_len, 4 * 512 * 32 * 64);
        for (g, k) in [
            (quick1, 32),
            (quick2, 32),
            (resnet1, 64),
            (quick3, 64),
            (dgrad3, 32),
        ] {
            let tile = g.direct_tile(k).unwrap();
            assert!(tile.shared_bytes <= DIRECT_SHARED_LIMIT, "{g:?}");
            assert!(tile.c_chunk * tile.grid.0 > 0, "{g:?}");
        }
        assert_eq!(geom(512, 32, 2, 1, 0).direct_tile(64), None);
        // A filter bank of 2,000 taps per channel does not fit at all.
        assert_eq!(geom(1, 1, 64, 45, 0).direct_tile(32), None);
    }

    /// Runs without a GPU: the input tile's pitch puts a warp's rows of lanes on disjoint banks
    /// where padding can (2 rows of 16 lanes 80 floats apart, 4 rows of 8 lanes 56 apart), and
    /// is left alone where no pitch helps (a stride of 2 puts 2 lanes on each even bank).
    #[test]
    fn direct_pitch_avoids_bank_conflicts() {
        assert_eq!(direct_pitch(36, 32, 1, 1), 36);
        assert_eq!(direct_pitch(20, 16, 1, 1), 20);
        assert_eq!(direct_pitch(18, 16, 1, 1), 20);
        assert_eq!(direct_pitch(12, 8, 1, 1), 14);
        assert_eq!(direct_pitch(69, 32, 2, 2), 69);
    }

    /// Runs without a GPU: a data gradient as a forward — the top's gradient as the input, the
    /// bottom's shape as the output, padded by `extent − 1 − pad` — for stride 1 only.
    #[test]
    fn data_gradient_geom_is_the_transposed_convolution() {
        let quick2 = geom(512, 32, 16, 5, 2);
        assert_eq!(
            quick2.data_gradient_geom(64),
            Some(ConvGeom { c: 64, ..quick2 })
        );
        let dilated = ConvGeom {
            kh: 3,
            kw: 2,
            ph: 1,
            pw: 0,
            dh: 2,
            oh: 8 + 2 - 4,
            ow: 8 - 1,
            ..geom(2, 3, 8, 1, 0)
        };
        let d = dilated.data_gradient_geom(5).unwrap();
        assert_eq!((d.c, d.h, d.w, d.oh, d.ow), (5, 6, 7, 8, 8));
        assert_eq!((d.ph, d.pw, d.kh, d.kw, d.dh, d.dw), (3, 1, 3, 2, 2, 1));
        // The forward's output size formula on the gradient's geometry gives the bottom back.
        let out = |size: i32, k: i32, p: i32, dil: i32| size + 2 * p - (k - 1) * dil;
        assert_eq!(out(d.h, d.kh, d.ph, d.dh), dilated.h);
        assert_eq!(out(d.w, d.kw, d.pw, d.dw), dilated.w);
        let strided = ConvGeom {
            sh: 2,
            oh: 8,
            ..quick2
        };
        assert_eq!(strided.data_gradient_geom(32), None);
        assert_eq!(geom(1, 1, 8, 3, 3).data_gradient_geom(1), None);
    }

    /// Runs without a GPU: the implicit weight gradient's chunks are whole steps that cover
    /// `N·OH·OW` exactly once with none empty, in at most [`WG_MAX_WAVES`] waves of the device's
    /// slots; the bias's column fuses where the last tile has room for it; its scratch holds
    /// the chunks' partial sums, and is refused beyond the int range.
    #[test]
    fn implicit_wgrad_split_covers_the_reduction() {
        // cifar10_quick's three convolutions at batch 512, a one-sample one and a tiny one, with
        // the tile widths (in columns) that the filter rows fill exactly, leaving no room for the
        // bias's column: none for 75 and 9 filter rows; 800 = 5 · 160 and 576 = 9 · 64 = 6 · 96
        // = 3 · 192.
        for (g, k, filled) in [
            (geom(512, 3, 32, 5, 2), 32, &[][..]),
            (geom(512, 32, 16, 5, 2), 32, &[160]),
            (geom(512, 32, 8, 5, 2), 64, &[160]),
            (geom(1, 64, 56, 3, 1), 64, &[64, 96, 192]),
            (geom(1, 1, 3, 3, 0), 1, &[]),
        ] {
            let j_total = (g.n * g.oh * g.ow) as usize;
            let rows = (g.c * g.kh * g.kw) as usize;
            // Slots as an H100 holds the tiles' blocks (per multiprocessor of 132: 8, 5, 4, 3 of
            // 4 × 8 sub-tiles, 6, 4, 3 of 8 × 8), and a device with room for one block.
            let h100 = [1056, 660, 528, 396, 792, 528, 396];
            for (tile, slots) in IMPLICIT_WGRAD_TILES.into_iter().zip(h100) {
                let fuses = !filled.contains(&tile.columns());
                assert_eq!(g.implicit_wgrad_fuses_bias(tile), fuses, "{g:?}, {tile:?}");
                for slots in [slots, 1] {
                    for with_bias in [false, true] {
                        let what = format!("{g:?}, {tile:?}, {slots} slots, {with_bias}");
                        let outputs = (k, with_bias);
                        let (chunk, chunks) = g.implicit_wgrad_split(outputs, tile, slots);
                        assert_eq!(chunk % WG_J, 0, "{what}");
                        let covers = chunks * chunk >= j_total && (chunks - 1) * chunk < j_total;
                        assert!(covers, "{what}");
                        let columns = rows + usize::from(with_bias);
                        let blocks = chunks * k.div_ceil(WG_K) * columns.div_ceil(tile.columns());
                        assert!(chunks == 1 || blocks <= WG_MAX_WAVES * slots, "{what}");
                        let scratch = g.implicit_wgrad_scratch(outputs, tile, slots);
                        assert_eq!(scratch, Some(chunks * k * columns), "{what}");
                    }
                }
            }
        }
        // cifar10_quick's second convolution with its bias in tiles of 96 columns on an H100:
        // 9 tiles; 147 chunks, as a fixed target of 1,024 blocks of 128-column tiles gave, would
        // take 1,323 blocks (two waves of 660 and three more); 72 chunks of 57 steps fill one
        // wave, 648 blocks.
        let tile = WgradTile { warps: 3, rows: 4 };
        let (chunk, chunks) = geom(512, 32, 16, 5, 2).implicit_wgrad_split((32, true), tile, 660);
        assert_eq!((chunk, chunks), (57 * WG_J, 72));
        let huge = geom(4096, 256, 64, 3, 1);
        let tile = WgradTile { warps: 4, rows: 4 };
        assert_eq!(huge.implicit_wgrad_scratch((256, false), tile, 528), None);
    }
}
