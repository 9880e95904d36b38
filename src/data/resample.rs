//! Resampling a window of an 8-bit [`Image`] to a fixed size, into planar 8-bit pixels: the
//! geometric half of `random_resized_crop`, `resize_shorter` + `center_crop`, and Caffe's
//! `new_height`/`new_width` resize.
//!
//! Separable linear interpolation, pixel centres at `+0.5` (OpenCV's and PIL's mapping: output
//! pixel `o` of a window `[a, a + n)` resized to `m` samples the input at `a + (o + 0.5)·n/m −
//! 0.5`). With `antialias` (PIL's bilinear, which torchvision applies to PIL images) the triangle
//! filter widens by the reduction factor when shrinking, so every input pixel contributes; without
//! it (OpenCV's `INTER_LINEAR`, which Caffe uses) only the two nearest pixels do. Taps are clipped
//! to the image (not to the window: a window is a view of the image, as a crop of a resized
//! image is) and their weights renormalised (in f64, then stored as f32).
//!
//! Arithmetic, exactly (so that a result is the same on every machine and every SIMD width):
//! pass 1 runs down the columns: for each output row, over only the input columns some output
//! reads, `mid = w₀·in[r₀] + w₁·in[r₀+1] + …` in f32 (the bytes converted exactly), each product
//! and each sum rounded once, in that order (no fused multiply-add); pass 2 runs along each such
//! row: for each output column, `acc = 0 + w₀·mid[c₀] + w₁·mid[c₀+1] + …` in f32 the same way.
//! `acc` is clamped to 0..=255 and rounded to the nearest integer, half-way values to the even
//! one ([`round_pixel`]). Against exact arithmetic this differs only where the exact value is
//! within a rounding error (far below 10⁻³) of half-way between two pixels.
//!
//! Layout, for speed: the columns-first order touches only the output's rows, and pass 1 is a
//! weighted sum of whole input rows, which vectorises as it stands. Pass 2 works on blocks of
//! [`BLOCK`] output rows: the block's pass-1 rows are transposed so that each value's `BLOCK`
//! rows lie side by side, and each output column of each channel is then `BLOCK` lanes of
//! multiply-adds; its pixels are staged by column and copied into the output's rows. The
//! passes are compiled once for the baseline target and once for AVX2, chosen at run time;
//! neither changes the order of the operations on a value, only how many values go at once.
//!
//! Shapes: the input image is `(H, W, C)` interleaved, C ≤ 4; outputs are `(C, out_h, out_w)`
//! planar.

use super::decode::Image;

/// A window of an image, in pixel-edge coordinates (may be fractional): rows `y..y + h`,
/// columns `x..x + w`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub y: f64,
    pub x: f64,
    pub h: f64,
    pub w: f64,
}

impl Window {
    /// The whole of an image of `h`×`w`.
    pub fn whole(h: usize, w: usize) -> Self {
        Window::pixels(0, 0, h, w)
    }

    /// The whole pixels `y..y + h`, `x..x + w`.
    pub fn pixels(y: usize, x: usize, h: usize, w: usize) -> Self {
        Window {
            y: y as f64,
            x: x as f64,
            h: h as f64,
            w: w as f64,
        }
    }
}

/// The taps of one axis: for each output sample the first input index and the weights of
/// consecutive inputs. Its buffers are reused from image to image.
#[derive(Debug, Clone, Default)]
struct Taps {
    /// `(m)` first inputs.
    first: Vec<usize>,
    /// `(m, taps)` weights per output sample (zero-padded).
    weights: Vec<f32>,
    /// `(m)`: the weights of each output up to its last non-zero one (at least 1).
    count: Vec<usize>,
    taps: usize,
}

impl Taps {
    /// Sets the taps resampling the span `[start, start + len)` of an axis of `size` pixels
    /// onto `m` outputs, clipped to the axis.
    fn compute(&mut self, start: f64, len: f64, size: usize, m: usize, antialias: bool) {
        let scale = len / m as f64;
        let support = if antialias { scale.max(1.0) } else { 1.0 };
        let taps = (2.0 * support).ceil() as usize + 2;
        self.taps = taps;
        self.first.clear();
        self.count.clear();
        self.weights.clear();
        self.weights.resize(m * taps, 0.0);
        for (o, row) in self.weights.chunks_exact_mut(taps).enumerate() {
            let centre = start + (o as f64 + 0.5) * scale;
            let lo = ((centre - support).floor().max(0.0) as usize).min(size - 1);
            let hi = ((centre + support).ceil().max(0.0) as usize).clamp(lo + 1, size);
            let weight = |i: usize| (1.0 - ((i as f64 + 0.5 - centre) / support).abs()).max(0.0);
            let inputs = lo..hi.min(lo + taps);
            let sum: f64 = inputs.clone().map(weight).sum();
            if sum > 0.0 {
                for (v, i) in row.iter_mut().zip(inputs) {
                    *v = (weight(i) / sum) as f32;
                }
            } else {
                row[0] = 1.0;
            }
            self.first.push(lo);
            self.count
                .push(row.iter().rposition(|&v| v != 0.0).map_or(1, |k| k + 1));
        }
    }

    /// Output `o`'s first input and weights (up to the last non-zero one).
    fn of(&self, o: usize) -> (usize, &[f32]) {
        let start = o * self.taps;
        (self.first[o], &self.weights[start..start + self.count[o]])
    }

    /// The inputs any output reads: `lo..hi`.
    fn span(&self) -> (usize, usize) {
        let lo = self.first.iter().copied().min().unwrap_or(0);
        let hi = (0..self.first.len())
            .map(|o| self.first[o] + self.count[o])
            .max()
            .unwrap_or(lo);
        (lo, hi)
    }
}

/// Output rows resampled together: pass 2 works on this many rows at once, one SIMD vector of
/// f32 (AVX2's 8 lanes).
const BLOCK: usize = 8;

/// What [`resample`] reuses between images: both axes' taps and the passes' buffers.
#[derive(Debug, Clone, Default)]
pub struct Resampler {
    across: Taps,
    down: Taps,
    buffers: Buffers,
}

/// The passes' intermediate values for one block of [`BLOCK`] output rows.
#[derive(Debug, Clone, Default)]
struct Buffers {
    /// Pass 1's output, `(BLOCK, n)`.
    rows: Vec<f32>,
    /// The same transposed, `(n, BLOCK)`: each value's `BLOCK` rows side by side.
    columns: Vec<f32>,
    /// Pass 2's pixels, `(C, out_w, BLOCK)`, before they go to their rows of the output.
    pixels: Vec<u8>,
}

/// The geometry of one resampling, for the passes.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Channels of the image.
    c: usize,
    /// The first input column any output reads, and how many values (columns × C) pass 1
    /// computes per row.
    lo: usize,
    n: usize,
    out_h: usize,
    out_w: usize,
    flip: bool,
}

/// Resamples `window` of `image` to `out_h`×`out_w`, mirrored along W when `flip`, into `out`
/// (`(C, out_h, out_w)` pixels, rounded as the module docs say). `scratch` is reused.
pub fn resample(
    image: &Image,
    window: Window,
    (out_h, out_w): (usize, usize),
    flip: bool,
    antialias: bool,
    out: &mut [u8],
    scratch: &mut Resampler,
) {
    resample_on(
        image,
        window,
        (out_h, out_w),
        (flip, antialias),
        out,
        scratch,
        true,
    );
}

/// [`resample`], with the AVX2 build of the passes where `avx2` allows it and the processor
/// has it.
fn resample_on(
    image: &Image,
    window: Window,
    (out_h, out_w): (usize, usize),
    (flip, antialias): (bool, bool),
    out: &mut [u8],
    scratch: &mut Resampler,
    avx2: bool,
) {
    let c = image.channels;
    assert!((1..=4).contains(&c), "images of 1 to 4 channels");
    assert_eq!(out.len(), c * out_h * out_w, "output of (C, H, W)");
    assert_eq!(
        image.pixels.len(),
        image.height * image.width * c,
        "(H, W, C) pixels"
    );
    let Resampler {
        across,
        down,
        buffers,
    } = scratch;
    across.compute(window.x, window.w, image.width, out_w, antialias);
    down.compute(window.y, window.h, image.height, out_h, antialias);
    let (lo, hi) = across.span();
    let n = (hi - lo) * c;
    let shape = Shape {
        c,
        lo,
        n,
        out_h,
        out_w,
        flip,
    };
    // Rows past the last output row of the last block keep stale values, which are never
    // stored.
    buffers.rows.resize(BLOCK * n, 0.0);
    buffers.columns.resize(n * BLOCK, 0.0);
    buffers.pixels.resize(c * out_w * BLOCK, 0);
    passes(image, down, across, shape, buffers, out, avx2);
}

/// Both passes, compiled for AVX2 where `avx2` allows it and the processor has it.
fn passes(
    image: &Image,
    down: &Taps,
    across: &Taps,
    shape: Shape,
    buffers: &mut Buffers,
    out: &mut [u8],
    avx2: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if avx2 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2.
        unsafe { passes_avx2(image, down, across, shape, buffers, out) };
        return;
    }
    passes_generic::<false>(image, down, across, shape, buffers, out);
}

/// [`passes_generic`] compiled with AVX2 (the same operations in the same order per value).
///
/// # Safety
/// The processor must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn passes_avx2(
    image: &Image,
    down: &Taps,
    across: &Taps,
    shape: Shape,
    buffers: &mut Buffers,
    out: &mut [u8],
) {
    passes_generic::<true>(image, down, across, shape, buffers, out);
}

/// Pass 1 then pass 2 on each block of [`BLOCK`] output rows, through `rows` `(BLOCK, n)` and
/// `columns` `(n, BLOCK)`. `AVX2` (only where the processor has it) transposes with AVX2's
/// shuffles.
#[inline(always)]
fn passes_generic<const AVX2: bool>(
    image: &Image,
    down: &Taps,
    across: &Taps,
    shape: Shape,
    buffers: &mut Buffers,
    out: &mut [u8],
) {
    let Buffers {
        rows,
        columns,
        pixels,
    } = buffers;
    for y0 in (0..shape.out_h).step_by(BLOCK) {
        let block = BLOCK.min(shape.out_h - y0);
        vertical(image, down, shape, y0, block, rows);
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: `AVX2` is set by `passes_avx2` only, which runs where the processor has it.
            unsafe { transpose_avx2(rows, shape.n, columns) };
        } else {
            transpose(rows, shape.n, columns);
        }
        #[cfg(not(target_arch = "x86_64"))]
        transpose(rows, shape.n, columns);
        match shape.c {
            1 => horizontal::<1>(columns, across, shape, pixels),
            2 => horizontal::<2>(columns, across, shape, pixels),
            3 => horizontal::<3>(columns, across, shape, pixels),
            _ => horizontal::<4>(columns, across, shape, pixels),
        }
        scatter(pixels, shape, (y0, block), out);
    }
}

/// Pass 1 for output rows `y0..y0 + block`: the input rows each one's taps name, weighted and
/// summed, over the values `shape.lo·C..` of each row (`shape.n` of them) into `rows`
/// `(BLOCK, n)`.
#[inline(always)]
fn vertical(image: &Image, down: &Taps, shape: Shape, y0: usize, block: usize, rows: &mut [f32]) {
    let row_len = image.width * shape.c;
    let offset = shape.lo * shape.c;
    let n = shape.n;
    for (r, dst) in rows.chunks_exact_mut(n).take(block).enumerate() {
        let (first, wts) = down.of(y0 + r);
        let src = |k: usize| &image.pixels[(first + k) * row_len + offset..][..n];
        let w0 = wts[0];
        dst.iter_mut()
            .zip(src(0))
            .for_each(|(d, &s)| *d = w0 * f32::from(s));
        for (k, &w) in wts.iter().enumerate().skip(1) {
            dst.iter_mut()
                .zip(src(k))
                .for_each(|(d, &s)| *d += w * f32::from(s));
        }
    }
}

/// `rows` `(BLOCK, n)` transposed into `columns` `(n, BLOCK)`.
#[inline(always)]
fn transpose(rows: &[f32], n: usize, columns: &mut [f32]) {
    for (j, column) in columns.chunks_exact_mut(BLOCK).enumerate() {
        for (r, v) in column.iter_mut().enumerate() {
            *v = rows[r * n + j];
        }
    }
}

/// [`transpose`] eight columns at a time as 8×8 blocks through AVX2's shuffles (data movement
/// only: the values are those [`transpose`] gives).
///
/// # Safety
/// The processor must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(rows: &[f32], n: usize, columns: &mut [f32]) {
    use std::arch::x86_64::*;
    const { assert!(BLOCK == 8, "8×8 blocks") };
    assert!(rows.len() >= BLOCK * n && columns.len() >= n * BLOCK);
    let whole = n / 8 * 8;
    for j in (0..whole).step_by(8) {
        // SAFETY: rows `r·n + j .. + 8` and columns `(j + i)·8 .. + 8` lie within the lengths
        // asserted above, as `j + 8 ≤ n`.
        unsafe {
            let row = |r: usize| _mm256_loadu_ps(rows.as_ptr().add(r * n + j));
            let (a, b, c, d) = (row(0), row(1), row(2), row(3));
            let (e, f, g, h) = (row(4), row(5), row(6), row(7));
            let (ab0, ab1) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
            let (cd0, cd1) = (_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
            let (ef0, ef1) = (_mm256_unpacklo_ps(e, f), _mm256_unpackhi_ps(e, f));
            let (gh0, gh1) = (_mm256_unpacklo_ps(g, h), _mm256_unpackhi_ps(g, h));
            let q0 = _mm256_shuffle_ps::<0x44>(ab0, cd0);
            let q1 = _mm256_shuffle_ps::<0xee>(ab0, cd0);
            let q2 = _mm256_shuffle_ps::<0x44>(ab1, cd1);
            let q3 = _mm256_shuffle_ps::<0xee>(ab1, cd1);
            let q4 = _mm256_shuffle_ps::<0x44>(ef0, gh0);
            let q5 = _mm256_shuffle_ps::<0xee>(ef0, gh0);
            let q6 = _mm256_shuffle_ps::<0x44>(ef1, gh1);
            let q7 = _mm256_shuffle_ps::<0xee>(ef1, gh1);
            let out = columns.as_mut_ptr().add(j * BLOCK);
            let store = |i: usize, v: __m256| _mm256_storeu_ps(out.add(i * BLOCK), v);
            store(0, _mm256_permute2f128_ps::<0x20>(q0, q4));
            store(1, _mm256_permute2f128_ps::<0x20>(q1, q5));
            store(2, _mm256_permute2f128_ps::<0x20>(q2, q6));
            store(3, _mm256_permute2f128_ps::<0x20>(q3, q7));
            store(4, _mm256_permute2f128_ps::<0x31>(q0, q4));
            store(5, _mm256_permute2f128_ps::<0x31>(q1, q5));
            store(6, _mm256_permute2f128_ps::<0x31>(q2, q6));
            store(7, _mm256_permute2f128_ps::<0x31>(q3, q7));
        }
    }
    for (j, column) in columns[..n * BLOCK]
        .chunks_exact_mut(BLOCK)
        .enumerate()
        .skip(whole)
    {
        for (r, v) in column.iter_mut().enumerate() {
            *v = rows[r * n + j];
        }
    }
}

/// Pass 2 for images of `C` channels on one block of rows: each channel's values along W
/// weighted by `across` (mirrored when `shape.flip`), all the block's rows at once from
/// `columns` `(n, BLOCK)`, rounded into `pixels` `(C, out_w, BLOCK)`.
#[inline(always)]
fn horizontal<const C: usize>(columns: &[f32], across: &Taps, shape: Shape, pixels: &mut [u8]) {
    let out_w = shape.out_w;
    for ox in 0..out_w {
        let (first, wts) = across.of(ox);
        let taps = &columns[(first - shape.lo) * C * BLOCK..][..wts.len() * C * BLOCK];
        let dx = if shape.flip { out_w - 1 - ox } else { ox };
        for ch in 0..C {
            let mut acc = [0f32; BLOCK];
            for (&w, pixel) in wts.iter().zip(taps.chunks_exact(C * BLOCK)) {
                let lanes = &pixel[ch * BLOCK..][..BLOCK];
                for (a, &v) in acc.iter_mut().zip(lanes) {
                    *a += w * v;
                }
            }
            let dst = &mut pixels[(ch * out_w + dx) * BLOCK..][..BLOCK];
            for (d, &a) in dst.iter_mut().zip(&acc) {
                *d = to_byte(a);
            }
        }
    }
}

/// `pixels` `(C, out_w, BLOCK)` of output rows `y0..y0 + block` into their rows of `out`
/// `(C, out_h, out_w)`.
#[inline(always)]
fn scatter(pixels: &[u8], shape: Shape, (y0, block): (usize, usize), out: &mut [u8]) {
    let (out_h, out_w) = (shape.out_h, shape.out_w);
    for (plane, staged) in out
        .chunks_exact_mut(out_h * out_w)
        .zip(pixels.chunks_exact(out_w * BLOCK))
    {
        for r in 0..block {
            let row = &mut plane[(y0 + r) * out_w..][..out_w];
            for (d, &p) in row.iter_mut().zip(staged[r..].iter().step_by(BLOCK)) {
                *d = p;
            }
        }
    }
}

/// A resampled value as a whole 8-bit pixel: clamped to 0..=255 and rounded to the nearest
/// integer, half-way values to the even one (`f32::round_ties_even`). Computed by adding and
/// subtracting 2²³ (where the floats' spacing is 1, so the sum rounds to the integer), which
/// vectorises where `round_ties_even` is a library call.
pub fn round_pixel(v: f32) -> f32 {
    const SPACING_ONE: f32 = 8_388_608.0; // 2^23
    (v.clamp(0.0, 255.0) + SPACING_ONE) - SPACING_ONE
}

/// [`round_pixel`] as a byte (NaN gives 0), branch-free so that a loop of it vectorises.
#[inline(always)]
#[allow(clippy::manual_clamp)] // `clamp` keeps NaN, which the unchecked conversion must not see
fn to_byte(v: f32) -> u8 {
    const SPACING_ONE: f32 = 8_388_608.0; // 2^23
                                          // `max` and `min` return the number where the other operand is NaN.
    let whole = (v.max(0.0).min(255.0) + SPACING_ONE) - SPACING_ONE;
    // SAFETY: `whole` is a whole number within 0..=255, so it converts to an i32 that fits a u8.
    unsafe { whole.to_int_unchecked::<i32>() as u8 }
}

/// `image` resized to `h`×`w` as OpenCV's `INTER_LINEAR` does, rounded to bytes (Caffe's
/// `new_height`/`new_width`), planar `(C, h, w)`.
pub fn resize_bytes(image: &Image, h: usize, w: usize, scratch: &mut Resampler) -> Vec<u8> {
    let mut planar = vec![0u8; image.channels * h * w];
    resample(
        image,
        Window::whole(image.height, image.width),
        (h, w),
        false,
        false,
        &mut planar,
        scratch,
    );
    planar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(h: usize, w: usize, c: usize) -> Image {
        let mut img = Image {
            height: h,
            width: w,
            channels: c,
            pixels: vec![0; h * w * c],
        };
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c {
                    img.pixels[(y * w + x) * c + ch] = (10 * y + x + 100 * ch) as u8;
                }
            }
        }
        img
    }

    #[test]
    fn the_same_size_copies_and_a_flip_mirrors() {
        let img = ramp(3, 4, 2);
        let mut out = vec![0; 24];
        let mut s = Resampler::default();
        for antialias in [false, true] {
            resample(
                &img,
                Window::whole(3, 4),
                (3, 4),
                false,
                antialias,
                &mut out,
                &mut s,
            );
            assert_eq!(out[..4], [0, 1, 2, 3]);
            assert_eq!(out[12 + 4..12 + 8], [110, 111, 112, 113]);
            resample(
                &img,
                Window::whole(3, 4),
                (3, 4),
                true,
                antialias,
                &mut out,
                &mut s,
            );
            assert_eq!(out[..4], [3, 2, 1, 0]);
        }
    }

    #[test]
    fn a_window_crops_and_halving_averages() {
        let img = ramp(4, 4, 1);
        let mut out = vec![0; 4];
        let mut s = Resampler::default();
        let win = Window::pixels(1, 2, 2, 2);
        resample(&img, win, (2, 2), false, false, &mut out, &mut s);
        assert_eq!(out, vec![12, 13, 22, 23]);
        // 4 → 2 without antialias samples at 0.5, 2.5: the mean of two neighbours, 5.5, 7.5,
        // 25.5 and 27.5, rounded half to even.
        resample(
            &img,
            Window::whole(4, 4),
            (2, 2),
            false,
            false,
            &mut out,
            &mut s,
        );
        assert_eq!(out, vec![6, 8, 26, 28]);
        // With antialias the triangle of half-width 2 reaches three inputs, weights 3/7, 3/7,
        // 1/7: along W (0·3 + 1·3 + 2·1)/7 = 0.71, along H ten times that, 7.86 in all.
        resample(
            &img,
            Window::whole(4, 4),
            (2, 2),
            false,
            true,
            &mut out,
            &mut s,
        );
        assert_eq!(out[0], 8);
    }

    /// An `h`×`w` image of `c` channels of hashed bytes.
    fn noise(h: usize, w: usize, c: usize, key: u64) -> Image {
        let pixels = (0..h * w * c)
            .map(|k| (crate::data::order::splitmix64(key ^ k as u64) >> 56) as u8)
            .collect();
        Image {
            height: h,
            width: w,
            channels: c,
            pixels,
        }
    }

    /// The triangle filter's weights for output `o` of `m` over `[start, start + len)` of an
    /// axis of `size`, computed directly in f64: `(input, weight)`, clipped to the axis and
    /// renormalised.
    fn reference_taps(
        start: f64,
        len: f64,
        size: usize,
        m: usize,
        o: usize,
        antialias: bool,
    ) -> Vec<(usize, f64)> {
        let scale = len / m as f64;
        let support = if antialias { scale.max(1.0) } else { 1.0 };
        let centre = start + (o as f64 + 0.5) * scale;
        let taps: Vec<(usize, f64)> = (0..size)
            .map(|i| {
                let d = ((i as f64 + 0.5 - centre) / support).abs();
                (i, (1.0 - d).max(0.0))
            })
            .filter(|&(_, w)| w > 0.0)
            .collect();
        let sum: f64 = taps.iter().map(|t| t.1).sum();
        if sum == 0.0 {
            let nearest = ((centre - support).floor().max(0.0) as usize).min(size - 1);
            return vec![(nearest, 1.0)];
        }
        taps.into_iter().map(|(i, w)| (i, w / sum)).collect()
    }

    /// Every output is the exact (f64) resampled value rounded to the nearest pixel, or, within
    /// 10⁻³ of half-way between two pixels, one of those two: the f32 passes differ from exact
    /// arithmetic by far less than that. The baseline build of the passes gives the same bytes
    /// as the one `resample` picks (AVX2 where the processor has it).
    #[test]
    fn outputs_are_the_exact_values_rounded() {
        let mut s = Resampler::default();
        let mut checked = 0;
        for key in 0..120u64 {
            let r = |k: u64| (crate::data::order::splitmix64(key * 16 + k) % 10_000) as f64 / 1e4;
            let (h, w, c) = (
                5 + (r(0) * 60.0) as usize,
                5 + (r(1) * 60.0) as usize,
                1 + key as usize % 4,
            );
            let img = noise(h, w, c, key);
            let (wh, ww) = (1.0 + r(2) * (h as f64 - 1.0), 1.0 + r(3) * (w as f64 - 1.0));
            let win = Window {
                y: r(4) * (h as f64 - wh),
                x: r(5) * (w as f64 - ww),
                h: wh,
                w: ww,
            };
            let (oh, ow) = (1 + (r(6) * 30.0) as usize, 1 + (r(7) * 30.0) as usize);
            let (flip, antialias) = (key % 3 == 0, key % 5 != 0);
            let mut out = vec![0; c * oh * ow];
            let mut baseline = vec![0; c * oh * ow];
            let size = (oh, ow);
            resample(&img, win, size, flip, antialias, &mut out, &mut s);
            resample_on(
                &img,
                win,
                size,
                (flip, antialias),
                &mut baseline,
                &mut s,
                false,
            );
            assert_eq!(out, baseline, "case {key}: the AVX2 and baseline builds");
            for oy in 0..oh {
                let down = reference_taps(win.y, win.h, h, oh, oy, antialias);
                for ox in 0..ow {
                    let across = reference_taps(win.x, win.w, w, ow, ox, antialias);
                    let dx = if flip { ow - 1 - ox } else { ox };
                    for ch in 0..c {
                        let mut exact = 0.0;
                        for &(y, wy) in &down {
                            for &(x, wx) in &across {
                                exact += wy * wx * f64::from(img.at(y, x, ch));
                            }
                        }
                        let got = f64::from(out[(ch * oh + oy) * ow + dx]);
                        let ok = if (exact.fract() - 0.5).abs() < 1e-3 {
                            got == exact.floor() || got == exact.ceil()
                        } else {
                            got == exact.round()
                        };
                        assert!(ok, "case {key}, ({ch}, {oy}, {ox}): {got}, exact {exact}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 50_000, "{checked} values");
    }

    /// Every channel count resamples each channel as a one-channel image of it would be.
    #[test]
    fn channels_resample_independently() {
        let img = noise(9, 13, 4, 7);
        let win = Window {
            y: 1.5,
            x: 0.25,
            h: 6.0,
            w: 11.0,
        };
        let mut s = Resampler::default();
        for c in 2..=4 {
            let sub = Image {
                channels: c,
                pixels: img
                    .pixels
                    .chunks_exact(4)
                    .flat_map(|p| p[..c].to_vec())
                    .collect(),
                ..img.clone()
            };
            let mut all = vec![0; c * 5 * 4];
            resample(&sub, win, (5, 4), true, true, &mut all, &mut s);
            for ch in 0..c {
                let one = Image {
                    channels: 1,
                    pixels: img.pixels.iter().skip(ch).step_by(4).copied().collect(),
                    ..img.clone()
                };
                let mut plane = vec![0; 20];
                resample(&one, win, (5, 4), true, true, &mut plane, &mut s);
                assert_eq!(
                    all[ch * 20..(ch + 1) * 20],
                    plane[..],
                    "{c} channels, channel {ch}"
                );
            }
        }
    }

    #[test]
    fn resize_bytes_upsamples_linearly() {
        let img = ramp(1, 2, 1); // 0, 1
        let got = resize_bytes(&img, 1, 4, &mut Resampler::default());
        // Samples at -0.25, 0.25, 0.75, 1.25 of [0, 1], clamped: 0, 0.25, 0.75, 1 → rounded.
        assert_eq!(got, vec![0, 0, 1, 1]);
    }
}
