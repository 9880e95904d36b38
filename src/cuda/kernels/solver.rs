//! Launchers of the solver's kernels (`solver.cu`): gradient clipping's sum of squares and scale
//! factor, and one update step of every rule (SGD, Nesterov, AdaGrad, RMSProp, Adam, AdamW,
//! AdaDelta) over the flat parameter and gradient buffers, operation for operation as the CPU
//! solver.

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use crate::solver::loss_scale::Rule as LossScaleRule;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};
use std::ops::Range;

/// Loss scaling's device state as [`Kernels::clip_scale`] judges and moves it
/// (`crate::cuda::loss_scale`): the scale `(1)` and the counts `(2)` of good and skipped steps.
pub struct LossScaleArgs<'a> {
    pub rule: LossScaleRule,
    pub scale: &'a mut CudaSlice<f32>,
    pub counts: &'a mut CudaSlice<i64>,
}

/// The bfloat16 wire's sum of a gradient over the replicas (`crate::cuda::wire`): the bit
/// patterns `(n)`, at the flat offsets of the gradient, and the averaging `scale` (`1/R`) that
/// `from_bf16_scaled` would multiply them by. An update reading it reads that value.
#[derive(Clone, Copy)]
pub struct WireSum<'a> {
    pub bits: &'a CudaSlice<u16>,
    pub scale: f32,
}

/// How the update refreshes a tensor's copy in [`WeightCopies`] (`WEIGHT_*` in `solver.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum WeightCopy {
    /// Not by the update: a stateful layer's tensors, copied as they are before each forward.
    Kept = 0,
    /// Rounded to the half type, as a float.
    Rounded = 1,
    /// Rounded to the half type, as its bit pattern only.
    Half = 2,
}

/// The copies of the weights that mixed precision's layers see, which an update step writes
/// from each new weight as it writes the weight: `rounded` `(n)` and `half` `(n)` at the flat
/// offsets, per tensor as `kinds` `(spans)` says ([`WeightCopy`] values), rounding to fp16 or
/// bf16.
pub struct WeightCopies<'a> {
    pub rounded: &'a mut CudaSlice<f32>,
    /// Needed where some tensor is [`WeightCopy::Half`].
    pub half: Option<&'a mut CudaSlice<u16>>,
    pub kinds: &'a CudaSlice<i32>,
    pub fp16: bool,
}

impl WeightCopies<'_> {
    /// The same copies, borrowed again (one update step of several over parts of the buffers).
    pub fn reborrow(&mut self) -> WeightCopies<'_> {
        WeightCopies {
            rounded: self.rounded,
            half: self.half.as_deref_mut(),
            kinds: self.kinds,
            fp16: self.fp16,
        }
    }
}

/// The flat-buffer description of an update step shared by every rule: `w` and `g` `(n)`, the
/// raw gradient in `g` or in the wire's `sum`, the elements `range` it updates (all `0..n`, or
/// one gradient bucket's), the tensors' `ends` `(spans)` (ascending, the last equal to `n`),
/// per-tensor `lr_mult` and `decay_mult` `(spans)`, and the device scalar `scale` `(1)` that
/// multiplies the raw gradient.
pub struct UpdateArgs<'a> {
    pub w: &'a mut CudaSlice<f32>,
    pub g: &'a mut CudaSlice<f32>,
    pub sum: Option<WireSum<'a>>,
    pub n: usize,
    pub range: Range<usize>,
    pub ends: &'a CudaSlice<i64>,
    pub lr_mult: &'a CudaSlice<f32>,
    pub decay_mult: &'a CudaSlice<f32>,
    pub spans: usize,
    pub scale: &'a CudaSlice<f32>,
    /// The iteration's learning rate (before `lr_mult`).
    pub lr: f32,
    pub weight_decay: f32,
    /// L1 instead of L2 regularisation.
    pub l1: bool,
    /// Mixed precision's copies of the weights, refreshed in the same pass.
    pub copies: Option<WeightCopies<'a>>,
    /// A lean update (one part of an update by parts under the `stop` rule): the record
    /// `[count, first, last]` `(3)` where each non-finite raw gradient element refuses iteration
    /// `iter` (that element left as it was), with no sum of squares before it; the effective
    /// gradient is then not stored back into `g`.
    pub lean: Option<LeanCheck<'a>>,
}

/// What a lean update ([`UpdateArgs::lean`]) records a non-finite gradient element in.
pub struct LeanCheck<'a> {
    pub steps: &'a mut CudaSlice<i64>,
    pub iter: u64,
}

/// The rule-specific part of an update step and its history buffers `(n)`.
pub enum Rule<'a> {
    Sgd {
        momentum: f32,
        v: &'a mut CudaSlice<f32>,
    },
    Nesterov {
        momentum: f32,
        v: &'a mut CudaSlice<f32>,
    },
    Adagrad {
        delta: f32,
        h: &'a mut CudaSlice<f32>,
    },
    Rmsprop {
        rho: f32,
        delta: f32,
        h: &'a mut CudaSlice<f32>,
    },
    Adam {
        beta1: f32,
        beta2: f32,
        eps: f32,
        /// `√(1 − β₂ᵗ) / (1 − β₁ᵗ)`.
        correction: f32,
        /// AdamW: the weight decay shrinks the weight instead of entering the gradient.
        decoupled_decay: bool,
        m: &'a mut CudaSlice<f32>,
        v: &'a mut CudaSlice<f32>,
    },
    Adadelta {
        rho: f32,
        delta: f32,
        h: &'a mut CudaSlice<f32>,
        u: &'a mut CudaSlice<f32>,
    },
}

impl Kernels {
    /// The number of partial sums [`Kernels::sumsq_partial`] writes for `n` elements.
    pub fn sumsq_parts(&self, n: usize) -> usize {
        self.grid(n).grid_dim.0 as usize
    }

    /// `partials[b]` = the sum of squares of block `b`'s share of `x[..n]`, in double, for
    /// `b < sumsq_parts(n)`.
    pub fn sumsq_partial(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        n: usize,
        partials: &mut impl DevicePtrMut<f64>,
    ) -> Result<()> {
        check_len("sumsq_partial", "x", x.len(), n);
        check_len(
            "sumsq_partial",
            "partials",
            partials.len(),
            self.sumsq_parts(n),
        );
        let n64 = n as i64;
        launch!(self, s, sumsq_partial, self.grid(n), [in x, &n64, out partials])
    }

    /// [`Kernels::sumsq_partial`] of the wire's sum: of `float(w[i]) · scale` for `i < n`, the
    /// values `from_bf16_scaled` would write.
    pub fn sumsq_partial_bf16(
        &self,
        s: &CudaStream,
        w: &impl DevicePtr<u16>,
        scale: f32,
        n: usize,
        partials: &mut impl DevicePtrMut<f64>,
    ) -> Result<()> {
        check_len("sumsq_partial_bf16", "w", w.len(), n);
        check_len(
            "sumsq_partial_bf16",
            "partials",
            partials.len(),
            self.sumsq_parts(n),
        );
        let n64 = n as i64;
        launch!(self, s, sumsq_partial_bf16, self.grid(n), [in w, &scale, &n64, out partials])
    }

    /// `scale[0] = normalise`, times `clip / norm` when `parts > 0` and
    /// `norm = √(Σ partials[..parts]) · normalise` exceeds `clip`. Where that sum of squares is
    /// not finite, iteration `iter` is recorded in `steps` (`[count, first, last]`, `first` and
    /// `last` −1 until one), and `scale[0]` is NaN, which makes the update kernels apply nothing;
    /// with `latch`, so is it at every iteration after one was recorded.
    ///
    /// Under loss scaling (`loss_scale.rule` not `Off`), the verdict of
    /// `LossScaler::verdict` first: an overflow under the dynamic rule skips the step (NaN,
    /// not recorded) and backs the scale off; a finite step moves the dynamic counts and is
    /// unscaled (the norm taken of the true gradient, `scale[0]` times `1 / step scale`).
    ///
    /// `later_part`: the partials are one part of the iteration's gradient after its first (a
    /// gradient judged bucket by bucket, never under the dynamic rule): where iteration `iter`
    /// is already recorded, the record is left as it is.
    #[allow(clippy::too_many_arguments)]
    pub fn clip_scale(
        &self,
        s: &CudaStream,
        partials: &impl DevicePtr<f64>,
        parts: usize,
        normalise: f64,
        clip: f64,
        scale: &mut impl DevicePtrMut<f32>,
        steps: &mut impl DevicePtrMut<i64>,
        iter: u64,
        latch: bool,
        loss_scale: LossScaleArgs<'_>,
        later_part: bool,
    ) -> Result<()> {
        check_len("clip_scale", "partials", partials.len(), parts);
        check_len("clip_scale", "scale", scale.len(), 1);
        check_len("clip_scale", "steps", steps.len(), 3);
        let parts = to_i32("clip_scale", parts);
        let (iter, latch) = (iter.min(i64::MAX as u64) as i64, latch as i32);
        let part = later_part as i32;
        let (rule, growth_interval, backoff) = match loss_scale.rule {
            LossScaleRule::Off => (0i32, 0i64, 1f32),
            LossScaleRule::Fixed => (1, 0, 1.0),
            LossScaleRule::Dynamic {
                growth_interval,
                backoff,
            } => (2, growth_interval.min(i64::MAX as u64) as i64, backoff),
        };
        let (ls, counts) = (loss_scale.scale, loss_scale.counts);
        launch!(
            self, s, clip_scale, Kernels::single_block(),
            [in partials, &parts, &normalise, &clip, out scale, out steps, &iter, &latch,
             out ls, out counts, &rule, &growth_interval, &backoff, &part]
        )
    }

    /// One update step of `rule` over `a.range` of the flat buffers of `a` (see
    /// `crate::solver::Solver::apply` for the formulas, which the kernels follow operation for
    /// operation).
    pub fn update(&self, s: &CudaStream, a: UpdateArgs<'_>, rule: Rule<'_>) -> Result<()> {
        let op = "update";
        check_len(op, "w", a.w.len(), a.n);
        check_len(op, "g", a.g.len(), a.n);
        check_len(op, "ends", a.ends.len(), a.spans);
        check_len(op, "lr_mult", a.lr_mult.len(), a.spans);
        check_len(op, "decay_mult", a.decay_mult.len(), a.spans);
        check_len(op, "scale", a.scale.len(), 1);
        assert!(
            a.range.start <= a.range.end && a.range.end <= a.n,
            "update: range {:?} outside the {} parameters",
            a.range,
            a.n
        );
        if a.range.is_empty() || a.spans == 0 {
            return Ok(());
        }
        let cfg = self.grid(a.range.len());
        let (start, end) = (a.range.start as i64, a.range.end as i64);
        // The wire's sum, or a null pointer: the kernels then read `g`.
        let (sum, sum_scale, _sum_guard) = match a.sum {
            Some(w) => {
                check_len(op, "sum", w.bits.len(), a.n);
                let (ptr, guard) = w.bits.device_ptr(s);
                (ptr, w.scale, Some(guard))
            }
            None => (0, 1.0f32, None),
        };
        // The copies, or null pointers: the kernels then write none.
        let (mut rounded, mut half, mut kinds, mut fp16) = (0, 0, 0, 0i32);
        let (mut _rounded_guard, mut _half_guard, mut _kinds_guard) = (None, None, None);
        if let Some(c) = a.copies {
            check_len(op, "rounded", c.rounded.len(), a.n);
            check_len(op, "kinds", c.kinds.len(), a.spans);
            let (ptr, guard) = c.rounded.device_ptr_mut(s);
            (rounded, _rounded_guard) = (ptr, Some(guard));
            if let Some(h) = c.half {
                check_len(op, "half", h.len(), a.n);
                let (ptr, guard) = h.device_ptr_mut(s);
                (half, _half_guard) = (ptr, Some(guard));
            }
            let (ptr, guard) = c.kinds.device_ptr(s);
            (kinds, _kinds_guard) = (ptr, Some(guard));
            fp16 = c.fp16 as i32;
        }
        // The lean check's record, or a null pointer: the effective gradient is then stored.
        let (steps, iter, _steps_guard) = match a.lean {
            Some(l) => {
                check_len(op, "steps", l.steps.len(), 3);
                let (ptr, guard) = l.steps.device_ptr_mut(s);
                (ptr, l.iter.min(i64::MAX as u64) as i64, Some(guard))
            }
            None => (0, 0i64, None),
        };
        let spans = to_i32(op, a.spans);
        let l1 = a.l1 as i32;
        let (lr, wd) = (a.lr, a.weight_decay);
        // Launches the rule's kernel with the arguments every rule shares (UPDATE_PARAMS in
        // SOURCE), then the rule's own.
        macro_rules! launch_rule {
            ($func:ident, [$($extra:tt)*]) => {
                launch!(
                    self, s, $func, cfg,
                    [
                        out a.w, out a.g, &sum, &sum_scale, &start, &end, in a.ends,
                        in a.lr_mult, in a.decay_mult, &spans, in a.scale, &lr, &wd, &l1,
                        &rounded, &half, &kinds, &fp16, &steps, &iter,
                        $($extra)*
                    ]
                )
            };
        }
        match rule {
            Rule::Sgd { momentum, v } => {
                check_len(op, "v", v.len(), a.n);
                launch_rule!(sgd_update, [out v, &momentum])
            }
            Rule::Nesterov { momentum, v } => {
                check_len(op, "v", v.len(), a.n);
                launch_rule!(nesterov_update, [out v, &momentum])
            }
            Rule::Adagrad { delta, h } => {
                check_len(op, "h", h.len(), a.n);
                launch_rule!(adagrad_update, [out h, &delta])
            }
            Rule::Rmsprop { rho, delta, h } => {
                check_len(op, "h", h.len(), a.n);
                launch_rule!(rmsprop_update, [out h, &rho, &delta])
            }
            Rule::Adam {
                beta1,
                beta2,
                eps,
                correction,
                decoupled_decay,
                m,
                v,
            } => {
                check_len(op, "m", m.len(), a.n);
                check_len(op, "v", v.len(), a.n);
                if decoupled_decay {
                    launch_rule!(adamw_update, [out m, out v, &beta1, &beta2, &eps, &correction])
                } else {
                    launch_rule!(adam_update, [out m, out v, &beta1, &beta2, &eps, &correction])
                }
            }
            Rule::Adadelta { rho, delta, h, u } => {
                check_len(op, "h", h.len(), a.n);
                check_len(op, "u", u.len(), a.n);
                launch_rule!(adadelta_update, [out h, out u, &rho, &delta])
            }
        }
    }
}
