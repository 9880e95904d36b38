//! Parameters of the output layers: the classifier layers SoftmaxWithLoss, Accuracy, Softmax
//! and ArgMax, and the regression loss EuclideanLoss.

use super::{axis, top_k, KindParams, Resolved};
use crate::config::LayerConfig;

/// `softmax_with_loss`: softmax over `axis`, then the mean negative log-likelihood.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftmaxWithLossParams {
    /// The class axis (default 1).
    pub axis: usize,
    /// Samples with this label count toward nothing.
    pub ignore_label: Option<i64>,
}

impl KindParams for SoftmaxWithLossParams {
    const KEYS: &'static [&'static str] = &["axis", "ignore_label", "loss_weight"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(SoftmaxWithLossParams {
            axis: axis(l, 1)?,
            ignore_label: l.ignore_label,
        })
    }
}

/// `accuracy`: the fraction of samples whose label is among the `top_k` highest scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccuracyParams {
    /// The class axis (default 1).
    pub axis: usize,
    /// At least 1, default 1.
    pub top_k: usize,
    /// Samples with this label are never correct.
    pub ignore_label: Option<i64>,
}

impl KindParams for AccuracyParams {
    const KEYS: &'static [&'static str] = &["axis", "top_k", "ignore_label"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let top_k = top_k(l)?;
        Ok(AccuracyParams {
            axis: axis(l, 1)?,
            top_k,
            ignore_label: l.ignore_label,
        })
    }
}

/// `softmax`: normalised exponentials over `axis`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftmaxParams {
    /// Default 1.
    pub axis: usize,
}

impl KindParams for SoftmaxParams {
    const KEYS: &'static [&'static str] = &["axis"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(SoftmaxParams { axis: axis(l, 1)? })
    }
}

/// `arg_max`: the indices (and optionally the values) of the `top_k` largest values of each
/// sample, or of each position along `axis`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArgMaxParams {
    /// Output the values too (default false).
    pub out_max_val: bool,
    /// At least 1, default 1.
    pub top_k: usize,
    /// The axis searched (1, 2 or 3); `None`: every value of a sample, flattened.
    pub axis: Option<usize>,
}

impl KindParams for ArgMaxParams {
    const KEYS: &'static [&'static str] = &["out_max_val", "top_k", "axis"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(ArgMaxParams {
            out_max_val: l.out_max_val.unwrap_or(false),
            top_k: top_k(l)?,
            axis: l.axis.map(|_| axis(l, 1)).transpose()?,
        })
    }
}

parameterless_kind! {
    /// `euclidean_loss`: `Σ (a − b)² / 2N` over a prediction `a` and a target `b`.
    pub struct EuclideanLossParams, keys &["loss_weight"];
}
