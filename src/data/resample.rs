//! Resampling a window of an 8-bit [`Image`] to a fixed size, into planar floats: the
//! geometric half of `random_resized_crop`, `resize_shorter` + `center_crop`, and Caffe's
//! `new_height`/`new_width` resize.
//!
//! Separable linear interpolation, pixel centres at `+0.5` (OpenCV's and PIL's mapping: output
//! pixel `o` of a window `[a, a + n)` resized to `m` samples the input at `a + (o + 0.5)·n/m −
//! 0.5`). With `antialias` (PIL's bilinear, which torchvision applies to PIL images) the triangle
//! filter widens by the reduction factor when shrinking, so every input pixel contributes; without
//! it (OpenCV's `INTER_LINEAR`, which Caffe uses) only the two nearest pixels do. Taps are clipped
//! to the image (not to the window: a window is a view of the image, as a crop of a resized
//! image is) and their weights renormalised.
//!
//! Shapes: the input image is `(H, W, C)` interleaved; outputs are `(C, out_h, out_w)` planar.

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

/// The taps of one output sample: the first input index and the weights of consecutive inputs.
#[derive(Debug, Clone, Default)]
struct Taps {
    first: Vec<usize>,
    /// `taps` weights per output sample (zero-padded).
    weights: Vec<f32>,
    /// The weights of each output up to its last non-zero one.
    count: Vec<usize>,
    taps: usize,
}

impl Taps {
    /// Taps resampling the span `[start, start + len)` of an axis of `size` pixels onto `m`
    /// outputs, clipped to the axis.
    fn new(start: f64, len: f64, size: usize, m: usize, antialias: bool) -> Self {
        let scale = len / m as f64;
        let support = if antialias { scale.max(1.0) } else { 1.0 };
        let taps = (2.0 * support).ceil() as usize + 2;
        let mut first = Vec::with_capacity(m);
        let mut weights = vec![0f32; m * taps];
        for o in 0..m {
            let centre = start + (o as f64 + 0.5) * scale;
            let lo = ((centre - support).floor().max(0.0) as usize).min(size - 1);
            let hi = ((centre + support).ceil().max(0.0) as usize).clamp(lo + 1, size);
            let row = &mut weights[o * taps..(o + 1) * taps];
            let mut sum = 0f64;
            for (k, i) in (lo..hi.min(lo + taps)).enumerate() {
                let d = ((i as f64 + 0.5 - centre) / support).abs();
                let wgt = (1.0 - d).max(0.0);
                row[k] = wgt as f32;
                sum += wgt;
            }
            if sum > 0.0 {
                row.iter_mut()
                    .for_each(|v| *v = (f64::from(*v) / sum) as f32);
            } else {
                row[0] = 1.0;
            }
            first.push(lo);
        }
        let count = weights
            .chunks_exact(taps)
            .map(|w| w.iter().rposition(|&v| v != 0.0).map_or(1, |k| k + 1))
            .collect();
        Taps {
            first,
            weights,
            count,
            taps,
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

/// Resamples `window` of `image` to `out_h`×`out_w`, mirrored along W when `flip`, into `out`
/// (`(C, out_h, out_w)` floats, pixel values 0–255 unrounded). `scratch` is reused.
pub fn resample(
    image: &Image,
    window: Window,
    (out_h, out_w): (usize, usize),
    flip: bool,
    antialias: bool,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let c = image.channels;
    assert!(c <= 4, "images of at most 4 channels");
    assert_eq!(out.len(), c * out_h * out_w, "output of (C, H, W)");
    let across = Taps::new(window.x, window.w, image.width, out_w, antialias);
    let down = Taps::new(window.y, window.h, image.height, out_h, antialias);
    let (row0, row1) = down.span();
    let rows = row1 - row0;
    // Pass 1: the rows any output reads, resampled along W (and mirrored), planar
    // `(C, rows, out_w)`.
    scratch.clear();
    scratch.resize(c * rows * out_w, 0.0);
    match c {
        1 => resample_rows::<1>(image, &across, row0, rows, flip, scratch),
        3 => resample_rows::<3>(image, &across, row0, rows, flip, scratch),
        2 => resample_rows::<2>(image, &across, row0, rows, flip, scratch),
        _ => resample_rows::<4>(image, &across, row0, rows, flip, scratch),
    }
    // Pass 2: along H, row by row of each plane.
    out.fill(0.0);
    for ch in 0..c {
        let plane_in = &scratch[ch * rows * out_w..][..rows * out_w];
        for oy in 0..out_h {
            let (first, wts) = down.of(oy);
            let dst = &mut out[(ch * out_h + oy) * out_w..][..out_w];
            for (k, &wgt) in wts.iter().enumerate() {
                let src = &plane_in[(first + k - row0) * out_w..][..out_w];
                dst.iter_mut().zip(src).for_each(|(d, &s)| *d += wgt * s);
            }
        }
    }
}

/// Pass 1 of [`resample`] for images of `C` channels: image rows `row0..row0 + rows` resampled
/// along W by `across` (mirrored when `flip`) into `out`, planar `(C, rows, out_w)`.
fn resample_rows<const C: usize>(
    image: &Image,
    across: &Taps,
    row0: usize,
    rows: usize,
    flip: bool,
    out: &mut [f32],
) {
    let out_w = across.first.len();
    let width = image.width * C;
    for r in 0..rows {
        let row = &image.pixels[(row0 + r) * width..][..width];
        for ox in 0..out_w {
            let (first, wts) = across.of(ox);
            let mut acc = [0f32; C];
            let pixels = row[first * C..(first + wts.len()) * C].chunks_exact(C);
            for (&wgt, px) in wts.iter().zip(pixels) {
                for (a, &v) in acc.iter_mut().zip(px) {
                    *a += wgt * f32::from(v);
                }
            }
            let dx = if flip { out_w - 1 - ox } else { ox };
            for (ch, &a) in acc.iter().enumerate() {
                out[(ch * rows + r) * out_w + dx] = a;
            }
        }
    }
}

/// `image` resized to `h`×`w` as OpenCV's `INTER_LINEAR` does, rounded to bytes (Caffe's
/// `new_height`/`new_width`), planar `(C, h, w)`.
pub fn resize_bytes(image: &Image, h: usize, w: usize, scratch: &mut Vec<f32>) -> Vec<u8> {
    let mut planar = vec![0f32; image.channels * h * w];
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
        .iter()
        .map(|v| v.round().clamp(0.0, 255.0) as u8)
        .collect()
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
        let mut out = vec![0.0; 24];
        let mut s = Vec::new();
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
            assert_eq!(out[..4], [0.0, 1.0, 2.0, 3.0]);
            assert_eq!(out[12 + 4..12 + 8], [110.0, 111.0, 112.0, 113.0]);
            resample(
                &img,
                Window::whole(3, 4),
                (3, 4),
                true,
                antialias,
                &mut out,
                &mut s,
            );
            assert_eq!(out[..4], [3.0, 2.0, 1.0, 0.0]);
        }
    }

    #[test]
    fn a_window_crops_and_halving_averages() {
        let img = ramp(4, 4, 1);
        let mut out = vec![0.0; 4];
        let mut s = Vec::new();
        let win = Window::pixels(1, 2, 2, 2);
        resample(&img, win, (2, 2), false, false, &mut out, &mut s);
        assert_eq!(out, vec![12.0, 13.0, 22.0, 23.0]);
        // 4 → 2 without antialias samples at 0.5, 2.5: the mean of two neighbours.
        resample(
            &img,
            Window::whole(4, 4),
            (2, 2),
            false,
            false,
            &mut out,
            &mut s,
        );
        assert_eq!(out, vec![5.5, 7.5, 25.5, 27.5]);
        // With antialias the triangle of half-width 2 reaches three inputs, weights 3/7, 3/7,
        // 1/7: along W (0·3 + 1·3 + 2·1)/7, along H ten times that.
        resample(
            &img,
            Window::whole(4, 4),
            (2, 2),
            false,
            true,
            &mut out,
            &mut s,
        );
        assert!((out[0] - 55.0 / 7.0).abs() < 1e-4, "{out:?}");
    }

    /// Every channel count resamples each channel as a one-channel image of it would be.
    #[test]
    fn channels_resample_independently() {
        let img = ramp(9, 13, 4);
        let win = Window {
            y: 1.5,
            x: 0.25,
            h: 6.0,
            w: 11.0,
        };
        let mut s = Vec::new();
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
            let mut all = vec![0.0; c * 5 * 4];
            resample(&sub, win, (5, 4), true, true, &mut all, &mut s);
            for ch in 0..c {
                let one = Image {
                    channels: 1,
                    pixels: img.pixels.iter().skip(ch).step_by(4).copied().collect(),
                    ..img.clone()
                };
                let mut plane = vec![0.0; 20];
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
        let got = resize_bytes(&img, 1, 4, &mut Vec::new());
        // Samples at -0.25, 0.25, 0.75, 1.25 of [0, 1], clamped: 0, 0.25, 0.75, 1 → rounded.
        assert_eq!(got, vec![0, 0, 1, 1]);
    }
}
