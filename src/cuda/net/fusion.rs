//! Which layers of a net the GPU runs fused, when the intermediate blobs of a chain are read by
//! nobody else: BatchNorm → Scale (→ ReLU) becomes one [`GpuBnScaleRelu`], and so does
//! BatchNorm → Scale → two-bottom Eltwise SUM → ReLU (a residual block's last branch and its
//! join: the sum's other bottom, the shortcut, becomes the fused layer's second bottom); a
//! two-bottom Eltwise SUM → ReLU one [`GpuEltwiseRelu`], a max Pooling → ReLU or a ReLU → average
//! Pooling one [`GpuPooling`] (see [`GpuPooling::with_relu`]), each at the chain's first slot. The
//! plan is a [`Slot`] per layer; [`super::GpuNet`] runs a fused chain's forward at its head and
//! its backward at its last layer (so that every parameter gradient of the chain is complete when
//! the backward reaches the last layer, where the gradient all-reduce may pick it up). A fused
//! layer reads its chain's [`reads_of`]: the head's bottoms, then those of later layers that the
//! chain does not write itself.
//!
//! In mixed precision the CPU rounds every member's top and bottom gradient. The BatchNorm
//! chain's kernels round where the members would; the others are formed only where no rounding
//! but the chain's last top's and first bottom gradient's (which their kernels apply) can change
//! a value: their ReLU has slope 0, which commutes with the rounding and keeps half-type values.
//! So does the ReLU after a BatchNorm chain's residual sum.

use crate::config::layer_params::LayerParams;
use crate::config::LayerKind;
use crate::cuda::layers::bn_scale_relu::{self, GpuBnScaleRelu};
use crate::cuda::layers::eltwise_relu::{self, GpuEltwiseRelu};
use crate::cuda::layers::pooling::{self, GpuPooling};
use crate::cuda::layers::GpuLayer;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;
use crate::net::{Net, NodeView};
use crate::params::ParamSpan;
use crate::precision::Half;
use std::ops::Range;

/// What the net does at one layer's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// The layer runs itself.
    Own,
    /// The first layer of a fused chain ending at layer `last`, whose fused layer sees the flat
    /// parameters `params` (the chain's tensors and the alignment gaps between them).
    Head { last: usize, params: Range<usize> },
    /// A later layer of the chain that starts at layer `head`.
    Absorbed { head: usize },
}

/// The chain starting at layer `i`, as its last layer, when it can be fused: the layers fit
/// [`bn_scale_relu::fusable`] (alone or with a residual sum, [`bn_scale_relu::fusable_with_sum`]),
/// [`eltwise_relu::fusable`] or [`pooling::fused_relu`], each reads the one top of the one before
/// it (a residual sum reads it beside the shortcut), nobody else reads those intermediate tops,
/// and all run in the same phases without a loss weight. In mixed precision (`half`), a chain of
/// an Eltwise or a Pooling needs a ReLU of slope 0.
fn chain_at(graph: &Net, consumers: &[usize], i: usize, half: bool) -> Option<usize> {
    // Whether layer `b` reads the one top of layer `a` (beside others where `beside`), which
    // nobody else reads.
    let feeds = |a: usize, b: usize, beside: bool| {
        let (na, nb) = (graph.node(a), graph.node(b));
        na.tops.len() == 1
            && (nb.bottoms == na.tops || beside && nb.bottoms.contains(&na.tops[0]))
            && consumers[na.tops[0]] == 1
            && na.phase == nb.phase
            && na.loss_weight == 0.0
            && nb.loss_weight == 0.0
    };
    let linked = |a: usize, b: usize| feeds(a, b, false);
    if i + 1 >= graph.len() || !linked(i, i + 1) {
        return None;
    }
    let nodes = |last: usize| (i..=last).map(|j| graph.node(j)).collect::<Vec<_>>();
    let exact = |pair: &[NodeView]| {
        !half
            || pair.iter().all(|n| match n.params {
                LayerParams::Relu(r) => r.negative_slope == 0.0,
                _ => true,
            })
    };
    match (graph.node(i).params.kind(), graph.node(i).bottoms.len()) {
        (LayerKind::Eltwise, 2) => {
            let pair = nodes(i + 1);
            (eltwise_relu::fusable(&pair) && exact(&pair)).then_some(i + 1)
        }
        (LayerKind::Pooling | LayerKind::Relu, 1) => {
            let pair = nodes(i + 1);
            (pooling::fused_relu(&pair).is_some() && exact(&pair)).then_some(i + 1)
        }
        (LayerKind::BatchNorm, 1) => {
            let with_sum = i + 3 < graph.len()
                && feeds(i + 1, i + 2, true)
                && linked(i + 2, i + 3)
                && bn_scale_relu::fusable_with_sum(&nodes(i + 3))
                && exact(&nodes(i + 3));
            let with_relu = i + 2 < graph.len()
                && linked(i + 1, i + 2)
                && bn_scale_relu::fusable(&nodes(i + 2));
            if with_sum {
                Some(i + 3)
            } else if with_relu {
                Some(i + 2)
            } else {
                bn_scale_relu::fusable(&nodes(i + 1)).then_some(i + 1)
            }
        }
        _ => None,
    }
}

/// One blob a layer reads as the net runs it: the blob, and the layer of the graph and the
/// position among its bottoms that read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub blob: usize,
    pub layer: usize,
    pub slot: usize,
}

/// Per layer of `graph` run as `slots` say, the blobs it reads: a layer that runs itself, its
/// bottoms; a fused chain's head, its own bottoms, then those of the chain's later layers that
/// no layer of the chain writes (a residual sum's shortcut), in order; an absorbed layer, none.
pub fn reads_of(graph: &Net, slots: &[Slot]) -> Vec<Vec<Read>> {
    let own = |j: usize| {
        let node = graph.node(j);
        (node.bottoms.iter().enumerate()).map(move |(slot, &blob)| Read {
            blob,
            layer: j,
            slot,
        })
    };
    (0..graph.len())
        .map(|i| match slots[i] {
            Slot::Own => own(i).collect(),
            Slot::Absorbed { .. } => Vec::new(),
            Slot::Head { last, .. } => {
                let written: Vec<usize> = (i..last)
                    .flat_map(|j| graph.node(j).tops.iter().copied())
                    .collect();
                let later = (i + 1..=last).flat_map(own);
                own(i)
                    .chain(later.filter(|r| !written.contains(&r.blob)))
                    .collect()
            }
        })
        .collect()
}

/// The flat range from the first tensor of layer `first` to the end of the last of `last`.
fn params_of(spans: &[ParamSpan], first: usize, last: usize) -> Option<Range<usize>> {
    let mut chain = spans.iter().filter(|s| (first..=last).contains(&s.layer));
    let first_span = chain.next()?;
    let end = chain.next_back().unwrap_or(first_span).range().end;
    Some(first_span.offset..end)
}

/// The slot of every layer of `graph` with parameters laid out as `spans`, in mixed precision
/// where `half`.
pub fn plan(graph: &Net, spans: &[ParamSpan], half: bool) -> Vec<Slot> {
    let mut consumers = vec![0usize; graph.blob_count()];
    for i in 0..graph.len() {
        for &b in graph.node(i).bottoms {
            consumers[b] += 1;
        }
    }
    let mut slots = vec![Slot::Own; graph.len()];
    let mut i = 0;
    while i < graph.len() {
        // A BatchNorm chain sees the BatchNorm's and the Scale's parameters; the others have
        // none.
        let chain = chain_at(graph, &consumers, i, half).and_then(|last| {
            match graph.node(i).params.kind() {
                LayerKind::BatchNorm => Some((last, params_of(spans, i, i + 1)?)),
                _ => Some((last, 0..0)),
            }
        });
        match chain {
            Some((last, params)) => {
                slots[i] = Slot::Head { last, params };
                for slot in &mut slots[i + 1..=last] {
                    *slot = Slot::Absorbed { head: i };
                }
                i = last + 1;
            }
            None => i += 1,
        }
    }
    slots
}

/// Per blob of `graph`, whether only the skipped layers of fused chains read or write it (the
/// tops of a chain's layers but its last): the net allocates nothing for those.
pub fn idle_blobs(graph: &Net, slots: &[Slot]) -> Vec<bool> {
    let mut idle = vec![false; graph.blob_count()];
    for (head, slot) in slots.iter().enumerate() {
        if let Slot::Head { last, .. } = slot {
            for layer in head..*last {
                for &t in graph.node(layer).tops {
                    idle[t] = true;
                }
            }
        }
    }
    idle
}

/// The fused layer of the chain `(head, last)` (as planned by [`plan`]), for the shapes
/// `bottoms` of the blobs it reads ([`reads_of`]), rounding to `half` in mixed precision.
#[allow(clippy::too_many_arguments)]
pub fn build(
    gpu: &Gpu,
    graph: &Net,
    spans: &[ParamSpan],
    (head, last): (usize, usize),
    bottoms: &[&[usize]],
    layout: Layout,
    half: Option<Half>,
    half_blobs: bool,
) -> Result<Box<dyn GpuLayer>> {
    assert!(
        half.is_some() || !half_blobs,
        "half-type blobs without a half type"
    );
    let chain: Vec<NodeView> = (head..=last).map(|j| graph.node(j)).collect();
    let kind = chain[0].params.kind();
    let mut layer: Box<dyn GpuLayer> = if kind == LayerKind::Eltwise {
        Box::new(GpuEltwiseRelu::new(&chain, half).on_half_blobs(half_blobs))
    } else if matches!(kind, LayerKind::Pooling | LayerKind::Relu) {
        Box::new(
            GpuPooling::with_relu(gpu, &chain, layout)?
                .rounding_to(half)
                .on_half_blobs(half_blobs),
        )
    } else {
        let bn = params_of(spans, head, head).expect("a BatchNorm has state tensors");
        let scale = params_of(spans, head + 1, head + 1).expect("a one-bottom Scale has a factor");
        let layer = match chain.len() {
            4 => GpuBnScaleRelu::with_sum(gpu, &chain, scale.start - bn.start, layout, half)?,
            _ => GpuBnScaleRelu::new(gpu, &chain, scale.start - bn.start, layout, half)?,
        };
        Box::new(layer.on_half_blobs(half_blobs))
    };
    layer.reshape(gpu, bottoms)?;
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::validate::load_str;
    use std::path::Path;

    const CNN: &str = include_str!("../../../tests/configs/cnn_bn_dropout.toml");
    const RELU1: &str =
        "[[layer]]\nname = \"relu1\"\ntype = \"relu\"\nbottom = [\"conv1\"]\ntop = [\"conv1\"]\n";

    fn slots_of(text: &str) -> (Vec<Slot>, Vec<ParamSpan>) {
        slots_for(text, [1, 8, 8])
    }

    fn slots_for(text: &str, record: [usize; 3]) -> (Vec<Slot>, Vec<ParamSpan>) {
        let cfg: Config = load_str("t.toml", text, Path::new("."), &[]).unwrap().0;
        let (graph, layout) = Net::build(&cfg, record, 1).unwrap();
        (plan(&graph, &layout.spans, false), layout.spans)
    }

    #[test]
    fn batch_norm_scale_relu_is_one_chain_with_both_layers_parameters() {
        assert!(CNN.contains(RELU1));
        let (slots, spans) = slots_of(CNN);
        let bn = spans.iter().find(|s| s.full_name == "bn1.mean").unwrap();
        let beta = spans.iter().find(|s| s.full_name == "scale1.bias").unwrap();
        assert_eq!(
            slots[1],
            Slot::Head {
                last: 3,
                params: bn.offset..beta.range().end
            }
        );
        assert_eq!(
            slots[2..4],
            [Slot::Absorbed { head: 1 }, Slot::Absorbed { head: 1 }]
        );
        // relu2 → pool2 (average) is the net's other chain.
        let relu2 = index_of(CNN, "relu2");
        assert_eq!(
            slots[relu2..relu2 + 2],
            [
                Slot::Head {
                    last: relu2 + 1,
                    params: 0..0
                },
                Slot::Absorbed { head: relu2 }
            ]
        );
        let chained = |i: usize| (1..4).contains(&i) || (relu2..relu2 + 2).contains(&i);
        assert!(slots
            .iter()
            .enumerate()
            .all(|(i, s)| chained(i) || *s == Slot::Own));
        let cfg: Config = load_str("t.toml", CNN, Path::new("."), &[]).unwrap().0;
        let (graph, _) = Net::build(&cfg, [1, 8, 8], 1).unwrap();
        let idle = idle_blobs(&graph, &slots);
        let inner_tops = [1, 2, relu2].map(|layer| graph.node(layer).tops[0]);
        for (b, &is_idle) in idle.iter().enumerate() {
            assert_eq!(is_idle, inner_tops.contains(&b), "blob {b}");
        }
    }

    const RESIDUAL: &str = include_str!("../../../tests/configs/cnn_equivalence.toml");

    /// The layer index of `name` in `cfg`.
    fn index_of(text: &str, name: &str) -> usize {
        let cfg: Config = load_str("t.toml", text, Path::new("."), &[]).unwrap().0;
        cfg.layers.iter().position(|l| l.name == name).unwrap()
    }

    #[test]
    fn a_residual_sum_and_its_relu_are_one_chain_without_parameters() {
        let (slots, _) = slots_of(RESIDUAL);
        let sum = index_of(RESIDUAL, "sum");
        assert_eq!(index_of(RESIDUAL, "relu"), sum + 1);
        assert_eq!(
            slots[sum],
            Slot::Head {
                last: sum + 1,
                params: 0..0
            }
        );
        assert_eq!(slots[sum + 1], Slot::Absorbed { head: sum });
        let fused = slots.iter().filter(|s| **s != Slot::Own).count();
        assert_eq!(fused, 2, "{slots:?}");
    }

    #[test]
    fn a_sum_read_by_another_layer_or_a_product_is_not_fused() {
        let sum_of = |text: &str| slots_of(text).0[index_of(text, "sum")].clone();
        // The ReLU writes a new blob and pool_b reads the sum besides it.
        let read_twice = RESIDUAL.replacen(
            "bottom = [\"sum\"]\ntop = [\"sum\"]",
            "bottom = [\"sum\"]\ntop = [\"rectified\"]",
            1,
        );
        assert_ne!(read_twice, RESIDUAL, "the config has the ReLU as expected");
        assert_eq!(sum_of(&read_twice), Slot::Own);
        let product = RESIDUAL.replacen("coeff = [1.0, 0.5]", "operation = \"prod\"", 1);
        assert_ne!(
            product, RESIDUAL,
            "the config has the coefficients as expected"
        );
        assert_eq!(sum_of(&product), Slot::Own);
    }

    const HALF_RESIDUAL: &str = include_str!("testdata/half_residual.toml");

    /// A residual block's last BatchNorm → Scale, its sum with the shortcut and the ReLU after
    /// it are one chain with the BatchNorm's and the Scale's parameters, which reads the
    /// BatchNorm's bottom and the shortcut (the sum's first bottom here); in mixed precision too,
    /// but with a leaky ReLU after the sum the BatchNorm chain stops at its Scale there.
    #[test]
    fn a_batch_norm_chain_takes_the_residual_sum_after_it() {
        let text = HALF_RESIDUAL;
        let at = |name: &str| index_of(text, name);
        let (bn3, relu) = (at("bn3"), at("sum_relu"));
        assert_eq!(relu, bn3 + 3);
        let (slots, spans) = slots_for(text, [3, 8, 8]);
        let params = params_of(&spans, bn3, bn3 + 1).unwrap();
        assert_eq!(slots[bn3], Slot::Head { last: relu, params });
        assert!(slots[bn3 + 1..=relu]
            .iter()
            .all(|s| *s == Slot::Absorbed { head: bn3 }));
        // The projection's chain stops at its Scale: a convolution follows it.
        assert!(matches!(slots[at("bn2")], Slot::Head { last, .. } if last == at("scale2")));
        let cfg: Config = load_str("t.toml", text, Path::new("."), &[]).unwrap().0;
        let (graph, layout) = Net::build(&cfg, [3, 8, 8], 1).unwrap();
        let blob = |layer: &str| graph.node(at(layer)).tops[0];
        let reads = reads_of(&graph, &slots);
        let read = |r: &Read| (r.blob, r.layer, r.slot);
        assert_eq!(
            reads[bn3].iter().map(read).collect::<Vec<_>>(),
            [(blob("projection"), bn3, 0), (blob("scale2"), at("sum"), 0)]
        );
        assert!((bn3 + 1..=relu).all(|j| reads[j].is_empty()));
        assert_eq!(plan(&graph, &layout.spans, true), slots, "slope 0 in bf16");
        let leaky = text.replacen(
            "name = \"sum_relu\"\ntype = \"relu\"\n",
            "name = \"sum_relu\"\ntype = \"relu\"\nnegative_slope = 0.1\n",
            1,
        );
        assert_ne!(leaky, text, "the config names sum_relu as expected");
        let cfg: Config = load_str("t.toml", &leaky, Path::new("."), &[]).unwrap().0;
        let (graph, layout) = Net::build(&cfg, [3, 8, 8], 1).unwrap();
        assert!(
            matches!(slots_for(&leaky, [3, 8, 8]).0[bn3], Slot::Head { last, .. } if last == relu)
        );
        let half = plan(&graph, &layout.spans, true);
        assert!(matches!(half[bn3], Slot::Head { last, .. } if last == bn3 + 1));
        assert_eq!(half[at("sum")], Slot::Own);
    }

    /// `config/cifar10_quick.toml` on synthetic records (its CIFAR-10 files need not exist).
    fn quick() -> String {
        let text = include_str!("../../../config/cifar10_quick.toml");
        let start = text.find("format = \"cifar10\"").unwrap();
        let end = text.find("mean_value = ").unwrap();
        let synthetic = "format = \"synthetic\"\nshape = [3, 32, 32]\nclasses = 10\n";
        format!("{}{synthetic}{}", &text[..start], &text[end..])
    }

    /// cifar10_quick's poolings run fused with their ReLUs, without parameters: max pooling →
    /// ReLU (pool1, relu1) and ReLU → average pooling (relu2, pool2; relu3, pool3). A leaky ReLU
    /// stays after a max pooling, and so does any ReLU after an average pooling or one of
    /// negative slope before it.
    #[test]
    fn poolings_and_their_relus_are_chains_without_parameters() {
        let quick = quick();
        let slots_of = |text: &str| slots_for(text, [3, 32, 32]).0;
        let slots = slots_of(&quick);
        let pairs = [("pool1", "relu1"), ("relu2", "pool2"), ("relu3", "pool3")];
        let mut chained = Vec::new();
        for (first, second) in pairs {
            let head = index_of(&quick, first);
            assert_eq!(index_of(&quick, second), head + 1, "{first} → {second}");
            let fused = Slot::Head {
                last: head + 1,
                params: 0..0,
            };
            assert_eq!(slots[head], fused, "{first}");
            assert_eq!(slots[head + 1], Slot::Absorbed { head }, "{second}");
            chained.extend([head, head + 1]);
        }
        let others = slots
            .iter()
            .enumerate()
            .filter(|(i, _)| !chained.contains(i));
        assert!(others.into_iter().all(|(_, s)| *s == Slot::Own));
        let (pool1, relu2) = (index_of(&quick, "pool1"), index_of(&quick, "relu2"));
        let relu = |name: &str| format!("name = \"{name}\"\ntype = \"relu\"\n");
        let with_slope = |name: &str, slope: &str| {
            let text = quick.replace(
                &relu(name),
                &format!("{}negative_slope = {slope}\n", relu(name)),
            );
            assert_ne!(text, quick, "{name} as expected");
            slots_of(&text)
        };
        assert_eq!(with_slope("relu1", "0.1")[pool1], Slot::Own);
        assert!(matches!(
            with_slope("relu2", "0.1")[relu2],
            Slot::Head { .. }
        ));
        assert_eq!(with_slope("relu2", "-0.5")[relu2], Slot::Own);
        let average = quick.replacen("pool = \"max\"", "pool = \"ave\"", 1);
        assert_eq!(slots_of(&average)[pool1], Slot::Own);
    }

    /// In mixed precision a leaky ReLU joins a BatchNorm chain (whose kernels round its leak) but
    /// neither a residual sum nor an average pooling, whose top the CPU would round before it.
    #[test]
    fn in_mixed_precision_only_exact_chains_take_a_leaky_relu() {
        let half_slots = |text: &str| {
            let cfg: Config = load_str("t.toml", text, Path::new("."), &[]).unwrap().0;
            let (graph, layout) = Net::build(&cfg, [1, 8, 8], 1).unwrap();
            plan(&graph, &layout.spans, true)
        };
        assert_eq!(half_slots(CNN), slots_of(CNN).0, "slope 0: the FP32 chains");
        let relu = |name: &str| format!("name = \"{name}\"\ntype = \"relu\"\n");
        let leaky = |text: &str, name: &str| {
            let with = text.replacen(
                &relu(name),
                &format!("{}negative_slope = 0.1\n", relu(name)),
                1,
            );
            assert_ne!(with, text, "{name} as expected");
            with
        };
        let cnn = leaky(&leaky(CNN, "relu1"), "relu2");
        let (fp32, _) = slots_of(&cnn);
        let half = half_slots(&cnn);
        let relu2 = index_of(CNN, "relu2");
        assert!(matches!(fp32[1], Slot::Head { last: 3, .. }) && fp32[1] == half[1]);
        assert!(matches!(fp32[relu2], Slot::Head { .. }));
        assert_eq!(half[relu2], Slot::Own);
        let residual = leaky(RESIDUAL, "relu");
        let sum = index_of(RESIDUAL, "sum");
        assert!(matches!(slots_of(&residual).0[sum], Slot::Head { .. }));
        assert_eq!(half_slots(&residual)[sum], Slot::Own);
    }

    #[test]
    fn a_relu_with_a_negative_slope_stays_out_of_the_chain() {
        let leaky = RELU1.replace(
            "type = \"relu\"\n",
            "type = \"relu\"\nnegative_slope = -0.5\n",
        );
        let (slots, _) = slots_of(&CNN.replace(RELU1, &leaky));
        assert!(matches!(slots[1], Slot::Head { last: 2, .. }));
        assert_eq!(slots[3], Slot::Own);
    }

    #[test]
    fn a_normalised_blob_read_twice_is_not_fused() {
        // relu1 reads the BatchNorm's output, which the Scale reads too.
        let text = CNN.replacen(
            "name = \"scale1\"\ntype = \"scale\"\nbottom = [\"conv1\"]\ntop = [\"conv1\"]",
            "name = \"scale1\"\ntype = \"scale\"\nbottom = [\"conv1\"]\ntop = [\"scaled\"]",
            1,
        );
        assert_ne!(text, CNN, "the config names scale1 as expected");
        let (slots, _) = slots_of(&text);
        let relu2 = index_of(CNN, "relu2");
        let own = slots
            .iter()
            .enumerate()
            .filter(|(i, _)| ![relu2, relu2 + 1].contains(i));
        assert!(own.into_iter().all(|(_, s)| *s == Slot::Own), "{slots:?}");
    }
}
