//! MNIST's IDX format: image files (magic 0x00000803, unsigned bytes, N×H×W) and label files
//! (magic 0x00000801, unsigned bytes, N), gzip-compressed (recognised by the bytes 1f 8b) or raw,
//! read from a path or from bytes, and [`IdxSource`], the record source over an image file and
//! its label file. Every error names the file and says what was expected.
//!
//! Header layout (big-endian): two zero bytes, a data-type byte (0x08 = unsigned byte), a byte
//! with the number of dimensions, then one u32 per dimension; the data follows.

use super::{read_file, RecordSource};
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::io::{Read, Seek};
use std::path::Path;

/// Magic number of an IDX image file: unsigned bytes, three dimensions.
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX label file: unsigned bytes, one dimension.
pub const LABELS_MAGIC: u32 = 0x0000_0801;

/// The IDX data-type byte for unsigned bytes, the only type read.
const TYPE_U8: u8 = 0x08;

/// The images of an IDX image file.
#[derive(Debug, Clone)]
pub struct IdxImages {
    pub count: usize,
    pub height: usize,
    pub width: usize,
    /// `count·height·width` bytes, image after image, row-major.
    pub pixels: Vec<u8>,
}

/// Decompresses `bytes` if they start with the gzip magic 1f 8b; returns them unchanged otherwise.
/// The stream's IDX header (with `magic`) is read first, then at most the data it declares and
/// one byte more: a stream that holds more (a gzip bomb) is refused without being inflated
/// further. A header that is short, of another magic or of dimensions whose product overflows is
/// returned as read, for [`parse`] to report.
pub fn decompress<'a>(name: &str, bytes: &'a [u8], magic: u32) -> Result<Cow<'a, [u8]>> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(Cow::Borrowed(bytes));
    }
    let corrupt =
        |e: std::io::Error| Error::data(name, format!("corrupt or truncated gzip data: {e}"));
    let mut stream = flate2::read::MultiGzDecoder::new(bytes);
    let header = 4 + 4 * u64::from(magic & 0xff);
    let mut out = Vec::new();
    (&mut stream)
        .take(header)
        .read_to_end(&mut out)
        .map_err(corrupt)?;
    let Some(declared) = declared_bytes(&out, magic) else {
        return Ok(Cow::Owned(out));
    };
    (&mut stream)
        .take(declared.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(corrupt)?;
    if out.len() as u64 > header + declared {
        return Err(Error::data(
            name,
            format!(
                "gzip data decompress to more than the {} bytes its IDX header declares \
                 ({declared} bytes of data after the {header}-byte header): refused",
                header + declared
            ),
        ));
    }
    Ok(Cow::Owned(out))
}

/// The data bytes a complete IDX `header` of `magic` declares (the product of its dimensions);
/// `None` for a short header, another magic, or a product that overflows.
fn declared_bytes(header: &[u8], magic: u32) -> Option<u64> {
    let ndims = (magic & 0xff) as usize;
    if header.len() != 4 + 4 * ndims || header[..4] != magic.to_be_bytes() {
        return None;
    }
    header[4..]
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .try_fold(1u64, |acc, d| acc.checked_mul(d))
}

fn type_name(t: u8) -> &'static str {
    match t {
        0x08 => "unsigned byte",
        0x09 => "signed byte",
        0x0B => "i16",
        0x0C => "i32",
        0x0D => "f32",
        0x0E => "f64",
        _ => "unknown type",
    }
}

/// Checks the header of (decompressed) IDX `bytes` against `magic` and returns the dimensions
/// and the data that follows, exactly their product long.
fn parse<'a>(
    name: &str,
    bytes: &'a [u8],
    magic: u32,
    what: &str,
) -> Result<(Vec<usize>, &'a [u8])> {
    let ndims = (magic & 0xff) as usize;
    if bytes.len() < 4 {
        return Err(Error::data(
            name,
            format!(
                "truncated: {} bytes, too short for an IDX header \
                 (expected magic {magic:#010x}, {what})",
                bytes.len()
            ),
        ));
    }
    let found = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let wrong_magic = || {
        Error::data(
            name,
            format!("wrong magic number {found:#010x}, expected {magic:#010x} ({what})"),
        )
    };
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(wrong_magic());
    }
    if bytes[2] != TYPE_U8 {
        return Err(Error::data(
            name,
            format!(
                "data type {:#04x} ({}) is not supported: only unsigned bytes \
                 ({TYPE_U8:#04x}) are read (magic {found:#010x}, expected {magic:#010x})",
                bytes[2],
                type_name(bytes[2])
            ),
        ));
    }
    if bytes[3] as usize != ndims {
        return Err(wrong_magic());
    }
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(Error::data(
            name,
            format!(
                "truncated: expected a {header}-byte header, found {} bytes",
                bytes.len()
            ),
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let fmt_dims = || {
        dims.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("×")
    };
    if let Some(i) = (1..dims.len()).find(|&i| dims[i] == 0) {
        let field = ["number of images", "rows", "columns"][i.min(2)];
        return Err(Error::data(
            name,
            format!(
                "IDX header field `{field}` (dimension {} of {}) is 0: images must be at least \
                 1×1 pixels",
                i + 1,
                fmt_dims()
            ),
        ));
    }
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_add(header))
        .ok_or_else(|| {
            Error::data(
                name,
                format!(
                    "dimensions {} overflow: their product does not fit in memory",
                    fmt_dims()
                ),
            )
        })?;
    if bytes.len() < expected {
        return Err(Error::data(
            name,
            format!(
                "truncated: dimensions {} need {expected} bytes (header included), found {}",
                fmt_dims(),
                bytes.len()
            ),
        ));
    }
    if bytes.len() > expected {
        return Err(Error::data(
            name,
            format!(
                "{} bytes after the data of dimensions {} ({expected} bytes expected in all)",
                bytes.len() - expected,
                fmt_dims()
            ),
        ));
    }
    Ok((dims, &bytes[header..]))
}

/// Parses an IDX image file (gzip or raw) called `name` in messages.
pub fn parse_images(name: &str, bytes: &[u8]) -> Result<IdxImages> {
    let bytes = decompress(name, bytes, IMAGES_MAGIC)?;
    let (dims, data) = parse(name, &bytes, IMAGES_MAGIC, "an IDX image file: u8, N×H×W")?;
    let (count, height, width) = (dims[0], dims[1], dims[2]);
    Ok(IdxImages {
        count,
        height,
        width,
        pixels: data.to_vec(),
    })
}

/// Parses an IDX label file (gzip or raw) called `name` in messages.
pub fn parse_labels(name: &str, bytes: &[u8]) -> Result<Vec<u8>> {
    let bytes = decompress(name, bytes, LABELS_MAGIC)?;
    let (_, data) = parse(name, &bytes, LABELS_MAGIC, "an IDX label file: u8, N")?;
    Ok(data.to_vec())
}

/// An IDX image file and its label file in memory, one channel.
#[derive(Debug, Clone)]
pub struct IdxSource {
    name: String,
    count: usize,
    height: usize,
    width: usize,
    classes: usize,
    pixels: Vec<u8>,
    labels: Vec<u8>,
    mean: f32,
    scale: f32,
}

impl IdxSource {
    /// Reads `images` and `labels` (each gzip or raw), and checks that they hold as many records
    /// and that every label is below `classes`. Records come out as `(pixel − mean) · scale`.
    pub fn open(
        images: &Path,
        labels: &Path,
        classes: usize,
        mean: f32,
        scale: f32,
    ) -> Result<Self> {
        let image_bytes = read_file(images)?;
        let label_bytes = read_file(labels)?;
        Self::from_bytes(
            &images.display().to_string(),
            &image_bytes,
            &labels.display().to_string(),
            &label_bytes,
            classes,
            mean,
            scale,
        )
    }

    /// As [`IdxSource::open`], from the files' bytes; the names are used in messages.
    pub fn from_bytes(
        images_name: &str,
        images: &[u8],
        labels_name: &str,
        labels: &[u8],
        classes: usize,
        mean: f32,
        scale: f32,
    ) -> Result<Self> {
        let img = parse_images(images_name, images)?;
        let labels = parse_labels(labels_name, labels)?;
        if img.count != labels.len() {
            return Err(Error::data(
                images_name,
                format!(
                    "{} images but {} labels in {labels_name}: the counts must match",
                    img.count,
                    labels.len()
                ),
            ));
        }
        if let Some((i, &l)) = labels
            .iter()
            .enumerate()
            .find(|&(_, &l)| l as usize >= classes)
        {
            return Err(Error::data(
                labels_name,
                format!("label {l} of record {i} is not below classes = {classes}"),
            ));
        }
        Ok(IdxSource {
            name: images_name.to_string(),
            count: img.count,
            height: img.height,
            width: img.width,
            classes,
            pixels: img.pixels,
            labels,
            mean,
            scale,
        })
    }
}

impl RecordSource for IdxSource {
    fn len(&self) -> usize {
        self.count
    }

    fn record_shape(&self) -> [usize; 3] {
        [1, self.height, self.width]
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn fill(&self, index: usize, out: &mut [f32]) {
        let size = self.height * self.width;
        assert!(index < self.count, "record {index} of {}", self.count);
        assert_eq!(out.len(), size, "record buffer of {}", self.name);
        let src = &self.pixels[index * size..(index + 1) * size];
        for (o, &p) in out.iter_mut().zip(src) {
            *o = (f32::from(p) - self.mean) * self.scale;
        }
    }

    fn label(&self, index: usize) -> u32 {
        u32::from(self.labels[index])
    }

    /// The bytes as they are when the source itself neither shifts nor scales them.
    fn values_are_u8(&self) -> bool {
        self.mean == 0.0 && self.scale == 1.0
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// The dimensions of the IDX file at `path` (gzip-compressed or raw), which must have `magic`
/// ([`IMAGES_MAGIC`]: u8 images, 3 dimensions; [`LABELS_MAGIC`]: u8 labels, 1 dimension), read
/// from its header alone and checked before anything is derived from them: images of at least
/// 1×1 pixels, a product that fits, and (for a raw file) exactly the file's length after the
/// header. The error is a message naming the file (config validation adds the key).
pub fn check_header(path: &Path, magic: u32) -> std::result::Result<Vec<u64>, String> {
    let shown = path.display();
    let ndims = (magic & 0xff) as usize;
    let want = 4 + 4 * ndims;
    let (file, len) = super::open_checked(path)?;
    let (header, compressed) =
        read_header(file, want).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let what = if ndims == 1 { "labels" } else { "images" };
    if header.len() < 4 {
        return Err(format!("{shown} is too short for an IDX file"));
    }
    let found = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    if found != magic {
        let hint = match found {
            LABELS_MAGIC => " (an IDX label file)",
            IMAGES_MAGIC => " (an IDX image file)",
            _ => "",
        };
        return Err(format!(
            "{shown}: magic 0x{found:08x}{hint}, expected IDX u8 {what} (0x{magic:08x})"
        ));
    }
    if header.len() < want {
        return Err(format!("{shown}: truncated IDX header"));
    }
    let dims: Vec<u64> = header[4..]
        .chunks(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64)
        .collect();
    let raw_len = (!compressed).then_some(len);
    idx_dims_fit(&dims, want as u64, raw_len).map_err(|msg| format!("{shown}: {msg}"))?;
    Ok(dims)
}

/// The names of an IDX file's header fields, by number of dimensions.
fn idx_fields(ndims: usize) -> &'static [&'static str] {
    match ndims {
        1 => &["number of labels"],
        _ => &["number of images", "rows", "columns"],
    }
}

/// Checks IDX dimensions `dims` read from a header of `header` bytes: no zero image side, images
/// of fewer than 2^31 pixels, a data size that fits in a `u64`, and, for a raw file of `raw_len` bytes, exactly that many
/// bytes in all. The message names the header field at fault.
fn idx_dims_fit(
    dims: &[u64],
    header: u64,
    raw_len: Option<u64>,
) -> std::result::Result<(), String> {
    let fields = idx_fields(dims.len());
    let shown = dims
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("×");
    if let Some(i) = (1..dims.len()).find(|&i| dims[i] == 0) {
        return Err(format!(
            "IDX header field `{}` (dimension {} of {shown}) is 0: images must be at least 1×1 pixels",
            fields[i],
            i + 1
        ));
    }
    if let [_, rows, columns] = dims {
        if rows.saturating_mul(*columns) >= super::MAX_RECORD_ELEMS {
            return Err(format!(
                "IDX header fields `rows` × `columns` ({rows}×{columns}) make images of 2^31 or \
                 more pixels"
            ));
        }
    }
    let data = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let Some(total) = data.and_then(|d| d.checked_add(header)) else {
        return Err(format!(
            "IDX header dimensions {shown} ({}) overflow: their product is no size a file can have",
            fields.join(" × ")
        ));
    };
    match raw_len {
        Some(len) if len != total => Err(format!(
            "IDX header dimensions {shown} ({}) declare {total} bytes with the {header}-byte \
             header, but the file holds {len}",
            fields.join(" × ")
        )),
        _ => Ok(()),
    }
}

/// Up to `n` bytes from the start of `file`'s content, through gzip when it is compressed, and
/// whether it is.
fn read_header(mut file: std::fs::File, n: usize) -> std::io::Result<(Vec<u8>, bool)> {
    let mut magic = [0u8; 2];
    let got = file.read(&mut magic)?;
    file.seek(std::io::SeekFrom::Start(0))?;
    let mut out = Vec::with_capacity(n);
    let compressed = got == 2 && magic == [0x1f, 0x8b];
    if compressed {
        flate2::read::GzDecoder::new(file)
            .take(n as u64)
            .read_to_end(&mut out)?;
    } else {
        file.take(n as u64).read_to_end(&mut out)?;
    }
    Ok((out, compressed))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::input_files::{gzip, idx_labels};

    /// A raw IDX image file of `n` images of h×w whose pixel j of image i is (i·7 + j) mod 256.
    pub(crate) fn images_bytes(n: u32, h: u32, w: u32) -> Vec<u8> {
        let mut b = IMAGES_MAGIC.to_be_bytes().to_vec();
        for d in [n, h, w] {
            b.extend_from_slice(&d.to_be_bytes());
        }
        let size = (h * w) as usize;
        for i in 0..n as usize {
            b.extend((0..size).map(|j| ((i * 7 + j) % 256) as u8));
        }
        b
    }

    fn err(images: &[u8], labels: &[u8]) -> String {
        IdxSource::from_bytes("img.idx", images, "lab.idx", labels, 10, 0.0, 1.0)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bundled_digits_parse() {
        let (train, test) = crate::data::digits::open(10, 0.0, 1.0).unwrap();
        assert_eq!(train.len(), 1500);
        assert_eq!(test.len(), 297);
        assert_eq!(train.record_shape(), [1, 8, 8]);
        assert_eq!(test.record_shape(), [1, 8, 8]);
        let mut seen = [0usize; 10];
        for s in [&train, &test] {
            for i in 0..s.len() {
                assert!(s.label(i) < 10);
                seen[s.label(i) as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c > 100), "{seen:?}");
        let mut out = vec![0.0; 64];
        train.fill(0, &mut out);
        assert!(out
            .iter()
            .all(|&v| (0.0..=255.0).contains(&v) && v.fract() == 0.0));
        assert!(out.iter().any(|&v| v > 0.0));
    }

    #[test]
    fn gzip_and_raw_files_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let raw_i = images_bytes(5, 3, 4);
        let raw_l = idx_labels(5);
        let files = [
            ("ri", raw_i.clone()),
            ("rl", raw_l.clone()),
            ("gi.gz", gzip(&raw_i)),
            ("gl.gz", gzip(&raw_l)),
        ];
        for (n, b) in &files {
            std::fs::write(dir.path().join(n), b).unwrap();
        }
        let p = |n: &str| dir.path().join(n);
        let raw = IdxSource::open(&p("ri"), &p("rl"), 10, 1.0, 0.5).unwrap();
        let gz = IdxSource::open(&p("gi.gz"), &p("gl.gz"), 10, 1.0, 0.5).unwrap();
        let mixed = IdxSource::open(&p("ri"), &p("gl.gz"), 10, 1.0, 0.5).unwrap();
        assert_eq!(raw.record_shape(), [1, 3, 4]);
        for s in [&gz, &mixed] {
            assert_eq!(s.len(), 5);
            for i in 0..5 {
                let (mut a, mut b) = (vec![0.0; 12], vec![0.0; 12]);
                raw.fill(i, &mut a);
                s.fill(i, &mut b);
                assert_eq!(a, b);
                assert_eq!(raw.label(i), s.label(i));
            }
        }
        // (pixel − mean) · scale
        let mut a = vec![0.0; 12];
        raw.fill(1, &mut a);
        assert_eq!(a[0], (7.0 - 1.0) * 0.5);
        assert_eq!(raw.label(3), 3);

        // The bundled set, decompressed to a raw file, reads the same as gzip.
        let gz_bytes = include_bytes!("../../data/digits/test-images-idx3-ubyte.gz");
        let raw_bytes = decompress("x", gz_bytes, IMAGES_MAGIC)
            .unwrap()
            .into_owned();
        assert_ne!(raw_bytes.as_slice(), gz_bytes.as_slice());
        let a = parse_images("gz", gz_bytes).unwrap();
        let b = parse_images("raw", &raw_bytes).unwrap();
        assert_eq!((a.count, a.pixels), (b.count, b.pixels));
    }

    #[test]
    fn missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let l = dir.path().join("labels");
        std::fs::write(&l, idx_labels(1)).unwrap();
        let e = IdxSource::open(&dir.path().join("nope-images"), &l, 10, 0.0, 1.0).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = e.to_string();
        assert!(
            e.contains("nope-images") && e.contains("no such file"),
            "{e}"
        );
    }

    #[test]
    fn wrong_magic_is_shown_in_hex() {
        // Labels where images belong.
        let e = err(&idx_labels(3), &idx_labels(3));
        assert!(
            e.starts_with("img.idx:") && e.contains("0x00000801") && e.contains("0x00000803"),
            "{e}"
        );
        // Images where labels belong.
        let e = err(&images_bytes(3, 2, 2), &images_bytes(3, 2, 2));
        assert!(
            e.starts_with("lab.idx:")
                && e.contains("0x00000803")
                && e.contains("expected 0x00000801"),
            "{e}"
        );
        // Not an IDX file at all.
        let e = err(b"PK\x03\x04 something", &idx_labels(3));
        assert!(
            e.contains("0x504b0304") && e.contains("expected 0x00000803"),
            "{e}"
        );
    }

    #[test]
    fn truncated_files_say_how_much_is_missing() {
        let full = images_bytes(4, 3, 3); // 16 + 36 bytes
        let e = err(&full[..50], &idx_labels(4));
        assert!(
            e.contains("truncated") && e.contains("52") && e.contains("50"),
            "{e}"
        );
        let e = err(&full[..10], &idx_labels(4));
        assert!(
            e.contains("truncated") && e.contains("16-byte header"),
            "{e}"
        );
        let e = err(&full[..2], &idx_labels(4));
        assert!(e.contains("truncated"), "{e}");
        let l = idx_labels(4);
        let e = err(&full, &l[..l.len() - 1]);
        assert!(
            e.starts_with("lab.idx:") && e.contains("12") && e.contains("11"),
            "{e}"
        );
        // A truncated gzip stream.
        let g = gzip(&full);
        let e = err(&g[..g.len() / 2], &idx_labels(4));
        assert!(e.starts_with("img.idx:") && e.contains("gzip"), "{e}");
        // Trailing bytes.
        let mut long = full.clone();
        long.push(0);
        let e = err(&long, &idx_labels(4));
        assert!(e.contains("1 bytes after the data"), "{e}");
    }

    #[test]
    fn non_u8_data_is_refused() {
        let mut b = images_bytes(2, 2, 2);
        b[2] = 0x0D;
        let e = err(&b, &idx_labels(2));
        assert!(
            e.contains("0x0d") && e.contains("f32") && e.contains("unsigned"),
            "{e}"
        );
    }

    #[test]
    fn dimension_overflow_is_reported() {
        let mut b = IMAGES_MAGIC.to_be_bytes().to_vec();
        for _ in 0..3 {
            b.extend_from_slice(&u32::MAX.to_be_bytes());
        }
        let e = err(&b, &idx_labels(2));
        assert!(e.contains("overflow") && e.contains("4294967295"), "{e}");
        b[4..8].copy_from_slice(&1u32.to_be_bytes());
        b[8..12].copy_from_slice(&0u32.to_be_bytes());
        let e = err(&b, &idx_labels(2));
        assert!(
            e.contains("img.idx") && e.contains("`rows`") && e.contains("is 0"),
            "{e}"
        );
    }

    #[test]
    fn gzip_data_beyond_the_declared_size_are_refused_unread() {
        // A header of 2 images of 2×2, then 64 MiB of zeros: a small file that inflates far.
        let mut bomb = IMAGES_MAGIC.to_be_bytes().to_vec();
        for d in [2u32, 2, 2] {
            bomb.extend_from_slice(&d.to_be_bytes());
        }
        bomb.resize(bomb.len() + (64 << 20), 0);
        let e = parse_images("bomb.idx.gz", &gzip(&bomb))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bomb.idx.gz: ")
                && e.contains("more than the 24 bytes its IDX header declares"),
            "{e}"
        );
        // Fewer bytes than declared: truncated.
        let e = parse_images("short.idx.gz", &gzip(&bomb[..20]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("truncated") && e.contains("need 24 bytes"),
            "{e}"
        );
    }

    #[test]
    fn count_mismatch_names_both_files_and_counts() {
        let e = err(&images_bytes(5, 2, 2), &idx_labels(4));
        assert!(
            e.contains("img.idx")
                && e.contains("lab.idx")
                && e.contains("5 images")
                && e.contains("4 labels"),
            "{e}"
        );
    }

    #[test]
    fn label_out_of_range_names_index_and_value() {
        let mut l = idx_labels(6);
        l[8 + 4] = 12;
        let e = err(&images_bytes(6, 2, 2), &l);
        assert!(
            e.starts_with("lab.idx:")
                && e.contains("label 12 of record 4")
                && e.contains("classes = 10"),
            "{e}"
        );
    }
}
