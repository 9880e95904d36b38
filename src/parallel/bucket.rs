//! Gradient buckets: which all-reduces a replica launches during backward, over which part of the
//! flat gradient buffer, and when. Pure planning — no device types — so it is tested on any
//! machine.
//!
//! Backward runs from the last layer to the first, so buckets are listed in *launch order*:
//! reverse layer order, highest flat offsets first. A bucket is ready once the backward of its
//! lowest-indexed layer, [`Bucket::ready_after_layer`], is done; the replica then launches it on
//! its communication stream while backward continues below it. Every gradient float lies in
//! exactly one bucket.
//!
//! The three schedules of `[cluster] reduce`:
//!
//! - `flat`: one bucket of the whole buffer, ready after the last backward that produces a
//!   gradient (the lowest layer with parameters). No overlap, fewest launches.
//! - `layerwise`: one bucket per layer with parameters (Caffe's schedule). Most overlap, but a
//!   net with many small layers pays NCCL's per-launch latency many times.
//! - `bucketed`: consecutive layers, walked in reverse, are packed into buckets of at most
//!   `bucket_mb` MiB: a layer that would push a non-empty bucket past the target starts the next
//!   bucket. A layer larger than the target forms a bucket of its own.
//!
//! A layer's span is never split across buckets. Its whole gradient is written by one backward
//! call, so pieces of it would all become ready at the same moment: splitting would add launches
//! without starting any communication earlier (NCCL already pipelines a large message in chunks
//! internally). Closing a bucket *before* it would overflow, rather than after, also lets the
//! layers already gathered leave before a large layer's backward is done.
//!
//! ```
//! use p2ptrain::config::ReduceMode;
//! use p2ptrain::parallel::bucket::{BucketPlan, LayerSpan};
//! // Three layers with parameters: 0 (10 floats), 2 (1000 floats), 3 (5 floats).
//! let layers = [
//!     LayerSpan { layer: 0, range: 0..10 },
//!     LayerSpan { layer: 2, range: 10..1010 },
//!     LayerSpan { layer: 3, range: 1010..1015 },
//! ];
//! let plan = BucketPlan::from_layers(&layers, ReduceMode::Layerwise, 25.0);
//! let order: Vec<_> = plan.buckets().iter().map(|b| b.ready_after_layer).collect();
//! assert_eq!(order, [3, 2, 0]);
//! assert_eq!(plan.completed_by(2), 1..2); // bucket 1 is launched after layer 2's backward
//! ```

use crate::config::ReduceMode;
use crate::params::ParamSpan;
use std::ops::Range;

/// Bytes in one MiB (`bucket_mb` is in MiB).
const MIB: f64 = 1024.0 * 1024.0;

/// The gradient floats of one layer: the union of its tensors' spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpan {
    /// Index of the layer in the net.
    pub layer: usize,
    /// Flat range of the layer's tensors (they are laid out contiguously).
    pub range: Range<usize>,
}

/// One all-reduce of a contiguous part of the gradient buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Flat range of gradient floats.
    pub range: Range<usize>,
    /// The bucket is complete once the backward of this layer is done (backward runs in reverse
    /// layer order, so this is the lowest layer index among the bucket's layers).
    pub ready_after_layer: usize,
}

impl Bucket {
    /// Number of floats.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// Size in bytes (f32 gradients).
    pub fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }
}

/// The buckets of one net under one schedule, in launch order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketPlan {
    buckets: Vec<Bucket>,
}

/// Merges the tensors of each layer into one span, in layer order, skipping nothing: every
/// layer that owns parameters appears once. The alignment gap before a layer (see
/// [`crate::params::LAYER_ALIGN`]) joins the previous layer's span, so the spans tile
/// `0..total`; a gap before the first layer joins the first.
///
/// # Panics
/// If `spans` overlap, leave a gap inside a layer, or are not in layer order (what
/// [`crate::params::Params::new`] lays out never does).
pub fn layer_spans(spans: &[ParamSpan]) -> Vec<LayerSpan> {
    let mut out: Vec<LayerSpan> = Vec::new();
    let mut next = 0;
    for s in spans {
        let same_layer = out.last().is_some_and(|l| l.layer == s.layer);
        assert!(
            s.offset == next || (!same_layer && s.offset > next),
            "parameter `{}` starts at {} but the previous one ended at {next}: spans must tile \
             the flat buffer in order",
            s.full_name,
            s.offset
        );
        if let Some(last) = out.last_mut() {
            last.range.end = s.offset;
        }
        next = s.offset + s.len;
        match out.last_mut() {
            Some(last) if last.layer == s.layer => last.range.end = next,
            Some(last) if last.layer > s.layer => panic!(
                "parameter `{}` of layer {} follows layer {}: spans must be in layer order",
                s.full_name, s.layer, last.layer
            ),
            _ => out.push(LayerSpan {
                layer: s.layer,
                range: if out.is_empty() { 0 } else { s.offset }..next,
            }),
        }
    }
    out
}

/// The buckets of `spans` in launch order: [`BucketPlan::new`] as a vector.
pub fn plan_buckets(spans: &[ParamSpan], mode: ReduceMode, bucket_mb: f64) -> Vec<Bucket> {
    BucketPlan::new(spans, mode, bucket_mb).buckets
}

impl BucketPlan {
    /// Plans the buckets of the parameter spans `spans` (in layer order, as in
    /// [`crate::params::Params`]). `bucket_mb` (MiB, positive) matters for `Bucketed` only.
    pub fn new(spans: &[ParamSpan], mode: ReduceMode, bucket_mb: f64) -> Self {
        Self::from_layers(&layer_spans(spans), mode, bucket_mb)
    }

    /// Plans the buckets of `layers`: the layers with parameters, in increasing layer order,
    /// whose ranges tile `0..total`. Empty layers are skipped.
    ///
    /// # Panics
    /// If `layers` are not in increasing layer order or do not tile a prefix of the buffer.
    pub fn from_layers(layers: &[LayerSpan], mode: ReduceMode, bucket_mb: f64) -> Self {
        let mut next = 0;
        for (i, l) in layers.iter().enumerate() {
            assert_eq!(
                l.range.start, next,
                "layer {} does not start where the previous ended",
                l.layer
            );
            assert!(
                l.range.end >= l.range.start,
                "layer {} has a reversed range",
                l.layer
            );
            assert!(
                i == 0 || layers[i - 1].layer < l.layer,
                "layers must be in increasing order"
            );
            next = l.range.end;
        }
        let layers: Vec<&LayerSpan> = layers.iter().filter(|l| !l.range.is_empty()).collect();
        let buckets = match mode {
            ReduceMode::Flat => match (layers.first(), layers.last()) {
                (Some(first), Some(last)) => vec![Bucket {
                    range: first.range.start..last.range.end,
                    ready_after_layer: first.layer,
                }],
                _ => Vec::new(),
            },
            ReduceMode::Layerwise => layers
                .iter()
                .rev()
                .map(|l| Bucket {
                    range: l.range.clone(),
                    ready_after_layer: l.layer,
                })
                .collect(),
            ReduceMode::Bucketed => pack(&layers, target_floats(bucket_mb)),
        };
        BucketPlan { buckets }
    }

    /// The buckets, in launch order.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Number of buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Indices into [`Self::buckets`] of the buckets that become ready when the backward of
    /// `layer` is done (empty for most layers; at most one bucket since spans are not split).
    pub fn completed_by(&self, layer: usize) -> Range<usize> {
        // `ready_after_layer` decreases along the launch order.
        let start = self
            .buckets
            .partition_point(|b| b.ready_after_layer > layer);
        let end = self
            .buckets
            .partition_point(|b| b.ready_after_layer >= layer);
        start..end
    }

    /// Total number of floats covered.
    pub fn total_len(&self) -> usize {
        self.buckets.iter().map(Bucket::len).sum()
    }
}

/// `bucket_mb` MiB as a number of f32, at least one.
fn target_floats(bucket_mb: f64) -> usize {
    let floats = bucket_mb * MIB / std::mem::size_of::<f32>() as f64;
    if floats.is_finite() && floats >= 1.0 {
        floats as usize
    } else {
        1
    }
}

/// Packs non-empty `layers` (increasing order), walked in reverse, into buckets of at most
/// `target` floats; a layer larger than `target` gets a bucket of its own.
fn pack(layers: &[&LayerSpan], target: usize) -> Vec<Bucket> {
    let mut buckets = Vec::new();
    let mut open: Option<Bucket> = None;
    for l in layers.iter().rev() {
        if let Some(b) = open.take() {
            if b.len() + l.range.len() > target {
                buckets.push(b);
            } else {
                open = Some(b);
            }
        }
        open = Some(match open {
            // Walking down: the new layer sits just below the bucket.
            Some(b) => Bucket {
                range: l.range.start..b.range.end,
                ready_after_layer: l.layer,
            },
            None => Bucket {
                range: l.range.clone(),
                ready_after_layer: l.layer,
            },
        });
    }
    buckets.extend(open);
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FillerConfig;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const MODES: [ReduceMode; 3] = [
        ReduceMode::Flat,
        ReduceMode::Layerwise,
        ReduceMode::Bucketed,
    ];

    /// Layers `0..n` where some have no parameters, with random sizes (some zero).
    fn random_layers(rng: &mut ChaCha8Rng, n: usize, max_len: usize) -> Vec<LayerSpan> {
        let mut out = Vec::new();
        let mut next = 0;
        for layer in 0..n {
            if rng.gen_bool(0.3) {
                continue; // a layer without parameters (ReLU, pooling, the loss)
            }
            let len = if rng.gen_bool(0.1) {
                0
            } else {
                rng.gen_range(1..=max_len)
            };
            out.push(LayerSpan {
                layer,
                range: next..next + len,
            });
            next += len;
        }
        out
    }

    fn total(layers: &[LayerSpan]) -> usize {
        layers.last().map_or(0, |l| l.range.end)
    }

    /// Every float of `0..total` lies in exactly one bucket.
    fn assert_covers_exactly_once(plan: &BucketPlan, total: usize) {
        let mut seen = vec![0u8; total];
        for b in plan.buckets() {
            assert!(!b.is_empty(), "empty bucket {b:?}");
            for i in b.range.clone() {
                seen[i] += 1;
            }
        }
        if let Some(i) = seen.iter().position(|&c| c != 1) {
            panic!("float {i} covered {} times by {plan:?}", seen[i]);
        }
    }

    /// Launch order: descending offsets and descending ready layers; each bucket's ready layer
    /// is the lowest layer it contains.
    fn assert_launch_order(plan: &BucketPlan, layers: &[LayerSpan]) {
        for w in plan.buckets().windows(2) {
            assert_eq!(
                w[1].range.end, w[0].range.start,
                "not contiguous in reverse: {w:?}"
            );
            assert!(w[1].ready_after_layer < w[0].ready_after_layer);
        }
        for b in plan.buckets() {
            let lowest = layers
                .iter()
                .filter(|l| !l.range.is_empty() && b.range.contains(&l.range.start))
                .map(|l| l.layer)
                .min()
                .expect("a bucket holds a layer");
            assert_eq!(b.ready_after_layer, lowest, "{b:?}");
            // No layer straddles a bucket boundary.
            for l in layers.iter().filter(|l| !l.range.is_empty()) {
                let inside = b.range.start <= l.range.start && l.range.end <= b.range.end;
                let outside = l.range.end <= b.range.start || b.range.end <= l.range.start;
                assert!(inside || outside, "layer {l:?} split by {b:?}");
            }
        }
    }

    #[test]
    fn every_float_is_covered_exactly_once_in_every_mode() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for case in 0..300 {
            let max_len = 1 << rng.gen_range(0..12);
            let layers = random_layers(&mut rng, 1 + case % 20, max_len);
            let mb = [1e-6, 1e-4, 1e-3, 0.01, 25.0][case % 5];
            for mode in MODES {
                let plan = BucketPlan::from_layers(&layers, mode, mb);
                assert_covers_exactly_once(&plan, total(&layers));
                assert_eq!(plan.total_len(), total(&layers));
                assert_launch_order(&plan, &layers);
            }
        }
    }

    #[test]
    fn flat_is_one_bucket_ready_after_the_lowest_layer_with_parameters() {
        let layers = [
            LayerSpan {
                layer: 1,
                range: 0..0,
            },
            LayerSpan {
                layer: 2,
                range: 0..6,
            },
            LayerSpan {
                layer: 5,
                range: 6..9,
            },
        ];
        let plan = BucketPlan::from_layers(&layers, ReduceMode::Flat, 25.0);
        assert_eq!(
            plan.buckets(),
            [Bucket {
                range: 0..9,
                ready_after_layer: 2
            }]
        );
        assert_eq!(plan.completed_by(5), 0..0);
        assert_eq!(plan.completed_by(2), 0..1);
    }

    #[test]
    fn layerwise_is_one_bucket_per_layer_with_parameters_in_reverse() {
        let layers = [
            LayerSpan {
                layer: 0,
                range: 0..4,
            },
            LayerSpan {
                layer: 1,
                range: 4..4,
            },
            LayerSpan {
                layer: 3,
                range: 4..10,
            },
        ];
        let plan = BucketPlan::from_layers(&layers, ReduceMode::Layerwise, 25.0);
        assert_eq!(
            plan.buckets(),
            [
                Bucket {
                    range: 4..10,
                    ready_after_layer: 3
                },
                Bucket {
                    range: 0..4,
                    ready_after_layer: 0
                },
            ]
        );
        assert_eq!(plan.completed_by(3), 0..1);
        assert_eq!(plan.completed_by(2), 1..1);
        assert_eq!(plan.completed_by(1), 1..1);
        assert_eq!(plan.completed_by(0), 1..2);
    }

    #[test]
    fn bucketed_packs_up_to_the_target_and_a_large_layer_is_alone() {
        // Target: 1 KiB = 256 floats.
        let mb = 1.0 / 1024.0;
        let sizes = [100, 100, 1000, 50, 50, 50, 200];
        let mut next = 0;
        let layers: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(layer, &len)| {
                next += len;
                LayerSpan {
                    layer,
                    range: next - len..next,
                }
            })
            .collect();
        let plan = BucketPlan::from_layers(&layers, ReduceMode::Bucketed, mb);
        let got: Vec<_> = plan
            .buckets()
            .iter()
            .map(|b| (b.ready_after_layer, b.len()))
            .collect();
        // Reverse: 200 | +50 → 250 | +50 would be 300 > 256: close; 50+50 = 100 | 1000 alone | 100+100.
        assert_eq!(got, [(5, 250), (3, 100), (2, 1000), (0, 200)]);
        for b in plan.buckets() {
            let single_layer = layers.iter().any(|l| l.range == b.range);
            assert!(b.len() <= 256 || single_layer, "{b:?} over target");
        }
    }

    #[test]
    fn bucketed_with_a_large_target_is_flat() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let layers = random_layers(&mut rng, 12, 1000);
        let flat = BucketPlan::from_layers(&layers, ReduceMode::Flat, 25.0);
        let bucketed = BucketPlan::from_layers(&layers, ReduceMode::Bucketed, 25.0);
        assert_eq!(flat, bucketed);
    }

    #[test]
    fn bucketed_with_a_tiny_target_is_layerwise() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let layers = random_layers(&mut rng, 12, 1000);
        let layerwise = BucketPlan::from_layers(&layers, ReduceMode::Layerwise, 25.0);
        let bucketed = BucketPlan::from_layers(&layers, ReduceMode::Bucketed, 1e-9);
        assert_eq!(layerwise, bucketed);
    }

    #[test]
    fn no_parameters_no_buckets() {
        for mode in MODES {
            let plan = BucketPlan::from_layers(&[], mode, 25.0);
            assert!(plan.is_empty());
            let empty = [LayerSpan {
                layer: 2,
                range: 0..0,
            }];
            assert!(BucketPlan::from_layers(&empty, mode, 25.0).is_empty());
        }
    }

    fn span(layer: usize, name: &str, offset: usize, len: usize) -> ParamSpan {
        ParamSpan {
            layer,
            full_name: format!("l{layer}.{name}"),
            shape: vec![len],
            offset,
            len,
            lr_mult: 1.0,
            decay_mult: 1.0,
            filler: FillerConfig::constant(0.0),
        }
    }

    #[test]
    fn tensors_of_a_layer_merge_into_one_span() {
        let spans = [
            span(1, "weight", 0, 12),
            span(1, "bias", 12, 3),
            span(3, "weight", 15, 6),
            span(3, "bias", 21, 2),
        ];
        assert_eq!(
            layer_spans(&spans),
            [
                LayerSpan {
                    layer: 1,
                    range: 0..15
                },
                LayerSpan {
                    layer: 3,
                    range: 15..23
                }
            ]
        );
        let plan = BucketPlan::new(&spans, ReduceMode::Layerwise, 25.0);
        assert_eq!(plan.len(), 2);
        assert_eq!(plan.buckets()[0].range, 15..23);
        assert_eq!(
            plan_buckets(&spans, ReduceMode::Layerwise, 25.0),
            plan.buckets()
        );
    }

    #[test]
    #[should_panic(expected = "must tile")]
    fn a_gap_inside_a_layer_is_refused() {
        layer_spans(&[span(0, "weight", 0, 4), span(0, "bias", 5, 4)]);
    }

    #[test]
    fn an_alignment_gap_joins_the_previous_layer() {
        let spans = [span(0, "weight", 0, 4), span(2, "weight", 64, 4)];
        assert_eq!(
            layer_spans(&spans),
            vec![
                LayerSpan {
                    layer: 0,
                    range: 0..64
                },
                LayerSpan {
                    layer: 2,
                    range: 64..68
                }
            ]
        );
    }
}
