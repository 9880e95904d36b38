//! `p2ptrain bench-data CONFIG`: how many training images per second one rank's data pipeline
//! prepares — read, decode, augment (the config's transform) and assemble into batches of
//! `data.batch_size` — on its decode workers, with the rate per worker. No GPU, no MPI, no net:
//! the very reader a training replica uses ([`TrainReader`]) fills the batches, the first one is
//! checked (finite values once normalised, labels below the classes), and then the filling
//! and taking of `--batches` more is timed.
//!
//! `--decode-only` times reading and decoding alone (no resampling, no batch), each worker
//! claiming the next image as soon as it is done with one: the figure the JPEG decoders are
//! compared by.

use crate::data::{self, decode::Image, BatchStream, RecordSource, TrainOrder, TrainReader};
use crate::error::{Error, Result};
use crate::validate;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
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
    // The checked batch and the warm-up on one reader, the timed batches on another that
    // fills exactly those: the span covers their whole filling and nothing more.
    let order = || TrainOrder::new(source.len(), cfg.solver.random_seed, cfg.data.shuffle);
    let stream = BatchStream {
        batch,
        rank: 0,
        replicas: 1,
    };
    let reader = |range: std::ops::Range<u64>| {
        let (train, transform) = (split.train.clone(), split.transform.clone());
        TrainReader::start_range(train, order(), stream, range, cfg.data.prefetch, transform)
    };
    let take = |reader: &mut TrainReader, n: u64| -> Result<()> {
        for _ in 0..n {
            let b = reader.next()?;
            reader.recycle(b);
        }
        Ok(())
    };
    let warm = 1 + opts.warmup;
    let mut first = reader(0..warm);
    let checked = first.next()?;
    check_batch(source, &checked.data.to_f32(), &checked.labels)?;
    let pixels = match checked.data {
        data::Pixels::F32(_) => "f32",
        data::Pixels::U8 { .. } => "u8",
    };
    take(&mut first, opts.warmup)?;
    drop(first);
    let (start, cpu) = (Instant::now(), cpu_time());
    let mut timed = reader(warm..warm + opts.batches);
    take(&mut timed, opts.batches)?;
    let rate = DataRate {
        images: opts.batches * batch as u64,
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: cpu_time() - cpu,
        workers,
    };
    drop(timed);
    let [c, h, w] = split.input_shape();
    Ok((
        rate,
        format!("{format}, batches of {batch} × {c}×{h}×{w} ({pixels}), streamed"),
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

/// Reads and decodes `warmup + batches` batches of `batch` records in file order, on the
/// source's workers, each worker claiming the next record as soon as it is done with one.
fn decode_rate(
    source: &dyn RecordSource,
    batch: usize,
    opts: &BenchDataOptions,
) -> Result<DataRate> {
    let n = source.len();
    let decode = |records: std::ops::Range<usize>| -> Result<()> {
        let next = AtomicUsize::new(records.start);
        let failed = Mutex::new(None);
        let worker = || {
            let mut image = Image::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= records.end {
                    return;
                }
                if let Err(e) = source.read_image(i % n, &mut image) {
                    next.store(records.end, Ordering::Relaxed);
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            }
        };
        match source.workers() {
            Some(pool) => drop(pool.broadcast(|_| worker())),
            None => worker(),
        }
        failed
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(Ok(()), Err)
    };
    let warm = opts.warmup as usize * batch;
    decode(0..warm)?;
    let (start, cpu) = (Instant::now(), cpu_time());
    decode(warm..warm + opts.batches as usize * batch)?;
    Ok(DataRate {
        images: opts.batches * batch as u64,
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: cpu_time() - cpu,
        workers: 0,
    })
}
