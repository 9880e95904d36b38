//! Process start-up: the launcher's environment read before MPI is up ([`LaunchEnv`]), MPI with
//! thread support (the level granted is checked), world rank and size checked against the
//! launcher's, the node-local rank (the launcher's, else `MPI_Comm_split_type(SHARED)`), a panic hook that aborts the whole
//! MPI job, and the agreement steps that let the job end together on a start-up error; then what
//! every multi-replica command shares: a byte broadcast from one rank (the NCCL unique id), the
//! CPU communicators of the local replicas (over the job, and over a node for local SGD's
//! hierarchical scope), and one thread per local replica
//! ([`run_replicas`]) with a failure in any of them ending the job. Every collective here is
//! polled under the collective deadline ([`super::deadline`]), and the heartbeat
//! ([`super::heartbeat`]) starts with MPI and stops before it is finalised.

use super::launch_env::LaunchEnv;
use super::local::LocalGroup;
use super::mpi_link::{complete, MpiLink};
use super::nodes::Nodes;
use super::{deadline, heartbeat, CpuComm};
use crate::error::{Error, Result};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::Threading;
use std::sync::Arc;

/// MPI, initialised, and where this process sits in the job.
pub struct Bootstrap {
    /// Stops the heartbeat before MPI is finalised (dropped before `_universe`).
    _heartbeat: HeartbeatGuard,
    world: SimpleCommunicator,
    /// Keeps MPI alive; dropping it finalises MPI.
    _universe: Universe,
    /// MPI rank of this process.
    pub rank: usize,
    /// Number of MPI processes.
    pub size: usize,
    /// Rank among the processes on this node: the launcher's when it says, else MPI's.
    pub local_rank: usize,
    /// Number of processes on this node.
    pub local_size: usize,
    /// The threading level MPI granted.
    pub threading: Threading,
    /// What the launcher said, if a known one started the process.
    pub launch: Option<LaunchEnv>,
}

impl Bootstrap {
    /// Initialises MPI asking for `MPI_THREAD_MULTIPLE`. Replica threads call MPI one at a time
    /// from a thread other than the main one, so at least `MPI_THREAD_SERIALIZED` is required.
    /// A launcher (srun, mpirun) whose rank and size disagree with MPI's world is an error: the
    /// processes would each train alone.
    pub fn init() -> Result<Self> {
        let launch = LaunchEnv::detect();
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| Error::Comm("MPI was already initialised in this process".into()))?;
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        install_abort_on_panic(rank);
        deadline::set_rank(rank);
        if threading < Threading::Serialized {
            return Err(Error::Comm(format!(
                "rank {rank}: MPI granted thread level {threading:?}; p2ptrain needs at least \
                 Serialized (build OpenMPI with thread support)"
            )));
        }
        if let Some(env) = &launch {
            env.check_world(rank, size)?;
        }
        let node = world.split_shared(rank as i32);
        let local_size = node.size() as usize;
        let local_rank = launch
            .and_then(|l| l.local_rank)
            .filter(|&l| l < local_size)
            .unwrap_or(node.rank() as usize);
        let beats = heartbeat::start(&world, threading == Threading::Multiple);
        Ok(Bootstrap {
            rank,
            size,
            local_rank,
            local_size,
            threading,
            launch,
            _heartbeat: HeartbeatGuard(Some(beats)),
            world,
            _universe: universe,
        })
    }

    /// A duplicate of the world communicator for the leader replica thread.
    pub fn link(&self) -> MpiLink {
        MpiLink::new(self.world.duplicate())
    }

    /// Agrees on the outcome of a step that every rank ran on its own (reading the config, the
    /// data). If any rank failed, the lowest failing rank reports its error — prefixed with its
    /// rank — and every rank returns `Err(exit code)` of that error; nobody is left waiting.
    pub fn agree<T>(&self, outcome: Result<T>) -> std::result::Result<T, i32> {
        let mine: i32 = match &outcome {
            Ok(_) => i32::MAX,
            Err(_) => self.rank as i32,
        };
        let mut first = i32::MAX;
        self.all_reduce_i32(&mine, &mut first, SystemOperation::min());
        if first == i32::MAX {
            return outcome.map_err(|_| unreachable!("a failed rank was not seen"));
        }
        let mut code = match &outcome {
            Err(e) if self.rank as i32 == first => {
                report_error(self.rank, e);
                e.exit_code()
            }
            _ => 0,
        };
        let mine = code;
        self.all_reduce_i32(&mine, &mut code, SystemOperation::max());
        Err(code)
    }

    /// One integer reduced over the processes, under the deadline.
    fn all_reduce_i32(&self, mine: &i32, out: &mut i32, op: SystemOperation) {
        mpi::request::scope(|scope| {
            complete(
                self.world.immediate_all_reduce_into(scope, mine, out, op),
                "start-up agreement",
            )
        });
    }

    /// Checks that every rank resolved the same config; names the first rank that differs.
    pub fn check_same_fingerprint(&self, fingerprint: u64) -> Result<()> {
        let all = self.gather_u64s(&[fingerprint], "config fingerprint exchange");
        match all.iter().position(|&f| f != all[0]) {
            None => Ok(()),
            Some(r) => Err(Error::Comm(format!(
                "rank {r} resolved a different config than rank 0 (fingerprint {:016x} vs \
                 {:016x}): every rank must read the same config file and --set options",
                all[r], all[0]
            ))),
        }
    }

    /// Checks that every rank starts the same way: `key` sums up what must agree (the resolved
    /// snapshot or weights, options such as `--timeline`), `describe` says it in words. On a
    /// mismatch rank 0 returns an [`Error::Usage`] listing every rank's description and the other
    /// ranks return `Ok`: pass the outcome through [`Bootstrap::agree`] so that all stop.
    pub fn check_same_start(&self, key: u64, describe: &str) -> Result<()> {
        let all = self.gather_u64s(&[key], "start-up agreement");
        if all.iter().all(|&k| k == all[0]) {
            return Ok(());
        }
        let Some(described) = self.gather_bytes(describe.as_bytes()) else {
            return Ok(());
        };
        let ranks: String = described
            .iter()
            .enumerate()
            .map(|(r, d)| format!("\n  rank {r}: {}", String::from_utf8_lossy(d)))
            .collect();
        Err(Error::Usage(format!(
            "the ranks would not start alike (every rank must be given the same options and find \
             the same snapshot to resume):{ranks}"
        )))
    }

    /// Every process's `mine` (of one length everywhere), concatenated in rank order.
    pub fn all_gather_u64(&self, mine: &[u64]) -> Vec<u64> {
        self.gather_u64s(mine, "data fingerprint exchange")
    }

    /// [`Bootstrap::all_gather_u64`], the exchange named `op` in a deadline report.
    fn gather_u64s(&self, mine: &[u64], op: &str) -> Vec<u64> {
        let mut all = vec![0u64; mine.len() * self.size];
        mpi::request::scope(|scope| {
            complete(
                self.world
                    .immediate_all_gather_into(scope, mine, &mut all[..]),
                op,
            )
        });
        all
    }

    /// Sums a few numbers over the processes (the main thread's own small collectives).
    pub fn sum_f64(&self, values: &mut [f64]) {
        let send = values.to_vec();
        mpi::request::scope(|scope| {
            complete(
                self.world.immediate_all_reduce_into(
                    scope,
                    &send[..],
                    values,
                    SystemOperation::sum(),
                ),
                "score sum",
            )
        });
    }

    /// Copies `buf` of process `root` into every process's `buf` (the NCCL unique id). Every
    /// process calls it, from its main thread, with a buffer of the same length.
    pub fn broadcast_bytes(&self, buf: &mut [u8], root: usize) {
        assert!(
            root < self.size,
            "broadcast root {root} of {} processes",
            self.size
        );
        let root = self.world.process_at_rank(root as i32);
        mpi::request::scope(|scope| {
            complete(root.immediate_broadcast_into(scope, buf), "byte broadcast")
        });
    }

    /// The CPU communicators of this process's `k` local replicas, in local order: they share
    /// one `LocalGroup`, and replica 0 gets the MPI link when there are other processes.
    pub fn cpu_comms(&self, k: usize) -> Vec<CpuComm> {
        self.cpu_comms_in(Arc::new(LocalGroup::new(k)))
    }

    fn cpu_comms_in(&self, group: Arc<LocalGroup>) -> Vec<CpuComm> {
        (0..group.len())
            .map(|local| {
                let link = (local == 0 && self.size > 1).then(|| self.link());
                CpuComm::new(group.clone(), local, self.rank, self.size, link)
            })
            .collect()
    }

    /// The nodes of the job (see [`Nodes`]): blocks of `node_ranks` consecutive ranks, or with 0
    /// the ranks that share memory. A collective: every process calls it from its main thread.
    pub fn nodes(&self, node_ranks: usize) -> Nodes {
        let color = if let Some(block) = self.rank.checked_div(node_ranks) {
            block as u64
        } else {
            // A host is named by its lowest rank.
            let host = self.world.split_shared(self.rank as i32);
            let (mine, mut lowest) = (self.rank as i32, 0i32);
            mpi::request::scope(|scope| {
                complete(
                    host.immediate_all_reduce_into(
                        scope,
                        &mine,
                        &mut lowest,
                        SystemOperation::min(),
                    ),
                    "node discovery",
                )
            });
            lowest as u64
        };
        Nodes::from_colors(&self.all_gather_u64(&[color]))
    }

    /// The CPU communicators of this process's `k` local replicas over every replica and over
    /// the replicas of their node, sharing one `LocalGroup` (a replica uses one at a time); the
    /// node's leader replica gets an MPI link over the node's processes when it has several. A
    /// collective (the split of the world): every process calls it from its main thread.
    pub fn cpu_comms_with_nodes(&self, k: usize, nodes: &Nodes) -> Vec<(CpuComm, CpuComm)> {
        let group = Arc::new(LocalGroup::new(k));
        let (place, processes) = nodes.place(self.rank);
        let color = Color::with_value(nodes.of_rank[self.rank] as i32);
        let node_comm = self.world.split_by_color(color);
        let mut node_link = node_comm.filter(|_| processes > 1).map(MpiLink::new);
        self.cpu_comms_in(group.clone())
            .into_iter()
            .enumerate()
            .map(|(local, world)| {
                let link = if local == 0 { node_link.take() } else { None };
                let node = CpuComm::new(group.clone(), local, place, processes, link);
                (world, node)
            })
            .collect()
    }

    /// Gathers every process's `mine` on process 0, in rank order (`None` elsewhere). Every
    /// process calls it from its main thread.
    pub fn gather_bytes(&self, mine: &[u8]) -> Option<Vec<Vec<u8>>> {
        let root = self.world.process_at_rank(0);
        let len = i32::try_from(mine.len()).expect("gathered buffer under 2 GiB");
        if self.rank != 0 {
            root.gather_into(&len);
            root.gather_varcount_into(mine);
            return None;
        }
        let mut counts = vec![0i32; self.size];
        root.gather_into_root(&len, &mut counts[..]);
        let displs: Vec<i32> = counts
            .iter()
            .scan(0i32, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect();
        let mut all = vec![0u8; counts.iter().map(|&c| c as usize).sum()];
        {
            let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            root.gather_varcount_into_root(mine, &mut part);
        }
        Some(
            counts
                .iter()
                .zip(&displs)
                .map(|(&c, &d)| all[d as usize..(d + c) as usize].to_vec())
                .collect(),
        )
    }

    /// Waits for every process.
    pub fn barrier(&self) {
        complete(self.world.immediate_barrier(), "barrier");
    }

    /// Applies `[cluster] collective_timeout_s` to every later wait of this process.
    pub fn set_collective_timeout(&self, seconds: f64) {
        deadline::set_timeout(std::time::Duration::from_secs_f64(seconds));
    }
}

/// Stops the heartbeat (its thread, if any) when the bootstrap is dropped, before MPI is
/// finalised.
struct HeartbeatGuard(Option<Option<std::thread::JoinHandle<()>>>);

impl Drop for HeartbeatGuard {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            heartbeat::stop(thread);
        }
    }
}

/// Prints a fatal error once, prefixed with the rank that found it.
pub fn report_error(rank: usize, e: &Error) {
    say(&format!("p2ptrain: rank {rank}: error: {e}\n"));
}

/// Runs `body(local, input)` on one thread per local replica of MPI process `rank` (named
/// `{name}-{local}`, one per element of `inputs`) and returns the results in local order. A
/// replica that fails reports its error and ends the whole job: its peers may be waiting for it
/// inside a collective.
pub fn run_replicas<T: Send, R: Send>(
    rank: usize,
    name: &str,
    inputs: Vec<T>,
    body: impl Fn(usize, T) -> Result<R> + Sync,
) -> Vec<R> {
    let k = inputs.len();
    let body = &body;
    std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .into_iter()
            .enumerate()
            .map(|(local, input)| {
                std::thread::Builder::new()
                    .name(format!("{name}-{local}"))
                    .spawn_scoped(scope, move || match body(local, input) {
                        Ok(r) => r,
                        Err(e) => {
                            report_error(rank, &e);
                            let universal = rank * k + local;
                            tracing::error!("replica {universal} failed; aborting the job");
                            abort_job(e.exit_code())
                        }
                    })
                    .expect("spawning a replica thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| abort_job(1)))
            .collect()
    })
}

/// Writes `text` to stderr in one write, so that the launcher, which merges the ranks' streams,
/// does not interleave it with another rank's output.
pub(crate) fn say(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Seconds a process waits for `MPI_Abort` to end it before it exits by itself.
const ABORT_GRACE_S: u64 = 10;

/// Ends the whole MPI job with `code`. A rank that fails while others may be inside a collective
/// must call this, or they would wait forever.
pub fn abort_job(code: i32) -> ! {
    // Several threads may fail at once (every replica of a process sees the same bad state).
    // MPI_Abort is not safe to enter twice at once (Open MPI frees its help-message parser's
    // buffers concurrently and corrupts the heap), so only the first caller aborts; the others
    // wait for it to end the process.
    static ABORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if ABORTING.swap(true, std::sync::atomic::Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    // MPI_Abort asks the launcher to end every process; a launcher that cannot reach a silent
    // host may never answer. The process then ends itself after a grace period, so that no
    // rank is left waiting (the launcher sees it exit with `code`).
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(ABORT_GRACE_S));
        // SAFETY: _exit only ends the process; nothing is unwound or flushed.
        unsafe { libc::_exit(code) }
    });
    // Communicators waiting on a stopped peer would keep this process (and its GPU) busy.
    super::abort_hooks::run_all();
    // SAFETY: MPI_Abort may be called from any thread at any time after MPI_Init.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::exit(code)
}

/// A panic anywhere (any thread) prints the message with the rank and aborts the whole job.
fn install_abort_on_panic(rank: usize) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        say(&format!("p2ptrain: rank {rank}: fatal: {info}\n"));
        default(info);
        abort_job(1);
    }));
}
