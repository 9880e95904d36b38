//! In which [`Layout`] each layer of a GPU net runs and each blob is stored, and where a blob is
//! converted between the two for a layer that runs in the other ([`StoragePlan`]).
//!
//! With channels-last activations on, every layer that can ([`runs_channels_last`]) runs NHWC,
//! the others NCHW. A blob is stored as the first layer writing it runs; the input `data` is
//! stored channels-last when a channels-last layer reads it (the net transposes each batch as it
//! arrives). A layer reading a blob stored the other way reads a converted copy instead: a
//! [`Conversion`] fills the copy before the layer's forward and transposes the copy's gradient
//! back into the blob's after the layer's backward. Blobs whose layout does not matter (not 4-D,
//! or one pixel: a global pooling's output) are never converted, so in ResNet-50 the only
//! conversion is the input's, and in cifar10_quick the last pooling's output before the inner
//! product. In mixed precision a layer that rounds its own bottom gradients (a fused chain, a
//! pooling) reads no blob that other layers read through a copy in the other layout (its
//! rounded gradient, added to theirs in the blob, would be rounded again): it runs NCHW, or the
//! blob's writer does.
//!
//! Every blob has one writer (the graph gives a top that reuses a name a blob of its own), so a
//! blob's layout is never in question.
//!
//! In mixed precision the plan also decides which layers run on half-type blobs
//! ([`runs_on_half_blobs`]: the ungrouped convolutions, the fused BatchNorm and residual
//! chains, the poolings) and so which blobs are stored in the half type ([`Elem`]): a blob is
//! stored as its writer runs, the input `data` and `label` in FP32. A layer reading a blob stored
//! in the other type reads a converted copy, as for a layout; the conversion rounds (FP32 → half,
//! exact where the blob holds half-type values) or widens (exact), and in backward adds the
//! copy's gradient into the blob's, a half-type one rounded after the addition, as the CPU
//! rounds a bottom gradient after each layer's contribution. Two exceptions keep the rounding
//! the CPU's (docs/design.md, Mixed precision): a half-type layer never reads an FP32 blob with
//! other readers (its half-type gradient, widened and added to the others' FP32 sum, would be
//! rounded twice), and no copy converts both layout and type; a layer that would need either
//! runs in FP32 instead, and the plan is made again until no layer does. The same holds the
//! other way round: an FP32 layer that rounds its own bottom gradients (a fused chain, a
//! pooling) never reads a half-type blob with other readers, or the gradient it rounded would be
//! rounded again after the addition; the blob's writer runs in FP32 then. So does a half-type
//! layer whose bottoms are all FP32 and whose tops only FP32 layers read: it would add two
//! conversions and save nothing (a pooling between grouped convolutions, which run in FP32).
//! `testdata/half_exceptions.toml` meets each exception.

use super::fusion::{self, Slot};
use crate::config::layer_params::LayerParams;
use crate::config::LayerConfig;
use crate::cuda::blob::Elem;
use crate::cuda::layers::Grad;
use crate::cuda::layout::{layout_matters, runs_channels_last, Layout};
use crate::layers::Layer;
use crate::net::{Net, DATA, LABEL};
use crate::precision::Half;

/// One bottom of one layer read through a converted copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversion {
    /// The layer (graph index) and the position among the blobs it reads
    /// ([`fusion::reads_of`]: its bottoms, a fused chain's head's then the chain's).
    pub layer: usize,
    pub slot: usize,
    /// The graph's blob, and the copy (an index past the graph's blobs) the layer reads instead.
    pub from: usize,
    pub copy: usize,
}

/// The layouts and element types of a net's layers and blobs; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoragePlan {
    /// Per layer, the layout it runs in.
    pub runs: Vec<Layout>,
    /// Per layer, whether it runs on half-type blobs (a fused chain's head for the chain).
    pub on_half: Vec<bool>,
    /// Per blob — the graph's, then one copy per conversion — how it is stored.
    pub stored: Vec<Layout>,
    /// Per blob, as `stored`, its element type.
    pub elem: Vec<Elem>,
    /// In layer order.
    pub conversions: Vec<Conversion>,
    /// Per layer, the graph's blobs it reads ([`fusion::reads_of`]: a fused chain's head reads
    /// for the whole chain).
    reads: Vec<Vec<usize>>,
}

impl StoragePlan {
    /// The plan for the net `graph` built from `cfg`, with blob `shapes` and fusion `slots`;
    /// all NCHW unless `channels_last`. In mixed precision (`half`), the layers where
    /// `half_capable` says so run on half-type blobs unless the module docs' exceptions apply.
    pub fn new(
        cfg: &[LayerConfig],
        graph: &Net,
        shapes: &[Vec<usize>],
        slots: &[Slot],
        channels_last: bool,
        half: Option<(Half, &[bool])>,
    ) -> StoragePlan {
        let blobs = graph.blob_count();
        let mut runs: Vec<Layout> = cfg
            .iter()
            .map(|lc| match channels_last && runs_channels_last(lc) {
                true => Layout::Nhwc,
                false => Layout::Nchw,
            })
            .collect();
        // A fused chain runs as one layer: channels-last only if all of it can.
        for (head, slot) in slots.iter().enumerate() {
            if let Slot::Head { last, .. } = slot {
                if runs[head..=*last].contains(&Layout::Nchw) {
                    runs[head..=*last].fill(Layout::Nchw);
                }
            }
        }
        let matters = |b: usize| layout_matters(&shapes[b]);
        let read_blobs: Vec<Vec<usize>> = (fusion::reads_of(graph, slots).iter())
            .map(|r| r.iter().map(|r| r.blob).collect())
            .collect();
        let reads = |i: usize| !matches!(slots[i], Slot::Absorbed { .. });
        let runner = |i: usize| match slots[i] {
            Slot::Absorbed { head } => head,
            _ => i,
        };
        let stored_as = |runs: &[Layout]| {
            let mut stored = vec![Layout::Nchw; blobs];
            let data_read_nhwc =
                (0..cfg.len()).any(|i| runs[i] == Layout::Nhwc && read_blobs[i].contains(&DATA));
            if matters(DATA) && data_read_nhwc {
                stored[DATA] = Layout::Nhwc;
            }
            for (i, &run) in runs.iter().enumerate() {
                for &t in graph.node(i).tops {
                    if matters(t) {
                        stored[t] = run;
                    }
                }
            }
            stored
        };
        let mut readers = vec![0usize; blobs];
        for &b in read_blobs.iter().flatten() {
            readers[b] += 1;
        }
        // In mixed precision a layer that rounds its own bottom gradients (a fused chain, a
        // pooling) reads no blob that other layers read through a copy in the other layout: its
        // gradient, rounded in the copy and added to the others' in the blob, would be rounded
        // twice, where the CPU rounds the sum once. The layer runs NCHW instead, or where it
        // runs NCHW already, the blob's writer does: every round moves one layer (or chain) from
        // channels-last to NCHW, so it ends.
        let mut stored = loop {
            let stored = stored_as(&runs);
            let twice = |i: usize| {
                let shared_relaid = |b: &usize| {
                    *b != DATA && readers[*b] > 1 && matters(*b) && stored[*b] != runs[i]
                };
                let b = *read_blobs[i].iter().find(|b| shared_relaid(b))?;
                match runs[i] {
                    Layout::Nhwc => Some(i),
                    Layout::Nchw => (0..cfg.len())
                        .find(|&w| graph.node(w).tops.contains(&b))
                        .map(runner),
                }
            };
            let self_rounding =
                |i: &usize| reads(*i) && rounds_itself_on_fp32_blobs(graph, slots, *i);
            let moved = match half {
                Some(_) => (0..cfg.len()).filter(self_rounding).find_map(twice),
                None => None,
            };
            let Some(j) = moved else { break stored };
            let last = match slots[j] {
                Slot::Head { last, .. } => last,
                _ => j,
            };
            runs[j..=last].fill(Layout::Nchw);
        };
        let mut on_half: Vec<bool> = match half {
            Some((_, capable)) => (0..cfg.len()).map(|i| reads(i) && capable[i]).collect(),
            None => vec![false; cfg.len()],
        };
        // Each round runs in FP32 a layer that an exception rules out (or the writer of the
        // blob it reads), until none is left: every round turns one layer off, so it ends.
        let elem = loop {
            let mut is_half = vec![false; blobs];
            for i in 0..cfg.len() {
                for &t in graph.node(i).tops {
                    is_half[t] = on_half[runner(i)];
                }
            }
            (is_half[DATA], is_half[LABEL]) = (false, false);
            let mut demote = None;
            // A half-type layer between FP32 ones would only add two conversions.
            for i in (0..cfg.len()).filter(|&i| on_half[i]) {
                let outputs = match slots[i] {
                    Slot::Head { last, .. } => graph.node(last).tops,
                    _ => graph.node(i).tops,
                };
                let read_by = |t: usize| {
                    let node_reads = |j: &usize| read_blobs[*j].contains(&t);
                    (0..cfg.len()).filter(node_reads).collect::<Vec<_>>()
                };
                let fp32_in = read_blobs[i].iter().all(|&b| !is_half[b]);
                let fp32_out = outputs.iter().all(|&t| {
                    let readers = read_by(t);
                    !readers.is_empty() && readers.iter().all(|&j| !on_half[j])
                });
                if fp32_in && fp32_out {
                    demote = Some(i);
                    break;
                }
            }
            let none_yet = demote.is_none();
            'layers: for i in (0..cfg.len()).filter(|&i| none_yet && reads(i)) {
                for &b in &read_blobs[i] {
                    let relaid = matters(b) && stored[b] != runs[i];
                    let retyped = is_half[b] != on_half[i];
                    let shared_fp32 = on_half[i] && !is_half[b] && b != DATA && readers[b] > 1;
                    // An FP32 layer that rounds its own bottom gradient, reading a shared
                    // half-type blob: the rounded gradient, added to the others' and rounded
                    // again, would be rounded twice.
                    let shared_half = !on_half[i]
                        && is_half[b]
                        && readers[b] > 1
                        && rounds_itself_on_fp32_blobs(graph, slots, i);
                    if on_half[i] && (relaid || shared_fp32) {
                        demote = Some(i);
                    } else if relaid && retyped || shared_half {
                        // An FP32 layer reading a half-type blob in the other layout, or one
                        // that would round its gradient twice: the blob's writer runs in FP32.
                        let writer = (0..cfg.len()).find(|&w| graph.node(w).tops.contains(&b));
                        demote = writer.map(runner);
                    }
                    if demote.is_some() {
                        break 'layers;
                    }
                }
            }
            match demote {
                Some(i) => on_half[i] = false,
                None => break is_half,
            }
        };
        let elem_of = |h: bool| match (h, half) {
            (true, Some((ty, _))) => Elem::Half(ty),
            _ => Elem::F32,
        };
        let mut elem: Vec<Elem> = elem.into_iter().map(elem_of).collect();
        let mut conversions = Vec::new();
        for (i, &run) in runs.iter().enumerate() {
            if !reads(i) {
                continue;
            }
            let wanted = elem_of(on_half[i]);
            for (slot, &b) in read_blobs[i].iter().enumerate() {
                let relaid = matters(b) && stored[b] != run;
                if relaid || elem[b] != wanted {
                    conversions.push(Conversion {
                        layer: i,
                        slot,
                        from: b,
                        copy: stored.len(),
                    });
                    stored.push(if relaid { run } else { stored[b] });
                    elem.push(wanted);
                }
            }
        }
        StoragePlan {
            runs,
            on_half,
            stored,
            elem,
            conversions,
            reads: read_blobs,
        }
    }

    /// Per layer, the graph's blobs it reads ([`fusion::reads_of`]).
    pub fn reads(&self) -> &[Vec<usize>] {
        &self.reads
    }

    /// Per layer, the blobs it reads ([`fusion::reads_of`]) with each converted one replaced by
    /// its copy.
    pub fn bottoms(&self) -> Vec<Vec<usize>> {
        let mut bottoms = self.reads.clone();
        for c in &self.conversions {
            bottoms[c.layer][c.slot] = c.copy;
        }
        bottoms
    }

    /// Whether the input `data` is stored channels-last (each batch transposed as it arrives).
    pub fn input_channels_last(&self) -> bool {
        self.stored[DATA] == Layout::Nhwc
    }

    /// Whether every layer that reads the input `data` reads it through a half-type copy, whose
    /// conversion rounds it (so that the input itself needs no rounding pass).
    pub fn input_read_through_half_copies_only(&self) -> bool {
        let read_as_stored = self.bottoms().iter().flatten().any(|&b| b == DATA);
        let mut copies = self
            .conversions
            .iter()
            .filter(|c| c.from == DATA)
            .peekable();
        !read_as_stored && copies.peek().is_some() && copies.all(|c| self.elem[c.copy] != Elem::F32)
    }

    /// Whether the backward of the conversion into `copy` overwrites its blob's gradient
    /// (`converted`: the backward plan's [`Grad`] of each conversion, in order) with the copy's
    /// half-type gradient widened: half-type values, which need no rounding.
    pub fn widens_over(&self, copy: usize, converted: &[Grad]) -> bool {
        let mut of_copy = self.conversions.iter().zip(converted);
        of_copy.any(|(c, &g)| {
            c.copy == copy
                && g == Grad::Overwrite
                && self.elem[c.from] == Elem::F32
                && self.elem[c.copy] != Elem::F32
        })
    }

    /// The conversions of layer `i`'s bottoms.
    pub fn of_layer(&self, i: usize) -> impl Iterator<Item = &Conversion> {
        self.conversions.iter().filter(move |c| c.layer == i)
    }
}

/// Whether layer `i` of `graph` (run as `slots` say) can run on half-type blobs: an ungrouped
/// convolution, where `convolutions` (cuDNN's graph API, which takes half-type tensors); the
/// head of a fused BatchNorm → Scale (→ ReLU) or residual sum → ReLU chain; a pooling, alone or
/// fused with a ReLU. Never a layer with a loss weight or reported tops.
pub fn runs_on_half_blobs(graph: &Net, slots: &[Slot], i: usize, convolutions: bool) -> bool {
    let node = graph.node(i);
    if node.loss_weight != 0.0 || node.reports_output || node.is_loss {
        return false;
    }
    match (&slots[i], node.params) {
        (Slot::Absorbed { .. }, _) => false,
        (Slot::Head { .. }, _) => true,
        (Slot::Own, LayerParams::Convolution(p)) => convolutions && p.group == 1,
        (Slot::Own, LayerParams::Pooling(_)) => true,
        (Slot::Own, _) => false,
    }
}

/// Whether layer `i` of `graph` (run as `slots` say), built for mixed precision on FP32 blobs,
/// rounds the bottom gradients it writes itself ([`crate::cuda::layers::GpuLayer::rounds_itself`]):
/// a fused chain's head, a pooling.
fn rounds_itself_on_fp32_blobs(graph: &Net, slots: &[Slot], i: usize) -> bool {
    match (&slots[i], graph.node(i).params) {
        (Slot::Head { .. }, _) | (Slot::Own, LayerParams::Pooling(_)) => true,
        (Slot::Absorbed { .. } | Slot::Own, _) => false,
    }
}

/// The input channels from which a convolution counts as wide: cuDNN's tensor-core kernels run
/// faster on channels-last tensors from there (ResNet-50's), slower below (cifar10_quick's 3 and
/// 32), as measured on an H200.
const WIDE_CHANNELS: usize = 64;

/// What `cluster.gpu_layout = "auto"` goes by: the convolutions' forward multiply-adds over
/// the batch (`N·OH·OW · K·C/group·kh·kw` each, from the blob `shapes` and the `shapers`'
/// weight shapes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvolutionWork {
    /// Whether convolutions with at least [`WIDE_CHANNELS`] input channels do most of them.
    pub wide: bool,
    /// All of them: one replica's step, forward.
    pub macs: f64,
}

impl ConvolutionWork {
    /// The convolutions of `graph`.
    pub fn of(graph: &Net, shapers: &[Box<dyn Layer>], shapes: &[Vec<usize>]) -> Self {
        let (mut wide, mut all) = (0f64, 0f64);
        for (i, shaper) in shapers.iter().enumerate() {
            if shaper.type_name() != "convolution" {
                continue;
            }
            let node = graph.node(i);
            let (bottom, top) = (&shapes[node.bottoms[0]], &shapes[node.tops[0]]);
            let weights: usize = shaper.param_specs()[0].shape.iter().product();
            let outputs = top[0] * top[2..].iter().product::<usize>();
            let macs = outputs as f64 * weights as f64;
            all += macs;
            if bottom[1] >= WIDE_CHANNELS {
                wide += macs;
            }
        }
        ConvolutionWork {
            wide: all > 0.0 && 2.0 * wide >= all,
            macs: all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, GpuLayout, MathMode};
    use crate::cuda::net::fusion;
    use crate::cuda::net::infer_shapes;
    use crate::layers;
    use crate::precision::Half;
    use crate::validate::load_str;
    use std::path::Path;

    const CNN: &str = include_str!("../../../tests/configs/cnn_bn_dropout.toml");

    /// The net of the config `text` for records of `record` (C, H, W), its CPU layers and its
    /// blob shapes at batch 4 ([`build`]) or another ([`build_at`]).
    struct Built {
        cfg: Config,
        graph: Net,
        spans: Vec<crate::params::ParamSpan>,
        shapers: Vec<Box<dyn Layer>>,
        shapes: Vec<Vec<usize>>,
    }

    fn build(text: &str, record: [usize; 3]) -> Built {
        build_at(text, record, 4)
    }

    fn build_at(text: &str, record: [usize; 3], batch: usize) -> Built {
        let cfg: Config = load_str("t.toml", text, Path::new("."), &[]).unwrap().0;
        let (graph, params) = Net::build(&cfg, record, 1).unwrap();
        let mut shapers: Vec<_> = cfg
            .layers
            .iter()
            .map(|l| layers::build_from_config(l).unwrap())
            .collect();
        let shapes = infer_shapes(&graph, &mut shapers, record, batch).unwrap();
        Built {
            cfg,
            graph,
            spans: params.spans,
            shapers,
            shapes,
        }
    }

    /// A net's storage plan, with what it was made from.
    struct Planned {
        plan: StoragePlan,
        graph: Net,
        slots: Vec<Slot>,
        shapes: Vec<Vec<usize>>,
    }

    /// The storage plan of the config `text`: in FP32, or in mixed precision (`half`) with its
    /// chains fused as then and every layer [`runs_on_half_blobs`] allows taken as capable (a
    /// GPU may turn convolutions down where cuDNN has no plan).
    fn plan_of(text: &str, record: [usize; 3], channels_last: bool, half: Option<Half>) -> Planned {
        let b = build(text, record);
        let slots = fusion::plan(&b.graph, &b.spans, half.is_some());
        let capable: Vec<bool> = (0..b.graph.len())
            .map(|i| runs_on_half_blobs(&b.graph, &slots, i, true))
            .collect();
        let plan = StoragePlan::new(
            &b.cfg.layers,
            &b.graph,
            &b.shapes,
            &slots,
            channels_last,
            half.map(|h| (h, &capable[..])),
        );
        Planned {
            plan,
            graph: b.graph,
            slots,
            shapes: b.shapes,
        }
    }

    /// The config `text` with its `[data]` table replaced by synthetic records of `record` (the
    /// data files need not exist).
    fn with_synthetic_data(text: &str, [c, h, w]: [usize; 3]) -> String {
        let start = text.find("\n[data]").unwrap();
        let end = start + 1 + text[start + 1..].find("\n[").unwrap();
        let data =
            format!("\n[data]\nformat = \"synthetic\"\nshape = [{c}, {h}, {w}]\nbatch_size = 1\n");
        format!("{}{data}{}", &text[..start], &text[end..])
    }

    /// The convolutions' work of the config `text` on records of `record` in batches of
    /// `batch`.
    fn work(text: &str, record: [usize; 3], batch: usize) -> ConvolutionWork {
        let b = build_at(&with_synthetic_data(text, record), record, batch);
        ConvolutionWork::of(&b.graph, &b.shapers, &b.shapes)
    }

    /// `gpu_layout = "auto"` with tf32 takes channels-last for ResNet-50 (all but its first
    /// convolution read 64 or more channels), NCHW for cifar10_quick (3 and 32), ResNet-20 (16
    /// to 64) and LeNet (1 and 20); a net without convolutions is not wide. In bf16 and fp16
    /// it also takes channels-last for the narrow nets' large steps, as measured:
    /// cifar10_quick at batch 512 and ResNet-20 at 128, not cifar10_quick at 100 nor LeNet at
    /// 64 (nor at 512).
    #[test]
    fn auto_layout_goes_channels_last_for_wide_or_large_steps() {
        // Embedded, so that the packaged test binary runs from any directory.
        let resnet50 = include_str!("../../../config/resnet50.toml");
        let resnet20 = include_str!("../../../config/resnet20.toml");
        let cifar10_quick = include_str!("../../../config/cifar10_quick.toml");
        let lenet = include_str!("../../../config/lenet.toml");
        let quickstart = include_str!("../../../config/quickstart.toml");
        let cases = [
            ("resnet50", resnet50, [3, 224, 224], 64, true, true),
            ("resnet20", resnet20, [3, 32, 32], 128, false, true),
            (
                "cifar10_quick",
                cifar10_quick,
                [3, 32, 32],
                512,
                false,
                true,
            ),
            (
                "cifar10_quick",
                cifar10_quick,
                [3, 32, 32],
                100,
                false,
                false,
            ),
            ("lenet", lenet, [1, 28, 28], 64, false, false),
            ("lenet", lenet, [1, 28, 28], 512, false, false),
            ("quickstart", quickstart, [1, 28, 28], 64, false, false),
        ];
        for (name, text, record, batch, tf32, half) in cases {
            let w = work(text, record, batch);
            let at = format!("{name} at batch {batch}: {w:?}");
            let auto = |math| GpuLayout::Auto.channels_last(math, w.wide, w.macs);
            assert_eq!(auto(MathMode::Tf32), tf32, "tf32, {at}");
            assert_eq!(auto(MathMode::Bf16), half, "bf16, {at}");
            assert_eq!(auto(MathMode::Fp16), half, "fp16, {at}");
            assert!(!auto(MathMode::Fp32), "fp32, {at}");
        }
        // cifar10_quick's convolutions: 32·32·32·75 + 16·16·32·800 + 8·8·64·800 a sample.
        let quick = work(cifar10_quick, [3, 32, 32], 100).macs;
        assert_eq!(quick, 100.0 * (2_457_600.0 + 6_553_600.0 + 3_276_800.0));
        assert_eq!(work(quickstart, [1, 28, 28], 64).macs, 0.0);
    }

    /// ResNet-50 in bf16, channels-last: every convolution, fused chain and pooling runs on
    /// half-type blobs; the only conversions are the input's into the half type for conv1 and
    /// pool5's output into FP32 for the inner product, whose top the loss and the accuracy read
    /// in FP32.
    #[test]
    fn resnet50_runs_on_half_blobs_from_conv1_to_pool5() {
        let text = include_str!("../../../config/resnet50.toml");
        let Planned { plan, graph, .. } = plan_of(text, [3, 224, 224], true, Some(Half::Bf16));
        let on_fp32: Vec<&str> = (0..graph.len())
            .filter(|&i| !plan.on_half[i])
            .map(|i| graph.layer_name(i))
            .collect();
        // The fused chains' later layers run at their heads (not on their own).
        let own_fp32: Vec<&str> = on_fp32
            .iter()
            .copied()
            .filter(|name| !name.starts_with("scale") && !name.contains("relu"))
            .filter(|name| !name.starts_with("res") || name.contains("branch"))
            .collect();
        assert_eq!(own_fp32, ["fc1000", "loss", "accuracy"]);
        assert!(plan.on_half[layer(&graph, "conv1")]);
        assert!(plan.on_half[layer(&graph, "bn_conv1")]);
        assert!(plan.on_half[layer(&graph, "pool1")]);
        assert!(plan.on_half[layer(&graph, "pool5")]);
        let conversions: Vec<(&str, Elem)> = plan
            .conversions
            .iter()
            .map(|c| (graph.layer_name(c.layer), plan.elem[c.copy]))
            .collect();
        assert_eq!(
            conversions,
            [("conv1", Elem::Half(Half::Bf16)), ("fc1000", Elem::F32)]
        );
        assert_eq!(plan.elem[DATA], Elem::F32);
        let fc_top = graph.node(layer(&graph, "fc1000")).tops[0];
        assert_eq!(plan.elem[fc_top], Elem::F32);
    }

    /// cifar10_quick in bf16 channels-last (`gpu_layout = "nhwc"`), its convolutions taken as
    /// capable (in NCHW a GPU keeps those with a bias on FP32 blobs): its three convolutions and
    /// the poolings fused with their ReLUs between the first two run on half-type blobs; pool3's
    /// output would need both conversions for the NCHW-only inner product, so relu3 → pool3 runs
    /// on FP32 blobs, reading conv3's output widened. The input is rounded for conv1.
    #[test]
    fn cifar10_quick_channels_last_runs_on_half_blobs_from_conv1_to_conv3() {
        let text = include_str!("../../../config/cifar10_quick.toml");
        let text = with_synthetic_data(text, [3, 32, 32]);
        let Planned { plan, graph, .. } = plan_of(&text, [3, 32, 32], true, Some(Half::Bf16));
        let on_half: Vec<&str> = (0..graph.len())
            .filter(|&i| plan.on_half[i])
            .map(|i| graph.layer_name(i))
            .collect();
        // pool1 → relu1 and relu2 → pool2 run fused at their heads.
        assert_eq!(on_half, ["conv1", "pool1", "conv2", "relu2", "conv3"]);
        let retyped: Vec<(&str, Elem)> = plan
            .conversions
            .iter()
            .filter(|c| plan.elem[c.copy] != plan.elem[c.from])
            .map(|c| (graph.layer_name(c.layer), plan.elem[c.copy]))
            .collect();
        assert_eq!(
            retyped,
            [("conv1", Elem::Half(Half::Bf16)), ("relu3", Elem::F32)]
        );
    }

    /// Asserts that the bf16 plan of the config `text` keeps to the module docs' exceptions: no
    /// copy converts both layout and type; no half-type layer reads a blob in the other layout or
    /// an FP32 blob (but the input) that other layers read; no FP32 layer that rounds its own
    /// bottom gradients reads a half-type blob that other layers read, and no such layer of
    /// either type reads a blob that other layers read through a copy in the other layout; no
    /// half-type layer has only FP32 blobs on both sides. Returns the names of the layers on
    /// half-type blobs.
    fn keeps_to_the_exceptions(text: &str, record: [usize; 3], channels_last: bool) -> Vec<String> {
        let Planned {
            plan,
            graph,
            slots,
            shapes,
        } = plan_of(text, record, channels_last, Some(Half::Bf16));
        let reads = |i: usize| !matches!(slots[i], Slot::Absorbed { .. });
        let readers_of = |b: usize| {
            let reading = |&i: &usize| plan.reads()[i].contains(&b);
            (0..graph.len()).filter(reading).collect::<Vec<_>>()
        };
        let is_half = |b: usize| plan.elem[b] != Elem::F32;
        for c in &plan.conversions {
            let relaid = plan.stored[c.copy] != plan.stored[c.from];
            let retyped = plan.elem[c.copy] != plan.elem[c.from];
            assert!(relaid != retyped, "one conversion at a time: {c:?}");
        }
        for i in (0..graph.len()).filter(|&i| reads(i)) {
            let name = graph.layer_name(i);
            for &b in &plan.reads()[i] {
                let shared = readers_of(b).len() > 1;
                if plan.on_half[i] {
                    let relaid = layout_matters(&shapes[b]) && plan.stored[b] != plan.runs[i];
                    assert!(!relaid, "{name} reads a blob in the other layout");
                    assert!(
                        is_half(b) || b == DATA || !shared,
                        "{name} reads a shared FP32 blob"
                    );
                } else if rounds_itself_on_fp32_blobs(&graph, &slots, i) {
                    assert!(
                        !(is_half(b) && shared),
                        "{name} rounds a shared half-type blob's gradient twice"
                    );
                }
                if rounds_itself_on_fp32_blobs(&graph, &slots, i) && b != DATA && shared {
                    let relaid = layout_matters(&shapes[b]) && plan.stored[b] != plan.runs[i];
                    assert!(!relaid, "{name} rounds a shared blob's gradient in a copy");
                }
            }
            if plan.on_half[i] {
                let outputs = match slots[i] {
                    Slot::Head { last, .. } => graph.node(last).tops,
                    _ => graph.node(i).tops,
                };
                let half_in = plan.reads()[i].iter().any(|&b| is_half(b));
                let half_out = outputs.iter().any(|&t| {
                    let readers = readers_of(t);
                    readers.is_empty() || readers.iter().any(|&j| plan.on_half[j])
                });
                assert!(half_in || half_out, "{name} sits between FP32 layers");
            }
        }
        (0..graph.len())
            .filter(|&i| plan.on_half[i])
            .map(|i| graph.layer_name(i).to_string())
            .collect()
    }

    /// The exceptions in a net made to meet each of them, in both layouts. The pooling `pc2`
    /// between FP32 layers runs in FP32; the residual sum, whose bottom `c2` another layer
    /// reads, runs in FP32; so then does `c3`, whose output that sum (rounding its own
    /// gradients) reads with `pc3`; and so `pc3`, then between FP32 layers. What is left on
    /// half-type blobs is `c1` and its BatchNorm chain, read by two FP32 convolutions through
    /// widened copies. With the (NCHW-only) concat reading the chain's output too, channels-last
    /// runs the chain in FP32 (no copy converts layout and type), then `c1` between FP32 layers.
    #[test]
    fn half_blobs_keep_to_the_exceptions() {
        let text = include_str!("testdata/half_exceptions.toml");
        for channels_last in [false, true] {
            let on_half = keeps_to_the_exceptions(text, [3, 8, 8], channels_last);
            assert_eq!(on_half, ["c1", "bn1"], "channels-last {channels_last}");
        }
        let cat_reads_c1 =
            text.replace(r#"["pc2", "pc3", "sum"]"#, r#"["pc2", "pc3", "sum", "c1"]"#);
        assert_ne!(cat_reads_c1, text);
        let on_half = keeps_to_the_exceptions(&cat_reads_c1, [3, 8, 8], false);
        assert_eq!(on_half, ["c1", "bn1"]);
        let on_half = keeps_to_the_exceptions(&cat_reads_c1, [3, 8, 8], true);
        assert!(on_half.is_empty(), "{on_half:?}");
    }

    /// A max pooling reading, beside a convolution, the output of an NCHW-only concat: in FP32
    /// it runs channels-last through a copy, as any layer that can; in mixed precision, where it
    /// rounds the gradient it adds to the concat's, it runs NCHW and reads the concat's output
    /// itself, which the convolution reads through a copy. The rest is as in FP32, and the net
    /// keeps to the exceptions.
    #[test]
    fn a_pooling_rounding_a_shared_gradient_reads_no_copy_of_it() {
        let text = include_str!("testdata/pooling_reads_a_shared_concat.toml");
        let relaid = |half: Option<Half>| {
            let Planned { plan, graph, .. } = plan_of(text, [3, 8, 8], true, half);
            let (pool, cat) = (layer(&graph, "pool"), layer(&graph, "cat"));
            let cat_top = graph.node(cat).tops[0];
            assert_eq!(plan.stored[cat_top], Layout::Nchw);
            let copies: Vec<String> = (plan.conversions.iter())
                .filter(|c| c.from == cat_top)
                .map(|c| graph.layer_name(c.layer).to_string())
                .collect();
            (plan.runs[pool], copies, plan.runs)
        };
        let (pool, copies, fp32_runs) = relaid(None);
        assert_eq!(
            (pool, copies),
            (Layout::Nhwc, vec!["pool".into(), "c".into()])
        );
        let (pool, copies, half_runs) = relaid(Some(Half::Bf16));
        assert_eq!((pool, copies), (Layout::Nchw, vec!["c".to_string()]));
        let moved: Vec<usize> = (0..fp32_runs.len())
            .filter(|&i| fp32_runs[i] != half_runs[i])
            .collect();
        assert_eq!(moved.len(), 1, "{fp32_runs:?} against {half_runs:?}");
        // Every layer reads or writes the concats' FP32 blobs: none runs on half-type blobs.
        for channels_last in [false, true] {
            let on_half = keeps_to_the_exceptions(text, [3, 8, 8], channels_last);
            assert!(on_half.is_empty(), "{on_half:?}");
        }
    }

    /// ResNet-50 in bf16 reads its input only through conv1's half-type copy, in either layout,
    /// so the input needs no rounding pass of its own; not so in FP32, nor where the first
    /// convolutions run on FP32 blobs (between the input and an NCHW-only concat).
    #[test]
    fn only_half_type_copies_read_resnet50s_input() {
        let resnet = include_str!("../../../config/resnet50.toml");
        for channels_last in [false, true] {
            let Planned { plan, .. } =
                plan_of(resnet, [3, 224, 224], channels_last, Some(Half::Bf16));
            assert!(plan.input_read_through_half_copies_only());
            let Planned { plan, .. } = plan_of(resnet, [3, 224, 224], channels_last, None);
            assert!(!plan.input_read_through_half_copies_only());
        }
        let text = include_str!("testdata/concat_between_convolutions.toml");
        let Planned { plan, .. } = plan_of(text, [3, 6, 6], true, Some(Half::Bf16));
        assert!(!plan.input_read_through_half_copies_only());
    }

    /// The nets the project ships and tests keep to the exceptions too, in both layouts.
    #[test]
    fn every_configs_half_blobs_keep_to_the_exceptions() {
        let nets = [
            (include_str!("../../../config/resnet50.toml"), [3, 224, 224]),
            (include_str!("testdata/half_residual.toml"), [3, 8, 8]),
            (
                include_str!("testdata/concat_between_convolutions.toml"),
                [3, 6, 6],
            ),
            (CNN, [1, 8, 8]),
        ];
        for (text, record) in nets {
            for channels_last in [false, true] {
                keeps_to_the_exceptions(text, record, channels_last);
            }
        }
    }

    fn layer(graph: &Net, name: &str) -> usize {
        (0..graph.len())
            .find(|&i| graph.layer_name(i) == name)
            .unwrap()
    }

    #[test]
    fn without_channels_last_everything_is_nchw() {
        let Planned { plan, graph, .. } = plan_of(CNN, [1, 8, 8], false, None);
        assert!(plan.runs.iter().all(|&l| l == Layout::Nchw));
        assert_eq!(plan.stored, vec![Layout::Nchw; graph.blob_count()]);
        assert!(plan.conversions.is_empty());
    }

    /// The test CNN (conv → BatchNorm → Scale → ReLU → pool → grouped conv → ReLU → pool →
    /// dropout → inner product → loss, accuracy): everything up to the dropout and the input go
    /// channels-last; the inner product reads the last 4-D blob through one NCHW copy.
    #[test]
    fn a_cnn_runs_channels_last_up_to_its_inner_product() {
        let Planned { plan, graph, .. } = plan_of(CNN, [1, 8, 8], true, None);
        let conv1 = layer(&graph, "conv1");
        assert_eq!(plan.runs[conv1], Layout::Nhwc);
        assert_eq!(plan.stored[DATA], Layout::Nhwc);
        assert_eq!(plan.stored[graph.node(conv1).tops[0]], Layout::Nhwc);
        let nchw: Vec<&str> = (0..graph.len())
            .filter(|&i| plan.runs[i] == Layout::Nchw)
            .map(|i| graph.layer_name(i))
            .collect();
        assert_eq!(nchw, ["ip1", "loss", "accuracy"]);
        let drop1 = layer(&graph, "drop1");
        assert_eq!(plan.runs[drop1], Layout::Nhwc);
        let [conv] = &plan.conversions[..] else {
            panic!("one conversion expected: {:?}", plan.conversions);
        };
        assert_eq!(conv.layer, layer(&graph, "ip1"));
        assert_eq!(plan.stored[conv.from], Layout::Nhwc);
        assert_eq!(plan.stored[conv.copy], Layout::Nchw);
        assert_eq!(conv.copy, graph.blob_count());
        let bottoms = plan.bottoms();
        assert_eq!(bottoms[conv.layer][conv.slot], conv.copy);
    }

    /// An NCHW-only layer between channels-last ones: a concat of two convolutions read by a
    /// third reads both through NCHW copies, and the third convolution reads the concat's output
    /// through a channels-last copy; the inner product reads the 4-D pooling output through one.
    #[test]
    fn layers_of_either_layout_read_copies_of_the_other() {
        let text = include_str!("testdata/concat_between_convolutions.toml");
        let Planned { plan, graph, .. } = plan_of(text, [3, 6, 6], true, None);
        let by_name = |name: &str| layer(&graph, name);
        let conversions: Vec<(usize, usize, Layout)> = plan
            .conversions
            .iter()
            .map(|c| (c.layer, c.slot, plan.stored[c.copy]))
            .collect();
        assert_eq!(
            conversions,
            [
                (by_name("cat"), 0, Layout::Nchw),
                (by_name("cat"), 1, Layout::Nchw),
                (by_name("c"), 0, Layout::Nhwc),
                (by_name("ip"), 0, Layout::Nchw),
            ]
        );
        assert_eq!(plan.stored[DATA], Layout::Nhwc);
        let cat_top = graph.node(by_name("cat")).tops[0];
        assert_eq!(plan.stored[cat_top], Layout::Nchw);
    }
}
