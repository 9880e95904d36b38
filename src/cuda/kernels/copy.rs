//! Launchers of the copy kernels (`copy.cu`): strided rows (concat, slices), strided planes (a
//! strided 1 × 1 convolution's data gradient) and batched transposes (NCHW ↔ NHWC).

use super::{check_len, to_i32, Kernels, BLOCK};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

launchers! {
    /// `y[b] (+)= x[b]ᵀ` for `batch` row-major `(rows, cols)` matrices `x`, each becoming
    /// `(cols, rows)`: NCHW ↔ NHWC (`rows = C, cols = H·W` or the reverse) and KCRS ↔ KRSC.
    pub fn transpose(
        x: in f32, y: out f32, batch: usize, (rows, cols): (usize, usize) as i32,
        accumulate: bool as i32,
    ) over [batch * rows * cols]
        => launch transpose_batched(in x, out y, &rows, &cols, &accumulate)
        on transpose_grid(OP, batch, (rows, cols));

    /// [`Kernels::transpose`] from FP32 into half-type bit patterns (`fp16`, else bf16),
    /// rounded: a KCRS weight into the KRSC one a half-type convolution reads.
    pub fn transpose_to_half(
        x: in f32, y: out u16, batch: usize, (rows, cols): (usize, usize) as i32,
        fp16: bool as i32,
    ) over [batch * rows * cols]
        => launch transpose_to_half(in x, out y, &rows, &cols, &fp16)
        on transpose_grid(OP, batch, (rows, cols));

    /// [`Kernels::transpose`] from half-type bit patterns into FP32 (`y (+)=` the widened
    /// values): a KRSC weight gradient into the KCRS one.
    pub fn transpose_widen(
        x: in u16, y: out f32, batch: usize, (rows, cols): (usize, usize) as i32,
        accumulate: bool as i32, fp16: bool as i32,
    ) over [batch * rows * cols]
        => launch transpose_widen(in x, out y, &rows, &cols, &accumulate, &fp16)
        on transpose_grid(OP, batch, (rows, cols));

    /// `y[..n] (+)= x[..n]` widened from half-type bit patterns: the FP32 copy of a half-type
    /// blob, or a half-type copy's gradient into an FP32 blob's.
    pub fn widen_half(x: in u16, y: out f32, fp16: bool as i32, accumulate: bool as i32,
        n: elements as i64)
        => launch widen_half(in x, out y, &fp16, &accumulate, &n);

    /// `y[..n] =` the half-type bit patterns of `x[..n]` (plus `y` widened, where
    /// `accumulate`), rounded once: the half-type copy of an FP32 blob, or an FP32 copy's
    /// gradient into a half-type blob's.
    pub fn narrow_half(x: in f32, y: out u16, fp16: bool as i32, accumulate: bool as i32,
        n: elements as i64)
        => launch narrow_half(in x, out y, &fp16, &accumulate, &n);

    /// `y[..n] (+)= x[..n]` rounded to the half type: a weight gradient computed in FP32,
    /// rounded once, added in FP32.
    pub fn add_rounded(x: in f32, y: out f32, fp16: bool as i32, accumulate: bool as i32,
        n: elements as i64)
        => launch add_rounded(in x, out y, &fp16, &accumulate, &n);
}

/// The launch of `transpose_batched` (and its half-type twins) over `batch` `(rows, cols)`
/// matrices, whose block shape tells the kernel which way to go (`transpose_tiles` in
/// `copy.cu`): where both sides hold a 32 × 32 tile (or a matrix's elements pass an `int`),
/// blocks of 32 × 8 threads, one per tile and matrix; else (a filter's few taps a channel)
/// blocks of one row of `BLOCK` threads striding over each matrix's elements, up to 64 a matrix.
///
/// # Panics
/// If the matrices exceed the grid (65,535 along z).
fn transpose_grid(op: &str, batch: usize, (rows, cols): (usize, usize)) -> LaunchConfig {
    let batch = u32::try_from(batch)
        .ok()
        .filter(|&b| b <= 65_535)
        .unwrap_or_else(|| panic!("{op}: {batch} matrices exceed the grid"));
    if (rows >= 32 && cols >= 32) || rows * cols > i32::MAX as usize {
        return LaunchConfig {
            grid_dim: (cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, batch),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
    }
    let blocks = (rows * cols).div_ceil(BLOCK as usize).clamp(1, 64) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, batch),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Kernels {
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
}

#[cfg(test)]
mod tests {
    use crate::cuda::test_util::gpu_or_skip;
    use crate::precision::Half;

    /// `y[b][c][r] = x[b][r][c]`, or added to `y`, on the host.
    fn transposed(
        x: &[f32],
        y: &[f32],
        batch: usize,
        (rows, cols): (usize, usize),
        add: bool,
    ) -> Vec<f32> {
        let mut out = y.to_vec();
        for b in 0..batch {
            for r in 0..rows {
                for c in 0..cols {
                    let (to, from) = ((b * cols + c) * rows + r, (b * rows + r) * cols + c);
                    out[to] = if add { out[to] + x[from] } else { x[from] };
                }
            }
        }
        out
    }

    /// The three batched transposes move every element where the host puts it, written and
    /// added, by tiles (both sides at least 32) and by elements (a 1 × 1 filter's one tap, a
    /// 3 × 3's nine, an RGB stem's three channels, a side just short of a tile).
    #[test]
    fn batched_transposes_by_tiles_and_by_elements() {
        let gpu = gpu_or_skip!("batched_transposes_by_tiles_and_by_elements");
        let (s, k) = (&gpu.compute, &gpu.kernels);
        let half = Half::Bf16;
        for (batch, dims) in [
            (3, (40, 70)),
            (5, (64, 1)),
            (4, (33, 9)),
            (2, (3, 49)),
            (3, (31, 32)),
        ] {
            let n = batch * dims.0 * dims.1;
            let x: Vec<f32> = (0..n).map(|i| half.round(i as f32 * 0.37 - 11.0)).collect();
            let y0: Vec<f32> = (0..n).map(|i| half.round(i as f32 * 0.11 + 1.0)).collect();
            let xd = s.clone_htod(&x).unwrap();
            let xh = s
                .clone_htod(&x.iter().map(|&v| half.bits(v)).collect::<Vec<_>>())
                .unwrap();
            for add in [false, true] {
                let want = transposed(&x, &y0, batch, dims, add);
                let mut y = s.clone_htod(&y0).unwrap();
                k.transpose(s, &xd, &mut y, batch, dims, add).unwrap();
                assert_eq!(
                    s.clone_dtoh(&y).unwrap(),
                    want,
                    "transpose {batch} {dims:?} {add}"
                );
                let mut y = s.clone_htod(&y0).unwrap();
                k.transpose_widen(s, &xh, &mut y, batch, dims, add, false)
                    .unwrap();
                assert_eq!(
                    s.clone_dtoh(&y).unwrap(),
                    want,
                    "widen {batch} {dims:?} {add}"
                );
            }
            let want = transposed(&x, &vec![0.0; n], batch, dims, false);
            let mut h = s.clone_htod(&vec![0u16; n]).unwrap();
            k.transpose_to_half(s, &xd, &mut h, batch, dims, false)
                .unwrap();
            let got: Vec<f32> = s
                .clone_dtoh(&h)
                .unwrap()
                .iter()
                .map(|&b| half.widen(b))
                .collect();
            assert_eq!(got, want, "to half {batch} {dims:?}");
        }
    }
}
