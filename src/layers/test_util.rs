//! Test helpers shared by the layer tests: one forward pass at training settings.

use crate::backend::Cpu;
use crate::config::Phase;
use crate::layers::{Ctx, Layer};
use crate::tensor::Blob;

/// Reshapes `layer` for `bottoms`, runs forward with `params`, and returns the tops (their data
/// pre-filled with NaN, so that an element the layer forgets to write shows).
pub fn forward(layer: &mut dyn Layer, bottoms: &[Blob], params: &[&[f32]]) -> Vec<Blob> {
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
    let ctx = Ctx {
        cpu: &cpu,
        phase: Phase::Train,
        iter: 0,
        seed: 1,
        first_sample: 0,
        reducer: None,
    };
    layer.forward(&ctx, bottoms, params, &mut tops);
    tops
}

/// A blob of `shape` holding `data`.
pub fn blob(shape: &[usize], data: &[f32]) -> Blob {
    let mut b = Blob::new(shape);
    b.data.copy_from_slice(data);
    b
}
