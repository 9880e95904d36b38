//! JPEG decoding through libjpeg-turbo's TurboJPEG 3 API (the `turbojpeg-sys` crate, which
//! builds the vendored library with its SIMD code): whole images, or only the part of an image
//! that a resampled window reads ([`View`]).
//!
//! A partial decode takes, of the image scaled by a DCT factor `1/d` (d = 8, 4 or 2 where the
//! window is at least d times its output on both sides, else 1), the rectangle the resampler's
//! taps reach (the window widened by the antialiasing filter's support plus one pixel), widened
//! left and right by one iMCU for the chroma upsampling's context (libjpeg-turbo replicates a
//! cropped row's edge, so the columns next to it differ from a whole decode), its left edge
//! aligned down to the scaled iMCU width: rows above it are skipped and decoding stops after its
//! last row. Without DCT scaling the pixels the resampler reads are those of a whole decode, bit
//! for bit.
//!
//! One decompressor per thread (thread-local), reused from image to image. Errors are messages
//! like the other decoders' (`corrupt JPEG header: …`, `corrupt or truncated JPEG data: …`);
//! the caller names the record. Images above [`MAX_IMAGE_PIXELS`](super::decode::MAX_IMAGE_PIXELS)
//! are refused from their header. libjpeg's warnings (a corrupt stretch of entropy-coded data,
//! extraneous bytes before a marker) leave a decoded image, as PIL and OpenCV read it; a file
//! cut short is an error however little of it a window needs: its scans must end in an
//! end-of-image marker. CMYK, 12-bit and lossless JPEGs are left to another decoder
//! ([`Decoded::Unsupported`]).

use super::decode::{check_size, Image, View};
use super::resample::Window;
use std::cell::RefCell;
use std::ffi::CStr;
use turbojpeg_sys as tj;

/// The most scans a progressive JPEG may have (libjpeg-turbo's advice against files made to
/// take unbounded time).
const MAX_SCANS: i32 = 500;

/// What [`decode`] made of a file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decoded {
    /// The image (or its part) is in the output; the view's window in its coordinates.
    Window(Window),
    /// A JPEG libjpeg-turbo does not decode to BGR or grey here (CMYK or YCCK, 12-bit,
    /// lossless): nothing was written.
    Unsupported,
}

/// Decodes the part of JPEG `bytes` that `view(height, width)` needs into `out`, BGR when
/// `color`, grey otherwise.
pub fn decode(
    bytes: &[u8],
    color: bool,
    view: &mut dyn FnMut(usize, usize) -> View,
    out: &mut Image,
) -> Result<Decoded, String> {
    with_decompressor(|d| {
        let header = d.header(bytes)?;
        let Some(sos) = first_scan(bytes) else {
            return Err("corrupt JPEG header: the file ends before its first scan".into());
        };
        if !header.supported {
            return Ok(Decoded::Unsupported);
        }
        check_size(header.width, header.height)?;
        if !bytes[sos..].windows(2).rev().any(|w| w == [0xff, 0xd9]) {
            return Err("corrupt or truncated JPEG data: the file ends before its \
                        end-of-image marker"
                .into());
        }
        let plan = Plan::new(&header, view(header.height, header.width));
        d.decompress(bytes, &plan, color, out)?;
        Ok(Decoded::Window(plan.window))
    })
}

/// What a JPEG's header says.
#[derive(Debug, Clone, Copy)]
struct Header {
    height: usize,
    width: usize,
    /// The iMCU's width in pixels, when the subsampling is a known one (a cropping region
    /// starts at a multiple of it).
    imcu_width: Option<usize>,
    /// 8-bit, lossy, grey, RGB or YCbCr.
    supported: bool,
}

/// The part of the image one decode produces.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Plan {
    /// DCT scaling by `1/denom`: 1, 2, 4 or 8.
    denom: usize,
    /// The rectangle of the scaled image decoded: rows `y..y + h`, columns `x..x + w`.
    y: usize,
    x: usize,
    h: usize,
    w: usize,
    /// Whether the rectangle is the whole scaled image.
    whole: bool,
    /// The view's window in the rectangle's coordinates.
    window: Window,
}

impl Plan {
    /// The plan for `view` of the image `header` describes.
    fn new(header: &Header, view: View) -> Self {
        let (oh, ow) = view.out;
        let win = view.window;
        let denom = match header.imcu_width {
            Some(_) => [8, 4, 2]
                .into_iter()
                .find(|&d| win.h >= (d * oh) as f64 && win.w >= (d * ow) as f64)
                .unwrap_or(1),
            None => 1,
        };
        let (sh, sw) = (header.height.div_ceil(denom), header.width.div_ceil(denom));
        let s = 1.0 / denom as f64;
        let scaled = Window {
            y: win.y * s,
            x: win.x * s,
            h: win.h * s,
            w: win.w * s,
        };
        let Some(mw) = header.imcu_width.map(|m| m.div_ceil(denom)) else {
            return Plan::whole(sh, sw, denom, scaled);
        };
        // libjpeg reads the rows the chroma upsampling needs above and below by itself.
        let (y0, y1) = reach(scaled.y, scaled.h, oh, sh, 0);
        let (x0, x1) = reach(scaled.x, scaled.w, ow, sw, mw);
        let x0 = x0 / mw * mw;
        Plan {
            denom,
            y: y0,
            x: x0,
            h: y1 - y0,
            w: x1 - x0,
            whole: (y0, x0, y1, x1) == (0, 0, sh, sw),
            window: Window {
                y: scaled.y - y0 as f64,
                x: scaled.x - x0 as f64,
                ..scaled
            },
        }
    }

    /// The whole `h`×`w` scaled image.
    fn whole(h: usize, w: usize, denom: usize, window: Window) -> Self {
        Plan {
            denom,
            y: 0,
            x: 0,
            h,
            w,
            whole: true,
            window,
        }
    }
}

/// The pixels `lo..hi` of an axis of `size` pixels that resampling `start..start + len` to
/// `out` samples reads — the antialiasing filter's support (the reduction factor, at least 1)
/// plus one pixel on each side — widened by `context` pixels on each side, within the axis.
fn reach(start: f64, len: f64, out: usize, size: usize, context: usize) -> (usize, usize) {
    let margin = (len / out as f64).max(1.0).ceil() + 1.0 + context as f64;
    let lo = ((start - margin).floor().max(0.0) as usize).min(size - 1);
    let hi = ((start + len + margin).ceil().max(0.0) as usize).clamp(lo + 1, size);
    (lo, hi)
}

/// The offset of the first start-of-scan marker, walking the header's segments by their
/// lengths (so that an embedded thumbnail's markers are stepped over). The end-of-image marker
/// must follow it: a file cut short has none (JPEG's byte stuffing keeps the marker's bytes out
/// of entropy-coded data).
fn first_scan(bytes: &[u8]) -> Option<usize> {
    let mut i = 2;
    while i + 4 <= bytes.len() {
        if bytes[i] != 0xff || bytes[i + 1] == 0xff || bytes[i + 1] == 0 {
            i += 1; // fill bytes or stray data between segments
            continue;
        }
        match bytes[i + 1] {
            0xda => return Some(i),
            0x01 | 0xd0..=0xd8 => i += 2,
            _ => i += 2 + usize::from(u16::from_be_bytes([bytes[i + 2], bytes[i + 3]])),
        }
    }
    None
}

/// A TurboJPEG decompressor handle.
struct Decompressor(tj::tjhandle);

thread_local! {
    /// This thread's decompressor, made on first use.
    static DECOMPRESSOR: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

/// Calls `f` with this thread's decompressor.
fn with_decompressor<R>(
    f: impl FnOnce(&mut Decompressor) -> Result<R, String>,
) -> Result<R, String> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Decompressor::new()?);
        }
        f(slot.as_mut().expect("made above"))
    })
}

impl Decompressor {
    fn new() -> Result<Self, String> {
        // SAFETY: tj3Init has no preconditions; a null handle is checked.
        let handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if handle.is_null() {
            // SAFETY: a null handle asks for the global error string.
            let why = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(handle)) };
            return Err(format!(
                "libjpeg-turbo cannot start a decompressor: {}",
                why.to_string_lossy()
            ));
        }
        let d = Decompressor(handle);
        d.set(tj::TJPARAM_TJPARAM_SCANLIMIT, MAX_SCANS)?;
        d.set(tj::TJPARAM_TJPARAM_STOPONWARNING, 0)?;
        Ok(d)
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<(), String> {
        // SAFETY: the handle is live.
        match unsafe { tj::tj3Set(self.0, param as i32, value) } {
            0 => Ok(()),
            _ => Err(format!("libjpeg-turbo: {}", self.error())),
        }
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: the handle is live.
        unsafe { tj::tj3Get(self.0, param as i32) }
    }

    /// The last error or warning, on one line.
    fn error(&self) -> String {
        // SAFETY: the handle is live; the string is copied before the next call.
        let s = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.0)) };
        s.to_string_lossy().replace('\n', " ").trim().to_string()
    }

    /// Whether the last call that returned -1 only warned (it finished its work).
    fn only_warned(&self) -> bool {
        // SAFETY: the handle is live.
        unsafe { tj::tj3GetErrorCode(self.0) == tj::TJERR_TJERR_WARNING as i32 }
    }

    /// `Err(what: error)` unless `status` is success or only a warning.
    fn check(&self, status: i32, what: &str) -> Result<(), String> {
        if status == 0 || self.only_warned() {
            Ok(())
        } else {
            Err(format!("{what}: {}", self.error()))
        }
    }

    fn header(&mut self, bytes: &[u8]) -> Result<Header, String> {
        // SAFETY: the handle is live and `bytes` outlives the call.
        let status =
            unsafe { tj::tj3DecompressHeader(self.0, bytes.as_ptr(), bytes.len() as tj::size_t) };
        self.check(status, "corrupt JPEG header")?;
        let (width, height) = (
            self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH),
            self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT),
        );
        if width < 1 || height < 1 {
            return Err(format!("corrupt JPEG header: {width}×{height} pixels"));
        }
        let subsampling = self.get(tj::TJPARAM_TJPARAM_SUBSAMP);
        let colorspace = self.get(tj::TJPARAM_TJPARAM_COLORSPACE) as tj::TJCS;
        Ok(Header {
            height: height as usize,
            width: width as usize,
            imcu_width: imcu_width(subsampling),
            supported: self.get(tj::TJPARAM_TJPARAM_PRECISION) == 8
                && self.get(tj::TJPARAM_TJPARAM_LOSSLESS) == 0
                && matches!(
                    colorspace,
                    tj::TJCS_TJCS_GRAY | tj::TJCS_TJCS_RGB | tj::TJCS_TJCS_YCbCr
                ),
        })
    }

    /// Decodes `plan`'s part of the image whose header was read last into `out`.
    fn decompress(
        &mut self,
        bytes: &[u8],
        plan: &Plan,
        color: bool,
        out: &mut Image,
    ) -> Result<(), String> {
        let factor = tj::tjscalingfactor {
            num: 1,
            denom: plan.denom as i32,
        };
        // SAFETY: the handle is live.
        let status = unsafe { tj::tj3SetScalingFactor(self.0, factor) };
        self.check(status, "libjpeg-turbo cannot scale the JPEG")?;
        let region = if plan.whole {
            tj::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            tj::tjregion {
                x: plan.x as i32,
                y: plan.y as i32,
                w: plan.w as i32,
                h: plan.h as i32,
            }
        };
        // SAFETY: the handle is live and has read the header.
        let status = unsafe { tj::tj3SetCroppingRegion(self.0, region) };
        self.check(status, "libjpeg-turbo cannot crop the JPEG")?;
        let (channels, format) = if color {
            (3, tj::TJPF_TJPF_BGR)
        } else {
            (1, tj::TJPF_TJPF_GRAY)
        };
        out.reshape(plan.h, plan.w, channels);
        let pitch = i32::try_from(plan.w * channels).map_err(|_| "JPEG row too long")?;
        // SAFETY: `out.pixels` holds `plan.h` rows of `pitch` bytes, the decoded rectangle.
        let status = unsafe {
            tj::tj3Decompress8(
                self.0,
                bytes.as_ptr(),
                bytes.len() as tj::size_t,
                out.pixels.as_mut_ptr(),
                pitch,
                format,
            )
        };
        self.check(status, "corrupt or truncated JPEG data")
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

/// The iMCU width of TurboJPEG's subsampling `code` (`TJSAMP`: 4:4:4, 4:2:2, 4:2:0, grey,
/// 4:4:0, 4:1:1, 4:4:1), if it is a known one: `turbojpeg.h`'s `tjMCUWidth`, which the library
/// does not export.
fn imcu_width(code: i32) -> Option<usize> {
    const WIDTHS: [usize; 7] = [8, 16, 16, 8, 8, 32, 8];
    WIDTHS.get(usize::try_from(code).ok()?).copied()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::data::decode::{decode_view, JpegDecoder};
    use crate::data::order::splitmix64;
    use crate::data::resample::{resample, Resampler};

    /// A `w`×`h` RGB field: smooth ramps plus hashed noise, so that every block has detail.
    fn field(w: usize, h: usize) -> Vec<u8> {
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            for x in 0..w {
                let noise = splitmix64((y * w + x) as u64);
                for c in 0..3 {
                    let ramp = (x * (c + 1) + 2 * y) % 200;
                    px.push((ramp as u64 + (noise >> (8 * c)) % 56) as u8);
                }
            }
        }
        px
    }

    /// [`field`] encoded by libjpeg-turbo with `subsampling` (`TJSAMP`; grey is one channel),
    /// quality 90, progressive or baseline.
    pub(crate) fn encode(
        w: usize,
        h: usize,
        subsampling: tj::TJSAMP,
        progressive: bool,
    ) -> Vec<u8> {
        let pixels = field(w, h);
        // SAFETY: a compressor handle, used and destroyed here; the output buffer is
        // allocated by the library, copied, then freed with tj3Free.
        unsafe {
            let c = tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as i32);
            assert!(!c.is_null());
            tj::tj3Set(c, tj::TJPARAM_TJPARAM_QUALITY as i32, 90);
            tj::tj3Set(c, tj::TJPARAM_TJPARAM_SUBSAMP as i32, subsampling);
            tj::tj3Set(
                c,
                tj::TJPARAM_TJPARAM_PROGRESSIVE as i32,
                i32::from(progressive),
            );
            let (mut buf, mut len) = (std::ptr::null_mut(), 0);
            let status = tj::tj3Compress8(
                c,
                pixels.as_ptr(),
                w as i32,
                0,
                h as i32,
                tj::TJPF_TJPF_RGB,
                &mut buf,
                &mut len,
            );
            assert_eq!(status, 0);
            let bytes = std::slice::from_raw_parts(buf, len as usize).to_vec();
            tj::tj3Free(buf.cast());
            tj::tj3Destroy(c);
            bytes
        }
    }

    fn fixture(name: &str) -> Vec<u8> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jpeg/");
        std::fs::read(format!("{dir}{name}")).unwrap()
    }

    /// The project's JPEG fixtures and generated ones: baseline and progressive, 4:2:0, 4:2:2,
    /// 4:4:4, 4:4:0 and grey, of sizes that are not multiples of the iMCU.
    pub(crate) fn jpegs() -> Vec<(String, Vec<u8>)> {
        let mut all: Vec<(String, Vec<u8>)> = ["colour_baseline", "colour_progressive", "grey"]
            .iter()
            .map(|n| (n.to_string(), fixture(&format!("{n}.jpg"))))
            .collect();
        let made = [
            ("4:2:0", tj::TJSAMP_TJSAMP_420, 203, 157),
            ("4:2:2", tj::TJSAMP_TJSAMP_422, 131, 77),
            ("4:4:4", tj::TJSAMP_TJSAMP_444, 150, 97),
            ("4:4:0", tj::TJSAMP_TJSAMP_440, 99, 121),
            ("grey", tj::TJSAMP_TJSAMP_GRAY, 120, 90),
        ];
        for (name, sampling, w, h) in made {
            for progressive in [false, true] {
                let kind = if progressive {
                    "progressive"
                } else {
                    "baseline"
                };
                all.push((
                    format!("{name} {kind} {w}×{h}"),
                    encode(w, h, sampling, progressive),
                ));
            }
        }
        all
    }

    /// [`decode_view`] through libjpeg-turbo, the view the same whatever the image's size.
    fn turbo(
        bytes: &[u8],
        color: bool,
        view: &mut dyn FnMut(usize, usize) -> View,
        img: &mut Image,
    ) -> Result<Window, String> {
        decode_view(bytes, color, JpegDecoder::LibjpegTurbo, view, img)
    }

    fn whole(bytes: &[u8], color: bool) -> Image {
        let mut img = Image::default();
        turbo(bytes, color, &mut View::whole, &mut img).unwrap();
        img
    }

    /// A window of an `h`×`w` image drawn from `key`, and an output of at least 0.6 of its
    /// size (so below half: no DCT scaling).
    fn unscaled_view(key: u64, h: usize, w: usize) -> View {
        let r = |k: u64| (splitmix64(key * 8 + k) % 10_000) as f64 / 10_000.0;
        let (wh, ww) = (1.0 + r(0) * (h as f64 - 1.0), 1.0 + r(1) * (w as f64 - 1.0));
        let window = Window {
            y: r(2) * (h as f64 - wh),
            x: r(3) * (w as f64 - ww),
            h: wh,
            w: ww,
        };
        let out = |len: f64| ((len * (0.6 + 0.4 * r(4))).ceil() as usize).max(1);
        View {
            window,
            out: (out(wh), out(ww)),
        }
    }

    /// Without DCT scaling the pixels a partial decode gives the resampler (the window widened
    /// by the filter's reach) are those of the whole decode, bit for bit, and the window
    /// returned is the view's, moved by the rectangle's corner.
    #[test]
    fn a_cropped_decode_reads_as_the_whole_decode() {
        let mut partial = 0;
        for (name, bytes) in jpegs() {
            for color in [true, false] {
                let full = whole(&bytes, color);
                let mut smaller = 0;
                for key in 0..60 {
                    let view = unscaled_view(key, full.height, full.width);
                    let mut part = Image::default();
                    let got = turbo(&bytes, color, &mut |_, _| view, &mut part).unwrap();
                    let (oy, ox) = (view.window.y - got.y, view.window.x - got.x);
                    assert!(oy.fract() == 0.0 && ox.fract() == 0.0, "{name}: {got:?}");
                    assert_eq!((got.h, got.w), (view.window.h, view.window.w));
                    let (oy, ox) = (oy as usize, ox as usize);
                    smaller += usize::from(part.height * part.width < full.height * full.width);
                    let win = view.window;
                    let (y0, y1) = reach(win.y, win.h, view.out.0, full.height, 0);
                    let (x0, x1) = reach(win.x, win.w, view.out.1, full.width, 0);
                    assert!(
                        oy <= y0 && y1 <= oy + part.height,
                        "{name}: rows {y0}..{y1}"
                    );
                    assert!(
                        ox <= x0 && x1 <= ox + part.width,
                        "{name}: columns {x0}..{x1}"
                    );
                    let c = part.channels;
                    for y in y0..y1 {
                        let row = &part.pixels[((y - oy) * part.width + x0 - ox) * c..];
                        let want = &full.pixels[(y * full.width + x0) * c..];
                        assert!(
                            row[..(x1 - x0) * c] == want[..(x1 - x0) * c],
                            "{name}, colour {color}, {view:?}: row {y} differs"
                        );
                    }
                }
                partial += smaller;
            }
        }
        // Most windows of the generated images are well inside them.
        assert!(partial > 600, "only {partial} of 1560 decodes were partial");
    }

    /// The rectangle holds every pixel the resampler reads: the window widened by the filter's
    /// support plus one on each side, or the image's edge.
    #[test]
    fn the_rectangle_covers_what_the_resampler_reads() {
        let header = Header {
            height: 375,
            width: 500,
            imcu_width: Some(16),
            supported: true,
        };
        for key in 0..500 {
            let view = unscaled_view(key, 375, 500);
            let plan = Plan::new(&header, view);
            assert_eq!(plan.denom, 1);
            assert_eq!(plan.x % 16, 0);
            let (sy, sx) = (
                view.window.h / view.out.0 as f64,
                view.window.w / view.out.1 as f64,
            );
            let w = plan.window;
            assert!(plan.y == 0 || w.y - sy.max(1.0) - 1.0 >= 0.0, "{plan:?}");
            assert!(plan.x == 0 || w.x - sx.max(1.0) - 1.0 >= 0.0, "{plan:?}");
            assert!(plan.y + plan.h == 375 || w.y + w.h + sy.max(1.0) + 1.0 <= plan.h as f64);
            assert!(plan.x + plan.w == 500 || w.x + w.w + sx.max(1.0) + 1.0 <= plan.w as f64);
        }
    }

    /// A window 2×, 4× or 8× its output on both sides is decoded DCT-scaled by that factor,
    /// its window scaled alike, and resamples to the same picture.
    #[test]
    fn large_windows_are_decoded_dct_scaled() {
        let bytes = encode(203, 157, tj::TJSAMP_TJSAMP_420, false);
        let full = whole(&bytes, true);
        for (out, denom) in [((78, 101), 2), ((39, 50), 4), ((19, 25), 8), ((80, 50), 1)] {
            let view = View {
                window: Window::whole(157, 203),
                out,
            };
            let mut part = Image::default();
            let win = turbo(&bytes, true, &mut |_, _| view, &mut part).unwrap();
            let s = 1.0 / denom as f64;
            assert_eq!(
                (part.height, part.width),
                (157usize.div_ceil(denom), 203usize.div_ceil(denom))
            );
            assert_eq!((win.h, win.w), (157.0 * s, 203.0 * s));
            let n = 3 * out.0 * out.1;
            let (mut a, mut b) = (vec![0; n], vec![0; n]);
            let mut scratch = Resampler::default();
            resample(&full, view.window, out, false, true, &mut a, &mut scratch);
            resample(&part, win, out, false, true, &mut b, &mut scratch);
            let mean_diff = |a: &[u8], b: &[u8]| {
                let sum: u32 = a
                    .iter()
                    .zip(b)
                    .map(|(&x, &y)| u32::from(x.abs_diff(y)))
                    .sum();
                sum as f32 / n as f32
            };
            let mean = mean_diff(&a, &b);
            // The same picture: much closer than the whole decode's window moved by one output
            // pixel is to itself (a window misplaced by the scaling would not be).
            let moved = Window {
                x: view.window.w / out.1 as f64,
                ..view.window
            };
            resample(&full, moved, out, false, true, &mut b, &mut scratch);
            let off = mean_diff(&a, &b);
            assert!(
                mean < off / 2.0,
                "1/{denom}: off by {mean} on average, one pixel's move {off}"
            );
        }
    }

    /// A file cut anywhere is an error, a header cut short named as such, also when the window
    /// needs only rows above the cut.
    #[test]
    fn cut_files_are_errors_whatever_the_window() {
        for (name, bytes) in jpegs() {
            let sos = first_scan(&bytes).expect("a scan");
            let top_left = View {
                window: Window::pixels(0, 0, 4, 4),
                out: (4, 4),
            };
            for cut in [
                sos / 2,
                sos + 10,
                bytes.len() / 2,
                bytes.len() - 40,
                bytes.len() - 2,
            ] {
                let mut img = Image::default();
                for view in [None, Some(top_left)] {
                    let e = turbo(
                        &bytes[..cut],
                        true,
                        &mut |h, w| view.unwrap_or(View::whole(h, w)),
                        &mut img,
                    )
                    .unwrap_err();
                    let want = if cut < sos {
                        "corrupt JPEG header: "
                    } else {
                        "corrupt or truncated JPEG data: "
                    };
                    assert!(e.starts_with(want), "{name} cut at {cut}: {e}");
                }
            }
        }
    }

    /// The end-of-image check steps over an embedded thumbnail's markers and accepts data after
    /// the marker.
    #[test]
    fn the_end_marker_is_looked_for_after_the_first_scan() {
        let jpeg = encode(40, 24, tj::TJSAMP_TJSAMP_420, false);
        let mut img = Image::default();
        let mut padded = jpeg.clone();
        padded.extend_from_slice(&[0; 100]);
        turbo(&padded, true, &mut View::whole, &mut img).unwrap();
        // An APP1 segment holding a whole JPEG (a thumbnail), then the image cut short.
        let thumb = encode(8, 8, tj::TJSAMP_TJSAMP_444, false);
        let mut with_thumb = jpeg[..2].to_vec();
        with_thumb.extend_from_slice(&[0xff, 0xe1]);
        with_thumb.extend_from_slice(&((thumb.len() + 2) as u16).to_be_bytes());
        with_thumb.extend_from_slice(&thumb);
        with_thumb.extend_from_slice(&jpeg[2..]);
        turbo(&with_thumb, true, &mut View::whole, &mut img).unwrap();
        assert_eq!((img.height, img.width), (24, 40));
        let cut = &with_thumb[..with_thumb.len() - 2];
        let e = turbo(cut, true, &mut View::whole, &mut img).unwrap_err();
        assert!(e.contains("end-of-image marker"), "{e}");
    }
}
