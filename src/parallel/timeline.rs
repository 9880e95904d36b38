//! Recording a replica's timeline (`p2ptrain train --timeline FILE`): spans of the step phases
//! (data wait, forward, backward, all-reduce, update) for the first `iters` iterations, every test
//! pass and every averaging of local SGD (the window starts at the first iteration the run executes, so a run that does not
//! start at iteration 0 is recorded too), and the engine's own finer spans (forward and backward per layer on the CPU; the
//! device's phases from CUDA events on a GPU) over the same window.
//!
//! Cost: nothing when off (`StepTimes` and the engines hold an `Option` checked once per span
//! site); when on, two clock reads and a push into a pre-allocated vector per span. Times are
//! nanoseconds since an origin taken right after a barrier of all replicas at the start, so the
//! spans of ranks on different hosts line up to within that barrier's skew. Rendering into the
//! Chrome trace format is `crate::chrome_trace`'s.

use super::engine::Engine;
use crate::error::Result;
use crate::spans::{Name, ReplicaTrace, SpanLog, Step, Track};
use std::time::Instant;

/// Spans a step records per iteration (data wait and forward/backward per sub-batch, all-reduce,
/// update), for the initial capacity.
const STEP_SPANS: usize = 8;

/// A replica's timeline while it is being recorded.
#[derive(Debug)]
pub struct Timeline {
    log: SpanLog,
    /// Iterations recorded in detail, from the first one the run executes.
    iters: u64,
    /// The first iteration seen by `begin_iter`.
    first: Option<u64>,
    iter: u64,
    /// Whether step and engine spans are still recorded (test passes always are).
    detailed: bool,
}

impl Timeline {
    /// Waits for every replica, takes the origin, and starts the engine's own spans: a
    /// collective, called by every replica at the same point.
    pub fn start<E: Engine>(engine: &mut E, iters: u64) -> Result<Timeline> {
        engine.barrier()?;
        let origin = Instant::now();
        engine.start_spans(origin, iters)?;
        Ok(Timeline {
            log: SpanLog::with_capacity(origin, iters as usize * STEP_SPANS + 64),
            iters,
            first: None,
            iter: 0,
            detailed: true,
        })
    }

    /// Records a step phase of the current iteration (inside the window).
    #[inline]
    pub fn step(&mut self, phase: Step, start: Instant, end: Instant) {
        if self.detailed {
            self.log
                .push(Name::Step(phase), Track::Host, start, end, self.iter);
        }
    }

    /// Records a test pass (always).
    pub fn test(&mut self, start: Instant, end: Instant) {
        self.log
            .push(Name::Test, Track::Host, start, end, self.iter);
    }

    /// Records local SGD's averaging of the parameters (always: it is rare).
    pub fn average(&mut self, start: Instant, end: Instant) {
        self.log
            .push(Name::Average, Track::Host, start, end, self.iter);
    }

    /// Marks the start of iteration `iter`; the first iteration past the window ends the
    /// detailed recording and collects the engine's spans.
    pub fn begin_iter<E: Engine>(&mut self, iter: u64, engine: &mut E) -> Result<()> {
        self.iter = iter;
        let first = *self.first.get_or_insert(iter);
        if self.detailed && iter >= first.saturating_add(self.iters) {
            self.end_detail(engine)?;
        }
        Ok(())
    }

    fn end_detail<E: Engine>(&mut self, engine: &mut E) -> Result<()> {
        self.detailed = false;
        if let Some(mut fine) = engine.take_spans()? {
            self.log.layer_names = std::mem::take(&mut fine.layer_names);
            self.log.spans.append(&mut fine.spans);
        }
        Ok(())
    }

    /// Ends recording (collecting the engine's spans if the window is still open).
    pub fn finish<E: Engine>(mut self, engine: &mut E) -> Result<ReplicaTrace> {
        if self.detailed {
            self.end_detail(engine)?;
        }
        Ok(ReplicaTrace {
            replica: engine.rank(),
            log: self.log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with(spans: &[(Name, Track, u64)]) -> SpanLog {
        let mut log = SpanLog::with_capacity(Instant::now(), spans.len());
        log.layer_names = vec!["conv".into(), "relu".into(), "loss".into()];
        for &(name, track, dur_ns) in spans {
            log.push_ns(name, track, 0, dur_ns, Some(0));
        }
        log
    }

    /// Layer spans are summed and counted per layer and direction; step spans are not layers.
    #[test]
    fn layer_sums_add_each_layers_passes() {
        let log = log_with(&[
            (Name::Forward(0), Track::Host, 2_000_000),
            (Name::Forward(0), Track::Host, 4_000_000),
            (Name::Backward(0), Track::Host, 5_000_000),
            (Name::Forward(2), Track::Host, 1_000_000),
            (Name::Step(Step::Forward), Track::Host, 9_000_000),
        ]);
        let sums = log.layer_sums();
        assert_eq!(sums.len(), 12);
        assert_eq!(&sums[0..4], &[0.006, 2.0, 0.005, 1.0]);
        assert_eq!(&sums[4..8], &[0.0; 4], "relu never ran");
        assert_eq!(&sums[8..12], &[0.001, 1.0, 0.0, 0.0]);
    }

    /// Where the device timed the layers, the host's spans of the same layers are not added.
    #[test]
    fn layer_sums_prefer_the_device_clock() {
        let log = log_with(&[
            (Name::Forward(1), Track::Host, 7_000_000),
            (Name::Forward(1), Track::Device, 3_000_000),
        ]);
        assert_eq!(&log.layer_sums()[4..6], &[0.003, 1.0]);
    }
}
