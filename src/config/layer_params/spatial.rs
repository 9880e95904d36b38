//! Parameters of the 2-D sliding-window layers: Convolution, Deconvolution and Pooling. Their spatial keys
//! (`kernel_size`, `stride`, `pad`, `dilation`) take one value for both axes or one per axis
//! and resolve to `[h, w]` pairs here, once.

use super::dense::bias_term_default_on;
use super::{filler_or, num_output, spatial_dims, xavier, KindParams, ParamError, Resolved};
use crate::config::{FillerConfig, FillerKind, LayerConfig, PoolMethod};

/// A per-axis `[h, w]` pair.
pub type Pair = [usize; 2];

/// `convolution`: Caffe's 2-D convolution (cross-correlation).
#[derive(Debug, Clone)]
pub struct ConvolutionParams {
    /// Output channels, 1..=2^28, a multiple of `group`.
    pub num_output: usize,
    /// Required, each ≥ 1.
    pub kernel: Pair,
    /// Each ≥ 1, default 1.
    pub stride: Pair,
    /// Default 0.
    pub pad: Pair,
    /// Each ≥ 1, default 1.
    pub dilation: Pair,
    /// ≥ 1 and dividing `num_output`, default 1.
    pub group: usize,
    /// Default true.
    pub bias_term: bool,
    /// Default xavier.
    pub weight_filler: FillerConfig,
    /// Default constant 0.
    pub bias_filler: FillerConfig,
}

impl KindParams for ConvolutionParams {
    const KEYS: &'static [&'static str] = &[
        "num_output",
        "bias_term",
        "weight_filler",
        "bias_filler",
        "kernel_size",
        "stride",
        "pad",
        "dilation",
        "group",
        "loss_weight",
    ];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        ConvolutionParams::resolve_as(l, "convolution")
    }
}

impl ConvolutionParams {
    /// The parameters of `l`, a layer of type `kind` (for messages) that takes a convolution's
    /// keys.
    fn resolve_as(l: &LayerConfig, kind: &str) -> Resolved<Self> {
        let bias_term = bias_term_default_on(l)?;
        let weight_filler = match &l.weight_filler {
            Some(f) if f.kind == FillerKind::Bilinear => f.clone(),
            other => filler_or("weight_filler", other, xavier())?,
        };
        let bias_filler = filler_or("bias_filler", &l.bias_filler, FillerConfig::constant(0.0))?;
        let kernel = spatial_dims("kernel_size", &l.kernel_size, 1)?;
        let stride = spatial_dims("stride", &l.stride, 1)?;
        let pad = spatial_dims("pad", &l.pad, 0)?;
        let dilation = spatial_dims("dilation", &l.dilation, 1)?;
        let Some(kernel) = kernel else {
            return Err(ParamError::new(
                "kernel_size",
                format!("a layer of type {kind} needs `kernel_size`"),
            ));
        };
        if weight_filler.kind == FillerKind::Bilinear && kernel[0] != kernel[1] {
            return Err(ParamError::new(
                "weight_filler.type",
                format!("a bilinear filler needs a square kernel, got {kernel:?}"),
            ));
        }
        let num_output = num_output(l, kind)?;
        let group = l.group.unwrap_or(1);
        if group == 0 || !num_output.is_multiple_of(group) {
            return Err(ParamError::new(
                "group",
                format!("must be at least 1 and divide num_output {num_output}, got {group}"),
            ));
        }
        Ok(ConvolutionParams {
            num_output,
            kernel,
            stride: stride.unwrap_or([1; 2]),
            pad: pad.unwrap_or([0; 2]),
            dilation: dilation.unwrap_or([1; 2]),
            group,
            bias_term,
            weight_filler,
            bias_filler,
        })
    }
}

/// `deconvolution`: Caffe's transposed convolution, with a convolution's keys. `num_output` is
/// the top's channels; the weight is `(C, num_output/group, kh, kw)` for a bottom of `C`
/// channels (Caffe's: the weight of the convolution from the top's shape to the bottom's).
#[derive(Debug, Clone)]
pub struct DeconvolutionParams(pub ConvolutionParams);

impl KindParams for DeconvolutionParams {
    const KEYS: &'static [&'static str] = ConvolutionParams::KEYS;

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        ConvolutionParams::resolve_as(l, "deconvolution").map(DeconvolutionParams)
    }
}

/// `pooling`: the maximum or mean of each window, or of the whole image (`global`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolingParams {
    /// Default max.
    pub method: PoolMethod,
    /// The kernel is the whole image (default false).
    pub global: bool,
    /// Required unless `global` (then `[1, 1]`, replaced by the image at reshape), each ≥ 1.
    pub kernel: Pair,
    /// Each ≥ 1, default 1.
    pub stride: Pair,
    /// Smaller than the kernel, default 0.
    pub pad: Pair,
}

impl KindParams for PoolingParams {
    const KEYS: &'static [&'static str] =
        &["pool", "kernel_size", "stride", "pad", "global_pooling"];

    fn resolve(l: &LayerConfig) -> Resolved<Self> {
        let global = l.global_pooling == Some(true);
        let kernel = spatial_dims("kernel_size", &l.kernel_size, 1)?;
        let stride = spatial_dims("stride", &l.stride, 1)?;
        let pad = spatial_dims("pad", &l.pad, 0)?;
        if global {
            let set = [("kernel_size", kernel), ("stride", stride), ("pad", pad)];
            if let Some((k, _)) = set.iter().find(|(_, v)| v.is_some()) {
                return Err(ParamError::new(
                    *k,
                    format!("`{k}` does not apply with global_pooling = true (the kernel is the whole image)"),
                ));
            }
        } else if kernel.is_none() {
            return Err(ParamError::new(
                "kernel_size",
                "a layer of type pooling needs `kernel_size` (or global_pooling = true)",
            ));
        }
        if let (Some(k), Some(p)) = (kernel, pad) {
            if p[0] >= k[0] || p[1] >= k[1] {
                return Err(ParamError::new(
                    "pad",
                    format!("must be smaller than the kernel {k:?}, got {p:?}"),
                ));
            }
        }
        Ok(PoolingParams {
            method: l.pool.unwrap_or(PoolMethod::Max),
            global,
            kernel: kernel.unwrap_or([1; 2]),
            stride: stride.unwrap_or([1; 2]),
            pad: pad.unwrap_or([0; 2]),
        })
    }
}
