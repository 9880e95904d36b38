//! [`ImageSource`]: the record source of the image formats — Caffe LMDBs (`format = "lmdb"`),
//! list files (`"image_list"`) and class folders (`"image_folder"`) — over raw `Datum` pixels,
//! `float_data`, or JPEG/PNG files decoded on the fly ([`super::decode`]), with Caffe's
//! `is_color` and `new_height`/`new_width` resize, and what to do with a record that cannot be
//! read (`data.on_corrupt`).
//!
//! A record's shape is its own: raw `Datum`s carry theirs, files have their decoded size (or
//! `new_height`×`new_width`). [`RecordSource::record_shape`] is the first record's; reading a
//! record of another shape whole ([`RecordSource::try_fill`]) is an error naming it, while
//! [`RecordSource::read_image`] reads any size for the resampling transforms, and
//! [`RecordSource::read_view`] the part of it a resampled window needs (the JPEGs libjpeg-turbo
//! decodes; records resized by `new_height`/`new_width` are read whole).
//!
//! Unreadable records (a corrupt or truncated image, a `Datum` whose sizes do not match its
//! bytes) are named with their file or LMDB key: with `on_corrupt = "stop"` the read fails (exit
//! 2); with `"skip"` the next readable record in index order takes its place (the same one on
//! every replica, whatever the topology) and the skip is counted and logged once.
//!
//! The decode workers (`data.workers` threads, a pool shared by both halves of a data set) fill
//! the records of a batch in parallel.

use super::datum::DatumView;
use super::decode::{self, Image, JpegDecoder, View};
use super::image_files::FileList;
use super::lmdb::LmdbStore;
use super::resample::{self, Window};
use super::{Read, RecordSource};
use crate::error::{Error, Result};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What to do with a record that cannot be read (`data.on_corrupt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnCorrupt {
    /// Fail with an error naming the record (exit 2).
    #[default]
    Stop,
    /// Read the next readable record instead; count and log the skip.
    Skip,
}

/// How records are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Encoded images as 3 channels (BGR) or 1 (grey): Caffe's `is_color`.
    pub color: bool,
    /// Caffe's `new_height`, `new_width`: every decoded image resized to this.
    pub resize: Option<(usize, usize)>,
    pub on_corrupt: OnCorrupt,
    pub jpeg: JpegDecoder,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            color: true,
            resize: None,
            on_corrupt: OnCorrupt::Stop,
            jpeg: JpegDecoder::default(),
        }
    }
}

/// Where the records are.
#[derive(Debug)]
enum Store {
    Lmdb(LmdbStore),
    Files(Vec<PathBuf>),
}

/// One record as stored, borrowed.
enum Stored<'a> {
    /// u8 `(C, H, W)`.
    Raw([usize; 3], &'a [u8]),
    /// f32 `(C, H, W)`.
    Floats([usize; 3], DatumView<'a>),
    /// A JPEG or PNG file.
    Encoded(&'a [u8]),
}

/// Records of image files or `Datum`s; see the module docs.
pub struct ImageSource {
    name: String,
    store: Store,
    labels: Vec<u32>,
    classes: usize,
    options: DecodeOptions,
    shape: [usize; 3],
    workers: Arc<rayon::ThreadPool>,
    /// Records found unreadable (logged once each).
    corrupt: Mutex<HashSet<usize>>,
}

impl std::fmt::Debug for ImageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageSource({}, {:?})", self.name, self.store)
    }
}

/// A pool of `threads` decode workers.
pub fn worker_pool(threads: usize) -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("p2ptrain-decode-{i}"))
            .build()
            .expect("starting the decode workers"),
    )
}

impl ImageSource {
    /// The LMDB folder `path`.
    pub fn lmdb(
        path: &Path,
        classes: usize,
        options: DecodeOptions,
        workers: Arc<rayon::ThreadPool>,
    ) -> Result<Self> {
        let store = LmdbStore::open(path).map_err(|e| Error::data(path, e))?;
        let labels = store.labels().to_vec();
        Self::new(path, Store::Lmdb(store), &labels, classes, options, workers)
    }

    /// The image files of `list` (read from a list file or a folder tree named `name`).
    pub fn files(
        name: &Path,
        list: FileList,
        classes: usize,
        options: DecodeOptions,
        workers: Arc<rayon::ThreadPool>,
    ) -> Result<Self> {
        Self::new(
            name,
            Store::Files(list.files),
            &list.labels,
            classes,
            options,
            workers,
        )
    }

    fn new(
        name: &Path,
        store: Store,
        labels: &[i64],
        classes: usize,
        options: DecodeOptions,
        workers: Arc<rayon::ThreadPool>,
    ) -> Result<Self> {
        let mut source = ImageSource {
            name: name.display().to_string(),
            store,
            labels: Vec::with_capacity(labels.len()),
            classes,
            options,
            shape: [0; 3],
            workers,
            corrupt: Mutex::new(HashSet::new()),
        };
        for (i, &label) in labels.iter().enumerate() {
            if label < 0 || label >= classes as i64 {
                return Err(Error::data(
                    source.record_name(i),
                    format!("label {label} is not below classes = {classes} (nor negative)"),
                ));
            }
            source.labels.push(label as u32);
        }
        if !source.labels.is_empty() {
            source.shape = source.first_shape()?;
        }
        Ok(source)
    }

    /// `C×H×W` of the first readable record.
    fn first_shape(&self) -> Result<[usize; 3]> {
        let mut image = Image::default();
        let n = self.labels.len();
        let mut first_error = None;
        for i in 0..n {
            match self.shape_of(i, &mut image) {
                Ok(shape) => return Ok(shape),
                Err(e) if self.options.on_corrupt == OnCorrupt::Skip => {
                    first_error.get_or_insert(e);
                }
                Err(e) => return Err(Error::data(self.record_name(i), e)),
            }
        }
        let e = first_error.unwrap_or_default();
        Err(Error::data(&self.name, format!("no readable record ({e})")))
    }

    /// The shape record `index` is read whole as.
    fn shape_of(&self, index: usize, image: &mut Image) -> std::result::Result<[usize; 3], String> {
        self.with_stored(index, |stored| match stored {
            Stored::Raw(shape, _) | Stored::Floats(shape, _) => Ok(shape),
            Stored::Encoded(bytes) => {
                decode::decode(bytes, self.options.color, self.options.jpeg, image)?;
                let (h, w) = self.options.resize.unwrap_or((image.height, image.width));
                Ok([image.channels, h, w])
            }
        })
    }

    /// The record's file, or the LMDB and the record's key, for messages.
    pub fn record_name(&self, index: usize) -> String {
        match &self.store {
            Store::Lmdb(db) => format!("{} (record {index}, key `{}`)", self.name, db.key(index)),
            Store::Files(files) => files[index].display().to_string(),
        }
    }

    /// Calls `f` with record `index` as stored.
    fn with_stored<R>(
        &self,
        index: usize,
        f: impl FnOnce(Stored<'_>) -> std::result::Result<R, String>,
    ) -> std::result::Result<R, String> {
        match &self.store {
            Store::Lmdb(db) => db.with_value(index, |bytes| f(stored_datum(bytes)?)),
            Store::Files(files) => {
                let bytes =
                    std::fs::read(&files[index]).map_err(|e| format!("cannot read: {e}"))?;
                f(Stored::Encoded(&bytes))
            }
        }
    }

    /// Reads record `index` as an image (resized when `new_height`/`new_width` are set).
    fn image_of(
        &self,
        index: usize,
        image: &mut Image,
        scratch: &mut resample::Resampler,
    ) -> std::result::Result<(), String> {
        self.view_of(index, &mut View::whole, image)?;
        if let Some((h, w)) = self.options.resize {
            let resized = resample::resize_bytes(image, h, w, scratch);
            image.set_planar([image.channels, h, w], &resized);
        }
        Ok(())
    }

    /// Reads the part of record `index` that `view(height, width)` needs (all of it unless
    /// the decoder can decode a part); the view's window in `image`'s coordinates.
    fn view_of(
        &self,
        index: usize,
        view: &mut dyn FnMut(usize, usize) -> View,
        image: &mut Image,
    ) -> std::result::Result<Window, String> {
        self.with_stored(index, |stored| match stored {
            Stored::Raw(shape, bytes) => {
                image.set_planar(shape, bytes);
                Ok(view(image.height, image.width).window)
            }
            Stored::Floats(..) => {
                Err("holds float_data, which the resizing transforms do not read".into())
            }
            Stored::Encoded(bytes) => {
                let (color, jpeg) = (self.options.color, self.options.jpeg);
                decode::decode_view(bytes, color, jpeg, view, image)
            }
        })
    }

    /// Writes record `index`, which must have the source's shape, as floats.
    fn fill_one(
        &self,
        index: usize,
        out: &mut [f32],
        image: &mut Image,
    ) -> std::result::Result<(), String> {
        let want = self.shape;
        let wrong = |got: [usize; 3]| {
            format!(
                "the record is {}, the first record {}: set `new_height` and `new_width` or \
                 `random_resized_crop` to read records of several sizes",
                super::fmt_shape(got),
                super::fmt_shape(want)
            )
        };
        let needs_image = self.with_stored(index, |stored| match stored {
            Stored::Raw(shape, bytes) if self.options.resize.is_none() => {
                if shape != want {
                    return Err(wrong(shape));
                }
                out.iter_mut()
                    .zip(bytes)
                    .for_each(|(o, &b)| *o = f32::from(b));
                Ok(false)
            }
            Stored::Floats(shape, view) => {
                if shape != want {
                    return Err(wrong(shape));
                }
                out.iter_mut().zip(view.floats()).for_each(|(o, v)| *o = v);
                Ok(false)
            }
            _ => Ok(true),
        })?;
        if needs_image {
            let mut scratch = resample::Resampler::default();
            self.image_of(index, image, &mut scratch)?;
            let got = [image.channels, image.height, image.width];
            if got != want {
                return Err(wrong(got));
            }
            let plane = image.height * image.width;
            for (i, px) in image.pixels.chunks_exact(image.channels).enumerate() {
                for (c, &v) in px.iter().enumerate() {
                    out[c * plane + i] = f32::from(v);
                }
            }
        }
        Ok(())
    }

    /// Tries `read` on record `index`, then (with `on_corrupt = "skip"`) on the next ones; the
    /// label and the skips of the record read.
    fn read_or_skip(
        &self,
        index: usize,
        mut read: impl FnMut(usize) -> std::result::Result<(), String>,
    ) -> Result<Read> {
        let n = self.labels.len();
        for skipped in 0..n {
            let i = (index + skipped) % n;
            match read(i) {
                Ok(()) => {
                    return Ok(Read {
                        label: self.labels[i],
                        skipped: skipped as u32,
                    })
                }
                Err(e) if self.options.on_corrupt == OnCorrupt::Skip => {
                    self.note_corrupt(i, &e);
                }
                Err(e) => {
                    return Err(Error::data(
                        self.record_name(i),
                        format!("{e} (`data.on_corrupt = \"skip\"` skips unreadable records)"),
                    ))
                }
            }
        }
        Err(Error::data(&self.name, "no record is readable"))
    }

    /// Logs an unreadable record the first time it is met.
    fn note_corrupt(&self, index: usize, why: &str) {
        let first = self
            .corrupt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(index);
        if first {
            tracing::warn!(
                "skipping unreadable record {}: {why}",
                self.record_name(index)
            );
        }
    }
}

/// Where the first record of an image source is.
#[derive(Debug, Clone, Copy)]
pub enum FirstRecord<'a> {
    /// An LMDB folder.
    Lmdb(&'a Path),
    /// A list file and the folder its paths are relative to.
    List(&'a Path, &'a Path),
    /// A folder of class folders.
    Folder(&'a Path),
}

/// The shape `(C, H, W)` the first record of a source is read as with `options`: what
/// validation derives the net's input from, reading one record.
pub fn first_record_shape(
    first: FirstRecord<'_>,
    options: DecodeOptions,
) -> std::result::Result<[usize; 3], String> {
    let bytes = match first {
        FirstRecord::Lmdb(path) => super::lmdb::first_value(path)?,
        FirstRecord::List(list, root) => {
            let text = std::fs::read_to_string(list).map_err(|e| format!("cannot read: {e}"))?;
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .ok_or("the list names no images")?;
            let (path, _) = line
                .rsplit_once(' ')
                .ok_or_else(|| format!("line 1: expected `relative/path label`, found `{line}`"))?;
            let file = root.join(path);
            std::fs::read(&file).map_err(|e| format!("{}: cannot read: {e}", file.display()))?
        }
        FirstRecord::Folder(root) => {
            let file = super::image_files::first_in_folder(root)?;
            std::fs::read(&file).map_err(|e| format!("{}: cannot read: {e}", file.display()))?
        }
    };
    match first {
        FirstRecord::Lmdb(_) => datum_shape(&bytes, options),
        _ => stored_shape(Stored::Encoded(&bytes), options),
    }
}

/// The shape `(C, H, W)` a stored `Datum` is read as with `options`, its sizes checked against
/// its bytes and an encoded image decoded; `Err` says what is wrong with it.
pub fn datum_shape(
    bytes: &[u8],
    options: DecodeOptions,
) -> std::result::Result<[usize; 3], String> {
    stored_shape(stored_datum(bytes)?, options)
}

fn stored_shape(
    stored: Stored<'_>,
    options: DecodeOptions,
) -> std::result::Result<[usize; 3], String> {
    match stored {
        Stored::Raw(shape, _) | Stored::Floats(shape, _) => Ok(shape),
        Stored::Encoded(file) => {
            let mut image = Image::default();
            decode::decode(file, options.color, options.jpeg, &mut image)
                .map_err(|e| format!("the first image: {e}"))?;
            let (h, w) = options.resize.unwrap_or((image.height, image.width));
            Ok([image.channels, h, w])
        }
    }
}

/// The `Datum` in `bytes`, its sizes checked against its data.
fn stored_datum(bytes: &[u8]) -> std::result::Result<Stored<'_>, String> {
    let view = DatumView::parse(bytes).map_err(|e| format!("not a Caffe Datum: {e}"))?;
    if view.encoded {
        return Ok(Stored::Encoded(view.data));
    }
    let dims = [view.channels, view.height, view.width];
    if dims.iter().any(|&d| !(1..=1 << 20).contains(&d)) {
        return Err(format!(
            "a raw Datum of sizes {dims:?}: each must be in 1..=2^20"
        ));
    }
    let shape = dims.map(|d| d as usize);
    let n: usize = shape.iter().product();
    if n > decode::MAX_IMAGE_PIXELS * 4 {
        return Err(format!("a raw Datum of {n} values, more than allowed"));
    }
    if !view.data.is_empty() {
        if view.data.len() != n {
            return Err(format!(
                "a raw Datum of {} holds {} bytes, not {n}",
                super::fmt_shape(shape),
                view.data.len()
            ));
        }
        Ok(Stored::Raw(shape, view.data))
    } else if view.float_count() == n {
        Ok(Stored::Floats(shape, view))
    } else {
        Err(format!(
            "a raw Datum of {} holds {} bytes and {} floats, not {n}",
            super::fmt_shape(shape),
            view.data.len(),
            view.float_count()
        ))
    }
}

impl RecordSource for ImageSource {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn record_shape(&self) -> [usize; 3] {
        self.shape
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn fill(&self, index: usize, out: &mut [f32]) {
        if let Err(e) = self.try_fill(index, out) {
            panic!("{e}");
        }
    }

    fn try_fill(&self, index: usize, out: &mut [f32]) -> Result<Read> {
        let mut image = Image::default();
        self.read_or_skip(index, |i| self.fill_one(i, out, &mut image))
    }

    fn read_image(&self, index: usize, image: &mut Image) -> Result<Read> {
        let mut scratch = resample::Resampler::default();
        self.read_or_skip(index, |i| self.image_of(i, image, &mut scratch))
    }

    fn read_view(
        &self,
        index: usize,
        view: &mut dyn FnMut(usize, usize) -> View,
        image: &mut Image,
    ) -> Result<(Read, Window)> {
        if self.options.resize.is_some() {
            // Resized records are decoded whole; the view is of the resized image.
            let read = self.read_image(index, image)?;
            return Ok((read, view(image.height, image.width).window));
        }
        let mut window = Window::whole(0, 0);
        let read = self.read_or_skip(index, |i| {
            window = self.view_of(i, view, image)?;
            Ok(())
        })?;
        Ok((read, window))
    }

    fn label(&self, index: usize) -> u32 {
        self.labels[index]
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// Raw `Datum` bytes and decoded images are; `float_data` is not. Judged by the first
    /// record that can be read (a `float_data` record among bytes is then an error naming it).
    fn values_are_u8(&self) -> bool {
        (0..self.labels.len())
            .find_map(|i| {
                self.with_stored(i, |stored| Ok(!matches!(stored, Stored::Floats(..))))
                    .ok()
            })
            .unwrap_or(false)
    }

    fn workers(&self) -> Option<&rayon::ThreadPool> {
        Some(&self.workers)
    }

    fn print_words(&self, index: usize, words: &mut Vec<u64>) {
        // The stored bytes identify a record without decoding it.
        let hash = self.with_stored(index, |stored| {
            let mut h = super::fingerprint::Fnv::default();
            match stored {
                Stored::Raw(shape, bytes) => {
                    shape.iter().for_each(|&d| h.add(d as u64));
                    bytes.iter().for_each(|&b| h.add_byte(b));
                }
                Stored::Floats(shape, view) => {
                    shape.iter().for_each(|&d| h.add(d as u64));
                    view.floats().for_each(|v| h.add(u64::from(v.to_bits())));
                }
                Stored::Encoded(bytes) => bytes.iter().for_each(|&b| h.add_byte(b)),
            }
            Ok(h.finish())
        });
        words.push(hash.unwrap_or(u64::MAX));
    }
}
