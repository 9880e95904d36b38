//! Mixed precision on the GPU (`cluster.math = "bf16"`): [`HalfRounding`], the rounding points of
//! `crate::precision` applied to a [`GpuNet`](super::GpuNet)'s FP32 blobs, so that the GPU
//! computes the numbers the CPU backend computes (up to summation order):
//!
//! - before each forward pass, the input `data` in place (unless every layer reads it through a
//!   half-type copy, whose conversion rounds it), and the weights the layers see: a copy
//!   of the FP32 master weights rounded to the half type, except the tensors of stateful layers
//!   (BatchNorm's running statistics), copied as they are. The update step writes the rounded
//!   copies from each new weight as it writes the weight ([`HalfRounding::copies`]), so a
//!   forward pass after it rounds nothing; only where the master weights were written otherwise
//!   (the start's broadcast, a resume, local SGD's averaging: [`GpuParams::version`] tells)
//!   does it round them all again;
//! - after each layer's forward, its tops, unless it is a loss or a reported layer (accuracy), or
//!   only layers that round their bottoms as they read them read those tops
//!   ([`GpuLayer::rounds_on_load`]: a convolution's top before a fused BatchNorm or a pooling);
//! - after each layer's backward, the diffs of the bottoms it sent a gradient to (after its
//!   contribution was added in FP32), unless it is the last to add to a diff that only a layer
//!   rounding it as it reads it reads next ([`RoundingPlan::diff_left_by`]: a convolution's
//!   bottom gradient on its way to a fused BatchNorm chain, a residual sum or a pooling).
//!
//! A rounding that cannot change a value is skipped: the tops of a layer whose forward keeps
//! half-type values ([`GpuLayer::forward_keeps_half`]: ReLU without slope, max pooling, the
//! views) when its bottoms hold them, a bottom diff its backward overwrites from half-type
//! top diffs ([`GpuLayer::backward_keeps_half`]), and an FP32 blob's diff that the widened
//! gradient of a half-type layer's copy overwrites (`StoragePlan::widens_over`).
//!
//! Layers that take [`HalfOperands`] (the inner product) run their GEMMs on half-type operands
//! with FP32 accumulation: their first tensor (the weight matrix) as a half-type copy, which they
//! read in no other form, so it has no rounded FP32 copy ([`WeightCopy::Half`]); their bottoms
//! and top diffs converted, which is exact because those hold half-type values —
//! a condition checked per layer here (every bottom is the input or a top rounded by this
//! module, no top is a loss top). Other GEMMs and convolutions run on tensor cores with TF32
//! operands, which hold half-type values exactly
//! ([`MathMode::tf32_tensor_cores`](crate::config::MathMode::tf32_tensor_cores)), so their
//! products too are those of half-type operands accumulated in FP32, as the contract says.
//! A layer that rounds its own results ([`GpuLayer::rounds_itself`]: the fused BatchNorm → Scale
//! → ReLU and residual sum → ReLU chains, and the poolings, fused with a ReLU or not) gets no
//! rounding pass.

use super::storage::Conversion;
use crate::cuda::kernels::{WeightCopies, WeightCopy};
use crate::cuda::layers::{GpuLayer, HalfOperands};
use crate::cuda::params::GpuParams;
use crate::cuda::{gpu_error, Gpu};
use crate::error::Result;
use crate::layers::Layer;
use crate::net::{Net, DATA, LABEL};
use crate::params::ParamSpan;
use crate::precision::Half;
use cudarc::driver::{CudaSlice, DevicePtrMut};
use std::ops::Range;

/// The rounding of one GPU net; see the module docs.
pub struct HalfRounding {
    half: Half,
    /// `(params)` the weights the layers see as floats in the passes since the last
    /// [`HalfRounding::round_weights`] (a [`WeightCopy::Half`] tensor's range is not written).
    pub weights: CudaSlice<f32>,
    /// `(params)` the [`WeightCopy::Half`] tensors as half-type bit patterns, where some layer
    /// takes half operands (the other ranges are not written).
    weights_half: Option<CudaSlice<u16>>,
    /// `(spans)` how each tensor is copied, as [`WeightCopy`] values for the update kernels.
    kinds: CudaSlice<i32>,
    /// The flat parameters in contiguous runs of one [`WeightCopy`].
    runs: Vec<(Range<usize>, WeightCopy)>,
    /// The [`GpuParams::version`] of the master weights that the rounded and half copies hold.
    copied_from: Option<u64>,
    /// Where the passes round.
    pub plan: RoundingPlan,
    /// Whether the input `data` is rounded in place before each forward pass: not where every
    /// layer reads it through a half-type copy, whose conversion rounds it.
    pub rounds_input: bool,
}

/// How each tensor of `spans` is copied for the layers: as it is where its layer `stateful`
/// says so, as half-type bit patterns only where it is the first tensor run by a layer that
/// `takes_half_operands` (indexed by the running layer; the tensors of layer `j` are run by
/// layer `runs_at[j]`, the head of its fused chain), rounded as a float elsewhere.
pub(super) fn weight_copies(
    spans: &[ParamSpan],
    stateful: impl Fn(usize) -> bool,
    takes_half_operands: &[bool],
    runs_at: &[usize],
) -> Vec<WeightCopy> {
    let mut seen = vec![false; takes_half_operands.len()];
    spans
        .iter()
        .map(|s| {
            let runner = runs_at[s.layer];
            let first = !std::mem::replace(&mut seen[runner], true);
            match () {
                _ if stateful(s.layer) => WeightCopy::Kept,
                _ if first && takes_half_operands[runner] => WeightCopy::Half,
                _ => WeightCopy::Rounded,
            }
        })
        .collect()
}

/// The flat ranges of `spans` (laid out, in order) merged into contiguous runs of one of their
/// `kinds`.
pub(super) fn copy_runs(
    spans: &[ParamSpan],
    kinds: &[WeightCopy],
) -> Vec<(Range<usize>, WeightCopy)> {
    let mut runs: Vec<(Range<usize>, WeightCopy)> = Vec::new();
    for (s, &kind) in spans.iter().zip(kinds) {
        match runs.last_mut() {
            Some((r, was)) if *was == kind && r.end == s.offset => r.end = s.offset + s.len,
            _ => runs.push((s.range(), kind)),
        }
    }
    runs
}

/// What a GPU layer tells the rounding about itself (the [`GpuLayer`] methods of those names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct LayerTraits {
    pub forward_keeps_half: bool,
    pub backward_keeps_half: bool,
    pub takes_half_operands: bool,
    pub rounds_itself: bool,
    pub rounds_on_load: bool,
}

impl LayerTraits {
    fn of(layer: &dyn GpuLayer) -> LayerTraits {
        LayerTraits {
            forward_keeps_half: layer.forward_keeps_half(),
            backward_keeps_half: layer.backward_keeps_half(),
            takes_half_operands: layer.takes_half_operands(),
            rounds_itself: layer.rounds_itself(),
            rounds_on_load: layer.rounds_on_load(),
        }
    }
}

/// Where a net's passes round, decided from the graph and its layers' [`LayerTraits`] alone
/// (see the module docs).
#[derive(Debug)]
pub struct RoundingPlan {
    /// Per layer, whether its tops are rounded after its forward.
    pub rounds_tops: Vec<bool>,
    /// Per layer, whether a bottom diff its backward overwrites holds half-type values already.
    pub backward_keeps_half: Vec<bool>,
    /// Per layer, whether its passes carry [`HalfOperands`].
    pub takes_half_operands: Vec<bool>,
    /// Per layer, whether it rounds its tops and the bottom diffs it writes itself.
    pub rounds_itself: Vec<bool>,
    /// Per blob, the layer whose backward leaves the blob's diff unrounded, for the layer that
    /// wrote the blob to round as it reads it ([`GpuLayer::rounds_on_load`]): the last of the
    /// blob's readers to add to its diff, after which the diff is read only by that writer.
    pub diff_left_by: Vec<Option<usize>>,
}

impl RoundingPlan {
    /// The plan for the net `graph` whose layers (the slots' layers: a fused chain's at its head)
    /// have the `traits`, the work of layer `i` run by layer `runs_at[i]`, reading the blobs
    /// `bottoms` after the storage plan's `conversions`.
    pub(super) fn new(
        graph: &Net,
        traits: &[LayerTraits],
        runs_at: &[usize],
        bottoms: &[Vec<usize>],
        conversions: &[Conversion],
    ) -> RoundingPlan {
        let mut values = HalfValues::new(graph, conversions);
        // A layer whose tops only layers rounding their bottoms as they read them read leaves
        // them unrounded.
        let mut readers = vec![Vec::new(); graph.blob_count()];
        for j in 0..graph.len() {
            for &b in graph.node(j).bottoms {
                readers[b].push(j);
            }
        }
        let read_rounded = |t: usize| {
            // A fused chain reads its blobs as its head (a residual sum's shortcut too).
            let on_load = |j: &usize| traits[runs_at[*j]].rounds_on_load;
            !readers[t].is_empty() && readers[t].iter().all(on_load)
        };
        let leaves_tops: Vec<bool> = (0..graph.len())
            .map(|i| {
                let tops = graph.node(i).tops;
                !tops.is_empty() && tops.iter().all(|&t| read_rounded(t))
            })
            .collect();
        for i in (0..graph.len()).filter(|&i| leaves_tops[i]) {
            for &t in graph.node(i).tops {
                values.leave_unrounded(t, conversions);
            }
        }
        // Backward runs in reverse net order, a fused chain at its head's turn as far as other
        // layers are concerned: a blob's first reader in net order adds to its diff last.
        let mut writer = vec![None; graph.blob_count()];
        for (i, &runs) in runs_at.iter().enumerate() {
            for &t in graph.node(i).tops {
                writer[t] = Some(runs);
            }
        }
        let diff_left_by = (0..graph.blob_count())
            .map(|b| {
                let w = writer[b].filter(|&w| traits[w].rounds_on_load)?;
                let last = readers[b].iter().map(|&j| runs_at[j]).min()?;
                (last != w).then_some(last)
            })
            .collect();
        let per_layer = |f: &dyn Fn(usize, &LayerTraits) -> bool| -> Vec<bool> {
            traits.iter().enumerate().map(|(i, t)| f(i, t)).collect()
        };
        RoundingPlan {
            rounds_itself: per_layer(&|_, t| t.rounds_itself),
            rounds_tops: per_layer(&|i, t| {
                let kept = t.rounds_itself || t.forward_keeps_half && values.all(&bottoms[i]);
                values.tops[i] && !kept && !leaves_tops[i]
            }),
            backward_keeps_half: per_layer(&|i, t| values.tops[i] && t.backward_keeps_half),
            takes_half_operands: per_layer(&|i, t| {
                values.tops[i] && t.takes_half_operands && values.all(&bottoms[i])
            }),
            diff_left_by,
        }
    }
}

/// Where a net's values hold half-type values: per layer whether its tops do after the
/// layer's forward and the rounding (all but those of loss and reported layers), and per blob
/// (the graph's, then the storage plan's copies) whether every writer leaves half-type values.
pub(super) struct HalfValues {
    pub tops: Vec<bool>,
    pub blobs: Vec<bool>,
}

impl HalfValues {
    pub(super) fn new(graph: &Net, conversions: &[Conversion]) -> HalfValues {
        let tops: Vec<bool> = (0..graph.len())
            .map(|i| {
                let node = graph.node(i);
                !node.is_loss && !node.reports_output
            })
            .collect();
        let mut blobs = vec![None; graph.blob_count()];
        for (i, &half) in tops.iter().enumerate() {
            for &t in graph.node(i).tops {
                blobs[t] = Some(blobs[t].unwrap_or(true) && half);
            }
        }
        let mut blobs: Vec<bool> = blobs.into_iter().map(|b| b.unwrap_or(false)).collect();
        // The input is rounded before each forward (or, where it is not, read only through
        // half-type copies, which round it); labels never are.
        (blobs[DATA], blobs[LABEL]) = (true, false);
        // Each copy (an index past the graph's blobs) holds what its source holds.
        blobs.resize(graph.blob_count() + conversions.len(), false);
        for c in conversions {
            blobs[c.copy] = blobs[c.from];
        }
        HalfValues { tops, blobs }
    }

    /// Marks `blob` and its storage copies (of `conversions`) as not holding half-type values:
    /// a top left unrounded for its readers to round.
    pub(super) fn leave_unrounded(&mut self, blob: usize, conversions: &[Conversion]) {
        self.blobs[blob] = false;
        for c in conversions.iter().filter(|c| c.from == blob) {
            self.blobs[c.copy] = false;
        }
    }

    /// Whether every blob of `bottoms` holds half-type values.
    pub(super) fn all(&self, bottoms: &[usize]) -> bool {
        bottoms.iter().all(|&b| self.blobs[b])
    }
}

impl HalfRounding {
    /// The rounding to `half` of the net `graph` (its CPU `layers`, its GPU layers `gpu_layers`
    /// reading the blobs `bottoms`, after the storage plan's `conversions`; the work of layer `i`
    /// run by layer `runs_at[i]`, the head of its fused chain) with the learnable tensors `spans`
    /// (laid out, in order) of `len` floats.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        half: Half,
        graph: &Net,
        layers: &[Box<dyn Layer>],
        gpu_layers: &[Box<dyn GpuLayer>],
        runs_at: &[usize],
        bottoms: &[Vec<usize>],
        (conversions, rounds_input): (&[Conversion], bool),
        spans: &[ParamSpan],
        len: usize,
    ) -> Result<HalfRounding> {
        let traits: Vec<LayerTraits> = gpu_layers
            .iter()
            .map(|l| LayerTraits::of(l.as_ref()))
            .collect();
        let plan = RoundingPlan::new(graph, &traits, runs_at, bottoms, conversions);
        let stateful = |layer: usize| layers[layer].has_state();
        let kinds = weight_copies(spans, stateful, &plan.takes_half_operands, runs_at);
        let alloc = |what: &str| {
            let what = format!("allocate the half-precision weights{what}");
            move |e| gpu_error(&what, e)
        };
        let weights = gpu
            .compute
            .alloc_zeros::<f32>(len.max(1))
            .map_err(alloc(""))?;
        let weights_half = match kinds.contains(&WeightCopy::Half) {
            true => Some(
                gpu.compute
                    .alloc_zeros::<u16>(len.max(1))
                    .map_err(alloc(" (bit patterns)"))?,
            ),
            false => None,
        };
        let table: Vec<i32> = match kinds.is_empty() {
            true => vec![WeightCopy::Kept as i32],
            false => kinds.iter().map(|&k| k as i32).collect(),
        };
        let kinds_on_device = gpu.compute.clone_htod(&table).map_err(alloc(" (kinds)"))?;
        Ok(HalfRounding {
            half,
            weights,
            weights_half,
            kinds: kinds_on_device,
            runs: copy_runs(spans, &kinds),
            copied_from: None,
            plan,
            rounds_input,
        })
    }

    /// The half-type operands of layer `layer` over its `range` of the flat parameters, where
    /// it takes them.
    pub fn operands(&self, layer: usize, range: Range<usize>) -> Option<HalfOperands<'_>> {
        let weights = self.weights_half.as_ref()?;
        self.plan.takes_half_operands[layer].then(|| HalfOperands {
            half: self.half,
            params: weights.slice(range),
        })
    }

    /// Fills the copies of the weights the layers see from the master weights `params`, on the
    /// compute stream: the stateful layers' tensors always, the rounded and half copies unless
    /// they already hold these weights.
    pub fn round_weights(&mut self, gpu: &Gpu, params: &GpuParams) -> Result<()> {
        let current = self.copies_current(params);
        let fp16 = self.half == Half::Fp16;
        let (k, s) = (&gpu.kernels, &gpu.compute);
        for (range, kind) in &self.runs {
            let (from, n) = (params.data().slice(range.clone()), range.len());
            let mut to = self.weights.slice_mut(range.clone());
            match kind {
                WeightCopy::Kept => s
                    .memcpy_dtod(&from, &mut to)
                    .map_err(|e| gpu_error("copy a stateful layer's tensors", e))?,
                _ if current => {}
                WeightCopy::Rounded => k.round_half_copy(s, &from, &mut to, fp16, n)?,
                WeightCopy::Half => {
                    let bits = self
                        .weights_half
                        .as_mut()
                        .expect("allocated for half copies");
                    k.to_half(s, &from, &mut bits.slice_mut(range.clone()), fp16, n)?
                }
            }
        }
        self.mark_copied(params);
        Ok(())
    }

    /// Whether the rounded and half copies hold the master weights `params`.
    pub fn copies_current(&self, params: &GpuParams) -> bool {
        self.copied_from == Some(params.version())
    }

    /// Records that the rounded and half copies hold the master weights `params` (after a pass
    /// that wrote only stateful layers' tensors, or an update that wrote the copies).
    pub fn mark_copied(&mut self, params: &GpuParams) {
        self.copied_from = Some(params.version());
    }

    /// The copies, for an update step to write from the new weights.
    pub fn copies(&mut self) -> WeightCopies<'_> {
        WeightCopies {
            rounded: &mut self.weights,
            half: self.weights_half.as_mut(),
            kinds: &self.kinds,
            fp16: self.half == Half::Fp16,
        }
    }

    /// Rounds `x[..n]` in place, on the compute stream.
    pub fn round(&self, gpu: &Gpu, x: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        gpu.kernels
            .round_half(&gpu.compute, x, self.half == Half::Fp16, n)
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_runs, weight_copies};
    use crate::cuda::kernels::WeightCopy::{Half, Kept, Rounded};
    use crate::params::Params;

    /// Runs without a GPU. A net of an inner product taking half operands (weights, bias), a
    /// BatchNorm (three state tensors), a chain whose head (layer 2, no tensors) takes half
    /// operands and runs layer 3 (two tensors), and an inner product on FP32 operands: only the
    /// first tensor run by a layer taking half operands is copied as half bits only, the
    /// stateful layer's tensors are kept, the rest rounded; the runs merge what is contiguous.
    #[test]
    fn only_a_half_operand_layers_first_tensor_is_copied_as_half_only() {
        let tensors = [
            (6, 0),
            (3, 0),
            (4, 1),
            (4, 1),
            (1, 1),
            (5, 3),
            (2, 3),
            (7, 4),
            (1, 4),
        ];
        let p = Params::of_tensors(&tensors.map(|(len, _)| (len, 1.0, 1.0)), |i| tensors[i].1);
        let runs_at = [0, 1, 2, 2, 4];
        let takes_half = [true, false, true, false, false];
        let kinds = weight_copies(&p.spans, |layer| layer == 1, &takes_half, &runs_at);
        let want = [
            Half, Rounded, Kept, Kept, Kept, Half, Rounded, Rounded, Rounded,
        ];
        assert_eq!(kinds, want);
        let runs = copy_runs(&p.spans, &kinds);
        let at = |i: usize| p.spans[i].offset;
        let end = |i: usize| p.spans[i].offset + p.spans[i].len;
        let mut expected = vec![
            (at(0)..end(0), Half),
            (at(1)..end(1), Rounded),
            (at(2)..end(4), Kept),
            (at(5)..end(5), Half),
            (at(6)..end(6), Rounded),
        ];
        // Layers start on aligned offsets: layer 4's tensors follow layer 3's after a gap.
        assert!(at(7) > end(6), "layers are aligned apart");
        expected.push((at(7)..end(8), Rounded));
        assert_eq!(runs, expected);
    }
}
