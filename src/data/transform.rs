//! Caffe's `transform_param` applied between a [`RecordSource`] and the net: a square crop
//! (random in training, the centre in tests), a random horizontal flip in training, the `shift`
//! translation ([`Augment`]), then `(x − mean[c]) · scale` per channel, in Caffe's order.
//!
//! Sources are opened without normalisation (raw pixel values) and the transform does it, so a
//! per-channel mean applies to every format. A shift's uncovered border takes the raw value 0
//! before normalisation, i.e. `(0 − mean[c]) · scale`, as before per-channel means existed.
//!
//! A per-pixel mean image (Caffe's `mean_file`, shape `(C, H, W)` of the input records) is
//! subtracted from the whole record first, so that each pixel loses the mean at its position in
//! the record, wherever the crop and flip take it (Caffe indexes the mean by the source pixel the
//! same way); `mean[c]` is then 0. A shift's border then holds 0 after the subtraction, the mean
//! image's own value.
//!
//! Randomness: the crop offsets and the flip of the record at training stream position `p` come
//! from a hash of (seed, p) alone, like the shift, so a sample is cropped and flipped the same way
//! whatever the number of replicas or their batch split.
//!
//! ImageNet's geometry replaces the crop for sources of images of any size
//! ([`ResizedCrop`]): in training a random window of the image (a fraction of its area in
//! `crop_area`, an aspect ratio in `crop_aspect`, torchvision's `RandomResizedCrop` draw) resized
//! to `side`×`side` with an antialiasing linear filter, flipped when `mirror` says so, all drawn
//! from (seed, stream position); in tests the shorter side resized to `shorter` and the centre
//! `side`×`side` taken (torchvision's `Resize` + `CenterCrop`). Per-channel means and the scale
//! follow; a mean image does not apply. The window is chosen from the image's size alone, before
//! it is decoded, so that a decoder that can decodes only the part the window needs
//! ([`RecordSource::read_view`]).
//!
//! A resampled value is rounded to an 8-bit pixel, clamped to 0..=255 and rounded half to even
//! ([`round_pixel`]; PIL rounds its 8-bit resize half up, which differs only at exact halves),
//! before the means and the scale, so that a resized crop holds whole pixel values as a crop of
//! raw 8-bit records does: the resampler writes those pixels ([`resample`]), and the float path
//! converts them.
//!
//! 8-bit batches: where every value before the means and the scale is a whole 8-bit pixel (raw
//! 8-bit records, or a resized crop; no shift, no mean image: [`Transform::u8_batches`]), the
//! reader can hand batches on as those pixels ([`Transform::train_u8`]) with the [`Normalize`]
//! step that the consumer applies, `(x − mean[c]) · scale` in f32 exactly as
//! [`Transform::train`] computes it, so that both give the same floats bit for bit.
//!
//! Shapes: input records are `(C, H, W)`; outputs are `(C, crop, crop)` with a crop,
//! `(C, side, side)` with a resized crop, else `(C, H, W)`.

use super::augment::Augment;
use super::decode::{Image, View};
use super::order::splitmix64;
pub use super::resample::round_pixel;
use super::resample::{resample, Resampler, Window};
use super::{Read, RecordSource};
use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

const CROP_SALT: u64 = 0x4352_4f50_4d49_5231; // "CROPMIR1"
const RESIZED_CROP_SALT: u64 = 0x5252_4352_4f50_3031; // "RRCROP01"

/// Attempts at a window of the drawn area and aspect before the central fallback
/// (torchvision's 10).
const RESIZED_CROP_ATTEMPTS: usize = 10;

/// ImageNet's training crop and the matching test view; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResizedCrop {
    /// Side of the square output.
    pub side: usize,
    /// Fraction of the image's area: `[min, max]`.
    pub area: (f64, f64),
    /// Width / height: `[min, max]`.
    pub aspect: (f64, f64),
    /// Tests: the shorter side is resized to this (≥ `side`) before the centre crop.
    pub shorter: usize,
}

impl ResizedCrop {
    /// The training window of an `h`×`w` image drawn from `rng` (torchvision's
    /// `RandomResizedCrop.get_params`).
    fn train_window(&self, h: usize, w: usize, rng: &mut ChaCha8Rng) -> Window {
        let area = (h * w) as f64;
        let (lo, hi) = (self.aspect.0.ln(), self.aspect.1.ln());
        for _ in 0..RESIZED_CROP_ATTEMPTS {
            let target = area * (self.area.0 + (self.area.1 - self.area.0) * rng.gen::<f64>());
            let ratio = (lo + (hi - lo) * rng.gen::<f64>()).exp();
            let cw = (target * ratio).sqrt().round() as usize;
            let ch = (target / ratio).sqrt().round() as usize;
            if (1..=w).contains(&cw) && (1..=h).contains(&ch) {
                let y = rng.gen_range(0..=h - ch);
                let x = rng.gen_range(0..=w - cw);
                return Window::pixels(y, x, ch, cw);
            }
        }
        let ratio = w as f64 / h as f64;
        let (ch, cw) = if ratio < self.aspect.0 {
            (((w as f64 / self.aspect.0).round() as usize).clamp(1, h), w)
        } else if ratio > self.aspect.1 {
            (h, ((h as f64 * self.aspect.1).round() as usize).clamp(1, w))
        } else {
            (h, w)
        };
        Window::pixels((h - ch) / 2, (w - cw) / 2, ch, cw)
    }

    /// The test window of an `h`×`w` image: the centre `side` square of the image resized to a
    /// shorter side of `shorter`, in the image's coordinates.
    pub fn test_window(&self, h: usize, w: usize) -> Window {
        let s = self.shorter as f64;
        // torchvision's Resize: the longer side truncated.
        let (rh, rw) = if h <= w {
            (s, (s * w as f64 / h as f64).floor())
        } else {
            ((s * h as f64 / w as f64).floor(), s)
        };
        let side = self.side as f64;
        let top = ((rh - side) / 2.0).round_ties_even();
        let left = ((rw - side) / 2.0).round_ties_even();
        let (sy, sx) = (h as f64 / rh, w as f64 / rw);
        Window {
            y: top * sy,
            x: left * sx,
            h: side * sy,
            w: side * sx,
        }
    }
}

/// Buffers a transform reuses between records.
#[derive(Debug, Default)]
pub struct Scratch {
    /// A whole record `(C, H, W)`, or the shift's copy.
    floats: Vec<f32>,
    /// A decoded image.
    image: Image,
    /// The resampler's taps and rows.
    resampler: Resampler,
    /// A resized crop's pixels `(C, H, W)` on their way to floats.
    pixels: Vec<u8>,
    /// An output record before it becomes 8-bit pixels ([`Transform::train_u8`]).
    values: Vec<f32>,
}

/// The last step of a transform, applied by the consumer of 8-bit batches:
/// `out = (x − mean[c]) · scale` in f32 for pixels `(b, C, H, W)`, c the channel of the pixel
/// (the subtraction and the product each rounded once, as [`Transform::train`] rounds them).
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    /// `(C)`.
    pub mean: Vec<f32>,
    pub scale: f32,
    /// H·W: the pixels of one channel of one record.
    pub plane: usize,
}

/// Pixels from which [`Normalize::apply`] works on all cores.
const PARALLEL_NORMALIZE_MIN: usize = 1 << 20;

impl Normalize {
    /// `out[i] = (pixels[i] − mean[c]) · scale` for `pixels` and `out` of `(b, C, H, W)`.
    ///
    /// # Panics
    /// If the lengths differ or are not whole records.
    pub fn apply(&self, pixels: &[u8], out: &mut [f32]) {
        use rayon::prelude::*;
        let channels = self.mean.len();
        assert_eq!(pixels.len(), out.len(), "normalize: pixels and floats");
        assert_eq!(
            pixels.len() % (channels * self.plane).max(1),
            0,
            "normalize: whole records of {channels}×{}",
            self.plane
        );
        let plane = |(k, (src, dst)): (usize, (&[u8], &mut [f32]))| {
            let m = self.mean[k % channels];
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = (f32::from(s) - m) * self.scale;
            }
        };
        let plane_len = self.plane.max(1);
        if pixels.len() >= PARALLEL_NORMALIZE_MIN {
            pixels
                .par_chunks(plane_len)
                .zip(out.par_chunks_mut(plane_len))
                .enumerate()
                .for_each(plane);
        } else {
            pixels
                .chunks(plane_len)
                .zip(out.chunks_mut(plane_len))
                .enumerate()
                .for_each(plane);
        }
    }
}

/// `v` truncated into `0..=255` (NaN gives 0), without the checks of a saturating cast, so that
/// a loop of it vectorises.
#[allow(clippy::manual_clamp)] // `clamp` keeps NaN, which the unchecked conversion must not see
fn to_pixel(v: f32) -> u8 {
    // `max` and `min` return the number where the other operand is NaN.
    let clamped = v.max(0.0).min(255.0);
    // SAFETY: `clamped` is finite and within 0..=255, so it truncates to an i32 that fits a u8.
    unsafe { clamped.to_int_unchecked::<i32>() as u8 }
}

/// The per-record transform of one data set.
#[derive(Debug, Clone, PartialEq)]
pub struct Transform {
    /// `(C, H, W)` of the source's records.
    input: [usize; 3],
    /// Square crop side; 0 = no crop.
    crop: usize,
    mirror: bool,
    /// One mean per channel.
    mean: Vec<f32>,
    scale: f32,
    seed: u64,
    /// Translation after crop and flip, on raw values (fill 0).
    shift: Augment,
    /// `(C·H·W)` per-pixel means of the input records, subtracted before everything else.
    mean_image: Option<Arc<[f32]>>,
    /// ImageNet's geometry in place of the crop, for records of any size.
    resized: Option<ResizedCrop>,
}

impl Transform {
    /// The identity on records of `input`.
    pub fn identity(input: [usize; 3]) -> Self {
        Transform {
            input,
            crop: 0,
            mirror: false,
            mean: vec![0.0; input[0]],
            scale: 1.0,
            seed: 0,
            shift: Augment::none(),
            mean_image: None,
            resized: None,
        }
    }

    /// A transform of records of `input` (C, H, W). `crop` (0 = none) must not exceed H or W,
    /// `mean` has one value or C, `shift` is below the output's H and W (the config validation
    /// guarantees all three).
    pub fn new(
        input: [usize; 3],
        crop: usize,
        mirror: bool,
        mean: &[f32],
        scale: f32,
        shift: usize,
        seed: u64,
    ) -> Self {
        let [c, h, w] = input;
        assert!(crop <= h.min(w), "crop {crop} of records {h}×{w}");
        let mean = match mean.len() {
            1 => vec![mean[0]; c],
            n if n == c => mean.to_vec(),
            n => panic!("{n} mean values for {c} channels"),
        };
        Transform {
            input,
            crop,
            mirror,
            mean,
            scale,
            seed,
            shift: Augment {
                shift,
                seed,
                fill: 0.0,
            },
            mean_image: None,
            resized: None,
        }
    }

    /// This transform with ImageNet's geometry ([`ResizedCrop`]) in place of the crop: records
    /// of any size in, `(C, side, side)` out. The crop must be 0 and there must be no mean image.
    pub fn with_resized_crop(mut self, resized: ResizedCrop) -> Self {
        assert!(self.crop == 0 && self.mean_image.is_none());
        self.resized = Some(resized);
        self
    }

    /// The resized crop, when there is one.
    pub fn resized_crop(&self) -> Option<ResizedCrop> {
        self.resized
    }

    /// This transform with the per-pixel means `image` `(C·H·W` of the input shape`)` subtracted
    /// first, in place of per-channel means (which must be 0).
    pub fn with_mean_image(mut self, image: Vec<f32>) -> Self {
        assert_eq!(
            image.len(),
            self.input.iter().product::<usize>(),
            "a mean image of the input shape {:?}",
            self.input
        );
        assert!(
            self.mean.iter().all(|&m| m == 0.0),
            "per-channel and per-pixel means together"
        );
        self.mean_image = Some(image.into());
        self
    }

    /// `(C, H, W)` of the records the source provides.
    pub fn input_shape(&self) -> [usize; 3] {
        self.input
    }

    /// `(C, H, W)` of the records the net receives.
    pub fn output_shape(&self) -> [usize; 3] {
        let [c, h, w] = self.input;
        if let Some(r) = self.resized {
            [c, r.side, r.side]
        } else if self.crop > 0 {
            [c, self.crop, self.crop]
        } else {
            [c, h, w]
        }
    }

    /// Floats per output record.
    pub fn output_size(&self) -> usize {
        self.output_shape().iter().product()
    }

    /// The crop's top-left corner `(y, x)` and whether to flip, for the training record at
    /// stream position `position`.
    pub fn train_window(&self, position: u64) -> (usize, usize, bool) {
        let [_, h, w] = self.input;
        let [_, oh, ow] = self.output_shape();
        let r = splitmix64(splitmix64(self.seed ^ CROP_SALT) ^ position);
        let y = (r % (h - oh + 1) as u64) as usize;
        let x = ((r >> 32) % (w - ow + 1) as u64) as usize;
        let flip = self.mirror && splitmix64(r) & 1 == 1;
        (y, x, flip)
    }

    /// The centre crop's top-left corner `(y, x)` (Caffe's `(H − crop) / 2`).
    pub fn test_window(&self) -> (usize, usize) {
        let [_, h, w] = self.input;
        let [_, oh, ow] = self.output_shape();
        ((h - oh) / 2, (w - ow) / 2)
    }

    /// The resized crop's window of an `h`×`w` image and whether to flip, for the training
    /// record at stream position `position`.
    pub fn resized_window(&self, position: u64, h: usize, w: usize) -> Option<(Window, bool)> {
        let r = self.resized?;
        let key = splitmix64(splitmix64(self.seed ^ RESIZED_CROP_SALT) ^ position);
        let mut rng = ChaCha8Rng::seed_from_u64(key);
        let flip = rng.gen::<bool>() && self.mirror;
        Some((r.train_window(h, w, &mut rng), flip))
    }

    /// Writes training record `index` of `source`, seen at stream position `position`, into
    /// `out` (the output size). Returns what the source read (the label; records skipped).
    pub fn train(
        &self,
        source: &dyn RecordSource,
        index: usize,
        position: u64,
        out: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<Read> {
        let read = self.train_values(source, index, position, out, scratch)?;
        self.normalize(out);
        Ok(read)
    }

    /// Whether the batches of `source` can travel as 8-bit pixels: every value before the means
    /// and the scale is a whole pixel 0..=255 (a resized crop's rounded ones, or a source's raw
    /// bytes cropped and flipped), with no shift and no mean image. Decided once per data set.
    pub fn u8_batches(&self, source: &dyn RecordSource) -> bool {
        self.shift.shift == 0
            && self.mean_image.is_none()
            && (self.resized.is_some() || source.values_are_u8())
    }

    /// The step that turns this transform's 8-bit output into the net's input.
    pub fn normalization(&self) -> Normalize {
        let [_, oh, ow] = self.output_shape();
        Normalize {
            mean: self.mean.clone(),
            scale: self.scale,
            plane: oh * ow,
        }
    }

    /// [`Transform::train`] without its last step ([`Transform::normalization`]): the record as
    /// 8-bit pixels, for a data set whose [`Transform::u8_batches`] holds. A resized crop is
    /// resampled straight into them (the bytes [`Transform::train`]'s floats hold); otherwise a
    /// value that is not a whole pixel (a `float_data` record among bytes) is an error naming
    /// the record.
    pub fn train_u8(
        &self,
        source: &dyn RecordSource,
        index: usize,
        position: u64,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<Read> {
        if self.resized.is_some() && self.shift.shift == 0 {
            // Resampled values are whole pixels by construction.
            return self.resized_crop_u8(source, index, position, out, scratch);
        }
        let mut values = std::mem::take(&mut scratch.values);
        values.resize(out.len(), 0.0);
        let read = self.train_values(source, index, position, &mut values, scratch);
        // One branch-free pass (it vectorises); the offending value is looked for only when
        // there is one.
        let mut whole = true;
        for (o, &v) in out.iter_mut().zip(&values) {
            let pixel = to_pixel(v);
            whole &= f32::from(pixel) == v;
            *o = pixel;
        }
        let inexact = match whole {
            true => None,
            false => values
                .iter()
                .find(|&&v| f32::from(to_pixel(v)) != v)
                .copied(),
        };
        scratch.values = values;
        let read = read?;
        inexact.map_or(Ok(()), Err).map_err(|v| {
            Error::data(
                source.name(),
                format!(
                    "record {index} holds the value {v}, not an 8-bit pixel, while the data \
                     set's first record holds pixels"
                ),
            )
        })?;
        Ok(read)
    }

    /// [`Transform::train`]'s record before the means and the scale.
    fn train_values(
        &self,
        source: &dyn RecordSource,
        index: usize,
        position: u64,
        out: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<Read> {
        let read = if self.resized.is_some() {
            let (read, win, flip) = self.read_train_view(source, index, position, scratch)?;
            self.resample(win, flip, out, scratch);
            read
        } else {
            let (y, x, flip) = self.train_window(position);
            self.window(source, index, (y, x, flip), out, &mut scratch.floats)?
        };
        self.shift
            .apply(position, self.output_shape(), out, &mut scratch.floats);
        Ok(read)
    }

    /// Writes test record `index` of `source` into `out` (the output size): centre crop (or the
    /// resized crop's test view), no flip, no shift.
    pub fn test(
        &self,
        source: &dyn RecordSource,
        index: usize,
        out: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<Read> {
        let read = if let Some(r) = self.resized {
            let out_size = self.output_side();
            let (read, win) = source.read_view(
                index,
                &mut |h, w| View {
                    window: r.test_window(h, w),
                    out: out_size,
                },
                &mut scratch.image,
            )?;
            self.resample(win, false, out, scratch);
            read
        } else {
            let (y, x) = self.test_window();
            self.window(source, index, (y, x, false), out, &mut scratch.floats)?
        };
        self.normalize(out);
        Ok(read)
    }

    /// `(H, W)` of the output records.
    fn output_side(&self) -> (usize, usize) {
        let [_, oh, ow] = self.output_shape();
        (oh, ow)
    }

    /// `window` of the scratch image resampled to the output side, as whole pixels
    /// ([`resample`]), into `out` `(C, H, W)` floats.
    fn resample(&self, window: Window, flip: bool, out: &mut [f32], scratch: &mut Scratch) {
        let mut pixels = std::mem::take(&mut scratch.pixels);
        pixels.resize(out.len(), 0);
        self.resample_u8(window, flip, &mut pixels, scratch);
        for (o, &p) in out.iter_mut().zip(&pixels) {
            *o = f32::from(p);
        }
        scratch.pixels = pixels;
    }

    /// `window` of the scratch image resampled to the output side into `out` `(C, H, W)`.
    fn resample_u8(&self, window: Window, flip: bool, out: &mut [u8], scratch: &mut Scratch) {
        let [_, oh, ow] = self.output_shape();
        let Scratch {
            image, resampler, ..
        } = scratch;
        resample(image, window, (oh, ow), flip, true, out, resampler);
    }

    /// The training record of a resized crop straight into 8-bit pixels `(C, side, side)`.
    fn resized_crop_u8(
        &self,
        source: &dyn RecordSource,
        index: usize,
        position: u64,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<Read> {
        let (read, win, flip) = self.read_train_view(source, index, position, scratch)?;
        self.resample_u8(win, flip, out, scratch);
        Ok(read)
    }

    /// Reads the part of training record `index` its resized crop at stream position
    /// `position` needs into the scratch image: what the source read, the window in the
    /// image's coordinates, and whether to flip.
    fn read_train_view(
        &self,
        source: &dyn RecordSource,
        index: usize,
        position: u64,
        scratch: &mut Scratch,
    ) -> Result<(Read, Window, bool)> {
        let out_size = self.output_side();
        let mut flip = false;
        let (read, win) = source.read_view(
            index,
            &mut |h, w| {
                let (window, f) = self.resized_window(position, h, w).expect("a resized crop");
                flip = f;
                View {
                    window,
                    out: out_size,
                }
            },
            &mut scratch.image,
        )?;
        Ok((read, win, flip))
    }

    /// Copies the `output_shape` window at `(y, x)` of the raw record, flipped along W if asked.
    fn window(
        &self,
        source: &dyn RecordSource,
        index: usize,
        (y0, x0, flip): (usize, usize, bool),
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<Read> {
        let [_, h, w] = self.input;
        let [_, oh, ow] = self.output_shape();
        if oh == h && ow == w && !flip {
            let read = source.try_fill(index, out)?;
            self.subtract_mean_image(out);
            return Ok(read);
        }
        scratch.resize(self.input.iter().product(), 0.0);
        let read = source.try_fill(index, scratch)?;
        self.subtract_mean_image(scratch);
        for (src, dst) in scratch
            .chunks_exact(h * w)
            .zip(out.chunks_exact_mut(oh * ow))
        {
            for (y, row) in dst.chunks_exact_mut(ow).enumerate() {
                let start = (y0 + y) * w + x0;
                let from = &src[start..start + ow];
                if flip {
                    row.iter_mut()
                        .zip(from.iter().rev())
                        .for_each(|(d, s)| *d = *s);
                } else {
                    row.copy_from_slice(from);
                }
            }
        }
        Ok(read)
    }

    /// `record (C·H·W) −= mean image`, when there is one.
    fn subtract_mean_image(&self, record: &mut [f32]) {
        if let Some(image) = &self.mean_image {
            record
                .iter_mut()
                .zip(image.iter())
                .for_each(|(v, m)| *v -= m);
        }
    }

    /// `x ← (x − mean[c]) · scale`, skipped when it is the identity.
    fn normalize(&self, out: &mut [f32]) {
        if self.scale == 1.0 && self.mean.iter().all(|&m| m == 0.0) {
            return;
        }
        let [_, oh, ow] = self.output_shape();
        for (plane, &m) in out.chunks_exact_mut(oh * ow).zip(&self.mean) {
            plane.iter_mut().for_each(|v| *v = (*v - m) * self.scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::order::micro_batch_positions;
    use crate::data::test_util::FnSource;

    /// 50 records of 2×4×5 whose pixel (c, y, x) of record i is [`pixel`]`(i, c, y, x)`,
    /// labelled `i % 2`.
    fn ramp() -> impl RecordSource {
        let fill = |i, out: &mut [f32]| {
            let mut k = 0;
            for c in 0..2 {
                for y in 0..4 {
                    for x in 0..5 {
                        out[k] = pixel(i, c, y, x);
                        k += 1;
                    }
                }
            }
        };
        FnSource::new(50, [2, 4, 5], fill).labelled(|i| (i % 2) as u32)
    }

    fn pixel(i: usize, c: usize, y: usize, x: usize) -> f32 {
        (1000 * i + 100 * c + 10 * y + x) as f32
    }

    #[test]
    fn centre_crop_at_test() {
        let t = Transform::new([2, 4, 5], 3, true, &[0.0], 1.0, 0, 7);
        assert_eq!(t.output_shape(), [2, 3, 3]);
        assert_eq!(t.test_window(), (0, 1));
        let mut out = vec![0.0; 18];
        t.test(&ramp(), 3, &mut out, &mut Scratch::default())
            .unwrap();
        let mut want = Vec::new();
        for c in 0..2 {
            for y in 0..3 {
                for x in 1..4 {
                    want.push(pixel(3, c, y, x));
                }
            }
        }
        assert_eq!(out, want);
    }

    #[test]
    fn random_crop_and_flip_take_the_window_the_hash_names() {
        let t = Transform::new([2, 4, 5], 2, true, &[0.0], 1.0, 0, 3);
        let mut seen = std::collections::HashSet::new();
        let mut scratch = Scratch::default();
        for p in 0..400u64 {
            let (y0, x0, flip) = t.train_window(p);
            assert!(y0 <= 2 && x0 <= 3);
            seen.insert((y0, x0, flip));
            let mut out = vec![0.0; 8];
            t.train(&ramp(), 5, p, &mut out, &mut scratch).unwrap();
            let mut want = Vec::new();
            for c in 0..2 {
                for y in 0..2 {
                    for x in 0..2 {
                        let sx = if flip { x0 + 1 - x } else { x0 + x };
                        want.push(pixel(5, c, y0 + y, sx));
                    }
                }
            }
            assert_eq!(out, want, "position {p}: window ({y0}, {x0}), flip {flip}");
        }
        // Every corner (3 rows × 4 columns) with and without a flip occurs.
        assert_eq!(seen.len(), 24);
    }

    #[test]
    fn a_mean_image_is_subtracted_at_each_pixels_source_position() {
        // The mean of pixel (c, y, x) is ramp()'s record 0, so every output of record i is
        // 1000·i · scale, whatever the crop, flip or test window; a mean taken at the output
        // position instead would leave a ramp.
        let mut image = vec![0.0; 40];
        ramp().fill(0, &mut image);
        let scale = 0.5;
        for (crop, mirror) in [(0, false), (0, true), (3, true)] {
            let t = Transform::new([2, 4, 5], crop, mirror, &[0.0], scale, 0, 9)
                .with_mean_image(image.clone());
            let n = t.output_size();
            let mut scratch = Scratch::default();
            for p in 0..40u64 {
                let mut out = vec![f32::NAN; n];
                t.train(&ramp(), 7, p, &mut out, &mut scratch).unwrap();
                assert!(
                    out.iter().all(|&v| v == 7000.0 * scale),
                    "crop {crop}, mirror {mirror}, position {p}: {out:?}"
                );
            }
            let mut out = vec![f32::NAN; n];
            t.test(&ramp(), 3, &mut out, &mut scratch).unwrap();
            assert!(out.iter().all(|&v| v == 3000.0 * scale), "test: {out:?}");
        }
    }

    #[test]
    fn mirror_without_crop_reverses_rows() {
        let t = Transform::new([2, 4, 5], 0, true, &[0.0], 1.0, 0, 1);
        let p = (0..100u64).find(|&p| t.train_window(p).2).expect("a flip");
        let mut out = vec![0.0; 40];
        t.train(&ramp(), 0, p, &mut out, &mut Scratch::default())
            .unwrap();
        assert_eq!(&out[..5], &[4.0, 3.0, 2.0, 1.0, 0.0]);
        assert_eq!(&out[20..25], &[104.0, 103.0, 102.0, 101.0, 100.0]);
        let q = (0..100u64)
            .find(|&p| !t.train_window(p).2)
            .expect("no flip");
        t.train(&ramp(), 0, q, &mut out, &mut Scratch::default())
            .unwrap();
        assert_eq!(&out[..5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn per_channel_mean_then_scale() {
        let t = Transform::new([2, 4, 5], 0, false, &[1.0, 100.0], 0.5, 0, 1);
        let mut out = vec![0.0; 40];
        t.test(&ramp(), 0, &mut out, &mut Scratch::default())
            .unwrap();
        assert_eq!(out[3], (3.0 - 1.0) * 0.5);
        assert_eq!(out[20 + 3], (103.0 - 100.0) * 0.5);
        let one = Transform::new([2, 4, 5], 0, false, &[2.0], 0.5, 0, 1);
        one.test(&ramp(), 0, &mut out, &mut Scratch::default())
            .unwrap();
        assert_eq!((out[0], out[20]), (-1.0, 49.0));
    }

    #[test]
    fn shift_border_is_a_normalised_zero_per_channel() {
        let t = Transform::new([2, 4, 5], 0, false, &[10.0, 20.0], 2.0, 1, 5);
        let p = (0..1000u64)
            .find(|&p| t.shift.offsets(p) == (1, 0))
            .expect("offset (1, 0)");
        let mut out = vec![0.0; 40];
        t.train(&ramp(), 0, p, &mut out, &mut Scratch::default())
            .unwrap();
        assert!(out[..5].iter().all(|&v| v == -20.0), "{:?}", &out[..5]);
        assert!(out[20..25].iter().all(|&v| v == -40.0));
        assert_eq!(out[5], (0.0 - 10.0) * 2.0); // row 1 holds row 0
        assert_eq!(out[25], (100.0 - 20.0) * 2.0);
    }

    /// A sample gets the same crop and flip whatever the replica split: the window depends on
    /// its stream position only, and R replicas of batch b cover the positions one replica of
    /// batch R·b covers.
    #[test]
    fn windows_depend_on_the_global_position_only() {
        let t = Transform::new([2, 4, 5], 2, true, &[0.0], 1.0, 0, 11);
        for m in 0..5u64 {
            let one: Vec<_> = micro_batch_positions(m, 12, 0, 1)
                .map(|p| t.train_window(p))
                .collect();
            for replicas in [2usize, 3, 4] {
                let split: Vec<_> = (0..replicas)
                    .flat_map(|r| micro_batch_positions(m, 12 / replicas, r, replicas))
                    .map(|p| t.train_window(p))
                    .collect();
                assert_eq!(split, one, "micro-batch {m}, {replicas} replicas");
            }
        }
        let other = Transform::new([2, 4, 5], 2, true, &[0.0], 1.0, 0, 12);
        assert!((0..50).any(|p| t.train_window(p) != other.train_window(p)));
    }

    /// 50 records of 2×4×5 bytes, declared 8-bit.
    fn byte_records() -> impl RecordSource {
        let fill = |i: usize, out: &mut [f32]| {
            for (k, v) in out.iter_mut().enumerate() {
                *v = ((i * 31 + k * 7) % 256) as f32;
            }
        };
        FnSource::new(50, [2, 4, 5], fill).of_u8()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The consumer's normalisation of 8-bit records gives the floats `train` gives, bit for
    /// bit, whatever the crop, flip, means and scale.
    #[test]
    fn u8_records_normalised_by_the_consumer_are_the_float_records() {
        let source = byte_records();
        let cases: [(usize, bool, &[f32], f32); 4] = [
            (0, false, &[0.0], 1.0),
            (3, true, &[10.5, 200.25], 0.017),
            (0, true, &[104.0], 1.0 / 255.0),
            (2, true, &[123.675, 116.28], 0.0171247),
        ];
        for (crop, mirror, mean, scale) in cases {
            let t = Transform::new([2, 4, 5], crop, mirror, mean, scale, 0, 3);
            assert!(t.u8_batches(&source));
            let normalize = t.normalization();
            let n = t.output_size();
            let mut scratch = Scratch::default();
            for p in 0..40u64 {
                let (mut want, mut pixels, mut got) = (vec![0.0; n], vec![0u8; n], vec![0.0; n]);
                t.train(&source, 7, p, &mut want, &mut scratch).unwrap();
                t.train_u8(&source, 7, p, &mut pixels, &mut scratch)
                    .unwrap();
                normalize.apply(&pixels, &mut got);
                assert_eq!(bits(&got), bits(&want), "crop {crop}, position {p}");
            }
        }
    }

    #[test]
    fn batches_are_u8_only_where_every_value_is_a_pixel() {
        let bytes = byte_records();
        let plain = Transform::new([2, 4, 5], 0, true, &[1.5], 0.5, 0, 1);
        assert!(plain.u8_batches(&bytes));
        assert!(!plain.u8_batches(&ramp()), "a source of floats");
        let shifted = Transform::new([2, 4, 5], 0, true, &[1.5], 0.5, 1, 1);
        assert!(!shifted.u8_batches(&bytes), "a shift");
        let mean_image =
            Transform::new([2, 4, 5], 0, false, &[0.0], 1.0, 0, 1).with_mean_image(vec![0.5; 40]);
        assert!(!mean_image.u8_batches(&bytes), "a mean image");
        // A value that is not a pixel after all is an error naming its record.
        let liar =
            FnSource::new(3, [1, 1, 2], |i, out: &mut [f32]| out.fill(i as f32 + 0.5)).of_u8();
        let t = Transform::identity([1, 1, 2]);
        let e = t
            .train_u8(&liar, 2, 0, &mut [0; 2], &mut Scratch::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("record 2") && e.contains("2.5"), "{e}");
    }

    #[test]
    fn resampled_values_round_half_to_even_pixels() {
        let cases = [
            (0.5, 0.0),
            (1.49, 1.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (254.6, 255.0),
            (-0.3, 0.0),
            (255.4, 255.0),
            (1e9, 255.0),
        ];
        for (v, want) in cases {
            assert_eq!(round_pixel(v), want, "{v}");
        }
        for k in -2000..=300_000 {
            let v = k as f32 / 1024.0;
            assert_eq!(round_pixel(v), v.clamp(0.0, 255.0).round_ties_even(), "{v}");
        }
    }

    /// Images of any size (3×13×17 here), read through `read_image`.
    struct Pictures;

    impl RecordSource for Pictures {
        fn len(&self) -> usize {
            4
        }
        fn record_shape(&self) -> [usize; 3] {
            [3, 13, 17]
        }
        fn classes(&self) -> usize {
            2
        }
        fn fill(&self, _: usize, _: &mut [f32]) {
            unreachable!("read through read_image")
        }
        fn label(&self, _: usize) -> u32 {
            1
        }
        fn read_image(&self, index: usize, image: &mut Image) -> Result<Read> {
            let planar: Vec<u8> = (0..3 * 13 * 17)
                .map(|k| ((k * 37 + index * 11) % 256) as u8)
                .collect();
            image.set_planar([3, 13, 17], &planar);
            Ok(Read {
                label: 1,
                skipped: 0,
            })
        }
    }

    /// A resized crop holds whole pixel values, and its 8-bit records normalised by the consumer
    /// are its float records.
    #[test]
    fn a_resized_crop_travels_as_pixels() {
        let crop = ResizedCrop {
            side: 6,
            area: (0.3, 1.0),
            aspect: (0.75, 1.333),
            shorter: 7,
        };
        let identity =
            Transform::new([3, 13, 17], 0, true, &[0.0], 1.0, 0, 5).with_resized_crop(crop);
        let scaled = Transform::new([3, 13, 17], 0, true, &[100.0, 50.5, 3.0], 0.017, 0, 5)
            .with_resized_crop(crop);
        let n = identity.output_size();
        let mut scratch = Scratch::default();
        for p in 0..20u64 {
            let mut raw = vec![f32::NAN; n];
            identity
                .train(&Pictures, (p % 4) as usize, p, &mut raw, &mut scratch)
                .unwrap();
            assert!(
                raw.iter()
                    .all(|&v| v == v.round() && (0.0..=255.0).contains(&v)),
                "{raw:?}"
            );
            assert!(scaled.u8_batches(&Pictures));
            let (mut want, mut pixels, mut got) = (vec![0.0; n], vec![0u8; n], vec![0.0; n]);
            scaled
                .train(&Pictures, (p % 4) as usize, p, &mut want, &mut scratch)
                .unwrap();
            scaled
                .train_u8(&Pictures, (p % 4) as usize, p, &mut pixels, &mut scratch)
                .unwrap();
            scaled.normalization().apply(&pixels, &mut got);
            assert_eq!(bits(&got), bits(&want), "position {p}");
            let as_floats: Vec<f32> = pixels.iter().map(|&v| f32::from(v)).collect();
            assert_eq!(as_floats, raw, "position {p}");
        }
    }

    #[test]
    fn normalize_applies_each_channels_mean_on_both_sides_of_the_parallel_threshold() {
        for (records, plane) in [(3, 5), (1 + PARALLEL_NORMALIZE_MIN / 10, 5)] {
            let normalize = Normalize {
                mean: vec![1.0, 2.5],
                scale: 0.3,
                plane,
            };
            let pixels: Vec<u8> = (0..records * 2 * plane).map(|k| (k % 251) as u8).collect();
            let mut out = vec![f32::NAN; pixels.len()];
            normalize.apply(&pixels, &mut out);
            for (k, (&x, &y)) in pixels.iter().zip(&out).enumerate() {
                let mean = normalize.mean[(k / plane) % 2];
                assert_eq!(
                    y.to_bits(),
                    ((f32::from(x) - mean) * 0.3).to_bits(),
                    "pixel {k}"
                );
            }
        }
    }

    #[test]
    fn identity_leaves_records_alone() {
        let t = Transform::identity([2, 4, 5]);
        let (mut a, mut b) = (vec![0.0; 40], vec![0.0; 40]);
        t.train(&ramp(), 2, 9, &mut a, &mut Scratch::default())
            .unwrap();
        ramp().fill(2, &mut b);
        assert_eq!(a, b);
    }
}
