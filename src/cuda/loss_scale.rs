//! [`DeviceLossScale`]: loss scaling (`crate::solver::loss_scale`) kept on the device, so that a
//! step never waits for the host to judge its gradient. The scale seeds the loss gradient at the
//! top of backward (`GpuNet`'s loss tops get `loss_weight × scale`, read from device memory) and
//! the solver's `clip_scale` kernel gives the verdict on the averaged gradient, moves the scale
//! and the counts as `LossScaler::verdict` does, and unscales a finite step
//! (`GpuSolver::apply_scaled`). Every replica judges the same averaged bits, so every replica
//! skips the same steps and keeps the same scale without a collective of its own.
//!
//! The host reads the state only where it asks (the display line, `metrics.jsonl`, snapshots),
//! and writes it on a resume.

use super::kernels::LossScaleArgs;
use super::{gpu_error, Gpu};
use crate::error::Result;
use crate::solver::loss_scale::{LossScaleState, LossScaler, Rule};
use cudarc::driver::CudaSlice;

/// The loss scale of one replica on its device; see the module docs.
#[derive(Debug)]
pub struct DeviceLossScale {
    pub rule: Rule,
    /// `(1)` the factor of the next step's loss gradient.
    pub scale: CudaSlice<f32>,
    /// `(2)` finite steps in a row since the scale last moved, and steps skipped for an
    /// overflow.
    pub counts: CudaSlice<i64>,
}

impl DeviceLossScale {
    /// The device twin of `scaler` (its rule and state), on the compute stream.
    pub fn new(gpu: &Gpu, scaler: &LossScaler) -> Result<DeviceLossScale> {
        let s = &gpu.compute;
        let err = |e| gpu_error("allocate the loss scale", e);
        let state = scaler.state();
        let (scale, counts) = match state {
            Some(st) => (st.scale, [st.good_steps as i64, st.skipped as i64]),
            None => (1.0, [0, 0]),
        };
        Ok(DeviceLossScale {
            rule: scaler.rule(),
            scale: s.clone_htod(&[scale]).map_err(err)?,
            counts: s.clone_htod(&counts).map_err(err)?,
        })
    }

    /// The state and rule as the solver's `clip_scale` kernel takes them.
    pub fn args(&mut self) -> LossScaleArgs<'_> {
        LossScaleArgs {
            rule: self.rule,
            scale: &mut self.scale,
            counts: &mut self.counts,
        }
    }

    /// Whether the loss is scaled at all.
    pub fn is_on(&self) -> bool {
        self.rule != Rule::Off
    }

    /// The state as a snapshot keeps it; `None` when scaling is off. Synchronises.
    pub fn state(&self, gpu: &Gpu) -> Result<Option<LossScaleState>> {
        if !self.is_on() {
            return Ok(None);
        }
        // Waited for first, under the collective deadline: the copies below block.
        gpu.synchronize()?;
        let (mut scale, mut counts) = ([0f32], [0i64; 2]);
        let err = |e| gpu_error("copy the loss scale to the host", e);
        gpu.compute
            .memcpy_dtoh(&self.scale, &mut scale)
            .map_err(err)?;
        gpu.compute
            .memcpy_dtoh(&self.counts, &mut counts)
            .map_err(err)?;
        gpu.synchronize()?;
        Ok(Some(LossScaleState {
            scale: scale[0],
            good_steps: counts[0].max(0) as u64,
            skipped: counts[1].max(0) as u64,
        }))
    }

    /// Restores a snapshot's state as `LossScaler::restore` does: scale and good steps under the
    /// dynamic rule, the count of skipped steps under any.
    pub fn restore(&mut self, gpu: &Gpu, state: &LossScaleState) -> Result<()> {
        let Some(mut now) = self.state(gpu)? else {
            return Ok(());
        };
        if let Rule::Dynamic { .. } = self.rule {
            now.scale = state.scale;
            now.good_steps = state.good_steps;
        }
        now.skipped = state.skipped;
        let err = |e| gpu_error("copy the loss scale to the device", e);
        let counts = [now.good_steps as i64, now.skipped as i64];
        gpu.compute
            .memcpy_htod(&[now.scale], &mut self.scale)
            .map_err(err)?;
        gpu.compute
            .memcpy_htod(&counts, &mut self.counts)
            .map_err(err)?;
        gpu.synchronize()
    }
}
