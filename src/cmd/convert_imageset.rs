//! `p2ptrain convert-imageset`: a Caffe list file of images (`relative/path label` per line)
//! written into a new LMDB of `Datum`s that Caffe's Data layer reads, as Caffe's
//! `convert_imageset` writes it: keys `%08d_<path>` in list order (after `--shuffle`), raw pixels
//! `(C, H, W)` in BGR or grey with `encoded: false`, or with `--encoded` the image file itself
//! (`encoded: true`), commits every 1000 records. One process, no MPI.
//!
//! Differences from Caffe's tool: `--shuffle` draws its order from `--seed` (Caffe's from its own
//! generator, so the orders differ); with `--encoded`, a resize or an `--encode-type` other than
//! the file's re-encodes to PNG only (Caffe also writes JPEG through OpenCV), and those PNG bytes
//! are this tool's; an unreadable image stops the conversion naming it (Caffe logs it and goes
//! on), and nothing is left behind.

use crate::data::datum::Datum;
use crate::data::decode::{self, Image, JpegDecoder};
use crate::data::{image_files, lmdb, order, resample};
use crate::error::{Error, Result};
use prost::Message;
use std::path::{Path, PathBuf};

/// What `p2ptrain convert-imageset` was asked.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// The folder the list's paths are relative to.
    pub root: PathBuf,
    /// The list file.
    pub list: PathBuf,
    /// The LMDB folder to create.
    pub output: PathBuf,
    /// Grey images (one channel) instead of colour (B, G, R).
    pub gray: bool,
    /// Shuffle the lines (seeded by `seed`) before writing.
    pub shuffle: bool,
    pub seed: u64,
    /// Store the image files (or PNGs) instead of raw pixels.
    pub encoded: bool,
    /// With `encoded`: the file type to store, `png` or the file's own (empty: the file's own).
    pub encode_type: String,
    /// Resize every image to `height`×`width` (0 = keep).
    pub resize_height: usize,
    pub resize_width: usize,
}

/// Converts and returns the exit code (2 for a bad list or image, 1 when the LMDB cannot be
/// written).
pub fn run(opts: &ConvertOptions) -> i32 {
    match convert(opts) {
        Ok(n) => {
            println!(
                "{n} records written to {} ({})",
                opts.output.display(),
                if opts.encoded { "encoded" } else { "raw" }
            );
            0
        }
        Err(e) => {
            eprintln!("p2ptrain: error: {e}");
            e.exit_code()
        }
    }
}

/// Writes the LMDB; returns the number of records.
pub fn convert(opts: &ConvertOptions) -> Result<usize> {
    if (opts.resize_height > 0) != (opts.resize_width > 0) {
        return Err(Error::Usage(
            "give --resize-height and --resize-width together".into(),
        ));
    }
    let type_ok = ["", "png", "jpg", "jpeg"].contains(&opts.encode_type.as_str());
    if !type_ok {
        return Err(Error::Usage(format!(
            "--encode-type {}: png, jpg or jpeg",
            opts.encode_type
        )));
    }
    let list =
        image_files::read_list(&opts.list, &opts.root).map_err(|e| Error::data(&opts.list, e))?;
    let mut lines: Vec<(PathBuf, i64)> = list.files.into_iter().zip(list.labels).collect();
    if opts.shuffle {
        let perm = order::permutation(lines.len(), opts.seed, 0);
        lines = perm.iter().map(|&i| lines[i].clone()).collect();
    }
    // Every record is made before the LMDB is created: a bad image leaves nothing behind.
    let mut records = Vec::with_capacity(lines.len());
    let mut image = Image::default();
    let mut scratch = resample::Resampler::default();
    for (i, (file, label)) in lines.iter().enumerate() {
        let value = datum_of(opts, file, *label, &mut image, &mut scratch)
            .map_err(|e| Error::data(file, e))?;
        let rel = file.strip_prefix(&opts.root).unwrap_or(file);
        records.push((format!("{i:08}_{}", rel.display()), value));
    }
    let n = lmdb::write(&opts.output, records.into_iter()).map_err(|e| {
        Error::io(
            format!("writing {}", opts.output.display()),
            std::io::Error::other(e),
        )
    })?;
    Ok(n)
}

/// The serialized `Datum` of one image.
fn datum_of(
    opts: &ConvertOptions,
    file: &Path,
    label: i64,
    image: &mut Image,
    scratch: &mut resample::Resampler,
) -> std::result::Result<Vec<u8>, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read: {e}"))?;
    decode::decode(&bytes, !opts.gray, JpegDecoder::Zune, image)?;
    let label = i32::try_from(label).map_err(|_| format!("label {label} does not fit an int32"))?;
    let resize = opts.resize_height > 0;
    let planar = if resize {
        resample::resize_bytes(image, opts.resize_height, opts.resize_width, scratch)
    } else {
        planar_bytes(image)
    };
    let (h, w) = if resize {
        (opts.resize_height, opts.resize_width)
    } else {
        (image.height, image.width)
    };
    let datum = if opts.encoded {
        let own = file
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        let wanted = if opts.encode_type.is_empty() {
            own.clone()
        } else {
            opts.encode_type.clone()
        };
        let same_type = wanted == own || (wanted.starts_with("jp") && own.starts_with("jp"));
        let data = if same_type && !resize {
            bytes
        } else if wanted == "png" {
            png_of(&planar, [image.channels, h, w])?
        } else {
            return Err(format!(
                "re-encoding to {wanted} is not supported: store the files as they are \
                 (no resize, --encode-type of the file) or as png"
            ));
        };
        Datum {
            data: Some(data),
            label: Some(label),
            encoded: Some(true),
            ..Datum::default()
        }
    } else {
        Datum {
            channels: Some(image.channels as i32),
            height: Some(h as i32),
            width: Some(w as i32),
            data: Some(planar),
            label: Some(label),
            float_data: Vec::new(),
            encoded: Some(false),
        }
    };
    Ok(datum.encode_to_vec())
}

/// `(C, H, W)` bytes of an interleaved image.
fn planar_bytes(image: &Image) -> Vec<u8> {
    let (c, plane) = (image.channels, image.height * image.width);
    let mut out = vec![0; c * plane];
    for (i, px) in image.pixels.chunks_exact(c).enumerate() {
        for (ch, &v) in px.iter().enumerate() {
            out[ch * plane + i] = v;
        }
    }
    out
}

/// A PNG of planar `(C, H, W)` BGR or grey bytes.
fn png_of(planar: &[u8], [c, h, w]: [usize; 3]) -> std::result::Result<Vec<u8>, String> {
    let plane = h * w;
    let mut samples = vec![0; c * plane];
    for i in 0..plane {
        for ch in 0..c {
            // B, G, R planes → R, G, B samples.
            let from = if c == 3 { 2 - ch } else { ch };
            samples[i * c + ch] = planar[from * plane + i];
        }
    }
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
    e.set_color(if c == 3 {
        png::ColorType::Rgb
    } else {
        png::ColorType::Grayscale
    });
    e.set_depth(png::BitDepth::Eight);
    let mut writer = e
        .write_header()
        .map_err(|e| format!("encoding a PNG: {e}"))?;
    writer
        .write_image_data(&samples)
        .map_err(|e| format!("encoding a PNG: {e}"))?;
    drop(writer);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resized_png_record_decodes_to_the_raw_record() {
        let img = Image {
            height: 2,
            width: 3,
            channels: 3,
            pixels: (0..18).collect(),
        };
        let planar = planar_bytes(&img);
        assert_eq!(planar[..6], [0, 3, 6, 9, 12, 15]);
        let png = png_of(&planar, [3, 2, 3]).unwrap();
        let mut back = Image::default();
        decode::decode(&png, true, JpegDecoder::Zune, &mut back).unwrap();
        assert_eq!(back, img);
    }
}
