//! `[data]`: the keys of each format, the record shape and classes the source implies (read
//! from IDX headers and CIFAR-10 file sizes through `data`'s own checks), the transform, and the
//! memory of a batch.

use super::*;
use crate::config::DataFormat;
use std::path::Path;

impl Validator<'_> {
    pub(super) fn data(&self) -> Result<DataFacts> {
        let d = &self.cfg.data;
        self.at_least_one("data.batch_size", d.batch_size as u64)?;
        if let Some(t) = d.test_batch_size {
            self.at_least_one("data.test_batch_size", t as u64)?;
        }
        self.finite("data.scale", d.scale)?;
        self.finite("data.mean", d.mean)?;
        if let Some(c) = d.classes {
            if c < 2 {
                return Err(self.err("data.classes", format!("must be at least 2, got {c}")));
            }
        }
        let format = format!("\"{}\"", name_of(&d.format));
        let paths = [
            ("train_images", &d.train_images),
            ("train_labels", &d.train_labels),
            ("test_images", &d.test_images),
            ("test_labels", &d.test_labels),
        ];
        let files = [
            ("train_files", &d.train_files),
            ("test_files", &d.test_files),
        ];
        let synthetic_keys = [
            ("shape", d.shape.is_some()),
            ("train_size", d.train_size.is_some()),
            ("test_size", d.test_size.is_some()),
            ("pixels", d.pixels.is_some()),
        ];
        if d.format != DataFormat::Idx {
            if let Some((k, _)) = paths.iter().find(|(_, p)| p.is_some()) {
                return Err(self.err(
                    &format!("data.{k}"),
                    format!("does not apply to format {format} (only to \"idx\")"),
                ));
            }
        }
        if d.format != DataFormat::Cifar10 {
            if let Some((k, _)) = files.iter().find(|(_, p)| p.is_some()) {
                return Err(self.err(
                    &format!("data.{k}"),
                    format!("does not apply to format {format} (only to \"cifar10\")"),
                ));
            }
        }
        if d.format != DataFormat::Synthetic {
            if let Some((k, _)) = synthetic_keys.iter().find(|(_, set)| *set) {
                return Err(self.err(
                    &format!("data.{k}"),
                    format!("does not apply to format {format} (only to \"synthetic\")"),
                ));
            }
        }
        if !image_data::is_image_format(d.format) {
            self.no_image_keys(&format)?;
        }
        let mut resized = false;
        let (record, classes) = match d.format {
            DataFormat::Idx => (self.idx_files()?, d.classes.unwrap_or(DEFAULT_CLASSES)),
            DataFormat::Synthetic => self.synthetic()?,
            DataFormat::Cifar10 => {
                for (k, list) in files {
                    self.cifar10_files(k, list.as_deref())?;
                }
                (
                    crate::data::cifar10::SHAPE.map(|d| d as u64).to_vec(),
                    d.classes.unwrap_or(DEFAULT_CLASSES),
                )
            }
            DataFormat::Digits => {
                let classes = d.classes.unwrap_or(DIGITS_CLASSES);
                if classes < DIGITS_CLASSES {
                    return Err(self.err(
                        "data.classes",
                        format!("the digits have labels 0 to 9: must be at least {DIGITS_CLASSES}, got {classes}"),
                    ));
                }
                (DIGITS_SHAPE.to_vec(), classes)
            }
            DataFormat::Lmdb | DataFormat::ImageList | DataFormat::ImageFolder => {
                let (record, classes, r) = self.image_data()?;
                resized = r;
                (record, classes)
            }
        };
        let record = if resized {
            self.transform_means(&record)?;
            record
        } else {
            self.transform(record)?
        };
        let w = record.last().copied().unwrap_or(1);
        let h = record.iter().rev().nth(1).copied().unwrap_or(1);
        if d.shift as u64 >= h.min(w) {
            let what = if d.crop_size > 0 { "crop" } else { "record" };
            return Err(self.err(
                "data.shift",
                format!(
                    "must be smaller than the {what}'s height and width ({h}×{w}), got {}",
                    d.shift
                ),
            ));
        }
        let batch = d.batch_size as u64;
        let test = d.test_batch_size.map_or(batch, |t| t as u64);
        let (key, max_batch) = if test > batch {
            ("data.test_batch_size", test)
        } else {
            ("data.batch_size", batch)
        };
        let dims: Vec<u64> = std::iter::once(max_batch)
            .chain(record.iter().copied())
            .collect();
        let need = product(&dims).and_then(|n| n.checked_mul(4));
        let shape = record
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("×");
        match need {
            None => {
                return Err(self.err(
                    key,
                    format!("a batch of {max_batch} records of {shape} overflows the size of a tensor"),
                ))
            }
            Some(b) if b > MAX_TENSOR_BYTES => {
                return Err(self.err(
                    key,
                    format!(
                        "a batch of {max_batch} records of {shape} would need {} GiB of f32 per replica (limit {} GiB)",
                        gib(b),
                        MAX_TENSOR_BYTES / GIB
                    ),
                ))
            }
            _ => {}
        }
        Ok(DataFacts {
            record,
            classes,
            max_batch,
        })
    }

    /// Checks the transform keys (`mean`, `mean_value`, `mean_file`, `crop_size`) against the
    /// source's record shape `(C, H, W)` and returns the shape of the net's input.
    fn transform(&self, mut record: Vec<u64>) -> Result<Vec<u64>> {
        let d = &self.cfg.data;
        let (h, w) = (record[1], record[2]);
        self.transform_means(&record)?;
        let crop = d.crop_size as u64;
        if crop > h.min(w) {
            return Err(self.err(
                "data.crop_size",
                format!("must not exceed the records' height and width ({h}×{w}), got {crop}"),
            ));
        }
        if crop > 0 {
            record[1] = crop;
            record[2] = crop;
        }
        Ok(record)
    }

    /// Checks `mean`, `mean_value` and `mean_file` against records of `record`'s channels.
    fn transform_means(&self, record: &[u64]) -> Result<()> {
        let d = &self.cfg.data;
        let c = record[0];
        if d.mean_file.is_some() && (d.mean != 0.0 || d.mean_value.is_some()) {
            // Its contents are checked against the records when the data are opened.
            return Err(self.err(
                "data.mean_file",
                "set one of `mean`, `mean_value` and `mean_file`, not several",
            ));
        }
        if let Some(m) = &d.mean_value {
            if d.mean != 0.0 {
                return Err(self.err(
                    "data.mean_value",
                    "set `mean` (one value for every channel) or `mean_value`, not both",
                ));
            }
            if m.len() != 1 && m.len() as u64 != c {
                return Err(self.err(
                    "data.mean_value",
                    format!(
                        "{} values given for records of {c} channels: give 1 or {c}",
                        m.len()
                    ),
                ));
            }
            for (i, &v) in m.iter().enumerate() {
                self.finite(&format!("data.mean_value[{i}]"), v)?;
            }
        }
        Ok(())
    }

    /// Checks one CIFAR-10 file list: present, not empty, every file a regular file whose size is
    /// a positive multiple of the record size (labels are checked when the data are opened).
    fn cifar10_files(&self, key: &str, list: Option<&[std::path::PathBuf]>) -> Result<()> {
        let key = format!("data.{key}");
        let Some(list) = list else {
            return Err(self.err(
                &key,
                "format \"cifar10\" needs this list of files, e.g. [\"data_batch_1.bin\"]",
            ));
        };
        if list.is_empty() {
            return Err(self.err(&key, "lists no files"));
        }
        for (i, path) in list.iter().enumerate() {
            let k = format!("{key}[{i}]");
            crate::data::cifar10::check_file(path).map_err(|msg| self.err(&k, msg))?;
        }
        Ok(())
    }

    /// Checks the four IDX files (present, IDX headers, matching counts and image sizes) and
    /// returns the record shape.
    fn idx_files(&self) -> Result<Vec<u64>> {
        let d = &self.cfg.data;
        let mut shapes = Vec::new();
        for (split, images, labels) in [
            ("train", &d.train_images, &d.train_labels),
            ("test", &d.test_images, &d.test_labels),
        ] {
            let ikey = format!("data.{split}_images");
            let lkey = format!("data.{split}_labels");
            let (n, rows, cols) = match self.idx_header(&ikey, images.as_deref(), 0x0803)?[..] {
                [n, r, c] => (n, r, c),
                _ => unreachable!("an image header has three dimensions"),
            };
            let m = self.idx_header(&lkey, labels.as_deref(), 0x0801)?[0];
            if n != m {
                return Err(self.err(
                    &lkey,
                    format!("holds {m} labels but `{ikey}` holds {n} images"),
                ));
            }
            if n == 0 {
                return Err(self.err(&ikey, "holds no images"));
            }
            shapes.push((ikey, vec![1, rows, cols]));
        }
        let (train, test) = (&shapes[0].1, &shapes[1].1);
        if train != test {
            return Err(self.err(
                &shapes[1].0,
                format!(
                    "images are {}×{} but the training images are {}×{}",
                    test[1], test[2], train[1], train[2]
                ),
            ));
        }
        Ok(train.clone())
    }

    /// The dimensions of the IDX file at `path` (gzip-compressed or raw), which must have
    /// `magic` (0x0803: u8 images, 3 dimensions; 0x0801: u8 labels, 1 dimension), checked before
    /// anything is derived from them: images of at least 1×1 pixels, a product that fits, and (for
    /// a raw file) exactly the file's length after the header.
    fn idx_header(&self, key: &str, path: Option<&Path>, magic: u32) -> Result<Vec<u64>> {
        let Some(path) = path else {
            return Err(self.err(key, "format \"idx\" needs this file"));
        };
        crate::data::idx::check_header(path, magic).map_err(|msg| self.err(key, msg))
    }

    /// Shape, classes and sizes of a synthetic source; returns (record shape, classes).
    fn synthetic(&self) -> Result<(Vec<u64>, usize)> {
        let d = &self.cfg.data;
        let need = |k: &str, what: &str| {
            self.err(
                &format!("data.{k}"),
                format!("format \"synthetic\" needs `{k}` ({what})"),
            )
        };
        let shape = d
            .shape
            .as_ref()
            .ok_or_else(|| need("shape", "1 to 3 dimensions, e.g. [1, 28, 28]"))?;
        if shape.is_empty() || shape.len() > 3 {
            return Err(self.err(
                "data.shape",
                format!("must have 1 to 3 dimensions, got {}", shape.len()),
            ));
        }
        if shape.contains(&0) {
            return Err(self.err(
                "data.shape",
                format!("dimensions must be at least 1, got {shape:?}"),
            ));
        }
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        match product(&dims) {
            Some(n) if n < crate::data::MAX_RECORD_ELEMS => {}
            _ => {
                return Err(self.err(
                    "data.shape",
                    format!("a record of {shape:?} has 2^31 or more elements"),
                ))
            }
        }
        // `classes`, `train_size` and `test_size` default as in `data::open` (10, MNIST's sizes).
        let classes = d.classes.unwrap_or(DEFAULT_CLASSES);
        if let Some(n) = d.train_size {
            self.at_least_one("data.train_size", n as u64)?;
        }
        if let Some(n) = d.test_size {
            self.at_least_one("data.test_size", n as u64)?;
        }
        // (C, H, W): missing leading dimensions are 1.
        let mut record = vec![1; 3 - dims.len()];
        record.extend(dims);
        Ok((record, classes))
    }
}
