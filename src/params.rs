//! `Params`: every learnable tensor of a replica in one contiguous data buffer and one diff buffer
//! (Caffe's `Params`), so that a broadcast or an all-reduce is one call over one slice. Layers get
//! views; tensors are laid out in layer order, so a layer's tensors form one contiguous span.
//!
//! Each layer's span starts at a multiple of [`LAYER_ALIGN`] floats (256 bytes): cuDNN and cuBLAS
//! take their tensor-core kernels only for suitably aligned operands, and a BatchNorm's `2C + 1`
//! state floats would otherwise shift every later weight off alignment. The gaps between layers
//! hold zeros in both buffers and stay zero (their gradient is never written).

use crate::config::FillerConfig;
use std::ops::Range;

/// Alignment, in floats, of the start of every layer's span in the flat buffers.
pub const LAYER_ALIGN: usize = 64;

/// What a layer declares about one learnable tensor.
#[derive(Debug, Clone)]
pub struct ParamSpec {
    /// `weight` or `bias`.
    pub name: String,
    pub shape: Vec<usize>,
    pub filler: FillerConfig,
}

impl ParamSpec {
    /// The tensor `name` of `shape`, filled by `filler`.
    pub fn new(name: &str, shape: Vec<usize>, filler: &FillerConfig) -> Self {
        ParamSpec {
            name: name.into(),
            shape,
            filler: filler.clone(),
        }
    }
}

/// Where one learnable tensor lives in the flat buffers.
#[derive(Debug, Clone)]
pub struct ParamSpan {
    /// Index of the owning layer in the net.
    pub layer: usize,
    /// `<layer name>.<tensor name>`, the name used in snapshots.
    pub full_name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub len: usize,
    pub lr_mult: f32,
    pub decay_mult: f32,
    pub filler: FillerConfig,
}

impl ParamSpan {
    /// Range of this tensor in the flat buffers.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len
    }

    /// The tensor `full_name` of `layer` with `shape`, multipliers 1 and a zero filler, not yet
    /// laid out (`Params::new` sets its offset and length).
    #[cfg(test)]
    pub(crate) fn unit(layer: usize, full_name: &str, shape: &[usize]) -> ParamSpan {
        ParamSpan {
            layer,
            full_name: full_name.into(),
            shape: shape.to_vec(),
            offset: 0,
            len: 0,
            lr_mult: 1.0,
            decay_mult: 1.0,
            filler: FillerConfig::constant(0.0),
        }
    }
}

/// Flat parameter and gradient buffers of one replica.
#[derive(Debug, Clone, Default)]
pub struct Params {
    pub data: Vec<f32>,
    pub diff: Vec<f32>,
    pub spans: Vec<ParamSpan>,
}

impl Params {
    /// Lays out `spans` (offsets and lengths are recomputed; each layer's first tensor at a
    /// multiple of [`LAYER_ALIGN`]) and allocates zeroed buffers.
    pub fn new(mut spans: Vec<ParamSpan>) -> Self {
        let mut offset = 0usize;
        let mut previous_layer = None;
        for s in &mut spans {
            if previous_layer != Some(s.layer) {
                offset = offset.next_multiple_of(LAYER_ALIGN);
                previous_layer = Some(s.layer);
            }
            s.len = s.shape.iter().product();
            s.offset = offset;
            offset += s.len;
        }
        Params {
            data: vec![0.0; offset],
            diff: vec![0.0; offset],
            spans,
        }
    }

    /// Length of the flat buffers: the learnable floats and the alignment gaps between layers.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Number of learnable floats (the tensors, without the alignment gaps).
    pub fn count(&self) -> usize {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// Indices into `spans` of the tensors of `layer`.
    pub fn layer_spans(&self, layer: usize) -> Range<usize> {
        layer_spans(&self.spans, layer)
    }

    /// The flat range covered by the tensors of `layer` (empty if it has none).
    pub fn layer_range(&self, layer: usize) -> Range<usize> {
        layer_range(&self.spans, layer)
    }

    /// Views of `layer`'s tensors: data read-only, diff writable.
    pub fn layer_views(&mut self, layer: usize) -> (Vec<&[f32]>, Vec<&mut [f32]>) {
        let spans = &self.spans[self.layer_spans(layer)];
        let data = spans.iter().map(|s| &self.data[s.range()]).collect();
        (data, views_mut(&mut self.diff, spans))
    }

    /// Views of `layer`'s tensors in `data` (a buffer laid out as [`Params::data`], such as
    /// mixed precision's half copy of the weights) read-only, and of their diff writable.
    pub fn layer_views_in<'a>(
        &'a mut self,
        layer: usize,
        data: &'a [f32],
    ) -> (Vec<&'a [f32]>, Vec<&'a mut [f32]>) {
        let spans = &self.spans[self.layer_spans(layer)];
        let views = spans.iter().map(|s| &data[s.range()]).collect();
        (views, views_mut(&mut self.diff, spans))
    }

    /// Mutable views of `layer`'s tensors' data (the state of a stateful layer, see
    /// [`Layer::has_state`](crate::layers::Layer::has_state)).
    pub fn layer_data_mut(&mut self, layer: usize) -> Vec<&mut [f32]> {
        let spans = &self.spans[self.layer_spans(layer)];
        views_mut(&mut self.data, spans)
    }

    /// Looks a tensor up by its snapshot name.
    pub fn find(&self, full_name: &str) -> Option<&ParamSpan> {
        self.spans.iter().find(|s| s.full_name == full_name)
    }
}

/// Indices into `spans` (laid out in layer order) of the tensors of `layer`.
pub fn layer_spans(spans: &[ParamSpan], layer: usize) -> Range<usize> {
    let start = spans.partition_point(|s| s.layer < layer);
    let end = spans.partition_point(|s| s.layer <= layer);
    start..end
}

/// The flat range covered by the tensors of `layer` in `spans` (empty if it has none).
pub fn layer_range(spans: &[ParamSpan], layer: usize) -> Range<usize> {
    let r = layer_spans(spans, layer);
    if r.is_empty() {
        return 0..0;
    }
    spans[r.start].offset..spans[r.end - 1].range().end
}

#[cfg(test)]
impl Params {
    /// Zeroed buffers of the tensors `t0`, `t1`, … of the given lengths and `(lr_mult,
    /// decay_mult)`, tensor `i` in layer `layer_of(i)` (a layer's tensors are laid out back to
    /// back, every layer from the alignment).
    pub(crate) fn of_tensors(
        tensors: &[(usize, f32, f32)],
        layer_of: impl Fn(usize) -> usize,
    ) -> Params {
        let span = |(i, &(len, lr_mult, decay_mult)): (usize, &(usize, f32, f32))| ParamSpan {
            lr_mult,
            decay_mult,
            ..ParamSpan::unit(layer_of(i), &format!("t{i}"), &[len])
        };
        Params::new(tensors.iter().enumerate().map(span).collect())
    }
}

/// Disjoint writable views of `buf` at `spans` (in increasing offset order, not overlapping).
fn views_mut<'a>(buf: &'a mut [f32], spans: &[ParamSpan]) -> Vec<&'a mut [f32]> {
    let mut views = Vec::with_capacity(spans.len());
    let mut rest = buf;
    let mut consumed = 0;
    for s in spans {
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut(s.offset - consumed);
        let (view, tail) = tail.split_at_mut(s.len);
        views.push(view);
        rest = tail;
        consumed = s.offset + s.len;
    }
    views
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(layer: usize, name: &str, shape: &[usize]) -> ParamSpan {
        ParamSpan::unit(layer, &format!("l{layer}.{name}"), shape)
    }

    /// A layer's tensors stay contiguous; every layer starts on the alignment; the buffers hold
    /// the gaps, the count does not.
    #[test]
    fn layers_start_aligned_and_their_tensors_stay_contiguous() {
        let p = Params::new(vec![
            spec(0, "mean", &[3]),
            spec(0, "variance", &[3]),
            spec(0, "factor", &[1]),
            spec(2, "weight", &[5, 2]),
            spec(2, "bias", &[5]),
            spec(3, "weight", &[70]),
        ]);
        let offsets: Vec<usize> = p.spans.iter().map(|s| s.offset).collect();
        assert_eq!(offsets, [0, 3, 6, 64, 74, 128]);
        assert_eq!(p.len(), 198);
        assert_eq!(p.count(), 3 + 3 + 1 + 10 + 5 + 70);
        assert_eq!(p.layer_range(2), 64..79);
    }
}
