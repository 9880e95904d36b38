//! Deadlines of collective waits. Every wait of a replica for its peers — an MPI collective of
//! the leader thread, a local barrier between the threads of one process, the host waiting for
//! NCCL — polls its operation through a [`Wait`], which spins briefly, then yields, then sleeps
//! in short steps, and gives up after `[cluster] collective_timeout_s`. The caller then calls
//! [`expire`]: it prints which collective, at which iteration, and what is known of the missing
//! ranks, and aborts the whole MPI job (exit code 1).
//!
//! The process keeps three small globals here: the timeout (set once the config is read; 600 s
//! until then), the MPI rank (for messages), and the current training iteration (set by every
//! replica at the start of each iteration, read by messages and sent in heartbeats).

use super::heartbeat;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The default of `[cluster] collective_timeout_s`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Exit code of a job ended by an expired deadline (a runtime failure).
pub const EXIT_CODE: i32 = 1;

/// Marks "no iteration yet" in [`ITERATION`].
const NO_ITERATION: u64 = u64::MAX;

static TIMEOUT_MS: AtomicU64 = AtomicU64::new(600_000);
static ITERATION: AtomicU64 = AtomicU64::new(NO_ITERATION);
static RANK: AtomicU64 = AtomicU64::new(0);

/// Sets the deadline of every later wait (`[cluster] collective_timeout_s`).
pub fn set_timeout(t: Duration) {
    TIMEOUT_MS.store(t.as_millis().max(1) as u64, Ordering::Relaxed);
}

/// The deadline of a wait.
pub fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

/// Records this process's MPI rank for messages.
pub fn set_rank(rank: usize) {
    RANK.store(rank as u64, Ordering::Relaxed);
}

/// This process's MPI rank.
pub fn rank() -> usize {
    RANK.load(Ordering::Relaxed) as usize
}

/// Records the training iteration a replica of this process has started.
pub fn set_iteration(iter: u64) {
    ITERATION.store(iter.min(NO_ITERATION - 1), Ordering::Relaxed);
}

/// The current training iteration, if training has started.
pub fn iteration() -> Option<u64> {
    match ITERATION.load(Ordering::Relaxed) {
        NO_ITERATION => None,
        i => Some(i),
    }
}

/// The raw iteration word sent in heartbeats (`u64::MAX`: none yet).
pub(crate) fn iteration_word() -> u64 {
    ITERATION.load(Ordering::Relaxed)
}

/// `at iteration 17`, or `before training`.
pub fn describe_iteration(word: u64) -> String {
    match word {
        NO_ITERATION => "before training".into(),
        i => format!("at iteration {i}"),
    }
}

/// Polls back to back (spinning) this long: a collective that completes at once costs nothing
/// more, and MPI's non-blocking collectives progress only while they are polled.
const SPIN: Duration = Duration::from_micros(50);
/// Then yields between polls this long, still polling often while leaving the core to others.
const YIELD: Duration = Duration::from_millis(20);
/// Then sleeps between polls, doubling from 20 µs up to this.
const MAX_SLEEP: Duration = Duration::from_millis(1);

/// One wait with a deadline: call [`Wait::pause`] between two polls of the awaited operation.
#[derive(Debug)]
pub struct Wait {
    start: Instant,
    limit: Duration,
    sleep: Duration,
}

impl Wait {
    /// A wait under the process's deadline ([`timeout`]).
    pub fn new() -> Self {
        Self::with_limit(timeout())
    }

    /// A wait that gives up after `limit`.
    pub fn with_limit(limit: Duration) -> Self {
        Wait {
            start: Instant::now(),
            limit,
            sleep: Duration::from_micros(20),
        }
    }

    /// How long the wait has lasted.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The limit of this wait.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Time left before the deadline (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.limit.saturating_sub(self.start.elapsed())
    }

    /// Backs off before the next poll; `false` once the deadline has passed.
    pub fn pause(&mut self) -> bool {
        let elapsed = self.start.elapsed();
        if elapsed < SPIN {
            std::hint::spin_loop();
        } else if elapsed < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
            self.sleep = (self.sleep * 2).min(MAX_SLEEP);
            // Between polls of a long wait, keep the heartbeat going where no thread does it.
            heartbeat::pump_if_unthreaded();
        }
        elapsed < self.limit
    }
}

impl Default for Wait {
    fn default() -> Self {
        Self::new()
    }
}

/// The message of an expired wait on collective `op`; `missing` says who is missing (from the
/// heartbeat or the local group), or that it cannot be told.
pub fn message(
    rank: usize,
    op: &str,
    iteration_word: u64,
    waited: Duration,
    missing: &str,
) -> String {
    format!(
        "p2ptrain: rank {rank}: error: collective `{op}` {} did not complete within {:.1} s \
         ([cluster] collective_timeout_s); {missing}; aborting the job\n",
        describe_iteration(iteration_word),
        waited.as_secs_f64()
    )
}

/// Reports that the wait on collective `op` expired and aborts the whole job. `missing` is what
/// the caller knows of the missing peers, or `None` to ask the heartbeat.
pub fn expire(op: &str, wait: &Wait, missing: Option<String>) -> ! {
    let missing = missing.unwrap_or_else(heartbeat::missing_ranks);
    let text = message(rank(), op, iteration_word(), wait.elapsed(), &missing);
    super::bootstrap::say(&text);
    super::bootstrap::abort_job(EXIT_CODE)
}

/// Reports that collective `op` failed (`why`, e.g. NCCL's asynchronous error) and aborts the
/// whole job.
pub fn fail(op: &str, why: &str) -> ! {
    let text = format!(
        "p2ptrain: rank {}: error: collective `{op}` {} failed: {why}; aborting the job\n",
        rank(),
        describe_iteration(iteration_word())
    );
    super::bootstrap::say(&text);
    super::bootstrap::abort_job(EXIT_CODE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_expires_after_its_limit_and_not_before() {
        let mut w = Wait::with_limit(Duration::from_millis(30));
        let mut polls = 0u32;
        while w.pause() {
            polls += 1;
        }
        assert!(w.elapsed() >= Duration::from_millis(30));
        assert!(polls > 1, "polls often before sleeping: {polls}");
        assert_eq!(w.remaining(), Duration::ZERO);
    }

    #[test]
    fn the_message_names_the_collective_iteration_and_missing_ranks() {
        let m = message(
            1,
            "gradient all-reduce",
            17,
            Duration::from_secs(3),
            "rank 2 not heard from for 3.0 s (last at iteration 17)",
        );
        assert!(m.starts_with("p2ptrain: rank 1: error: collective `gradient all-reduce`"));
        assert!(m.contains("at iteration 17"), "{m}");
        assert!(m.contains("within 3.0 s"), "{m}");
        assert!(m.contains("rank 2 not heard from"), "{m}");
        assert!(
            message(0, "barrier", NO_ITERATION, Duration::ZERO, "x").contains("before training")
        );
    }
}
