//! How often the replicas of a training run agree on signals ([`AgreementSchedule`]).
//!
//! An agreement is a collective over host values (each replica's signal counters). On GPUs it is
//! ordered after the step on the device, so the host waits there for the device, and the device
//! then idles until the host has launched the next step: after every step, that costs a step of a
//! millisecond (mlp4096 on 4 GPUs) a few percent. Signals need no such haste: Slurm leaves
//! seconds between SIGTERM and SIGKILL.
//!
//! So the replicas agree after each of a run's first [`PROBE_STEPS`] steps (a signal sent before
//! training is acted on after the first), then take their mean wall time per step over the last
//! [`MEASURED_STEPS`] of those (one collective), and from there agree every `interval` steps: the
//! fewest that last [`AGREEMENT_PERIOD`], at least 1 and at most [`MAX_INTERVAL`]
//! ([`interval_for`]). Every replica derives the interval from the same mean, so all reach the
//! collectives at the same iterations. The refused-step record, read where the host has waited
//! for the device anyway, is read at the agreements too.

use std::time::{Duration, Instant};

/// Steps after each of which a run's replicas agree before the interval is set.
pub const PROBE_STEPS: u64 = 20;
/// The last steps of the probe whose wall time sets the interval.
pub const MEASURED_STEPS: u64 = 10;
/// The least time between two agreements once the interval is set.
pub const AGREEMENT_PERIOD: Duration = Duration::from_millis(25);
/// The most steps between two agreements.
pub const MAX_INTERVAL: u64 = 1000;

/// Steps between two agreements for a mean step of `step_seconds`: the fewest that last
/// [`AGREEMENT_PERIOD`], within 1 ..= [`MAX_INTERVAL`] (1 for a time that is not a positive
/// number).
pub fn interval_for(step_seconds: f64) -> u64 {
    if step_seconds.is_nan() || step_seconds <= 0.0 {
        return 1;
    }
    let steps = (AGREEMENT_PERIOD.as_secs_f64() / step_seconds).ceil();
    (steps.min(MAX_INTERVAL as f64) as u64).max(1)
}

/// When the replicas agree, for a run whose first iteration is `first`; see the module docs.
#[derive(Debug, Clone)]
pub struct AgreementSchedule {
    first: u64,
    /// Steps between agreements after the probe (1 until it is set).
    interval: u64,
    /// The end of the step before the measured ones.
    measured_from: Option<Instant>,
}

impl AgreementSchedule {
    pub fn new(first: u64) -> Self {
        AgreementSchedule {
            first,
            interval: 1,
            measured_from: None,
        }
    }

    /// Whether the replicas agree after iteration `iter` (at or after the first).
    pub fn due(&self, iter: u64) -> bool {
        let done = iter + 1 - self.first;
        done <= PROBE_STEPS || (done - PROBE_STEPS).is_multiple_of(self.interval)
    }

    /// Notes the end of iteration `iter`'s agreement at `now`. At the probe's last step, this
    /// replica's mean wall time per measured step, in seconds: the loop averages it over every
    /// replica (a collective) and hands the mean to [`AgreementSchedule::set_interval`].
    pub fn after_agreement(&mut self, iter: u64, now: Instant) -> Option<f64> {
        let done = iter + 1 - self.first;
        if done == PROBE_STEPS - MEASURED_STEPS {
            self.measured_from = Some(now);
        }
        let from = self.measured_from.filter(|_| done == PROBE_STEPS)?;
        Some((now - from).as_secs_f64() / MEASURED_STEPS as f64)
    }

    /// Sets the interval from the replicas' mean step time, in seconds.
    pub fn set_interval(&mut self, mean_step_seconds: f64) {
        self.interval = interval_for(mean_step_seconds);
    }

    /// Steps between agreements after the probe.
    pub fn interval(&self) -> u64 {
        self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_spans_the_agreement_period() {
        // 1 ms steps: 25 of them; 10 ms: 3; a step longer than the period: every step.
        assert_eq!(interval_for(0.001), 25);
        assert_eq!(interval_for(0.010), 3);
        assert_eq!(interval_for(0.030), 1);
        assert_eq!(interval_for(1e-9), MAX_INTERVAL);
        assert_eq!(interval_for(0.0), 1);
        assert_eq!(interval_for(f64::NAN), 1);
        assert_eq!(interval_for(-1.0), 1);
    }

    /// Every step of the probe agrees, then every `interval`-th; the probe's mean step is taken
    /// over its last `MEASURED_STEPS`, whatever the first iteration (a resumed run).
    #[test]
    fn agreements_fall_on_the_probe_then_on_the_interval() {
        for first in [0u64, 7, 1000] {
            let mut s = AgreementSchedule::new(first);
            let t0 = Instant::now();
            let mut asked = None;
            for k in 0..PROBE_STEPS {
                let iter = first + k;
                assert!(s.due(iter), "probe step {k}");
                let now = t0 + Duration::from_millis(2 * (k + 1));
                if let Some(m) = s.after_agreement(iter, now) {
                    assert_eq!(k + 1, PROBE_STEPS);
                    asked = Some(m);
                }
            }
            let mean = asked.expect("the probe's last step asks for the mean");
            assert!((mean - 0.002).abs() < 1e-9, "{mean}");
            s.set_interval(mean);
            assert_eq!(s.interval(), 13);
            let after = first + PROBE_STEPS;
            let due: Vec<u64> = (after..after + 40).filter(|&i| s.due(i)).collect();
            assert_eq!(due, vec![after + 12, after + 25, after + 38]);
        }
    }
}
