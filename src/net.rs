//! `Net`: the layer graph of one replica. Builds the layers of a config in order, wires their
//! blobs by name (a top that reuses a name, as in Caffe's in-place layers, becomes a new blob
//! that later bottoms of that name read), lays out the learnable tensors in one `Params`, and runs
//! forward and backward for a phase.
//!
//! Inputs: the blobs `data` (N, C, H, W) and `label` (N), filled by the caller. An `input`
//! layer (Caffe's Input, in deploy nets) names no bottoms: it is wired to `data` (and `label`,
//! for a second top) and hands them on under its tops' names.

use crate::config::{Config, LayerConfig, LayerParams, Phase};
use crate::error::{Error, Result};
use crate::layers::{self, filler, BackwardPass, Ctx, ForwardPass, Layer};
use crate::params::{ParamSpan, Params};
use crate::precision::Half;
use crate::tensor::Blob;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

/// Where in training a forward/backward pass happens (topology-invariant randomness keys).
#[derive(Debug, Clone, Copy)]
pub struct PassCtx {
    pub phase: Phase,
    pub iter: u64,
    /// Stream position (train) or test-set index of the replica's first record in the batch.
    pub first_sample: u64,
}

/// Called with (layer index, start, end) after each layer of a traced pass.
pub type LayerClock<'a> = dyn FnMut(usize, Instant, Instant) + 'a;

/// Index of the `data` input blob.
pub const DATA: usize = 0;
/// Index of the `label` input blob.
pub const LABEL: usize = 1;

struct Node {
    name: String,
    /// The layer's resolved parameters (GPU nets build their layers from them too).
    params: LayerParams,
    layer: Box<dyn Layer>,
    phase: Option<Phase>,
    bottoms: Vec<usize>,
    tops: Vec<usize>,
    /// Per bottom: whether a gradient must flow into it.
    propagate_down: Vec<bool>,
    /// Whether backward runs for this layer at all.
    needs_backward: bool,
    /// Weight of each top in the objective (non-zero for loss layers).
    loss_weight: f32,
}

impl Node {
    fn runs_in(&self, phase: Phase) -> bool {
        self.phase.is_none_or(|p| p == phase)
    }
}

/// A read-only view of one layer of the graph, for executors of other backends (the GPU net
/// takes its wiring and shapes from here and runs its own kernels).
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub name: &'a str,
    /// The layer's resolved parameters.
    pub params: &'a LayerParams,
    pub phase: Option<Phase>,
    /// Blob indices; blob 0 is `data`, blob 1 is `label`.
    pub bottoms: &'a [usize],
    pub tops: &'a [usize],
    pub propagate_down: &'a [bool],
    pub needs_backward: bool,
    pub loss_weight: f32,
    pub is_loss: bool,
    pub has_backward: bool,
    /// Whether its tops are reported after a forward pass (`Layer::reports_output`).
    pub reports_output: bool,
}

impl NodeView<'_> {
    /// Whether the layer runs in `phase`.
    pub fn runs_in(&self, phase: Phase) -> bool {
        self.phase.is_none_or(|p| p == phase)
    }
}

/// A scalar the net reports after a forward pass: loss and accuracy tops.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The top's blob name.
    pub name: String,
    pub value: f32,
    /// Whether it comes from a loss layer.
    pub is_loss: bool,
    /// The layer's `loss_weight`: the output's share of the objective is `value × loss_weight`.
    pub loss_weight: f32,
}

/// The objective of a pass: Σ loss_weight × value over the loss outputs (Caffe's total loss).
pub fn weighted_loss(outputs: &[Output]) -> f64 {
    outputs
        .iter()
        .filter(|o| o.is_loss)
        .map(|o| o.value as f64 * o.loss_weight as f64)
        .sum()
}

/// The layer graph of one replica.
pub struct Net {
    nodes: Vec<Node>,
    blobs: Vec<Blob>,
    blob_names: Vec<String>,
    /// Per blob: whether some layer needs its gradient.
    blob_needs_grad: Vec<bool>,
    record_shape: [usize; 3],
    batch: usize,
    /// The current layer's bottoms and tops, moved out of `blobs` (allocations reused).
    scratch_bottoms: Vec<Blob>,
    scratch_tops: Vec<Blob>,
    /// Mixed precision (`cluster.math = "bf16" | "fp16"`): the type activations, their
    /// gradients and the weights the layers see are rounded to (`crate::precision`).
    half: Option<Half>,
    /// With `half`: the weights rounded to it, laid out as `Params::data`, made at each
    /// forward pass (stateful layers' tensors copied unrounded).
    half_params: Vec<f32>,
    /// With `half`: what a convolution's weight gradient held before its backward, set aside
    /// while the backward writes its own contribution (`set_aside`).
    grad_aside: Vec<f32>,
    /// The factor loss tops' gradients are seeded with besides their loss weight (loss
    /// scaling; 1 without).
    loss_scale: f32,
}

impl Net {
    /// Builds the net of `cfg` for records of `record_shape` (C, H, W) and a batch of `batch`,
    /// and returns it with the layout of its learnable tensors (not yet filled).
    pub fn build(cfg: &Config, record_shape: [usize; 3], batch: usize) -> Result<(Net, Params)> {
        let mut net = Net {
            nodes: Vec::new(),
            blobs: vec![Blob::default(), Blob::default()],
            blob_names: vec!["data".into(), "label".into()],
            blob_needs_grad: vec![false, false],
            record_shape,
            batch,
            scratch_bottoms: Vec::new(),
            scratch_tops: Vec::new(),
            half: Half::of(cfg.cluster.math),
            half_params: Vec::new(),
            grad_aside: Vec::new(),
            loss_scale: 1.0,
        };
        let mut latest: HashMap<String, usize> =
            HashMap::from([("data".to_string(), DATA), ("label".to_string(), LABEL)]);
        for lc in &cfg.layers {
            net.add_node(lc, &mut latest)?;
        }
        net.reshape_all(batch)?;
        net.mark_backward();
        let mut spans = Vec::new();
        for (i, (node, lc)) in net.nodes.iter().zip(&cfg.layers).enumerate() {
            // State tensors (BatchNorm's running statistics) are never learned or decayed.
            let fixed = node.layer.has_state();
            for (j, spec) in node.layer.param_specs().into_iter().enumerate() {
                let mult = |v: &Option<Vec<f32>>| {
                    if fixed {
                        Some(0.0)
                    } else {
                        v.as_ref().and_then(|m| m.get(j)).copied()
                    }
                };
                spans.push(ParamSpan {
                    layer: i,
                    full_name: format!("{}.{}", node.name, spec.name),
                    len: 0,
                    offset: 0,
                    shape: spec.shape,
                    lr_mult: mult(&lc.lr_mult).unwrap_or(1.0),
                    decay_mult: mult(&lc.decay_mult).unwrap_or(1.0),
                    filler: spec.filler,
                });
            }
        }
        Ok((net, Params::new(spans)))
    }

    fn add_node(&mut self, lc: &LayerConfig, latest: &mut HashMap<String, usize>) -> Result<()> {
        let params = lc.params()?;
        let layer = layers::build(&lc.name, &params);
        let mut bottoms = Vec::new();
        match &params {
            LayerParams::Input(_) if !lc.bottom.is_empty() => {
                return Err(Error::net(
                    &lc.name,
                    "an input layer takes no bottom (it reads `data` and `label`)",
                ))
            }
            LayerParams::Input(_) => bottoms.extend([DATA, LABEL].iter().take(lc.top.len())),
            _ => {}
        }
        for b in &lc.bottom {
            let idx = *latest.get(b).ok_or_else(|| {
                Error::net(
                    &lc.name,
                    format!("bottom `{b}` is produced by no earlier layer"),
                )
            })?;
            if bottoms.contains(&idx) {
                return Err(Error::net(&lc.name, format!("reads blob `{b}` twice")));
            }
            bottoms.push(idx);
        }
        let mut tops = Vec::new();
        for t in &lc.top {
            self.blobs.push(Blob::default());
            self.blob_names.push(t.clone());
            self.blob_needs_grad.push(false);
            tops.push(self.blobs.len() - 1);
        }
        for (t, &idx) in lc.top.iter().zip(&tops) {
            latest.insert(t.clone(), idx);
        }
        let loss_weight = lc
            .loss_weight
            .unwrap_or(if layer.is_loss() { 1.0 } else { 0.0 });
        self.nodes.push(Node {
            name: lc.name.clone(),
            params,
            layer,
            phase: lc.phase,
            propagate_down: vec![false; bottoms.len()],
            bottoms,
            tops,
            needs_backward: false,
            loss_weight,
        });
        Ok(())
    }

    /// Decides which layers run backward and which bottoms get gradients: a layer needs
    /// backward if it has a backward pass and learnable tensors or a bottom that needs a gradient.
    fn mark_backward(&mut self) {
        for node in &mut self.nodes {
            let has_backward = node.layer.has_backward();
            node.propagate_down = node
                .bottoms
                .iter()
                .map(|&b| has_backward && self.blob_needs_grad[b])
                .collect();
            let has_params = !node.layer.param_specs().is_empty();
            node.needs_backward =
                has_backward && (has_params || node.propagate_down.iter().any(|&p| p));
            for &t in &node.tops {
                self.blob_needs_grad[t] = node.needs_backward;
            }
        }
    }

    /// Reshapes every blob for a batch of `batch` records.
    fn reshape_all(&mut self, batch: usize) -> Result<()> {
        let [c, h, w] = self.record_shape;
        self.blobs[DATA].reshape(&[batch, c, h, w]);
        self.blobs[LABEL].reshape(&[batch]);
        for node in &mut self.nodes {
            let shapes: Vec<&[usize]> = node
                .bottoms
                .iter()
                .map(|&b| &self.blobs[b].shape[..])
                .collect();
            let tops = node.layer.reshape(&shapes)?;
            if tops.len() != node.tops.len() {
                return Err(Error::net(
                    &node.name,
                    format!(
                        "produces {} tops, config names {}",
                        tops.len(),
                        node.tops.len()
                    ),
                ));
            }
            for (&t, shape) in node.tops.iter().zip(&tops) {
                self.blobs[t].reshape(shape);
            }
        }
        self.batch = batch;
        Ok(())
    }

    /// Sets the batch size (the test pass's last batch may be smaller).
    pub fn set_batch(&mut self, batch: usize) -> Result<()> {
        if batch != self.batch {
            self.reshape_all(batch)?;
        }
        Ok(())
    }

    /// Current batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The input blobs to fill: `data` (N, C, H, W) and `label` (N).
    pub fn inputs_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        let (a, b) = self.blobs.split_at_mut(LABEL);
        (&mut a[DATA].data, &mut b[0].data)
    }

    /// Fills every learnable tensor from its filler, each from its own generator keyed by
    /// (seed, tensor index), so every replica of every topology starts from the same weights.
    pub fn init_params(params: &mut Params, seed: u64) {
        for (i, span) in params.spans.iter().enumerate() {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(i as u64 + 1);
            filler::fill(
                &span.filler,
                &span.shape,
                &mut rng,
                &mut params.data[span.range()],
            );
        }
    }

    /// Runs the layers of `phase` forward and returns the loss and accuracy outputs. In mixed
    /// precision the input, the weights the layers see and every top but the reported outputs
    /// are rounded to the half type (`crate::precision`).
    pub fn forward(&mut self, ctx: &Ctx, params: &mut Params) -> Vec<Output> {
        self.forward_traced(ctx, params, None)
    }

    /// `forward`, calling `on_layer(i, start, end)` after layer `i` ran (timelines).
    pub fn forward_traced(
        &mut self,
        ctx: &Ctx,
        params: &mut Params,
        mut on_layer: Option<&mut LayerClock>,
    ) -> Vec<Output> {
        let mut outputs = Vec::new();
        if let Some(half) = self.half {
            self.round_inputs_and_weights(half, params);
        }
        for i in 0..self.nodes.len() {
            if !self.nodes[i].runs_in(ctx.phase) {
                continue;
            }
            let start = on_layer.is_some().then(Instant::now);
            let (data, _) = match self.half {
                None => params.layer_views(i),
                Some(_) => params.layer_views_in(i, &self.half_params),
            };
            let node = &mut self.nodes[i];
            let (bottoms, tops) = (&mut self.scratch_bottoms, &mut self.scratch_tops);
            take_blobs(&mut self.blobs, &node.bottoms, bottoms);
            take_blobs(&mut self.blobs, &node.tops, tops);
            node.layer.forward(ForwardPass {
                ctx,
                bottoms,
                params: &data,
                tops,
            });
            if let Some(half) = self.half {
                if !node.layer.is_loss() && !node.layer.reports_output() {
                    tops.iter_mut().for_each(|t| half.round_slice(&mut t.data));
                }
            }
            if node.layer.has_state() {
                node.layer.update_state(ctx, &mut params.layer_data_mut(i));
            }
            if node.layer.reports_output() {
                for (t, &ti) in tops.iter().zip(&node.tops) {
                    outputs.push(Output {
                        name: self.blob_names[ti].clone(),
                        value: t.data[0],
                        is_loss: node.layer.is_loss(),
                        loss_weight: node.loss_weight,
                    });
                }
            }
            restore_blobs(&mut self.blobs, &node.bottoms, bottoms);
            restore_blobs(&mut self.blobs, &node.tops, tops);
            if let (Some(f), Some(start)) = (on_layer.as_mut(), start) {
                f(i, start, Instant::now());
            }
        }
        outputs
    }

    /// Runs backward through the layers of `phase` in reverse order, accumulating into
    /// `params.diff`. Activation diffs are zeroed first; loss tops get their loss weight (times
    /// the loss scale, see [`Net::set_loss_scale`]). In mixed precision each bottom gradient is
    /// rounded to the half type after its layer's backward added to it, and a convolution's
    /// weight gradient of this pass is rounded before it is added (`rounded_weight_grad`).
    /// `on_layer_done(i)` is called after layer `i`'s parameter gradients are complete.
    pub fn backward(
        &mut self,
        ctx: &Ctx,
        params: &mut Params,
        on_layer_done: &mut dyn FnMut(usize),
    ) {
        self.backward_traced(ctx, params, on_layer_done, None)
    }

    /// `backward`, calling `on_layer(i, start, end)` after layer `i`'s backward (timelines).
    pub fn backward_traced(
        &mut self,
        ctx: &Ctx,
        params: &mut Params,
        on_layer_done: &mut dyn FnMut(usize),
        mut on_layer: Option<&mut LayerClock>,
    ) {
        for (b, needs) in self.blobs.iter_mut().zip(&self.blob_needs_grad) {
            if *needs {
                b.diff.fill(0.0);
            }
        }
        for node in &self.nodes {
            if node.runs_in(ctx.phase) && node.loss_weight != 0.0 {
                for &t in &node.tops {
                    self.blobs[t].diff.fill(node.loss_weight * self.loss_scale);
                }
            }
        }
        for i in (0..self.nodes.len()).rev() {
            let node = &mut self.nodes[i];
            if !node.runs_in(ctx.phase) || !node.needs_backward {
                continue;
            }
            let start = on_layer.is_some().then(Instant::now);
            let rounded_grad = self.half.and_then(|half| {
                rounded_weight_grad(node.layer.as_ref(), i, params).map(|r| (half, r))
            });
            if let Some((_, range)) = &rounded_grad {
                set_aside(&mut params.diff[range.clone()], &mut self.grad_aside);
            }
            let (data, mut diffs) = match self.half {
                None => params.layer_views(i),
                Some(_) => params.layer_views_in(i, &self.half_params),
            };
            let (bottoms, tops) = (&mut self.scratch_bottoms, &mut self.scratch_tops);
            take_blobs(&mut self.blobs, &node.bottoms, bottoms);
            take_blobs(&mut self.blobs, &node.tops, tops);
            node.layer.backward(BackwardPass {
                ctx,
                tops,
                propagate_down: &node.propagate_down,
                bottoms,
                params: &data,
                param_diffs: &mut diffs,
            });
            if let Some((half, range)) = rounded_grad {
                round_and_add_back(half, &mut params.diff[range], &self.grad_aside);
            }
            if let Some(half) = self.half {
                for (b, _) in bottoms
                    .iter_mut()
                    .zip(&node.propagate_down)
                    .filter(|p| *p.1)
                {
                    half.round_slice(&mut b.diff);
                }
            }
            restore_blobs(&mut self.blobs, &node.bottoms, bottoms);
            restore_blobs(&mut self.blobs, &node.tops, tops);
            if let (Some(f), Some(start)) = (on_layer.as_mut(), start) {
                f(i, start, Instant::now());
            }
            on_layer_done(i);
        }
    }

    /// Mixed precision's rounding before a forward pass: the input `data` (normalised by the
    /// reader) and the half copy of the weights, every tensor but those of stateful layers
    /// (BatchNorm's running statistics stay FP32, as cuDNN takes them).
    fn round_inputs_and_weights(&mut self, half: Half, params: &Params) {
        half.round_slice(&mut self.blobs[DATA].data);
        self.half_params.clear();
        self.half_params.extend_from_slice(&params.data);
        for s in &params.spans {
            if !self.nodes[s.layer].layer.has_state() {
                half.round_slice(&mut self.half_params[s.range()]);
            }
        }
    }

    /// The half type activations are rounded to (`cluster.math`), `None` in FP32 and TF32.
    pub fn half(&self) -> Option<Half> {
        self.half
    }

    /// Seeds the next backward passes' loss gradients with `scale` × the loss weight (loss
    /// scaling; the parameter gradients come out `scale` times too large).
    pub fn set_loss_scale(&mut self, scale: f32) {
        self.loss_scale = scale;
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Name of layer `i`.
    pub fn layer_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The wiring of layer `i` (layer `i` is `[[layer]]` number `i` of the config).
    pub fn node(&self, i: usize) -> NodeView<'_> {
        let n = &self.nodes[i];
        NodeView {
            name: &n.name,
            params: &n.params,
            phase: n.phase,
            bottoms: &n.bottoms,
            tops: &n.tops,
            propagate_down: &n.propagate_down,
            needs_backward: n.needs_backward,
            loss_weight: n.loss_weight,
            is_loss: n.layer.is_loss(),
            has_backward: n.layer.has_backward(),
            reports_output: n.layer.reports_output(),
        }
    }

    /// Number of blobs (inputs included).
    pub fn blob_count(&self) -> usize {
        self.blobs.len()
    }

    /// Current shape of blob `b`.
    pub fn blob_shape(&self, b: usize) -> &[usize] {
        &self.blobs[b].shape
    }

    /// The index of the blob called `name` as the last layer that writes it leaves it (the
    /// input blobs are `data` and `label`).
    pub fn blob_named(&self, name: &str) -> Option<usize> {
        self.blob_names.iter().rposition(|n| n == name)
    }

    /// Blob `b`'s values after the last forward, `(N, ...)` in [`Net::blob_shape`].
    pub fn blob_data(&self, b: usize) -> &[f32] {
        &self.blobs[b].data
    }

    /// Whether some layer needs blob `b`'s gradient.
    pub fn blob_needs_grad(&self, b: usize) -> bool {
        self.blob_needs_grad[b]
    }
}

/// Mixed precision: the flat range of the parameter gradient of layer `layer` (built as `kind`)
/// whose every backward contribution is rounded to the half type before it is added: a
/// convolution's `weight` (its first tensor), since cuDNN's weight gradient of half-type tensors
/// comes out in the half type. `None` for every other layer and for biases.
fn rounded_weight_grad(kind: &dyn Layer, layer: usize, params: &Params) -> Option<Range<usize>> {
    if kind.type_name() != "convolution" {
        return None;
    }
    let weight = params.spans.get(params.layer_spans(layer).start)?;
    (weight.layer == layer).then(|| weight.range())
}

/// Before a backward whose contribution to `grad` is rounded: moves what `grad` holds into
/// `aside` and zeroes it, so that the backward writes its contribution alone.
fn set_aside(grad: &mut [f32], aside: &mut Vec<f32>) {
    aside.clear();
    aside.extend_from_slice(grad);
    grad.fill(0.0);
}

/// After it: rounds the contribution in `grad` to `half` (it was accumulated in FP32) and adds
/// what [`set_aside`] kept, in FP32.
fn round_and_add_back(half: Half, grad: &mut [f32], aside: &[f32]) {
    half.round_slice(grad);
    grad.iter_mut().zip(aside).for_each(|(g, a)| *g += a);
}

/// Moves the blobs `idx` out of `blobs` into `into` (kept allocated between layers), so that a
/// layer can read its bottoms while writing its tops. A layer never names a blob twice (`build`
/// rejects it), so every taken blob is a real one.
fn take_blobs(blobs: &mut [Blob], idx: &[usize], into: &mut Vec<Blob>) {
    into.clear();
    into.extend(idx.iter().map(|&i| std::mem::take(&mut blobs[i])));
}

/// Puts the blobs `take_blobs` moved out back in place.
fn restore_blobs(blobs: &mut [Blob], idx: &[usize], from: &mut Vec<Blob>) {
    for (&i, b) in idx.iter().zip(from.drain(..)) {
        blobs[i] = b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::test_util::net_around;
    use crate::validate::load_str;
    use std::path::Path;

    #[test]
    fn a_layer_reading_one_blob_twice_is_rejected() {
        let (mut cfg, _) = load_str("t.toml", &net_around(""), Path::new("."), &[]).unwrap();
        Net::build(&cfg, [1, 8, 8], 4).expect("the valid net builds");
        cfg.layers[1].bottom = vec!["ip".into(), "ip".into()];
        let err = Net::build(&cfg, [1, 8, 8], 4).err().expect("an error");
        assert!(err.to_string().contains("reads blob `ip` twice"), "{err}");
        assert_eq!(err.exit_code(), 2);
    }

    /// The train-phase context of the tests' passes.
    fn train_ctx(cpu: &crate::backend::Cpu) -> Ctx<'_> {
        Ctx {
            cpu,
            phase: Phase::Train,
            iter: 0,
            seed: 3,
            first_sample: 0,
            reducer: None,
        }
    }

    /// Fills the inputs of a batch of 4: `offset + (i mod 7) / 7` and the labels 0, 3, 5, 9.
    fn fill_inputs(net: &mut Net, offset: f32) {
        let (d, l) = net.inputs_mut();
        d.iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = offset + (i % 7) as f32 / 7.0);
        l.copy_from_slice(&[0.0, 3.0, 5.0, 9.0]);
    }

    /// Mixed precision's rounding points: after a forward pass every blob but the loss holds
    /// values of the half type, after backward every activation gradient does, while the
    /// parameter gradients of layers other than convolutions (here an inner product: FP32 sums
    /// of half products) and the master weights do not.
    #[test]
    fn half_math_rounds_activations_and_their_gradients_but_not_parameter_gradients() {
        use crate::layers::test_util::layer_table;
        let act = layer_table("act", "tanh", &["ip"], &["ip"], "");
        let (mut cfg, _) = load_str("t.toml", &net_around(&act), Path::new("."), &[]).unwrap();
        for (math, half) in [
            (crate::config::MathMode::Bf16, Half::Bf16),
            (crate::config::MathMode::Fp16, Half::Fp16),
        ] {
            cfg.cluster.math = math;
            let (mut net, mut params) = Net::build(&cfg, [1, 8, 8], 4).unwrap();
            assert_eq!(net.half(), Some(half));
            Net::init_params(&mut params, 3);
            let master = params.data.clone();
            let cpu = crate::backend::Cpu::new(1);
            let ctx = train_ctx(&cpu);
            fill_inputs(&mut net, 0.1);
            let out = net.forward(&ctx, &mut params);
            assert!(out[0].value.is_finite());
            net.backward(&ctx, &mut params, &mut |_| {});
            let loss = net.blob_named("loss").unwrap();
            let holds = |v: &[f32]| v.iter().all(|&x| half.holds(x));
            for b in 0..net.blob_count() {
                if b != loss && b != LABEL {
                    assert!(holds(net.blob_data(b)), "{half:?}: blob {b}'s data");
                }
                if net.blob_needs_grad(b) {
                    let diff = &net.blobs[b].diff;
                    assert!(
                        diff.iter().any(|&g| g != 0.0) && holds(diff),
                        "{half:?}: {b}"
                    );
                }
            }
            assert_eq!(params.data, master, "the master weights are not rounded");
            assert!(!holds(&params.data), "{half:?}: the filler's weights");
            assert!(
                !holds(&params.diff),
                "{half:?}: the inner product's parameter gradients in FP32"
            );
        }
    }

    /// In mixed precision a convolution's weight gradient is rounded to the half type once per
    /// backward, before it is added in FP32 to what the gradient held; its bias gradient and
    /// the other layers' parameter gradients are not rounded.
    #[test]
    fn half_math_rounds_each_backwards_convolution_weight_gradient_before_adding_it() {
        use crate::layers::test_util::layer_table;
        let conv = layer_table(
            "conv",
            "convolution",
            &["data"],
            &["conv"],
            "num_output = 4\nkernel_size = 3\nweight_filler = { type = \"msra\" }",
        );
        let ip = layer_table("ip", "inner_product", &["conv"], &["ip"], "num_output = 10");
        let loss = layer_table("loss", "softmax_with_loss", &["ip", "label"], &["loss"], "");
        let toml = format!(
            "data = {{ format = \"digits\", batch_size = 4 }}\n\
             solver = {{ base_lr = 0.1, max_iter = 1 }}\n{conv}{ip}{loss}"
        );
        let (mut cfg, _) = load_str("t.toml", &toml, Path::new("."), &[]).unwrap();
        for (math, half) in [
            (crate::config::MathMode::Bf16, Half::Bf16),
            (crate::config::MathMode::Fp16, Half::Fp16),
        ] {
            cfg.cluster.math = math;
            let (mut net, mut params) = Net::build(&cfg, [1, 8, 8], 4).unwrap();
            Net::init_params(&mut params, 3);
            let range = |name: &str| params.find(name).unwrap().range();
            let (weight, bias, ip) = (range("conv.weight"), range("conv.bias"), range("ip.weight"));
            let cpu = crate::backend::Cpu::new(1);
            let ctx = train_ctx(&cpu);
            // One backward on `offset`'s inputs, accumulating onto what the gradient holds.
            let pass = |net: &mut Net, params: &mut Params, offset: f32| {
                fill_inputs(net, offset);
                net.forward(&ctx, params);
                net.backward(&ctx, params, &mut |_| {});
            };
            let holds = |v: &[f32]| v.iter().all(|&x| half.holds(x));
            let mut contributions = Vec::new();
            for offset in [0.1, 0.3] {
                params.diff.fill(0.0);
                pass(&mut net, &mut params, offset);
                let g = &params.diff;
                assert!(g[weight.clone()].iter().any(|&x| x != 0.0), "{half:?}");
                assert!(holds(&g[weight.clone()]), "{half:?}: the weight gradient");
                assert!(
                    !holds(&g[bias.clone()]),
                    "{half:?}: the bias gradient in FP32"
                );
                assert!(
                    !holds(&g[ip.clone()]),
                    "{half:?}: the inner product's in FP32"
                );
                contributions.push(g[weight.clone()].to_vec());
            }
            // Two backwards without a zero between: the FP32 sum of the rounded contributions.
            params.diff.fill(0.0);
            pass(&mut net, &mut params, 0.1);
            pass(&mut net, &mut params, 0.3);
            let sum: Vec<f32> = contributions[0]
                .iter()
                .zip(&contributions[1])
                .map(|(a, b)| a + b)
                .collect();
            assert_eq!(params.diff[weight.clone()], sum[..], "{half:?}");
            assert!(!holds(&sum), "{half:?}: the sum is not rounded again");
        }
    }

    #[test]
    fn forward_and_backward_run_repeatedly_with_the_same_results() {
        let (cfg, _) = load_str("t.toml", &net_around(""), Path::new("."), &[]).unwrap();
        let (mut net, mut params) = Net::build(&cfg, [1, 8, 8], 4).unwrap();
        Net::init_params(&mut params, 3);
        let cpu = crate::backend::Cpu::new(1);
        let ctx = train_ctx(&cpu);
        fill_inputs(&mut net, 0.0);
        let mut runs = Vec::new();
        for _ in 0..2 {
            params.diff.fill(0.0);
            let out = net.forward(&ctx, &mut params);
            net.backward(&ctx, &mut params, &mut |_| {});
            runs.push((out[0].value, params.diff.clone()));
        }
        assert!(runs[0].0.is_finite() && runs[0].0 > 0.0);
        assert!(runs[0].1.iter().any(|&g| g != 0.0));
        assert_eq!(runs[0], runs[1]);
    }
}
