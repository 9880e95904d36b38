//! `[solver]`: rates, iteration counts, the update rule's and the lr policy's keys.

use super::*;
use crate::config::{LrPolicy, SolverType};

impl Validator<'_> {
    pub(super) fn solver(&self) -> Result<()> {
        let s = &self.cfg.solver;
        self.positive("solver.base_lr", s.base_lr)?;
        self.fraction("solver.momentum", s.momentum)?;
        self.non_negative("solver.weight_decay", s.weight_decay)?;
        self.at_least_one("solver.max_iter", s.max_iter)?;
        self.at_least_one("solver.iter_size", s.iter_size)?;
        self.at_least_one("solver.average_loss", s.average_loss)?;
        // Record positions are 64-bit counts: the samples one replica reads must fit well within.
        let samples = s
            .max_iter
            .checked_mul(s.iter_size)
            .and_then(|v| v.checked_mul(self.cfg.data.batch_size as u64))
            .filter(|&v| v <= MAX_SAMPLES);
        if samples.is_none() {
            return Err(self.err(
                "solver.max_iter",
                format!(
                    "max_iter {} × iter_size {} × batch_size {} records per replica exceeds 2^62",
                    s.max_iter, s.iter_size, self.cfg.data.batch_size
                ),
            ));
        }
        if let Some(t) = s.test_iter {
            self.at_least_one("solver.test_iter", t)?;
        }
        self.finite("solver.clip_gradients", s.clip_gradients)?;
        if s.snapshot_prefix.trim().is_empty() {
            return Err(self.err("solver.snapshot_prefix", "must not be empty"));
        }
        match s.solver_type {
            SolverType::Sgd | SolverType::Nesterov => {}
            SolverType::Adagrad => self.positive("solver.delta", s.delta)?,
            SolverType::Rmsprop => {
                self.positive("solver.delta", s.delta)?;
                self.fraction("solver.rms_decay", s.rms_decay)?;
            }
            SolverType::Adam | SolverType::Adamw => {
                self.fraction("solver.momentum2", s.momentum2)?;
                self.positive("solver.delta", s.delta)?;
            }
            SolverType::Adadelta => self.positive("solver.delta", s.delta)?,
        }
        self.lr_policy()
    }

    fn lr_policy(&self) -> Result<()> {
        let s = &self.cfg.solver;
        let policy = format!("lr_policy \"{}\"", name_of(&s.lr_policy));
        let needs = |key: &str, what: &str, got: String| {
            self.err(
                &format!("solver.{key}"),
                format!("{policy} needs `{key}` {what}, got {got}"),
            )
        };
        let gamma_positive = || {
            if s.gamma.is_finite() && s.gamma > 0.0 {
                Ok(())
            } else {
                Err(needs("gamma", "> 0", s.gamma.to_string()))
            }
        };
        let power_positive = || {
            if s.power.is_finite() && s.power > 0.0 {
                Ok(())
            } else {
                Err(needs("power", "> 0", s.power.to_string()))
            }
        };
        let stepsize_positive = || {
            if s.stepsize > 0 {
                Ok(())
            } else {
                Err(needs("stepsize", "> 0", "0".into()))
            }
        };
        match s.lr_policy {
            LrPolicy::Fixed => Ok(()),
            LrPolicy::Step => {
                stepsize_positive()?;
                gamma_positive()
            }
            LrPolicy::Multistep => {
                if s.stepvalue.is_empty() {
                    return Err(needs(
                        "stepvalue",
                        "(a non-empty list of iterations)",
                        "[]".into(),
                    ));
                }
                if let Some(w) = s.stepvalue.windows(2).position(|w| w[0] >= w[1]) {
                    return Err(self.src.error_at(
                        "solver.stepvalue",
                        &format!("solver.stepvalue[{}]", w + 1),
                        format!("must be strictly increasing, got {:?}", s.stepvalue),
                    ));
                }
                gamma_positive()
            }
            LrPolicy::Exp => gamma_positive(),
            LrPolicy::Inv => {
                gamma_positive()?;
                power_positive()
            }
            LrPolicy::Poly => power_positive(),
            LrPolicy::Sigmoid => {
                if !(s.gamma.is_finite() && s.gamma != 0.0) {
                    return Err(needs(
                        "gamma",
                        "≠ 0 (the slope; negative decays)",
                        s.gamma.to_string(),
                    ));
                }
                stepsize_positive()
            }
            LrPolicy::Cosine => Ok(()),
        }
    }
}
