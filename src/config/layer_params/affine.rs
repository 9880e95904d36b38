//! Parameters of the broadcast affine layers: Scale and Bias.

use super::{axis, filler_or, num_axes, KindParams, ParamError, Resolved};
use crate::config::{FillerConfig, LayerConfig};

/// `scale`: `y = x · s (+ b)` with `s` (and `b`) broadcast over the axes `axis..axis+num_axes`.
#[derive(Debug, Clone)]
pub struct ScaleParams {
    /// First axis of the factor (default 1).
    pub axis: usize,
    /// Axes of the factor; −1: to the last axis (default 1).
    pub num_axes: i64,
    /// Filler of the learned factor (default constant 1).
    pub filler: FillerConfig,
    /// Whether a bias is learned too (default false).
    pub bias_term: bool,
    /// Default constant 0.
    pub bias_filler: FillerConfig,
}

impl KindParams for ScaleParams {
    const KEYS: &'static [&'static str] =
        &["axis", "num_axes", "filler", "bias_term", "bias_filler"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let bias_term = l.bias_term == Some(true);
        if l.bias_filler.is_some() && !bias_term {
            return Err(ParamError::new(
                "bias_filler",
                "`bias_filler` does not apply unless bias_term = true",
            ));
        }
        let axis = axis(l, 1)?;
        let bias_filler = filler_or("bias_filler", &l.bias_filler, FillerConfig::constant(0.0))?;
        let filler = filler_or("filler", &l.filler, FillerConfig::constant(1.0))?;
        Ok(ScaleParams {
            axis,
            num_axes: num_axes(l, 1)?,
            filler,
            bias_term,
            bias_filler,
        })
    }
}

/// `bias`: `y = x + b` with `b` broadcast over the axes `axis..axis+num_axes`.
#[derive(Debug, Clone)]
pub struct BiasParams {
    /// First axis of the bias (default 1).
    pub axis: usize,
    /// Axes of the bias; −1: to the last axis (default 1).
    pub num_axes: i64,
    /// Filler of the learned bias (default constant 0).
    pub filler: FillerConfig,
}

impl KindParams for BiasParams {
    const KEYS: &'static [&'static str] = &["axis", "num_axes", "filler"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let axis = axis(l, 1)?;
        let filler = filler_or("filler", &l.filler, FillerConfig::constant(0.0))?;
        Ok(BiasParams {
            axis,
            num_axes: num_axes(l, 1)?,
            filler,
        })
    }
}
