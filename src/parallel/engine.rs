//! `Engine`: everything one replica computes and communicates with — its net, parameters,
//! gradients, update rule and communicator — behind one seam, so that `P2PSync` drives a CPU
//! replica and a GPU replica alike. Numbers stay where they are computed (device memory for a
//! GPU) until the loop asks for them: the loss window at display time, outputs at test time,
//! parameters at snapshot time.

use crate::data::{Normalize, Pixels};
use crate::error::Result;
use crate::net::{Output, PassCtx};
use crate::params::Params;
use std::time::Instant;

use super::local_sgd::GradientScope;
use crate::solver::loss_scale::LossScaleState;
use crate::solver::non_finite::NonFiniteSteps;
use crate::spans::SpanLog;

/// One replica's compute and communication.
pub trait Engine {
    /// Universal rank of this replica.
    fn rank(&self) -> usize;
    /// Number of replicas in the job.
    fn size(&self) -> usize;
    /// Number of learnable floats (the length of every parameter-sized buffer).
    fn param_count(&self) -> usize;
    /// Replaces this replica's parameters by universal rank 0's.
    fn broadcast_params(&mut self) -> Result<()>;
    /// Sets the batch size of the next passes (the last test batch may be smaller).
    fn set_batch(&mut self, n: usize) -> Result<()>;
    /// Copies a batch in: `data` (n, C, H, W) and `labels` (n).
    fn load_batch(&mut self, data: &[f32], labels: &[f32]) -> Result<()>;
    /// Copies a batch of 8-bit pixels in, normalised on the way: `pixels` (n, C, H, W) become
    /// the floats `normalize` makes of them (bit for bit those the CPU's [`Normalize::apply`]
    /// computes), `labels` (n) are copied. A GPU copies the bytes and normalises on the device.
    fn load_batch_u8(&mut self, pixels: &[u8], normalize: &Normalize, labels: &[f32])
        -> Result<()>;
    /// Copies a training batch's inputs in, in whichever form they travel.
    fn load_pixels(&mut self, data: &Pixels, labels: &[f32]) -> Result<()> {
        match data {
            Pixels::F32(floats) => self.load_batch(floats, labels),
            Pixels::U8 { values, normalize } => self.load_batch_u8(values, normalize, labels),
        }
    }
    /// Zeroes the parameter gradients (start of an iteration).
    fn zero_grad(&mut self) -> Result<()>;
    /// Train-phase forward over the loaded batch, adding the pass's loss into loss slot `slot`
    /// (see `loss_window`); `first` says the pass is the first of its iteration, which resets
    /// the slot.
    fn forward_train(&mut self, ctx: PassCtx, slot: usize, first: bool) -> Result<()>;
    /// Backward after `forward_train`, accumulating the parameter gradients.
    fn backward(&mut self, ctx: PassCtx) -> Result<()>;
    /// Test-phase forward over the loaded batch; returns its loss and accuracy outputs (this is
    /// allowed to synchronise with the device).
    fn forward_test(&mut self, ctx: PassCtx) -> Result<Vec<Output>>;
    /// Test-phase forward over the loaded batch; returns the blob called `name` (as the net's
    /// last writer of that name leaves it): its shape `(N, ...)` and a host copy of its values.
    fn forward_blob(&mut self, ctx: PassCtx, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;
    /// Says which replicas average the gradients of the coming iteration (every replica unless
    /// local SGD says otherwise; see `super::local_sgd`). Called before its first backward.
    fn set_gradient_scope(&mut self, scope: GradientScope);
    /// Averages the gradients over the replicas of the current scope (none: its own).
    fn all_reduce_gradients(&mut self) -> Result<()>;
    /// Local SGD's averaging (a collective over every replica): the parameters go through the
    /// outer rule (`super::local_sgd::Outer`), after which every replica holds the same ones.
    fn average_params(&mut self) -> Result<()>;
    /// With `true` (a collective), keeps this replica's own parameters aside and puts the mean
    /// of every replica's in their place (tests and snapshot weights between averagings); with
    /// `false`, puts its own back.
    fn hold_mean_params(&mut self, on: bool) -> Result<()>;
    /// A host copy of the outer rule's state, in `Outer::state_names` order (for snapshots).
    fn outer_state(&mut self) -> Result<Vec<Vec<f32>>>;
    /// Resuming local SGD: this replica's own parameters (`None`: keep those it has) and the
    /// outer rule's state (empty: start it afresh from the parameters).
    fn restore_apart(&mut self, params: Option<&[f32]>, outer: &[Vec<f32>]) -> Result<()>;
    /// Copies `buf` (host floats, of one length everywhere) of universal rank `root` into every
    /// replica's `buf` (snapshots gather the replicas' own states through it).
    fn broadcast_host(&mut self, buf: &mut [f32], root: usize) -> Result<()>;
    /// Applies the update rule for iteration `iter`; returns the learning rate used. A step
    /// whose averaged gradient is not finite (or, in `non_finite = "stop"` mode, any step after
    /// one) applies nothing and is recorded (see `crate::solver::non_finite`).
    fn update(&mut self, iter: u64) -> Result<f32>;
    /// The steps refused so far for non-finite numbers (a GPU engine waits for the device).
    fn non_finite_steps(&mut self) -> Result<NonFiniteSteps>;
    /// Whether the host waits for this engine's device every step anyway (always on the CPU), so
    /// that reading [`Engine::non_finite_steps`] after each step costs no extra wait; otherwise
    /// the loop reads it where it has waited (its agreements among replicas).
    fn host_waits_each_step(&self) -> bool {
        true
    }
    /// Makes this replica's loss of the current iteration NaN, in loss slot `slot` (failure
    /// injection: `crate::solver::non_finite::INJECT_NAN`).
    fn inject_nan_loss(&mut self, slot: usize) -> Result<()>;
    /// The loss slots, each the sum of one iteration's sub-batch losses (synchronises).
    fn loss_window(&mut self) -> Result<Vec<f64>>;
    /// Replaces `values` by their sums over every replica.
    fn sum_scores(&mut self, values: &mut [f64]) -> Result<()>;
    /// Waits for every replica.
    fn barrier(&mut self) -> Result<()>;
    /// A host copy of the parameters (for snapshots).
    fn params_to_host(&mut self) -> Result<Params>;
    /// A host copy of the solver's history buffers (for snapshots), in `Solver::history` order.
    fn solver_history(&mut self) -> Result<Vec<Vec<f32>>>;
    /// The names of the solver's history buffers (`Solver::history_names`).
    fn history_names(&self) -> &'static [&'static str];
    /// Restores a resumed run's solver history and loss slots (the weights come in at build).
    fn restore_state(&mut self, history: &[Vec<f32>], loss_slots: &[f64]) -> Result<()>;
    /// The loss-scaling state (`crate::solver::loss_scale`), `None` when the loss is not
    /// scaled (for snapshots, the training log and `metrics.jsonl`).
    fn loss_scale(&mut self) -> Result<Option<LossScaleState>> {
        Ok(None)
    }
    /// Restores a resumed run's loss-scaling state (ignored when the loss is not scaled).
    fn restore_loss_scale(&mut self, _state: &LossScaleState) -> Result<()> {
        Ok(())
    }
    /// A bit-exact hash of the parameters (`verify::hash_params`), for replica checks.
    fn params_hash(&mut self) -> Result<u64> {
        Ok(super::verify::hash_params(&self.params_to_host()?.data))
    }
    /// Changes one parameter (the first, to its next float): failure injection only.
    fn perturb_param(&mut self) -> Result<()>;
    /// Starts (or stops) measuring the device time of each step phase (`bench`).
    fn time_device_phases(&mut self, _on: bool) {}
    /// Device seconds per phase (in `spans::Step::ALL` order) since measuring started; `None`
    /// when the engine has no device clock (the CPU: the host timings are the device timings).
    fn device_phase_seconds(&mut self) -> Result<Option<[f64; 5]>> {
        Ok(None)
    }
    /// Timeline: starts recording the engine's own spans (per layer; device phases) against
    /// `origin`, sized for about `iters` iterations. Off unless called.
    fn start_spans(&mut self, _origin: Instant, _iters: u64) -> Result<()> {
        Ok(())
    }
    /// Stops recording the engine's spans and hands them back (`None` if it records none).
    fn take_spans(&mut self) -> Result<Option<SpanLog>> {
        Ok(None)
    }
    /// Ends the replica's part in the job cleanly, after its last collective (an NCCL
    /// communicator is finalised rather than aborted).
    fn finish(self) -> Result<()>
    where
        Self: Sized,
    {
        Ok(())
    }
}
