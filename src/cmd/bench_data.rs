//! `p2ptrain bench-data CONFIG`: how many training images per second one rank's data pipeline
//! prepares — read, decode, augment (the config's transform) and assemble into batches of
//! `data.batch_size` — on its decode workers, with the rate per worker. No GPU, no MPI, no net:
//! the batches are checked (finite values, labels below the classes) and then timed.
//!
//! `--decode-only` times reading and decoding alone (no resampling, no batch), each worker
//! decoding whole images: the figure the JPEG decoders are compared by.

use crate::data::{self, decode::Image, Batch, BatchStream, ReadyQueue, RecordSource, TrainOrder};
use crate::error::{Error, Result};
use crate::validate;
use rayon::prelude::*;
use std::path::PathBuf;
use std::time::Instant;

/// What `p2ptrain bench-data` was asked.
#[derive(Debug, Clone)]
pub struct BenchDataOptions {
    pub config: PathBuf,
    pub sets: Vec<String>,
    /// Untimed batches first.
    pub warmup: u64,
    /// Timed batches.
    pub batches: u64,
    /// Decode workers (default: the config's `data.workers`, 0 = every core).
    pub workers: Option<usize>,
    /// Time reading and decoding only.
    pub decode_only: bool,
}

/// What one run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DataRate {
    pub images: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// CPU seconds of the whole process (user + system) over the same span: on a machine
    /// shared with other work, the images per CPU-second stay comparable when the wall clock
    /// does not.
    pub cpu_seconds: f64,
    pub workers: usize,
}

/// The process's CPU time so far (user + system), in seconds.
fn cpu_time() -> f64 {
    // SAFETY: getrusage writes into the struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

impl DataRate {
    pub fn per_second(&self) -> f64 {
        self.images as f64 / self.seconds.max(1e-12)
    }
}

/// Runs the benchmark and returns the exit code (2 for a bad config or data).
pub fn run(opts: &BenchDataOptions) -> i32 {
    match measure(opts) {
        Ok((rate, what)) => {
            let ips = rate.per_second();
            println!(
                "bench-data: {what}: {} images in {:.3} s on {} workers: {ips:.1} images/s, \
                 {:.1} images/s per worker; {:.3} CPU-seconds: {:.1} images per CPU-second",
                rate.images,
                rate.seconds,
                rate.workers,
                ips / rate.workers as f64,
                rate.cpu_seconds,
                rate.images as f64 / rate.cpu_seconds.max(1e-12)
            );
            0
        }
        Err(e) => {
            eprintln!("p2ptrain: error: {e}");
            e.exit_code()
        }
    }
}

/// Opens the config's training data and times it; returns the rate and a description.
pub fn measure(opts: &BenchDataOptions) -> Result<(DataRate, String)> {
    let (mut cfg, _) = validate::load(&opts.config, &opts.sets)?;
    if let Some(w) = opts.workers {
        cfg.data.workers = w;
    }
    let split = data::open(&cfg.data, cfg.solver.random_seed, 1)?;
    let source = split.train.as_ref();
    let workers = source
        .workers()
        .map_or_else(rayon::current_num_threads, |p| p.current_num_threads());
    let batch = cfg.data.batch_size;
    let format = serde_json::to_value(cfg.data.format)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    if opts.decode_only {
        let rate = decode_rate(source, batch, opts)?;
        return Ok((
            DataRate { workers, ..rate },
            format!("{format}, decode only"),
        ));
    }
    // Batches are filled as a training replica's reader fills them: several per parallel pass
    // where one holds too few records for the workers.
    let size = split.transform.output_size();
    let per_pass = ReadyQueue::new(cfg.data.prefetch, batch * size)
        .for_workers(batch, workers)
        .per_pass as u64;
    let mut order = TrainOrder::new(source.len(), cfg.solver.random_seed, cfg.data.shuffle);
    let stream = BatchStream {
        batch,
        rank: 0,
        replicas: 1,
    };
    let mut pass = vec![Batch::default(); per_pass as usize];
    let mut next = 0;
    let mut fill = |pass: &mut [Batch]| -> Result<()> {
        let filled = stream.fill(source, &mut order, next, &split.transform, pass);
        next += pass.len() as u64;
        filled.into_iter().collect()
    };
    fill(&mut pass)?;
    check_batch(source, &pass[0].data, &pass[0].labels)?;
    for _ in 0..opts.warmup.div_ceil(per_pass) {
        fill(&mut pass)?;
    }
    let passes = opts.batches.div_ceil(per_pass);
    let (start, cpu) = (Instant::now(), cpu_time());
    for _ in 0..passes {
        fill(&mut pass)?;
    }
    let rate = DataRate {
        images: passes * per_pass * batch as u64,
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: cpu_time() - cpu,
        workers,
    };
    let [c, h, w] = split.input_shape();
    Ok((
        rate,
        format!("{format}, batches of {batch} × {c}×{h}×{w}, {per_pass} per pass"),
    ))
}

/// A filled batch holds finite values and labels below the classes.
fn check_batch(source: &dyn RecordSource, values: &[f32], labels: &[f32]) -> Result<()> {
    if let Some(v) = values.iter().find(|v| !v.is_finite()) {
        return Err(Error::data(source.name(), format!("a batch holds {v}")));
    }
    let classes = source.classes() as f32;
    if let Some(l) = labels.iter().find(|&&l| !(0.0..classes).contains(&l)) {
        return Err(Error::data(
            source.name(),
            format!("a batch holds label {l}"),
        ));
    }
    Ok(())
}

/// Reads and decodes `warmup + batches` batches of `batch` records in file order, in parallel
/// on the source's workers.
fn decode_rate(
    source: &dyn RecordSource,
    batch: usize,
    opts: &BenchDataOptions,
) -> Result<DataRate> {
    let n = source.len();
    let decode_batch = |m: u64| -> Result<()> {
        let first = m as usize * batch;
        (first..first + batch)
            .into_par_iter()
            .map_init(Image::default, |image, i| {
                source.read_image(i % n, image).map(|_| ())
            })
            .collect::<Result<Vec<()>>>()
            .map(drop)
    };
    let run = |f: &(dyn Fn() -> Result<()> + Sync)| match source.workers() {
        Some(pool) => pool.install(f),
        None => f(),
    };
    run(&|| (0..opts.warmup).try_for_each(decode_batch))?;
    let (start, cpu) = (Instant::now(), cpu_time());
    run(&|| (opts.warmup..opts.warmup + opts.batches).try_for_each(decode_batch))?;
    Ok(DataRate {
        images: opts.batches * batch as u64,
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: cpu_time() - cpu,
        workers: 0,
    })
}
