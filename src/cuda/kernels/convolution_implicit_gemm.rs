//! Launchers of the implicit-GEMM weight-gradient kernels (`convolution_implicit_gemm.cu`):
//! [`Kernels::implicit_wgrad`] computes `dW (K, C·kh·kw) = dy (K, N·OH·OW) · colᵀ` without the
//! column matrix, gathering its values from the input tile by tile, in a fixed split over
//! `N·OH·OW`; [`IMPLICIT_WGRAD_TILES`] are the tile shapes its kernels come in.

use super::{check_len, to_i32, Kernels, BLOCK};
use crate::error::Result;
use cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};

use super::ConvGeom;

/// `wgrad_partial_*`'s rows of K per tile of `dW` and its step along `N·OH·OW` (the chunks'
/// unit): the constants of the same names in convolution_implicit_gemm.cu.
const WG_K: usize = 32;
const WG_J: usize = 32;

/// A tile shape of the implicit weight gradient (`wgrad_partial_<rows>x8_w<warps>` in convolution_implicit_gemm.cu):
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

impl ConvGeom {
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
}

impl Kernels {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernels::im2col::geom;

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
