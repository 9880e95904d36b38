//! Typed layer parameters: each `[[layer]]` table ([`LayerConfig`], the serde layer) resolved
//! once into the defaulted, checked parameters of its kind ([`LayerParams`]). The allowed keys of
//! a kind ([`KindParams::KEYS`]) and its defaults live next to its struct, in one file per
//! family; CPU layers, GPU layers and the validator read only these structs.
//!
//! ```text
//! LayerConfig { kind: convolution, num_output: Some(8), kernel_size: Some(3), .. }
//!   → LayerParams::Convolution(ConvolutionParams { num_output: 8, kernel: [3, 3], stride: [1, 1], .. })
//! ```
//!
//! Adding a layer type: its parameter struct (with `KEYS` and `resolve`), its CPU file (the layer
//! and `impl BuildCpu for ItsParams`), its GPU file (`impl BuildGpu for ItsParams`), and one line
//! in [`for_each_layer_kind`], the registry from which the enum and both builders are generated.

/// Declares the parameters of a kind that has none: a unit struct, its allowed keys `$keys`
/// (those every layer of the kind may carry, such as `loss_weight`) and its `resolve`.
macro_rules! parameterless_kind {
    ($(#[$doc:meta])* pub struct $params:ident, keys $keys:expr;) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $params;

        impl KindParams for $params {
            const KEYS: &'static [&'static str] = $keys;

            fn resolve(_: &LayerConfig) -> Resolved<Self> {
                Ok($params)
            }
        }
    };
}

mod affine;
mod blob;
mod classifier;
mod dense;
mod neuron;
mod normalization;
mod spatial;
mod wiring;

pub use affine::{BiasParams, ScaleParams};
pub use blob::{ConcatParams, EltwiseParams, FlattenParams, ReshapeParams};
pub use classifier::{
    AccuracyParams, ArgMaxParams, EuclideanLossParams, SoftmaxParams, SoftmaxWithLossParams,
};
pub use dense::InnerProductParams;
pub use neuron::{
    AbsValParams, DropoutParams, EluParams, PowerParams, PreluParams, ReluParams, SigmoidParams,
    TanhParams,
};
pub use normalization::{BatchNormParams, LrnParams};
pub use spatial::{ConvolutionParams, DeconvolutionParams, Pair, PoolingParams};
pub use wiring::{InputParams, SilenceParams, SliceParams, SplitParams};

use super::{Dims, FillerConfig, FillerKind, LayerConfig};
use crate::error::Error;

/// The largest `num_output` (2^28).
pub const MAX_NUM_OUTPUT: usize = 1 << 28;
/// The largest spatial value (`kernel_size`, `stride`, `pad`, `dilation`).
pub const MAX_SPATIAL: usize = 1 << 20;

/// A key of one `[[layer]]` table that is missing or out of range.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamError {
    /// The key within the layer table, e.g. `num_output` or `weight_filler.std`.
    pub key: String,
    /// The element of a list-valued key the error is about (`kernel_size[1]`), if any.
    pub index: Option<usize>,
    pub msg: String,
}

impl ParamError {
    pub fn new(key: impl Into<String>, msg: impl Into<String>) -> Self {
        ParamError {
            key: key.into(),
            index: None,
            msg: msg.into(),
        }
    }

    /// The error at element `index` of the key's list.
    pub fn at(key: impl Into<String>, index: usize, msg: impl Into<String>) -> Self {
        ParamError {
            key: key.into(),
            index: Some(index),
            msg: msg.into(),
        }
    }

    /// The error of a layer built without a config file (no position): names the layer.
    pub fn for_layer(&self, layer: &str) -> Error {
        Error::net(layer, format!("`{}`: {}", self.key, self.msg))
    }
}

/// Result of resolving a layer's parameters.
pub type Resolved<T> = std::result::Result<T, ParamError>;

/// The typed parameters of one layer kind.
pub trait KindParams: Sized {
    /// The kind-specific keys a layer of this kind takes (besides `name`, `type`, `bottom`,
    /// `top`, `phase`, and `lr_mult`/`decay_mult` where it learns).
    const KEYS: &'static [&'static str];

    /// The parameters of `l` (of this kind), defaulted and checked.
    fn resolve(l: &LayerConfig) -> Resolved<Self>;
}

/// The registry of layer kinds: the type, its parameters and its variant of [`LayerParams`].
macro_rules! layer_kinds {
    ($($kind:ident => $params:ident,)*) => {
        /// Layer types, as `type` names them in a `[[layer]]` table (`inner_product`, `abs_val`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum LayerKind {
            $($kind,)*
        }

        /// The resolved parameters of one layer, by kind.
        #[derive(Debug, Clone)]
        pub enum LayerParams {
            $($kind($params),)*
        }

        impl LayerParams {
            /// Checks the keys of `l` against its kind and resolves its parameters.
            pub fn resolve(l: &LayerConfig) -> Resolved<LayerParams> {
                match l.kind {
                    $(LayerKind::$kind => {
                        keys_apply(l, $params::KEYS)?;
                        $params::resolve(l).map(LayerParams::$kind)
                    })*
                }
            }

            /// The layer type these parameters belong to.
            pub fn kind(&self) -> LayerKind {
                match self {
                    $(LayerParams::$kind(_) => LayerKind::$kind,)*
                }
            }

            /// The keys a layer of `kind` takes.
            pub fn keys(kind: LayerKind) -> &'static [&'static str] {
                match kind {
                    $(LayerKind::$kind => $params::KEYS,)*
                }
            }
        }
    };
}

/// The registry of layer kinds, the one line a new kind adds: `Kind => ParamsStruct`. It calls
/// `$callback! { Kind => ParamsStruct, ... }` with every kind, so that the enum here, the CPU
/// builder ([`crate::layers::build`]) and the GPU builder (`cuda::layers::build`) are each
/// generated from this one list: a kind missing its CPU or GPU file is a compile error.
macro_rules! for_each_layer_kind {
    ($callback:ident) => {
        $callback! {
            InnerProduct => InnerProductParams,
            Relu => ReluParams,
            Sigmoid => SigmoidParams,
            Tanh => TanhParams,
            SoftmaxWithLoss => SoftmaxWithLossParams,
            Accuracy => AccuracyParams,
            Convolution => ConvolutionParams,
            Pooling => PoolingParams,
            Dropout => DropoutParams,
            BatchNorm => BatchNormParams,
            Scale => ScaleParams,
            Bias => BiasParams,
            Eltwise => EltwiseParams,
            Concat => ConcatParams,
            Flatten => FlattenParams,
            Reshape => ReshapeParams,
            Softmax => SoftmaxParams,
            Power => PowerParams,
            AbsVal => AbsValParams,
            Input => InputParams,
            Split => SplitParams,
            Silence => SilenceParams,
            Slice => SliceParams,
            Deconvolution => DeconvolutionParams,
            Elu => EluParams,
            Prelu => PreluParams,
            EuclideanLoss => EuclideanLossParams,
            ArgMax => ArgMaxParams,
            Lrn => LrnParams,
        }
    };
}
#[allow(unused_imports)] // used by the CPU and GPU builders
pub(crate) use for_each_layer_kind;

for_each_layer_kind!(layer_kinds);

impl LayerParams {
    /// The learnable tensors of a layer with these parameters and `bottoms` bottoms: their
    /// number and a description for messages (Scale and Bias learn their tensor only with one
    /// bottom; a second bottom provides it).
    pub fn learnable_tensors(&self, bottoms: usize) -> (usize, &'static str) {
        let one_bottom = bottoms < 2;
        match self {
            LayerParams::InnerProduct(InnerProductParams { bias_term, .. })
            | LayerParams::Convolution(ConvolutionParams { bias_term, .. })
            | LayerParams::Deconvolution(DeconvolutionParams(ConvolutionParams {
                bias_term,
                ..
            })) => match bias_term {
                true => (2, "2 learnable tensors (weight, bias)"),
                false => (1, "1 learnable tensor (weight; bias_term = false)"),
            },
            LayerParams::Scale(p) => match (one_bottom, p.bias_term) {
                (true, true) => (2, "2 learnable tensors (scale, bias)"),
                (true, false) => (1, "1 learnable tensor (scale)"),
                (false, true) => (
                    1,
                    "1 learnable tensor (bias; the scale is the second bottom)",
                ),
                (false, false) => (0, ""),
            },
            LayerParams::Bias(_) if one_bottom => (1, "1 learnable tensor (bias)"),
            LayerParams::Prelu(_) => (1, "1 learnable tensor (slope)"),
            _ => (0, ""),
        }
    }
}

/// Which of the kind-specific keys of `l` are set, in the order they are reported.
fn keys_set(l: &LayerConfig) -> [(&'static str, bool); 38] {
    [
        ("num_output", l.num_output.is_some()),
        ("bias_term", l.bias_term.is_some()),
        ("weight_filler", l.weight_filler.is_some()),
        ("bias_filler", l.bias_filler.is_some()),
        ("axis", l.axis.is_some()),
        ("loss_weight", l.loss_weight.is_some()),
        ("negative_slope", l.negative_slope.is_some()),
        ("top_k", l.top_k.is_some()),
        ("ignore_label", l.ignore_label.is_some()),
        ("kernel_size", l.kernel_size.is_some()),
        ("stride", l.stride.is_some()),
        ("pad", l.pad.is_some()),
        ("dilation", l.dilation.is_some()),
        ("group", l.group.is_some()),
        ("pool", l.pool.is_some()),
        ("global_pooling", l.global_pooling.is_some()),
        ("dropout_ratio", l.dropout_ratio.is_some()),
        (
            "moving_average_fraction",
            l.moving_average_fraction.is_some(),
        ),
        ("eps", l.eps.is_some()),
        ("use_global_stats", l.use_global_stats.is_some()),
        ("sync", l.sync.is_some()),
        ("num_axes", l.num_axes.is_some()),
        ("filler", l.filler.is_some()),
        ("operation", l.operation.is_some()),
        ("coeff", l.coeff.is_some()),
        ("end_axis", l.end_axis.is_some()),
        ("shape", l.shape.is_some()),
        ("power", l.power.is_some()),
        ("scale", l.scale.is_some()),
        ("shift", l.shift.is_some()),
        ("slice_point", l.slice_point.is_some()),
        ("alpha", l.alpha.is_some()),
        ("beta", l.beta.is_some()),
        ("k", l.k.is_some()),
        ("local_size", l.local_size.is_some()),
        ("norm_region", l.norm_region.is_some()),
        ("out_max_val", l.out_max_val.is_some()),
        ("channel_shared", l.channel_shared.is_some()),
    ]
}

/// The first key set on `l` that its kind does not take (`allowed`).
fn keys_apply(l: &LayerConfig, allowed: &[&str]) -> Resolved<()> {
    match keys_set(l)
        .into_iter()
        .find(|(k, set)| *set && !allowed.contains(k))
    {
        Some((k, _)) => Err(ParamError::new(
            k,
            format!(
                "`{k}` does not apply to a layer of type {}",
                super::name_of(&l.kind)
            ),
        )),
        None => Ok(()),
    }
}

/// `v` of `key`, which must be finite.
pub(crate) fn finite(key: &'static str, v: f32) -> Resolved<f32> {
    if !v.is_finite() {
        return Err(ParamError::new(
            key,
            format!("must be a finite number, got {v}"),
        ));
    }
    Ok(v)
}

/// `axis` (1, 2 or 3 when set; axis 0 is the batch), `default` when absent.
pub(crate) fn axis(l: &LayerConfig, default: usize) -> Resolved<usize> {
    match l.axis {
        Some(a) if !(1..=3).contains(&a) => Err(ParamError::new(
            "axis",
            format!("must be 1, 2 or 3 (axis 0 is the batch), got {a}"),
        )),
        Some(a) => Ok(a),
        None => Ok(default),
    }
}

/// `top_k` (at least 1), 1 when absent.
pub(crate) fn top_k(l: &LayerConfig) -> Resolved<usize> {
    match l.top_k.unwrap_or(1) {
        0 => Err(ParamError::new("top_k", "must be at least 1, got 0")),
        k => Ok(k),
    }
}

/// `num_axes` (−1 or at least 0 when set), 1 when absent.
pub(crate) fn num_axes(l: &LayerConfig, default: i64) -> Resolved<i64> {
    match l.num_axes {
        Some(n) if n < -1 => Err(ParamError::new(
            "num_axes",
            format!("must be -1 (to the last axis) or at least 0, got {n}"),
        )),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

/// `num_output` of a layer of type `kind`, required, in 1..=2^28.
pub(crate) fn num_output(l: &LayerConfig, kind: &str) -> Resolved<usize> {
    match l.num_output {
        None => Err(ParamError::new(
            "num_output",
            format!("a layer of type {kind} needs `num_output`"),
        )),
        Some(n) if n == 0 || n > MAX_NUM_OUTPUT => Err(ParamError::new(
            "num_output",
            format!("must be between 1 and 2^28, got {n}"),
        )),
        Some(n) => Ok(n),
    }
}

/// Filler `f` given at `key`: finite values, `min < max` (uniform), `std > 0` (gaussian).
pub(crate) fn filler(key: &'static str, f: &FillerConfig) -> Resolved<()> {
    let sub = |field: &str| format!("{key}.{field}");
    for (k, v) in [
        ("value", f.value),
        ("min", f.min),
        ("max", f.max),
        ("mean", f.mean),
        ("std", f.std),
    ] {
        if !v.is_finite() {
            return Err(ParamError::new(
                sub(k),
                format!("must be a finite number, got {v}"),
            ));
        }
    }
    match f.kind {
        FillerKind::Uniform if f.min >= f.max => Err(ParamError::new(
            sub("max"),
            format!(
                "a uniform filler needs min < max, got min {} and max {}",
                f.min, f.max
            ),
        )),
        FillerKind::Gaussian if f.std <= 0.0 => Err(ParamError::new(
            sub("std"),
            format!("a gaussian filler needs std > 0, got {}", f.std),
        )),
        FillerKind::Bilinear => Err(ParamError::new(
            sub("type"),
            "a bilinear filler fills only the square weight of a convolution or deconvolution \
             (its `weight_filler`)",
        )),
        _ => Ok(()),
    }
}

/// The optional filler at `key`, checked, or `default`.
pub(crate) fn filler_or(
    key: &'static str,
    f: &Option<FillerConfig>,
    default: FillerConfig,
) -> Resolved<FillerConfig> {
    match f {
        Some(f) => filler(key, f).map(|()| f.clone()),
        None => Ok(default),
    }
}

/// Caffe's xavier filler (the default of weights).
pub(crate) fn xavier() -> FillerConfig {
    FillerConfig {
        kind: FillerKind::Xavier,
        ..FillerConfig::constant(0.0)
    }
}

/// A spatial key as `[h, w]` (one value for both axes or one per axis), each in
/// `min..=MAX_SPATIAL`; `None` when absent.
pub(crate) fn spatial_dims(
    key: &'static str,
    dims: &Option<Dims>,
    min: usize,
) -> Resolved<Option<Pair>> {
    let Some(d) = dims else { return Ok(None) };
    let Some(v) = d.per_axis(2) else {
        return Err(ParamError::new(
            key,
            "takes 1 or 2 values (one per spatial axis; 2-D only)",
        ));
    };
    for (j, &x) in v.iter().enumerate() {
        if x < min || x > MAX_SPATIAL {
            let msg = format!("must be between {min} and {MAX_SPATIAL}, got {x}");
            return Err(match d {
                Dims::PerAxis(list) if list.len() > 1 => ParamError::at(key, j, msg),
                _ => ParamError::new(key, msg),
            });
        }
    }
    Ok(Some([v[0], v[1]]))
}
