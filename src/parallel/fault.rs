//! Failure injection for testing the job's failure paths: `P2PTRAIN_INJECT_PANIC=RANK:ITER` makes
//! the replica of universal rank `RANK` panic at the start of iteration `ITER`, as a bug would. The
//! panic hook must then abort the whole MPI job; the other replicas, waiting in a collective, must
//! not hang. `P2PTRAIN_INJECT_PERTURB=RANK:ITER` changes one parameter of that replica (by one
//! ulp) at the start of iteration `ITER`, as silent corruption would, for the replica consistency
//! check (`[cluster] verify_interval`) to find. Unset (the normal case), each costs one comparison
//! per iteration.

/// The environment variable read once at start.
pub const INJECT_PANIC: &str = "P2PTRAIN_INJECT_PANIC";
/// The environment variable of the parameter perturbation.
pub const INJECT_PERTURB: &str = "P2PTRAIN_INJECT_PERTURB";

/// Where to panic, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedPanic {
    pub rank: usize,
    pub iter: u64,
}

impl InjectedPanic {
    /// Reads `P2PTRAIN_INJECT_PANIC`; a malformed value is ignored with a warning.
    pub fn from_env() -> Option<Self> {
        Self::from_var(INJECT_PANIC)
    }

    /// Reads `RANK:ITER` from the environment variable `var` (the perturbation uses the same
    /// form); a malformed value is ignored with a warning.
    pub fn from_var(var: &str) -> Option<Self> {
        let v = std::env::var(var).ok()?;
        let parsed = Self::parse(&v);
        if parsed.is_none() {
            tracing::warn!("{var}={v:?} ignored: expected RANK:ITER");
        }
        parsed
    }

    /// Parses `RANK:ITER`.
    pub fn parse(v: &str) -> Option<Self> {
        let (rank, iter) = v.split_once(':')?;
        Some(InjectedPanic {
            rank: rank.trim().parse().ok()?,
            iter: iter.trim().parse().ok()?,
        })
    }

    /// Panics if replica `rank` is at iteration `iter` of the injection.
    pub fn check(this: Option<Self>, rank: usize, iter: u64) {
        if this == Some(InjectedPanic { rank, iter }) {
            panic!("injected fault ({INJECT_PANIC}) in replica {rank} at iteration {iter}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rank_and_iteration() {
        assert_eq!(
            InjectedPanic::parse("1:5"),
            Some(InjectedPanic { rank: 1, iter: 5 })
        );
        assert_eq!(InjectedPanic::parse("x:5"), None);
        assert_eq!(InjectedPanic::parse("3"), None);
    }

    #[test]
    #[should_panic(expected = "injected fault")]
    fn panics_only_where_asked() {
        let f = InjectedPanic::parse("2:7");
        InjectedPanic::check(f, 1, 7);
        InjectedPanic::check(f, 2, 6);
        InjectedPanic::check(f, 2, 7);
    }
}
