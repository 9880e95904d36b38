//! `GpuSolver`: `crate::solver::Solver` on the device — the same update rules (SGD, Nesterov,
//! AdaGrad, RMSProp, Adam, AdamW, AdaDelta), the same order of steps (normalise by `iter_size`, clip by the global
//! L2 norm, L2/L1 decay with `decay_mult`, rule with `lr · lr_mult`), the same formulas operation
//! for operation, and the learning rate from `crate::solver::learning_rate`. History buffers live
//! on the device in the flat layout of the parameters.
//!
//! [`GpuSolver::apply`] enqueues three kernels and never synchronises: the squared norm of the
//! gradient is reduced on the device (per-block partial sums in double, then one block), and the
//! resulting scale factor stays in device memory where the update kernel reads it. The same sum
//! tells a non-finite gradient: that step is recorded on the device and gets a NaN scale, on
//! which the update kernel applies nothing (`crate::solver::non_finite`); the host reads the
//! record only when it asks ([`GpuSolver::non_finite_steps`]). The per-tensor `lr_mult` and
//! `decay_mult` sit in small device tables built once, so one launch updates every tensor.
//!
//! Where the result cannot differ ([`GpuSolver::updates_by_part`]), the engine updates the
//! gradient bucket by bucket ([`GpuSolver::apply_part`]): each bucket as soon as its all-reduce
//! is done, while the next buckets are still on the wire, or, for a replica alone, on a stream of
//! its own beside the backward of the layers below it. Those parts are lean ([`Part`]): the
//! update kernel reads each gradient element once and judges it itself, and the effective
//! gradient is not stored back.

use super::loss_scale::DeviceLossScale;
use super::params::GpuParams;
use super::{gpu_error, Gpu};
use crate::config::{NonFiniteMode, Regularization, SolverConfig, SolverType};
use crate::cuda::kernels::{LeanCheck, Rule, UpdateArgs, WeightCopies, WireSum};
use crate::error::{Error, Result};
use crate::params::ParamSpan;
use crate::solver::loss_scale::{LossScaler, Rule as LossScaleRule};
use crate::solver::non_finite::NonFiniteSteps;
use crate::solver::{learning_rate, Solver};
use cudarc::driver::{CudaSlice, CudaStream};
use std::ops::Range;

/// The update rule of one replica with its history on the device; see the module docs.
#[derive(Debug)]
pub struct GpuSolver {
    cfg: SolverConfig,
    /// Learnable floats the solver was built for.
    n: usize,
    /// `(n)` each: `[v]` (SGD, Nesterov), `[h]` (AdaGrad, RMSProp), `[m, v]` (Adam, AdamW) or
    /// `[h, u]` (AdaDelta), as `Solver::history`.
    history: Vec<CudaSlice<f32>>,
    /// `(spans)` end offset of each tensor in the flat buffers.
    ends: CudaSlice<i64>,
    /// `(spans)` per-tensor multipliers.
    lr_mult: CudaSlice<f32>,
    decay_mult: CudaSlice<f32>,
    spans: usize,
    /// `(sumsq_parts(n))` partial sums of squares for clipping.
    partials: CudaSlice<f64>,
    /// `(1)` the factor on the raw gradient: `1 / iter_size`, times the clipping factor; NaN
    /// for a refused step.
    scale: CudaSlice<f32>,
    /// `(3)` the refused steps: count, first and last iteration (−1 until one).
    steps: CudaSlice<i64>,
    /// The loss scale of [`GpuSolver::apply`], which scales nothing.
    unscaled: DeviceLossScale,
}

impl GpuSolver {
    /// A solver for parameters laid out as `spans` (offsets and lengths as `Params::new` sets
    /// them), with zeroed history.
    pub fn new(gpu: &Gpu, cfg: &SolverConfig, spans: &[ParamSpan]) -> Result<GpuSolver> {
        let n = spans.last().map_or(0, |s| s.offset + s.len);
        let buffers = Solver::buffers(cfg.solver_type);
        let s = &gpu.compute;
        let err = |what: &str| {
            let what = what.to_string();
            move |e| gpu_error(&format!("allocate the solver's {what}"), e)
        };
        let history = (0..buffers)
            .map(|_| s.alloc_zeros::<f32>(n.max(1)).map_err(err("history")))
            .collect::<Result<Vec<_>>>()?;
        let ends: Vec<i64> = spans.iter().map(|s| (s.offset + s.len) as i64).collect();
        let lr_mult: Vec<f32> = spans.iter().map(|s| s.lr_mult).collect();
        let decay_mult: Vec<f32> = spans.iter().map(|s| s.decay_mult).collect();
        let table = |v: Vec<f32>| {
            let v = if v.is_empty() { vec![0.0] } else { v };
            s.clone_htod(&v).map_err(err("multiplier table"))
        };
        Ok(GpuSolver {
            cfg: cfg.clone(),
            n,
            history,
            ends: s
                .clone_htod(if ends.is_empty() {
                    &[0i64][..]
                } else {
                    &ends[..]
                })
                .map_err(err("span table"))?,
            lr_mult: table(lr_mult)?,
            decay_mult: table(decay_mult)?,
            spans: spans.len(),
            partials: s
                .alloc_zeros::<f64>(gpu.kernels.sumsq_parts(n).max(1))
                .map_err(err("norm partials"))?,
            scale: s.alloc_zeros::<f32>(1).map_err(err("scale"))?,
            steps: s.clone_htod(&[0i64, -1, -1]).map_err(err("step record"))?,
            unscaled: DeviceLossScale::new(gpu, &LossScaler::off())?,
        })
    }

    /// The `[solver]` config this solver runs.
    pub fn config(&self) -> &SolverConfig {
        &self.cfg
    }

    /// Names of the history buffers, as `Solver::history_names`.
    pub fn history_names(&self) -> &'static [&'static str] {
        Solver::new(&self.cfg, 0).history_names()
    }

    /// Host copies of the history buffers, each `n` long. Synchronises.
    pub fn history_to_host(&self, gpu: &Gpu) -> Result<Vec<Vec<f32>>> {
        // Waited for first: a copy into pageable memory blocks without a deadline.
        gpu.synchronize()?;
        let out = self
            .history
            .iter()
            .map(|h| {
                gpu.compute
                    .clone_dtoh(&h.slice(..self.n))
                    .map_err(|e| gpu_error("copy the solver history to the host", e))
            })
            .collect::<Result<Vec<_>>>()?;
        gpu.synchronize()?;
        Ok(out)
    }

    /// Replaces the history by host buffers (to restore a solver state): as many as
    /// [`GpuSolver::history_names`], each `n` long.
    pub fn history_from_host(&mut self, gpu: &Gpu, history: &[Vec<f32>]) -> Result<()> {
        if history.len() != self.history.len() || history.iter().any(|h| h.len() != self.n) {
            return Err(Error::Device(format!(
                "CUDA: solver history of {} buffers ({:?} floats) for {} buffers of {}",
                history.len(),
                history.iter().map(Vec::len).collect::<Vec<_>>(),
                self.history.len(),
                self.n
            )));
        }
        if self.n == 0 {
            return Ok(());
        }
        for (dst, src) in self.history.iter_mut().zip(history) {
            gpu.compute
                .memcpy_htod(&src[..], &mut dst.slice_mut(..self.n))
                .map_err(|e| gpu_error("copy the solver history to the device", e))?;
        }
        Ok(())
    }

    /// The steps refused so far for a non-finite gradient. Synchronises (under the collective
    /// deadline, before the copy: a copy into host memory would block without one); allocates
    /// nothing, as it may run every step.
    pub fn non_finite_steps(&self, gpu: &Gpu) -> Result<NonFiniteSteps> {
        gpu.synchronize()?;
        let mut v = [0i64; 3];
        gpu.compute
            .memcpy_dtoh(&self.steps, &mut v)
            .map_err(|e| gpu_error("copy the refused-step record to the host", e))?;
        let iteration = |i: i64| u64::try_from(i).ok();
        Ok(NonFiniteSteps {
            count: v[0].max(0) as u64,
            first: iteration(v[1]),
            last: iteration(v[2]),
            culprit: None,
        })
    }

    /// Applies one update of iteration `iter` (0-based) to `params` and returns the learning
    /// rate it used — `Solver::apply` step for step (its docs give the formulas). On entry
    /// `params.diff` holds the gradient summed over the `iter_size` sub-batches and averaged
    /// over the replicas; on return it holds the effective gradient (normalised, clipped,
    /// regularised). Enqueued on the compute stream; nothing synchronises.
    ///
    /// # Panics
    /// If `params` has not the length the solver was built for.
    pub fn apply(&mut self, gpu: &Gpu, iter: u64, params: &mut GpuParams) -> Result<f32> {
        self.apply_scaled(gpu, iter, params, None, None)
    }

    /// [`GpuSolver::apply`] of a gradient `loss_scale` times the true one, where the loss is
    /// scaled: the verdict first (`crate::cuda::loss_scale`), then the update of a finite step
    /// with the gradient unscaled; an overflow under the dynamic rule updates nothing. Mixed
    /// precision's `copies` of the weights are written from the new weights in the same pass.
    pub fn apply_scaled(
        &mut self,
        gpu: &Gpu,
        iter: u64,
        params: &mut GpuParams,
        copies: Option<WeightCopies<'_>>,
        loss_scale: Option<&mut DeviceLossScale>,
    ) -> Result<f32> {
        let whole = Part {
            range: 0..self.n,
            later: false,
            sum: None,
            copies,
            lean: false,
        };
        self.apply_part(gpu, &gpu.compute, iter, params, whole, loss_scale)
    }

    /// Whether the update may run bucket by bucket ([`GpuSolver::apply_part`]), each part as
    /// soon as its all-reduce is done, with the same result as one update of the whole
    /// gradient: no clipping (whose factor needs the whole gradient's norm), `non_finite =
    /// "stop"` (under `"skip"` a step must leave every weight as it was when any part is not
    /// finite) and no dynamic loss scale (whose verdict moves its state once per step).
    pub fn updates_by_part(&self, loss_scale: Option<&DeviceLossScale>) -> bool {
        updates_by_part(&self.cfg, loss_scale.map(|ls| ls.rule))
    }

    /// The update of iteration `iter` over the elements `part.range` of the flat buffers, on
    /// stream `s`: judged and applied as [`GpuSolver::apply_scaled`] does the whole gradient,
    /// where [`GpuSolver::updates_by_part`] allows it (see [`Part`]). The parts of one solver
    /// share its scratch: they must run in order on one stream.
    pub fn apply_part(
        &mut self,
        gpu: &Gpu,
        s: &CudaStream,
        iter: u64,
        params: &mut GpuParams,
        part: Part<'_>,
        loss_scale: Option<&mut DeviceLossScale>,
    ) -> Result<f32> {
        let Part {
            range,
            later,
            sum,
            copies,
            lean,
        } = part;
        assert!(
            !lean || self.updates_by_part(loss_scale.as_deref()),
            "GpuSolver: a lean part under a rule that does not update by parts"
        );
        assert_eq!(
            params.len(),
            self.n,
            "GpuSolver: built for {} parameters, got {}",
            self.n,
            params.len()
        );
        let cfg = &self.cfg;
        let lr = learning_rate(cfg, iter);
        if range.is_empty() {
            return Ok(lr);
        }
        gpu.bind()?;
        let k = &gpu.kernels;
        let n = self.n;

        // Steps 1 and 2: the factor on the raw diff, on the device (NaN for a refused step). A
        // lean part sums the squares of its first element only, where a non-finite loss puts its
        // NaN in the first part (`Part`), and none in a later part: the update judges each
        // element itself.
        let normalise = 1.0 / cfg.iter_size.max(1) as f64;
        let judged = match (lean, later) {
            (false, _) => range.clone(),
            (true, false) => range.start..range.start + 1,
            (true, true) => range.start..range.start,
        };
        let parts = match judged.is_empty() {
            true => 0,
            false => k.sumsq_parts(judged.len()),
        };
        let partials = &mut self.partials.slice_mut(..parts);
        match sum {
            _ if parts == 0 => {}
            Some(w) => {
                let bits = &w.bits.slice(judged.clone());
                k.sumsq_partial_bf16(s, bits, w.scale, judged.len(), partials)?
            }
            None => k.sumsq_partial(
                s,
                &params.diff.slice(judged.clone()),
                judged.len(),
                partials,
            )?,
        }
        k.clip_scale(
            s,
            partials,
            parts,
            normalise,
            cfg.clip_gradients as f64,
            &mut self.scale,
            &mut self.steps,
            iter,
            cfg.non_finite == NonFiniteMode::Stop,
            loss_scale.unwrap_or(&mut self.unscaled).args(),
            later,
        )?;

        // Steps 3 and 4, fused over every tensor.
        let (w, g) = params.data_and_diff_mut();
        let args = UpdateArgs {
            w,
            g,
            sum,
            n,
            range,
            ends: &self.ends,
            lr_mult: &self.lr_mult,
            decay_mult: &self.decay_mult,
            spans: self.spans,
            scale: &self.scale,
            lr,
            weight_decay: cfg.weight_decay,
            l1: cfg.regularization_type == Regularization::L1,
            copies,
            lean: lean.then_some(LeanCheck {
                steps: &mut self.steps,
                iter,
            }),
        };
        let (h0, h1) = match self.history.as_mut_slice() {
            [a] => (a, None),
            [a, b] => (a, Some(b)),
            _ => unreachable!("a solver has one or two history buffers"),
        };
        let rule = match cfg.solver_type {
            SolverType::Sgd => Rule::Sgd {
                momentum: cfg.momentum,
                v: h0,
            },
            SolverType::Nesterov => Rule::Nesterov {
                momentum: cfg.momentum,
                v: h0,
            },
            SolverType::Adagrad => Rule::Adagrad {
                delta: cfg.delta,
                h: h0,
            },
            SolverType::Rmsprop => Rule::Rmsprop {
                rho: cfg.rms_decay,
                delta: cfg.delta,
                h: h0,
            },
            SolverType::Adam | SolverType::Adamw => Rule::Adam {
                beta1: cfg.momentum,
                beta2: cfg.momentum2,
                eps: cfg.delta,
                correction: adam_correction(cfg, iter),
                decoupled_decay: cfg.solver_type == SolverType::Adamw,
                m: h0,
                v: h1.expect("Adam has two history buffers"),
            },
            SolverType::Adadelta => Rule::Adadelta {
                rho: cfg.momentum,
                delta: cfg.delta,
                h: h0,
                u: h1.expect("AdaDelta has two history buffers"),
            },
        };
        k.update(s, args, rule)?;
        Ok(lr)
    }
}

/// [`GpuSolver::updates_by_part`] for the solver `cfg` under the loss-scaling rule `loss_scale`
/// (`None`: the loss is not scaled).
pub fn updates_by_part(cfg: &SolverConfig, loss_scale: Option<LossScaleRule>) -> bool {
    let dynamic = matches!(loss_scale, Some(LossScaleRule::Dynamic { .. }));
    cfg.clip_gradients <= 0.0 && cfg.non_finite == NonFiniteMode::Stop && !dynamic
}

/// One part of an iteration's update ([`GpuSolver::apply_part`]): the elements `range`, whether
/// it is `later` than the iteration's first part, where its raw gradient is: in the
/// gradient buffer, or still in the bfloat16 wire's `sum`, widened and averaged as it is read,
/// mixed precision's `copies` of the weights, written from the new weights in the same pass,
/// and whether it is `lean`.
///
/// A later part of an iteration already refused adds nothing to the refused-step record; in
/// `stop` mode the latch refuses the parts after a non-finite one. The parts before it have
/// been applied: the run stops at its next look at the record and writes nothing after it (a
/// non-finite loss poisons the first element of the first part launched, so that then nothing
/// is applied).
///
/// A lean part reads its gradient once: no sum of squares over it before the update (only of its
/// first element, in the first part), each raw element judged by the update itself — a
/// non-finite one refuses the step and is left as it was, the elements beside it applied — and
/// the effective gradient not stored back, so that the gradient buffer keeps the raw one. The
/// weights it leaves are those of a part that is not lean wherever the gradient is finite.
pub struct Part<'a> {
    pub range: Range<usize>,
    pub later: bool,
    pub sum: Option<WireSum<'a>>,
    pub copies: Option<WeightCopies<'a>>,
    pub lean: bool,
}

/// Adam's bias correction `√(1 − β₂ᵗ) / (1 − β₁ᵗ)` with `t = iter + 1`, computed as the CPU
/// solver does (in f64, then rounded).
fn adam_correction(cfg: &SolverConfig, iter: u64) -> f32 {
    let t = iter.saturating_add(1).min(i32::MAX as u64) as i32;
    let (b1, b2) = (cfg.momentum as f64, cfg.momentum2 as f64);
    ((1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t))) as f32
}

#[cfg(test)]
mod tests;
