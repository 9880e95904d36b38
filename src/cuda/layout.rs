//! How the GPU stores 4-D activations: [`Layout`] — NCHW, Caffe's and the CPU's, or
//! channels-last NHWC, which cuDNN's tensor-core convolutions run fastest on — the channel view of
//! a blob in either ([`Layout::channel_view`]), which layer types run on channels-last blobs
//! ([`runs_channels_last`]), and host-side conversions for tests and tools.
//!
//! A blob's logical shape is always `(N, C, H, W)`; the layout only says where element
//! `(n, c, h, w)` lies: at `((n·C + c)·H + h)·W + w` in NCHW, at `((n·H + h)·W + w)·C + c` in NHWC.
//! Blobs of another rank, and 4-D blobs with `H·W = 1`, lie the same in both.
//!
//! Parameters never change layout: filters stay KCRS in the flat buffer (snapshots and the
//! gradient all-reduce are layout-free); a channels-last convolution transposes its weight to
//! KRSC for cuDNN and its weight gradient back.

use crate::config::{LayerConfig, LayerKind};

/// Where the elements of a 4-D blob lie; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// `(N, C, H, W)` row-major.
    #[default]
    Nchw,
    /// `(N, H, W, C)` row-major: each pixel's channels adjacent.
    Nhwc,
}

impl Layout {
    /// The channel view `(outer, C, inner)` of a blob of `shape` `(N, C, ...)` stored in this
    /// layout: element `i` is in channel `(i / inner) % C`. `(N, C, H·W)` in NCHW,
    /// `(N·H·W, C, 1)` in NHWC; `(N, C, 1)` for a 2-D blob in either.
    ///
    /// # Panics
    /// If `shape` has fewer than 2 axes.
    pub fn channel_view(self, shape: &[usize]) -> (usize, usize, usize) {
        let spatial: usize = shape[2..].iter().product();
        match self {
            Layout::Nchw => (shape[0], shape[1], spatial),
            Layout::Nhwc => (shape[0] * spatial, shape[1], 1),
        }
    }

    /// `(rows, cols)` of each sample's matrix when a blob of this layout is transposed into the
    /// other: `(C, H·W)` from NCHW, `(H·W, C)` from NHWC (see `Kernels::transpose`).
    pub fn sample_matrix(self, shape: &[usize]) -> (usize, usize) {
        let spatial: usize = shape[2..].iter().product();
        match self {
            Layout::Nchw => (shape[1], spatial),
            Layout::Nhwc => (spatial, shape[1]),
        }
    }
}

/// Whether a blob of `shape` lies differently in the two layouts: 4-D with more than one pixel.
pub fn layout_matters(shape: &[usize]) -> bool {
    shape.len() == 4 && shape[2] * shape[3] > 1
}

/// Whether the GPU layer of `cfg` runs on channels-last blobs: the channel-aware layers
/// (convolution, pooling, BatchNorm, and Scale or Bias over the channel axis alone), dropout
/// (its mask numbers elements in NCHW order either way) and the elementwise layers, which do not
/// care (split and silence among them). The others (inner product, concat, slice, softmax,
/// flatten, reshape, losses, input, and deconvolution, whose cuDNN calls are made NCHW) read
/// NCHW: under channels-last they read a converted copy.
pub fn runs_channels_last(cfg: &LayerConfig) -> bool {
    match cfg.kind {
        LayerKind::Convolution
        | LayerKind::Pooling
        | LayerKind::BatchNorm
        | LayerKind::Dropout
        | LayerKind::Relu
        | LayerKind::Sigmoid
        | LayerKind::Tanh
        | LayerKind::Eltwise
        | LayerKind::Power
        | LayerKind::AbsVal
        | LayerKind::Split
        | LayerKind::Silence
        | LayerKind::Elu => true,
        LayerKind::Scale | LayerKind::Bias => {
            cfg.bottom.len() == 1 && cfg.axis.unwrap_or(1) == 1 && cfg.num_axes.unwrap_or(1) == 1
        }
        LayerKind::InnerProduct
        | LayerKind::SoftmaxWithLoss
        | LayerKind::Accuracy
        | LayerKind::Concat
        | LayerKind::Flatten
        | LayerKind::Reshape
        | LayerKind::Softmax
        | LayerKind::Input
        | LayerKind::Slice
        | LayerKind::Deconvolution
        | LayerKind::Prelu
        | LayerKind::EuclideanLoss
        | LayerKind::ArgMax
        | LayerKind::Lrn => false,
    }
}

/// `data` of a blob of `shape` stored in `from`, rearranged into layout `to` (host side: tests
/// and tools). Blobs whose layout does not matter come back as they are.
pub fn convert(data: &[f32], shape: &[usize], from: Layout, to: Layout) -> Vec<f32> {
    if from == to || !layout_matters(shape) {
        return data.to_vec();
    }
    let (rows, cols) = from.sample_matrix(shape);
    let mut out = vec![0.0; data.len()];
    for (src, dst) in data
        .chunks_exact(rows * cols)
        .zip(out.chunks_exact_mut(rows * cols))
    {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::layer_config;

    /// Element (n, c, h, w) of a (2, 3, 2, 2) blob numbered in NCHW order lands at the NHWC
    /// address, and converting back restores it.
    #[test]
    fn convert_moves_each_element_to_its_channels_last_address() {
        let shape = [2, 3, 2, 2];
        let nchw: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let nhwc = convert(&nchw, &shape, Layout::Nchw, Layout::Nhwc);
        for (n, c, h, w) in (0..2).flat_map(|n| {
            (0..3).flat_map(move |c| (0..2).flat_map(move |h| (0..2).map(move |w| (n, c, h, w))))
        }) {
            let at_nchw = ((n * 3 + c) * 2 + h) * 2 + w;
            let at_nhwc = ((n * 2 + h) * 2 + w) * 3 + c;
            assert_eq!(nhwc[at_nhwc], nchw[at_nchw]);
        }
        assert_eq!(convert(&nhwc, &shape, Layout::Nhwc, Layout::Nchw), nchw);
        let flat = [1.0, 2.0, 3.0];
        assert_eq!(
            convert(&flat, &[1, 3, 1, 1], Layout::Nchw, Layout::Nhwc),
            flat
        );
    }

    /// The channel of element i under each layout's view is the channel of its address.
    #[test]
    fn channel_views_name_the_channel_of_every_address() {
        let shape = [2, 3, 2, 5];
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let (outer, dim, inner) = layout.channel_view(&shape);
            assert_eq!(outer * dim * inner, 60);
            let tagged: Vec<f32> = (0..60).map(|i| ((i / 10) % 3) as f32).collect();
            let stored = convert(&tagged, &shape, Layout::Nchw, layout);
            for (i, &c) in stored.iter().enumerate() {
                assert_eq!((i / inner) % dim, c as usize, "{layout:?} element {i}");
            }
        }
        assert_eq!(Layout::Nhwc.channel_view(&[4, 7]), (4, 7, 1));
    }

    #[test]
    fn scale_and_bias_run_channels_last_only_over_the_channel_axis() {
        let layer = |extra: &str| layer_config(&format!("name = \"s\"\nbottom = [\"x\"]\n{extra}"));
        assert!(runs_channels_last(&layer("type = \"scale\"")));
        assert!(runs_channels_last(&layer("type = \"bias\"\naxis = 1")));
        assert!(!runs_channels_last(&layer(
            "type = \"scale\"\nnum_axes = 3"
        )));
        assert!(!runs_channels_last(&layer("type = \"bias\"\naxis = 2")));
        assert!(runs_channels_last(&layer(
            "type = \"convolution\"\nnum_output = 2\nkernel_size = 1"
        )));
        assert!(!runs_channels_last(&layer(
            "type = \"inner_product\"\nnum_output = 2"
        )));
        assert!(!runs_channels_last(&layer("type = \"concat\"")));
    }
}
