//! `p2ptrain bench-allreduce` under the real `mpirun`: the CPU path on two ranks (with and without
//! local replica threads), the usage errors, and the NCCL path where the machine has GPUs (skipped
//! loudly elsewhere).

mod common;

use common::{mpi_p2ptrain, text};
use std::process::Output;

/// One parsed line of the table: bytes, count, time (µs), algbw, busbw.
#[derive(Debug)]
struct Line {
    bytes: usize,
    count: usize,
    time_us: f64,
    algbw: f64,
    busbw: f64,
}

/// The table rank 0 printed, after checking its column header.
fn table(stdout: &str) -> Vec<Line> {
    let header = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("bytes"))
        .unwrap_or_else(|| panic!("no column header in:\n{stdout}"));
    let columns: Vec<_> = header.split_whitespace().collect();
    assert_eq!(
        columns,
        ["bytes", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)"]
    );
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("bytes"))
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<_> = l.split_whitespace().collect();
            assert_eq!(f.len(), 5, "row {l:?}");
            Line {
                bytes: f[0].parse().unwrap(),
                count: f[1].parse().unwrap(),
                time_us: f[2].parse().unwrap(),
                algbw: f[3].parse().unwrap(),
                busbw: f[4].parse().unwrap(),
            }
        })
        .collect()
}

/// Checks the sizes 1 KiB … `max` doubling, and busbw = algbw · 2(n − 1)/n.
fn check_rows(rows: &[Line], max: usize, n: usize) {
    let expected: Vec<usize> = (10..).map(|p| 1 << p).take_while(|&b| b <= max).collect();
    let got: Vec<usize> = rows.iter().map(|r| r.bytes).collect();
    assert_eq!(got, expected);
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    for r in rows {
        assert_eq!(r.count, r.bytes / 4);
        assert!(r.time_us > 0.0, "{r:?}");
        assert!(r.algbw >= 0.0, "{r:?}");
        // Both columns are printed with two decimals.
        assert!((r.busbw - r.algbw * factor).abs() <= 0.01 + 1e-9, "{r:?}");
    }
}

/// `p2ptrain bench-allreduce --backend BACKEND FLAGS...` on two ranks.
fn bench(backend: &str, flags: &[&str]) -> Output {
    mpi_p2ptrain(
        2,
        &[&["bench-allreduce", "--backend", backend], flags].concat(),
    )
}

#[test]
fn bench_allreduce_on_two_ranks_checks_and_times_every_size() {
    let out = bench("cpu", &["--max-bytes", "1M", "--iters", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("= 2 replicas"), "{stdout}");
    assert!(stdout.contains("busbw = algbw * 2(n-1)/n"), "{stdout}");
    // Rank 0 alone prints the table.
    assert_eq!(stdout.matches("average busbw").count(), 1, "{stdout}");
    check_rows(&table(&stdout), 1 << 20, 2);
}

#[test]
fn bench_allreduce_with_local_replica_threads() {
    let out = bench(
        "cpu",
        &[
            "--replicas-per-rank",
            "2",
            "--max-bytes",
            "64K",
            "--iters",
            "2",
            "--warmup",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("2 process(es) x 2 replica(s) = 4 replicas"),
        "{stdout}"
    );
    check_rows(&table(&stdout), 64 << 10, 4);
}

#[test]
fn bench_allreduce_usage_errors_exit_2_reported_once() {
    let out = bench("cpu", &["--min-bytes", "1M", "--max-bytes", "1K"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let all = text(&out);
    assert_eq!(
        all.matches("--max-bytes 1024 is below --min-bytes").count(),
        1,
        "{all}"
    );
}

/// The NCCL path, one GPU per rank, where there are two GPUs and NCCL; skipped loudly elsewhere.
#[test]
fn bench_allreduce_over_nccl_on_two_gpus() {
    let gpus = if p2ptrain::cuda::available() {
        p2ptrain::cuda::device_count().unwrap_or(0)
    } else {
        0
    };
    if gpus < 2 || !p2ptrain::cuda::nccl::nccl_available() {
        // Straight to stderr: the harness captures `eprintln!`, and a skip must show.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED (needs 2 CUDA devices and NCCL; {gpus} device(s), NCCL {}): \
             bench_allreduce_over_nccl_on_two_gpus",
            if p2ptrain::cuda::nccl::nccl_available() {
                "present"
            } else {
                "missing"
            }
        );
        return;
    }
    let out = bench("cuda", &["--max-bytes", "1M", "--iters", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("backend cuda (NCCL"), "{stdout}");
    check_rows(&table(&stdout), 1 << 20, 2);
}
