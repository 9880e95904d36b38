//! Deterministic synthetic records for benchmarks and tests: pool record s of a split is computed
//! from (seed, split, s) by a counter-based hash, and record i of the split is pool record
//! `i mod P`, so any record reads the same whatever the order or topology. The pool of P records is
//! generated once when the source is made (P = the split's size, at most [`POOL_BYTES`] of f32:
//! e.g. all 60 000 records of 1×28×28, 2 730 of 3×32×32, 55 of 3×224×224), so reading a record is
//! a copy and costs a benchmark no more than reading a file would. The data are learnable: each
//! class has a prototype image shared by both splits, and a record is half its class's prototype
//! and half noise.
//!
//! Definitions (wrapping u64 arithmetic, `h` = [`splitmix64`](super::order::splitmix64),
//! γ = [`GAMMA`], `unit(x) = (x >> 40) / 2²⁴` in [0, 1)):
//!
//! - `k = h(seed ^ SYNTH_SALT)`; split tag t = 1 for train, 2 for test;
//! - record key `rk(i) = h(k ^ h(t·γ ^ h(i mod P)))`, label `= h(rk(i) ^ LABEL_SALT) mod classes`;
//! - prototype key `pk(c) = h(k ^ PROTO_SALT ^ h(c))`;
//! - pixel j (0-based) of record i, before normalisation:
//!   `0.5·unit(h(pk(label) + (j+1)·γ)) + 0.5·unit(h(rk(i) + (j+1)·γ))`.

use super::order::{splitmix64 as h, GAMMA};
use super::{config_error, Split};
use crate::data::RecordSource;
use crate::error::Result;
use rayon::prelude::*;
use std::sync::Arc;

/// The most memory a split's pool of generated records takes (f32 bytes).
pub const POOL_BYTES: usize = 32 << 20;

const SYNTH_SALT: u64 = 0x5359_4e54_4845_5449; // "SYNTHETI"
const LABEL_SALT: u64 = 0x4c41_4245_4c53_414c; // "LABELSAL"
const PROTO_SALT: u64 = 0x5052_4f54_4f54_5950; // "PROTOTYP"

/// Records of shape `[C, H, W]` in `classes` classes, read from a pool generated once.
#[derive(Clone)]
pub struct SyntheticSource {
    shape: [usize; 3],
    size: usize,
    classes: usize,
    len: usize,
    key: u64,
    tag: u64,
    mean: f32,
    scale: f32,
    /// The pool holds whole 8-bit pixels ([`SyntheticSource::with_u8_pixels`]).
    u8_pixels: bool,
    name: String,
    /// `(P, C, H, W)` raw pixels of the pool records, shared by clones.
    pool: Arc<[f32]>,
    /// `(P)` their labels.
    pool_labels: Arc<[u32]>,
}

impl std::fmt::Debug for SyntheticSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyntheticSource")
            .field("name", &self.name)
            .field("shape", &self.shape)
            .field("len", &self.len)
            .field("pool", &self.pool_labels.len())
            .field("classes", &self.classes)
            .finish()
    }
}

/// Pool records for `len` records of `size` floats: all of them, up to [`POOL_BYTES`], at least 1.
pub fn pool_records(size: usize, len: usize) -> usize {
    (POOL_BYTES / size.max(1).saturating_mul(4)).clamp(1, len.max(1))
}

/// A config `shape` of 1 to 3 positive dimensions as `[C, H, W]`: `[W]` → `[1, 1, W]`,
/// `[H, W]` → `[1, H, W]`.
pub fn pad_shape(shape: &[usize]) -> Result<[usize; 3]> {
    let padded = match *shape {
        [w] => [1, 1, w],
        [h, w] => [1, h, w],
        [c, h, w] => [c, h, w],
        _ => {
            return Err(config_error(
                "data.shape",
                format!(
                    "{} dimensions given, expected 1 to 3 ([C, H, W])",
                    shape.len()
                ),
            ))
        }
    };
    if padded.contains(&0) {
        return Err(config_error(
            "data.shape",
            format!("{shape:?} has a zero dimension"),
        ));
    }
    if padded
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .is_none()
    {
        return Err(config_error(
            "data.shape",
            format!("{shape:?} is too large"),
        ));
    }
    Ok(padded)
}

impl SyntheticSource {
    /// `len` records of `shape` (positive dimensions) in `classes` (≥ 1) classes, keyed by
    /// (seed, split). Pixels lie in [0, 1) until [`SyntheticSource::with_normalization`].
    /// Generates the pool (on all cores).
    pub fn new(shape: [usize; 3], classes: usize, len: usize, seed: u64, split: Split) -> Self {
        assert!(classes > 0, "synthetic data with no classes");
        assert!(!shape.contains(&0), "synthetic shape {shape:?}");
        let tag = match split {
            Split::Train => 1,
            Split::Test => 2,
        };
        let size: usize = shape.iter().product();
        let mut s = SyntheticSource {
            shape,
            size,
            classes,
            len,
            key: h(seed ^ SYNTH_SALT),
            tag,
            mean: 0.0,
            scale: 1.0,
            u8_pixels: false,
            name: format!(
                "synthetic:{}",
                if split == Split::Train {
                    "train"
                } else {
                    "test"
                }
            ),
            pool: Arc::from(Vec::new()),
            pool_labels: Arc::from(Vec::new()),
        };
        let p = pool_records(size, len);
        let mut pool = vec![0.0f32; p * size];
        pool.par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, out)| s.generate(i, out));
        s.pool_labels = (0..p).map(|i| s.label_of_key(s.record_key(i))).collect();
        s.pool = Arc::from(pool);
        s
    }

    /// Pool record `i`, raw.
    fn generate(&self, i: usize, out: &mut [f32]) {
        let rk = self.record_key(i);
        let label = self.label_of_key(rk);
        let pk = h(self.key ^ PROTO_SALT ^ h(u64::from(label)));
        let mut step = 0u64;
        for o in out.iter_mut() {
            step = step.wrapping_add(GAMMA);
            *o = 0.5 * unit(h(pk.wrapping_add(step))) + 0.5 * unit(h(rk.wrapping_add(step)));
        }
    }

    /// Number of distinct records P; record i is pool record i mod P.
    pub fn pool_len(&self) -> usize {
        self.pool_labels.len()
    }

    /// Records come out as `(pixel − mean) · scale` (no longer whole pixels, whatever the pool).
    pub fn with_normalization(mut self, mean: f32, scale: f32) -> Self {
        self.mean = mean;
        self.scale = scale;
        self.u8_pixels = false;
        self
    }

    /// The same records as whole 8-bit pixels: a value `v` in [0, 1) becomes `⌊256 v⌋`, 0 to
    /// 255, and the source says so ([`RecordSource::values_are_u8`]), so that its batches travel
    /// as bytes, as real images' do. Any normalisation set before is dropped.
    pub fn with_u8_pixels(mut self) -> Self {
        let pool: Vec<f32> = self.pool.iter().map(|&v| (v * 256.0).floor()).collect();
        self.pool = Arc::from(pool);
        self.mean = 0.0;
        self.scale = 1.0;
        self.u8_pixels = true;
        self
    }

    fn record_key(&self, i: usize) -> u64 {
        h(self.key ^ h(self.tag.wrapping_mul(GAMMA) ^ h(i as u64)))
    }

    fn label_of_key(&self, rk: u64) -> u32 {
        (h(rk ^ LABEL_SALT) % self.classes as u64) as u32
    }
}

fn unit(x: u64) -> f32 {
    (x >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

impl RecordSource for SyntheticSource {
    fn len(&self) -> usize {
        self.len
    }

    fn record_shape(&self) -> [usize; 3] {
        self.shape
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn fill(&self, index: usize, out: &mut [f32]) {
        assert!(index < self.len, "record {index} of {}", self.len);
        assert_eq!(out.len(), self.size, "record buffer of {}", self.name);
        let s = index % self.pool_len();
        let src = &self.pool[s * self.size..(s + 1) * self.size];
        if self.mean == 0.0 && self.scale == 1.0 {
            out.copy_from_slice(src);
        } else {
            for (o, &v) in out.iter_mut().zip(src) {
                *o = (v - self.mean) * self.scale;
            }
        }
    }

    fn label(&self, index: usize) -> u32 {
        assert!(index < self.len, "record {index} of {}", self.len);
        self.pool_labels[index % self.pool_len()]
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn values_are_u8(&self) -> bool {
        self.u8_pixels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_padded() {
        assert_eq!(pad_shape(&[5]).unwrap(), [1, 1, 5]);
        assert_eq!(pad_shape(&[4, 5]).unwrap(), [1, 4, 5]);
        assert_eq!(pad_shape(&[3, 4, 5]).unwrap(), [3, 4, 5]);
        assert!(pad_shape(&[]).is_err());
        assert!(pad_shape(&[1, 2, 3, 4]).is_err());
        assert!(pad_shape(&[3, 0, 5]).is_err());
        assert!(pad_shape(&[usize::MAX, 2]).is_err());
    }

    /// `pixels = "u8"`: the float records' values as whole pixels, the same labels, and batches
    /// that travel as bytes and normalise to the floats the transform gives.
    #[test]
    fn u8_pixels_are_the_float_records_quantised() {
        use crate::data::transform::{Scratch, Transform};
        let floats = SyntheticSource::new([3, 4, 5], 7, 300, 5, Split::Train);
        let bytes = floats.clone().with_u8_pixels();
        assert!(!floats.values_are_u8() && bytes.values_are_u8());
        assert!(!bytes.clone().with_normalization(1.0, 0.5).values_are_u8());
        let (mut f, mut b) = (vec![0.0f32; 60], vec![0.0f32; 60]);
        let (mut lowest, mut highest) = (f32::MAX, f32::MIN);
        for i in 0..300 {
            floats.fill(i, &mut f);
            bytes.fill(i, &mut b);
            assert_eq!(floats.label(i), bytes.label(i));
            for (x, y) in f.iter().zip(&b) {
                assert_eq!(*y, (x * 256.0).floor(), "record {i}");
                assert!(
                    y.fract() == 0.0 && (0.0..=255.0).contains(y),
                    "record {i}: {y}"
                );
            }
            lowest = lowest.min(b.iter().copied().fold(f32::MAX, f32::min));
            highest = highest.max(b.iter().copied().fold(f32::MIN, f32::max));
        }
        assert!(
            lowest < 32.0 && highest > 223.0,
            "pixels in [{lowest}, {highest}]"
        );
        // A per-channel mean and a scale, as cifar10_quick's: bytes through the normalisation
        // are the floats of the transform, bit for bit.
        let t = Transform::new(
            [3, 4, 5],
            0,
            false,
            &[125.3, 123.0, 113.9],
            1.0 / 255.0,
            0,
            1,
        );
        assert!(t.u8_batches(&bytes) && !t.u8_batches(&floats));
        let (mut want, mut pixels, mut got) = (vec![0.0; 60], vec![0u8; 60], vec![0.0; 60]);
        let mut scratch = Scratch::default();
        t.train(&bytes, 9, 0, &mut want, &mut scratch).unwrap();
        t.train_u8(&bytes, 9, 0, &mut pixels, &mut scratch).unwrap();
        t.normalization().apply(&pixels, &mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn records_are_deterministic_and_split_dependent() {
        let a = SyntheticSource::new([2, 3, 4], 5, 100, 11, Split::Train);
        let b = SyntheticSource::new([2, 3, 4], 5, 100, 11, Split::Train);
        let t = SyntheticSource::new([2, 3, 4], 5, 100, 11, Split::Test);
        let s = SyntheticSource::new([2, 3, 4], 5, 100, 12, Split::Train);
        let rec = |src: &SyntheticSource, i| {
            let mut v = vec![0.0; 24];
            src.fill(i, &mut v);
            v
        };
        // Reading in any order gives the same records.
        for i in (0..100).rev() {
            assert_eq!(rec(&a, i), rec(&b, i));
            assert_eq!(a.label(i), b.label(i));
            assert!(rec(&a, i).iter().all(|v| (0.0..1.0).contains(v)));
        }
        assert_ne!(rec(&a, 3), rec(&t, 3));
        assert_ne!(rec(&a, 3), rec(&s, 3));
        assert_ne!(rec(&a, 3), rec(&a, 4));
        let n = a.with_normalization(0.5, 2.0);
        let (x, y) = (rec(&b, 7), rec(&n, 7));
        for (x, y) in x.iter().zip(&y) {
            assert_eq!(*y, (x - 0.5) * 2.0);
        }
    }

    #[test]
    fn large_records_repeat_a_bounded_pool() {
        let shape = [3, 224, 224];
        let size = 3 * 224 * 224;
        let a = SyntheticSource::new(shape, 1000, 1_000_000, 5, Split::Train);
        let p = a.pool_len();
        assert_eq!(p, POOL_BYTES / (size * 4));
        assert!(p > 1 && p * size * 4 <= POOL_BYTES);
        let (mut x, mut y) = (vec![0.0; size], vec![0.0; size]);
        a.fill(7, &mut x);
        a.fill(7 + 3 * p, &mut y);
        assert_eq!(x, y);
        assert_eq!(a.label(7), a.label(7 + 3 * p));
        a.fill(8, &mut y);
        assert_ne!(x, y);
        // Small sets are generated whole.
        assert_eq!(pool_records(3 * 32 * 32, 100), 100);
        assert_eq!(
            pool_records(3 * 32 * 32, 50_000),
            POOL_BYTES / (3 * 32 * 32 * 4)
        );
        assert_eq!(pool_records(usize::MAX / 8, 10), 1);
    }

    #[test]
    fn classes_are_balanced_and_separable() {
        let classes = 4;
        let train = SyntheticSource::new([1, 1, 64], classes, 2000, 3, Split::Train);
        let test = SyntheticSource::new([1, 1, 64], classes, 400, 3, Split::Test);
        // Class means from the training split.
        let mut means = vec![vec![0.0f64; 64]; classes];
        let mut counts = vec![0usize; classes];
        let mut v = vec![0.0; 64];
        for i in 0..train.len() {
            let l = train.label(i) as usize;
            train.fill(i, &mut v);
            counts[l] += 1;
            for (m, x) in means[l].iter_mut().zip(&v) {
                *m += f64::from(*x);
            }
        }
        assert!(counts.iter().all(|&c| c > 400), "{counts:?}");
        for (m, c) in means.iter_mut().zip(&counts) {
            m.iter_mut().for_each(|x| *x /= *c as f64);
        }
        // The nearest class mean classifies the test split almost perfectly.
        let mut correct = 0;
        for i in 0..test.len() {
            test.fill(i, &mut v);
            let dist = |m: &Vec<f64>| -> f64 {
                m.iter()
                    .zip(&v)
                    .map(|(a, b)| (a - f64::from(*b)).powi(2))
                    .sum()
            };
            let best = (0..classes)
                .min_by(|&a, &b| dist(&means[a]).total_cmp(&dist(&means[b])))
                .unwrap();
            correct += usize::from(best == test.label(i) as usize);
        }
        assert!(
            correct * 100 >= test.len() * 95,
            "{correct} of {}",
            test.len()
        );
    }
}
