//! Mixed precision on the GPU (`cluster.math = "bf16"`): [`HalfRounding`], the rounding points of
//! `crate::precision` applied to a [`GpuNet`](super::GpuNet)'s FP32 blobs, so that the GPU
//! computes the numbers the CPU backend computes (up to summation order):
//!
//! - before each forward pass, the input `data` in place, and the weights the layers see: a copy
//!   of the FP32 master weights rounded to the half type, except the tensors of stateful layers
//!   (BatchNorm's running statistics), copied as they are;
//! - after each layer's forward, its tops, unless it is a loss or a reported layer (accuracy);
//! - after each layer's backward, the diffs of the bottoms it sent a gradient to (after its
//!   contribution was added in FP32).
//!
//! GEMMs and convolutions run on tensor cores with TF32 operands, which hold half-type values
//! exactly ([`MathMode::tf32_tensor_cores`](crate::config::MathMode::tf32_tensor_cores)), so their
//! products are those of half-type operands accumulated in FP32, as the contract says. Fused
//! chains are not formed in half modes: the CPU rounds every member's top.

use crate::cuda::{gpu_error, Gpu};
use crate::error::Result;
use crate::layers::Layer;
use crate::net::Net;
use crate::params::ParamSpan;
use crate::precision::Half;
use cudarc::driver::{CudaSlice, DevicePtrMut};
use std::ops::Range;

/// The rounding of one GPU net; see the module docs.
pub struct HalfRounding {
    half: Half,
    /// `(params)` the weights the layers see in the passes since the last
    /// [`HalfRounding::round_weights`].
    pub weights: CudaSlice<f32>,
    /// The flat parameters in contiguous runs, each rounded (`true`) or copied.
    runs: Vec<(Range<usize>, bool)>,
    /// Per layer, whether its tops are rounded after its forward.
    pub rounds_tops: Vec<bool>,
}

impl HalfRounding {
    /// The rounding to `half` of the net `graph` (its CPU `layers`) with the learnable tensors
    /// `spans` (laid out, in order) of `len` floats.
    pub fn new(
        gpu: &Gpu,
        half: Half,
        graph: &Net,
        layers: &[Box<dyn Layer>],
        spans: &[ParamSpan],
        len: usize,
    ) -> Result<HalfRounding> {
        let mut runs: Vec<(Range<usize>, bool)> = Vec::new();
        for s in spans {
            let round = !layers[s.layer].has_state();
            match runs.last_mut() {
                Some((r, was)) if *was == round && r.end == s.offset => r.end = s.offset + s.len,
                _ => runs.push((s.range(), round)),
            }
        }
        let rounds_tops = (0..graph.len())
            .map(|i| {
                let node = graph.node(i);
                !node.is_loss && !node.reports_output
            })
            .collect();
        let weights = gpu
            .compute
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| gpu_error("allocate the half-precision weights", e))?;
        Ok(HalfRounding {
            half,
            weights,
            runs,
            rounds_tops,
        })
    }

    /// Fills [`HalfRounding::weights`] from the master weights `master`, on the compute stream.
    pub fn round_weights(&mut self, gpu: &Gpu, master: &CudaSlice<f32>) -> Result<()> {
        for (range, round) in &self.runs {
            let (from, mut to) = (
                master.slice(range.clone()),
                self.weights.slice_mut(range.clone()),
            );
            if *round {
                let fp16 = self.half == Half::Fp16;
                gpu.kernels
                    .round_half_copy(&gpu.compute, &from, &mut to, fp16, range.len())?;
            } else {
                gpu.compute
                    .memcpy_dtod(&from, &mut to)
                    .map_err(|e| gpu_error("copy a stateful layer's tensors", e))?;
            }
        }
        Ok(())
    }

    /// Rounds `x[..n]` in place, on the compute stream.
    pub fn round(&self, gpu: &Gpu, x: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        gpu.kernels
            .round_half(&gpu.compute, x, self.half == Half::Fp16, n)
    }
}
