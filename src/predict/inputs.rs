//! The inputs of `p2ptrain predict`: record sources whose records are named (a file and an
//! index, later an LMDB key or an image's path) and need no label. [`open`] tells each path's
//! kind; every kind is an [`InputSource`], so a new one (image files, a list of them, an LMDB)
//! plugs in as one more arm there.
//!
//! Read now: MNIST IDX image files (gzip or raw; records `(1, H, W)`), CIFAR-10 binary batches
//! (`(3, 32, 32)`, their label bytes ignored), and NumPy `.npy` arrays of `u1` or `<f4` values
//! shaped `(N, C, H, W)` or `(N, H, W)`. Records are raw pixels; the config's test-phase
//! transform (mean, scale, centre crop) is applied as for the test set. Refused with a clear
//! error until p2ptrain reads them: LMDB folders, image files and lists of them.

use crate::data::{idx, Cifar10Source, RecordSource};
use crate::error::{Error, Result};
use crate::input_file::{read_regular, UNBOUNDED};
use std::path::Path;
use std::sync::Arc;

/// Records with names: what `predict` reads.
pub trait InputSource: RecordSource {
    /// The name of record `index` in `predictions.jsonl`.
    fn key(&self, index: usize) -> String;
}

/// Opens every path of `paths` (in order) as one source.
pub fn open_all(paths: &[std::path::PathBuf]) -> Result<Arc<dyn InputSource>> {
    let mut parts = paths.iter().map(|p| open(p)).collect::<Result<Vec<_>>>()?;
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    let shape = parts[0].record_shape();
    if let Some(p) = parts.iter().find(|p| p.record_shape() != shape) {
        return Err(Error::data(
            p.name(),
            format!(
                "records are {} where {}'s are {}: one prediction run reads one shape",
                crate::data::fmt_shape(p.record_shape()),
                parts[0].name(),
                crate::data::fmt_shape(shape)
            ),
        ));
    }
    Ok(Arc::new(Concat::new(parts)))
}

/// Opens one input path, by what it is.
pub fn open(path: &Path) -> Result<Arc<dyn InputSource>> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if path.is_dir() {
        return Err(Error::data(
            path,
            "a folder (an LMDB?): LMDB inputs are read once p2ptrain reads LMDB data sets",
        ));
    }
    if ["png", "jpg", "jpeg", "bmp", "txt", "list"].contains(&ext.as_str()) {
        return Err(Error::data(
            path,
            "image files and lists of them are read once p2ptrain reads image data sets; \
             predict reads IDX image files, CIFAR-10 batches and .npy arrays",
        ));
    }
    let bytes = read_regular(path, UNBOUNDED)
        .map_err(|e| Error::data(path, format!("cannot read: {e}")))?;
    let name = path.display().to_string();
    if ext == "npy" {
        return parse_npy(&name, &bytes);
    }
    let magic = idx::IMAGES_MAGIC.to_be_bytes();
    if bytes.starts_with(&magic) || bytes.starts_with(&[0x1f, 0x8b]) {
        let images = idx::parse_images(&name, &bytes)?;
        return Ok(Keyed::named(name, Idx { images }));
    }
    if !bytes.is_empty() && bytes.len() % crate::data::cifar10::RECORD_BYTES == 0 {
        let source = Cifar10Source::from_bytes(vec![(name.clone(), bytes)], 256)?;
        return Ok(Keyed::named(name, source));
    }
    Err(Error::data(
        path,
        "not an IDX image file, a CIFAR-10 batch (records of 3073 bytes) or a .npy array",
    ))
}

/// The NumPy array in `bytes` (the file `name`) as an input source.
pub fn parse_npy(name: &str, bytes: &[u8]) -> Result<Arc<dyn InputSource>> {
    Ok(Keyed::named(name.to_string(), Npy::parse(name, bytes)?))
}

/// The records of the file `name`, named `<file>#<index>`, without labels.
struct Keyed {
    name: String,
    inner: Arc<dyn RecordSource>,
}

impl Keyed {
    fn named(name: String, inner: impl RecordSource + 'static) -> Arc<dyn InputSource> {
        Arc::new(Keyed {
            name,
            inner: Arc::new(inner),
        })
    }
}

impl RecordSource for Keyed {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn record_shape(&self) -> [usize; 3] {
        self.inner.record_shape()
    }
    fn classes(&self) -> usize {
        self.inner.classes()
    }
    fn fill(&self, index: usize, out: &mut [f32]) {
        self.inner.fill(index, out)
    }
    fn label(&self, _: usize) -> u32 {
        0
    }
    fn name(&self) -> &str {
        &self.name
    }
}

impl InputSource for Keyed {
    fn key(&self, index: usize) -> String {
        format!("{}#{index}", self.name)
    }
}

/// The images of an IDX file, `(1, H, W)`, no labels.
struct Idx {
    images: idx::IdxImages,
}

impl RecordSource for Idx {
    fn len(&self) -> usize {
        self.images.count
    }
    fn record_shape(&self) -> [usize; 3] {
        [1, self.images.height, self.images.width]
    }
    fn classes(&self) -> usize {
        1
    }
    fn fill(&self, index: usize, out: &mut [f32]) {
        let n = self.images.height * self.images.width;
        let pixels = &self.images.pixels[index * n..(index + 1) * n];
        for (o, &p) in out.iter_mut().zip(pixels) {
            *o = f32::from(p);
        }
    }
    fn label(&self, _: usize) -> u32 {
        0
    }
}

/// A NumPy array `(N, C, H, W)` or `(N, H, W)` of `u1` or little-endian `f4` values.
struct Npy {
    shape: [usize; 3],
    count: usize,
    values: Vec<f32>,
}

impl Npy {
    /// Parses a version 1, 2 or 3 `.npy` file (C order).
    fn parse(name: &str, bytes: &[u8]) -> Result<Npy> {
        let bad = |m: &str| Error::data(name, format!("not a readable .npy array: {m}"));
        let rest = bytes
            .strip_prefix(b"\x93NUMPY")
            .ok_or_else(|| bad("no \\x93NUMPY magic"))?;
        let (header_len, start): (usize, usize) = match rest.first() {
            Some(1) if rest.len() >= 4 => (usize::from(u16::from_le_bytes([rest[2], rest[3]])), 10),
            Some(2 | 3) if rest.len() >= 6 => {
                let n = u32::from_le_bytes([rest[2], rest[3], rest[4], rest[5]]);
                (usize::try_from(n).map_err(|_| bad("header length"))?, 12)
            }
            _ => return Err(bad("unknown version")),
        };
        let header = bytes
            .get(start..start.saturating_add(header_len))
            .ok_or_else(|| bad("truncated header"))?;
        let header = String::from_utf8_lossy(header);
        let field = |key: &str| -> Option<String> {
            let at = header.find(&format!("'{key}'"))? + key.len() + 2;
            let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
            let end = match rest.chars().next()? {
                '(' => rest.find(')')? + 1,
                '\'' => rest[1..].find('\'')? + 2,
                _ => rest.find([',', '}'])?,
            };
            Some(rest[..end].trim().to_string())
        };
        let descr = field("descr").ok_or_else(|| bad("no 'descr'"))?;
        if field("fortran_order").as_deref() != Some("False") {
            return Err(bad("only C-order arrays are read (fortran_order: False)"));
        }
        let dims: Vec<usize> = field("shape")
            .ok_or_else(|| bad("no 'shape'"))?
            .trim_matches(['(', ')'])
            .split(',')
            .filter(|d| !d.trim().is_empty())
            .map(|d| {
                d.trim()
                    .parse()
                    .map_err(|_| bad("a dimension that is not a number"))
            })
            .collect::<Result<_>>()?;
        let (count, shape) = match dims[..] {
            [n, c, h, w] => (n, [c, h, w]),
            [n, h, w] => (n, [1, h, w]),
            _ => {
                return Err(bad(&format!(
                    "shape {dims:?}: (N, C, H, W) or (N, H, W) expected"
                )))
            }
        };
        let elems = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("shape too large"))?;
        let data = &bytes[start + header_len..];
        let values: Vec<f32> = match descr.trim_matches('\'') {
            "|u1" | "u1" | "<u1" => data
                .get(..elems)
                .ok_or_else(|| bad("truncated data"))?
                .iter()
                .map(|&b| f32::from(b))
                .collect(),
            "<f4" => data
                .get(..elems.checked_mul(4).ok_or_else(|| bad("shape too large"))?)
                .ok_or_else(|| bad("truncated data"))?
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            other => return Err(bad(&format!("dtype {other}: |u1 or <f4 expected"))),
        };
        if count == 0 || shape.contains(&0) {
            return Err(bad("no records"));
        }
        Ok(Npy {
            shape,
            count,
            values,
        })
    }
}

impl RecordSource for Npy {
    fn len(&self) -> usize {
        self.count
    }
    fn record_shape(&self) -> [usize; 3] {
        self.shape
    }
    fn classes(&self) -> usize {
        1
    }
    fn fill(&self, index: usize, out: &mut [f32]) {
        let n = out.len();
        out.copy_from_slice(&self.values[index * n..(index + 1) * n]);
    }
    fn label(&self, _: usize) -> u32 {
        0
    }
}

/// Several sources of one shape, one after the other.
struct Concat {
    parts: Vec<Arc<dyn InputSource>>,
    /// Index of each part's first record; then the total.
    starts: Vec<usize>,
}

impl Concat {
    fn new(parts: Vec<Arc<dyn InputSource>>) -> Self {
        let mut starts = vec![0];
        for p in &parts {
            starts.push(starts.last().copied().unwrap_or(0) + p.len());
        }
        Concat { parts, starts }
    }

    /// The part holding record `index` and the index within it.
    fn locate(&self, index: usize) -> (&dyn InputSource, usize) {
        let part = self.starts.partition_point(|&s| s <= index) - 1;
        (self.parts[part].as_ref(), index - self.starts[part])
    }
}

impl RecordSource for Concat {
    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }
    fn record_shape(&self) -> [usize; 3] {
        self.parts[0].record_shape()
    }
    fn classes(&self) -> usize {
        1
    }
    fn fill(&self, index: usize, out: &mut [f32]) {
        let (part, i) = self.locate(index);
        part.fill(i, out)
    }
    fn label(&self, _: usize) -> u32 {
        0
    }
    fn name(&self) -> &str {
        self.parts[0].name()
    }
}

impl InputSource for Concat {
    fn key(&self, index: usize) -> String {
        let (part, i) = self.locate(index);
        part.key(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input_files::npy;

    #[test]
    fn npy_arrays_of_bytes_and_floats() {
        let a = Npy::parse(
            "a.npy",
            &npy("|u1", "(2, 1, 2, 2)", &[1, 2, 3, 4, 5, 6, 7, 8]),
        )
        .unwrap();
        assert_eq!((a.len(), a.record_shape()), (2, [1, 2, 2]));
        let mut out = [0.0; 4];
        a.fill(1, &mut out);
        assert_eq!(out, [5.0, 6.0, 7.0, 8.0]);
        let named = parse_npy("a.npy", &npy("|u1", "(2, 1, 2, 2)", &[0; 8])).unwrap();
        assert_eq!(named.key(1), "a.npy#1");
        let floats: Vec<u8> = [0.5f32, -1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f = Npy::parse("f.npy", &npy("<f4", "(2, 1, 1)", &floats)).unwrap();
        let mut one = [0.0];
        f.fill(1, &mut one);
        assert_eq!(one, [-1.0]);
        for (bytes, what) in [
            (npy("<f8", "(1, 1, 1)", &[0; 8]), "dtype"),
            (npy("|u1", "(4,)", &[0; 4]), "shape"),
            (npy("|u1", "(2, 2, 2)", &[0; 3]), "truncated"),
            (b"garbage".to_vec(), "magic"),
        ] {
            let e = Npy::parse("x.npy", &bytes).err().expect("an error");
            assert!(e.to_string().contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn several_files_read_as_one_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.npy");
        let b = dir.path().join("b.npy");
        std::fs::write(&a, npy("|u1", "(1, 1, 2)", &[1, 2])).unwrap();
        std::fs::write(&b, npy("|u1", "(2, 1, 2)", &[3, 4, 5, 6])).unwrap();
        let all = open_all(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(all.len(), 3);
        let mut out = [0.0; 2];
        all.fill(2, &mut out);
        assert_eq!(out, [5.0, 6.0]);
        assert_eq!(all.key(0), format!("{}#0", a.display()));
        assert_eq!(all.key(2), format!("{}#1", b.display()));
    }

    #[test]
    fn what_is_not_read_yet_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let e = open(dir.path()).err().expect("a folder is refused");
        assert!(e.to_string().contains("LMDB"), "{e}");
        let png = dir.path().join("x.png");
        std::fs::write(&png, b"png").unwrap();
        let e = open(&png).err().expect("an image is refused");
        assert!(e.to_string().contains("image files"), "{e}");
    }
}
