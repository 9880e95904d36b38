//! Test helpers shared by the layer tests: the context of a step and one forward pass at
//! training settings.

use crate::backend::Cpu;
use crate::config::Phase;
use crate::layers::gradient_check::train_ctx;
use crate::layers::{Ctx, Layer};
use crate::tensor::Blob;

/// Reshapes `layer` for `bottoms`, runs a training forward pass with `params`, and returns the
/// tops (their data pre-filled with NaN, so that an element the layer forgets to write shows).
pub fn forward(layer: &mut dyn Layer, bottoms: &[Blob], params: &[&[f32]]) -> Vec<Blob> {
    forward_in(Phase::Train, layer, bottoms, params)
}

/// [`forward`] in `phase`.
pub fn forward_in(
    phase: Phase,
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
    let cpu = Cpu::new(1);
    layer.forward(&ctx(&cpu, phase), bottoms, params, &mut tops);
    tops
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
