//! Decoding image files (JPEG, baseline and progressive, through zune-jpeg, jpeg-decoder or
//! libjpeg-turbo; PNG through the png crate) into 8-bit [`Image`]s in Caffe's channel order: BGR
//! for colour (OpenCV's, so `mean_value` lists are Caffe's), one channel for grey. Every failure
//! is a message saying what is wrong with the bytes; nothing here panics on any input.
//!
//! [`decode_view`] decodes only the part of a JPEG that a resampled window needs ([`View`]) where
//! the decoder can (libjpeg-turbo: [`super::libjpeg_turbo`]); the others decode
//! whole images.
//!
//! Colour conversions follow OpenCV's `imread`, which Caffe uses: a colour file read as grey is
//! converted with OpenCV's fixed-point `Y = (1868·B + 9617·G + 4899·R + 2^13) >> 14` (a JPEG's
//! own luma is taken instead, as libjpeg does for `IMREAD_GRAYSCALE`); a grey file read as colour
//! repeats its channel; alpha is dropped; 16-bit PNG samples keep their high byte.
//!
//! Images larger than [`MAX_IMAGE_PIXELS`] are refused from their header, before any pixel
//! buffer is allocated (a "PNG bomb" or an absurd declared size).

use super::libjpeg_turbo::{self, Decoded};
use super::resample::Window;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;

/// The most pixels a decoded image may have (2^27: 134 megapixels, PIL's refusal threshold in
/// magnitude).
pub const MAX_IMAGE_PIXELS: usize = 1 << 27;

/// An 8-bit image, `(H, W, C)` interleaved, C = 1 (grey) or 3 (B, G, R).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Image {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    /// `H·W·C` bytes.
    pub pixels: Vec<u8>,
}

impl Image {
    /// The pixel value at `(y, x)`, channel `c`.
    pub fn at(&self, y: usize, x: usize, c: usize) -> u8 {
        self.pixels[(y * self.width + x) * self.channels + c]
    }

    /// Refills this image from planar `(C, H, W)` bytes.
    pub fn set_planar(&mut self, [c, h, w]: [usize; 3], planar: &[u8]) {
        self.reshape(h, w, c);
        for (ch, plane) in planar.chunks_exact(h * w).enumerate() {
            for (i, &v) in plane.iter().enumerate() {
                self.pixels[i * c + ch] = v;
            }
        }
    }

    pub(super) fn reshape(&mut self, height: usize, width: usize, channels: usize) {
        self.height = height;
        self.width = width;
        self.channels = channels;
        self.pixels.resize(height * width * channels, 0);
    }
}

/// Which JPEG decoder decodes (`data.jpeg_decoder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JpegDecoder {
    /// zune-jpeg: pure Rust, SIMD colour conversion and IDCT.
    Zune,
    /// jpeg-decoder (image-rs): pure Rust.
    JpegDecoderCrate,
    /// libjpeg-turbo (C, SIMD), decoding only the part of an image a window needs.
    #[default]
    LibjpegTurbo,
}

/// What a transform needs of an image: a window of it and the size the window is resampled
/// to, `(out_h, out_w)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    pub window: Window,
    pub out: (usize, usize),
}

impl View {
    /// The whole `h`×`w` image at its own size.
    pub fn whole(h: usize, w: usize) -> Self {
        View {
            window: Window::whole(h, w),
            out: (h, w),
        }
    }
}

/// The kinds of file recognised, by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Jpeg,
    Png,
}

/// The kind of file `bytes` start like, if any.
pub fn sniff(bytes: &[u8]) -> Option<FileKind> {
    if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some(FileKind::Jpeg)
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(FileKind::Png)
    } else {
        None
    }
}

/// Decodes a JPEG or PNG file whole into `out` (its buffer reused), colour (BGR) when `color`,
/// grey otherwise.
pub fn decode(bytes: &[u8], color: bool, jpeg: JpegDecoder, out: &mut Image) -> Result<(), String> {
    decode_view(bytes, color, jpeg, &mut View::whole, out).map(drop)
}

/// Decodes a JPEG or PNG file into `out` as [`decode`] does, but only the part that
/// `view(height, width)` of the image needs when the decoder can (libjpeg-turbo's JPEGs: a
/// cropped, possibly DCT-scaled, rectangle); returns the view's window in `out`'s coordinates.
pub fn decode_view(
    bytes: &[u8],
    color: bool,
    jpeg: JpegDecoder,
    view: &mut dyn FnMut(usize, usize) -> View,
    out: &mut Image,
) -> Result<Window, String> {
    let kind = sniff(bytes);
    if kind == Some(FileKind::Jpeg) && jpeg == JpegDecoder::LibjpegTurbo {
        if let Decoded::Window(window) = libjpeg_turbo::decode(bytes, color, view, out)? {
            return Ok(window);
        }
    }
    match kind {
        Some(FileKind::Jpeg) => match jpeg {
            JpegDecoder::JpegDecoderCrate => decode_jpeg_crate(bytes, color, out),
            // libjpeg-turbo leaves CMYK, 12-bit and lossless JPEGs to zune-jpeg.
            JpegDecoder::Zune | JpegDecoder::LibjpegTurbo => decode_jpeg(bytes, color, out),
        },
        Some(FileKind::Png) => decode_png(bytes, color, out),
        None if bytes.is_empty() => Err("empty file (0 bytes)".into()),
        None => Err(format!(
            "not a JPEG or PNG file (starts with {:02x?})",
            &bytes[..bytes.len().min(8)]
        )),
    }?;
    Ok(view(out.height, out.width).window)
}

/// Checks declared dimensions against [`MAX_IMAGE_PIXELS`].
pub(super) fn check_size(width: usize, height: usize) -> Result<(), String> {
    if width == 0 || height == 0 {
        return Err(format!("declares an empty image ({width}×{height})"));
    }
    match width.checked_mul(height) {
        Some(n) if n <= MAX_IMAGE_PIXELS => Ok(()),
        _ => Err(format!(
            "declares {width}×{height} pixels, more than the {MAX_IMAGE_PIXELS} allowed"
        )),
    }
}

fn decode_jpeg(bytes: &[u8], color: bool, out: &mut Image) -> Result<(), String> {
    let space = if color {
        ColorSpace::RGB
    } else {
        ColorSpace::Luma
    };
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(space)
        .set_max_width(1 << 16)
        .set_max_height(1 << 16);
    let mut d = zune_jpeg::JpegDecoder::new_with_options(std::io::Cursor::new(bytes), options);
    d.decode_headers()
        .map_err(|e| zune_error("corrupt JPEG header", &e))?;
    let (w, h) = d.dimensions().ok_or("JPEG without dimensions")?;
    check_size(w, h)?;
    let channels = if color { 3 } else { 1 };
    let need = d.output_buffer_size().ok_or("JPEG without a size")?;
    if need != w * h * channels {
        return Err(format!(
            "JPEG decodes to {need} bytes, not {w}×{h}×{channels}"
        ));
    }
    out.reshape(h, w, channels);
    d.decode_into(&mut out.pixels)
        .map_err(|e| zune_error("corrupt or truncated JPEG data", &e))?;
    if color {
        rgb_to_bgr(&mut out.pixels);
    }
    Ok(())
}

/// `what: error`, on one line.
fn zune_error(what: &str, e: &dyn std::fmt::Debug) -> String {
    let detail = format!("{e:?}").replace('\n', " ");
    format!("{what}: {}", detail.trim())
}

fn decode_jpeg_crate(bytes: &[u8], color: bool, out: &mut Image) -> Result<(), String> {
    let mut d = jpeg_decoder::Decoder::new(bytes);
    d.read_info()
        .map_err(|e| format!("corrupt JPEG header: {e}"))?;
    let info = d.info().ok_or("JPEG without a header")?;
    check_size(info.width.into(), info.height.into())?;
    let pixels = d
        .decode()
        .map_err(|e| format!("corrupt or truncated JPEG data: {e}"))?;
    let (h, w) = (info.height as usize, info.width as usize);
    let src = match info.pixel_format {
        jpeg_decoder::PixelFormat::L8 => 1,
        jpeg_decoder::PixelFormat::RGB24 => 3,
        other => return Err(format!("JPEG pixel format {other:?} is not read")),
    };
    interleaved_to(&pixels, h, w, src, false, color, out)
}

fn decode_png(bytes: &[u8], color: bool, out: &mut Image) -> Result<(), String> {
    let limits = png::Limits {
        bytes: MAX_IMAGE_PIXELS * 8,
    };
    let mut d = png::Decoder::new_with_limits(std::io::Cursor::new(bytes), limits);
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = d
        .read_info()
        .map_err(|e| format!("corrupt PNG header: {e}"))?;
    let (w, h) = (reader.info().width as usize, reader.info().height as usize);
    check_size(w, h)?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let frame = reader
        .next_frame(&mut buf)
        .map_err(|e| format!("corrupt or truncated PNG data: {e}"))?;
    let (kind, depth) = (frame.color_type, frame.bit_depth);
    if depth != png::BitDepth::Eight {
        return Err(format!("PNG of bit depth {depth:?} after expansion"));
    }
    let (src, alpha) = match kind {
        png::ColorType::Grayscale => (1, false),
        png::ColorType::GrayscaleAlpha => (2, true),
        png::ColorType::Rgb => (3, false),
        png::ColorType::Rgba => (4, true),
        png::ColorType::Indexed => return Err("indexed PNG left unexpanded".into()),
    };
    buf.truncate(frame.buffer_size());
    interleaved_to(&buf, h, w, src, alpha, color, out)
}

/// Converts interleaved `src`-channel RGB(A) or grey(A) pixels to `out` (BGR or grey).
fn interleaved_to(
    pixels: &[u8],
    h: usize,
    w: usize,
    src: usize,
    alpha: bool,
    color: bool,
    out: &mut Image,
) -> Result<(), String> {
    if pixels.len() < h * w * src {
        return Err(format!("{} bytes for {w}×{h}×{src}", pixels.len()));
    }
    let grey_src = src - usize::from(alpha) == 1;
    out.reshape(h, w, if color { 3 } else { 1 });
    let px = pixels.chunks_exact(src).take(h * w);
    match (grey_src, color) {
        (true, true) => {
            for (o, p) in out.pixels.chunks_exact_mut(3).zip(px) {
                o.fill(p[0]);
            }
        }
        (true, false) => {
            for (o, p) in out.pixels.iter_mut().zip(px) {
                *o = p[0];
            }
        }
        (false, true) => {
            for (o, p) in out.pixels.chunks_exact_mut(3).zip(px) {
                o.copy_from_slice(&[p[2], p[1], p[0]]);
            }
        }
        (false, false) => {
            for (o, p) in out.pixels.iter_mut().zip(px) {
                *o = grey_of(p[2], p[1], p[0]);
            }
        }
    }
    Ok(())
}

/// OpenCV's BGR → grey in fixed point (`cv::cvtColor`, `COLOR_BGR2GRAY`).
pub fn grey_of(b: u8, g: u8, r: u8) -> u8 {
    ((1868 * u32::from(b) + 9617 * u32::from(g) + 4899 * u32::from(r) + (1 << 13)) >> 14) as u8
}

fn rgb_to_bgr(pixels: &mut [u8]) {
    for p in pixels.chunks_exact_mut(3) {
        p.swap(0, 2);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A PNG of `w`×`h` pixels of `kind` with the given raw samples.
    pub fn png_bytes(w: u32, h: u32, kind: png::ColorType, samples: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut e = png::Encoder::new(&mut out, w, h);
            e.set_color(kind);
            e.set_depth(png::BitDepth::Eight);
            let mut wr = e.write_header().unwrap();
            wr.write_image_data(samples).unwrap();
        }
        out
    }

    #[test]
    fn png_colour_comes_out_bgr_and_grey_as_opencv_converts_it() {
        let rgb = [10, 20, 30, 200, 100, 0];
        let bytes = png_bytes(2, 1, png::ColorType::Rgb, &rgb);
        let mut img = Image::default();
        decode(&bytes, true, JpegDecoder::Zune, &mut img).unwrap();
        assert_eq!((img.height, img.width, img.channels), (1, 2, 3));
        assert_eq!(img.pixels, vec![30, 20, 10, 0, 100, 200]);
        decode(&bytes, false, JpegDecoder::Zune, &mut img).unwrap();
        assert_eq!(img.pixels, vec![grey_of(30, 20, 10), grey_of(0, 100, 200)]);
        // (9617·100 + 4899·200 + 2^13) >> 14 = 1949692 >> 14 = 118 (0.299·200 + 0.587·100 = 118.5).
        assert_eq!(grey_of(0, 100, 200), 118);
        let grey = png_bytes(2, 1, png::ColorType::Grayscale, &[7, 9]);
        decode(&grey, true, JpegDecoder::Zune, &mut img).unwrap();
        assert_eq!(img.pixels, vec![7, 7, 7, 9, 9, 9]);
        let rgba = png_bytes(1, 1, png::ColorType::Rgba, &[1, 2, 3, 0]);
        decode(&rgba, true, JpegDecoder::Zune, &mut img).unwrap();
        assert_eq!(img.pixels, vec![3, 2, 1]);
    }

    #[test]
    fn bad_bytes_are_errors_that_say_why() {
        let mut img = Image::default();
        let e = decode(&[], true, JpegDecoder::Zune, &mut img).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = decode(b"GIF89a....", true, JpegDecoder::Zune, &mut img).unwrap_err();
        assert!(e.contains("not a JPEG or PNG"), "{e}");
        let png = png_bytes(4, 4, png::ColorType::Grayscale, &[5; 16]);
        for cut in [10, 30, png.len() - 13] {
            let e = decode(&png[..cut], false, JpegDecoder::Zune, &mut img).unwrap_err();
            assert!(e.contains("PNG"), "cut {cut}: {e}");
        }
    }

    const ALL_JPEG: [JpegDecoder; 3] = [
        JpegDecoder::Zune,
        JpegDecoder::JpegDecoderCrate,
        JpegDecoder::LibjpegTurbo,
    ];

    fn fixture(name: &str) -> Vec<u8> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jpeg/");
        std::fs::read(format!("{dir}{name}")).unwrap()
    }

    /// Baseline, progressive and grey JPEGs decode, with every decoder, to within a few levels
    /// of the reference libjpeg-turbo's pixels (IDCT and chroma upsampling round differently).
    #[test]
    fn jpegs_decode_close_to_libjpeg_turbo() {
        for (name, color) in [
            ("colour_baseline", true),
            ("colour_progressive", true),
            ("grey", false),
        ] {
            let mut want = Image::default();
            decode(
                &fixture(&format!("{name}.decoded.png")),
                color,
                JpegDecoder::Zune,
                &mut want,
            )
            .unwrap();
            for jpeg in ALL_JPEG {
                let mut got = Image::default();
                decode(&fixture(&format!("{name}.jpg")), color, jpeg, &mut got).unwrap();
                assert_eq!(
                    (got.height, got.width, got.channels),
                    (24, 40, if color { 3 } else { 1 })
                );
                let worst = got
                    .pixels
                    .iter()
                    .zip(&want.pixels)
                    .map(|(&a, &b)| a.abs_diff(b))
                    .max()
                    .unwrap();
                assert!(worst <= 4, "{name} by {jpeg:?}: off by up to {worst}");
            }
        }
    }

    /// A truncated or damaged JPEG is an error, never a panic.
    #[test]
    fn damaged_jpegs_are_errors() {
        let good = fixture("colour_baseline.jpg");
        let mut img = Image::default();
        for cut in [3, 20, 200, good.len() / 2] {
            for jpeg in ALL_JPEG {
                let r = decode(&good[..cut], true, jpeg, &mut img);
                assert!(
                    r.is_err(),
                    "{jpeg:?}: {cut} of {} bytes decoded",
                    good.len()
                );
            }
        }
        // Absurd declared dimensions in the SOF0 marker: 65000 × 65000.
        let mut huge = good.clone();
        let sof = huge.windows(2).position(|w| w == [0xff, 0xc0]).unwrap();
        huge[sof + 5..sof + 9].copy_from_slice(&[0xfd, 0xe8, 0xfd, 0xe8]);
        for jpeg in ALL_JPEG {
            let e = decode(&huge, true, jpeg, &mut img).unwrap_err();
            assert!(e.contains("65000×65000"), "{jpeg:?}: {e}");
        }
    }
}
