//! Test helpers shared by the layer tests: a layer built from its `[[layer]]` keys, the context
//! of a step, one forward pass at training settings, and the smallest net around a layer.

use crate::backend::Cpu;
use crate::config::layer_params::KindParams;
use crate::config::{LayerConfig, Phase};
use crate::layers::gradient_check::{from_config, layer_config, train_ctx};
use crate::layers::{BackwardPass, BuildCpu, Ctx, ForwardPass, Layer};
use crate::tensor::Blob;

/// The layer of a `[[layer]]` table of type `kind` with the keys `keys` (TOML lines), named
/// after its type: `layer::<ReluParams>("relu", "negative_slope = 0.1")`.
pub fn layer<P: KindParams + BuildCpu>(kind: &str, keys: &str) -> P::Layer {
    named::<P>(kind, kind, keys)
}

/// [`layer`], named `name`.
pub fn named<P: KindParams + BuildCpu>(name: &str, kind: &str, keys: &str) -> P::Layer {
    from_config(|name, p: &P| p.build(name), &table(name, kind, keys))
}

/// The `[[layer]]` table `name` of type `kind` with the keys `keys` (TOML lines).
fn table(name: &str, kind: &str, keys: &str) -> LayerConfig {
    layer_config(&format!("name = \"{name}\"\ntype = \"{kind}\"\n{keys}"))
}

/// The error resolving a `[[layer]]` table of type `kind` with the keys `keys` gives (the
/// layer is named after its type); panics when the table resolves.
pub fn params_error(kind: &str, keys: &str) -> String {
    match table(kind, kind, keys).params() {
        Ok(p) => panic!("{keys:?} resolved to {p:?}"),
        Err(e) => e.to_string(),
    }
}

/// Reshapes `layer` for `bottoms`, runs a training forward pass with `params`, and returns the
/// tops (their data pre-filled with NaN, so that an element the layer forgets to write shows).
pub fn forward(layer: &mut dyn Layer, bottoms: &[Blob], params: &[&[f32]]) -> Vec<Blob> {
    let cpu = Cpu::new(1);
    forward_in(&ctx(&cpu, Phase::Train), layer, bottoms, params)
}

/// [`forward`] in the step `ctx`.
pub fn forward_in(
    ctx: &Ctx,
    layer: &mut dyn Layer,
    bottoms: &[Blob],
    params: &[&[f32]],
) -> Vec<Blob> {
    let shapes: Vec<&[usize]> = bottoms.iter().map(|b| b.shape.as_slice()).collect();
    let mut tops: Vec<Blob> = layer
        .reshape(&shapes)
        .unwrap()
        .iter()
        .map(|s| Blob::new(s))
        .collect();
    for t in &mut tops {
        t.data.fill(f32::NAN);
    }
    layer.forward(ForwardPass {
        ctx,
        bottoms,
        params,
        tops: &mut tops,
    });
    tops
}

/// Runs `layer`'s backward in a training step from the tops' diffs, accumulating into the
/// diffs of `bottoms` (where `propagate_down`) and into `param_diffs`.
pub fn backward(
    layer: &mut dyn Layer,
    tops: &[Blob],
    propagate_down: &[bool],
    bottoms: &mut [Blob],
    params: &[&[f32]],
    param_diffs: &mut [&mut [f32]],
) {
    let cpu = Cpu::new(1);
    // Views that live no longer than this call, as the pass's one lifetime asks.
    let mut diffs: Vec<&mut [f32]> = param_diffs.iter_mut().map(|d| &mut **d).collect();
    layer.backward(BackwardPass {
        ctx: &ctx(&cpu, Phase::Train),
        tops,
        propagate_down,
        bottoms,
        params,
        param_diffs: &mut diffs,
    });
}

/// The context of a step at iteration 0 in `phase`: seed 1, first sample 0, one replica.
pub fn ctx(cpu: &Cpu, phase: Phase) -> Ctx<'_> {
    Ctx {
        phase,
        ..train_ctx(cpu, 1)
    }
}

/// A blob of `shape` holding `data`.
pub fn blob(shape: &[usize], data: &[f32]) -> Blob {
    let mut b = Blob::new(shape);
    b.data.copy_from_slice(data);
    b
}

/// A `[[layer]]` table (TOML): `name` of type `kind` from `bottoms` to `tops`, with the keys
/// `keys` (TOML lines).
pub fn layer_table(name: &str, kind: &str, bottoms: &[&str], tops: &[&str], keys: &str) -> String {
    format!("[[layer]]\nname = {name:?}\ntype = {kind:?}\nbottom = {bottoms:?}\ntop = {tops:?}\n{keys}\n")
}

/// A `[[layer]]` table `name` of type `kind` with the keys `keys` that reads and writes the
/// blob `ip`, for [`net_around`].
pub fn in_place(name: &str, kind: &str, keys: &str) -> String {
    layer_table(name, kind, &["ip"], &["ip"], keys)
}

/// A config of the smallest trainable net around the layers `middle` (`[[layer]]` tables that
/// read and write the blob `ip`): digits in batches of 4, an inner product `ip` of 10 outputs,
/// `middle`, and a softmax loss; one iteration of plain SGD at rate 0.1.
pub fn net_around(middle: &str) -> String {
    let ip = layer_table("ip", "inner_product", &["data"], &["ip"], "num_output = 10");
    let loss = layer_table("loss", "softmax_with_loss", &["ip", "label"], &["loss"], "");
    format!(
        "data = {{ format = \"digits\", batch_size = 4 }}\n\
         solver = {{ base_lr = 0.1, max_iter = 1 }}\n{ip}{middle}{loss}"
    )
}
