//! Gradient buckets: which spans of the flat gradient buffer are all-reduced together, and after
//! which layer's backward each may start (`[cluster] reduce`).
//!
//! Backward runs from the last layer to the first, so buckets are planned in reverse layer order:
//! - `flat`: one bucket holding every gradient, ready after the last backward;
//! - `layerwise`: one bucket per layer with parameters (Caffe's schedule);
//! - `bucketed`: consecutive layers (in reverse order) merged until a bucket holds about
//!   `bucket_mb` MiB; a layer larger than that is a bucket of its own. Layers are never split,
//!   so a bucket is ready exactly when its lowest layer's backward is done.

use crate::config::ReduceMode;
use crate::params::ParamSpan;
use std::ops::Range;

/// One all-reduce over a contiguous span of the gradient buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Flat float range.
    pub range: Range<usize>,
    /// The layer whose backward completes the bucket (its lowest layer).
    pub ready_after_layer: usize,
}

/// Plans the buckets of `spans` (in layer order, as `Params` lays them out), in launch order.
pub fn plan_buckets(spans: &[ParamSpan], mode: ReduceMode, bucket_mb: f64) -> Vec<Bucket> {
    // Per layer with parameters: its flat range, in reverse layer order.
    let mut layers: Vec<(usize, Range<usize>)> = Vec::new();
    for s in spans.iter().rev() {
        match layers.last_mut() {
            Some((l, r)) if *l == s.layer => r.start = s.offset,
            _ => layers.push((s.layer, s.range())),
        }
    }
    let target = match mode {
        ReduceMode::Flat => usize::MAX,
        ReduceMode::Layerwise => 0,
        ReduceMode::Bucketed => ((bucket_mb * 1024.0 * 1024.0) / 4.0).max(1.0) as usize,
    };
    let mut buckets: Vec<Bucket> = Vec::new();
    for (layer, range) in layers {
        match buckets.last_mut() {
            Some(b) if b.range.len() < target => {
                debug_assert_eq!(range.end, b.range.start, "layers are contiguous");
                b.range.start = range.start;
                b.ready_after_layer = layer;
            }
            _ => buckets.push(Bucket {
                range,
                ready_after_layer: layer,
            }),
        }
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FillerConfig;
    use crate::params::Params;

    /// Layers 0, 2, 3 have a weight and a bias of the given sizes; layer 1 has none.
    fn spans(sizes: &[(usize, usize, usize)]) -> Vec<ParamSpan> {
        let mut v = Vec::new();
        for &(layer, w, b) in sizes {
            for (name, n) in [("weight", w), ("bias", b)] {
                v.push(ParamSpan {
                    layer,
                    full_name: format!("l{layer}.{name}"),
                    shape: vec![n],
                    offset: 0,
                    len: 0,
                    lr_mult: 1.0,
                    decay_mult: 1.0,
                    filler: FillerConfig::constant(0.0),
                });
            }
        }
        Params::new(v).spans
    }

    fn covers_once(buckets: &[Bucket], total: usize) {
        let mut seen = vec![0u8; total];
        for b in buckets {
            for i in b.range.clone() {
                seen[i] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "every float exactly once: {buckets:?}");
    }

    #[test]
    fn flat_is_one_bucket_ready_after_the_first_layer() {
        let s = spans(&[(0, 100, 10), (2, 50, 5), (3, 20, 2)]);
        let b = plan_buckets(&s, ReduceMode::Flat, 25.0);
        assert_eq!(b, vec![Bucket { range: 0..187, ready_after_layer: 0 }]);
    }

    #[test]
    fn layerwise_is_one_bucket_per_layer_in_reverse_order() {
        let s = spans(&[(0, 100, 10), (2, 50, 5), (3, 20, 2)]);
        let b = plan_buckets(&s, ReduceMode::Layerwise, 25.0);
        let expect = vec![
            Bucket { range: 165..187, ready_after_layer: 3 },
            Bucket { range: 110..165, ready_after_layer: 2 },
            Bucket { range: 0..110, ready_after_layer: 0 },
        ];
        assert_eq!(b, expect);
        covers_once(&b, 187);
    }

    #[test]
    fn bucketed_merges_small_layers_and_keeps_large_ones_whole() {
        // bucket_mb such that the target is 60 floats.
        let mb = 60.0 * 4.0 / (1024.0 * 1024.0);
        let s = spans(&[(0, 100, 10), (2, 50, 5), (3, 20, 2), (4, 10, 1)]);
        let b = plan_buckets(&s, ReduceMode::Bucketed, mb);
        // Reverse order: layer 4 (11) + layer 3 (22) = 33 < 60, + layer 2 (55) = 88 ≥ 60; then layer 0.
        let expect = vec![
            Bucket { range: 110..198, ready_after_layer: 2 },
            Bucket { range: 0..110, ready_after_layer: 0 },
        ];
        assert_eq!(b, expect);
        covers_once(&b, 198);
    }

    #[test]
    fn no_parameters_no_buckets() {
        assert!(plan_buckets(&[], ReduceMode::Bucketed, 25.0).is_empty());
    }
}
