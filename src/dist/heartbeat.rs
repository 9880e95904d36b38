//! Heartbeats: who was heard from lately. On a duplicate of `MPI_COMM_WORLD` of its own, every
//! rank sends each peer a one-word message (its current iteration) every [`PERIOD`], and takes
//! in whatever the peers sent, recording per peer when it was last heard from and at which
//! iteration. When a collective's deadline expires, [`missing_ranks`] names the peers not heard
//! from for longer than a few seconds — a killed, stopped or hung process stops beating, while a
//! slow one inside a long computation still beats.
//!
//! With `MPI_THREAD_MULTIPLE` a thread of its own beats, independently of what the replicas do.
//! With `MPI_THREAD_SERIALIZED` no other thread may call MPI concurrently, so the thread that is
//! waiting in a collective beats between its polls instead ([`pump_if_unthreaded`]); a rank busy
//! computing then beats only when it next waits, and the report says so.
//!
//! Messages are sent with `MPI_Isend` from a fixed buffer per peer; a peer whose previous beat
//! has not completed (it stopped receiving) is skipped, so nothing queues up without bound.

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Time between two beats.
pub const PERIOD: Duration = Duration::from_millis(100);

/// The message tag of beats (their communicator carries nothing else).
const TAG: c_int = 7;

/// The heartbeat state of this process.
struct Heartbeat {
    /// Keeps the duplicate communicator alive.
    comm: SimpleCommunicator,
    rank: usize,
    /// Per peer: one word to send (stable address while a send is in flight) and its request.
    out: Vec<u64>,
    requests: Vec<ffi::MPI_Request>,
    /// Per peer: when it was last heard from and the iteration it reported.
    heard: Vec<(Instant, u64)>,
    last_beat: Option<Instant>,
    /// Whether the beats come from a thread of their own.
    threaded: bool,
}

// SAFETY: the MPI handles inside are used only under the `STATE` mutex, from threads that the
// thread level granted to MPI allows (see the module doc).
unsafe impl Send for Heartbeat {}

static STATE: OnceLock<Mutex<Heartbeat>> = OnceLock::new();
static STOP: AtomicBool = AtomicBool::new(false);
/// Set while [`watch_progress`]'s guard lives.
static WATCHING: AtomicBool = AtomicBool::new(false);

/// How long past the collective deadline the watchdog waits before it ends a stalled job, so
/// that a wait with a deadline of its own reports first (it knows which collective it awaits).
const WATCHDOG_GRACE: Duration = Duration::from_secs(3);

/// Starts the heartbeat of this process over a duplicate of `world`; with `threaded`, a thread
/// beats every [`PERIOD`] until [`stop`]. A job of one process has nobody to hear from.
pub fn start(world: &SimpleCommunicator, threaded: bool) -> Option<std::thread::JoinHandle<()>> {
    let size = world.size() as usize;
    if size < 2 {
        return None;
    }
    let now = Instant::now();
    let hb = Heartbeat {
        comm: world.duplicate(),
        rank: world.rank() as usize,
        out: vec![0; size],
        // SAFETY: reading an MPI constant after MPI_Init.
        requests: vec![unsafe { ffi::RSMPI_REQUEST_NULL }; size],
        heard: vec![(now, super::deadline::iteration_word()); size],
        last_beat: None,
        threaded,
    };
    if STATE.set(Mutex::new(hb)).is_err() {
        return None;
    }
    threaded.then(|| {
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(|| {
                let mut watchdog = Watchdog::new();
                while !STOP.load(Ordering::Relaxed) {
                    pump();
                    watchdog.check(Instant::now());
                    std::thread::sleep(PERIOD / 2);
                }
            })
            .expect("spawning the heartbeat thread")
    })
}

/// Stops the beats (before MPI is finalised) and releases the sends still in flight.
pub fn stop(thread: Option<std::thread::JoinHandle<()>>) {
    STOP.store(true, Ordering::Relaxed);
    if let Some(t) = thread {
        let _ = t.join();
    }
    if let Some(state) = STATE.get() {
        let mut hb = state.lock().unwrap_or_else(|p| p.into_inner());
        for r in &mut hb.requests {
            // SAFETY: a live send request (or null) of this process; freeing lets MPI complete
            // it on its own.
            unsafe {
                if *r != ffi::RSMPI_REQUEST_NULL {
                    ffi::MPI_Request_free(r);
                }
            }
        }
    }
}

/// Turns the progress watchdog on until the guard is dropped (around the replicas' run, not
/// around the writing of outputs after it, when peers that are done stop beating).
///
/// A thread of the replicas may block where no deadline reaches it: a blocking device call
/// whose work is ordered after an NCCL collective, or a communicator's creation, when a peer has
/// stopped (SIGSTOP, a hung host). The heartbeat thread, which runs regardless, then sees that
/// the process's training iteration has not moved for the collective deadline plus a few
/// seconds while some peer is silent, names that peer and ends the job (communicators aborted
/// through [`super::abort_hooks`]). A process that is merely slow, with every peer beating, is
/// left alone. Needs the heartbeat thread (`MPI_THREAD_MULTIPLE`).
pub fn watch_progress() -> WatchGuard {
    WATCHING.store(true, Ordering::SeqCst);
    WatchGuard(())
}

/// Keeps the watchdog on; see [`watch_progress`].
#[derive(Debug)]
pub struct WatchGuard(());

impl Drop for WatchGuard {
    fn drop(&mut self) {
        WATCHING.store(false, Ordering::SeqCst);
    }
}

/// The heartbeat thread's view of this process's progress.
struct Watchdog {
    /// The iteration word last seen, and since when (`None` while not watching).
    seen: Option<(u64, Instant)>,
}

impl Watchdog {
    fn new() -> Self {
        Watchdog { seen: None }
    }

    /// Ends the job if the iteration has not moved for too long while some peer is silent.
    fn check(&mut self, now: Instant) {
        if !WATCHING.load(Ordering::SeqCst) {
            self.seen = None;
            return;
        }
        let word = super::deadline::iteration_word();
        match self.seen {
            Some((w, _)) if w == word => {}
            _ => {
                self.seen = Some((word, now));
                return;
            }
        }
        let since = self.seen.map_or(now, |(_, t)| t);
        let timeout = super::deadline::timeout();
        let stalled = now.saturating_duration_since(since);
        if stalled < timeout + stale_after(timeout) + WATCHDOG_GRACE {
            return;
        }
        let Some(state) = STATE.get() else { return };
        let Ok(hb) = state.try_lock() else { return };
        let silent = silent_peers(&hb.heard, hb.rank, now, stale_after(timeout));
        if silent.is_empty() {
            return;
        }
        let text = stall_message(hb.rank, word, stalled, &silent);
        drop(hb);
        super::bootstrap::say(&text);
        super::bootstrap::abort_job(super::deadline::EXIT_CODE)
    }
}

/// The watchdog's report: no progress for `stalled` at iteration word `word`, `silent` peers.
fn stall_message(rank: usize, word: u64, stalled: Duration, silent: &[String]) -> String {
    format!(
        "p2ptrain: rank {rank}: error: no progress for {:.1} s {} ([cluster] \
         collective_timeout_s plus a grace period); not heard from: {}; aborting the job\n",
        stalled.as_secs_f64(),
        super::deadline::describe_iteration(word),
        silent.join(", ")
    )
}

/// Beats (at most once per [`PERIOD`]) and takes in the peers' beats.
pub fn pump() {
    let Some(state) = STATE.get() else { return };
    let Ok(mut hb) = state.try_lock() else { return };
    if !STOP.load(Ordering::Relaxed) {
        hb.pump();
    }
}

/// Beats from a waiting thread when no heartbeat thread does it (`MPI_THREAD_SERIALIZED`).
pub fn pump_if_unthreaded() {
    if let Some(state) = STATE.get() {
        if let Ok(mut hb) = state.try_lock() {
            if !hb.threaded && !STOP.load(Ordering::Relaxed) {
                hb.pump();
            }
        }
    }
}

impl Heartbeat {
    fn pump(&mut self) {
        let now = Instant::now();
        if self.last_beat.is_none_or(|t| now - t >= PERIOD) {
            self.last_beat = Some(now);
            self.send_all();
        }
        self.receive_all(now);
    }

    fn send_all(&mut self) {
        let comm = self.comm.as_raw();
        let word = super::deadline::iteration_word();
        for peer in 0..self.out.len() {
            if peer == self.rank {
                continue;
            }
            // SAFETY: `requests[peer]` is null or a send request of ours; `out[peer]` stays at
            // the same address (the vector never grows) until that send completes.
            unsafe {
                let req = &mut self.requests[peer];
                if *req != ffi::RSMPI_REQUEST_NULL {
                    let mut done: c_int = 0;
                    ffi::MPI_Test(req, &mut done, ffi::RSMPI_STATUS_IGNORE);
                    if done == 0 {
                        continue; // the peer is not taking its beats in
                    }
                }
                self.out[peer] = word;
                ffi::MPI_Isend(
                    (&self.out[peer] as *const u64).cast(),
                    1,
                    ffi::RSMPI_UINT64_T,
                    peer as c_int,
                    TAG,
                    comm,
                    req,
                );
            }
        }
    }

    fn receive_all(&mut self, now: Instant) {
        let comm = self.comm.as_raw();
        loop {
            let mut flag: c_int = 0;
            let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::zeroed();
            let mut word: u64 = 0;
            // SAFETY: valid communicator, writable flag, status and one-word buffer.
            unsafe {
                ffi::MPI_Iprobe(
                    ffi::RSMPI_ANY_SOURCE,
                    TAG,
                    comm,
                    &mut flag,
                    status.as_mut_ptr(),
                );
                if flag == 0 {
                    return;
                }
                let source = status.assume_init().MPI_SOURCE;
                ffi::MPI_Recv(
                    (&mut word as *mut u64).cast(),
                    1,
                    ffi::RSMPI_UINT64_T,
                    source,
                    TAG,
                    comm,
                    ffi::RSMPI_STATUS_IGNORE,
                );
                if let Some(h) = self.heard.get_mut(source as usize) {
                    *h = (now, word);
                }
            }
        }
    }
}

/// How long a peer may be silent before it is named: a few seconds, less for short deadlines.
pub fn stale_after(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_millis(500), Duration::from_secs(5))
}

/// The peers not heard from lately, for the message of an expired deadline.
pub fn missing_ranks() -> String {
    let Some(state) = STATE.get() else {
        return "no other MPI process to hear from: a local replica is missing".into();
    };
    // A poisoned or busy lock must not keep the job from ending.
    let hb = match state.try_lock() {
        Ok(hb) => hb,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            std::thread::sleep(Duration::from_millis(50));
            match state.try_lock() {
                Ok(hb) => hb,
                Err(_) => return "cannot tell which ranks are missing".into(),
            }
        }
    };
    describe(
        &hb.heard,
        hb.rank,
        Instant::now(),
        stale_after(super::deadline::timeout()),
        hb.threaded,
    )
}

/// The peers of `heard` (indexed by rank; `me` is skipped) silent for longer than `stale`, each
/// as `rank 2 (silent for 3.0 s, last heard at iteration 17)`.
fn silent_peers(heard: &[(Instant, u64)], me: usize, now: Instant, stale: Duration) -> Vec<String> {
    heard
        .iter()
        .enumerate()
        .filter(|&(r, &(t, _))| r != me && now.saturating_duration_since(t) > stale)
        .map(|(r, &(t, word))| {
            format!(
                "rank {r} (silent for {:.1} s, last heard {})",
                now.saturating_duration_since(t).as_secs_f64(),
                super::deadline::describe_iteration(word)
            )
        })
        .collect()
}

/// Names the peers of `heard` (indexed by rank; `me` is skipped) silent for longer than `stale`.
fn describe(
    heard: &[(Instant, u64)],
    me: usize,
    now: Instant,
    stale: Duration,
    threaded: bool,
) -> String {
    let silent = silent_peers(heard, me, now, stale);
    if silent.is_empty() {
        let how = if threaded {
            ""
        } else {
            " (MPI has no MPI_THREAD_MULTIPLE here: ranks beat only while they wait)"
        };
        format!(
            "cannot tell which rank is missing: every rank was heard from within the last \
             {:.1} s{how}",
            stale.as_secs_f64()
        )
    } else {
        format!("not heard from: {}", silent.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_peers_are_named_with_their_last_iteration() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        let heard = vec![
            (later, 5),
            (now, 3),
            (later - Duration::from_millis(100), 5),
        ];
        let d = describe(&heard, 0, later, Duration::from_secs(2), true);
        assert!(
            d.contains("rank 1 (silent for 10.0 s, last heard at iteration 3)"),
            "{d}"
        );
        assert!(!d.contains("rank 2"), "{d}");
        let d = describe(&heard[..1], 0, later, Duration::from_secs(2), true);
        assert!(d.starts_with("cannot tell"), "{d}");
    }

    #[test]
    fn the_stall_message_names_the_iteration_and_the_silent_peers() {
        let m = stall_message(
            0,
            41,
            Duration::from_secs(28),
            &["rank 1 (silent for 27.5 s, last heard at iteration 41)".into()],
        );
        assert!(
            m.starts_with("p2ptrain: rank 0: error: no progress for 28.0 s at iteration 41"),
            "{m}"
        );
        assert!(m.contains("not heard from: rank 1 (silent"), "{m}");
    }

    #[test]
    fn short_deadlines_shorten_the_silence_that_counts() {
        assert_eq!(
            stale_after(Duration::from_secs(3)),
            Duration::from_millis(1500)
        );
        assert_eq!(
            stale_after(Duration::from_secs(600)),
            Duration::from_secs(5)
        );
        assert_eq!(
            stale_after(Duration::from_millis(10)),
            Duration::from_millis(500)
        );
    }
}
