//! Loss scaling (`cluster.loss_scale`): the factor the loss gradient is multiplied by at the top
//! of backward, so that small gradients survive fp16's range, and its dynamic rule.
//!
//! One step, as an engine drives it:
//!
//! 1. backward seeds every loss top's gradient with `loss_weight × scale`
//!    ([`crate::net::Net::set_loss_scale`]); the parameter gradients come out `scale` times too
//!    large (in FP32);
//! 2. the gradients are all-reduced; the averaged gradient is the same bits on every replica;
//! 3. [`LossScaler::verdict`] looks at it: finite, the step goes on, its gradient divided by
//!    `scale` ([`LossScaler::unscale`], exact for a power of two) before the update rule;
//!    not finite, under the dynamic rule with a scale above 1, the step is skipped (no update,
//!    weights and solver history unchanged) and the scale multiplied by `loss_scale_backoff`
//!    (at least 1). Because every replica sees the same averaged gradient, every replica skips
//!    the same iterations and keeps the same scale without a collective of its own;
//! 4. after `loss_scale_growth_interval` finite steps in a row, the scale doubles (while it
//!    stays finite).
//!
//! A non-finite gradient the scale cannot explain — a fixed scale, no scaling, or the dynamic
//! scale already at 1 — is left to `[solver] non_finite` (`super::non_finite`).
//!
//! The scale, the run of good steps and the count of skipped steps are solver state: a snapshot
//! keeps them ([`LossScaleState`]) and a resume under loss scaling restores them.

use crate::config::{ClusterConfig, LossScale, MathMode};

/// How the scale moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// No scaling: the scale is 1.
    Off,
    /// A fixed scale.
    Fixed,
    /// Backed off on overflow, doubled after `growth_interval` good steps.
    Dynamic { growth_interval: u64, backoff: f32 },
}

/// The state of loss scaling a snapshot keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaleState {
    /// The factor of the next step.
    pub scale: f32,
    /// Finite steps in a row since the scale last changed.
    pub good_steps: u64,
    /// Steps skipped for an overflow since the run (or its first ancestor) started.
    pub skipped: u64,
}

/// What the averaged gradient of a step says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Finite: unscale and update.
    Apply,
    /// An overflow under the dynamic rule: skip the update, the scale has been backed off.
    Overflow,
    /// Not finite, and the scale cannot be blamed: `[solver] non_finite` decides.
    NonFinite,
}

/// The smallest dynamic scale: below it, scaling would shrink gradients instead of saving them.
pub const MIN_SCALE: f32 = 1.0;
/// The dynamic scale's growth factor.
pub const GROWTH: f32 = 2.0;

/// Loss scaling of one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    rule: Rule,
    state: LossScaleState,
}

impl LossScaler {
    /// The scaler `cluster` asks for: `loss_scale` when set, else dynamic with
    /// `math = "fp16"` and off otherwise.
    pub fn new(cluster: &ClusterConfig) -> Self {
        let dynamic = Rule::Dynamic {
            growth_interval: cluster.loss_scale_growth_interval.max(1),
            backoff: cluster.loss_scale_backoff,
        };
        let (rule, scale) = match cluster.loss_scale {
            Some(LossScale::Fixed(s)) => (Rule::Fixed, s),
            Some(LossScale::Dynamic) => (dynamic, cluster.loss_scale_init),
            None if cluster.math == MathMode::Fp16 => (dynamic, cluster.loss_scale_init),
            None => (Rule::Off, 1.0),
        };
        LossScaler {
            rule,
            state: LossScaleState {
                scale,
                good_steps: 0,
                skipped: 0,
            },
        }
    }

    /// No scaling (a scale of 1).
    pub fn off() -> Self {
        LossScaler {
            rule: Rule::Off,
            state: LossScaleState {
                scale: 1.0,
                good_steps: 0,
                skipped: 0,
            },
        }
    }

    /// How the scale moves.
    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// Whether the loss is scaled at all.
    pub fn is_on(&self) -> bool {
        self.rule != Rule::Off
    }

    /// The factor of the current step's loss gradient (1 when off).
    pub fn scale(&self) -> f32 {
        self.state.scale
    }

    /// The state to snapshot; `None` when scaling is off.
    pub fn state(&self) -> Option<LossScaleState> {
        self.is_on().then_some(self.state)
    }

    /// Restores a snapshot's state under the dynamic rule (a fixed or no scale keeps its own;
    /// the count of skipped steps is kept either way).
    pub fn restore(&mut self, state: &LossScaleState) {
        if let Rule::Dynamic { .. } = self.rule {
            self.state.scale = state.scale;
            self.state.good_steps = state.good_steps;
        }
        self.state.skipped = state.skipped;
    }

    /// Judges the averaged gradient of a step (`finite`: no NaN or infinity in it) and moves
    /// the scale as the rule says.
    pub fn verdict(&mut self, finite: bool) -> Verdict {
        let Rule::Dynamic {
            growth_interval,
            backoff,
        } = self.rule
        else {
            return match finite {
                true => Verdict::Apply,
                false => Verdict::NonFinite,
            };
        };
        let s = &mut self.state;
        if !finite {
            if s.scale <= MIN_SCALE {
                return Verdict::NonFinite;
            }
            s.scale = (s.scale * backoff).max(MIN_SCALE);
            s.good_steps = 0;
            s.skipped += 1;
            return Verdict::Overflow;
        }
        s.good_steps += 1;
        if s.good_steps >= growth_interval {
            s.good_steps = 0;
            if (s.scale * GROWTH).is_finite() {
                s.scale *= GROWTH;
            }
        }
        Verdict::Apply
    }

    /// Divides the scaled gradient by the scale of the step it came from (nothing when off).
    /// Call it after [`LossScaler::verdict`] said `Apply`: the verdict of a good step may
    /// already have grown the scale, so the factor is taken from `step_scale`.
    pub fn unscale(step_scale: f32, diff: &mut [f32]) {
        if step_scale != 1.0 {
            let inverse = 1.0 / step_scale;
            diff.iter_mut().for_each(|g| *g *= inverse);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(math: MathMode, set: impl FnOnce(&mut ClusterConfig)) -> ClusterConfig {
        let mut c = ClusterConfig {
            math,
            ..Default::default()
        };
        set(&mut c);
        c
    }

    #[test]
    fn fp16_scales_dynamically_by_default_and_the_others_do_not() {
        let fp16 = LossScaler::new(&cluster(MathMode::Fp16, |_| {}));
        assert!(fp16.is_on());
        assert_eq!(fp16.scale(), 65536.0);
        for math in [MathMode::Fp32, MathMode::Tf32, MathMode::Bf16] {
            let s = LossScaler::new(&cluster(math, |_| {}));
            assert!(!s.is_on());
            assert_eq!((s.scale(), s.state()), (1.0, None));
        }
        let fixed = LossScaler::new(&cluster(MathMode::Bf16, |c| {
            c.loss_scale = Some(LossScale::Fixed(128.0))
        }));
        assert_eq!(fixed.scale(), 128.0);
    }

    #[test]
    fn off_scales_nothing_and_keeps_no_state() {
        let off = LossScaler::off();
        assert_eq!((off.is_on(), off.scale(), off.state()), (false, 1.0, None));
        assert_eq!(off, LossScaler::new(&cluster(MathMode::Fp32, |_| {})));
        assert_eq!(off.rule(), Rule::Off);
    }

    #[test]
    fn overflows_back_off_and_good_runs_grow_the_dynamic_scale() {
        let mut s = LossScaler::new(&cluster(MathMode::Fp16, |c| {
            c.loss_scale_init = 8.0;
            c.loss_scale_growth_interval = 3;
        }));
        assert_eq!(s.verdict(true), Verdict::Apply);
        assert_eq!(s.verdict(false), Verdict::Overflow);
        assert_eq!(s.scale(), 4.0);
        for _ in 0..2 {
            assert_eq!(s.verdict(true), Verdict::Apply);
        }
        assert_eq!(s.scale(), 4.0);
        assert_eq!(s.verdict(true), Verdict::Apply);
        assert_eq!(s.scale(), 8.0);
        for _ in 0..3 {
            s.verdict(false);
        }
        assert_eq!(s.scale(), MIN_SCALE);
        assert_eq!(s.verdict(false), Verdict::NonFinite);
        assert_eq!(s.state().unwrap().skipped, 4);
    }

    #[test]
    fn a_fixed_scale_never_moves_and_leaves_non_finite_steps_to_the_policy() {
        let mut s = LossScaler::new(&cluster(MathMode::Fp16, |c| {
            c.loss_scale = Some(LossScale::Fixed(1024.0))
        }));
        assert_eq!(s.verdict(false), Verdict::NonFinite);
        assert_eq!(s.verdict(true), Verdict::Apply);
        assert_eq!(s.scale(), 1024.0);
    }

    #[test]
    fn unscaling_by_a_power_of_two_is_exact() {
        let mut g = [3.0f32 * 1024.0, -0.1 * 1024.0];
        LossScaler::unscale(1024.0, &mut g);
        assert_eq!(g, [3.0, -0.1f32 * 1024.0 / 1024.0]);
        let mut same = [0.1f32];
        LossScaler::unscale(1.0, &mut same);
        assert_eq!(same, [0.1]);
    }

    #[test]
    fn a_restored_state_continues_where_it_was() {
        let c = cluster(MathMode::Fp16, |_| {});
        let mut s = LossScaler::new(&c);
        s.verdict(false);
        s.verdict(true);
        let mut resumed = LossScaler::new(&c);
        resumed.restore(&s.state().unwrap());
        assert_eq!(resumed, s);
    }
}
