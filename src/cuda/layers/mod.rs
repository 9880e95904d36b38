//! The GPU layers: the [`GpuLayer`] trait and one file per layer, each the device twin of the CPU
//! layer of the same name in `crate::layers`, which stays the reference semantics (the tests of
//! each file compare the two on random inputs).
//!
//! Conventions, as on the CPU:
//! - Blobs are row-major `(N, ...)`; a layer reads and writes the blobs the net names by index in
//!   one slice of [`GpuBlob`]s, so that a layer borrows its bottoms and tops disjointly without
//!   collecting references (all indices of one layer are distinct; the net checks this).
//! - `backward` accumulates into the parameter gradient and into the bottoms' diffs, unless told
//!   [`Grad::Overwrite`]: the net says so for a bottom when the layer is the only one to
//!   contribute to that blob's gradient, and for the parameters on the first backward of an
//!   iteration, which saves zero-filling the buffers first (the result is the same).
//! - A layer sees its learnable tensors as one view of its contiguous range of the flat buffers,
//!   in the order of the CPU layer's `param_specs()`.
//! - Everything is enqueued on [`Gpu::compute`]; nothing synchronises.

pub mod accuracy;
pub mod inner_product;
pub mod relu;
pub mod sigmoid;
pub mod softmax_with_loss;
pub mod tanh;

use super::blob::GpuBlob;
use super::Gpu;
use crate::config::{LayerConfig, LayerKind};
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// What a layer's backward does to one gradient buffer (a bottom's diff, or its parameters').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grad {
    /// No gradient flows into this bottom.
    Skip,
    /// `diff += gradient` (the layer contract).
    Accumulate,
    /// `diff = gradient`: this layer is the buffer's only contributor.
    Overwrite,
}

impl Grad {
    /// Whether a gradient is computed at all.
    pub fn wanted(self) -> bool {
        self != Grad::Skip
    }

    /// Whether it is added to the old diff.
    pub fn accumulate(self) -> bool {
        self == Grad::Accumulate
    }

    /// `beta` of a GEMM that writes this gradient: 1 to accumulate, 0 to overwrite.
    pub fn beta(self) -> f32 {
        if self.accumulate() {
            1.0
        } else {
            0.0
        }
    }
}

/// A differentiable operation on device blobs.
pub trait GpuLayer: Send {
    /// The config name of the layer type, e.g. `inner_product`.
    fn type_name(&self) -> &'static str;

    /// Takes the bottom shapes of a new batch (called at build and whenever the batch changes;
    /// the CPU layer has already checked them) and grows scratch buffers when needed.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()>;

    /// Computes the tops `blobs[tops[..]]` (already shaped) from the bottoms `blobs[bottoms[..]]`
    /// and the layer's learnable tensors `params`.
    fn forward(
        &mut self,
        gpu: &Gpu,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        params: &CudaView<'_, f32>,
    ) -> Result<()>;

    /// From the tops' diffs, writes the bottoms' diffs as `grads[i]` says and the layer's range
    /// of the flat gradient `param_diff` as `param_grad` says (`Accumulate` or `Overwrite`).
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        gpu: &Gpu,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        grads: &[Grad],
        params: &CudaView<'_, f32>,
        param_grad: Grad,
        param_diff: &mut CudaViewMut<'_, f32>,
    ) -> Result<()>;
}

/// Builds the GPU layer a validated `[[layer]]` table describes, for the given bottom shapes.
pub fn build(gpu: &Gpu, cfg: &LayerConfig, bottoms: &[&[usize]]) -> Result<Box<dyn GpuLayer>> {
    let mut layer: Box<dyn GpuLayer> = match cfg.kind {
        LayerKind::InnerProduct => Box::new(inner_product::GpuInnerProduct::new(gpu, cfg)?),
        LayerKind::Relu => Box::new(relu::GpuRelu::new(cfg)),
        LayerKind::Sigmoid => Box::new(sigmoid::GpuSigmoid),
        LayerKind::Tanh => Box::new(tanh::GpuTanH),
        LayerKind::SoftmaxWithLoss => {
            Box::new(softmax_with_loss::GpuSoftmaxWithLoss::new(gpu, cfg)?)
        }
        LayerKind::Accuracy => Box::new(accuracy::GpuAccuracy::new(gpu, cfg)?),
        other => {
            return Err(crate::error::Error::net(
                &cfg.name,
                format!("layer type {other:?} has no GPU implementation yet"),
            ))
        }
    };
    layer.reshape(gpu, bottoms)?;
    Ok(layer)
}

/// `N` distinct blobs by index, mutably.
///
/// # Panics
/// If two indices are equal or one is out of range (the net rules both out when it is built).
pub(crate) fn pick<const N: usize>(blobs: &mut [GpuBlob], idx: [usize; N]) -> [&mut GpuBlob; N] {
    blobs
        .get_disjoint_mut(idx)
        .unwrap_or_else(|e| panic!("layer blobs {idx:?}: {e}"))
}

/// `(rows, classes)` of scores flattened at `axis`, as the CPU classifier layers view them.
pub(crate) fn rows_and_classes(shape: &[usize], axis: usize) -> (usize, usize) {
    let axis = axis.min(shape.len());
    (
        shape[..axis].iter().product(),
        shape[axis..].iter().product(),
    )
}

#[cfg(test)]
pub(crate) mod testing;
