//! CIFAR-10's binary format and [`Cifar10Source`], the record source over a list of its batch
//! files (`data_batch_1.bin` … `data_batch_5.bin`, `test_batch.bin`).
//!
//! A file is a sequence of 3073-byte records: one label byte (0 to 9), then 3072 pixel bytes,
//! the 32×32 red plane, then green, then blue, each row-major: one record is `(3, 32, 32)` in
//! C, H, W order, which is the net's layout. Files are read into memory when opened (not mapped:
//! a file truncated or rewritten while training runs cannot change or fault the records read);
//! records are numbered across the files in list order. Every error names the file (and, from [`Cifar10Source::open`], the
//! config key that lists it) and says what was expected.

use super::RecordSource;
use crate::error::{Error, Result};
use crate::input_file::{read_regular, InputError, UNBOUNDED};
use std::path::{Path, PathBuf};

/// Shape of one record, `(C, H, W)`.
pub const SHAPE: [usize; 3] = [3, 32, 32];
/// Pixel bytes per record.
pub const PIXELS: usize = 3 * 32 * 32;
/// Bytes per record: the label byte and the pixels.
pub const RECORD_BYTES: usize = 1 + PIXELS;
/// Labels are below this.
pub const LABELS: usize = 10;

/// Checks CIFAR-10 `bytes` called `name` in messages: a positive whole number of records, every
/// label below `min(10, classes)`. Returns the number of records. Never panics.
pub fn check(name: &str, bytes: &[u8], classes: usize) -> Result<usize> {
    if bytes.is_empty() {
        return Err(Error::data(
            name,
            format!("empty: a CIFAR-10 file holds records of {RECORD_BYTES} bytes"),
        ));
    }
    if !bytes.len().is_multiple_of(RECORD_BYTES) {
        return Err(Error::data(
            name,
            format!(
                "size {} is not a multiple of the CIFAR-10 record size {RECORD_BYTES} \
                 (1 label byte + 3×32×32 pixels): {} whole records and {} bytes more \
                 (truncated or not a CIFAR-10 binary batch)",
                bytes.len(),
                bytes.len() / RECORD_BYTES,
                bytes.len() % RECORD_BYTES
            ),
        ));
    }
    let limit = LABELS.min(classes);
    if let Some((i, &l)) = bytes
        .iter()
        .step_by(RECORD_BYTES)
        .enumerate()
        .find(|&(_, &l)| l as usize >= limit)
    {
        let why = if (l as usize) >= LABELS {
            "a CIFAR-10 label is 0 to 9".to_string()
        } else {
            format!("not below classes = {classes}")
        };
        return Err(Error::data(
            name,
            format!(
                "label {l} of record {i} (byte offset {}): {why}",
                i * RECORD_BYTES
            ),
        ));
    }
    Ok(bytes.len() / RECORD_BYTES)
}

/// CIFAR-10 batch files as one record source of `(3, 32, 32)` records.
pub struct Cifar10Source {
    name: String,
    files: Vec<Vec<u8>>,
    /// `starts[f]` is the index of file f's first record; the last entry is the total.
    starts: Vec<usize>,
    classes: usize,
}

impl std::fmt::Debug for Cifar10Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cifar10Source")
            .field("name", &self.name)
            .field("records", &self.len())
            .field("classes", &self.classes)
            .finish()
    }
}

impl Cifar10Source {
    /// Reads and checks `paths` (at least one), listed in the config under `key` (named in
    /// messages about a missing or unreadable file).
    pub fn open(key: &str, paths: &[PathBuf], classes: usize) -> Result<Self> {
        if paths.is_empty() {
            return Err(Error::Config {
                file: "config".to_string(),
                pos: None,
                key: key.to_string(),
                msg: "lists no files".to_string(),
            });
        }
        let mut files = Vec::with_capacity(paths.len());
        for (i, path) in paths.iter().enumerate() {
            files.push((
                path.display().to_string(),
                read(path, &format!("{key}[{i}]"))?,
            ));
        }
        Self::build(files, classes)
    }

    /// As [`Cifar10Source::open`], from `(name, bytes)` pairs held in memory.
    pub fn from_bytes(files: Vec<(String, Vec<u8>)>, classes: usize) -> Result<Self> {
        Self::build(files, classes)
    }

    fn build(files: Vec<(String, Vec<u8>)>, classes: usize) -> Result<Self> {
        let Some((first, _)) = files.first() else {
            return Err(Error::data("cifar10", "no files given"));
        };
        let name = if files.len() == 1 {
            first.clone()
        } else {
            format!("{} (and {} more)", first, files.len() - 1)
        };
        let mut starts = vec![0];
        for (n, b) in &files {
            let count = check(n, b, classes)?;
            starts.push(starts.last().copied().unwrap_or(0) + count);
        }
        Ok(Cifar10Source {
            name,
            files: files.into_iter().map(|(_, b)| b).collect(),
            starts,
            classes,
        })
    }

    /// The bytes of record `index`: label byte, then pixels.
    fn record(&self, index: usize) -> &[u8] {
        assert!(index < self.len(), "record {index} of {}", self.len());
        let f = self.starts.partition_point(|&s| s <= index) - 1;
        let at = (index - self.starts[f]) * RECORD_BYTES;
        &self.files[f][at..at + RECORD_BYTES]
    }
}

/// Reads the file at `path` (listed as `key`), refusing a missing, unreadable or irregular one.
fn read(path: &Path, key: &str) -> Result<Vec<u8>> {
    read_regular(path, UNBOUNDED).map_err(|e| match e {
        InputError::Missing | InputError::NotRegular(_) => {
            Error::data(path, format!("{e} (`{key}`)"))
        }
        _ => Error::data(path, format!("cannot read (`{key}`): {e}")),
    })
}

impl RecordSource for Cifar10Source {
    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    fn record_shape(&self) -> [usize; 3] {
        SHAPE
    }

    fn classes(&self) -> usize {
        self.classes
    }

    /// Raw pixel values 0 to 255 (the transform normalises).
    fn fill(&self, index: usize, out: &mut [f32]) {
        assert_eq!(out.len(), PIXELS, "record buffer of {}", self.name);
        for (o, &p) in out.iter_mut().zip(&self.record(index)[1..]) {
            *o = f32::from(p);
        }
    }

    fn label(&self, index: usize) -> u32 {
        u32::from(self.record(index)[0])
    }

    fn values_are_u8(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// Checks one CIFAR-10 binary batch before it is read: a regular file whose size is a positive
/// multiple of [`RECORD_BYTES`] (its labels are checked when it is opened). The error is a
/// message naming the file (config validation adds the key).
pub fn check_file(path: &Path) -> std::result::Result<(), String> {
    let shown = path.display();
    let (_, len) = super::open_checked(path)?;
    if len == 0 || len % RECORD_BYTES as u64 != 0 {
        return Err(format!(
            "{shown}: size {len} is not a positive multiple of the CIFAR-10 record \
             size {RECORD_BYTES} (1 label byte + 3×32×32 pixels): truncated or not \
             a CIFAR-10 binary batch"
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `n` CIFAR-10 records: label (first + i) mod 10, pixel j of record i = (3·i + j) mod 256.
    pub(crate) fn batch_bytes(n: usize, first: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(n * RECORD_BYTES);
        for i in 0..n {
            b.push(((first + i) % 10) as u8);
            b.extend((0..PIXELS).map(|j| ((3 * i + j) % 256) as u8));
        }
        b
    }

    #[test]
    fn records_read_across_files_in_list_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("data_batch_1.bin");
        let b = dir.path().join("data_batch_2.bin");
        std::fs::write(&a, batch_bytes(3, 0)).unwrap();
        std::fs::write(&b, batch_bytes(2, 3)).unwrap();
        let s = Cifar10Source::open("data.train_files", &[a, b], 10).unwrap();
        assert_eq!((s.len(), s.record_shape(), s.classes()), (5, SHAPE, 10));
        assert_eq!(
            (0..5).map(|i| s.label(i)).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        let mut out = vec![0.0; PIXELS];
        s.fill(4, &mut out); // record 1 of the second file
        assert_eq!((out[0], out[1], out[1024], out[3071]), (3.0, 4.0, 3.0, 2.0));
        s.fill(2, &mut out); // record 2 of the first
        assert_eq!((out[0], out[2047]), (6.0, 5.0));
        assert!(s.name().contains("data_batch_1.bin") && s.name().contains("1 more"));
    }

    #[test]
    fn missing_file_names_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.bin");
        std::fs::write(&a, batch_bytes(1, 0)).unwrap();
        let e = Cifar10Source::open("data.test_files", &[a, dir.path().join("gone.bin")], 10)
            .unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = e.to_string();
        assert!(
            e.contains("gone.bin")
                && e.contains("no such file")
                && e.contains("data.test_files[1]"),
            "{e}"
        );
    }

    #[test]
    fn truncated_and_wrong_size_files_are_refused() {
        let full = batch_bytes(4, 0);
        let e = check("t.bin", &full[..full.len() - 1], 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.bin:")
                && e.contains(&format!("{}", 4 * RECORD_BYTES - 1))
                && e.contains("3073")
                && e.contains("3 whole records and 3072 bytes more"),
            "{e}"
        );
        let e = check("t.bin", &full[..100], 10).unwrap_err().to_string();
        assert!(e.contains("size 100 is not a multiple"), "{e}");
        let e = check("t.bin", &[], 10).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        assert_eq!(check("t.bin", &full, 10).unwrap(), 4);
        // Through a file.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("short.bin");
        std::fs::write(&p, &full[..5000]).unwrap();
        let e = Cifar10Source::open("data.train_files", &[p], 10).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("short.bin"), "{e}");
        let p = dir.path().join("empty.bin");
        std::fs::write(&p, []).unwrap();
        let e = Cifar10Source::open("data.train_files", &[p], 10).unwrap_err();
        assert!(e.to_string().contains("empty.bin: empty"), "{e}");
    }

    #[test]
    fn bad_labels_name_the_record() {
        let mut b = batch_bytes(6, 0);
        b[4 * RECORD_BYTES] = 10;
        let e = check("x.bin", &b, 10).unwrap_err().to_string();
        assert!(
            e.starts_with("x.bin:") && e.contains("label 10 of record 4") && e.contains("0 to 9"),
            "{e}"
        );
        b[4 * RECORD_BYTES] = 7;
        let e = check("x.bin", &b, 5).unwrap_err().to_string();
        assert!(
            e.contains("label 7 of record 4") && e.contains("classes = 5"),
            "{e}"
        );
        assert_eq!(check("x.bin", &b, 10).unwrap(), 6);
    }

    #[test]
    fn a_file_truncated_after_the_open_still_reads_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("data_batch_1.bin");
        std::fs::write(&p, batch_bytes(64, 0)).unwrap();
        let s = Cifar10Source::open("data.train_files", std::slice::from_ref(&p), 10).unwrap();
        // Truncated under a running job: a mapping of it would fault (SIGBUS) on the next read.
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(0)
            .unwrap();
        let mut out = vec![0.0; PIXELS];
        s.fill(63, &mut out);
        assert_eq!(s.label(63), 3);
        // Pixel 0 of record 63 is (3 · 63) mod 256.
        assert_eq!(out[0], 189.0);
    }
}
