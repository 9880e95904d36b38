//! Fillers: the initial values of learnable tensors (Caffe's `constant`, `uniform`, `gaussian`,
//! `xavier`, `msra`, `bilinear`), and the fan computations xavier and msra scale by.
//!
//! `bilinear` (BVLC Caffe's, for the weight `(.., .., K, K)` of an upsampling deconvolution)
//! writes the same `K × K` interpolation kernel into every filter: with `f = ⌈K/2⌉` and
//! `c = (K − 1)/(2f)`, element `(y, x)` is `(1 − |x/f − c|)·(1 − |y/f − c|)`.
//!
//! Fans follow Caffe's `filler.hpp` for a tensor of shape `(d0, d1, ...)` with `count` elements:
//! - `fan_in = count / d0` — for an inner-product weight `(num_output, K)` that is `K`;
//! - `fan_out = count / d1` — `num_output` for the same weight; a 1-D tensor `(d0)` has
//!   `fan_out = count`, as in Caffe;
//! - `average = (fan_in + fan_out) / 2`.
//!
//! `xavier` draws from `U(-sqrt(3/n), +sqrt(3/n))` (variance `1/n`); `msra` from `N(0, 2/n)`, with
//! `n` the fan that `variance_norm` picks.
//!
//! ```
//! use p2ptrain::layers::filler;
//! use rand::SeedableRng;
//!
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
//! let mut w = vec![0.0f32; 10 * 784];
//! filler::fill(&filler::xavier(), &[10, 784], &mut rng, &mut w);
//! let bound = (3.0f32 / 784.0).sqrt();
//! assert!(w.iter().all(|v| v.abs() <= bound));
//! ```

use crate::config::{FillerConfig, FillerKind, VarianceNorm};
use rand::distributions::{Distribution, Uniform};
use rand::Rng;
use rand_distr::Normal;

/// `{ type = "xavier" }` with the fan-in norm: the default weight filler.
pub fn xavier() -> FillerConfig {
    FillerConfig {
        kind: FillerKind::Xavier,
        ..FillerConfig::constant(0.0)
    }
}

/// `(fan_in, fan_out)` of a tensor of `shape`, Caffe's definitions (see the module docs). A scalar
/// (empty shape) has both fans 1; a zero-sized axis gives fans of 0.
pub fn fans(shape: &[usize]) -> (usize, usize) {
    let count: usize = shape.iter().product();
    let fan_in = match shape.first() {
        Some(&d0) if d0 > 0 => count / d0,
        Some(_) => 0,
        None => 1,
    };
    let fan_out = match shape.get(1) {
        Some(&d1) if d1 > 0 => count / d1,
        Some(_) => 0,
        None => count,
    };
    (fan_in, fan_out)
}

/// The `n` that xavier and msra divide by: the fan `norm` picks for `shape`.
pub fn variance_n(norm: VarianceNorm, shape: &[usize]) -> f32 {
    let (fan_in, fan_out) = fans(shape);
    match norm {
        VarianceNorm::FanIn => fan_in as f32,
        VarianceNorm::FanOut => fan_out as f32,
        VarianceNorm::Average => (fan_in + fan_out) as f32 / 2.0,
    }
}

/// Checks the parameters of a filler: `uniform` needs `min <= max`, `gaussian` a finite `std >= 0`,
/// every value must be finite. The message names the offending key.
pub fn check(cfg: &FillerConfig) -> std::result::Result<(), String> {
    let finite = |key: &str, v: f32| {
        if v.is_finite() {
            Ok(())
        } else {
            Err(format!("`{key}` must be finite, got {v}"))
        }
    };
    match cfg.kind {
        FillerKind::Constant => finite("value", cfg.value),
        FillerKind::Uniform => {
            finite("min", cfg.min)?;
            finite("max", cfg.max)?;
            if cfg.min > cfg.max {
                return Err(format!(
                    "`min` ({}) must not exceed `max` ({})",
                    cfg.min, cfg.max
                ));
            }
            Ok(())
        }
        FillerKind::Gaussian => {
            finite("mean", cfg.mean)?;
            finite("std", cfg.std)?;
            if cfg.std < 0.0 {
                return Err(format!("`std` must be >= 0, got {}", cfg.std));
            }
            Ok(())
        }
        FillerKind::Xavier | FillerKind::Msra | FillerKind::Bilinear => Ok(()),
    }
}

/// Fills `out` (the `count` elements of a tensor of `shape`, row-major) as `cfg` says, drawing from
/// `rng`.
///
/// # Panics
/// If `out.len()` is not the product of `shape`, or if [`check`] rejects `cfg` (the config
/// validation runs it first).
pub fn fill(cfg: &FillerConfig, shape: &[usize], rng: &mut impl Rng, out: &mut [f32]) {
    let count: usize = shape.iter().product();
    assert_eq!(
        out.len(),
        count,
        "fill: {} values for a tensor of shape {shape:?}",
        out.len()
    );
    if let Err(msg) = check(cfg) {
        panic!("fill: invalid {:?} filler: {msg}", cfg.kind);
    }
    match cfg.kind {
        FillerKind::Constant => out.fill(cfg.value),
        FillerKind::Uniform => uniform(cfg.min, cfg.max, rng, out),
        FillerKind::Gaussian => gaussian(cfg.mean, cfg.std, rng, out),
        FillerKind::Xavier => {
            let scale = (3.0 / variance_n(cfg.variance_norm, shape)).sqrt();
            uniform(-scale, scale, rng, out);
        }
        FillerKind::Msra => {
            let std = (2.0 / variance_n(cfg.variance_norm, shape)).sqrt();
            gaussian(0.0, std, rng, out);
        }
        FillerKind::Bilinear => bilinear(shape, out),
    }
}

/// Caffe's bilinear kernel over the last two axes of `shape` (see the module docs), the same
/// for every leading index; validation allows it only on square `(.., .., K, K)` weights.
fn bilinear(shape: &[usize], out: &mut [f32]) {
    let width = shape.last().copied().unwrap_or(1).max(1);
    let height = shape.iter().rev().nth(1).copied().unwrap_or(1).max(1);
    let f = width.div_ceil(2) as f64;
    let c = (width as f64 - 1.0) / (2.0 * f);
    for (i, v) in out.iter_mut().enumerate() {
        let (x, y) = ((i % width) as f64, (i / width % height) as f64);
        *v = ((1.0 - (x / f - c).abs()) * (1.0 - (y / f - c).abs())) as f32;
    }
}

/// `U(min, max)`; `min == max` (or a non-finite bound from a zero fan) writes `min`.
fn uniform(min: f32, max: f32, rng: &mut impl Rng, out: &mut [f32]) {
    if min < max && min.is_finite() && max.is_finite() {
        let dist = Uniform::new_inclusive(min, max);
        out.iter_mut().for_each(|v| *v = dist.sample(rng));
    } else {
        out.fill(min);
    }
}

/// `N(mean, std²)`; `std == 0` (or non-finite from a zero fan) writes `mean`.
fn gaussian(mean: f32, std: f32, rng: &mut impl Rng, out: &mut [f32]) {
    match Normal::new(mean, std) {
        Ok(dist) if std > 0.0 && std.is_finite() => {
            out.iter_mut().for_each(|v| *v = dist.sample(rng))
        }
        _ => out.fill(mean),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const SAMPLES: usize = 100_000;

    fn cfg(kind: FillerKind) -> FillerConfig {
        FillerConfig {
            kind,
            ..FillerConfig::constant(0.0)
        }
    }

    /// Fills `shape` (whose count must be at least `SAMPLES`) and returns (mean, variance) in f64.
    fn stats(cfg: &FillerConfig, shape: &[usize]) -> (f64, f64, Vec<f32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(1701);
        let mut out = vec![f32::NAN; shape.iter().product()];
        fill(cfg, shape, &mut rng, &mut out);
        let n = out.len() as f64;
        let mean = out.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = out.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var, out)
    }

    /// Asserts |got − want| ≤ tol with a message naming `what`.
    fn close(what: &str, got: f64, want: f64, tol: f64) {
        assert!(
            (got - want).abs() <= tol,
            "{what}: got {got}, want {want} ± {tol}"
        );
    }

    #[test]
    fn fans_follow_caffe() {
        assert_eq!(fans(&[10, 784]), (784, 10));
        assert_eq!(fans(&[6, 3, 5, 5]), (75, 150));
        assert_eq!(fans(&[7]), (1, 7));
        assert_eq!(fans(&[]), (1, 1));
        assert_eq!(variance_n(VarianceNorm::FanIn, &[10, 784]), 784.0);
        assert_eq!(variance_n(VarianceNorm::FanOut, &[10, 784]), 10.0);
        assert_eq!(variance_n(VarianceNorm::Average, &[10, 784]), 397.0);
        assert_eq!(variance_n(VarianceNorm::Average, &[3, 2]), 2.5);
    }

    #[test]
    fn constant_writes_the_value() {
        let mut c = cfg(FillerKind::Constant);
        c.value = 0.25;
        let (_, _, out) = stats(&c, &[3, 4]);
        assert!(out.iter().all(|&v| v == 0.25), "{out:?}");
    }

    #[test]
    fn uniform_statistics() {
        let mut c = cfg(FillerKind::Uniform);
        c.min = -1.0;
        c.max = 3.0;
        let (mean, var, out) = stats(&c, &[SAMPLES]);
        assert!(out.iter().all(|&v| (-1.0..=3.0).contains(&v)));
        // σ = 4/√12 ≈ 1.155; σ/√n ≈ 0.0037.
        close("uniform mean", mean, 1.0, 0.02);
        close("uniform variance", var, 16.0 / 12.0, 0.03);
    }

    #[test]
    fn gaussian_statistics() {
        let mut c = cfg(FillerKind::Gaussian);
        c.mean = 0.5;
        c.std = 2.0;
        let (mean, var, _) = stats(&c, &[SAMPLES]);
        close("gaussian mean", mean, 0.5, 0.03);
        close("gaussian variance", var, 4.0, 4.0 * 0.03);
    }

    /// Xavier (uniform in ±√(3/n)) and MSRA (gaussian) have mean 0 and variance `gain / n`,
    /// `n` the fan the variance norm picks. (num_output, K) = (100, 1000): fan_in 1000, fan_out
    /// 100, average 550.
    #[test]
    fn variance_scaling_statistics_per_variance_norm() {
        for (kind, gain) in [(FillerKind::Xavier, 1.0), (FillerKind::Msra, 2.0)] {
            for (norm, n) in [
                (VarianceNorm::FanIn, 1000.0f64),
                (VarianceNorm::FanOut, 100.0),
                (VarianceNorm::Average, 550.0),
            ] {
                let mut c = cfg(kind);
                c.variance_norm = norm;
                let (mean, var, out) = stats(&c, &[100, 1000]);
                let bound = (3.0f64 / n).sqrt() as f32;
                let bounded = kind != FillerKind::Xavier || out.iter().all(|v| v.abs() <= bound);
                assert!(bounded, "{norm:?}: outside ±{bound}");
                let want = gain / n;
                let what = format!("{kind:?} {norm:?}");
                close(
                    &format!("{what} mean"),
                    mean,
                    0.0,
                    5.0 * want.sqrt() / 316.0,
                );
                close(&format!("{what} variance"), var, want, 0.03 * want);
            }
        }
    }

    #[test]
    fn same_seed_same_values() {
        let c = xavier();
        let (_, _, a) = stats(&c, &[10, 20]);
        let (_, _, b) = stats(&c, &[10, 20]);
        assert_eq!(a, b);
    }

    #[test]
    fn check_rejects_bad_parameters() {
        let mut u = cfg(FillerKind::Uniform);
        u.min = 2.0;
        u.max = 1.0;
        assert!(check(&u).unwrap_err().contains("`min`"));
        let mut g = cfg(FillerKind::Gaussian);
        g.std = -1.0;
        assert!(check(&g).unwrap_err().contains("`std`"));
        g.std = f32::NAN;
        assert!(check(&g).is_err());
        assert!(check(&xavier()).is_ok());
    }

    /// Caffe's kernels by hand: K = 4 (f = 2, c = 0.75) has the 1-D profile 0.25, 0.75, 0.75,
    /// 0.25; K = 3 (f = 2, c = 0.5) 0.5, 1, 0.5; every filter the same.
    #[test]
    fn bilinear_is_caffes_interpolation_kernel() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let outer = |p: &[f32]| -> Vec<f32> {
            p.iter()
                .flat_map(|&a| p.iter().map(move |&b| a * b))
                .collect()
        };
        for (k, profile) in [(4, vec![0.25, 0.75, 0.75, 0.25]), (3, vec![0.5, 1.0, 0.5])] {
            let mut w = vec![f32::NAN; 2 * 3 * k * k];
            fill(&cfg(FillerKind::Bilinear), &[2, 3, k, k], &mut rng, &mut w);
            let want = outer(&profile);
            for filter in w.chunks_exact(k * k) {
                assert_eq!(filter, &want[..], "K = {k}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "shape")]
    fn fill_rejects_a_wrong_length() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        fill(&xavier(), &[2, 3], &mut rng, &mut [0.0; 5]);
    }
}
