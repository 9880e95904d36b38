//! Launchers of the direct convolution kernels (`convolution_direct.cu`):
//! [`Kernels::conv_forward_direct`] computes a convolution from shared memory, a chunk of input
//! channels at a time, bias included ([`ConvGeom::direct_tile`] says how it covers a shape), and
//! with the filters flipped a stride-1 convolution's data gradient
//! ([`ConvGeom::data_gradient_geom`]).

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{
    CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::ConvGeom;

/// `conv_forward_direct`'s output channels per block and output rows per thread, and its block
/// size (one warp per 8 channels): the constants of the same names in convolution_direct.cu.
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
}

impl Kernels {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernels::im2col::geom;

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
}
