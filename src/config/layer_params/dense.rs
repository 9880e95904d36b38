//! Parameters of the fully connected layer.

use super::{axis, filler_or, num_output, xavier, KindParams, ParamError, Resolved};
use crate::config::{FillerConfig, LayerConfig};

/// `inner_product`: `y = x·Wᵀ + b` over the axes from `axis` on.
#[derive(Debug, Clone)]
pub struct InnerProductParams {
    /// Outputs per sample, 1..=2^28.
    pub num_output: usize,
    /// Whether the layer learns a bias (default true).
    pub bias_term: bool,
    /// Default xavier.
    pub weight_filler: FillerConfig,
    /// Default constant 0.
    pub bias_filler: FillerConfig,
    /// First axis flattened into the inner product (default 1).
    pub axis: usize,
}

impl KindParams for InnerProductParams {
    const KEYS: &'static [&'static str] = &[
        "num_output",
        "bias_term",
        "weight_filler",
        "bias_filler",
        "axis",
        "loss_weight",
    ];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let bias_term = bias_term_default_on(l)?;
        let axis = axis(l, 1)?;
        let num_output = num_output(l, "inner_product")?;
        Ok(InnerProductParams {
            num_output,
            bias_term,
            weight_filler: filler_or("weight_filler", &l.weight_filler, xavier())?,
            bias_filler: filler_or("bias_filler", &l.bias_filler, FillerConfig::constant(0.0))?,
            axis,
        })
    }
}

/// `bias_term` of a layer that learns a bias unless told not to; `bias_filler` set with
/// `bias_term = false` is an error.
pub(crate) fn bias_term_default_on(l: &LayerConfig) -> Resolved<bool> {
    let bias_term = l.bias_term != Some(false);
    if l.bias_filler.is_some() && !bias_term {
        return Err(ParamError::new(
            "bias_filler",
            "`bias_filler` does not apply when bias_term = false",
        ));
    }
    Ok(bias_term)
}
