//! Parameters of the elementwise (neuron) layers: ReLU, Sigmoid, TanH, AbsVal, Power, Dropout,
//! ELU and PReLU.

use super::{filler_or, finite, KindParams, ParamError, Resolved};
use crate::config::{FillerConfig, LayerConfig};

/// `relu`: `y = max(x, 0) + negative_slope · min(x, 0)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReluParams {
    /// Finite, default 0.
    pub negative_slope: f32,
}

impl KindParams for ReluParams {
    const KEYS: &'static [&'static str] = &["negative_slope", "loss_weight"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(ReluParams {
            negative_slope: finite("negative_slope", l.negative_slope.unwrap_or(0.0))?,
        })
    }
}

parameterless_kind! {
    /// `sigmoid`: no parameters.
    pub struct SigmoidParams, keys &["loss_weight"];
}

parameterless_kind! {
    /// `tanh`: no parameters.
    pub struct TanhParams, keys &["loss_weight"];
}

parameterless_kind! {
    /// `abs_val`: no parameters.
    pub struct AbsValParams, keys &[];
}

/// `power`: `y = (shift + scale · x)^power`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerParams {
    /// Finite, default 1.
    pub power: f32,
    /// Finite, default 1.
    pub scale: f32,
    /// Finite, default 0.
    pub shift: f32,
}

impl KindParams for PowerParams {
    const KEYS: &'static [&'static str] = &["power", "scale", "shift"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(PowerParams {
            power: finite("power", l.power.unwrap_or(1.0))?,
            scale: finite("scale", l.scale.unwrap_or(1.0))?,
            shift: finite("shift", l.shift.unwrap_or(0.0))?,
        })
    }
}

/// `dropout`: zeroes each input with probability `ratio` in training, scaling the rest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutParams {
    /// In [0, 1), default 0.5 (`dropout_ratio`).
    pub ratio: f32,
}

impl KindParams for DropoutParams {
    const KEYS: &'static [&'static str] = &["dropout_ratio"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let ratio = l.dropout_ratio.unwrap_or(0.5);
        if !(0.0..1.0).contains(&ratio) {
            return Err(ParamError::new(
                "dropout_ratio",
                format!("must lie in [0, 1), got {ratio}"),
            ));
        }
        Ok(DropoutParams { ratio })
    }
}

/// `elu`: `y = x > 0 ? x : alpha · (e^x − 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EluParams {
    /// Finite, default 1.
    pub alpha: f32,
}

impl KindParams for EluParams {
    const KEYS: &'static [&'static str] = &["alpha"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(EluParams {
            alpha: finite("alpha", l.alpha.unwrap_or(1.0))?,
        })
    }
}

/// `prelu`: `y = x > 0 ? x : slope[c] · x` with a learnable slope per channel (axis 1), or one
/// slope for every channel.
#[derive(Debug, Clone)]
pub struct PreluParams {
    /// One slope shared by every channel (default false).
    pub channel_shared: bool,
    /// The slopes' filler (`filler`), default constant 0.25.
    pub filler: FillerConfig,
}

impl KindParams for PreluParams {
    const KEYS: &'static [&'static str] = &["channel_shared", "filler"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(PreluParams {
            channel_shared: l.channel_shared.unwrap_or(false),
            filler: filler_or("filler", &l.filler, FillerConfig::constant(0.25))?,
        })
    }
}
