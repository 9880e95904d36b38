//! Whole-input entry points for the parsers of untrusted bytes, shared by the fuzz targets
//! (`fuzz/`) and the mutation tests (`tests/parser_mutations.rs`): a config file (load, `--set`
//! free, validate, plan), an IDX image or label file (raw or gzip), a CIFAR-10 batch file, a
//! Caffe mean image (`mean.binaryproto`), a Caffe net or solver prototxt, a `.caffemodel`, and a
//! NumPy `.npy` array (`predict`'s inputs), an image file (JPEG or PNG) and an LMDB record (a
//! Caffe `Datum`).
//! Each returns the parser's verdict; none may panic, whatever the bytes.

use crate::config::Plan;
use crate::data::decode::{self, Image, JpegDecoder};
use crate::data::images::{self, DecodeOptions};
use crate::data::{cifar10, idx, mean_file, Cifar10Source, IdxSource, RecordSource};
use crate::error::{Error, Result};
use crate::validate;
use std::path::Path;

/// Records read back from a parsed source, at most (bounds the work per input).
const READ_BACK: usize = 64;

/// A config file's bytes through `validate::load_bytes` (syntax, types, unknown keys, whole-config
/// validation; relative data paths resolve under a directory that does not exist) and
/// [`Plan::new`] for 4 processes, then the plan's summary.
pub fn config(bytes: &[u8]) -> Result<()> {
    let (cfg, source) = validate::load_bytes(
        "fuzz.toml",
        bytes,
        Path::new("/nonexistent/p2ptrain-inputs"),
        &[],
    )?;
    let plan = Plan::new(cfg, source, 4)?;
    let _ = plan.describe(&[]);
    Ok(())
}

/// IDX bytes as an image file, as a label file, and as a raw image file followed by its label
/// file (split where the image header says the images end), reading the records back. Ok when
/// the bytes are an image or a label file.
pub fn idx(bytes: &[u8]) -> Result<()> {
    let images = idx::parse_images("images.idx", bytes);
    let labels = idx::parse_labels("labels.idx", bytes);
    let dim = |i: usize| {
        bytes
            .get(4 + 4 * i..8 + 4 * i)
            .map_or(0, |d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
    };
    let split = dim(0)
        .saturating_mul(dim(1))
        .saturating_mul(dim(2))
        .saturating_add(16)
        .min(bytes.len());
    let (a, b) = bytes.split_at(split);
    if let Ok(s) = IdxSource::from_bytes("images.idx", a, "labels.idx", b, 10, 0.0, 1.0) {
        read_back(&s);
    }
    match (images, labels) {
        (Err(e), Err(_)) => Err(e),
        _ => Ok(()),
    }
}

/// CIFAR-10 bytes as one batch file of 10 classes (and of 3: other label bounds), reading the
/// records back.
pub fn cifar10(bytes: &[u8]) -> Result<()> {
    let _ = cifar10::check("batch.bin", bytes, 3);
    let s = Cifar10Source::from_bytes(vec![("batch.bin".to_string(), bytes.to_vec())], 10)?;
    read_back(&s);
    Ok(())
}

/// A mean image file's bytes (`data.mean_file`), its shape checked against its values.
pub fn mean_file(bytes: &[u8]) -> Result<()> {
    let image = mean_file::parse(Path::new("mean.binaryproto"), bytes)?;
    assert_eq!(image.data.len(), image.shape.iter().product::<usize>());
    Ok(())
}

/// A Caffe net prototxt's bytes: the text format, then the net read into config tables.
pub fn caffe_net(bytes: &[u8]) -> Result<()> {
    let path = Path::new("net.prototxt");
    let m = prototxt(path, bytes)?;
    crate::caffe::net::read(path, &m, Path::new("/nonexistent/p2ptrain-inputs"))?;
    Ok(())
}

/// A Caffe solver prototxt's bytes: the text format, then the `[solver]` table.
pub fn caffe_solver(bytes: &[u8]) -> Result<()> {
    let path = Path::new("solver.prototxt");
    let m = prototxt(path, bytes)?;
    crate::caffe::solver::read(path, &m)?;
    Ok(())
}

/// The prototxt text format of `bytes`, read as the file `path`.
fn prototxt(path: &Path, bytes: &[u8]) -> Result<crate::caffe::prototxt::Message> {
    crate::caffe::prototxt::parse(&String::from_utf8_lossy(bytes))
        .map_err(|e| crate::caffe::text_error(path, e.pos, "(syntax)", e.msg))
}

/// A `.caffemodel`'s bytes, every blob's dimensions and values read.
pub fn caffemodel(bytes: &[u8]) -> Result<()> {
    let model = crate::caffe::weights::parse_caffemodel(Path::new("m.caffemodel"), bytes)?;
    for blob in model.layer.iter().flat_map(|l| &l.blobs) {
        let _ = (blob.dims(), blob.values().len());
    }
    Ok(())
}

/// A `.npy` array's bytes as `predict` reads them, reading the records back.
pub fn npy(bytes: &[u8]) -> Result<()> {
    let source = crate::predict::inputs::parse_npy("x.npy", bytes)?;
    read_back(source.as_ref());
    Ok(())
}

/// Reads up to [`READ_BACK`] records and labels of `s`, spread over the set.
fn read_back(s: &dyn RecordSource) {
    let n = s.len();
    if n == 0 {
        return;
    }
    let mut out = vec![0.0; s.record_shape().iter().product()];
    let step = n.div_ceil(READ_BACK).max(1);
    for i in (0..n).step_by(step).chain([n - 1]) {
        s.fill(i, &mut out);
        assert!(
            (s.label(i) as usize) < s.classes(),
            "label of record {i} not below {}",
            s.classes()
        );
    }
}

/// An image file's bytes (JPEG or PNG) decoded as colour and as grey by each JPEG decoder, and
/// by libjpeg-turbo a part of it as well (a window inside the image); the first error, if any.
pub fn image(bytes: &[u8]) -> Result<()> {
    let mut img = Image::default();
    let mut first = None;
    let jpegs = [
        JpegDecoder::Zune,
        JpegDecoder::JpegDecoderCrate,
        JpegDecoder::LibjpegTurbo,
    ];
    for jpeg in jpegs {
        for color in [true, false] {
            match decode::decode(bytes, color, jpeg, &mut img) {
                Ok(()) => assert_eq!(img.pixels.len(), img.height * img.width * img.channels),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
    }
    // The middle half of the image, resampled to a quarter of its size.
    let mut middle = |h: usize, w: usize| decode::View {
        window: crate::data::resample::Window::pixels(h / 4, w / 4, h.div_ceil(2), w.div_ceil(2)),
        out: (h.div_ceil(4), w.div_ceil(4)),
    };
    match decode::decode_view(
        bytes,
        true,
        JpegDecoder::LibjpegTurbo,
        &mut middle,
        &mut img,
    ) {
        Ok(win) => {
            assert_eq!(img.pixels.len(), img.height * img.width * img.channels);
            assert!(win.y >= 0.0 && win.x >= 0.0);
            assert!(win.y + win.h <= img.height as f64 && win.x + win.w <= img.width as f64);
        }
        Err(e) => {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), |e| Err(Error::data("image", e)))
}

/// An LMDB value's bytes as a Caffe `Datum`: its sizes checked against its data, an encoded
/// image decoded (grey and colour).
pub fn datum(bytes: &[u8]) -> Result<()> {
    for color in [false, true] {
        let options = DecodeOptions {
            color,
            ..DecodeOptions::default()
        };
        images::datum_shape(bytes, options).map_err(|e| Error::data("datum", e))?;
    }
    Ok(())
}
