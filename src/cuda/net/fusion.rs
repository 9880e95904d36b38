//! Which layers of a net the GPU runs fused: BatchNorm → Scale (→ ReLU) chains whose intermediate
//! blobs nobody else reads become one [`GpuBnScaleRelu`] at the chain's first slot. The plan is a
//! [`Slot`] per layer; [`super::GpuNet`] runs a fused chain's forward at its head and its backward
//! at its last layer (so that every parameter gradient of the chain is complete when the
//! backward reaches the last layer, where the gradient all-reduce may pick it up).

use crate::config::LayerConfig;
use crate::cuda::layers::bn_scale_relu::{fusable, GpuBnScaleRelu};
use crate::cuda::layers::GpuLayer;
use crate::cuda::Gpu;
use crate::error::Result;
use crate::net::Net;
use crate::params::ParamSpan;
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

/// The chain starting at layer `i`, as the layer indices it covers, when it can be fused: the
/// layers fit [`fusable`], each reads the one top of the one before it, nobody else reads those
/// intermediate tops, and all run in the same phases without a loss weight.
fn chain_at(cfg: &[LayerConfig], graph: &Net, consumers: &[usize], i: usize) -> Option<usize> {
    let linked = |a: usize, b: usize| {
        let (na, nb) = (graph.node(a), graph.node(b));
        na.tops.len() == 1
            && nb.bottoms == na.tops
            && consumers[na.tops[0]] == 1
            && na.phase == nb.phase
            && na.loss_weight == 0.0
            && nb.loss_weight == 0.0
    };
    if i + 1 >= cfg.len() || graph.node(i).bottoms.len() != 1 || !linked(i, i + 1) {
        return None;
    }
    let with_relu =
        i + 2 < cfg.len() && linked(i + 1, i + 2) && fusable(&[&cfg[i], &cfg[i + 1], &cfg[i + 2]]);
    if with_relu {
        Some(i + 2)
    } else if fusable(&[&cfg[i], &cfg[i + 1]]) {
        Some(i + 1)
    } else {
        None
    }
}

/// The flat range from the first tensor of layer `first` to the end of the last of `last`.
fn params_of(spans: &[ParamSpan], first: usize, last: usize) -> Option<Range<usize>> {
    let mut chain = spans.iter().filter(|s| (first..=last).contains(&s.layer));
    let first_span = chain.next()?;
    let end = chain.next_back().unwrap_or(first_span).range().end;
    Some(first_span.offset..end)
}

/// The slot of every layer of `graph` (built from `cfg`) with parameters laid out as `spans`.
pub fn plan(cfg: &[LayerConfig], graph: &Net, spans: &[ParamSpan]) -> Vec<Slot> {
    let mut consumers = vec![0usize; graph.blob_count()];
    for i in 0..graph.len() {
        for &b in graph.node(i).bottoms {
            consumers[b] += 1;
        }
    }
    let mut slots = vec![Slot::Own; cfg.len()];
    let mut i = 0;
    while i < cfg.len() {
        let chain = chain_at(cfg, graph, &consumers, i)
            .and_then(|last| Some((last, params_of(spans, i, i + 1)?)));
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

/// The fused layer of the chain at `head`, for the bottom shape `bottom`.
pub fn build(
    gpu: &Gpu,
    cfg: &[LayerConfig],
    spans: &[ParamSpan],
    head: usize,
    last: usize,
    bottom: &[usize],
) -> Result<Box<dyn GpuLayer>> {
    let chain: Vec<&LayerConfig> = cfg[head..=last].iter().collect();
    let bn = params_of(spans, head, head).expect("a BatchNorm has state tensors");
    let scale = params_of(spans, head + 1, head + 1).expect("a one-bottom Scale has a factor");
    let mut layer = GpuBnScaleRelu::new(gpu, &chain, scale.start - bn.start)?;
    layer.reshape(gpu, &[bottom])?;
    Ok(Box::new(layer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{load_str, Config};
    use std::path::Path;

    const CNN: &str = include_str!("../../../tests/configs/cnn_bn_dropout.toml");
    const RELU1: &str =
        "[[layer]]\nname = \"relu1\"\ntype = \"relu\"\nbottom = [\"conv1\"]\ntop = [\"conv1\"]\n";

    fn slots_of(text: &str) -> (Vec<Slot>, Vec<ParamSpan>) {
        let cfg: Config = load_str("t.toml", text, Path::new("."), &[]).unwrap().0;
        let (graph, layout) = Net::build(&cfg, [1, 8, 8], 1).unwrap();
        (plan(&cfg.layers, &graph, &layout.spans), layout.spans)
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
        assert!(slots
            .iter()
            .enumerate()
            .all(|(i, s)| (1..4).contains(&i) || *s == Slot::Own));
        let cfg: Config = load_str("t.toml", CNN, Path::new("."), &[]).unwrap().0;
        let (graph, _) = Net::build(&cfg, [1, 8, 8], 1).unwrap();
        let idle = idle_blobs(&graph, &slots);
        let bn_and_scale_tops = [graph.node(1).tops[0], graph.node(2).tops[0]];
        for (b, &is_idle) in idle.iter().enumerate() {
            assert_eq!(is_idle, bn_and_scale_tops.contains(&b), "blob {b}");
        }
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
        assert!(slots.iter().all(|s| *s == Slot::Own), "{slots:?}");
    }
}
