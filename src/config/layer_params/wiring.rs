//! Parameters of the layers that route blobs rather than compute on them: Input (declares the
//! net's input), Split (one blob to several), Silence (consumes blobs) and Slice (one blob cut
//! into several along an axis, the inverse of Concat).

use super::{axis, KindParams, ParamError, Resolved};
use crate::config::LayerConfig;

/// `input`: Caffe's Input layer of deploy nets, `shape = [N, C, H, W]`. Its tops are the
/// records of `[data]` (top 0) and, with a second top, their labels; `N` is Caffe's batch and
/// informative only (the batch is `[data]`'s), `(C, H, W)` must be the records' shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputParams {
    /// Required: 4 dimensions, each ≥ 1.
    pub shape: [usize; 4],
}

impl KindParams for InputParams {
    const KEYS: &'static [&'static str] = &["shape"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let Some(shape) = &l.shape else {
            return Err(ParamError::new(
                "shape",
                "a layer of type input needs `shape` = [N, C, H, W] (the records' shape, after \
                 Caffe's batch N)",
            ));
        };
        if let Some(j) = shape.iter().position(|&d| d < 1) {
            return Err(ParamError::at(
                "shape",
                j,
                format!("must be at least 1, got {}", shape[j]),
            ));
        }
        let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let Ok(shape) = <[usize; 4]>::try_from(dims) else {
            return Err(ParamError::new(
                "shape",
                format!(
                    "takes 4 dimensions [N, C, H, W] (p2ptrain's records are images), got {}",
                    shape.len()
                ),
            ));
        };
        Ok(InputParams { shape })
    }
}

/// `split`: every top a copy of the one bottom; backward sums the tops' gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitParams {
    /// The number of tops the layer names (validation wants at least 1).
    pub tops: usize,
}

impl KindParams for SplitParams {
    const KEYS: &'static [&'static str] = &[];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        Ok(SplitParams { tops: l.top.len() })
    }
}

parameterless_kind! {
    /// `silence`: reads its bottoms, writes nothing; their gradient from it is zero.
    pub struct SilenceParams, keys &[];
}

/// `slice`: the bottom cut along `axis` into one piece per top, at `slice_point` (the offsets
/// where pieces 2, 3, … start) or into equal pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceParams {
    /// Default 1.
    pub axis: usize,
    /// Strictly increasing, each ≥ 1 (checked against the bottom and the tops by the layer);
    /// empty: equal pieces.
    pub slice_point: Vec<usize>,
    /// The number of tops the layer names: the pieces.
    pub tops: usize,
}

impl KindParams for SliceParams {
    const KEYS: &'static [&'static str] = &["axis", "slice_point"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let points = l.slice_point.clone().unwrap_or_default();
        for (j, &p) in points.iter().enumerate() {
            let prev = if j == 0 { 0 } else { points[j - 1] };
            if p <= prev {
                return Err(ParamError::at(
                    "slice_point",
                    j,
                    format!("must be strictly increasing and at least 1, got {p} after {prev}"),
                ));
            }
        }
        Ok(SliceParams {
            axis: axis(l, 1)?,
            slice_point: points,
            tops: l.top.len(),
        })
    }
}
