//! Training and test data: the [`RecordSource`] trait and its sources (MNIST IDX files, CIFAR-10
//! binary batches, the bundled digits, deterministic synthetic records, and the image formats:
//! Caffe LMDBs, image lists and class folders, decoded by a pool of workers), the per-record
//! [`Transform`] (crop or ImageNet's resized crop, mirror, shift, per-channel mean and scale), the
//! topology-independent record order, test-set sharding, and the per-replica prefetching reader.
//!
//! # Which replica reads which records
//!
//! `batch_size` b is per replica and R is the total number of replicas. Iteration `it` with
//! `iter_size` S consists of micro-batches m = it·S + s for s in 0..S. The training stream is the
//! infinite sequence of positions p = 0, 1, 2, …; position p lies in epoch e = p / n (n = training
//! set size) and maps to record `perm_e[p % n]`, where `perm_e` depends only on (seed, e) (see
//! [`order::permutation`]; the identity when shuffling is off). Micro-batch m covers positions
//! [m·b·R, (m+1)·b·R) and the replica of universal rank r takes [m·b·R + r·b, m·b·R + (r+1)·b).
//! Hence one replica with batch b·R reads exactly the records that R replicas with batch b read,
//! in the same order when their batches are concatenated in rank order.
//!
//! The test set is cut into R contiguous shards, in file order, whose sizes differ by at most one
//! ([`test_shard`]); each replica reads its shard in batches of `test_batch_size`, the last one
//! possibly smaller ([`test_batches`]). Replicas may therefore see one batch more or fewer than
//! each other: reduce test metrics once per pass, not once per batch.

pub mod augment;
pub mod cifar10;
pub mod datum;
pub mod decode;
mod digits;
pub mod fingerprint;
pub mod idx;
pub mod image_files;
pub mod images;
pub mod libjpeg_turbo;
pub mod lmdb;
pub mod mean_file;
pub mod order;
pub mod reader;
pub mod resample;
pub mod synthetic;
#[cfg(test)]
pub(crate) mod test_util;
pub mod transform;

pub use augment::Augment;
pub use cifar10::Cifar10Source;
pub use idx::IdxSource;
pub use images::ImageSource;
pub use order::{micro_batch_positions, permutation, TrainOrder};
pub use reader::{
    fill_test_batch, fill_train_batch, Batch, BatchStream, Pixels, ReadyQueue, TrainReader,
};
pub use synthetic::SyntheticSource;
pub use transform::{Normalize, ResizedCrop, Scratch, Transform};

use crate::config::{CorruptMode, DataConfig, DataFormat, JpegDecoderKind, SyntheticPixels};
use crate::error::{Error, Result};
use crate::input_file::{open_regular, read_regular, InputError, UNBOUNDED};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// A random-access, in-memory (or computed) set of labelled records of one shape.
pub trait RecordSource: Send + Sync {
    /// Number of records.
    fn len(&self) -> usize;

    /// Whether the set has no records (never true for a source that [`open`] returns).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shape of one record, `[C, H, W]`.
    fn record_shape(&self) -> [usize; 3];

    /// Number of classes; every label is below it.
    fn classes(&self) -> usize;

    /// Writes record `index` as `(pixel − mean) · scale`, C·H·W floats in C, H, W order.
    /// `out.len()` must be [`record_size`]`(self)`; `index` must be below `len()`.
    fn fill(&self, index: usize, out: &mut [f32]);

    /// The label of record `index`.
    fn label(&self, index: usize) -> u32;

    /// A name for messages: the file, or what produced the records.
    fn name(&self) -> &str {
        "records"
    }

    /// Writes record `index` as [`fill`](Self::fill) does, or says which record cannot be read
    /// (an image source's corrupt file, exit 2). Returns the label of the record written, which
    /// is another than `index`'s when unreadable records were skipped.
    fn try_fill(&self, index: usize, out: &mut [f32]) -> Result<Read> {
        self.fill(index, out);
        Ok(Read {
            label: self.label(index),
            skipped: 0,
        })
    }

    /// Reads record `index` as an 8-bit image of its own size, for the resampling transforms;
    /// only the image formats' sources can.
    fn read_image(&self, index: usize, image: &mut decode::Image) -> Result<Read> {
        let _ = (index, image);
        Err(Error::data(
            self.name(),
            "its records are not images: `random_resized_crop` needs format \"lmdb\", \
             \"image_list\" or \"image_folder\"",
        ))
    }

    /// Reads record `index` as [`read_image`](Self::read_image) does, but only the part of the
    /// image that `view(height, width)` names where the source can decode a part (libjpeg-turbo's
    /// JPEGs); returns what was read and the view's window in `image`'s coordinates. `view` is
    /// called once per record tried (again for a record read in place of an unreadable one).
    fn read_view(
        &self,
        index: usize,
        view: &mut dyn FnMut(usize, usize) -> decode::View,
        image: &mut decode::Image,
    ) -> Result<(Read, resample::Window)> {
        let read = self.read_image(index, image)?;
        Ok((read, view(image.height, image.width).window))
    }

    /// Whether every value [`fill`](Self::fill) writes is a whole 8-bit pixel, 0 to 255 (raw
    /// bytes): the reader may then hand batches on as 8-bit pixels (see
    /// [`Transform::u8_batches`]).
    fn values_are_u8(&self) -> bool {
        false
    }

    /// The workers that decode this source's records, when it has them: the training reader's
    /// jobs run on them, and a test batch's records are filled in parallel on them.
    fn workers(&self) -> Option<&rayon::ThreadPool> {
        None
    }

    /// Pushes the words that identify record `index` for [`fingerprint`]: by default the bits
    /// of its values.
    fn print_words(&self, index: usize, words: &mut Vec<u64>) {
        let mut values = vec![0.0f32; record_size(self)];
        self.fill(index, &mut values);
        words.extend(values.iter().map(|v| u64::from(v.to_bits())));
    }
}

/// What reading a record gave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Read {
    /// The label of the record written.
    pub label: u32,
    /// Unreadable records skipped to reach it (`data.on_corrupt = "skip"`).
    pub skipped: u32,
}

/// Floats per record: C·H·W.
pub fn record_size<S: RecordSource + ?Sized>(source: &S) -> usize {
    source.record_shape().iter().product()
}

/// The two halves of a data set and the transform between their records and the net.
#[derive(Clone)]
pub struct DataSplit {
    pub train: Arc<dyn RecordSource>,
    pub test: Arc<dyn RecordSource>,
    /// Applied to both halves (train mode to `train`, test mode to `test`).
    pub transform: Transform,
}

impl DataSplit {
    /// `(C, H, W)` of the net's `data` blob per record: the records after the transform.
    pub fn input_shape(&self) -> [usize; 3] {
        self.transform.output_shape()
    }
}

impl std::fmt::Debug for DataSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |s: &Arc<dyn RecordSource>| {
            format!(
                "{} ({} records of {}, {} classes)",
                s.name(),
                s.len(),
                fmt_shape(s.record_shape()),
                s.classes()
            )
        };
        f.debug_struct("DataSplit")
            .field("train", &side(&self.train))
            .field("test", &side(&self.test))
            .field("input", &fmt_shape(self.input_shape()))
            .finish()
    }
}

/// Which half of a data set; keys the synthetic generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

/// Classes when `classes` is not set.
pub const DEFAULT_CLASSES: usize = 10;
/// Record elements of a synthetic shape or an IDX image must stay below this (2^31).
pub const MAX_RECORD_ELEMS: u64 = 1 << 31;
/// Synthetic record shape when `shape` is not set (MNIST's).
pub const DEFAULT_SYNTHETIC_SHAPE: [usize; 3] = [1, 28, 28];
/// Synthetic training-set size when `train_size` is not set (MNIST's).
pub const DEFAULT_SYNTHETIC_TRAIN: usize = 60_000;
/// Synthetic test-set size when `test_size` is not set (MNIST's).
pub const DEFAULT_SYNTHETIC_TEST: usize = 10_000;

/// Opens the training and test sets that `cfg` describes. `seed` keys the synthetic generator
/// and the random crops, flips and shifts (the record order is keyed separately by
/// [`TrainOrder`]); `local_ranks` (the ranks on this node) sizes the decode workers of the image
/// formats when `data.workers` is 0.
///
/// Checks that both sets are non-empty, that every label is below the class count
/// (`cfg.classes`, default 10), that train and test records have the same shape and that the
/// transform keys fit it (a `mean_file` is read and must hold an image of the records' shape).
/// Sources are opened raw; the transform normalises.
pub fn open(cfg: &DataConfig, seed: u64, local_ranks: usize) -> Result<DataSplit> {
    let (train, test) = open_sources(cfg, seed, local_ranks)?;
    let transform = transform_of(cfg, train.record_shape(), seed)?;
    Ok(DataSplit {
        train,
        test,
        transform,
    })
}

/// The raw training and test sources of `cfg` (no transform), checked as by [`open`]; what
/// `p2ptrain compute-mean` averages.
pub fn open_sources(
    cfg: &DataConfig,
    seed: u64,
    local_ranks: usize,
) -> Result<(Arc<dyn RecordSource>, Arc<dyn RecordSource>)> {
    let classes = cfg.classes.unwrap_or(DEFAULT_CLASSES);
    if classes == 0 {
        return Err(config_error("data.classes", "must be at least 1"));
    }
    let (train, test): (Arc<dyn RecordSource>, Arc<dyn RecordSource>) = match cfg.format {
        DataFormat::Idx => {
            let path = |p: &Option<std::path::PathBuf>, key: &str| {
                p.clone().ok_or_else(|| {
                    config_error(&format!("data.{key}"), "required when format = \"idx\"")
                })
            };
            let train_images = path(&cfg.train_images, "train_images")?;
            let train_labels = path(&cfg.train_labels, "train_labels")?;
            let test_images = path(&cfg.test_images, "test_images")?;
            let test_labels = path(&cfg.test_labels, "test_labels")?;
            let train = IdxSource::open(&train_images, &train_labels, classes, 0.0, 1.0)?;
            let test = IdxSource::open(&test_images, &test_labels, classes, 0.0, 1.0)?;
            (
                Arc::new(train) as Arc<dyn RecordSource>,
                Arc::new(test) as Arc<dyn RecordSource>,
            )
        }
        DataFormat::Cifar10 => {
            let files = |p: &Option<Vec<std::path::PathBuf>>, key: &str| {
                p.clone().ok_or_else(|| {
                    config_error(&format!("data.{key}"), "required when format = \"cifar10\"")
                })
            };
            let train_files = files(&cfg.train_files, "train_files")?;
            let test_files = files(&cfg.test_files, "test_files")?;
            let train = Cifar10Source::open("data.train_files", &train_files, classes)?;
            let test = Cifar10Source::open("data.test_files", &test_files, classes)?;
            (
                Arc::new(train) as Arc<dyn RecordSource>,
                Arc::new(test) as Arc<dyn RecordSource>,
            )
        }
        DataFormat::Digits => {
            let (train, test) = digits::open(classes, 0.0, 1.0)?;
            (
                Arc::new(train) as Arc<dyn RecordSource>,
                Arc::new(test) as Arc<dyn RecordSource>,
            )
        }
        DataFormat::Synthetic => {
            let shape = match &cfg.shape {
                Some(s) => synthetic::pad_shape(s)?,
                None => DEFAULT_SYNTHETIC_SHAPE,
            };
            let train_size = cfg.train_size.unwrap_or(DEFAULT_SYNTHETIC_TRAIN);
            let test_size = cfg.test_size.unwrap_or(DEFAULT_SYNTHETIC_TEST);
            if train_size == 0 {
                return Err(config_error("data.train_size", "must be at least 1"));
            }
            if test_size == 0 {
                return Err(config_error("data.test_size", "must be at least 1"));
            }
            let make = |split, len| {
                let source = SyntheticSource::new(shape, classes, len, seed, split);
                match cfg.pixels.unwrap_or_default() {
                    SyntheticPixels::Float => source,
                    SyntheticPixels::U8 => source.with_u8_pixels(),
                }
            };
            (
                Arc::new(make(Split::Train, train_size)) as Arc<dyn RecordSource>,
                Arc::new(make(Split::Test, test_size)) as Arc<dyn RecordSource>,
            )
        }
        DataFormat::Lmdb | DataFormat::ImageList | DataFormat::ImageFolder => {
            let (train, test) = open_images(cfg, classes, local_ranks)?;
            (
                Arc::new(train) as Arc<dyn RecordSource>,
                Arc::new(test) as Arc<dyn RecordSource>,
            )
        }
    };
    check_split(&train, &test, cfg.random_resized_crop > 0)?;
    Ok((train, test))
}

/// Decode workers per rank: `data.workers`, or the node's cores divided among its ranks.
pub fn decode_workers(cfg: &DataConfig, local_ranks: usize) -> usize {
    match cfg.workers {
        0 => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores / local_ranks.max(1)).max(1)
        }
        n => n,
    }
}

/// How the image formats decode, from `cfg`.
pub fn decode_options(cfg: &DataConfig) -> images::DecodeOptions {
    images::DecodeOptions {
        color: cfg.is_color,
        resize: (cfg.new_height > 0).then_some((cfg.new_height, cfg.new_width)),
        on_corrupt: match cfg.on_corrupt {
            CorruptMode::Stop => images::OnCorrupt::Stop,
            CorruptMode::Skip => images::OnCorrupt::Skip,
        },
        jpeg: match cfg.jpeg_decoder {
            JpegDecoderKind::Zune => decode::JpegDecoder::Zune,
            JpegDecoderKind::JpegDecoder => decode::JpegDecoder::JpegDecoderCrate,
            JpegDecoderKind::LibjpegTurbo => decode::JpegDecoder::LibjpegTurbo,
        },
    }
}

/// The training and test sources of an image format, sharing one pool of decode workers.
fn open_images(
    cfg: &DataConfig,
    classes: usize,
    local_ranks: usize,
) -> Result<(ImageSource, ImageSource)> {
    let path = |p: &Option<std::path::PathBuf>, key: &str| {
        p.clone().ok_or_else(|| {
            config_error(
                &format!("data.{key}"),
                "required by the image formats (lmdb, image_list, image_folder)",
            )
        })
    };
    let train = path(&cfg.train_source, "train_source")?;
    let test = path(&cfg.test_source, "test_source")?;
    let options = decode_options(cfg);
    let pool = images::worker_pool(decode_workers(cfg, local_ranks));
    let open_one = |source: &Path, class_names: &[String]| -> Result<ImageSource> {
        let pool = Arc::clone(&pool);
        match cfg.format {
            DataFormat::Lmdb => ImageSource::lmdb(source, classes, options, pool),
            DataFormat::ImageList => {
                let root = cfg
                    .root_folder
                    .clone()
                    .or_else(|| source.parent().map(Path::to_path_buf))
                    .unwrap_or_default();
                let list =
                    image_files::read_list(source, &root).map_err(|e| Error::data(source, e))?;
                ImageSource::files(source, list, classes, options, pool)
            }
            _ => {
                let list = image_files::read_folder(source, class_names)
                    .map_err(|e| Error::data(source, e))?;
                ImageSource::files(source, list, classes, options, pool)
            }
        }
    };
    let class_names = match cfg.format {
        DataFormat::ImageFolder => {
            image_files::class_names(&train).map_err(|e| Error::data(&train, e))?
        }
        _ => Vec::new(),
    };
    Ok((
        open_one(&train, &class_names)?,
        open_one(&test, &class_names)?,
    ))
}

/// The transform of `cfg` for records of `shape`, its keys checked against the shape (what
/// `predict` applies to its inputs too).
pub fn transform_of(cfg: &DataConfig, shape: [usize; 3], seed: u64) -> Result<Transform> {
    let [c, h, w] = shape;
    let mean = match &cfg.mean_value {
        Some(m) if m.len() == 1 || m.len() == c => m.clone(),
        Some(m) => {
            return Err(config_error(
                "data.mean_value",
                format!(
                    "{} values for records of {c} channels: give 1 or {c}",
                    m.len()
                ),
            ))
        }
        None => vec![cfg.mean],
    };
    if cfg.random_resized_crop > 0 {
        return Ok(
            Transform::new(shape, 0, cfg.mirror, &mean, cfg.scale, cfg.shift, seed)
                .with_resized_crop(resized_crop_of(cfg)),
        );
    }
    let mean_image = match &cfg.mean_file {
        Some(path) => Some(mean_image_of(path, shape)?),
        None => None,
    };
    if cfg.crop_size > h.min(w) {
        return Err(config_error(
            "data.crop_size",
            format!("{} exceeds the records' {h}×{w}", cfg.crop_size),
        ));
    }
    let side = if cfg.crop_size > 0 {
        cfg.crop_size
    } else {
        h.min(w)
    };
    if cfg.shift > 0 && cfg.shift >= side {
        return Err(config_error(
            "data.shift",
            format!(
                "must be smaller than the input's side {side}, got {}",
                cfg.shift
            ),
        ));
    }
    let transform = Transform::new(
        shape,
        cfg.crop_size,
        cfg.mirror,
        &mean,
        cfg.scale,
        cfg.shift,
        seed,
    );
    Ok(match mean_image {
        Some(image) => transform.with_mean_image(image),
        None => transform,
    })
}

/// `random_resized_crop` and its companions, defaults filled in (validation checked them).
pub fn resized_crop_of(cfg: &DataConfig) -> ResizedCrop {
    let pair = |v: &Option<Vec<f32>>, default: (f64, f64)| match v.as_deref() {
        Some([a, b]) => (f64::from(*a), f64::from(*b)),
        _ => default,
    };
    let side = cfg.random_resized_crop;
    ResizedCrop {
        side,
        area: pair(&cfg.crop_area, (0.08, 1.0)),
        aspect: pair(&cfg.crop_aspect, (3.0 / 4.0, 4.0 / 3.0)),
        shorter: cfg.resize_shorter.unwrap_or_else(|| default_shorter(side)),
    }
}

/// The test resize of a `side` crop when `resize_shorter` is not set: `side / 0.875`, rounded
/// (256 for 224, ImageNet's).
pub fn default_shorter(side: usize) -> usize {
    (side as f64 / 0.875).round() as usize
}

/// The per-pixel means of the mean file at `path`, which must hold one image of the records'
/// `shape`.
fn mean_image_of(path: &Path, shape: [usize; 3]) -> Result<Vec<f32>> {
    let image = mean_file::read(path).map_err(|e| match e {
        Error::Data { path, msg } => Error::Data {
            path,
            msg: format!("`data.mean_file`: {msg}"),
        },
        other => other,
    })?;
    if image.shape != shape {
        return Err(Error::data(
            path,
            format!(
                "`data.mean_file`: the image is {}, the records are {}",
                fmt_shape(image.shape),
                fmt_shape(shape)
            ),
        ));
    }
    Ok(image.data)
}

/// Both halves non-empty, same record shape (the same channels when records are resampled).
fn check_split(
    train: &Arc<dyn RecordSource>,
    test: &Arc<dyn RecordSource>,
    resampled: bool,
) -> Result<()> {
    for s in [train, test] {
        if s.is_empty() {
            return Err(Error::data(s.name(), "contains no records"));
        }
    }
    let (a, b) = (train.record_shape(), test.record_shape());
    if (resampled && a[0] != b[0]) || (!resampled && a != b) {
        return Err(Error::data(
            test.name(),
            format!(
                "records are {} but the training set's ({}) are {}",
                fmt_shape(b),
                train.name(),
                fmt_shape(a)
            ),
        ));
    }
    Ok(())
}

/// `C×H×W`.
pub fn fmt_shape(s: [usize; 3]) -> String {
    format!("{}×{}×{}", s[0], s[1], s[2])
}

/// A config error about `key` found while opening the data (no file position known here).
fn config_error(key: &str, msg: impl std::fmt::Display) -> Error {
    Error::Config {
        file: "config".to_string(),
        pos: None,
        key: key.to_string(),
        msg: msg.to_string(),
    }
}

/// The test records of replica `r` of `replicas`: the r-th of `replicas` contiguous ranges that
/// cover 0..n in order, with sizes differing by at most one (the first n % replicas are longer).
pub fn test_shard(n: usize, r: usize, replicas: usize) -> Range<usize> {
    assert!(
        replicas > 0 && r < replicas,
        "rank {r} of {replicas} replicas"
    );
    let (base, rem) = (n / replicas, n % replicas);
    let start = r * base + r.min(rem);
    let len = base + usize::from(r < rem);
    start..start + len
}

/// The batches of a test shard: consecutive ranges of `batch` records (the last possibly smaller),
/// at most `test_iter` of them when it is set.
pub fn test_batches(
    shard: Range<usize>,
    batch: usize,
    test_iter: Option<u64>,
) -> impl Iterator<Item = Range<usize>> {
    assert!(batch > 0, "test batch size must be positive");
    let end = shard.end;
    let cap = test_iter.map_or(usize::MAX, |t| usize::try_from(t).unwrap_or(usize::MAX));
    shard
        .step_by(batch)
        .map(move |s| s..(s + batch).min(end))
        .take(cap)
}

/// Reads a whole file, naming it in the error.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    read_regular(path, UNBOUNDED).map_err(|e| match e {
        InputError::Missing | InputError::NotRegular(_) => Error::data(path, e),
        _ => Error::data(path, format!("cannot read: {e}")),
    })
}

/// The input file at `path`, opened for a check before it is read, and its length; the error
/// is a message naming the file.
pub(crate) fn open_checked(path: &Path) -> std::result::Result<(std::fs::File, u64), String> {
    let shown = path.display();
    open_regular(path).map_err(|e| match e {
        InputError::Missing => format!("file not found: {shown}"),
        InputError::NotRegular(_) => format!("not a file: {shown} ({e})"),
        _ => format!("cannot read {shown}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_shards_cover_the_set_exactly_once() {
        for n in [0usize, 1, 2, 3, 7, 10, 297, 1000] {
            for replicas in 1..=9 {
                let mut next = 0;
                let mut sizes = Vec::new();
                for r in 0..replicas {
                    let s = test_shard(n, r, replicas);
                    assert_eq!(s.start, next, "n {n} R {replicas} r {r}");
                    next = s.end;
                    sizes.push(s.len());
                }
                assert_eq!(next, n);
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "n {n} R {replicas}: {sizes:?}");
            }
        }
    }

    #[test]
    fn test_batches_split_a_shard() {
        let b: Vec<_> = test_batches(10..17, 3, None).collect();
        assert_eq!(b, vec![10..13, 13..16, 16..17]);
        let b: Vec<_> = test_batches(10..17, 3, Some(2)).collect();
        assert_eq!(b, vec![10..13, 13..16]);
        assert_eq!(test_batches(5..5, 3, None).count(), 0);
        let all: Vec<usize> = (0..4)
            .flat_map(|r| test_batches(test_shard(297, r, 4), 32, None))
            .flatten()
            .collect();
        assert_eq!(all, (0..297).collect::<Vec<_>>());
    }

    fn cfg(format: DataFormat) -> DataConfig {
        DataConfig {
            format,
            train_images: None,
            train_labels: None,
            test_images: None,
            test_labels: None,
            train_files: None,
            test_files: None,
            batch_size: 8,
            test_batch_size: None,
            shuffle: true,
            scale: 1.0,
            mean: 0.0,
            mean_value: None,
            mean_file: None,
            crop_size: 0,
            mirror: false,
            classes: None,
            shape: None,
            train_size: None,
            test_size: None,
            pixels: None,
            shift: 0,
            prefetch: 2,
            train_source: None,
            test_source: None,
            root_folder: None,
            is_color: true,
            new_height: 0,
            new_width: 0,
            random_resized_crop: 0,
            crop_area: None,
            crop_aspect: None,
            resize_shorter: None,
            center_crop: None,
            workers: 1,
            on_corrupt: CorruptMode::Stop,
            jpeg_decoder: JpegDecoderKind::Zune,
        }
    }

    #[test]
    fn open_digits() {
        let mut c = cfg(DataFormat::Digits);
        c.scale = 1.0 / 256.0;
        let s = open(&c, 1, 1).unwrap();
        assert_eq!((s.train.len(), s.test.len()), (1500, 297));
        assert_eq!(s.train.record_shape(), [1, 8, 8]);
        assert_eq!(s.train.classes(), 10);
        let mut out = vec![0.0; 64];
        s.transform
            .test(&*s.train, 0, &mut out, &mut Scratch::default())
            .unwrap();
        assert!(out.iter().all(|&v| (0.0..1.0).contains(&v)));
        s.train.fill(0, &mut out); // sources are raw
        assert!(out.iter().any(|&v| v > 1.0));
        c.classes = Some(5);
        let e = open(&c, 1, 1).unwrap_err().to_string();
        assert!(e.contains("not below classes = 5"), "{e}");
    }

    #[test]
    fn open_synthetic() {
        let mut c = cfg(DataFormat::Synthetic);
        c.shape = Some(vec![3, 4, 5]);
        c.train_size = Some(100);
        c.test_size = Some(20);
        c.classes = Some(7);
        let s = open(&c, 9, 1).unwrap();
        assert_eq!((s.train.len(), s.test.len()), (100, 20));
        assert_eq!(s.test.record_shape(), [3, 4, 5]);
        assert!((0..100).all(|i| s.train.label(i) < 7));
        c.shape = Some(vec![]);
        assert!(open(&c, 9, 1).is_err());
        c.shape = Some(vec![2, 0]);
        assert!(open(&c, 9, 1).is_err());
        c.shape = None;
        c.test_size = Some(0);
        assert!(open(&c, 9, 1).is_err());
    }

    #[test]
    fn open_cifar10_with_crop_mirror_and_channel_means() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, n: usize, first: usize| {
            let p = dir.path().join(name);
            std::fs::write(&p, cifar10::tests::batch_bytes(n, first)).unwrap();
            p
        };
        let mut c = cfg(DataFormat::Cifar10);
        let e = open(&c, 1, 1).unwrap_err().to_string();
        assert!(e.contains("data.train_files"), "{e}");
        c.train_files = Some(vec![write("b1.bin", 4, 0), write("b2.bin", 3, 4)]);
        c.test_files = Some(vec![write("t.bin", 5, 0)]);
        c.crop_size = 28;
        c.mirror = true;
        c.mean_value = Some(vec![1.0, 2.0, 3.0]);
        c.scale = 0.5;
        let s = open(&c, 3, 1).unwrap();
        assert_eq!((s.train.len(), s.test.len()), (7, 5));
        assert_eq!(s.train.record_shape(), [3, 32, 32]);
        assert_eq!(s.input_shape(), [3, 28, 28]);
        // Test record 1, centre crop at (2, 2): pixel (c, y, x) = (3 + c·1024 + 32(y+2) + x+2) mod 256.
        let mut out = vec![0.0; 3 * 28 * 28];
        s.transform
            .test(&*s.test, 1, &mut out, &mut Scratch::default())
            .unwrap();
        for (ch, m) in [1.0f32, 2.0, 3.0].iter().enumerate() {
            let raw = (3 + ch * 1024 + 2 * 32 + 2) % 256;
            assert_eq!(out[ch * 784], (raw as f32 - m) * 0.5);
        }
        c.mean_value = Some(vec![1.0, 2.0]);
        let e = open(&c, 3, 1).unwrap_err().to_string();
        assert!(
            e.contains("data.mean_value") && e.contains("give 1 or 3"),
            "{e}"
        );
        c.mean_value = None;
        c.crop_size = 33;
        let e = open(&c, 3, 1).unwrap_err().to_string();
        assert!(e.contains("data.crop_size"), "{e}");
    }

    #[test]
    fn open_idx_needs_paths_and_equal_shapes() {
        let c = cfg(DataFormat::Idx);
        let e = open(&c, 1, 1).unwrap_err().to_string();
        assert!(e.contains("data.train_images"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: Vec<u8>| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let mut c = cfg(DataFormat::Idx);
        c.train_images = Some(write("tri", idx::tests::images_bytes(3, 2, 2)));
        c.train_labels = Some(write("trl", crate::input_files::idx_labels(3)));
        c.test_images = Some(write("tei", idx::tests::images_bytes(2, 2, 3)));
        c.test_labels = Some(write("tel", crate::input_files::idx_labels(2)));
        let e = open(&c, 1, 1).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = e.to_string();
        assert!(
            e.contains("tei") && e.contains("1×2×3") && e.contains("1×2×2"),
            "{e}"
        );
        c.test_images = Some(write("tei", idx::tests::images_bytes(2, 2, 2)));
        let s = open(&c, 1, 1).unwrap();
        assert_eq!((s.train.len(), s.test.len()), (3, 2));
        c.test_labels = Some(dir.path().join("missing"));
        let e = open(&c, 1, 1).unwrap_err().to_string();
        assert!(e.contains("missing: no such file"), "{e}");
    }
}
