//! `StepTimes`: where the time of a training step goes (Caffe's `caffe time`): data wait, forward,
//! backward, all-reduce and update, accumulated per replica and averaged over replicas. With a
//! `Timeline` attached, each phase is also recorded as a span (`p2ptrain train --timeline`).

use super::timeline::Timeline;
use crate::spans::Step;
use std::time::Instant;

/// Seconds spent per phase.
#[derive(Debug, Default)]
pub struct StepTimes {
    pub seconds: [f64; 5],
    enabled: bool,
    timeline: Option<Box<Timeline>>,
}

impl StepTimes {
    /// Timing is off unless enabled (a training run does not pay for it).
    pub fn new(enabled: bool) -> Self {
        StepTimes {
            seconds: [0.0; 5],
            enabled,
            timeline: None,
        }
    }

    /// Also records every phase into `timeline`, when there is one.
    pub fn with_timeline(mut self, timeline: Option<Timeline>) -> Self {
        self.timeline = timeline.map(Box::new);
        self
    }

    /// The attached timeline.
    pub fn timeline(&mut self) -> Option<&mut Timeline> {
        self.timeline.as_deref_mut()
    }

    /// Detaches the timeline.
    pub fn take_timeline(&mut self) -> Option<Timeline> {
        self.timeline.take().map(|t| *t)
    }

    /// Runs `f`, adding its duration to `phase`.
    pub fn time<T>(&mut self, phase: Step, f: impl FnOnce() -> T) -> T {
        self.timed(phase, |tl, start, end| tl.step(phase, start, end), f)
    }

    /// Runs `f`, local SGD's averaging: its time counts as all-reduce, and the timeline (if
    /// any) records it under its own name.
    pub fn average<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.timed(Step::AllReduce, |tl, start, end| tl.average(start, end), f)
    }

    /// Runs `f`, adding its duration to `phase` and handing its span to `record`.
    fn timed<T>(
        &mut self,
        phase: Step,
        record: impl FnOnce(&mut Timeline, Instant, Instant),
        f: impl FnOnce() -> T,
    ) -> T {
        if !self.enabled && self.timeline.is_none() {
            return f();
        }
        let t = Instant::now();
        let r = f();
        let end = Instant::now();
        if self.enabled {
            self.seconds[phase as usize] += (end - t).as_secs_f64();
        }
        if let Some(tl) = &mut self.timeline {
            record(tl, t, end);
        }
        r
    }

    /// Runs `f`, a test pass, recording it on the timeline if there is one.
    pub fn test<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let Some(tl) = &mut self.timeline else {
            return f();
        };
        let t = Instant::now();
        let r = f();
        tl.test(t, Instant::now());
        r
    }

    pub fn reset(&mut self) {
        self.seconds = [0.0; 5];
    }
}
