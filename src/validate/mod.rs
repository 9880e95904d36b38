//! Loading a config: [`load`] parses it ([`crate::config::parse`]) and validates it as a whole
//! before anything is allocated. It sits above `config`, `layers` and `data`, because it reads
//! the IDX and CIFAR-10 headers (`data`'s checks) and infers shapes through the layers' own
//! `reshape`. Whole-config validation: every value range, the
//! keys each data format, lr policy, update rule and layer type needs or rejects, the layer graph
//! (bottoms produced by earlier layers in the same phase, no cycles, a train-phase loss), and the
//! memory the per-replica tensors would take. Each error names the dotted key and its position.
//!
//! Per-sample shapes are propagated through the layers (data `(C, H, W)`, label `()`), so an
//! inner product's weights `(num_output, K)` and tops `(N, num_output)` are checked against the
//! 64 GiB tensor limit, and a classifier with fewer scores than the data has classes is caught.
//!
//! One file per section: [`cluster`], [`data`] (its file checks are `data`'s own; the image
//! formats' keys in [`image_data`]), [`solver`], [`layers`] (keys through
//! [`crate::config::layer_params`], the graph and the shapes).

mod cluster;
mod data;
mod image_data;
mod layers;
mod solver;
#[cfg(test)]
mod tests;

pub use layers::train_loss;

use crate::config::{name_of, Config, Source};
use crate::config::{parse, parse_bytes, parse_str};
use crate::error::{Error, Result};
use std::collections::HashMap;
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
/// The bundled digits: 8×8 grey images of 10 classes.
const DIGITS_SHAPE: [u64; 3] = [1, 8, 8];
const DIGITS_CLASSES: usize = 10;
/// Classes assumed for IDX and synthetic data when `classes` is not set.
const DEFAULT_CLASSES: usize = 10;

/// Blobs available in one phase: name → (producing layer, or `None` for the data source;
/// per-sample shape).
type Blobs = HashMap<String, (Option<usize>, Vec<u64>)>;

/// Reads, overrides, deserialises and validates the config file at `path`. Relative data paths
/// in the file are resolved against the file's directory; relative paths given by `--set`
/// against the current directory.
pub fn load(path: &Path, sets: &[String]) -> Result<(Config, Source)> {
    checked(parse(path, sets)?)
}

/// Like [`load`], for a config file's bytes held in memory (which need not be UTF-8): `name`
/// stands for the file in messages and relative data paths are resolved against `base_dir`.
/// Never panics, whatever the bytes (the fuzz targets' entry).
pub fn load_bytes(
    name: &str,
    bytes: &[u8],
    base_dir: &Path,
    sets: &[String],
) -> Result<(Config, Source)> {
    checked(parse_bytes(name, bytes, base_dir, sets)?)
}

/// Like [`load`], for a config held in memory.
pub fn load_str(
    name: &str,
    text: &str,
    base_dir: &Path,
    sets: &[String],
) -> Result<(Config, Source)> {
    checked(parse_str(name, text, base_dir, sets)?)
}

fn checked((config, source): (Config, Source)) -> Result<(Config, Source)> {
    config.validate(&source)?;
    Ok((config, source))
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
}
