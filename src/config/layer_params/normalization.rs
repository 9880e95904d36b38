//! Parameters of the normalisation layers: BatchNorm and LRN.

use super::{finite, KindParams, ParamError, Resolved, MAX_SPATIAL};
use crate::config::{LayerConfig, NormRegion};

/// `batch_norm`: normalises each channel by batch statistics (train) or running ones (test).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormParams {
    /// Weight of the old running statistics in each update, in (0, 1], default 0.999.
    pub moving_average_fraction: f32,
    /// Added to the variance, finite and > 0, default 1e-5.
    pub eps: f32,
    /// Normalise by the running statistics; unset: only in the test phase.
    pub use_global_stats: Option<bool>,
    /// Reduce the batch statistics over every replica of the job (default false).
    pub sync: bool,
}

impl KindParams for BatchNormParams {
    const KEYS: &'static [&'static str] =
        &["moving_average_fraction", "eps", "use_global_stats", "sync"];

    /// Its tensors (running mean, variance, factor) are statistics, so `lr_mult` and
    /// `decay_mult` are rejected.
    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let moving_average_fraction = l.moving_average_fraction.unwrap_or(0.999);
        let f = moving_average_fraction;
        if !(f > 0.0 && f <= 1.0) {
            return Err(ParamError::new(
                "moving_average_fraction",
                format!("must lie in (0, 1], got {f}"),
            ));
        }
        let eps = l.eps.unwrap_or(1e-5);
        if !(eps.is_finite() && eps > 0.0) {
            return Err(ParamError::new(
                "eps",
                format!("must be a finite number > 0, got {eps}"),
            ));
        }
        for (k, set) in [
            ("lr_mult", l.lr_mult.is_some()),
            ("decay_mult", l.decay_mult.is_some()),
        ] {
            if set {
                return Err(ParamError::new(
                    k,
                    format!(
                        "`{k}` does not apply to batch_norm: its tensors (running mean, variance, factor) \
                         are statistics, never learned or decayed (their lr_mult and decay_mult are always 0)"
                    ),
                ));
            }
        }
        Ok(BatchNormParams {
            moving_average_fraction,
            eps,
            use_global_stats: l.use_global_stats,
            sync: l.sync.unwrap_or(false),
        })
    }
}

/// `lrn`: local response normalisation, `y = x · s^(−beta)` with `s` from the squares of a
/// window of `local_size` around each value (see `crate::layers::lrn`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrnParams {
    /// Odd, in 1..=2^20, default 5.
    pub local_size: usize,
    /// Finite, default 1.
    pub alpha: f32,
    /// Finite, default 0.75.
    pub beta: f32,
    /// Finite, default 1 (ACROSS_CHANNELS only; WITHIN_CHANNEL adds 1, as Caffe does).
    pub k: f32,
    /// Default across channels.
    pub norm_region: NormRegion,
}

impl KindParams for LrnParams {
    const KEYS: &'static [&'static str] = &["local_size", "alpha", "beta", "k", "norm_region"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let local_size = l.local_size.unwrap_or(5);
        if local_size == 0 || local_size > MAX_SPATIAL || local_size.is_multiple_of(2) {
            return Err(ParamError::new(
                "local_size",
                format!(
                    "must be odd (the window is centred on each value) and between 1 and \
                     {MAX_SPATIAL}, got {local_size}"
                ),
            ));
        }
        Ok(LrnParams {
            local_size,
            alpha: finite("alpha", l.alpha.unwrap_or(1.0))?,
            beta: finite("beta", l.beta.unwrap_or(0.75))?,
            k: finite("k", l.k.unwrap_or(1.0))?,
            norm_region: l.norm_region.unwrap_or(NormRegion::AcrossChannels),
        })
    }
}
