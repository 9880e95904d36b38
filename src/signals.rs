//! Signals that steer training: SIGUSR1 asks for a snapshot, SIGHUP and SIGINT/SIGTERM do what
//! `[solver] sighup_effect` and `sigint_effect` say (snapshot, snapshot and stop, stop, nothing).
//!
//! The handler is async-signal-safe: it only increments one atomic counter per signal (and, for a
//! second SIGINT, calls `_exit(130)` unless `sigint_effect = "none"`). Everything else happens at iteration boundaries in the training loop:
//!
//! 1. [`SignalWatch::arrived`]: the first replica of each process reads the counters and reports
//!    which signals arrived since its last look, as four flags `[usr1, hup, int, term]`;
//!    the other replicas of the process report zeros, so each arrival is counted once.
//! 2. The replicas sum those flags (one 4-float all-reduce per iteration, skipped with a single
//!    replica): signals reach ranks at different moments (or only one rank, when sent to it
//!    directly), and the sum is the same on every replica.
//! 3. [`Effects::decide`] turns the agreed flags into the same [`Decision`] everywhere: every
//!    replica snapshots (or stops) after the same iteration.
//!
//! A stop exits every rank with `128 + signal number` (SIGTERM 143, SIGINT 130, SIGHUP 129),
//! after the snapshot when the effect includes one.

use crate::config::{SignalEffect, SolverConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The watched signals, in the order of the agreement flags.
const SIGNALS: [libc::c_int; 4] = [libc::SIGUSR1, libc::SIGHUP, libc::SIGINT, libc::SIGTERM];
const INT: usize = 2;

static COUNTS: [AtomicU64; 4] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];
/// Whether a second SIGINT ends the process at once (false when SIGINT is ignored).
static INT_EXITS: AtomicBool = AtomicBool::new(true);

/// The exit code of a run stopped by signal `sig`: `128 + sig`, as a shell reports it.
pub fn exit_code(sig: libc::c_int) -> i32 {
    128 + sig
}

extern "C" fn on_signal(sig: libc::c_int) {
    if let Some(i) = SIGNALS.iter().position(|&s| s == sig) {
        let before = COUNTS[i].fetch_add(1, Ordering::SeqCst);
        if i == INT && INT_EXITS.load(Ordering::Relaxed) && before > 0 {
            // SAFETY: _exit is async-signal-safe; a second Ctrl-C means "now".
            unsafe { libc::_exit(exit_code(libc::SIGINT)) };
        }
    }
}

/// Installs the handler for SIGUSR1, SIGHUP, SIGINT and SIGTERM (once per process; later calls
/// only update whether a second SIGINT exits at once).
pub fn install(cfg: &SolverConfig) -> std::io::Result<()> {
    INT_EXITS.store(cfg.sigint_effect != SignalEffect::None, Ordering::Relaxed);
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    for sig in SIGNALS {
        // SAFETY: the handler only touches atomics and calls _exit, both async-signal-safe; the
        // sigaction struct is fully initialised before use.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One replica's view of the signal counters.
#[derive(Debug, Clone)]
pub struct SignalWatch {
    /// Only the first replica of a process reads the counters.
    reads: bool,
    seen: [u64; 4],
}

impl SignalWatch {
    /// A watch that reports signals (`reads`, the first replica of its process) or only zeros.
    /// Signals that arrived before it was made are reported by its first [`Self::arrived`].
    pub fn new(reads: bool) -> Self {
        SignalWatch {
            reads,
            seen: [0; 4],
        }
    }

    /// `[usr1, hup, int, term]`: 1.0 for each signal that arrived since the last call.
    pub fn arrived(&mut self) -> [f64; 4] {
        let mut flags = [0.0; 4];
        if !self.reads {
            return flags;
        }
        for (i, f) in flags.iter_mut().enumerate() {
            let now = COUNTS[i].load(Ordering::SeqCst);
            if now > self.seen[i] {
                *f = 1.0;
                self.seen[i] = now;
            }
        }
        flags
    }
}

/// What the agreed signals make every replica do after the current iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    pub snapshot: bool,
    /// Stop with this exit code.
    pub stop: Option<i32>,
}

/// The effect of each watched signal.
#[derive(Debug, Clone, Copy)]
pub struct Effects {
    effects: [SignalEffect; 4],
}

impl Effects {
    /// SIGUSR1 snapshots; SIGHUP follows `sighup_effect`; SIGINT and SIGTERM `sigint_effect`.
    pub fn new(cfg: &SolverConfig) -> Self {
        Effects {
            effects: [
                SignalEffect::Snapshot,
                cfg.sighup_effect,
                cfg.sigint_effect,
                cfg.sigint_effect,
            ],
        }
    }

    /// The decision for the summed flags of every replica (see [`SignalWatch::arrived`]). The
    /// stop code is that of the strongest stopping signal: SIGTERM, then SIGINT, then SIGHUP.
    pub fn decide(&self, arrived: &[f64; 4]) -> Decision {
        let mut d = Decision::default();
        for i in 0..4 {
            if arrived[i] <= 0.0 {
                continue;
            }
            let (snapshot, stop) = match self.effects[i] {
                SignalEffect::SnapshotStop => (true, true),
                SignalEffect::Snapshot => (true, false),
                SignalEffect::Stop => (false, true),
                SignalEffect::None => (false, false),
            };
            d.snapshot |= snapshot;
            if stop {
                // Later entries are stronger (SIGHUP < SIGINT < SIGTERM).
                d.stop = Some(exit_code(SIGNALS[i]));
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> SolverConfig {
        toml::from_str(&format!("base_lr = 0.1\nmax_iter = 10\n{extra}")).unwrap()
    }

    #[test]
    fn defaults_snapshot_on_usr1_and_hup_and_stop_on_int_and_term() {
        let e = Effects::new(&cfg(""));
        let d = |f: [f64; 4]| e.decide(&f);
        assert_eq!(d([0.0; 4]), Decision::default());
        assert_eq!(
            d([1.0, 0.0, 0.0, 0.0]),
            Decision {
                snapshot: true,
                stop: None
            }
        );
        assert_eq!(
            d([0.0, 2.0, 0.0, 0.0]),
            Decision {
                snapshot: true,
                stop: None
            }
        );
        assert_eq!(
            d([0.0, 0.0, 1.0, 0.0]),
            Decision {
                snapshot: true,
                stop: Some(130)
            }
        );
        assert_eq!(
            d([0.0, 0.0, 1.0, 3.0]),
            Decision {
                snapshot: true,
                stop: Some(143)
            }
        );
    }

    #[test]
    fn configured_effects_apply() {
        let e = Effects::new(&cfg("sigint_effect = \"stop\"\nsighup_effect = \"none\""));
        assert_eq!(e.decide(&[0.0, 1.0, 0.0, 0.0]), Decision::default());
        assert_eq!(
            e.decide(&[0.0, 0.0, 0.0, 1.0]),
            Decision {
                snapshot: false,
                stop: Some(143)
            }
        );
        let e = Effects::new(&cfg("sighup_effect = \"stop\""));
        assert_eq!(
            e.decide(&[0.0, 1.0, 0.0, 0.0]),
            Decision {
                snapshot: false,
                stop: Some(129)
            }
        );
    }

    #[test]
    fn only_the_reading_replica_reports_and_each_arrival_once() {
        let mut reader = SignalWatch::new(true);
        let mut other = SignalWatch::new(false);
        reader.arrived();
        COUNTS[0].fetch_add(1, Ordering::SeqCst);
        assert_eq!(other.arrived(), [0.0; 4]);
        assert_eq!(reader.arrived()[0], 1.0);
        assert_eq!(reader.arrived()[0], 0.0);
    }
}
