//! What a process must release before it ends the job on an error. An NCCL communicator whose
//! peer stopped keeps a kernel spinning on the GPU and the host thread waiting on it; aborting it
//! (`ncclCommAbort`) lets the process, and with it the device, go. Backends register such work
//! here ([`register`]); [`super::bootstrap::abort_job`] runs it once, from whatever thread ends
//! the job, before `MPI_Abort`.
//!
//! The registry never blocks the aborting thread for long: it is taken with `try_lock` (a hook
//! that is being registered or dropped at that moment is skipped after a short retry), and each
//! hook runs at most once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::{Duration, Instant};

type Hook = Box<dyn FnOnce() + Send>;

static HOOKS: Mutex<Vec<(u64, Hook)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// How long the aborting thread waits for the registry when another thread holds it.
const LOCK_PATIENCE: Duration = Duration::from_millis(500);

/// A registered hook; dropping it unregisters the hook (call that before the resource it
/// releases is released the normal way).
#[derive(Debug)]
pub struct Registration(u64);

/// Registers `hook` to run if this process ends the job on an error.
pub fn register(hook: impl FnOnce() + Send + 'static) -> Registration {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    HOOKS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((id, Box::new(hook)));
    Registration(id)
}

impl Drop for Registration {
    fn drop(&mut self) {
        HOOKS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _)| *id != self.0);
    }
}

/// Runs (and removes) every registered hook; the hooks of a registry busy for longer than
/// [`LOCK_PATIENCE`] are left alone, so that ending the job never waits on them.
pub(crate) fn run_all() {
    let start = Instant::now();
    let hooks = loop {
        match HOOKS.try_lock() {
            Ok(mut h) => break std::mem::take(&mut *h),
            Err(TryLockError::Poisoned(p)) => break std::mem::take(&mut *p.into_inner()),
            Err(TryLockError::WouldBlock) if start.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(TryLockError::WouldBlock) => return,
        }
    };
    for (_, hook) in hooks {
        hook();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn registered_hooks_run_once_and_dropped_ones_never() {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = |n: usize| {
            let ran = ran.clone();
            move || {
                ran.fetch_add(n, Ordering::SeqCst);
            }
        };
        let kept = register(counter(1));
        let dropped = register(counter(100));
        drop(dropped);
        run_all();
        run_all();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        drop(kept); // unregistering a hook that already ran is harmless
    }
}
