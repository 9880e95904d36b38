//! Signals that steer training: SIGUSR1 asks for a snapshot, SIGHUP and SIGINT/SIGTERM do what
//! `[solver] sighup_effect` and `sigint_effect` say (snapshot, snapshot and stop, stop, nothing).
//!
//! The handlers are installed first thing in a training run ([`install_early`]), before MPI
//! starts and the config is read, so that a signal sent at once is counted rather than fatal; its
//! effect, which the config decides, applies at the first iteration boundary.
//!
//! The handler is async-signal-safe: it only increments one atomic counter per signal (and, for a
//! second SIGINT, unlinks the snapshot temporaries being written — see [`PendingFile`] — and
//! calls `_exit(130)` unless `sigint_effect = "none"`). Everything else happens at iteration
//! boundaries in the training loop:
//!
//! 1. [`SignalWatch::counts`]: the first replica of each process reports how many of each signal
//!    `[usr1, hup, int, term]` its process has received; the other replicas report zeros.
//! 2. The replicas take the maximum of those counts over the job (a gather through one small
//!    all-reduce sum of `4 × replicas` floats per iteration, skipped with a single replica), so
//!    every replica sees the same maxima although signals reach ranks at different moments.
//! 3. [`SignalWatch::agreed`]: a signal is a new request when its maximum count exceeds the count
//!    the job has acted on. A signal mpirun or Slurm forwards to every rank raises every rank's
//!    count by one: one request, even when it reaches the ranks on either side of an iteration
//!    boundary. A signal sent to one rank directly is a request too (that rank's count rises
//!    above the others'); signals sent directly to different ranks count by position (the k-th
//!    signal of any rank is the job's k-th).
//! 4. [`Effects::decide`] turns the agreed flags into the same [`Decision`] everywhere: every
//!    replica snapshots (or stops) after the same iteration.
//!
//! A stop exits every rank with `128 + signal number` (SIGTERM 143, SIGINT 130, SIGHUP 129),
//! after the snapshot when the effect includes one.

use crate::config::{SignalEffect, SolverConfig};
use std::cell::UnsafeCell;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

/// The watched signals, in the order of the agreement flags.
const SIGNALS: [libc::c_int; 4] = [libc::SIGUSR1, libc::SIGHUP, libc::SIGINT, libc::SIGTERM];
const INT: usize = 2;
/// The signals that stop a run (or a launcher's shutdown of it): SIGHUP, SIGINT, SIGTERM.
const STOPPING: [usize; 3] = [1, 2, 3];

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

/// Set once the job has agreed to stop (see [`note_stop_decided`]).
static STOP_DECIDED: AtomicBool = AtomicBool::new(false);

/// Whether this process has received SIGHUP, SIGINT or SIGTERM, or its job has agreed to stop:
/// from then on its output must never hold it up (see `logging`), a launcher shutting the job
/// down may have stopped reading.
pub fn stop_signalled() -> bool {
    STOP_DECIDED.load(Ordering::Relaxed)
        || STOPPING
            .iter()
            .any(|&i| COUNTS[i].load(Ordering::Relaxed) > 0)
}

/// Records that the job has agreed to stop (a signal another rank received): this process's
/// output no longer waits either.
pub fn note_stop_decided() {
    STOP_DECIDED.store(true, Ordering::Relaxed);
}

extern "C" fn on_signal(sig: libc::c_int) {
    if let Some(i) = SIGNALS.iter().position(|&s| s == sig) {
        let before = COUNTS[i].fetch_add(1, Ordering::SeqCst);
        if i == INT && INT_EXITS.load(Ordering::Relaxed) && before > 0 {
            unlink_pending_files();
            // SAFETY: _exit is async-signal-safe; a second Ctrl-C means "now".
            unsafe { libc::_exit(exit_code(libc::SIGINT)) };
        }
    }
}

/// Installs the handler for SIGUSR1, SIGHUP, SIGINT and SIGTERM before anything else of a
/// training run: signals are counted from then on; a second SIGINT exits at once until
/// [`install`] applies the config.
pub fn install_early() -> std::io::Result<()> {
    set_handlers()
}

/// Installs the handlers again (in case a library replaced them while starting) and applies the
/// config: whether a second SIGINT exits at once (not when SIGINT is ignored).
pub fn install(cfg: &SolverConfig) -> std::io::Result<()> {
    INT_EXITS.store(cfg.sigint_effect != SignalEffect::None, Ordering::Relaxed);
    set_handlers()
}

fn set_handlers() -> std::io::Result<()> {
    for sig in SIGNALS {
        // SAFETY: the handler only touches atomics and calls unlink and _exit, all
        // async-signal-safe; the
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

/// Slots for the paths of files being written that a second SIGINT removes.
const PENDING_SLOTS: usize = 8;
/// The longest path a slot holds, with its NUL.
const PENDING_PATH_BYTES: usize = 4096;
const SLOT_FREE: u8 = 0;
/// Taken by one thread (registering it, or the handler unlinking it).
const SLOT_BUSY: u8 = 1;
/// Holds the NUL-terminated path of a file being written.
const SLOT_READY: u8 = 2;

/// One registered path. Its bytes are written only by the thread that moved the state from free
/// to busy, and read only by the handler that moved it from ready to busy.
struct PendingSlot {
    state: AtomicU8,
    path: UnsafeCell<[u8; PENDING_PATH_BYTES]>,
}

// SAFETY: access to `path` is serialised by `state` (see `PendingSlot`).
unsafe impl Sync for PendingSlot {}

static PENDING: [PendingSlot; PENDING_SLOTS] = [const {
    PendingSlot {
        state: AtomicU8::new(SLOT_FREE),
        path: UnsafeCell::new([0; PENDING_PATH_BYTES]),
    }
}; PENDING_SLOTS];

/// A file being written (a snapshot's temporary) that a second SIGINT, which ends the process at
/// once, unlinks first: no partial file is left behind. The registration is stored where the
/// signal handler can read it without allocating or locking; it ends when this is dropped.
#[derive(Debug)]
pub struct PendingFile {
    slot: usize,
}

impl PendingFile {
    /// Registers `path`; `None` when every slot is taken or the path is too long (the file is
    /// then only not removed on a second SIGINT).
    pub fn register(path: &Path) -> Option<PendingFile> {
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= PENDING_PATH_BYTES || bytes.contains(&0) {
            return None;
        }
        PENDING.iter().enumerate().find_map(|(slot, p)| {
            p.state
                .compare_exchange(SLOT_FREE, SLOT_BUSY, Ordering::AcqRel, Ordering::Relaxed)
                .ok()?;
            // SAFETY: the busy state gives this thread the slot's bytes alone.
            let buf = unsafe { &mut *p.path.get() };
            buf[..bytes.len()].copy_from_slice(bytes);
            buf[bytes.len()] = 0;
            p.state.store(SLOT_READY, Ordering::Release);
            Some(PendingFile { slot })
        })
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        // Fails only while the handler unlinks it, just before the process ends.
        let _ = PENDING[self.slot].state.compare_exchange(
            SLOT_READY,
            SLOT_FREE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// Unlinks every registered file (async-signal-safe: atomics and unlink(2) only).
fn unlink_pending_files() {
    for p in &PENDING {
        if p.state
            .compare_exchange(SLOT_READY, SLOT_BUSY, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: the slot holds a NUL-terminated path that no thread changes while busy.
            unsafe { libc::unlink(p.path.get().cast::<libc::c_char>()) };
        }
    }
}

/// One replica's view of the signal counters and of the requests the job has acted on.
#[derive(Debug, Clone)]
pub struct SignalWatch {
    /// Only the first replica of a process reports the counters.
    reads: bool,
    /// Per signal: the job-wide count already acted on.
    handled: [u64; 4],
}

impl SignalWatch {
    /// A watch that reports this process's counters (`reads`, the first replica of its process)
    /// or only zeros.
    pub fn new(reads: bool) -> Self {
        SignalWatch {
            reads,
            handled: [0; 4],
        }
    }

    /// `[usr1, hup, int, term]`: how many of each signal this process has received (zeros when
    /// this replica does not read), for the all-reduce max.
    pub fn counts(&self) -> [f64; 4] {
        let mut c = [0.0; 4];
        if self.reads {
            for (v, n) in c.iter_mut().zip(&COUNTS) {
                *v = n.load(Ordering::SeqCst) as f64;
            }
        }
        c
    }

    /// From the maxima of every replica's [`Self::counts`]: 1.0 for each signal of which some
    /// rank has received more than the job has acted on (then counted as acted on). A signal
    /// forwarded to every rank raises every count to the same value, so it is one request even
    /// when it reaches the ranks on either side of an iteration boundary.
    pub fn agreed(&mut self, max: &[f64; 4]) -> [f64; 4] {
        let mut fresh = [0.0; 4];
        for i in 0..4 {
            let m = max[i] as u64;
            if m > self.handled[i] {
                fresh[i] = 1.0;
                self.handled[i] = m;
            }
        }
        fresh
    }
}

/// The per-signal maxima of the summed gather slots (`4 × replicas`, replica r's counts at
/// `4r..4r + 4`).
pub fn slot_max(slots: &[f64]) -> [f64; 4] {
    let mut m = [0.0f64; 4];
    for chunk in slots.chunks_exact(4) {
        for (a, b) in m.iter_mut().zip(chunk) {
            *a = a.max(*b);
        }
    }
    m
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

    /// The decision for the agreed flags (see [`SignalWatch::agreed`]). The
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
    fn a_forwarded_signal_is_one_request_and_a_direct_one_another() {
        let mut reader = SignalWatch::new(true);
        let other = SignalWatch::new(false);
        assert_eq!(other.counts(), [0.0; 4]);
        let base = reader.counts()[1];
        reader.agreed(&[0.0, base, 0.0, 0.0]);
        // Rank A has the forwarded SIGHUP, rank B not yet: one request.
        let a = [0.0, base + 1.0, 0.0, 0.0];
        let b = [0.0, base, 0.0, 0.0];
        let mut slots = a.to_vec();
        slots.extend(b);
        assert_eq!(reader.agreed(&slot_max(&slots))[1], 1.0);
        // Next boundary: B has it too; nothing new.
        slots[5] = base + 1.0;
        assert_eq!(reader.agreed(&slot_max(&slots))[1], 0.0);
        // A signal sent to B alone: a new request.
        slots[5] = base + 2.0;
        assert_eq!(reader.agreed(&slot_max(&slots))[1], 1.0);
        COUNTS[1].fetch_add(1, Ordering::SeqCst);
        assert_eq!(reader.counts()[1], base + 1.0);
    }
}
