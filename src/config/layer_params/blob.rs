//! Parameters of the layers that combine or reshape blobs: Eltwise, Concat, Flatten, Reshape.

use super::{axis, finite, num_axes, KindParams, ParamError, Resolved};
use crate::config::{EltwiseOp, LayerConfig};

/// `eltwise`: the elementwise sum (weighted by `coeff`), product or maximum of the bottoms.
#[derive(Debug, Clone, PartialEq)]
pub struct EltwiseParams {
    /// Default sum.
    pub operation: EltwiseOp,
    /// Finite coefficients, one per bottom (sum only; their number is checked against the
    /// bottoms by validation and by the layer); unset: all 1.
    pub coeff: Option<Vec<f32>>,
}

impl KindParams for EltwiseParams {
    const KEYS: &'static [&'static str] = &["operation", "coeff"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let operation = l.operation.unwrap_or(EltwiseOp::Sum);
        if let Some(c) = &l.coeff {
            if operation != EltwiseOp::Sum {
                return Err(ParamError::new(
                    "coeff",
                    "`coeff` applies only to operation \"sum\"",
                ));
            }
            for (j, &v) in c.iter().enumerate() {
                finite("coeff", v).map_err(|e| ParamError::new(format!("coeff[{j}]"), e.msg))?;
            }
        }
        Ok(EltwiseParams {
            operation,
            coeff: l.coeff.clone(),
        })
    }
}

/// `concat`: the bottoms side by side along `axis`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcatParams {
    /// Default 1.
    pub axis: usize,
}

impl KindParams for ConcatParams {
    const KEYS: &'static [&'static str] = &["axis"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(ConcatParams { axis: axis(l, 1)? })
    }
}

/// `flatten`: the axes `axis..=end_axis` merged into one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlattenParams {
    /// Default 1.
    pub axis: usize,
    /// Negative counts from the end; default −1 (the last axis).
    pub end_axis: i64,
}

impl KindParams for FlattenParams {
    const KEYS: &'static [&'static str] = &["axis", "end_axis"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(FlattenParams {
            axis: axis(l, 1)?,
            end_axis: l.end_axis.unwrap_or(-1),
        })
    }
}

/// `reshape`: the axes `axis..axis+num_axes` replaced by `shape` (0 copies an axis, −1 infers
/// one).
#[derive(Debug, Clone, PartialEq)]
pub struct ReshapeParams {
    /// Default 0 (when set: 1, 2 or 3).
    pub axis: usize,
    /// −1: to the last axis (the default).
    pub num_axes: i64,
    /// Required; values ≥ −1, at most one −1.
    pub shape: Vec<i64>,
}

impl KindParams for ReshapeParams {
    const KEYS: &'static [&'static str] = &["axis", "num_axes", "shape"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let axis = axis(l, 0)?;
        let Some(shape) = &l.shape else {
            return Err(ParamError::new(
                "shape",
                "a layer of type reshape needs `shape` (0 copies an axis, -1 infers one)",
            ));
        };
        if let Some(j) = shape.iter().position(|&d| d < -1) {
            return Err(ParamError::at(
                "shape",
                j,
                format!("must be -1 (infer), 0 (copy) or positive, got {}", shape[j]),
            ));
        }
        if shape.iter().filter(|&&d| d == -1).count() > 1 {
            return Err(ParamError::new("shape", "may infer (-1) one axis only"));
        }
        Ok(ReshapeParams {
            axis,
            num_axes: num_axes(l, -1)?,
            shape: shape.clone(),
        })
    }
}
