//! Whole-config validation, run by `load` before anything is allocated: every value range, the
//! keys each data format, lr policy, update rule and layer type needs or rejects, the layer graph
//! (bottoms produced by earlier layers in the same phase, no cycles, a train-phase loss), and the
//! memory the per-replica tensors would take. Each error names the dotted key and its position.
//!
//! Per-sample shapes are propagated through the layers (data `(C, H, W)`, label `()`), so an
//! inner product's weights `(num_output, K)` and tops `(N, num_output)` are checked against the
//! 64 GiB tensor limit, and a classifier with fewer scores than the data has classes is caught.

use super::layer_params::{EltwiseParams, LayerParams, ParamError};
use super::{Config, DataFormat, LayerConfig, LayerKind, LrPolicy, Phase, SolverType, Source};
use crate::error::{Error, Result};
use crate::input_file::{open_regular, InputError};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{Read, Seek};
use std::path::Path;

const GIB: u64 = 1 << 30;
/// The largest single f32 tensor a replica may hold.
const MAX_TENSOR_BYTES: u64 = 64 * GIB;
/// The most records one replica may read in a run (`max_iter × iter_size × batch_size`).
const MAX_SAMPLES: u64 = 1 << 62;
const MAX_REPLICAS_PER_RANK: usize = 1024;
/// Most worker threads a rank starts (`threads_per_replica × replicas_per_rank`): far more cores
/// than one node has, and few enough that their stacks fit in memory.
const MAX_WORKER_THREADS: usize = 4096;
/// Record elements of a synthetic shape or an IDX image must stay below this.
const MAX_RECORD_ELEMS: u64 = 1 << 31;
/// The bundled digits: 8×8 grey images of 10 classes.
const DIGITS_SHAPE: [u64; 3] = [1, 8, 8];
const DIGITS_CLASSES: usize = 10;
/// Classes assumed for IDX and synthetic data when `classes` is not set.
const DEFAULT_CLASSES: usize = 10;

/// Blobs available in one phase: name → (producing layer, or `None` for the data source;
/// per-sample shape).
type Blobs = HashMap<String, (Option<usize>, Vec<u64>)>;

/// The config name of an enum value (`inner_product`, `sgd`, `idx`).
pub(crate) fn name_of<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

impl Config {
    /// Checks the whole config, returning the first problem as an [`Error::Config`] that names
    /// the key and its position in `src` (or the `--set` argument that set it). Reads the headers
    /// of IDX files to learn the record size; allocates nothing else.
    pub fn validate(&self, src: &Source) -> Result<()> {
        let v = Validator { cfg: self, src };
        v.cluster()?;
        let data = v.data()?;
        v.solver()?;
        v.layers(&data)
    }
}

/// What the data section implies for the net.
struct DataFacts {
    /// Per-sample shape of the `data` blob, `(C, H, W)`.
    record: Vec<u64>,
    /// Labels are below this.
    classes: usize,
    /// The larger of the train and test per-replica batches.
    max_batch: u64,
}

struct Validator<'a> {
    cfg: &'a Config,
    src: &'a Source,
}

/// `(N, a, b)` for a per-sample shape `[a, b]`.
fn shape_str(sample: &[u64]) -> String {
    let mut s = String::from("(N");
    for d in sample {
        s.push_str(&format!(", {d}"));
    }
    s + ")"
}

fn product(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
}

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / GIB as f64)
}

impl Validator<'_> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> Error {
        self.src.error(key, msg)
    }

    fn at_least_one(&self, key: &str, v: u64) -> Result<()> {
        if v == 0 {
            return Err(self.err(key, "must be at least 1, got 0"));
        }
        Ok(())
    }

    fn finite(&self, key: &str, v: f32) -> Result<()> {
        if !v.is_finite() {
            return Err(self.err(key, format!("must be a finite number, got {v}")));
        }
        Ok(())
    }

    fn positive(&self, key: &str, v: f32) -> Result<()> {
        if !(v.is_finite() && v > 0.0) {
            return Err(self.err(key, format!("must be a finite number > 0, got {v}")));
        }
        Ok(())
    }

    fn non_negative(&self, key: &str, v: f32) -> Result<()> {
        if !(v.is_finite() && v >= 0.0) {
            return Err(self.err(key, format!("must be a finite number ≥ 0, got {v}")));
        }
        Ok(())
    }

    /// `v` in [0, 1).
    fn fraction(&self, key: &str, v: f32) -> Result<()> {
        if !(0.0..1.0).contains(&v) {
            return Err(self.err(key, format!("must be in [0, 1), got {v}")));
        }
        Ok(())
    }

    fn cluster(&self) -> Result<()> {
        let mb = self.cfg.cluster.bucket_mb;
        if !(mb.is_finite() && mb > 0.0) {
            return Err(self.err(
                "cluster.bucket_mb",
                format!("must be a positive number of MiB, got {mb}"),
            ));
        }
        let t = self.cfg.cluster.collective_timeout_s;
        if !(t.is_finite() && t > 0.0 && t <= 1e9) {
            return Err(self.err(
                "cluster.collective_timeout_s",
                format!("must be a number of seconds > 0 (at most 1e9), got {t}"),
            ));
        }
        let r = self.cfg.cluster.replicas_per_rank;
        if r == 0 || r > MAX_REPLICAS_PER_RANK {
            return Err(self.err(
                "cluster.replicas_per_rank",
                format!("must be between 1 and {MAX_REPLICAS_PER_RANK}, got {r}"),
            ));
        }
        let t = self.cfg.cluster.threads_per_replica;
        if t.saturating_mul(r) > MAX_WORKER_THREADS {
            return Err(self.err(
                "cluster.threads_per_replica",
                format!(
                    "{t} threads × {r} replicas per rank exceeds the limit of \
                     {MAX_WORKER_THREADS} worker threads per rank (0 = the node's cores)"
                ),
            ));
        }
        if let Some(n) = self.cfg.cluster.world_size {
            self.at_least_one("cluster.world_size", n as u64)?;
        }
        Ok(())
    }

    fn data(&self) -> Result<DataFacts> {
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
        };
        let record = self.transform(record)?;
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
        let (c, h, w) = (record[0], record[1], record[2]);
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

    /// Checks one CIFAR-10 file list: present, not empty, every file a regular file whose size is
    /// a positive multiple of the record size (labels are checked when the data are opened).
    fn cifar10_files(&self, key: &str, list: Option<&[std::path::PathBuf]>) -> Result<()> {
        use crate::data::cifar10::RECORD_BYTES;
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
            let shown = path.display();
            let (_, len) = open_regular(path).map_err(|e| match e {
                InputError::Missing => self.err(&k, format!("file not found: {shown}")),
                InputError::NotRegular(_) => self.err(&k, format!("not a file: {shown} ({e})")),
                _ => self.err(&k, format!("cannot read {shown}: {e}")),
            })?;
            if len == 0 || len % RECORD_BYTES as u64 != 0 {
                return Err(self.err(
                    &k,
                    format!(
                        "{shown}: size {len} is not a positive multiple of the CIFAR-10 record \
                         size {RECORD_BYTES} (1 label byte + 3×32×32 pixels): truncated or not \
                         a CIFAR-10 binary batch"
                    ),
                ));
            }
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
        let shown = path.display();
        let ndims = (magic & 0xff) as usize;
        let want = 4 + 4 * ndims;
        let (file, len) = open_regular(path).map_err(|e| match e {
            InputError::Missing => self.err(key, format!("file not found: {shown}")),
            InputError::NotRegular(_) => self.err(key, format!("not a file: {shown} ({e})")),
            _ => self.err(key, format!("cannot read {shown}: {e}")),
        })?;
        let (header, compressed) = read_header(file, want)
            .map_err(|e| self.err(key, format!("cannot read {shown}: {e}")))?;
        let what = if ndims == 1 { "labels" } else { "images" };
        if header.len() < 4 {
            return Err(self.err(key, format!("{shown} is too short for an IDX file")));
        }
        let found = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        if found != magic {
            let hint = match found {
                0x0801 => " (an IDX label file)",
                0x0803 => " (an IDX image file)",
                _ => "",
            };
            return Err(self.err(
                key,
                format!(
                    "{shown}: magic 0x{found:08x}{hint}, expected IDX u8 {what} (0x{magic:08x})"
                ),
            ));
        }
        if header.len() < want {
            return Err(self.err(key, format!("{shown}: truncated IDX header")));
        }
        let dims: Vec<u64> = header[4..]
            .chunks(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64)
            .collect();
        let raw_len = (!compressed).then_some(len);
        idx_dims_fit(&dims, want as u64, raw_len)
            .map_err(|msg| self.err(key, format!("{shown}: {msg}")))?;
        Ok(dims)
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
            Some(n) if n < MAX_RECORD_ELEMS => {}
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

    fn solver(&self) -> Result<()> {
        let s = &self.cfg.solver;
        self.positive("solver.base_lr", s.base_lr)?;
        self.fraction("solver.momentum", s.momentum)?;
        self.non_negative("solver.weight_decay", s.weight_decay)?;
        self.at_least_one("solver.max_iter", s.max_iter)?;
        self.at_least_one("solver.iter_size", s.iter_size)?;
        self.at_least_one("solver.average_loss", s.average_loss)?;
        // Record positions are 64-bit counts: the samples one replica reads must fit well within.
        let samples = s
            .max_iter
            .checked_mul(s.iter_size)
            .and_then(|v| v.checked_mul(self.cfg.data.batch_size as u64))
            .filter(|&v| v <= MAX_SAMPLES);
        if samples.is_none() {
            return Err(self.err(
                "solver.max_iter",
                format!(
                    "max_iter {} × iter_size {} × batch_size {} records per replica exceeds 2^62",
                    s.max_iter, s.iter_size, self.cfg.data.batch_size
                ),
            ));
        }
        if let Some(t) = s.test_iter {
            self.at_least_one("solver.test_iter", t)?;
        }
        self.finite("solver.clip_gradients", s.clip_gradients)?;
        if s.snapshot_prefix.trim().is_empty() {
            return Err(self.err("solver.snapshot_prefix", "must not be empty"));
        }
        match s.solver_type {
            SolverType::Sgd | SolverType::Nesterov => {}
            SolverType::Adagrad => self.positive("solver.delta", s.delta)?,
            SolverType::Rmsprop => {
                self.positive("solver.delta", s.delta)?;
                self.fraction("solver.rms_decay", s.rms_decay)?;
            }
            SolverType::Adam => {
                self.fraction("solver.momentum2", s.momentum2)?;
                self.positive("solver.delta", s.delta)?;
            }
        }
        self.lr_policy()
    }

    fn lr_policy(&self) -> Result<()> {
        let s = &self.cfg.solver;
        let policy = format!("lr_policy \"{}\"", name_of(&s.lr_policy));
        let needs = |key: &str, what: &str, got: String| {
            self.err(
                &format!("solver.{key}"),
                format!("{policy} needs `{key}` {what}, got {got}"),
            )
        };
        let gamma_positive = || {
            if s.gamma.is_finite() && s.gamma > 0.0 {
                Ok(())
            } else {
                Err(needs("gamma", "> 0", s.gamma.to_string()))
            }
        };
        let power_positive = || {
            if s.power.is_finite() && s.power > 0.0 {
                Ok(())
            } else {
                Err(needs("power", "> 0", s.power.to_string()))
            }
        };
        let stepsize_positive = || {
            if s.stepsize > 0 {
                Ok(())
            } else {
                Err(needs("stepsize", "> 0", "0".into()))
            }
        };
        match s.lr_policy {
            LrPolicy::Fixed => Ok(()),
            LrPolicy::Step => {
                stepsize_positive()?;
                gamma_positive()
            }
            LrPolicy::Multistep => {
                if s.stepvalue.is_empty() {
                    return Err(needs(
                        "stepvalue",
                        "(a non-empty list of iterations)",
                        "[]".into(),
                    ));
                }
                if let Some(w) = s.stepvalue.windows(2).position(|w| w[0] >= w[1]) {
                    return Err(self.src.error_at(
                        "solver.stepvalue",
                        &format!("solver.stepvalue[{}]", w + 1),
                        format!("must be strictly increasing, got {:?}", s.stepvalue),
                    ));
                }
                gamma_positive()
            }
            LrPolicy::Exp => gamma_positive(),
            LrPolicy::Inv => {
                gamma_positive()?;
                power_positive()
            }
            LrPolicy::Poly => power_positive(),
            LrPolicy::Sigmoid => {
                if !(s.gamma.is_finite() && s.gamma != 0.0) {
                    return Err(needs(
                        "gamma",
                        "≠ 0 (the slope; negative decays)",
                        s.gamma.to_string(),
                    ));
                }
                stepsize_positive()
            }
        }
    }

    fn layers(&self, data: &DataFacts) -> Result<()> {
        let layers = &self.cfg.layers;
        if layers.is_empty() {
            return Err(self.err("layer", "the net needs at least one layer"));
        }
        // Per phase (0: train, 1: test), the blobs available so far: name → (producer, shape).
        let mut avail: [Blobs; 2] = Default::default();
        for a in &mut avail {
            a.insert("data".into(), (None, data.record.clone()));
            a.insert("label".into(), (None, Vec::new()));
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, l) in layers.iter().enumerate() {
            let key = |k: &str| format!("layer[{i}].{k}");
            if l.name.trim().is_empty() {
                return Err(self.err(&key("name"), "must not be empty"));
            }
            if let Some(j) = names.insert(&l.name, i) {
                return Err(self.err(
                    &key("name"),
                    format!("layer name `{}` is already used by layer[{j}]", l.name),
                ));
            }
            let params = self.layer_params(i, l)?;
            self.layer_arity(i, l)?;
            let phases: &[usize] = match l.phase {
                None => &[0, 1],
                Some(Phase::Train) => &[0],
                Some(Phase::Test) => &[1],
            };
            let mut bottoms = Vec::new();
            for (j, b) in l.bottom.iter().enumerate() {
                for &q in phases {
                    if !avail[q].contains_key(b) {
                        return Err(self.src.error_at(
                            &key("bottom"),
                            &format!("layer[{i}].bottom[{j}]"),
                            self.missing_bottom(i, b, q, &avail[1 - q]),
                        ));
                    }
                }
                bottoms.push(avail[phases[0]][b].1.clone());
            }
            let top_shape = self.layer_shapes(i, l, &params, &bottoms, data)?;
            for (j, t) in l.top.iter().enumerate() {
                if l.top[..j].contains(t) {
                    return Err(self.err(&key("top"), format!("top `{t}` is listed twice")));
                }
                for &q in phases {
                    if let Some((producer, _)) = avail[q].get(t) {
                        if !l.bottom.contains(t) {
                            let by = match producer {
                                Some(p) => format!("layer `{}`", layers[*p].name),
                                None => "the data source".into(),
                            };
                            return Err(self.src.error_at(
                                &key("top"),
                                &format!("layer[{i}].top[{j}]"),
                                format!("top `{t}` is already produced by {by}; a layer may reuse a blob name only in place (as one of its bottoms)"),
                            ));
                        }
                    }
                }
            }
            for &q in phases {
                for t in &l.top {
                    avail[q].insert(t.clone(), (Some(i), top_shape.clone()));
                }
            }
        }
        let trains_a_loss = layers.iter().any(|l| {
            l.kind == LayerKind::SoftmaxWithLoss
                && l.phase != Some(Phase::Test)
                && l.loss_weight != Some(0.0)
        });
        if !trains_a_loss {
            return Err(self.err(
                "layer",
                "no loss layer runs in the train phase: add a layer of type softmax_with_loss (without phase = \"test\" or loss_weight = 0)",
            ));
        }
        Ok(())
    }

    /// Why bottom `b` of layer `i` is missing in phase `q`.
    fn missing_bottom(&self, i: usize, b: &str, q: usize, other_phase: &Blobs) -> String {
        let layers = &self.cfg.layers;
        let phase = ["train", "test"][q];
        if let Some((Some(p), _)) = other_phase.get(b) {
            let other = ["train", "test"][1 - q];
            return format!(
                "bottom `{b}` is produced only in the {other} phase (by layer `{}`), but this layer also runs in the {phase} phase",
                layers[*p].name
            );
        }
        let later = (i..layers.len()).find(|&j| layers[j].top.iter().any(|t| t == b));
        match later {
            Some(j) if j == i => format!(
                "bottom `{b}` is produced by no earlier layer (only by this layer itself, a cycle)"
            ),
            Some(j) if self.depends_on(j, i) => format!(
                "bottom `{b}` is produced by no earlier layer: layer `{}` produces it from this layer's output, a cycle",
                layers[j].name
            ),
            Some(j) => format!(
                "bottom `{b}` is produced by no earlier layer: only the later layer `{}` produces it; layers run in file order, so move that layer above this one",
                layers[j].name
            ),
            None => format!("bottom `{b}` is produced by no earlier layer"),
        }
    }

    /// Whether layer `j` consumes, directly or through other layers, a top of layer `i`.
    fn depends_on(&self, j: usize, i: usize) -> bool {
        let layers = &self.cfg.layers;
        let mut seen = vec![false; layers.len()];
        let mut stack = vec![j];
        while let Some(k) = stack.pop() {
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            for b in &layers[k].bottom {
                for (p, l) in layers.iter().enumerate() {
                    if l.top.contains(b) && p != k {
                        if p == i {
                            return true;
                        }
                        stack.push(p);
                    }
                }
            }
        }
        false
    }

    /// The parameters of layer `i` resolved from its table (keys that do not apply to its type,
    /// ranges), then the ranges of the keys every layer type shares.
    fn layer_params(&self, i: usize, l: &LayerConfig) -> Result<LayerParams> {
        let key = |k: &str| format!("layer[{i}].{k}");
        let params = LayerParams::resolve(l).map_err(|e| self.param_error(i, e))?;
        let kind = name_of(&l.kind);
        let (learnable, tensors) = params.learnable_tensors(l.bottom.len());
        for (k, mults) in [("lr_mult", &l.lr_mult), ("decay_mult", &l.decay_mult)] {
            let Some(m) = mults else { continue };
            if learnable == 0 && !m.is_empty() {
                return Err(self.err(
                    &key(k),
                    format!("`{k}` does not apply to a layer of type {kind} (it has no learnable tensors)"),
                ));
            }
            if m.len() > learnable {
                return Err(self.err(
                    &key(k),
                    format!("has {} values but the layer has {tensors}", m.len()),
                ));
            }
            for (j, v) in m.iter().enumerate() {
                self.non_negative(&format!("layer[{i}].{k}[{j}]"), *v)?;
            }
        }
        if let Some(w) = l.loss_weight {
            self.finite(&key("loss_weight"), w)?;
        }
        if let LayerParams::Eltwise(EltwiseParams { coeff: Some(c), .. }) = &params {
            if c.len() != l.bottom.len() {
                return Err(self.err(
                    &key("coeff"),
                    format!(
                        "has {} values but the layer has {} bottoms (one coefficient each)",
                        c.len(),
                        l.bottom.len()
                    ),
                ));
            }
        }
        Ok(params)
    }

    /// The error of a key of layer `i`, at its position in the file.
    fn param_error(&self, i: usize, e: ParamError) -> Error {
        let key = format!("layer[{i}].{}", e.key);
        match e.index {
            Some(j) => self.src.error_at(&key, &format!("{key}[{j}]"), e.msg),
            None => self.err(&key, e.msg),
        }
    }

    fn layer_arity(&self, i: usize, l: &LayerConfig) -> Result<()> {
        let kind = name_of(&l.kind);
        let (bottoms, tops, what) = match l.kind {
            LayerKind::InnerProduct
            | LayerKind::Relu
            | LayerKind::Sigmoid
            | LayerKind::Tanh
            | LayerKind::Convolution
            | LayerKind::Pooling
            | LayerKind::Flatten
            | LayerKind::Reshape
            | LayerKind::Softmax
            | LayerKind::Power
            | LayerKind::AbsVal => (1..=1, 1, "1 bottom"),
            LayerKind::SoftmaxWithLoss | LayerKind::Accuracy => {
                (2..=2, 1, "2 bottoms (scores, label)")
            }
            LayerKind::Scale => (1..=2, 1, "1 bottom, or 2 (data, scale)"),
            LayerKind::Bias => (1..=2, 1, "1 bottom, or 2 (data, bias)"),
            LayerKind::Eltwise => (2..=usize::MAX, 1, "2 or more bottoms"),
            LayerKind::Concat => (1..=usize::MAX, 1, "1 or more bottoms"),
            LayerKind::Dropout | LayerKind::BatchNorm => (1..=1, 1, "1 bottom"),
        };
        if !bottoms.contains(&l.bottom.len()) {
            return Err(self.err(
                &format!("layer[{i}].bottom"),
                format!(
                    "a layer of type {kind} takes {what}, got {}",
                    l.bottom.len()
                ),
            ));
        }
        if l.top.len() != tops {
            return Err(self.err(
                &format!("layer[{i}].top"),
                format!("a layer of type {kind} has 1 top, got {}", l.top.len()),
            ));
        }
        for (k, names) in [("bottom", &l.bottom), ("top", &l.top)] {
            if let Some(j) = names.iter().position(|n| n.trim().is_empty()) {
                return Err(self.src.error_at(
                    &format!("layer[{i}].{k}"),
                    &format!("layer[{i}].{k}[{j}]"),
                    "blob names must not be empty",
                ));
            }
        }
        Ok(())
    }

    /// The per-sample shape of layer `i`'s top from its bottoms' shapes; checks the sizes.
    fn layer_shapes(
        &self,
        i: usize,
        l: &LayerConfig,
        params: &LayerParams,
        bottoms: &[Vec<u64>],
        data: &DataFacts,
    ) -> Result<Vec<u64>> {
        let key = |k: &str| format!("layer[{i}].{k}");
        let axis = match params {
            LayerParams::InnerProduct(p) => p.axis,
            LayerParams::SoftmaxWithLoss(p) => p.axis,
            LayerParams::Accuracy(p) => p.axis,
            _ => 1,
        };
        let split = |shape: &[u64]| -> Result<(Vec<u64>, u64)> {
            if axis > shape.len() {
                return Err(self.err(
                    &key(if l.axis.is_some() { "axis" } else { "bottom" }),
                    format!(
                        "axis {axis} is out of range for bottom `{}` of shape {}",
                        l.bottom[0],
                        shape_str(shape)
                    ),
                ));
            }
            Ok((
                shape[..axis - 1].to_vec(),
                product(&shape[axis - 1..]).unwrap_or(u64::MAX),
            ))
        };
        match params {
            LayerParams::InnerProduct(p) => {
                let n = p.num_output as u64;
                let (mut outer, fan_in) = split(&bottoms[0])?;
                let too_big = |what: String, dims: &[u64]| -> Result<()> {
                    match product(dims).and_then(|e| e.checked_mul(4)) {
                        Some(b) if b <= MAX_TENSOR_BYTES => Ok(()),
                        Some(b) => Err(self.err(
                            &key("num_output"),
                            format!(
                                "{what} would need {} GiB of f32 (limit {} GiB)",
                                gib(b),
                                MAX_TENSOR_BYTES / GIB
                            ),
                        )),
                        None => Err(self.err(
                            &key("num_output"),
                            format!("{what} overflows the size of a tensor"),
                        )),
                    }
                };
                too_big(format!("the weights ({n} × {fan_in})"), &[n, fan_in])?;
                outer.push(n);
                let batch: Vec<u64> = std::iter::once(data.max_batch)
                    .chain(outer.iter().copied())
                    .collect();
                too_big(
                    format!(
                        "the top `{}` {}, batch {}",
                        l.top[0],
                        shape_str(&outer),
                        data.max_batch
                    ),
                    &batch,
                )?;
                Ok(outer)
            }
            LayerParams::Relu(_) | LayerParams::Sigmoid(_) | LayerParams::Tanh(_) => {
                Ok(bottoms[0].clone())
            }
            LayerParams::SoftmaxWithLoss(_) | LayerParams::Accuracy(_) => {
                let (_, _) = split(&bottoms[0])?;
                let scores = bottoms[0][axis - 1];
                if l.bottom[1] == "label"
                    && bottoms[0].len() == 1
                    && (scores as usize) < data.classes
                {
                    return Err(self.err(
                        &key("bottom"),
                        format!(
                            "bottom `{}` has {scores} scores per sample but the data has {} classes",
                            l.bottom[0], data.classes
                        ),
                    ));
                }
                if let (Some(k), LayerParams::Accuracy(p)) = (l.top_k, params) {
                    if p.top_k as u64 > scores {
                        return Err(self.err(
                            &key("top_k"),
                            format!("top_k {k} exceeds the {scores} scores per sample"),
                        ));
                    }
                }
                Ok(Vec::new())
            }
            LayerParams::Dropout(_) => Ok(bottoms[0].clone()),
            LayerParams::BatchNorm(_) => {
                if bottoms[0].is_empty() {
                    return Err(self.err(
                        &key("bottom"),
                        format!(
                            "batch_norm needs a bottom with channels (N, C, ...); `{}` is a scalar per sample",
                            l.bottom[0]
                        ),
                    ));
                }
                Ok(bottoms[0].clone())
            }
            _ => self.shape_by_layer(i, l, params, bottoms, data),
        }
    }

    /// The per-sample top shape of a layer computed by the layer's own `reshape` on
    /// `[batch] + bottom`, its refusal reported at the key that most likely causes it; checks
    /// the top's and (for a convolution) the weights' and column buffer's sizes.
    fn shape_by_layer(
        &self,
        i: usize,
        l: &LayerConfig,
        params: &LayerParams,
        bottoms: &[Vec<u64>],
        data: &DataFacts,
    ) -> Result<Vec<u64>> {
        let key = |k: &str| format!("layer[{i}].{k}");
        // The key blamed for a shape the layer refuses: the first of these that is set.
        let suspects: &[(&str, bool)] = match l.kind {
            LayerKind::Convolution => &[
                ("group", l.group.is_some()),
                ("kernel_size", l.kernel_size.is_some()),
            ],
            LayerKind::Pooling => &[
                ("kernel_size", l.kernel_size.is_some()),
                ("global_pooling", l.global_pooling.is_some()),
            ],
            LayerKind::Scale | LayerKind::Bias => &[
                ("num_axes", l.num_axes.is_some()),
                ("axis", l.axis.is_some()),
            ],
            LayerKind::Flatten => &[
                ("end_axis", l.end_axis.is_some()),
                ("axis", l.axis.is_some()),
            ],
            LayerKind::Reshape => &[("shape", true)],
            LayerKind::Concat | LayerKind::Softmax => &[("axis", l.axis.is_some())],
            _ => &[],
        };
        let blamed = suspects
            .iter()
            .find_map(|(k, set)| set.then_some(*k))
            .unwrap_or("bottom");
        let fail = |e: Error| match e {
            Error::Net { msg, .. } => self.err(&key(blamed), msg),
            other => other,
        };
        let rank4 = matches!(l.kind, LayerKind::Convolution | LayerKind::Pooling);
        if rank4 && bottoms[0].len() != 3 {
            return Err(self.err(
                &key("bottom"),
                format!(
                    "bottom `{}` of shape {} is not an image (N, C, H, W)",
                    l.bottom[0],
                    shape_str(&bottoms[0])
                ),
            ));
        }
        let batch = data.max_batch;
        let full: Vec<Vec<usize>> = bottoms
            .iter()
            .map(|b| {
                std::iter::once(batch)
                    .chain(b.iter().copied())
                    .map(|d| d as usize)
                    .collect()
            })
            .collect();
        let views: Vec<&[usize]> = full.iter().map(|b| b.as_slice()).collect();
        if let LayerParams::Convolution(p) = params {
            let c = bottoms[0][0];
            let g = p.group as u64;
            if !c.is_multiple_of(g) {
                return Err(self.err(
                    &key("group"),
                    format!(
                        "group {g} does not divide the {c} channels of bottom `{}`",
                        l.bottom[0]
                    ),
                ));
            }
        }
        let mut layer = crate::layers::build(&l.name, params);
        let top = layer.reshape(&views).map_err(fail)?.remove(0);
        let sample: Vec<u64> = top.iter().skip(1).map(|&d| d as u64).collect();
        let (size_key, what) = match l.kind {
            LayerKind::Convolution => ("num_output", "the top"),
            _ => ("top", "the top"),
        };
        let too_big = |k: &str, what: String, dims: &[u64]| -> Result<()> {
            match product(dims).and_then(|e| e.checked_mul(4)) {
                Some(b) if b <= MAX_TENSOR_BYTES => Ok(()),
                Some(b) => Err(self.err(
                    &key(k),
                    format!(
                        "{what} would need {} GiB of f32 (limit {} GiB)",
                        gib(b),
                        MAX_TENSOR_BYTES / GIB
                    ),
                )),
                None => Err(self.err(&key(k), format!("{what} overflows the size of a tensor"))),
            }
        };
        let with_batch: Vec<u64> = std::iter::once(batch)
            .chain(sample.iter().copied())
            .collect();
        too_big(
            size_key,
            format!(
                "{what} `{}` {}, batch {batch}",
                l.top[0],
                shape_str(&sample)
            ),
            &with_batch,
        )?;
        if l.kind == LayerKind::Convolution {
            for spec in layer.param_specs() {
                let dims: Vec<u64> = spec.shape.iter().map(|&d| d as u64).collect();
                too_big(
                    "num_output",
                    format!("the {} {:?}", spec.name, spec.shape),
                    &dims,
                )?;
            }
            let (c, k) = (bottoms[0][0], layer.param_specs()[0].shape.clone());
            let col = [c, k[2] as u64, k[3] as u64, sample[1], sample[2]];
            too_big(
                "kernel_size",
                format!(
                    "the column buffer (C·kh·kw × OH·OW = {c}·{}·{} × {}·{})",
                    k[2], k[3], sample[1], sample[2]
                ),
                &col,
            )?;
        }
        Ok(sample)
    }
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
        if rows.saturating_mul(*columns) >= MAX_RECORD_ELEMS {
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
mod tests {
    use super::*;
    use crate::config::load_str;

    const BASE: &str = r#"[cluster]
backend = "cpu"

[data]
format = "digits"
batch_size = 32

[solver]
base_lr = 0.05
momentum = 0.9
max_iter = 100

[[layer]]
name = "ip1"
type = "inner_product"
bottom = ["data"]
top = ["ip1"]
num_output = 16

[[layer]]
name = "relu1"
type = "relu"
bottom = ["ip1"]
top = ["ip1"]

[[layer]]
name = "ip2"
type = "inner_product"
bottom = ["ip1"]
top = ["ip2"]
num_output = 10

[[layer]]
name = "loss"
type = "softmax_with_loss"
bottom = ["ip2", "label"]
top = ["loss"]

[[layer]]
name = "accuracy"
type = "accuracy"
bottom = ["ip2", "label"]
top = ["accuracy"]
phase = "test"
"#;

    fn check(text: &str) -> Result<()> {
        load_str("t.toml", text, Path::new("."), &[]).map(|_| ())
    }

    /// The error of `BASE` with `from` replaced by `to`.
    fn err(from: &str, to: &str) -> String {
        assert!(BASE.contains(from), "{from:?} not in BASE");
        let text = BASE.replacen(from, to, 1);
        match check(&text) {
            Ok(()) => panic!("no error with {to:?}"),
            Err(e) => {
                assert_eq!(e.exit_code(), 2);
                e.to_string()
            }
        }
    }

    fn has(e: &str, want: &str) {
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    }

    #[test]
    fn the_base_config_is_valid() {
        check(BASE).unwrap();
    }

    #[test]
    fn range_errors_name_the_key_and_position() {
        has(
            &err("batch_size = 32", "batch_size = 0"),
            "t.toml:6:1: `data.batch_size`: must be at least 1",
        );
        has(
            &err("batch_size = 32", "batch_size = 32\ntest_batch_size = 0"),
            "`data.test_batch_size`: must be at least 1",
        );
        has(
            &err("backend = \"cpu\"", "replicas_per_rank = 0"),
            "t.toml:2:1: `cluster.replicas_per_rank`: must be between 1 and 1024",
        );
        has(
            &err("backend = \"cpu\"", "replicas_per_rank = 1025"),
            "`cluster.replicas_per_rank`",
        );
        has(
            &err("backend = \"cpu\"", "threads_per_replica = 100000"),
            "t.toml:2:1: `cluster.threads_per_replica`: 100000 threads × 1 replicas per rank \
             exceeds the limit of 4096",
        );
        has(
            &err("base_lr = 0.05", "base_lr = -0.1"),
            "t.toml:9:1: `solver.base_lr`: must be a finite number > 0, got -0.1",
        );
        has(&err("base_lr = 0.05", "base_lr = nan"), "`solver.base_lr`");
        has(&err("base_lr = 0.05", "base_lr = inf"), "`solver.base_lr`");
        has(
            &err("momentum = 0.9", "momentum = 1.0"),
            "`solver.momentum`: must be in [0, 1), got 1",
        );
        has(
            &err("momentum = 0.9", "weight_decay = -1e-4"),
            "`solver.weight_decay`",
        );
        has(
            &err("max_iter = 100", "max_iter = 0"),
            "`solver.max_iter`: must be at least 1",
        );
        has(
            &err("max_iter = 100", "max_iter = 1\niter_size = 0"),
            "`solver.iter_size`",
        );
        has(
            &err("max_iter = 100", "max_iter = 1\naverage_loss = 0"),
            "`solver.average_loss`",
        );
        has(
            &err("max_iter = 100", "max_iter = 1\nclip_gradients = inf"),
            "`solver.clip_gradients`",
        );
        has(
            &err("batch_size = 32", "batch_size = 1\nscale = nan"),
            "`data.scale`",
        );
        has(
            &err("batch_size = 32", "batch_size = 1\nclasses = 1"),
            "`data.classes`: must be at least 2",
        );
        has(
            &err("batch_size = 32", "batch_size = 1\nclasses = 5"),
            "`data.classes`: the digits have labels 0 to 9",
        );
    }

    #[test]
    fn lr_policies_need_their_keys() {
        let p = |s: &str| err("max_iter = 100", &format!("max_iter = 100\n{s}"));
        has(
            &p("lr_policy = \"step\"\ngamma = 0.1"),
            "`solver.stepsize`: lr_policy \"step\" needs `stepsize` > 0",
        );
        has(
            &p("lr_policy = \"step\"\nstepsize = 10"),
            "`solver.gamma`: lr_policy \"step\" needs `gamma` > 0",
        );
        has(
            &p("lr_policy = \"multistep\"\ngamma = 0.1"),
            "`solver.stepvalue`",
        );
        has(
            &p("lr_policy = \"multistep\"\ngamma = 0.1\nstepvalue = [10, 10]"),
            "t.toml:14:18: `solver.stepvalue`: must be strictly increasing",
        );
        has(&p("lr_policy = \"exp\""), "`solver.gamma`");
        has(
            &p("lr_policy = \"inv\"\ngamma = 1e-4"),
            "`solver.power`: lr_policy \"inv\" needs `power` > 0",
        );
        has(&p("lr_policy = \"poly\""), "`solver.power`");
        has(
            &p("lr_policy = \"sigmoid\"\nstepsize = 5"),
            "`solver.gamma`",
        );
        has(
            &p("lr_policy = \"sigmoid\"\ngamma = -0.1"),
            "`solver.stepsize`",
        );
        for ok in [
            "lr_policy = \"step\"\nstepsize = 10\ngamma = 0.1",
            "lr_policy = \"multistep\"\nstepvalue = [10, 20]\ngamma = 0.1",
            "lr_policy = \"inv\"\ngamma = 1e-4\npower = 0.75",
            "lr_policy = \"poly\"\npower = 1.0",
            "lr_policy = \"sigmoid\"\ngamma = -0.1\nstepsize = 50",
        ] {
            check(&BASE.replace("max_iter = 100", &format!("max_iter = 100\n{ok}"))).unwrap();
        }
    }

    #[test]
    fn update_rules_check_their_keys() {
        let p = |s: &str| err("max_iter = 100", &format!("max_iter = 100\n{s}"));
        has(
            &p("type = \"adam\"\nmomentum2 = 1.0"),
            "`solver.momentum2`: must be in [0, 1)",
        );
        has(
            &p("type = \"adam\"\ndelta = 0"),
            "`solver.delta`: must be a finite number > 0",
        );
        has(
            &p("type = \"rmsprop\"\nrms_decay = 1.5"),
            "`solver.rms_decay`",
        );
        has(&p("type = \"adagrad\"\ndelta = -1"), "`solver.delta`");
        check(&BASE.replace("max_iter = 100", "max_iter = 100\ntype = \"adam\"")).unwrap();
    }

    #[test]
    fn data_formats_take_their_own_keys() {
        has(
            &err("batch_size = 32", "batch_size = 32\ntrain_images = \"x\""),
            "`data.train_images`: does not apply to format \"digits\"",
        );
        has(
            &err("batch_size = 32", "batch_size = 32\nshape = [1, 2]"),
            "`data.shape`: does not apply to format \"digits\"",
        );
        let synth = |extra: &str| {
            err(
                "format = \"digits\"",
                &format!("format = \"synthetic\"\n{extra}"),
            )
        };
        has(
            &synth("classes = 10\ntrain_size = 9\ntest_size = 9"),
            "`data.shape`: format \"synthetic\" needs `shape`",
        );
        has(
            &synth("shape = [1, 8, 8]\nclasses = 10\ntrain_size = 9\ntest_size = 0"),
            "`data.test_size`: must be at least 1",
        );
        check(&BASE.replace(
            "format = \"digits\"",
            "format = \"synthetic\"\nshape = [64]",
        ))
        .unwrap();
        has(
            &synth("shape = [1, 8, 8]\nclasses = 10\ntrain_size = 0\ntest_size = 9"),
            "`data.train_size`: must be at least 1",
        );
        has(
            &synth("shape = [1, 1, 8, 8]\nclasses = 10\ntrain_size = 9\ntest_size = 9"),
            "`data.shape`: must have 1 to 3 dimensions",
        );
        has(
            &synth("shape = [0, 8]\nclasses = 10\ntrain_size = 9\ntest_size = 9"),
            "`data.shape`: dimensions must be at least 1",
        );
        has(
            &synth("shape = [65536, 65536]\nclasses = 10\ntrain_size = 9\ntest_size = 9"),
            "`data.shape`: a record of [65536, 65536] has 2^31",
        );
        let ok = BASE.replace(
            "format = \"digits\"",
            "format = \"synthetic\"\nshape = [64]\nclasses = 10\ntrain_size = 9\ntest_size = 9",
        );
        check(&ok).unwrap();
        let e = err(
            "format = \"digits\"",
            "format = \"synthetic\"\nshape = [64]\nclasses = 20\ntrain_size = 9\ntest_size = 9",
        );
        has(
            &e,
            "`layer[3].bottom`: bottom `ip2` has 10 scores per sample but the data has 20 classes",
        );
    }

    #[test]
    fn memory_limits_are_reported_in_gib() {
        let e = err("batch_size = 32", "batch_size = 300000000");
        has(&e, "`data.batch_size`: a batch of 300000000 records of 1×8×8 would need 71.5 GiB of f32 per replica (limit 64 GiB)");
        let e = err(
            "batch_size = 32",
            "batch_size = 1\ntest_batch_size = 300000000",
        );
        has(&e, "`data.test_batch_size`: a batch of 300000000");
        let e = err("batch_size = 32", &format!("batch_size = {}", u64::MAX / 2));
        has(&e, "overflows");
        let wide = BASE.replace("num_output = 16", "num_output = 1048576");
        let e = check(&wide.replace("num_output = 10\n", "num_output = 65536\n"))
            .unwrap_err()
            .to_string();
        has(&e, "t.toml:31:1: `layer[2].num_output`: the weights (65536 × 1048576) would need 256.0 GiB of f32 (limit 64 GiB)");
        let big_batch = BASE.replace("batch_size = 32", "batch_size = 100000");
        let e = check(&big_batch.replace("num_output = 16", "num_output = 200000"))
            .unwrap_err()
            .to_string();
        has(
            &e,
            "`layer[0].num_output`: the top `ip1` (N, 200000), batch 100000 would need 74.5 GiB",
        );
        let synth = BASE.replace(
            "format = \"digits\"\nbatch_size = 32",
            "format = \"synthetic\"\nshape = [3, 4096, 4096]\nclasses = 10\ntrain_size = 9\ntest_size = 9\nbatch_size = 512",
        );
        has(
            &check(&synth).unwrap_err().to_string(),
            "`data.batch_size`: a batch of 512 records of 3×4096×4096 would need 96.0 GiB",
        );
    }

    #[test]
    fn layer_types_reject_keys_that_do_not_apply() {
        has(&err("num_output = 16", "num_output = 16\nnegative_slope = 0.1"), "t.toml:19:1: `layer[0].negative_slope`: `negative_slope` does not apply to a layer of type inner_product");
        has(
            &err("top = [\"ip1\"]\n\n", "top = [\"ip1\"]\nnum_output = 3\n\n"),
            "`layer[1].num_output`: `num_output` does not apply to a layer of type relu",
        );
        has(
            &err(
                "top = [\"accuracy\"]",
                "top = [\"accuracy\"]\nloss_weight = 1.0",
            ),
            "`layer[4].loss_weight`: `loss_weight` does not apply to a layer of type accuracy",
        );
        has(&err("top = [\"ip1\"]\n\n", "top = [\"ip1\"]\nlr_mult = [1.0]\n\n"), "`layer[1].lr_mult`: `lr_mult` does not apply to a layer of type relu (it has no learnable tensors)");
        has(
            &err("num_output = 16", "num_output = 16\nlr_mult = [1, 2, 3]"),
            "`layer[0].lr_mult`: has 3 values but the layer has 2 learnable tensors",
        );
        has(
            &err(
                "num_output = 16",
                "num_output = 16\nbias_term = false\ndecay_mult = [1, 0]",
            ),
            "`layer[0].decay_mult`: has 2 values but the layer has 1 learnable tensor",
        );
        has(
            &err(
                "num_output = 16",
                "num_output = 16\nbias_term = false\nbias_filler = { type = \"constant\" }",
            ),
            "`layer[0].bias_filler`: `bias_filler` does not apply when bias_term = false",
        );
        has(
            &err("num_output = 16", "num_output = 16\nlr_mult = [-1]"),
            "`layer[0].lr_mult[0]`: must be a finite number ≥ 0",
        );
        check(&BASE.replace(
            "num_output = 16",
            "num_output = 16\nlr_mult = [1, 2]\ndecay_mult = [1, 0]",
        ))
        .unwrap();
    }

    #[test]
    fn layer_values_are_checked() {
        has(
            &err("num_output = 16", "num_output = 0"),
            "t.toml:18:1: `layer[0].num_output`: must be between 1 and 2^28, got 0",
        );
        has(
            &err("num_output = 16", "num_output = 268435457"),
            "`layer[0].num_output`: must be between 1 and 2^28",
        );
        has(
            &err("num_output = 16\n", ""),
            "`layer[0].num_output`: a layer of type inner_product needs `num_output`",
        );
        has(
            &err("phase = \"test\"", "phase = \"test\"\ntop_k = 0"),
            "`layer[4].top_k`: must be at least 1",
        );
        has(
            &err("phase = \"test\"", "phase = \"test\"\ntop_k = 11"),
            "`layer[4].top_k`: top_k 11 exceeds the 10 scores",
        );
        has(
            &err("num_output = 16", "num_output = 16\naxis = 0"),
            "`layer[0].axis`: must be 1, 2 or 3",
        );
        has(
            &err("num_output = 10", "num_output = 10\naxis = 2"),
            "`layer[2].axis`: axis 2 is out of range for bottom `ip1` of shape (N, 16)",
        );
        check(&BASE.replace("num_output = 16", "num_output = 16\naxis = 3")).unwrap();
        has(
            &err(
                "num_output = 16",
                "num_output = 16\nweight_filler = { type = \"uniform\", min = 1, max = -1 }",
            ),
            "`layer[0].weight_filler.max`: a uniform filler needs min < max",
        );
        has(
            &err(
                "num_output = 16",
                "num_output = 16\nweight_filler = { type = \"gaussian\", std = 0 }",
            ),
            "t.toml:19:38: `layer[0].weight_filler.std`: a gaussian filler needs std > 0",
        );
        has(
            &err(
                "num_output = 16",
                "num_output = 16\nbias_filler = { type = \"constant\", value = nan }",
            ),
            "`layer[0].bias_filler.value`: must be a finite number",
        );
    }

    #[test]
    fn the_graph_is_checked() {
        has(
            &err(
                "bottom = [\"ip1\"]\ntop = [\"ip2\"]",
                "bottom = [\"ip0\"]\ntop = [\"ip2\"]",
            ),
            "t.toml:29:11: `layer[2].bottom`: bottom `ip0` is produced by no earlier layer",
        );
        has(&err("bottom = [\"data\"]", "bottom = [\"ip2\"]"), "`layer[0].bottom`: bottom `ip2` is produced by no earlier layer: layer `ip2` produces it from this layer's output, a cycle");
        let moved = err(
            "bottom = [\"ip2\", \"label\"]\ntop = [\"loss\"]",
            "bottom = [\"x\", \"label\"]\ntop = [\"loss\"]",
        );
        has(&moved, "bottom `x` is produced by no earlier layer");
        let later = BASE.replace("bottom = [\"ip2\", \"label\"]\ntop = [\"loss\"]", "bottom = [\"late\", \"label\"]\ntop = [\"loss\"]")
            + "\n[[layer]]\nname = \"late\"\ntype = \"relu\"\nbottom = [\"ip2\"]\ntop = [\"late\"]\n";
        has(
            &check(&later).unwrap_err().to_string(),
            "only the later layer `late` produces it",
        );
        has(
            &err("name = \"relu1\"", "name = \"ip1\""),
            "`layer[1].name`: layer name `ip1` is already used by layer[0]",
        );
        has(
            &err("name = \"relu1\"", "name = \"\""),
            "`layer[1].name`: must not be empty",
        );
        has(&err("bottom = [\"ip2\", \"label\"]\ntop = [\"loss\"]", "bottom = [\"ip2\"]\ntop = [\"loss\"]"), "`layer[3].bottom`: a layer of type softmax_with_loss takes 2 bottoms (scores, label), got 1");
        has(
            &err("top = [\"ip2\"]", "top = []"),
            "`layer[2].top`: a layer of type inner_product has 1 top, got 0",
        );
        has(
            &err("top = [\"ip2\"]", "top = [\"\"]"),
            "`layer[2].top`: blob names must not be empty",
        );
        has(&err("bottom = [\"ip1\"]\ntop = [\"ip2\"]", "bottom = [\"data\"]\ntop = [\"ip1\"]"), "`layer[2].top`: top `ip1` is already produced by layer `relu1`; a layer may reuse a blob name only in place");
        has(
            &err("top = [\"ip1\"]", "top = [\"label\"]"),
            "top `label` is already produced by the data source",
        );
        has(
            &err("name = \"loss\"", "name = \"loss\"\nphase = \"test\""),
            "`layer`: no loss layer runs in the train phase",
        );
        has(
            &err("name = \"loss\"", "name = \"loss\"\nloss_weight = 0.0"),
            "no loss layer runs in the train phase",
        );
        has(&err("name = \"ip2\"", "name = \"ip2\"\nphase = \"test\""), "bottom `ip2` is produced only in the test phase (by layer `ip2`), but this layer also runs in the train phase");
        check(&BASE.replace("phase = \"test\"", "phase = \"train\"")).unwrap();
        // In place on data is allowed.
        check(&BASE.replace("[[layer]]\nname = \"ip1\"", "[[layer]]\nname = \"scale\"\ntype = \"tanh\"\nbottom = [\"data\"]\ntop = [\"data\"]\n\n[[layer]]\nname = \"ip1\"")).unwrap();
        has(&check("layer = []\n[data]\nformat = \"digits\"\nbatch_size = 1\n[solver]\nbase_lr = 0.1\nmax_iter = 1\n").unwrap_err().to_string(), "`layer`: the net needs at least one layer");
    }

    #[test]
    fn idx_files_are_checked() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
        let idx = |ti: &str, tl: &str| {
            format!(
                "format = \"idx\"\ntrain_images = \"{}\"\ntrain_labels = \"{}\"\ntest_images = \"{}\"\ntest_labels = \"{}\"",
                root.join(ti).display(),
                root.join(tl).display(),
                root.join("test-images-idx3-ubyte.gz").display(),
                root.join("test-labels-idx1-ubyte.gz").display()
            )
        };
        let good = idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
        check(&BASE.replace("format = \"digits\"", &good)).unwrap();
        has(
            &err(
                "format = \"digits\"",
                &idx("nope.gz", "train-labels-idx1-ubyte.gz"),
            ),
            "t.toml:6:1: `data.train_images`: file not found: ",
        );
        has(
            &err(
                "format = \"digits\"",
                &idx("train-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte.gz"),
            ),
            "`data.train_images`: ",
        );
        has(
            &err(
                "format = \"digits\"",
                &idx("train-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte.gz"),
            ),
            "magic 0x00000801 (an IDX label file), expected IDX u8 images",
        );
        has(
            &err(
                "format = \"digits\"",
                &idx("train-images-idx3-ubyte.gz", "test-labels-idx1-ubyte.gz"),
            ),
            "`data.train_labels`: holds 297 labels but `data.train_images` holds 1500 images",
        );
        has(
            &err(
                "format = \"digits\"",
                &idx("README.md", "train-labels-idx1-ubyte.gz"),
            ),
            "`data.train_images`: ",
        );
        has(
            &err("format = \"digits\"", "format = \"idx\""),
            "`data.train_images`: format \"idx\" needs this file",
        );
        has(
            &err(
                "format = \"digits\"",
                &idx(".", "train-labels-idx1-ubyte.gz"),
            ),
            "not a file: ",
        );
    }

    #[test]
    fn cifar10_files_and_transform_keys_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let record = crate::data::cifar10::RECORD_BYTES;
        let good = dir.path().join("data_batch_1.bin");
        std::fs::write(&good, vec![0u8; 2 * record]).unwrap();
        let short = dir.path().join("short.bin");
        std::fs::write(&short, vec![0u8; 2 * record - 1]).unwrap();
        let cifar = |train: &str, extra: &str| {
            format!(
                "format = \"cifar10\"\ntrain_files = [\"{}\", \"{}\"]\ntest_files = [\"{}\"]\n{extra}",
                good.display(),
                dir.path().join(train).display(),
                good.display()
            )
        };
        let e = |train: &str, extra: &str| err("format = \"digits\"", &cifar(train, extra));
        check(&BASE.replace("format = \"digits\"", &cifar("data_batch_1.bin", ""))).unwrap();
        has(
            &e("gone.bin", ""),
            "`data.train_files[1]`: file not found: ",
        );
        has(&e("gone.bin", ""), "gone.bin");
        has(&e("short.bin", ""), "`data.train_files[1]`: ");
        has(
            &e("short.bin", ""),
            "short.bin: size 6145 is not a positive multiple of the CIFAR-10 record size 3073",
        );
        has(
            &err("format = \"digits\"", "format = \"cifar10\""),
            "`data.train_files`: format \"cifar10\" needs this list of files",
        );
        has(
            &err("batch_size = 32", "batch_size = 32\ntrain_files = []"),
            "`data.train_files`: does not apply to format \"digits\"",
        );
        // Transform keys against the 3×32×32 records.
        let ok = "data_batch_1.bin";
        has(
            &e(ok, "crop_size = 33"),
            "`data.crop_size`: must not exceed the records' height and width (32×32), got 33",
        );
        has(
            &e(ok, "mean_value = [1.0, 2.0]"),
            "`data.mean_value`: 2 values given for records of 3 channels: give 1 or 3",
        );
        has(
            &e(ok, "mean_value = [1.0]\nmean = 3.0"),
            "`data.mean_value`: set `mean`",
        );
        for means in ["mean_value = [1.0]", "mean = 3.0"] {
            has(
                &e(ok, &format!("{means}\nmean_file = \"mean.binaryproto\"")),
                "`data.mean_file`: set one of `mean`, `mean_value` and `mean_file`, not several",
            );
        }
        // The file itself is read when the data are opened (compute-mean writes it).
        check(&BASE.replace(
            "format = \"digits\"",
            &cifar(ok, "mean_file = \"not_yet.binaryproto\""),
        ))
        .unwrap();
        has(
            &e(ok, "crop_size = 8\nshift = 8"),
            "`data.shift`: must be smaller than the crop's height and width (8×8), got 8",
        );
        check(&BASE.replace(
            "format = \"digits\"",
            &cifar(
                ok,
                "crop_size = 28\nmirror = true\nmean_value = [125.3, 123.0, 113.9]\nscale = 0.017",
            ),
        ))
        .unwrap();
        check(&BASE.replace("format = \"digits\"", &cifar(ok, "mean_value = [128]"))).unwrap();
        // The digits are one channel.
        has(
            &err("batch_size = 32", "batch_size = 32\nmean_value = [1, 2, 3]"),
            "give 1 or 1",
        );
    }

    #[test]
    fn the_quickstart_is_valid() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("config/quickstart.toml"),
        )
        .unwrap();
        check(&text).unwrap();
    }

    /// Every `tests/configs/bad/<name>.toml` fails with exit code 2 and a message holding each line
    /// of `<name>.expect` (the key, the message, and the `name.toml:line:col:` where one applies);
    /// `<name>.sets`, where present, holds `--set` options, one a line.
    #[test]
    fn the_bad_config_corpus_fails_as_expected() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/bad");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        files.sort();
        assert!(
            files.len() >= 12,
            "only {} files in {}",
            files.len(),
            dir.display()
        );
        for file in files {
            let expect = std::fs::read_to_string(file.with_extension("expect"))
                .unwrap_or_else(|e| panic!("{}: no .expect file: {e}", file.display()));
            let sets: Vec<String> = std::fs::read_to_string(file.with_extension("sets"))
                .map(|t| t.lines().map(str::to_string).collect())
                .unwrap_or_default();
            let e = match crate::config::load(&file, &sets) {
                Ok(_) => panic!("{} loads without error", file.display()),
                Err(e) => e,
            };
            assert_eq!(e.exit_code(), 2, "{}: {e}", file.display());
            let msg = e.to_string();
            let lines: Vec<&str> = expect.lines().filter(|l| !l.trim().is_empty()).collect();
            assert!(
                lines.iter().any(|l| l.contains('`')),
                "{}: the .expect names no key",
                file.display()
            );
            for want in lines {
                assert!(
                    msg.contains(want),
                    "{}:\n  error: {msg}\n  lacks: {want}",
                    file.display()
                );
            }
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            if let Error::Config { pos: Some(p), .. } = &e {
                assert!(
                    msg.contains(&format!("{name}:{}:{}: ", p.line, p.col)),
                    "{msg}"
                );
            }
        }
    }

    #[test]
    fn the_good_configs_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/good");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                crate::config::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 1);
    }

    const CNN: &str = r#"[data]
format = "digits"
batch_size = 32

[solver]
base_lr = 0.05
max_iter = 10

[[layer]]
name = "conv1"
type = "convolution"
bottom = ["data"]
top = ["conv1"]
num_output = 8
kernel_size = 3
pad = 1

[[layer]]
name = "pool1"
type = "pooling"
bottom = ["conv1"]
top = ["pool1"]
kernel_size = 2
stride = 2

[[layer]]
name = "ip"
type = "inner_product"
bottom = ["pool1"]
top = ["ip"]
num_output = 10

[[layer]]
name = "loss"
type = "softmax_with_loss"
bottom = ["ip", "label"]
top = ["loss"]
"#;

    /// The error of `CNN` with `from` replaced by `to`.
    fn cnn_err(from: &str, to: &str) -> String {
        assert!(CNN.contains(from), "{from:?} not in CNN");
        match check(&CNN.replacen(from, to, 1)) {
            Ok(()) => panic!("no error with {to:?}"),
            Err(e) => {
                assert_eq!(e.exit_code(), 2);
                e.to_string()
            }
        }
    }

    /// `CNN` with the layers in `extra` (TOML) inserted before the inner product, which then
    /// reads `bottom`.
    fn cnn_with(extra: &str, bottom: &str) -> String {
        CNN.replace(
            "[[layer]]\nname = \"ip\"",
            &format!("{extra}\n\n[[layer]]\nname = \"ip\""),
        )
        .replace(
            "bottom = [\"pool1\"]\ntop = [\"ip\"]",
            &format!("bottom = [\"{bottom}\"]\ntop = [\"ip\"]"),
        )
    }

    #[test]
    fn the_cnn_config_is_valid() {
        check(CNN).unwrap();
        check(&CNN.replace("kernel_size = 2\nstride = 2", "global_pooling = true")).unwrap();
    }

    #[test]
    fn spatial_keys_are_checked() {
        has(
            &cnn_err("kernel_size = 3", "kernel_size = 0"),
            "t.toml:15:1: `layer[0].kernel_size`: must be between 1 and 1048576, got 0",
        );
        has(
            &cnn_err("kernel_size = 3\n", ""),
            "t.toml:9:1: `layer[0].kernel_size`: a layer of type convolution needs `kernel_size`",
        );
        has(
            &cnn_err("kernel_size = 2\nstride = 2", "stride = 2"),
            "`layer[1].kernel_size`: a layer of type pooling needs `kernel_size` (or global_pooling = true)",
        );
        has(
            &cnn_err("stride = 2", "stride = 0"),
            "t.toml:24:1: `layer[1].stride`: must be between 1",
        );
        has(
            &cnn_err("pad = 1", "pad = 1\ndilation = 0"),
            "t.toml:17:1: `layer[0].dilation`: must be between 1",
        );
        has(
            &cnn_err("stride = 2", "stride = 2\npad = 2"),
            "t.toml:25:1: `layer[1].pad`: must be smaller than the kernel [2, 2], got [2, 2]",
        );
        has(
            &cnn_err("kernel_size = 3", "kernel_size = [3, 3, 3]"),
            "t.toml:15:1: `layer[0].kernel_size`: takes 1 or 2 values (one per spatial axis; 2-D only)",
        );
        has(
            &cnn_err("kernel_size = 3", "kernel_size = [3, 0]"),
            "t.toml:15:19: `layer[0].kernel_size`: must be between 1 and 1048576, got 0",
        );
        has(
            &cnn_err("kernel_size = 3", "kernel_size = 11"),
            "t.toml:15:1: `layer[0].kernel_size`: the kernel spans 11 pixels, more than the padded input (10)",
        );
        has(
            &cnn_err("stride = 2", "stride = 2\nglobal_pooling = true"),
            "t.toml:23:1: `layer[1].kernel_size`: `kernel_size` does not apply with global_pooling = true",
        );
        has(
            &cnn_err("kernel_size = 3", "kernel_size = 3\nnegative_slope = 1.0"),
            "`layer[0].negative_slope`: `negative_slope` does not apply to a layer of type convolution",
        );
        // Pooling needs an image: after the inner product there is none.
        let text = CNN.replace(
            "[[layer]]\nname = \"loss\"",
            "[[layer]]\nname = \"p2\"\ntype = \"pooling\"\nbottom = [\"ip\"]\ntop = [\"p2\"]\nkernel_size = 1\n\n[[layer]]\nname = \"loss\"",
        );
        has(
            &check(&text).unwrap_err().to_string(),
            "`layer[3].bottom`: bottom `ip` of shape (N, 10) is not an image (N, C, H, W)",
        );
    }

    #[test]
    fn convolution_counts_and_groups_are_checked() {
        has(
            &cnn_err("num_output = 8", "num_output = 8\ngroup = 3"),
            "t.toml:15:1: `layer[0].group`: must be at least 1 and divide num_output 8, got 3",
        );
        has(
            &cnn_err("num_output = 8", "num_output = 8\ngroup = 2"),
            "`layer[0].group`: group 2 does not divide the 1 channels of bottom `data`",
        );
        has(
            &cnn_err("num_output = 8\n", ""),
            "`layer[0].num_output`: a layer of type convolution needs `num_output`",
        );
        has(
            &cnn_err("num_output = 8", "num_output = 8\nlr_mult = [1, 2, 3]"),
            "`layer[0].lr_mult`: has 3 values but the layer has 2 learnable tensors (weight, bias)",
        );
        has(
            &cnn_err(
                "num_output = 8",
                "num_output = 8\nbias_term = false\ndecay_mult = [1, 0]",
            ),
            "`layer[0].decay_mult`: has 2 values but the layer has 1 learnable tensor",
        );
        check(&CNN.replace("num_output = 8", "num_output = 8\nlr_mult = [1, 2]")).unwrap();
    }

    #[test]
    fn convolution_memory_is_reported_in_gib() {
        let big = CNN.replace("batch_size = 32", "batch_size = 100000");
        let e = check(&big.replace("num_output = 8", "num_output = 100000"))
            .unwrap_err()
            .to_string();
        has(
            &e,
            "t.toml:14:1: `layer[0].num_output`: the top `conv1` (N, 100000, 8, 8), batch 100000 would need 2384.2 GiB of f32 (limit 64 GiB)",
        );
        let synth = CNN.replace(
            "format = \"digits\"",
            "format = \"synthetic\"\nshape = [64, 1024, 1024]\ntrain_size = 1\ntest_size = 1",
        );
        let e = check(
            &synth
                .replace("batch_size = 32", "batch_size = 1")
                .replace("kernel_size = 3", "kernel_size = 31"),
        )
        .unwrap_err()
        .to_string();
        has(&e, "`layer[0].kernel_size`: the column buffer");
        has(&e, "GiB of f32 (limit 64 GiB)");
    }

    #[test]
    fn other_layer_types_are_checked() {
        let eltwise = "[[layer]]\nname = \"sum\"\ntype = \"eltwise\"\nbottom = [\"pool1\", \"pool1b\"]\ntop = [\"sum\"]";
        let twin = "[[layer]]\nname = \"twin\"\ntype = \"pooling\"\nbottom = [\"conv1\"]\ntop = [\"pool1b\"]\nkernel_size = 2\nstride = 2";
        check(&cnn_with(
            &format!("{twin}\n\n{eltwise}\ncoeff = [1.0, -1.0]"),
            "sum",
        ))
        .unwrap();
        has(
            &check(&cnn_with(
                &format!("{twin}\n\n{eltwise}\ncoeff = [1.0]"),
                "sum",
            ))
            .unwrap_err()
            .to_string(),
            "`layer[3].coeff`: has 1 values but the layer has 2 bottoms",
        );
        has(
            &check(&cnn_with(
                &format!("{twin}\n\n{eltwise}\noperation = \"max\"\ncoeff = [1.0, 1.0]"),
                "sum",
            ))
            .unwrap_err()
            .to_string(),
            "`layer[3].coeff`: `coeff` applies only to operation \"sum\"",
        );
        let one =
            "[[layer]]\nname = \"sum\"\ntype = \"eltwise\"\nbottom = [\"pool1\"]\ntop = [\"sum\"]";
        has(
            &check(&cnn_with(one, "sum")).unwrap_err().to_string(),
            "`layer[2].bottom`: a layer of type eltwise takes 2 or more bottoms, got 1",
        );
        let cat = "[[layer]]\nname = \"cat\"\ntype = \"concat\"\nbottom = [\"pool1\", \"conv1\"]\ntop = [\"cat\"]";
        has(
            &check(&cnn_with(cat, "cat")).unwrap_err().to_string(),
            "`layer[2].bottom`: bottoms [32, 8, 4, 4] and [32, 8, 8, 8] differ on an axis other than 1",
        );
        check(&cnn_with(&format!("{twin}\n\n[[layer]]\nname = \"cat\"\ntype = \"concat\"\nbottom = [\"pool1\", \"pool1b\"]\ntop = [\"cat\"]\naxis = 2"), "cat")).unwrap();
        let scale =
            "[[layer]]\nname = \"s\"\ntype = \"scale\"\nbottom = [\"pool1\"]\ntop = [\"s\"]";
        check(&cnn_with(
            &format!("{scale}\nbias_term = true\nlr_mult = [1, 2]"),
            "s",
        ))
        .unwrap();
        has(
            &check(&cnn_with(&format!("{scale}\nlr_mult = [1, 2]"), "s"))
                .unwrap_err()
                .to_string(),
            "`layer[2].lr_mult`: has 2 values but the layer has 1 learnable tensor (scale)",
        );
        has(
            &check(&cnn_with(
                &format!("{scale}\nbias_filler = {{ type = \"constant\" }}"),
                "s",
            ))
            .unwrap_err()
            .to_string(),
            "`layer[2].bias_filler`: `bias_filler` does not apply unless bias_term = true",
        );
        has(
            &check(&cnn_with(&format!("{scale}\nnum_axes = 4"), "s"))
                .unwrap_err()
                .to_string(),
            "`layer[2].num_axes`: `num_axes` 4 is out of range",
        );
        let reshape =
            "[[layer]]\nname = \"r\"\ntype = \"reshape\"\nbottom = [\"pool1\"]\ntop = [\"r\"]";
        check(&cnn_with(&format!("{reshape}\nshape = [0, -1, 2]"), "r")).unwrap();
        has(
            &check(&cnn_with(reshape, "r")).unwrap_err().to_string(),
            "`layer[2].shape`: a layer of type reshape needs `shape`",
        );
        has(
            &check(&cnn_with(&format!("{reshape}\nshape = [0, -1, -1]"), "r"))
                .unwrap_err()
                .to_string(),
            "`layer[2].shape`: may infer (-1) one axis only",
        );
        has(
            &check(&cnn_with(&format!("{reshape}\nshape = [0, 7, -1]"), "r"))
                .unwrap_err()
                .to_string(),
            "`layer[2].shape`: cannot infer the −1",
        );
        let power =
            "[[layer]]\nname = \"p\"\ntype = \"power\"\nbottom = [\"pool1\"]\ntop = [\"p\"]";
        has(
            &check(&cnn_with(&format!("{power}\npower = nan"), "p"))
                .unwrap_err()
                .to_string(),
            "`layer[2].power`: must be a finite number",
        );
        let flat =
            "[[layer]]\nname = \"f\"\ntype = \"flatten\"\nbottom = [\"pool1\"]\ntop = [\"f\"]";
        check(&cnn_with(flat, "f")).unwrap();
        has(
            &check(&cnn_with(&format!("{flat}\nend_axis = 7"), "f"))
                .unwrap_err()
                .to_string(),
            "`layer[2].end_axis`: axes 1 ..= 7 are out of range",
        );
    }
}
