//! `[data]` of the image formats (`lmdb`, `image_list`, `image_folder`): the keys they need or
//! reject, ImageNet's crop keys, and the record shape and classes read from the first record
//! (through `data`'s own reader), so that the net's input shape is known before anything is
//! allocated.

use super::*;
use crate::config::DataFormat;
use crate::data::images::{first_record_shape, FirstRecord};

/// The keys only the image formats take, and whether each is set.
fn image_keys(d: &crate::config::DataConfig) -> [(&'static str, bool); 13] {
    [
        ("train_source", d.train_source.is_some()),
        ("test_source", d.test_source.is_some()),
        ("root_folder", d.root_folder.is_some()),
        ("new_height", d.new_height > 0),
        ("new_width", d.new_width > 0),
        ("random_resized_crop", d.random_resized_crop > 0),
        ("crop_area", d.crop_area.is_some()),
        ("crop_aspect", d.crop_aspect.is_some()),
        ("resize_shorter", d.resize_shorter.is_some()),
        ("center_crop", d.center_crop.is_some()),
        ("is_color", !d.is_color),
        ("workers", d.workers > 0),
        (
            "jpeg_decoder",
            d.jpeg_decoder != crate::config::JpegDecoderKind::default(),
        ),
    ]
}

/// Whether `format` is one of the image formats.
pub(super) fn is_image_format(format: DataFormat) -> bool {
    matches!(
        format,
        DataFormat::Lmdb | DataFormat::ImageList | DataFormat::ImageFolder
    )
}

impl Validator<'_> {
    /// Rejects the image formats' keys under another format.
    pub(super) fn no_image_keys(&self, format: &str) -> Result<()> {
        if let Some((k, _)) = image_keys(&self.cfg.data).iter().find(|(_, set)| *set) {
            return Err(self.err(
                &format!("data.{k}"),
                format!(
                    "does not apply to format {format} (only to \"lmdb\", \"image_list\" and \
                     \"image_folder\")"
                ),
            ));
        }
        Ok(())
    }

    /// Checks an image format's keys and returns the net's input shape `(C, H, W)` (after the
    /// resized crop; a plain crop is applied by the caller) and the classes.
    pub(super) fn image_data(&self) -> Result<(Vec<u64>, usize, bool)> {
        let d = &self.cfg.data;
        if d.root_folder.is_some() && d.format != DataFormat::ImageList {
            return Err(self.err("data.root_folder", "applies to format \"image_list\" only"));
        }
        let need = |key: &str, p: &Option<std::path::PathBuf>| {
            p.clone().ok_or_else(|| {
                self.err(
                    &format!("data.{key}"),
                    "the image formats need `train_source` and `test_source`",
                )
            })
        };
        let train = need("train_source", &d.train_source)?;
        if d.workers > MAX_WORKER_THREADS {
            return Err(self.err(
                "data.workers",
                format!("at most {MAX_WORKER_THREADS}, got {}", d.workers),
            ));
        }
        need("test_source", &d.test_source)?;
        if (d.new_height > 0) != (d.new_width > 0) {
            let key = if d.new_height > 0 {
                "data.new_width"
            } else {
                "data.new_height"
            };
            return Err(self.err(key, "set `new_height` and `new_width` together"));
        }
        self.resized_crop_keys()?;
        let options = crate::data::decode_options(d);
        let root = d
            .root_folder
            .clone()
            .or_else(|| train.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_default();
        let first = match d.format {
            DataFormat::Lmdb => FirstRecord::Lmdb(&train),
            DataFormat::ImageList => FirstRecord::List(&train, &root),
            _ => FirstRecord::Folder(&train),
        };
        let shape = first_record_shape(first, options)
            .map_err(|e| self.err("data.train_source", format!("{}: {e}", train.display())))?;
        let classes = match (d.classes, d.format) {
            (Some(c), _) => c,
            (None, DataFormat::ImageFolder) => crate::data::image_files::class_names(&train)
                .map_err(|e| self.err("data.train_source", format!("{}: {e}", train.display())))?
                .len(),
            (None, _) => DEFAULT_CLASSES,
        };
        let mut record: Vec<u64> = shape.iter().map(|&v| v as u64).collect();
        let resized = d.random_resized_crop > 0;
        if resized {
            record[1] = d.random_resized_crop as u64;
            record[2] = d.random_resized_crop as u64;
        }
        Ok((record, classes, resized))
    }

    /// `random_resized_crop` and the keys that go with it.
    fn resized_crop_keys(&self) -> Result<()> {
        let d = &self.cfg.data;
        let side = d.random_resized_crop;
        if side == 0 {
            let companions = [
                ("crop_area", d.crop_area.is_some()),
                ("crop_aspect", d.crop_aspect.is_some()),
                ("resize_shorter", d.resize_shorter.is_some()),
                ("center_crop", d.center_crop.is_some()),
            ];
            if let Some((k, _)) = companions.iter().find(|(_, set)| *set) {
                return Err(self.err(
                    &format!("data.{k}"),
                    "applies with `random_resized_crop` only",
                ));
            }
            return Ok(());
        }
        if d.crop_size > 0 {
            return Err(self.err(
                "data.crop_size",
                "set `crop_size` (Caffe's crop) or `random_resized_crop`, not both",
            ));
        }
        if d.mean_file.is_some() {
            return Err(self.err(
                "data.mean_file",
                "a mean image does not apply to resized crops: use `mean_value`",
            ));
        }
        self.range_pair("data.crop_area", d.crop_area.as_deref(), 1.0)?;
        self.range_pair("data.crop_aspect", d.crop_aspect.as_deref(), f32::INFINITY)?;
        if let Some(c) = d.center_crop {
            if c != side {
                return Err(self.err(
                    "data.center_crop",
                    format!(
                        "must equal `random_resized_crop` ({side}): the net sees one input size, \
                         got {c}"
                    ),
                ));
            }
        }
        let shorter = d
            .resize_shorter
            .unwrap_or_else(|| crate::data::default_shorter(side));
        if shorter < side {
            return Err(self.err(
                "data.resize_shorter",
                format!("must be at least the crop's side {side}, got {shorter}"),
            ));
        }
        Ok(())
    }

    /// A `[min, max]` pair with `0 < min ≤ max ≤ top`.
    fn range_pair(&self, key: &str, v: Option<&[f32]>, top: f32) -> Result<()> {
        match v {
            None => Ok(()),
            Some([a, b]) if a.is_finite() && b.is_finite() && 0.0 < *a && a <= b && *b <= top => {
                Ok(())
            }
            Some(v) => Err(self.err(
                key,
                format!("must be [min, max] with 0 < min ≤ max ≤ {top}, got {v:?}"),
            )),
        }
    }
}
