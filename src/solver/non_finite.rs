//! Steps whose numbers are not finite. A replica whose loss of an iteration is NaN or infinite
//! poisons its gradient (one element set to NaN) before the all-reduce, so the averaged gradient
//! — the same bits on every replica — holds a non-finite value exactly when some replica's loss
//! or gradient did: every replica reaches the same verdict at the same iteration without a
//! collective of its own. A step whose averaged gradient is not finite applies no update (weights
//! and solver history stay as they were); `[solver] non_finite` says what follows:
//!
//! - `"stop"` (default): every later update is refused too, and the loop fails at its next look
//!   at the record, naming the first such iteration (exit 1); no snapshot is written after it.
//!   The loop looks after every step on the CPU and with several GPU replicas (whose host waits
//!   for the device at the signal agreement anyway); a GPU replica alone keeps the record in
//!   device memory until the next display, snapshot or signal stop, where the host waits too.
//! - `"skip"`: training goes on; universal rank 0 logs each skipped step and counts it in
//!   `metrics.jsonl` (`{"iter", "phase": "skip", "steps", "skipped_total"}`).
//!
//! GPU replicas that update bucket by bucket behind the backward (`crate::cuda::update::Part`,
//! `stop` mode only) judge each gradient element as its bucket's update reads it: a non-finite
//! loss poisons the first element of the first bucket, so nothing of that step is applied, but
//! a gradient that is not finite elsewhere leaves the elements beside it in its bucket, and the
//! buckets before it, updated in device memory (never a non-finite element). The run stops at
//! its next look at the record, and nothing after the step is written.
//!
//! Snapshots are checked as well: every replica checks its weights (identical on all of them)
//! before one is written, so an update that overflowed to an infinity never reaches a file.

use crate::config::NonFiniteMode;
use crate::error::{Error, Result};
use crate::params::Params;

/// The environment variable that makes one replica's loss NaN at one iteration
/// (`RANK:ITER`, as `P2PTRAIN_INJECT_PANIC`): failure injection for the tests.
pub const INJECT_NAN: &str = "P2PTRAIN_INJECT_NAN";

/// The non-finite steps an engine has refused so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NonFiniteSteps {
    /// Steps whose update was refused for a non-finite averaged gradient.
    pub count: u64,
    /// The first such iteration.
    pub first: Option<u64>,
    /// The latest such iteration.
    pub last: Option<u64>,
    /// What was not finite at `first`, where the engine knows it cheaply.
    pub culprit: Option<String>,
}

impl NonFiniteSteps {
    /// Records iteration `iter` as refused, `culprit` saying what was not finite (kept for the
    /// first one only).
    pub fn record(&mut self, iter: u64, culprit: impl FnOnce() -> String) {
        if self.first.is_none() {
            self.first = Some(iter);
            self.culprit = Some(culprit());
        }
        self.last = Some(iter);
        self.count += 1;
    }

    /// Whether the update of a step must be refused: its averaged gradient is not finite, or, in
    /// `stop` mode, an earlier step's was (the weights stay those before the first one).
    pub fn refuses(&self, mode: NonFiniteMode, gradient_finite: bool) -> bool {
        !gradient_finite || (mode == NonFiniteMode::Stop && self.count > 0)
    }

    /// The error that stops a job in `stop` mode once a step was refused; `None` if none was.
    pub fn stop_error(&self) -> Option<Error> {
        let iter = self.first?;
        let what = self
            .culprit
            .as_deref()
            .unwrap_or("the loss or the averaged gradient");
        Some(Error::NotFinite(format!(
            "iteration {iter}: {what} is not finite (NaN or infinite); training stopped with the \
             weights from before it, no snapshot written after it (`[solver] non_finite = \
             \"skip\"` skips such steps instead)"
        )))
    }
}

impl NonFiniteSteps {
    /// This record of universal rank `rank` as the all-reduce input that merges every replica's
    /// ([`NonFiniteSteps::merged`]): `[count, first + 1, last + 1]` (0: none) in slots
    /// `3·rank..3·rank + 3` of `3 × size` zeros. Local SGD needs it: between averagings a
    /// replica refuses its own steps, not the others'.
    pub fn slots(&self, rank: usize, size: usize) -> Vec<f64> {
        let mut v = vec![0.0; 3 * size];
        let at = |i: Option<u64>| i.map_or(0.0, |i| (i + 1) as f64);
        v[3 * rank..3 * rank + 3].copy_from_slice(&[
            self.count as f64,
            at(self.first),
            at(self.last),
        ]);
        v
    }

    /// The job's record from the summed [`NonFiniteSteps::slots`] of every replica: the counts
    /// added, the earliest first and the latest last iteration; the culprit is this replica's
    /// where its first is the job's, else the earliest replica that refused that iteration.
    pub fn merged(&self, summed: &[f64]) -> NonFiniteSteps {
        let per: Vec<&[f64]> = summed.chunks_exact(3).collect();
        let iter = |x: f64| (x > 0.0).then(|| x as u64 - 1);
        let first = per.iter().filter_map(|p| iter(p[1])).min();
        let culprit = match first {
            None => None,
            Some(f) if self.first == Some(f) => self.culprit.clone(),
            Some(f) => per
                .iter()
                .position(|p| iter(p[1]) == Some(f))
                .map(|r| format!("the loss or the gradient of replica {r}")),
        };
        NonFiniteSteps {
            count: per.iter().map(|p| p[0] as u64).sum(),
            first,
            last: per.iter().filter_map(|p| iter(p[2])).max(),
            culprit,
        }
    }
}

/// The index of the first NaN or infinity in `values`.
pub fn first_non_finite(values: &[f32]) -> Option<usize> {
    values.iter().position(|v| !v.is_finite())
}

/// `what` of the tensor of `params` holding flat element `index`, e.g. "the averaged gradient of
/// `ip1.weight`".
pub fn name_element(params: &Params, index: usize, what: &str) -> String {
    match params.spans.iter().find(|s| s.range().contains(&index)) {
        Some(s) => format!("{what} of `{}`", s.full_name),
        None => what.to_string(),
    }
}

/// Fails when `params` (the weights about to be snapshotted after `iter` iterations) holds a
/// non-finite value, naming the tensor.
pub fn check_weights(params: &Params, iter: u64) -> Result<()> {
    match first_non_finite(&params.data) {
        None => Ok(()),
        Some(i) => Err(Error::NotFinite(format!(
            "after iteration {iter}: {} is not finite (NaN or infinite); training stopped, no \
             snapshot written (lower `solver.base_lr`, or clip with `solver.clip_gradients`)",
            name_element(params, i, "the weights")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FillerConfig;
    use crate::params::ParamSpan;

    fn params(values: &[f32]) -> Params {
        let span = |name: &str, len: usize| ParamSpan {
            layer: 0,
            full_name: name.into(),
            shape: vec![len],
            offset: 0,
            len,
            lr_mult: 1.0,
            decay_mult: 1.0,
            filler: FillerConfig::constant(0.0),
        };
        let mut p = Params::new(vec![span("ip.weight", 3), span("ip.bias", 2)]);
        p.data.copy_from_slice(values);
        p
    }

    #[test]
    fn stop_refuses_every_update_after_the_first_non_finite_step() {
        let mut steps = NonFiniteSteps::default();
        assert!(!steps.refuses(NonFiniteMode::Stop, true));
        assert!(steps.stop_error().is_none());
        steps.record(7, || "the loss of replica 1".into());
        steps.record(9, || unreachable!("only the first culprit is kept"));
        assert_eq!(
            (steps.count, steps.first, steps.last),
            (2, Some(7), Some(9))
        );
        assert!(steps.refuses(NonFiniteMode::Stop, true));
        assert!(!steps.refuses(NonFiniteMode::Skip, true));
        assert!(steps.refuses(NonFiniteMode::Skip, false));
        let err = steps.stop_error().unwrap();
        assert_eq!(err.exit_code(), 1);
        assert!(err
            .to_string()
            .starts_with("iteration 7: the loss of replica 1 is not finite"));
    }

    #[test]
    fn non_finite_weights_are_named_by_tensor() {
        let mut values = [0.5; 5];
        assert!(check_weights(&params(&values), 3).is_ok());
        values[4] = f32::INFINITY;
        let p = params(&values);
        let at = first_non_finite(&p.data).unwrap();
        assert_eq!(
            name_element(&p, at, "the weights"),
            "the weights of `ip.bias`"
        );
        let err = check_weights(&p, 3).unwrap_err().to_string();
        assert!(err.contains("after iteration 3"), "{err}");
        assert!(err.contains("`ip.bias`"), "{err}");
    }

    #[test]
    fn merged_records_add_counts_and_name_the_earliest_replica() {
        let mut a = NonFiniteSteps::default();
        a.record(9, || "mine".into());
        let mut b = NonFiniteSteps::default();
        b.record(4, || "theirs".into());
        b.record(6, || unreachable!("only the first culprit is kept"));
        let quiet = NonFiniteSteps::default();
        let mut sum = vec![0.0; 9];
        for (rank, r) in [(0, &quiet), (1, &b), (2, &a)] {
            for (s, x) in sum.iter_mut().zip(r.slots(rank, 3)) {
                *s += x;
            }
        }
        let seen_by_a = a.merged(&sum);
        assert_eq!(
            (seen_by_a.count, seen_by_a.first, seen_by_a.last),
            (3, Some(4), Some(9))
        );
        assert_eq!(
            seen_by_a.culprit.as_deref(),
            Some("the loss or the gradient of replica 1")
        );
        assert_eq!(b.merged(&sum).culprit.as_deref(), Some("theirs"));
        assert_eq!(quiet.merged(&[0.0; 9]), NonFiniteSteps::default());
    }
}
