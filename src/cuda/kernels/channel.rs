//! Launchers of the per-channel kernels (`channel.cu`): deterministic two-stage reductions over a
//! channel view, per-channel affine maps and PReLU's per-channel slopes. A "channel view"
//! `(outer, dim, inner)` of a blob has the channel index `(i / inner) % dim`: `(N, C, H·W)` for
//! NCHW, `(N·H·W, C, 1)` for NHWC.

use super::{check_len, half_arg, int_count, to_i32, Kernels, StoredElem, BLOCK};
use crate::cuda::gpu_error;
use crate::error::Result;
use crate::precision::Half;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;

/// The scratch of `len` doubles for stage 1's partial sums: stream-ordered (the context's memory
/// pool, freed in stream order on drop) and not zeroed, since stage 1 writes every partial that
/// the finishing kernel reads.
pub(super) fn partial_sums_scratch(
    s: &Arc<CudaStream>,
    op: &str,
    len: usize,
) -> Result<CudaSlice<f64>> {
    // SAFETY: the finishing kernels read a partial (channel < dim, chunk < splits) only after
    // stage 1, earlier on the same stream, wrote it.
    unsafe { s.alloc::<f64>(len) }.map_err(|e| gpu_error(&format!("{op} scratch"), e))
}

/// Whether tensors stored as `T` over the view `(outer, dim, inner)`, at the device addresses
/// `ptrs`, take the `_h8` kernels, which read channels-last tensors four or eight channels a
/// thread (`channels_last_sums` in `channel.cu`, and the fused chain's): half-type bit patterns,
/// channels-last (`inner == 1`), `dim` a multiple of 8 and every buffer 16-byte aligned.
pub(super) fn channels_last_by_eight<T: StoredElem>(
    (_, dim, inner): (usize, usize, usize),
    ptrs: &[CUdeviceptr],
) -> bool {
    T::HALF && inner == 1 && dim % 8 == 0 && ptrs.iter().all(|p| p % 16 == 0)
}

impl Kernels {
    /// The grid of a stage 1 over a channels-last view `(outer, dim, 1)` that reads `per_thread`
    /// adjacent channels a thread (`channels_last_sums` in `channel.cu`, `V`):
    /// [`Kernels::grid_channel_sums`]'s splits, so that each channel's partials are those of its
    /// one-channel-a-thread grid, and blocks of `(min(32, dim / per_thread), 8)` threads.
    pub(super) fn grid_channel_sums_by(
        &self,
        dims: (usize, usize, usize),
        per_thread: usize,
    ) -> (LaunchConfig, usize) {
        let (mut cfg, splits) = self.grid_channel_sums(dims);
        let groups = dims.1.div_ceil(per_thread);
        let width = groups.clamp(1, 32);
        cfg.grid_dim.1 = groups.div_ceil(width) as u32;
        cfg.block_dim = (width as u32, 8, 1);
        (cfg, splits)
    }

    /// Stage 1 of a two-stage channel reduction over the view `(outer, dim, inner)`: its grid
    /// and the number of chunks each channel's values are split into (see `view_sums` in
    /// `channel.cu`). For `inner > 1` a block of `BLOCK` threads per channel and chunk; for
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

    /// A two-stage channel reduction over the view `dims` = `(outer, dim, inner)` (see
    /// [`Kernels::grid_channel_sums`], or with `Some(per_thread)` channels a thread
    /// [`Kernels::grid_channel_sums_by`]):
    /// `stage1(grid, partial, splits)` writes `per_channel · dim · splits` partial sums in double
    /// into the scratch `partial`, then `finish(partial, splits)` reduces them in a fixed order.
    pub(super) fn two_stage_sums(
        &self,
        s: &Arc<CudaStream>,
        (op, per_channel): (&str, usize),
        (dims, per_thread): ((usize, usize, usize), Option<usize>),
        stage1: impl FnOnce(LaunchConfig, CUdeviceptr, i32) -> Result<()>,
        finish: impl FnOnce(CUdeviceptr, i32) -> Result<()>,
    ) -> Result<()> {
        let (grid, splits) = match per_thread {
            Some(v) => self.grid_channel_sums_by(dims, v),
            None => self.grid_channel_sums(dims),
        };
        let sp = to_i32(op, splits);
        let mut partial = partial_sums_scratch(s, op, per_channel * dims.1 * splits)?;
        {
            let (pp, _p) = partial.device_ptr_mut(s);
            stage1(grid, pp, sp)?;
        }
        let (pp, _p) = partial.device_ptr(s);
        finish(pp, sp)
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
        dims: (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let operands = (a, use_b.then_some(b), 0);
        self.channel_sums(
            s,
            ("channel_reduce", false),
            operands,
            out,
            dims,
            accumulate,
        )
    }

    /// [`Kernels::channel_reduce`] of `a` alone stored as half-type bit patterns of `half`:
    /// `out[d] (+)= Σ a` (a convolution's bias gradient from its half-type top gradient), the
    /// same chunks and so the same values as `channel_reduce` of `a`'s FP32 values.
    pub fn channel_reduce_half(
        &self,
        s: &Arc<CudaStream>,
        a: &impl DevicePtr<u16>,
        half: Half,
        out: &mut impl DevicePtrMut<f32>,
        dims: (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = ("channel_reduce_h", false);
        let operands = (a, None::<&CudaView<'_, u16>>, half_arg(Some(half)));
        self.channel_sums(s, op, operands, out, dims, accumulate)
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
        dims: (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = ("channel_reduce_pair", true);
        self.channel_sums(s, op, (a, Some(b), 0), out, dims, accumulate)
    }

    /// The sums per channel `out (+)=` of the two-stage reduction [`Kernels::two_stage_sums`]
    /// over the view `(outer, dim, inner)` of `a` and `b` (`None`: not read), stored as `T` (of
    /// the half type `half`, the kernels' argument: 0 for FP32, nothing rounded): one per
    /// channel (`out (dim)`, [`Kernels::channel_reduce`]), or with `pair` two
    /// ([`Kernels::channel_reduce_pair`], `out (2·dim)`).
    fn channel_sums<T: StoredElem>(
        &self,
        s: &Arc<CudaStream>,
        (op, pair): (&str, bool),
        (a, b, half): (&impl DevicePtr<T>, Option<&impl DevicePtr<T>>, i32),
        out: &mut impl DevicePtrMut<f32>,
        (outer, dim, inner): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        // Every stage-1 kernel takes `(a, b, has_b, partial, outer, dim, inner, splits, half)`,
        // both finishing ones `(partial, out, dim, splits, accumulate)`.
        // The pair's sums are taken of FP32 tensors only (the Scale layer's gradient).
        assert!(!(pair && T::HALF), "{op}: pair sums of half-type tensors");
        let (per_channel, [stage1, finish]) = match pair {
            true => {
                let stage1 = (&self.bn_sums, "bn_sums");
                (
                    2,
                    [stage1, (&self.pair_reduce_finish, "pair_reduce_finish")],
                )
            }
            false => {
                let stage1 = match T::HALF {
                    false => (&self.channel_reduce, "channel_reduce"),
                    true => (&self.channel_reduce_h, "channel_reduce_h"),
                };
                let finish = (&self.channel_reduce_finish, "channel_reduce_finish");
                (1, [stage1, finish])
            }
        };
        let n = outer * dim * inner;
        check_len(op, "a", a.len(), n);
        if let Some(b) = b {
            check_len(op, "b", b.len(), n);
        }
        check_len(op, "out", out.len(), per_channel * dim);
        if dim == 0 {
            return Ok(());
        }
        to_i32(op, n);
        let (o, d, i) = (to_i32(op, outer), to_i32(op, dim), to_i32(op, inner));
        let (hb, acc) = (b.is_some() as i32, accumulate as i32);
        // An absent `b` passes a's address, never read (has_b is 0).
        let (bp, _b) = match b {
            Some(b) => b.device_ptr(s),
            None => a.device_ptr(s),
        };
        self.two_stage_sums(
            s,
            (op, per_channel),
            ((outer, dim, inner), None),
            |grid, pp, sp| {
                launch!(
                    function stage1.0, stage1.1, s, grid,
                    [in a, &bp, &hb, &pp, &o, &d, &i, &sp, &half]
                )
            },
            |pp, sp| {
                let rows = self.grid_rows(dim);
                launch!(function finish.0, finish.1, s, rows, [&pp, out out, &d, &sp, &acc])
            },
        )
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
        for (what, v) in [("scale", scale), ("bias", bias)] {
            if let Some(v) = v {
                check_len(op, what, v.len(), dim);
            }
        }
        let Some(ni) = int_count(op, n, &[("x", x.len()), ("y", y.len())]) else {
            return Ok(());
        };
        let (d, i) = (to_i32(op, dim), to_i32(op, inner));
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
        check_len(op, "bias", bias.len(), dim);
        let Some(ni) = int_count(op, n, &[("y", y.len())]) else {
            return Ok(());
        };
        let (d, i) = (to_i32(op, dim), to_i32(op, inner));
        let (yp, _y) = y.device_ptr_mut(s);
        // channel_affine reads x[i] before it writes y[i]: x = y is its in-place form; the
        // scale operand is absent (flag 0, never read).
        let (no, yes) = (0i32, 1i32);
        launch!(
            self, s, channel_affine, self.grid(n),
            [&yp, &yp, &no, in bias, &yes, &yp, &ni, &d, &i]
        )
    }
}

launchers! {
    /// `dx (+)= dy · scale[d]` over `(n)` viewed as `(·, dim, inner)`.
    pub fn channel_scale_backward(
        dy: in f32, scale: in f32 [dim], dx: out f32,
        n: elements as i32, (dim, inner): (usize, usize) as i32, accumulate: bool as i32,
    ) => launch channel_scale_backward(in dy, in scale, out dx, &n, &dim, &inner, &accumulate);

    /// PReLU forward over `(n)` viewed as `(·, dim, inner)`: `y = max(x, 0) + slope[d] ·
    /// min(x, 0)` (`dim = 1`: one slope for all).
    pub fn prelu_forward(
        x: in f32, slope: in f32 [dim], y: out f32, n: elements as i32,
        (dim, inner): (usize, usize) as i32,
    ) => launch prelu_forward(in x, in slope, out y, &n, &dim, &inner);

    /// PReLU backward to the bottom over `(n)` viewed as `(·, dim, inner)`: `dx (+)= x > 0 ? dy
    /// : slope[d] · dy`.
    pub fn prelu_backward(
        x: in f32, dy: in f32, slope: in f32 [dim], dx: out f32,
        n: elements as i32, (dim, inner): (usize, usize) as i32, accumulate: bool as i32,
    ) => launch prelu_backward(in x, in dy, in slope, out dx, &n, &dim, &inner, &accumulate);

    /// `m = x ≤ 0 ? x : 0` over `(n)`: the factor of `dy` in PReLU's slope gradient.
    pub fn prelu_negative_part(x: in f32, m: out f32, n: elements as i32)
        => launch prelu_negative_part(in x, out m, &n);
}

#[cfg(test)]
mod tests {
    use crate::cuda::test_util::gpu_or_skip;
    use crate::precision::Half;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// `channel_reduce_half` of half-type bit patterns gives `channel_reduce`'s bits on their
    /// FP32 values, written and added, over an NCHW view and channels-last ones (one a multiple
    /// of 32 channels, one not), in both half types.
    #[test]
    fn half_type_channel_sums_are_the_fp32_sums_of_their_values() {
        let gpu = gpu_or_skip!("half_type_channel_sums_are_the_fp32_sums_of_their_values");
        let (s, k) = (&gpu.compute, &gpu.kernels);
        let mut rng = ChaCha8Rng::seed_from_u64(23);
        for half in [Half::Bf16, Half::Fp16] {
            for dims in [(6, 5, 37), (700, 64, 1), (333, 24, 1)] {
                let n = dims.0 * dims.1 * dims.2;
                let values: Vec<f32> = (0..n)
                    .map(|_| half.round(rng.gen_range(-3.0f32..3.0)))
                    .collect();
                let bits: Vec<u16> = values.iter().map(|&v| half.bits(v)).collect();
                let (x, h) = (s.clone_htod(&values).unwrap(), s.clone_htod(&bits).unwrap());
                let start: Vec<f32> = (0..dims.1).map(|d| d as f32 * 0.25 - 1.0).collect();
                for accumulate in [false, true] {
                    let mut want = s.clone_htod(&start).unwrap();
                    let mut got = s.clone_htod(&start).unwrap();
                    k.channel_reduce(s, &x, &x, false, &mut want, dims, accumulate)
                        .unwrap();
                    k.channel_reduce_half(s, &h, half, &mut got, dims, accumulate)
                        .unwrap();
                    let (want, got) = (s.clone_dtoh(&want).unwrap(), s.clone_dtoh(&got).unwrap());
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{half:?} {dims:?} accumulate {accumulate}"
                    );
                }
            }
        }
    }
}
