//! `p2ptrain bench-allreduce`: the all-reduce benchmark, after nccl-tests' `all_reduce_perf`,
//! over the communicators the trainer uses — [`CpuComm`](crate::dist::CpuComm) (local threads,
//! MPI between processes) or NCCL, one replica per GPU.
//!
//! For each size of the sweep (`--min-bytes`, multiplied by `--factor` up to `--max-bytes`), every
//! replica fills its buffer with a pattern that depends on its universal rank ([`pattern`]), runs
//! one all-reduce (average, in place, f32) and checks every element against the exact average
//! ([`check_average`]). The replicas agree on the outcome: a wrong value anywhere stops the sweep
//! on every rank, the replica that saw it prints the size, its rank, the element, the value and
//! the expected value, and every rank exits with status 1. Only then is the size timed:
//! `--warmup` untimed all-reduces, a barrier, `--iters` timed ones — between CUDA events on the
//! replica's stream on GPUs, by the wall clock on the CPU. The time of a size is the slowest
//! replica's mean per all-reduce. Universal rank 0 prints the table:
//!
//! - `bytes`, `count` (f32 elements), `time(us)`;
//! - `algbw(GB/s)` = bytes / time, with GB = 10⁹ bytes;
//! - `busbw(GB/s)` = algbw · 2(n − 1)/n for n replicas: the traffic through the busiest link of a
//!   ring all-reduce (each byte crosses n − 1 links in the reduce-scatter half and n − 1 in the
//!   all-gather half, over n links), so that busbw is comparable with the link's bandwidth
//!   whatever n is. It is 0 for one replica.
//!
//! ```text
//! mpirun -np 2 p2ptrain bench-allreduce --backend cuda --max-bytes 1G
//! p2ptrain bench-allreduce --backend cpu --replicas-per-rank 4 --max-bytes 16M
//! ```

mod cuda;

use crate::config::BackendKind;
use crate::dist::bootstrap::{report_error, run_replicas};
use crate::dist::{Bootstrap, Communicator};
use crate::error::{Error, Result};
use std::fmt::Write as _;
use std::time::Instant;

/// The options of `bench-allreduce`.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Smallest size, in bytes.
    pub min_bytes: usize,
    /// Largest size, in bytes; `None`: 1 GiB on GPUs, 64 MiB on the CPU.
    pub max_bytes: Option<usize>,
    /// Each size is the previous one times this (2 or more).
    pub factor: usize,
    /// Timed all-reduces per size.
    pub iters: usize,
    /// Untimed all-reduces per size before the timed ones.
    pub warmup: usize,
    pub backend: BackendKind,
    /// Replicas per MPI process: threads on the CPU, GPUs on CUDA.
    pub replicas_per_rank: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            min_bytes: 1024,
            max_bytes: None,
            factor: 2,
            iters: 20,
            warmup: 5,
            backend: BackendKind::Auto,
            replicas_per_rank: 1,
        }
    }
}

/// Default `--max-bytes` on GPUs.
pub const DEFAULT_MAX_BYTES_CUDA: usize = 1 << 30;
/// Default `--max-bytes` on the CPU (every size is copied several times through shared memory).
pub const DEFAULT_MAX_BYTES_CPU: usize = 64 << 20;
/// Most local replicas accepted.
const MAX_REPLICAS_PER_RANK: usize = 1024;

const F32: usize = std::mem::size_of::<f32>();

/// Parses a byte count: a number with an optional binary suffix `K`, `M`, `G` (also `KB`,
/// `KiB`…; case-insensitive), as nccl-tests reads `-b`/`-e`: `1K` = 1024.
pub fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let num: usize = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (e.g. 4096, 64K, 16M, 1G)"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("`{s}`: unknown unit `{suffix}` (use K, M or G)")),
    };
    num.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Parses `cpu`, `cuda` or `auto`.
pub fn parse_backend(s: &str) -> std::result::Result<BackendKind, String> {
    match s.to_ascii_lowercase().as_str() {
        "cpu" => Ok(BackendKind::Cpu),
        "cuda" | "gpu" => Ok(BackendKind::Cuda),
        "auto" => Ok(BackendKind::Auto),
        _ => Err(format!("`{s}`: expected cpu, cuda or auto")),
    }
}

/// The sizes of the sweep in bytes, each a multiple of 4 (whole f32): `min`, `min·factor`, …
/// up to `max`.
pub fn sizes(min_bytes: usize, max_bytes: usize, factor: usize) -> Result<Vec<usize>> {
    if min_bytes < F32 {
        return Err(Error::Usage(format!(
            "--min-bytes {min_bytes}: the smallest all-reduce is one f32 (4 bytes)"
        )));
    }
    if max_bytes < min_bytes {
        return Err(Error::Usage(format!(
            "--max-bytes {max_bytes} is below --min-bytes {min_bytes}"
        )));
    }
    if factor < 2 {
        return Err(Error::Usage(format!(
            "--factor {factor}: must be 2 or more"
        )));
    }
    let mut out = Vec::new();
    let mut size = min_bytes;
    while size <= max_bytes {
        out.push(size / F32 * F32);
        match size.checked_mul(factor) {
            Some(next) => size = next,
            None => break,
        }
    }
    Ok(out)
}

/// Period of the test pattern along the buffer.
const PERIOD: usize = 11;

/// Element `index` of the buffer of universal rank `rank` before the all-reduce: a small integer
/// (exact in f32) that varies along the buffer with a phase that depends on the rank, so that no
/// replica's own buffer equals the average of two or more and an all-reduce that did nothing, or
/// summed instead of averaging, or mixed up elements, is caught.
pub fn pattern(rank: usize, index: usize) -> f32 {
    ((3 * rank + index) % PERIOD) as f32
}

/// Fills `buf` with [`pattern`] of `rank`.
pub fn fill_pattern(buf: &mut [f32], rank: usize) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = pattern(rank, i);
    }
}

/// The exact average over `n` replicas of [`pattern`], element by element (it depends on the
/// element's index modulo the pattern's period only).
#[derive(Debug, Clone)]
pub struct Expected {
    by_phase: [f64; PERIOD],
}

impl Expected {
    /// The averages for `n` replicas.
    pub fn new(n: usize) -> Self {
        let mut by_phase = [0.0; PERIOD];
        for (j, e) in by_phase.iter_mut().enumerate() {
            let sum: f64 = (0..n).map(|r| pattern(r, j) as f64).sum();
            *e = sum / n as f64;
        }
        Expected { by_phase }
    }

    /// The expected value of element `index`.
    pub fn at(&self, index: usize) -> f64 {
        self.by_phase[index % PERIOD]
    }
}

/// Largest accepted |result − exact average|. Values are at most 10; NCCL's float `Avg` rounds
/// each `value · (1/n)` before summing, the CPU path rounds the sum: both stay within a few ulp
/// of 10 (~10⁻⁶). The smallest error of a wrong result is at least 1/n of a pattern step.
pub const TOLERANCE: f64 = 1e-4;

/// A wrong element of an all-reduce result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mismatch {
    pub index: usize,
    pub got: f32,
    pub expected: f64,
}

/// Checks an all-reduce result `buf` against the exact average over `n` replicas; returns the
/// first wrong element (NaN counts as wrong).
pub fn check_average(buf: &[f32], expected: &Expected) -> std::result::Result<(), Mismatch> {
    for (index, &got) in buf.iter().enumerate() {
        let want = expected.at(index);
        let close = (got as f64 - want).abs() <= TOLERANCE; // false for NaN
        if !close {
            return Err(Mismatch {
                index,
                got,
                expected: want,
            });
        }
    }
    Ok(())
}

/// One replica's side of the benchmark: a buffer of f32 and a communicator.
pub trait Endpoint {
    /// Universal rank of this replica.
    fn rank(&self) -> usize;
    /// Number of replicas.
    fn size(&self) -> usize;
    /// Copies `values` into the first `values.len()` elements of the buffer.
    fn load(&mut self, values: &[f32]) -> Result<()>;
    /// Replaces the first `count` elements by their average over the replicas and waits for
    /// the result.
    fn all_reduce(&mut self, count: usize) -> Result<()>;
    /// Copies the first `out.len()` elements of the buffer out.
    fn read(&mut self, out: &mut [f32]) -> Result<()>;
    /// Runs `warmup` untimed all-reduces of `count` elements, waits for every replica, runs
    /// `iters` timed ones and returns this replica's seconds per all-reduce.
    fn time(&mut self, count: usize, warmup: usize, iters: usize) -> Result<f64>;
    /// Replaces host `values` by their sums over the replicas.
    fn sum_f64(&mut self, values: &mut [f64]) -> Result<()>;
}

/// One line of the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub bytes: usize,
    /// f32 elements.
    pub count: usize,
    /// Slowest replica's mean seconds per all-reduce.
    pub seconds: f64,
}

/// `2(n − 1)/n`: busbw / algbw for an all-reduce over `n` replicas.
pub fn bus_factor(n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        2.0 * (n as f64 - 1.0) / n as f64
    }
}

impl Row {
    /// Algorithm bandwidth, GB/s (10⁹ bytes): bytes / time.
    pub fn algbw(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }

    /// Bus bandwidth, GB/s: algbw · 2(n − 1)/n.
    pub fn busbw(&self, n: usize) -> f64 {
        self.algbw() * bus_factor(n)
    }
}

/// A wrong all-reduce result, as one replica saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WrongResult {
    pub bytes: usize,
    /// Universal rank of the replica that saw it.
    pub rank: usize,
    pub mismatch: Mismatch,
}

impl std::fmt::Display for WrongResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.mismatch;
        write!(
            f,
            "wrong all-reduce result at {} bytes ({} floats): replica {}, element {}: got {}, \
             expected {}",
            self.bytes,
            self.bytes / F32,
            self.rank,
            m.index,
            m.got,
            m.expected
        )
    }
}

/// The outcome of a sweep on one replica.
#[derive(Debug, Clone, Default)]
pub struct Sweep {
    /// The sizes checked and timed, in order.
    pub rows: Vec<Row>,
    /// Set on the replica that saw a wrong result; the sweep stopped at that size.
    pub wrong: Option<WrongResult>,
    /// Number of replicas that saw a wrong result (the same on every replica).
    pub wrong_replicas: usize,
}

/// Runs the sweep on one replica: for each size of `sizes` (bytes), check then time. Every
/// replica calls it with the same arguments.
pub fn sweep(
    ep: &mut impl Endpoint,
    sizes: &[usize],
    warmup: usize,
    iters: usize,
) -> Result<Sweep> {
    let (rank, n) = (ep.rank(), ep.size());
    let expected = Expected::new(n);
    let max_count = sizes.iter().max().map_or(0, |b| b / F32);
    let mut mine = vec![0.0f32; max_count];
    fill_pattern(&mut mine, rank);
    let mut result = vec![0.0f32; max_count];
    let mut out = Sweep::default();
    for &bytes in sizes {
        let count = bytes / F32;
        ep.load(&mine[..count])?;
        ep.all_reduce(count)?;
        ep.read(&mut result[..count])?;
        let wrong = check_average(&result[..count], &expected)
            .err()
            .map(|mismatch| WrongResult {
                bytes,
                rank,
                mismatch,
            });
        let mut flag = [f64::from(u8::from(wrong.is_some()))];
        ep.sum_f64(&mut flag)?;
        if flag[0] > 0.0 {
            out.wrong = wrong;
            out.wrong_replicas = flag[0].round() as usize;
            return Ok(out);
        }
        let seconds = ep.time(count, warmup, iters)?;
        // The slowest replica's time: sum one-hot vectors.
        let mut all = vec![0.0; n];
        all[rank] = seconds;
        ep.sum_f64(&mut all)?;
        let seconds = all.into_iter().fold(0.0, f64::max);
        out.rows.push(Row {
            bytes,
            count,
            seconds,
        });
    }
    Ok(out)
}

/// The table as rank 0 prints it, after a `#` header saying what was measured.
pub fn format_table(header: &[String], rows: &[Row], n: usize) -> String {
    let mut s = String::new();
    for h in header {
        let _ = writeln!(s, "# {h}");
    }
    let _ = writeln!(s, "#");
    let _ = writeln!(
        s,
        "{:>14} {:>12} {:>12} {:>12} {:>12}",
        "bytes", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>14} {:>12} {:>12.2} {:>12.2} {:>12.2}",
            r.bytes,
            r.count,
            r.seconds * 1e6,
            r.algbw(),
            r.busbw(n)
        );
    }
    if !rows.is_empty() {
        let avg = rows.iter().map(|r| r.busbw(n)).sum::<f64>() / rows.len() as f64;
        let _ = writeln!(
            s,
            "# average busbw over {} sizes: {avg:.2} GB/s",
            rows.len()
        );
    }
    s
}

/// [`Endpoint`] over any [`Communicator`] with a host buffer: the CPU path.
pub struct HostEndpoint<C: Communicator> {
    comm: C,
    buf: Vec<f32>,
}

impl<C: Communicator> HostEndpoint<C> {
    /// An endpoint whose buffer holds up to `max_count` floats.
    pub fn new(comm: C, max_count: usize) -> Self {
        HostEndpoint {
            comm,
            buf: vec![0.0; max_count],
        }
    }
}

impl<C: Communicator> Endpoint for HostEndpoint<C> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn load(&mut self, values: &[f32]) -> Result<()> {
        self.buf[..values.len()].copy_from_slice(values);
        Ok(())
    }

    fn all_reduce(&mut self, count: usize) -> Result<()> {
        self.comm.all_reduce_avg(&mut self.buf[..count])
    }

    fn read(&mut self, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&self.buf[..out.len()]);
        Ok(())
    }

    fn time(&mut self, count: usize, warmup: usize, iters: usize) -> Result<f64> {
        for _ in 0..warmup {
            self.all_reduce(count)?;
        }
        self.comm.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            self.all_reduce(count)?;
        }
        Ok(start.elapsed().as_secs_f64() / iters.max(1) as f64)
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<()> {
        self.comm.all_reduce_sum_f64(values)
    }
}

/// The backend a run resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolved {
    Cpu,
    Cuda,
}

/// Checks the options that need no other rank; returns the sizes in bytes.
fn validate(opts: &BenchOptions, backend: Resolved) -> Result<Vec<usize>> {
    if opts.iters == 0 {
        return Err(Error::Usage("--iters must be at least 1".into()));
    }
    let k = opts.replicas_per_rank;
    if k == 0 || k > MAX_REPLICAS_PER_RANK {
        return Err(Error::Usage(format!(
            "--replicas-per-rank {k}: must be between 1 and {MAX_REPLICAS_PER_RANK}"
        )));
    }
    let max = opts.max_bytes.unwrap_or(match backend {
        Resolved::Cpu => DEFAULT_MAX_BYTES_CPU,
        Resolved::Cuda => DEFAULT_MAX_BYTES_CUDA,
    });
    sizes(opts.min_bytes, max, opts.factor)
}

/// This rank's view of the backend: `cuda` needs the CUDA driver, NCCL and one device per local
/// replica of every process on the node.
fn probe_backend(opts: &BenchOptions, boot: &Bootstrap) -> Result<Resolved> {
    let usable = || -> Result<()> {
        crate::cuda::nccl::nccl_version()?;
        let count = crate::cuda::device_count()?;
        let need = boot.local_size * opts.replicas_per_rank;
        if count < need {
            return Err(Error::Comm(format!(
                "{} process(es) on this node x {} replica(s) need {need} GPUs; {count} visible",
                boot.local_size, opts.replicas_per_rank
            )));
        }
        Ok(())
    };
    match opts.backend {
        BackendKind::Cpu => Ok(Resolved::Cpu),
        BackendKind::Cuda => usable().map(|_| Resolved::Cuda),
        BackendKind::Auto => Ok(match usable() {
            Ok(()) => Resolved::Cuda,
            Err(e) => {
                tracing::info!("--backend auto: the CPU, since {e}");
                Resolved::Cpu
            }
        }),
    }
}

/// Runs `bench-allreduce` and returns the process exit code: 0, 1 on a wrong result or a
/// runtime failure, 2 on bad usage.
pub fn run(opts: &BenchOptions) -> i32 {
    let boot = match super::start_rank() {
        Ok(b) => b,
        Err(code) => return code,
    };
    // Every rank resolves the backend; `auto` picks CUDA only where every rank can use it.
    let backend = match boot.agree(probe_backend(opts, &boot)) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let mut cuda_everywhere = [f64::from(u8::from(backend == Resolved::Cuda))];
    boot.sum_f64(&mut cuda_everywhere);
    let backend = if cuda_everywhere[0] as usize == boot.size {
        Resolved::Cuda
    } else {
        Resolved::Cpu
    };
    let sizes = match boot.agree(validate(opts, backend)) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let k = opts.replicas_per_rank;
    let n = boot.size * k;
    let max_count = sizes.iter().max().map_or(0, |b| b / F32);
    let (iters, warmup) = (opts.iters, opts.warmup);
    let (sweeps, backend_line) = match backend {
        Resolved::Cpu => {
            let sweeps = run_replicas(boot.rank, "allreduce", boot.cpu_comms(k), |_, comm| {
                sweep(
                    &mut HostEndpoint::new(comm, max_count),
                    &sizes,
                    warmup,
                    iters,
                )
            });
            (
                sweeps,
                "cpu (shared memory within a process, MPI between)".to_string(),
            )
        }
        Resolved::Cuda => {
            let id = match boot.agree(crate::cuda::nccl::NcclId::shared(&boot)) {
                Ok(id) => id,
                Err(code) => return code,
            };
            let (first_device, process) = (boot.local_rank * k, boot.rank);
            let sweeps = run_replicas(boot.rank, "allreduce", (0..k).collect(), |local, _| {
                // As in training: device node-local rank x replicas_per_rank + local index.
                let device = first_device + local;
                let rank = process * k + local;
                let mut ep = cuda::GpuEndpoint::new(device, rank, n, id, max_count)?;
                let outcome = sweep(&mut ep, &sizes, warmup, iters)?;
                ep.finish()?;
                Ok(outcome)
            });
            let nccl = crate::cuda::nccl::nccl_version()
                .map(|(a, b, c)| format!("{a}.{b}.{c}"))
                .unwrap_or_default();
            let lib = crate::cuda::nccl::nccl_library().unwrap_or_default();
            (
                sweeps,
                format!("cuda (NCCL {nccl} from {lib}), one GPU per replica"),
            )
        }
    };
    for s in &sweeps {
        if let Some(w) = &s.wrong {
            report_error(boot.rank, &Error::Comm(w.to_string()));
        }
    }
    let wrong = sweeps[0].wrong_replicas;
    if boot.rank == 0 {
        let header = vec![
            "p2ptrain bench-allreduce: in-place all-reduce (average) of f32".to_string(),
            format!("backend {backend_line}"),
            format!(
                "{} process(es) x {k} replica(s) = {n} replicas; warmup {warmup}, iters {iters}",
                boot.size
            ),
            "each size checked on every replica before it is timed; time = slowest replica's \
             mean per all-reduce"
                .to_string(),
            format!(
                "algbw = bytes / time; busbw = algbw * 2(n-1)/n = algbw * {:.3}; GB = 1e9 bytes",
                bus_factor(n)
            ),
        ];
        print!("{}", format_table(&header, &sweeps[0].rows, n));
        if wrong > 0 {
            println!("# FAILED: {wrong} replica(s) saw a wrong result; see the errors above");
        }
    }
    i32::from(wrong > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::local::LocalGroup;
    use crate::dist::CpuComm;
    use std::sync::Arc;

    #[test]
    fn byte_counts_read_as_nccl_tests_does() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("1K"), Ok(1024));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert_eq!(parse_bytes("16M"), Ok(16 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert!(parse_bytes("1T").is_err());
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("-1").is_err());
    }

    #[test]
    fn sizes_double_from_min_to_max_in_whole_floats() {
        assert_eq!(sizes(1024, 8192, 2).unwrap(), [1024, 2048, 4096, 8192]);
        assert_eq!(sizes(1024, 8000, 2).unwrap(), [1024, 2048, 4096]);
        assert_eq!(sizes(6, 100, 4).unwrap(), [4, 24, 96]);
        assert_eq!(sizes(4, 4, 2).unwrap(), [4]);
        assert!(sizes(2, 100, 2).is_err());
        assert!(sizes(64, 32, 2).is_err());
        assert!(sizes(64, 128, 1).is_err());
        assert_eq!(
            sizes(1 << 30, usize::MAX, 1 << 20).unwrap(),
            [1 << 30, 1 << 50]
        );
    }

    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        let row = Row {
            bytes: 1_000_000_000,
            count: 250_000_000,
            seconds: 0.5,
        };
        assert!((row.algbw() - 2.0).abs() < 1e-12);
        assert_eq!(row.busbw(1), 0.0);
        assert!((row.busbw(2) - 2.0).abs() < 1e-12);
        assert!((row.busbw(8) - 3.5).abs() < 1e-12);
    }

    /// The average as NCCL computes a float `Avg` (each input times 1/n, rounded, then summed in
    /// f32) and as the CPU path does (sum, then times 1/n).
    fn averages(n: usize, count: usize) -> [Vec<f32>; 2] {
        let inv = 1.0 / n as f32;
        let premul = (0..count)
            .map(|j| (0..n).map(|r| pattern(r, j) * inv).sum())
            .collect();
        let postmul = (0..count)
            .map(|j| (0..n).map(|r| pattern(r, j)).sum::<f32>() * inv)
            .collect();
        [premul, postmul]
    }

    #[test]
    fn correct_averages_pass() {
        for n in 1..=64 {
            let expected = Expected::new(n);
            for avg in averages(n, 300) {
                assert_eq!(check_average(&avg, &expected), Ok(()), "n = {n}");
            }
        }
    }

    #[test]
    fn an_all_reduce_that_did_nothing_is_caught_on_every_rank() {
        for n in 2..=64 {
            let expected = Expected::new(n);
            for rank in 0..n {
                // The smallest default size: 1 KiB.
                let mut own = vec![0.0; 256];
                fill_pattern(&mut own, rank);
                assert!(
                    check_average(&own, &expected).is_err(),
                    "rank {rank} of {n}: its own values pass as the average"
                );
            }
        }
    }

    #[test]
    fn a_sum_instead_of_an_average_is_caught() {
        let expected = Expected::new(4);
        let sum: Vec<f32> = (0..100)
            .map(|j| (0..4).map(|r| pattern(r, j)).sum())
            .collect();
        assert!(check_average(&sum, &expected).is_err());
    }

    #[test]
    fn one_wrong_element_is_named() {
        let n = 3;
        let [mut avg, _] = averages(n, 1000);
        avg[737] += 0.01;
        let m = check_average(&avg, &Expected::new(n)).unwrap_err();
        assert_eq!(m.index, 737);
        assert_eq!(m.got, avg[737]);
        avg[737] = f32::NAN;
        assert_eq!(
            check_average(&avg, &Expected::new(n)).unwrap_err().index,
            737
        );
        // Shifted by one element (a wrong offset).
        let [avg, _] = averages(n, 1001);
        assert_eq!(
            check_average(&avg[1..], &Expected::new(n))
                .unwrap_err()
                .index,
            0
        );
    }

    /// Runs `f` on `k` local replicas of one process (no MPI), returning their results in order.
    fn on_local_replicas<R: Send>(k: usize, f: impl Fn(CpuComm) -> R + Sync) -> Vec<R> {
        let group = Arc::new(LocalGroup::new(k));
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..k)
                .map(|i| {
                    let (g, f) = (group.clone(), &f);
                    s.spawn(move || f(CpuComm::new(g, i, 0, 1, None)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn sweep_over_local_replicas_checks_and_times_every_size() {
        let sizes = sizes(4, 64 << 10, 4).unwrap();
        let sweeps = on_local_replicas(3, |comm| {
            sweep(&mut HostEndpoint::new(comm, 16 << 10), &sizes, 1, 2).unwrap()
        });
        for s in &sweeps {
            assert_eq!(s.wrong, None);
            assert_eq!(s.wrong_replicas, 0);
            let bytes: Vec<_> = s.rows.iter().map(|r| r.bytes).collect();
            assert_eq!(bytes, sizes);
            assert!(s.rows.iter().all(|r| r.seconds > 0.0));
        }
        // Every replica reports the same (slowest) times.
        assert_eq!(sweeps[0].rows, sweeps[2].rows);
        let table = format_table(&["test".into()], &sweeps[0].rows, 3);
        assert!(table.contains("busbw(GB/s)"));
        assert_eq!(
            table.lines().filter(|l| !l.starts_with('#')).count(),
            1 + sizes.len()
        );
    }

    /// A communicator whose all-reduce corrupts one element on one replica.
    struct Faulty {
        inner: CpuComm,
        bad_rank: usize,
        bad_index: usize,
    }

    impl Communicator for Faulty {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn size(&self) -> usize {
            self.inner.size()
        }
        fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
            self.inner.broadcast(buf, root)
        }
        fn all_reduce_avg(&mut self, buf: &mut [f32]) -> Result<()> {
            self.inner.all_reduce_avg(buf)?;
            if self.rank() == self.bad_rank && self.bad_index < buf.len() {
                buf[self.bad_index] += 1.0;
            }
            Ok(())
        }
        fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
            self.inner.all_reduce_sum_f64(buf)
        }
        fn barrier(&mut self) -> Result<()> {
            self.inner.barrier()
        }
    }

    #[test]
    fn a_wrong_result_on_one_replica_stops_every_replica() {
        // Element 300 exists from the 2 KiB size on (512 floats): 1 KiB is timed, 2 KiB fails.
        let sizes = sizes(1024, 8192, 2).unwrap();
        let sweeps = on_local_replicas(4, |comm| {
            let faulty = Faulty {
                inner: comm,
                bad_rank: 2,
                bad_index: 300,
            };
            sweep(&mut HostEndpoint::new(faulty, 2048), &sizes, 0, 1).unwrap()
        });
        for (rank, s) in sweeps.iter().enumerate() {
            assert_eq!(s.wrong_replicas, 1);
            assert_eq!(s.rows.len(), 1, "only 1 KiB was timed");
            if rank == 2 {
                let w = s.wrong.expect("replica 2 saw it");
                assert_eq!((w.bytes, w.rank, w.mismatch.index), (2048, 2, 300));
                let msg = w.to_string();
                assert!(
                    msg.contains("2048 bytes") && msg.contains("replica 2"),
                    "{msg}"
                );
                assert!(msg.contains("element 300"), "{msg}");
            } else {
                assert_eq!(s.wrong, None);
            }
        }
    }
}
