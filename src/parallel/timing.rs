//! `StepTimes`: where the time of a training step goes (Caffe's `caffe time`): data wait, forward,
//! backward, all-reduce and update, accumulated per replica and averaged over replicas.

use std::time::Instant;

/// The phases of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Data,
    Forward,
    Backward,
    AllReduce,
    Update,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Data,
        Phase::Forward,
        Phase::Backward,
        Phase::AllReduce,
        Phase::Update,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Phase::Data => "data wait",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::AllReduce => "all-reduce",
            Phase::Update => "update",
        }
    }
}

/// Seconds spent per phase.
#[derive(Debug, Clone, Default)]
pub struct StepTimes {
    pub seconds: [f64; 5],
    enabled: bool,
}

impl StepTimes {
    /// Timing is off unless enabled (a training run does not pay for it).
    pub fn new(enabled: bool) -> Self {
        StepTimes {
            seconds: [0.0; 5],
            enabled,
        }
    }

    /// Runs `f`, adding its duration to `phase`.
    pub fn time<T>(&mut self, phase: Phase, f: impl FnOnce() -> T) -> T {
        if !self.enabled {
            return f();
        }
        let t = Instant::now();
        let r = f();
        self.seconds[phase as usize] += t.elapsed().as_secs_f64();
        r
    }

    pub fn reset(&mut self) {
        self.seconds = [0.0; 5];
    }
}
