//! `GpuBatchNorm`: Caffe's BatchNorm (no affine part) on the project's own kernels, the device
//! twin of `crate::layers::batch_norm`, including `sync` over the replicas.
//!
//! Shapes: bottom and top `(N, C, ...)`, statistics per channel over `m = N · S` values
//! (`S` the product of the axes after C) — over every replica's batch when `sync = true`.
//! State, three non-learnable tensors in the flat parameters: running mean `(C)`, running
//! variance `(C)`, moving-average factor `(1)`.
//!
//! Train (batch statistics): per-channel `Σx` and `Σx²` in double (one block per channel, a
//! fixed summation tree), all-reduced (`2C + 1` doubles, the count included) on the compute
//! stream when `sync`; `mean = Σx / m`, biased `var = Σx² / m − mean²`,
//! `y = (x − mean) · inv_std`, `inv_std = 1/√(var + eps)` (as the CPU layer). Then [`GpuLayer::update_state`] updates the running
//! statistics: `factor = factor·maf + 1`, `mean_r = mean_r·maf + mean`,
//! `var_r = var_r·maf + m/(m−1)·var`. Backward: `Σdy` and `Σdy·y` likewise (all-reduced when
//! `sync`), `dx = (dy − mean(dy) − mean(dy·y)·y) / √(var + eps)`, so that N replicas × batch b
//! equal one replica × batch N·b.
//!
//! Global statistics (`use_global_stats`, default in the test phase): `s = factor == 0 ? 0 :
//! 1/factor`, `mean = mean_r·s`, `var = var_r·s`; backward `dx = dy / √(var + eps)`. No state
//! update, no communication.
//!
//! The state tensors have lr_mult 0: their gradient is zero (written as such when the net asks
//! this layer to overwrite the parameter gradient).

use super::{pick, scratch, GpuCtx, GpuLayer, Grad};
use crate::config::{LayerConfig, Phase};
use crate::cuda::blob::GpuBlob;
use crate::cuda::{gpu_error, Gpu};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

/// BatchNorm; see the module docs.
#[derive(Debug)]
pub struct GpuBatchNorm {
    name: String,
    maf: f32,
    eps: f32,
    use_global_stats: Option<bool>,
    sync: bool,
    /// `(N, C, S)` of the current bottom; C fixed by the first reshape.
    dims: (usize, usize, usize),
    channels: Option<usize>,
    /// `(2C + 1)`: `[Σa, Σa·b, m]` of the last forward or backward (after the all-reduce).
    sums: CudaSlice<f64>,
    /// `(C)` the statistics the last forward normalised with.
    mean: CudaSlice<f32>,
    var: CudaSlice<f32>,
    inv_std: CudaSlice<f32>,
    /// Whether the last forward used batch statistics (so that state and backward follow it).
    batch_stats: bool,
}

impl GpuBatchNorm {
    /// Reads `moving_average_fraction` (0.999), `eps` (1e-5), `use_global_stats` and `sync`
    /// (false).
    pub fn new(gpu: &Gpu, cfg: &LayerConfig) -> Result<Self> {
        Ok(GpuBatchNorm {
            name: cfg.name.clone(),
            maf: cfg.moving_average_fraction.unwrap_or(0.999),
            eps: cfg.eps.unwrap_or(1e-5),
            use_global_stats: cfg.use_global_stats,
            sync: cfg.sync.unwrap_or(false),
            dims: (0, 0, 0),
            channels: None,
            sums: scratch(gpu, 1)?,
            mean: scratch(gpu, 1)?,
            var: scratch(gpu, 1)?,
            inv_std: scratch(gpu, 1)?,
            batch_stats: false,
        })
    }

    fn global(&self, phase: Phase) -> bool {
        self.use_global_stats.unwrap_or(phase == Phase::Test)
    }

    /// Sums over every replica when `sync` in the train phase (never in test passes, whose
    /// batch counts may differ between replicas).
    fn reduce(&mut self, gpu: &Gpu, ctx: &GpuCtx<'_>) -> Result<()> {
        if !(self.sync && ctx.phase == Phase::Train) {
            return Ok(());
        }
        if let Some(coll) = ctx.collective {
            let n = 2 * self.dims.1 + 1;
            coll.sum_f64(gpu, &mut self.sums, n)?;
        }
        Ok(())
    }
}

impl GpuLayer for GpuBatchNorm {
    fn type_name(&self) -> &'static str {
        "batch_norm"
    }

    /// One bottom `(N, C, ...)` with the C of the first call.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let [shape] = bottoms else {
            return Err(Error::net(
                &self.name,
                format!("takes 1 bottom, got {}", bottoms.len()),
            ));
        };
        if shape.len() < 2 {
            return Err(Error::net(
                &self.name,
                format!("needs a bottom with a channel axis (N, C, ...), got {shape:?}"),
            ));
        }
        let c = shape[1];
        match self.channels {
            Some(c0) if c0 != c => {
                return Err(Error::net(
                    &self.name,
                    format!("bottom {shape:?} has {c} channels, the statistics {c0}"),
                ))
            }
            Some(_) => {}
            None => {
                self.channels = Some(c);
                self.sums = scratch(gpu, 2 * c + 1)?;
                self.mean = scratch(gpu, c)?;
                self.var = scratch(gpu, c)?;
                self.inv_std = scratch(gpu, c)?;
            }
        }
        self.dims = (shape[0], c, shape[2..].iter().product());
        Ok(())
    }

    fn forward(
        &mut self,
        gpu: &Gpu,
        ctx: &GpuCtx<'_>,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        params: &CudaView<'_, f32>,
    ) -> Result<()> {
        let (_, c, _) = self.dims;
        let s = &gpu.compute;
        self.batch_stats = !self.global(ctx.phase);
        let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
        if self.batch_stats {
            gpu.kernels
                .bn_sums(s, &x.data(), None, &mut self.sums, self.dims)?;
            self.reduce(gpu, ctx)?;
            gpu.kernels.bn_batch_stats(
                s,
                &self.sums,
                c,
                self.eps,
                &mut self.mean,
                &mut self.var,
                &mut self.inv_std,
            )?;
        } else {
            gpu.kernels.bn_global_stats(
                s,
                params,
                c,
                self.eps,
                &mut self.mean,
                &mut self.var,
                &mut self.inv_std,
            )?;
        }
        gpu.kernels.bn_normalize(
            s,
            &x.data(),
            &self.mean,
            &self.inv_std,
            &mut y.data_mut(),
            self.dims,
        )
    }

    /// The running statistics of a training forward with batch statistics (the sums still hold
    /// the forward's count `m`).
    fn update_state(
        &mut self,
        gpu: &Gpu,
        ctx: &GpuCtx<'_>,
        params: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        if ctx.phase != Phase::Train || !self.batch_stats {
            return Ok(());
        }
        gpu.kernels.bn_update_running(
            &gpu.compute,
            params,
            &self.mean,
            &self.var,
            &self.sums,
            self.dims.1,
            self.maf,
        )
    }

    fn backward(
        &mut self,
        gpu: &Gpu,
        ctx: &GpuCtx<'_>,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        grads: &[Grad],
        _params: &CudaView<'_, f32>,
        param_grad: Grad,
        param_diff: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let s = &gpu.compute;
        if param_grad == Grad::Overwrite {
            s.memset_zeros(param_diff)
                .map_err(|e| gpu_error("zero the batch-norm state gradient", e))?;
        }
        if !grads[0].wanted() {
            return Ok(());
        }
        let acc = grads[0].accumulate();
        let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
        if !self.batch_stats {
            return gpu.kernels.bn_backward_global(
                s,
                &y.diff(),
                &self.inv_std,
                &mut x.diff_mut(),
                self.dims,
                acc,
            );
        }
        let top = y.data();
        gpu.kernels
            .bn_sums(s, &y.diff(), Some(&top), &mut self.sums, self.dims)?;
        self.reduce(gpu, ctx)?;
        gpu.kernels.bn_backward(
            s,
            &y.diff(),
            &top,
            &self.sums,
            &self.inv_std,
            &mut x.diff_mut(),
            self.dims,
            acc,
        )
    }
}
