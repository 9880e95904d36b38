//! The per-replica data reader: the training batches of one replica prepared ahead into a queue
//! (Caffe's producer/consumer data reader), with consumed buffers handed back for reuse; and the
//! synchronous filling of test batches.
//!
//! Two ways to fill the queue, chosen by the source:
//!
//! - Sources with decode workers ([`RecordSource::workers`], the image formats) are read by
//!   *streaming jobs* on those workers: each job claims the next `(batch, slot)` of the
//!   micro-batches the queue has room for (several batches in flight, at most
//!   [`ReadyQueue::capacity`] ready or in flight), writes that record straight into the slot
//!   of the batch's buffer, and reports it; a batch whose slots are all done joins the ready
//!   batches in micro-batch order. No pass ends in a barrier: a worker that finishes an image
//!   claims the next one, whichever batch it belongs to. A job ends when there is nothing to
//!   claim (the queue is full) and the reader starts jobs again as batches are taken, so
//!   workers that have nothing to do return to their pool (the test batches' fills use it too)
//!   instead of waiting in it.
//! - Other sources are read by a thread that fills one batch at a time, refilling the queue in
//!   bursts ([`ReadyQueue`]: it sleeps on a full queue until a refill's worth has been taken);
//!   a batch of at least [`PARALLEL_FILL_MIN`] values is filled in parallel on the rank's pool.
//!
//! Which records a batch holds and how each is transformed never depend on how it is filled:
//! slot j of micro-batch m holds the record at stream position `first_position(m) + j`.
//!
//! Batches are [`Pixels::U8`] where the transform allows ([`Transform::u8_batches`], decided
//! once per reader): the consumer normalises them ([`Normalize`]) into the same floats
//! [`Pixels::F32`] would carry.
//!
//! Dropping a [`TrainReader`] stops its filling: a flag is raised in the queue, a thread asleep
//! on a full queue is woken and joined, running jobs finish their record and end (the drop
//! waits for them). A record that cannot be read (a corrupt image) ends the filling, and once
//! the batches before it have been taken, [`TrainReader::next`] returns that error, which names
//! the record; a fill that panics (say, in a source's `fill`) becomes an error with the panic
//! message the same way, instead of a reader that blocks forever.

use super::order::{micro_batch_positions, TrainOrder};
use super::transform::{Normalize, Scratch, Transform};
use super::{Read, RecordSource};
use crate::error::{Error, Result};
use rayon::prelude::*;
use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Values per batch from which a source without decode workers fills records in parallel.
const PARALLEL_FILL_MIN: usize = 1 << 17;

/// A batch's inputs, `(b, C, H, W)`.
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    /// Normalised floats.
    F32(Vec<f32>),
    /// 8-bit pixels, which `normalize` turns into the floats [`Pixels::F32`] would hold.
    U8 {
        values: Vec<u8>,
        normalize: Arc<Normalize>,
    },
}

impl Default for Pixels {
    fn default() -> Self {
        Pixels::F32(Vec::new())
    }
}

impl Pixels {
    /// Values held (b·C·H·W).
    pub fn len(&self) -> usize {
        match self {
            Pixels::F32(v) => v.len(),
            Pixels::U8 { values, .. } => values.len(),
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The normalised floats: what the net receives.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Pixels::F32(v) => v.clone(),
            Pixels::U8 { values, normalize } => {
                let mut out = vec![0.0; values.len()];
                normalize.apply(values, &mut out);
                out
            }
        }
    }

    /// `len` floats to fill (the allocation kept where it already holds floats).
    fn floats(&mut self, len: usize) -> &mut [f32] {
        if !matches!(self, Pixels::F32(_)) {
            *self = Pixels::F32(Vec::new());
        }
        let Pixels::F32(v) = self else { unreachable!() };
        v.resize(len, 0.0);
        v
    }

    /// `len` pixels to fill, to be normalised by `normalize` (the allocation kept where it
    /// already holds pixels).
    fn bytes(&mut self, len: usize, normalize: &Arc<Normalize>) -> &mut [u8] {
        match self {
            Pixels::U8 { normalize: n, .. } => *n = Arc::clone(normalize),
            _ => {
                *self = Pixels::U8 {
                    values: Vec::new(),
                    normalize: Arc::clone(normalize),
                }
            }
        }
        let Pixels::U8 { values, .. } = self else {
            unreachable!()
        };
        values.resize(len, 0);
        values
    }
}

/// One replica's part of a training micro-batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// `(b, C, H, W)`: normalised floats, or 8-bit pixels and their normalisation.
    pub data: Pixels,
    /// `(b)`, the class indices as floats.
    pub labels: Vec<f32>,
    /// The micro-batch m this is a part of.
    pub micro_batch: u64,
    /// The stream position of the first record.
    pub first_position: u64,
    /// Unreadable records skipped while filling it (`data.on_corrupt = "skip"`).
    pub skipped: u64,
}

/// Fills each `(record, out)` job with `fill`, in parallel where the source has workers or the
/// batch is large, and returns the reads in job order.
fn fill_records<J: Sync, T: Send>(
    source: &dyn RecordSource,
    jobs: &[J],
    outs: Vec<&mut [T]>,
    fill: impl Fn(&J, &mut [T], &mut Scratch) -> Result<Read> + Sync,
) -> Vec<Result<Read>> {
    let values: usize = outs.iter().map(|o| o.len()).sum();
    let fill = &fill;
    let parallel = |outs: Vec<&mut [T]>| {
        jobs.par_iter()
            .zip(outs)
            .map_init(Scratch::default, |scratch, (job, out)| {
                fill(job, out, scratch)
            })
            .collect()
    };
    match source.workers() {
        Some(pool) => pool.install(|| parallel(outs)),
        None if values >= PARALLEL_FILL_MIN => parallel(outs),
        None => {
            let mut scratch = Scratch::default();
            jobs.iter()
                .zip(outs)
                .map(|(job, out)| fill(job, out, &mut scratch))
                .collect()
        }
    }
}

/// Writes the reads' labels into `labels`; returns the records skipped, or the first error.
fn take_labels(reads: Vec<Result<Read>>, labels: &mut [f32]) -> Result<u64> {
    let mut skipped = 0;
    for (label, read) in labels.iter_mut().zip(reads) {
        let read = read?;
        *label = read.label as f32;
        skipped += u64::from(read.skipped);
    }
    Ok(skipped)
}

/// Fills `data` and `labels` (resized, allocations kept) with replica `rank`'s part of
/// micro-batch `m`, as normalised floats: `batch` records from the stream positions of
/// [`micro_batch_positions`], each transformed by `transform` (train mode). Returns the first
/// position and the unreadable records skipped, or the error naming a record that cannot be read.
#[allow(clippy::too_many_arguments)]
pub fn fill_train_batch(
    source: &dyn RecordSource,
    order: &mut TrainOrder,
    m: u64,
    batch: usize,
    rank: usize,
    replicas: usize,
    transform: &Transform,
    data: &mut Vec<f32>,
    labels: &mut Vec<f32>,
) -> Result<(u64, u64)> {
    let mut one = [Batch {
        data: Pixels::F32(std::mem::take(data)),
        labels: std::mem::take(labels),
        ..Batch::default()
    }];
    let stream = BatchStream {
        batch,
        rank,
        replicas,
    };
    let filled = stream.fill(source, order, m, transform, None, &mut one);
    let [b] = one;
    let Pixels::F32(floats) = b.data else {
        unreachable!("filled as floats")
    };
    (*data, *labels) = (floats, b.labels);
    filled.into_iter().next().expect("one batch filled")?;
    Ok((b.first_position, b.skipped))
}

/// Replica `rank` of `replicas`'s training micro-batches of `batch` records.
#[derive(Debug, Clone, Copy)]
pub struct BatchStream {
    pub batch: usize,
    pub rank: usize,
    pub replicas: usize,
}

impl BatchStream {
    /// Micro-batch `m`'s stream positions and records, in slot order; sets the batch's
    /// `micro_batch`, `first_position`, `skipped` (0) and `labels` length.
    fn open(&self, order: &mut TrainOrder, m: u64, b: &mut Batch) -> Vec<(u64, usize)> {
        let positions = micro_batch_positions(m, self.batch, self.rank, self.replicas);
        (b.micro_batch, b.first_position, b.skipped) = (m, positions.start, 0);
        b.labels.resize(self.batch, 0.0);
        positions.map(|p| (p, order.record(p))).collect()
    }

    /// Fills `out[i]` (buffers resized, allocations kept) with micro-batch `first + i`, every
    /// record of every batch in one parallel fill, each transformed by `transform` (train mode):
    /// as 8-bit pixels when `u8` gives their normalisation, else as normalised floats. Sets
    /// each batch's `micro_batch`, `first_position` and `skipped`. Returns, per batch, whether
    /// it could be read (an error naming its first unreadable record).
    pub fn fill(
        &self,
        source: &dyn RecordSource,
        order: &mut TrainOrder,
        first: u64,
        transform: &Transform,
        u8: Option<&Arc<Normalize>>,
        out: &mut [Batch],
    ) -> Vec<Result<()>> {
        let size = transform.output_size();
        let mut records = Vec::with_capacity(out.len() * self.batch);
        for (m, b) in (first..).zip(out.iter_mut()) {
            records.extend(self.open(order, m, b));
        }
        let n = self.batch * size;
        let reads = match u8 {
            None => {
                let outs = out
                    .iter_mut()
                    .flat_map(|b| b.data.floats(n).chunks_exact_mut(size))
                    .collect();
                fill_records(source, &records, outs, |(p, rec), out, scratch| {
                    transform.train(source, *rec, *p, out, scratch)
                })
            }
            Some(normalize) => {
                let outs = out
                    .iter_mut()
                    .flat_map(|b| b.data.bytes(n, normalize).chunks_exact_mut(size))
                    .collect();
                fill_records(source, &records, outs, |(p, rec), out, scratch| {
                    transform.train_u8(source, *rec, *p, out, scratch)
                })
            }
        };
        let mut reads = reads.into_iter();
        out.iter_mut()
            .map(|b| {
                let batch_reads = reads.by_ref().take(self.batch).collect();
                b.skipped = take_labels(batch_reads, &mut b.labels)?;
                Ok(())
            })
            .collect()
    }
}

/// Fills `data` and `labels` (resized, allocations kept) with the test records `range`, in order,
/// each transformed by `transform` (test mode: centre crop, no flip). Returns the unreadable
/// records skipped, or the error naming a record that cannot be read.
pub fn fill_test_batch(
    source: &dyn RecordSource,
    transform: &Transform,
    range: Range<usize>,
    data: &mut Vec<f32>,
    labels: &mut Vec<f32>,
) -> Result<u64> {
    let size = transform.output_size();
    data.resize(range.len() * size, 0.0);
    labels.resize(range.len(), 0.0);
    let records: Vec<usize> = range.collect();
    let outs = data.chunks_exact_mut(size).collect();
    let reads = fill_records(source, &records, outs, |&i, out, scratch| {
        transform.test(source, i, out, scratch)
    });
    take_labels(reads, labels)
}

/// Bytes of batches a reader keeps ready when its batches are small: it then holds more than
/// `data.prefetch` of them (up to [`MAX_READY_BATCHES`]), so that its thread can refill in bursts.
pub const READY_BYTES: usize = 32 << 20;

/// The most batches a reader keeps ready, whatever their size.
pub const MAX_READY_BATCHES: usize = 256;

/// Bytes of batches a reader's thread fills per wake-up, at least one batch and at most half its
/// queue. Small batches are refilled many at a time; large ones (a GPU's) one at a time as they
/// are taken, so that their parallel fills keep spreading evenly between the steps, which share
/// the worker pool (the copy into pinned memory).
pub const REFILL_BYTES: usize = 4 << 20;

/// Records a reader keeps in flight per decode worker at least (batches being filled and batches
/// ready together), where `data.prefetch` batches hold fewer: a worker that finishes a record
/// then always finds another to claim while the consumer takes a batch.
pub const RECORDS_PER_WORKER: usize = 4;

/// The size of a reader's queue of ready batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyQueue {
    /// Batches kept ready (or, on decode workers, ready and in flight) at most: at least
    /// `data.prefetch` (and 1), as many as fit [`READY_BYTES`], at most [`MAX_READY_BATCHES`].
    pub capacity: usize,
    /// Batches filled per wake-up: the filling sleeps on a full queue until this many have been
    /// taken.
    pub refill: usize,
}

impl ReadyQueue {
    /// The queue of a reader of `batch_floats`-float batches with `data.prefetch = prefetch`.
    pub fn new(prefetch: usize, batch_floats: usize) -> Self {
        let batch_bytes = batch_floats
            .max(1)
            .saturating_mul(std::mem::size_of::<f32>());
        let capacity = (READY_BYTES / batch_bytes)
            .min(MAX_READY_BATCHES)
            .max(prefetch)
            .max(1);
        let refill = (REFILL_BYTES / batch_bytes).clamp(1, (capacity / 2).max(1));
        ReadyQueue { capacity, refill }
    }

    /// This queue for batches of `batch` records streamed by `workers` decode workers: room for
    /// [`RECORDS_PER_WORKER`] records per worker (at most [`MAX_READY_BATCHES`] batches).
    pub fn for_workers(self, batch: usize, workers: usize) -> Self {
        let capacity = (RECORDS_PER_WORKER * workers)
            .div_ceil(batch.max(1))
            .max(self.capacity)
            .min(MAX_READY_BATCHES);
        ReadyQueue { capacity, ..self }
    }

    /// The queue length at which a filling asleep on a full queue is woken.
    pub fn low_water(&self) -> usize {
        self.capacity - self.refill
    }
}

/// The queue between a [`TrainReader`] and its filling, under one mutex.
#[derive(Default)]
struct Queue {
    /// Filled batches, oldest first.
    ready: VecDeque<Batch>,
    /// Consumed batches handed back, their buffers to be refilled.
    free: Vec<Batch>,
    /// The reader waits for a batch.
    consumer_waiting: bool,
    /// The thread waits for the queue to drain to the low-water mark.
    producer_waiting: bool,
    /// The filling has ended (stopped, failed, or panicked).
    producer_gone: bool,
    /// Why the filling ended, when a record could not be read.
    failed: Option<Error>,
    /// The reader asks the filling to end.
    stop: bool,
    /// Batches filled so far.
    filled: u64,
    /// The streaming jobs' side, on decode workers.
    stream: Option<StreamState>,
    /// Times the thread has been woken from a full queue.
    #[cfg(test)]
    refills: u64,
}

/// A [`Queue`] and the conditions its sides wait on.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// A batch was filled (or the filling ended).
    filled: Condvar,
    /// The queue drained to its low-water mark (or the reader stops).
    drained: Condvar,
    /// The last streaming job ended.
    jobs_ended: Condvar,
}

impl Shared {
    /// The queue; a panic elsewhere while holding it leaves it consistent, so poisoning is
    /// ignored.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Replica `rank`'s training batches, prepared ahead of the consumer (see the module docs).
pub struct TrainReader {
    shared: Arc<Shared>,
    /// The thread filling the queue, for sources without decode workers.
    handle: Option<JoinHandle<()>>,
    /// The streaming jobs' context, for sources with decode workers.
    streamer: Option<Arc<Streamer>>,
    /// `next` has returned the filling's end.
    ended: bool,
    rank: usize,
    queue: ReadyQueue,
}

impl TrainReader {
    /// Starts filling replica `rank` of `replicas`'s batches of `batch` records from micro-batch
    /// `first_micro_batch` on, with `prefetch` batches ready at least (more when they are small:
    /// [`ReadyQueue`]), each record transformed by `transform` (train mode). The order is keyed
    /// by `seed` (shuffled when `shuffle`).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        source: Arc<dyn RecordSource>,
        seed: u64,
        shuffle: bool,
        batch: usize,
        rank: usize,
        replicas: usize,
        first_micro_batch: u64,
        prefetch: usize,
        transform: Transform,
    ) -> Self {
        let stream = BatchStream {
            batch,
            rank,
            replicas,
        };
        let order = TrainOrder::new(source.len(), seed, shuffle);
        Self::start_range(
            source,
            order,
            stream,
            first_micro_batch..u64::MAX,
            prefetch,
            transform,
        )
    }

    /// [`TrainReader::start`] for the micro-batches `micro_batches` only, in `order`: once they
    /// have all been taken, `next` says the filling has stopped (`bench-data` times exactly
    /// these).
    pub fn start_range(
        source: Arc<dyn RecordSource>,
        order: TrainOrder,
        stream: BatchStream,
        micro_batches: Range<u64>,
        prefetch: usize,
        transform: Transform,
    ) -> Self {
        let BatchStream {
            batch,
            rank,
            replicas,
        } = stream;
        assert!(batch > 0, "batch size must be positive");
        assert!(rank < replicas, "rank {rank} of {replicas} replicas");
        let workers = source.workers().map_or(0, |p| p.current_num_threads());
        let mut queue = ReadyQueue::new(prefetch, batch * transform.output_size());
        let u8 = transform
            .u8_batches(&*source)
            .then(|| Arc::new(transform.normalization()));
        let shared = Arc::new(Shared::default());
        let (mut handle, mut streamer) = (None, None);
        if workers > 0 {
            queue = queue.for_workers(batch, workers);
            shared.lock().stream = Some(StreamState {
                order,
                next: micro_batches.start,
                end: micro_batches.end,
                in_flight: VecDeque::new(),
                jobs: 0,
                failed_at: None,
            });
            let s = Arc::new(Streamer {
                source,
                transform,
                stream,
                u8,
                queue,
                workers,
                shared: Arc::clone(&shared),
            });
            s.start_jobs(&mut shared.lock());
            streamer = Some(s);
        } else {
            let producer = Producer {
                order,
                source,
                stream,
                transform,
                u8,
                next: micro_batches.start,
                end: micro_batches.end,
                queue,
                shared: Arc::clone(&shared),
            };
            handle = Some(
                std::thread::Builder::new()
                    .name(format!("data-reader-{rank}"))
                    .spawn(move || producer.run())
                    .expect("spawning the data reader thread"),
            );
        }
        TrainReader {
            shared,
            handle,
            streamer,
            ended: false,
            rank,
            queue,
        }
    }

    /// The next batch, waiting for it when it is not ready yet. An error when the filling has
    /// ended: the record that could not be read, or the panic that stopped it.
    #[allow(clippy::should_implement_trait)] // blocking and fallible, never exhausted: no Iterator
    pub fn next(&mut self) -> Result<Batch> {
        if self.ended {
            return Err(self.stopped("stopped earlier"));
        }
        let mut q = self.shared.lock();
        loop {
            if let Some(batch) = q.ready.pop_front() {
                self.taken(&mut q);
                return Ok(batch);
            }
            if q.producer_gone {
                break;
            }
            q.consumer_waiting = true;
            q = self
                .shared
                .filled
                .wait(q)
                .unwrap_or_else(|p| p.into_inner());
            q.consumer_waiting = false;
        }
        self.ended = true;
        let failed = q.failed.take();
        drop(q);
        let joined = self.handle.take().map(JoinHandle::join);
        if let Some(e) = failed {
            return Err(e);
        }
        let why = match joined {
            Some(Err(payload)) => format!("panicked: {}", panic_message(&*payload)),
            _ => "stopped".to_string(),
        };
        Err(self.stopped(&why))
    }

    /// After a batch was taken from `q`: wakes the thread, or starts jobs, once the queue has
    /// drained to its low-water mark.
    fn taken(&self, q: &mut Queue) {
        let low = self.queue.low_water();
        if let Some(s) = &self.streamer {
            s.start_jobs(q);
        } else if q.producer_waiting && q.ready.len() <= low {
            q.producer_waiting = false;
            self.shared.drained.notify_one();
        }
    }

    /// Batches filled so far (taken or ready): what `bench-data` counts.
    pub fn batches_filled(&self) -> u64 {
        self.shared.lock().filled
    }

    /// Hands a consumed batch's buffers back to the filling, to be refilled without allocating.
    pub fn recycle(&mut self, batch: Batch) {
        self.shared.lock().free.push(batch);
    }

    /// How many batches are ready now, how many times the thread has been woken to refill, and
    /// whether it is asleep on a queue that has not drained to its low-water mark since it was full.
    #[cfg(test)]
    fn queue_state(&self) -> (usize, u64, bool) {
        let q = self.shared.lock();
        (q.ready.len(), q.refills, q.producer_waiting)
    }

    /// Streaming jobs running now and batches in flight (0, 0 without decode workers).
    #[cfg(test)]
    fn stream_state(&self) -> (usize, usize) {
        let q = self.shared.lock();
        q.stream
            .as_ref()
            .map_or((0, 0), |s| (s.jobs, s.in_flight.len()))
    }

    fn stopped(&self, why: &str) -> Error {
        stopped_error(self.rank, why)
    }
}

/// The error of replica `rank`'s reader whose filling ended: `why`.
fn stopped_error(rank: usize, why: &str) -> Error {
    Error::io(
        format!("data reader of replica {rank}"),
        std::io::Error::other(format!("its thread {why}")),
    )
}

/// The message of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

impl Drop for TrainReader {
    fn drop(&mut self) {
        let mut q = self.shared.lock();
        q.stop = true;
        self.shared.drained.notify_one();
        // Running jobs write into the buffers of the batches in flight: wait for them.
        while q.stream.as_ref().is_some_and(|s| s.jobs > 0) {
            q = self
                .shared
                .jobs_ended
                .wait(q)
                .unwrap_or_else(|p| p.into_inner());
        }
        drop(q);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The streaming jobs' side of the queue.
struct StreamState {
    order: TrainOrder,
    /// The next micro-batch to open.
    next: u64,
    /// The micro-batch at which the filling stops.
    end: u64,
    /// Batches being filled, in micro-batch order; only the last may have slots left to claim.
    in_flight: VecDeque<InFlight>,
    /// Jobs started and not yet ended.
    jobs: usize,
    /// The first micro-batch found to hold an unreadable record: nothing after it is claimed.
    failed_at: Option<u64>,
}

/// A batch being filled by the streaming jobs.
struct InFlight {
    batch: Batch,
    /// `(stream position, record)` per slot.
    records: Vec<(u64, usize)>,
    /// Slots claimed so far (claimed in order).
    claimed: usize,
    /// Slots reported done.
    done: usize,
    /// The first slot (in slot order) that could not be read, and why.
    error: Option<(usize, Error)>,
}

/// Where a claimed slot's record goes: the slot of the batch's buffer, as a raw view.
enum SlotOut {
    F32(*mut f32, usize),
    U8(*mut u8, usize),
}

/// A slot claimed by a job: micro-batch, slot, stream position, record, destination.
struct Claim {
    m: u64,
    slot: usize,
    position: u64,
    record: usize,
    out: SlotOut,
}

/// What every streaming job of a reader shares.
struct Streamer {
    source: Arc<dyn RecordSource>,
    transform: Transform,
    stream: BatchStream,
    /// The normalisation of 8-bit batches, `None` for float batches.
    u8: Option<Arc<Normalize>>,
    queue: ReadyQueue,
    /// Jobs at most (the decode workers).
    workers: usize,
    shared: Arc<Shared>,
}

impl Streamer {
    /// Starts jobs up to one per worker where the queue has drained to its low-water mark (or
    /// a batch in flight has slots left) and the filling goes on.
    fn start_jobs(self: &Arc<Self>, q: &mut Queue) {
        let stop = q.stop;
        let held = q.ready.len();
        let Some(s) = q.stream.as_mut() else { return };
        let open_slots = s
            .in_flight
            .back()
            .is_some_and(|b| b.claimed < self.stream.batch);
        let room = held + s.in_flight.len() <= self.queue.low_water();
        if stop || s.failed_at.is_some() || !(room || open_slots) {
            return;
        }
        let pool = self.source.workers().expect("a source with decode workers");
        while s.jobs < self.workers {
            s.jobs += 1;
            let me = Arc::clone(self);
            pool.spawn(move || me.work());
        }
    }

    /// One job: claims, fills and reports slots until there is nothing to claim. It lets go
    /// of the reader's context before it counts itself out, so that a dropped reader has
    /// released its source once its drop returns.
    fn work(self: Arc<Self>) {
        let mut scratch = Scratch::default();
        let shared = Arc::clone(&self.shared);
        let mut q = shared.lock();
        while let Some(claim) = self.claim(&mut q) {
            drop(q);
            let read = catch_unwind(AssertUnwindSafe(|| self.fill(&claim, &mut scratch)))
                .unwrap_or_else(|payload| {
                    let why = format!("panicked: {}", panic_message(&*payload));
                    Err(stopped_error(self.stream.rank, &why))
                });
            q = shared.lock();
            self.report(&mut q, &claim, read);
        }
        drop(self);
        let s = q.stream.as_mut().expect("a streaming queue");
        s.jobs -= 1;
        if s.jobs == 0 {
            shared.jobs_ended.notify_all();
        }
    }

    /// The next slot to fill: the next one of the batch being opened, or slot 0 of a new
    /// batch where the queue has room; `None` when the reader stops, the filling failed before,
    /// or the queue is full.
    fn claim(&self, q: &mut Queue) -> Option<Claim> {
        if q.stop {
            return None;
        }
        let held = q.ready.len();
        let s = q.stream.as_mut().expect("a streaming queue");
        let b = self.stream.batch;
        let last_open = s.in_flight.back().is_some_and(|f| {
            f.claimed < b && s.failed_at.is_none_or(|at| f.batch.micro_batch <= at)
        });
        if !last_open {
            let full = held + s.in_flight.len() >= self.queue.capacity;
            if s.failed_at.is_some() || full || s.next >= s.end {
                return None;
            }
            let mut batch = q.free.pop().unwrap_or_default();
            let records = self.stream.open(&mut s.order, s.next, &mut batch);
            let n = b * self.transform.output_size();
            match &self.u8 {
                Some(normalize) => {
                    batch.data.bytes(n, normalize);
                }
                None => {
                    batch.data.floats(n);
                }
            }
            s.next += 1;
            s.in_flight.push_back(InFlight {
                batch,
                records,
                claimed: 0,
                done: 0,
                error: None,
            });
        }
        let f = s.in_flight.back_mut().expect("a batch in flight");
        let slot = f.claimed;
        f.claimed += 1;
        let size = self.transform.output_size();
        let out = match &mut f.batch.data {
            Pixels::F32(v) => SlotOut::F32(v[slot * size..].as_mut_ptr(), size),
            Pixels::U8 { values, .. } => SlotOut::U8(values[slot * size..].as_mut_ptr(), size),
        };
        let (position, record) = f.records[slot];
        Some(Claim {
            m: f.batch.micro_batch,
            slot,
            position,
            record,
            out,
        })
    }

    /// Fills a claimed slot.
    fn fill(&self, c: &Claim, scratch: &mut Scratch) -> Result<Read> {
        let (source, t) = (&*self.source, &self.transform);
        // SAFETY: the slot was claimed under the queue's lock by this job alone (slots are
        // handed out once each), so no other reference to these elements exists; the batch's
        // buffer is neither resized nor dropped while it is in flight, which it stays until
        // every claimed slot has been reported (and the reader's drop waits for running jobs).
        match c.out {
            SlotOut::F32(ptr, len) => {
                let out = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                t.train(source, c.record, c.position, out, scratch)
            }
            SlotOut::U8(ptr, len) => {
                let out = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                t.train_u8(source, c.record, c.position, out, scratch)
            }
        }
    }

    /// Records a filled slot, and moves the batches whose slots are all done, oldest first, to
    /// the ready batches; the first of them that holds an unreadable record ends the filling.
    fn report(&self, q: &mut Queue, c: &Claim, read: Result<Read>) {
        let b = self.stream.batch;
        let s = q.stream.as_mut().expect("a streaming queue");
        let front = s
            .in_flight
            .front()
            .expect("a batch in flight")
            .batch
            .micro_batch;
        let f = &mut s.in_flight[(c.m - front) as usize];
        match read {
            Ok(read) => {
                f.batch.labels[c.slot] = read.label as f32;
                f.batch.skipped += u64::from(read.skipped);
            }
            Err(e) => {
                if f.error.as_ref().is_none_or(|(slot, _)| c.slot < *slot) {
                    f.error = Some((c.slot, e));
                }
                s.failed_at = Some(s.failed_at.map_or(c.m, |at| at.min(c.m)));
            }
        }
        f.done += 1;
        if q.producer_gone {
            return; // the filling failed: nothing after the failed batch is delivered
        }
        let mut delivered = false;
        while s.in_flight.front().is_some_and(|f| f.done == b) {
            let f = s.in_flight.pop_front().expect("a batch in flight");
            if let Some((_, e)) = f.error {
                q.failed = Some(e);
                q.producer_gone = true;
                delivered = true;
                break;
            }
            q.ready.push_back(f.batch);
            q.filled += 1;
            delivered = true;
        }
        if s.next >= s.end && s.in_flight.is_empty() {
            q.producer_gone = true; // every micro-batch asked for is ready
            delivered = true;
        }
        if delivered && q.consumer_waiting {
            self.shared.filled.notify_one();
        }
    }
}

/// The thread's side of a [`TrainReader`] on a source without decode workers.
struct Producer {
    source: Arc<dyn RecordSource>,
    order: TrainOrder,
    stream: BatchStream,
    transform: Transform,
    /// The normalisation of 8-bit batches, `None` for float batches.
    u8: Option<Arc<Normalize>>,
    next: u64,
    /// The micro-batch at which the thread stops.
    end: u64,
    /// Once the queue is full, the thread waits until the reader has taken it down to its
    /// low-water mark.
    queue: ReadyQueue,
    shared: Arc<Shared>,
}

/// Marks the thread's end in the queue and wakes a waiting reader, also when the thread
/// unwinds from a panic.
struct Gone(Arc<Shared>);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.lock().producer_gone = true;
        self.0.filled.notify_one();
    }
}

impl Producer {
    fn run(mut self) {
        let _gone = Gone(Arc::clone(&self.shared));
        let mut q = self.shared.lock();
        loop {
            if q.stop || self.next >= self.end {
                return;
            }
            if q.ready.len() >= self.queue.capacity {
                q.producer_waiting = true;
                while q.producer_waiting && !q.stop {
                    q = self
                        .shared
                        .drained
                        .wait(q)
                        .unwrap_or_else(|p| p.into_inner());
                }
                #[cfg(test)]
                {
                    q.refills += 1;
                }
                continue;
            }
            let mut one = [q.free.pop().unwrap_or_default()];
            drop(q);
            let filled = self.stream.fill(
                &*self.source,
                &mut self.order,
                self.next,
                &self.transform,
                self.u8.as_ref(),
                &mut one,
            );
            self.next += 1;
            q = self.shared.lock();
            // An unreadable record ends the thread; the batches before it were delivered.
            let [b] = one;
            if let Err(e) = filled.into_iter().next().expect("one batch filled") {
                q.failed = Some(e);
                return;
            }
            q.ready.push_back(b);
            q.filled += 1;
            if q.consumer_waiting {
                self.shared.filled.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_util::FnSource;
    use crate::data::{Split, SyntheticSource};
    use std::time::{Duration, Instant};

    fn digits() -> Arc<dyn RecordSource> {
        Arc::new(crate::data::digits::open(10, 0.0, 1.0 / 256.0).unwrap().0)
    }

    fn direct(
        source: &dyn RecordSource,
        seed: u64,
        shuffle: bool,
        m: u64,
        b: usize,
        r: usize,
        replicas: usize,
    ) -> Batch {
        let mut order = TrainOrder::new(source.len(), seed, shuffle);
        let (mut data, mut labels) = (Vec::new(), Vec::new());
        let first_position = fill_train_batch(
            source,
            &mut order,
            m,
            b,
            r,
            replicas,
            &Transform::identity(source.record_shape()),
            &mut data,
            &mut labels,
        )
        .unwrap()
        .0;
        Batch {
            data: Pixels::F32(data),
            labels,
            micro_batch: m,
            first_position,
            skipped: 0,
        }
    }

    /// `batch` with its inputs as the net receives them (normalised floats).
    fn as_floats(batch: Batch) -> Batch {
        Batch {
            data: Pixels::F32(batch.data.to_f32()),
            ..batch
        }
    }

    /// The central property: R replicas of batch b, concatenated in rank order, read the very
    /// records of one replica of batch b·R, for every micro-batch, epoch boundaries included.
    #[test]
    fn replicas_together_read_what_one_replica_reads() {
        let sources: [(Arc<dyn RecordSource>, usize); 2] = [
            (digits(), 1500),
            (
                Arc::new(SyntheticSource::new([2, 2, 3], 5, 23, 4, Split::Train)),
                23,
            ),
        ];
        for (source, n) in &sources {
            for shuffle in [true, false] {
                for b in [1usize, 3, 32] {
                    for replicas in [1usize, 2, 4] {
                        let mut ms: Vec<u64> = (0..4).collect();
                        // The micro-batches that hold the first epoch boundaries.
                        let global = (b * replicas) as u64;
                        ms.extend((1..4u64).map(|e| e * *n as u64 / global));
                        ms.push(1000);
                        for &m in &ms {
                            let one = direct(&**source, 9, shuffle, m, b * replicas, 0, 1);
                            let mut data = Vec::new();
                            let mut labels = Vec::new();
                            for r in 0..replicas {
                                let part = direct(&**source, 9, shuffle, m, b, r, replicas);
                                assert_eq!(
                                    part.first_position,
                                    one.first_position + (r * b) as u64
                                );
                                data.extend(part.data.to_f32());
                                labels.extend(part.labels);
                            }
                            assert_eq!(data, one.data.to_f32(), "b {b} R {replicas} m {m}");
                            assert_eq!(labels, one.labels, "b {b} R {replicas} m {m}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn boundary_batches_do_straddle_epochs() {
        // 23 records, 4 replicas × 3: micro-batch 1 covers positions 12..24, across the boundary.
        let s = SyntheticSource::new([1, 1, 2], 3, 23, 4, Split::Train);
        let last = direct(&s, 9, true, 1, 3, 3, 4);
        assert_eq!(last.first_position, 21);
        let mut o = TrainOrder::new(23, 9, true);
        let recs: Vec<usize> = (21..24).map(|p| o.record(p)).collect();
        let p0 = crate::data::permutation(23, 9, 0);
        let p1 = crate::data::permutation(23, 9, 1);
        assert_eq!(recs, vec![p0[21], p0[22], p1[0]]);
        let want: Vec<f32> = recs.iter().map(|&i| s.label(i) as f32).collect();
        assert_eq!(last.labels, want);
        // A batch larger than the whole set spans several epochs.
        let big = direct(&s, 9, false, 0, 50, 0, 1);
        let want: Vec<f32> = (0..50).map(|p| s.label(p % 23) as f32).collect();
        assert_eq!(big.labels, want);
    }

    /// Read by the thread (no decode workers): digits the source scales itself travel as floats,
    /// raw ones as bytes; either way the batches are the direct ones.
    #[test]
    fn reader_delivers_the_direct_batches() {
        let raw: Arc<dyn RecordSource> =
            Arc::new(crate::data::digits::open(10, 0.0, 1.0).unwrap().0);
        for (source, u8) in [(digits(), false), (raw, true)] {
            for (rank, replicas, first) in [(0, 1, 0u64), (1, 2, 5), (3, 4, 40)] {
                let mut reader = TrainReader::start(
                    Arc::clone(&source),
                    3,
                    true,
                    16,
                    rank,
                    replicas,
                    first,
                    2,
                    Transform::identity(source.record_shape()),
                );
                for m in first..first + 60 {
                    let got = reader.next().unwrap();
                    assert_eq!(matches!(got.data, Pixels::U8 { .. }), u8);
                    let got = as_floats(got);
                    assert_eq!(got, direct(&*source, 3, true, m, 16, rank, replicas));
                    if m % 2 == 0 {
                        reader.recycle(got);
                    }
                }
            }
        }
    }

    /// Record `i`'s value `k`: a whole 8-bit value, so that the same records can be declared
    /// floats or bytes.
    fn byte_ramp(i: usize, out: &mut [f32]) {
        for (k, v) in out.iter_mut().enumerate() {
            *v = ((i * 7 + k) % 256) as f32;
        }
    }

    /// Streamed on decode workers (several batches in flight, slots claimed in any order), the
    /// batches are the direct ones, as floats and as bytes, for a replica of several, whatever
    /// the consumer recycles.
    #[test]
    fn streamed_batches_are_the_direct_batches() {
        let floats = FnSource::new(37, [2, 2, 3], byte_ramp)
            .labelled(|i| (i % 2) as u32)
            .with_workers(8);
        let bytes = FnSource::new(37, [2, 2, 3], byte_ramp)
            .labelled(|i| (i % 2) as u32)
            .with_workers(3)
            .of_u8();
        let sources: [Arc<dyn RecordSource>; 2] = [Arc::new(floats), Arc::new(bytes)];
        for (source, u8) in sources.iter().zip([false, true]) {
            let shape = source.record_shape();
            let transform = Transform::new(shape, 2, true, &[3.0, 5.5], 0.25, 0, 4);
            let mut reader = TrainReader::start(
                Arc::clone(source),
                5,
                true,
                4,
                1,
                3,
                7,
                2,
                transform.clone(),
            );
            for m in 7..7 + 50 {
                let got = reader.next().unwrap();
                assert_eq!(matches!(got.data, Pixels::U8 { .. }), u8, "{got:?}");
                let mut order = TrainOrder::new(source.len(), 5, true);
                let (mut data, mut labels) = (Vec::new(), Vec::new());
                let (first, _) = fill_train_batch(
                    &**source,
                    &mut order,
                    m,
                    4,
                    1,
                    3,
                    &transform,
                    &mut data,
                    &mut labels,
                )
                .unwrap();
                let want = Batch {
                    data: Pixels::F32(data),
                    labels,
                    micro_batch: m,
                    first_position: first,
                    skipped: 0,
                };
                assert_eq!(as_floats(got.clone()), want, "micro-batch {m}, u8 {u8}");
                if m % 3 != 0 {
                    reader.recycle(got);
                }
            }
        }
    }

    /// A consumer that takes nothing: the jobs fill the queue up to its capacity (batches
    /// ready and in flight together) and end, rather than wait on their workers; taking
    /// batches down to the low-water mark starts them again. Dropping the reader releases
    /// everything the jobs held.
    #[test]
    fn streaming_jobs_stop_at_a_full_queue_and_resume_when_batches_are_taken() {
        let source: Arc<dyn RecordSource> =
            Arc::new(FnSource::new(100, [1, 2, 2], byte_ramp).with_workers(4));
        let shape = source.record_shape();
        let queue = ReadyQueue::new(3, 2 * 4).for_workers(2, 4);
        let identity = Transform::identity(shape);
        let mut reader = TrainReader::start(Arc::clone(&source), 1, true, 2, 0, 1, 0, 3, identity);
        // Waits (at most 20 s, against a hang) until no job runs; returns the batches ready.
        let idle = |r: &TrainReader| {
            let t = Instant::now();
            loop {
                let (ready, _, _) = r.queue_state();
                let (jobs, in_flight) = r.stream_state();
                assert!(ready + in_flight <= queue.capacity, "{ready} + {in_flight}");
                if jobs == 0 {
                    assert_eq!(in_flight, 0);
                    return ready;
                }
                let state = r.stream_state();
                assert!(t.elapsed() < Duration::from_secs(20), "{state:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        assert_eq!(idle(&reader), queue.capacity);
        assert_eq!(reader.batches_filled(), queue.capacity as u64);
        let taken = 3 * queue.capacity as u64;
        for m in 0..taken {
            let got = reader.next().unwrap();
            assert_eq!(as_floats(got), direct(&*source, 1, true, m, 2, 0, 1));
        }
        // The jobs last ended on a full queue, and have not been started since the consumer
        // took it down past the low-water mark.
        let ready = idle(&reader);
        assert!(ready > queue.low_water(), "{ready} ready");
        assert_eq!(reader.batches_filled(), taken + ready as u64);
        drop(reader);
        assert_eq!(Arc::strong_count(&source), 1, "a job outlived its reader");
    }

    /// A source whose record `bad` cannot be read (`try_fill` fails, as a corrupt image does),
    /// read on decode workers.
    struct Unreadable {
        bad: usize,
        workers: rayon::ThreadPool,
    }

    impl RecordSource for Unreadable {
        fn len(&self) -> usize {
            40
        }
        fn record_shape(&self) -> [usize; 3] {
            [1, 1, 3]
        }
        fn classes(&self) -> usize {
            2
        }
        fn fill(&self, index: usize, out: &mut [f32]) {
            out.fill(index as f32);
        }
        fn try_fill(&self, index: usize, out: &mut [f32]) -> Result<Read> {
            if index == self.bad {
                return Err(Error::data(
                    "unreadable",
                    format!("record {index} is corrupt"),
                ));
            }
            self.fill(index, out);
            Ok(Read::default())
        }
        fn label(&self, _: usize) -> u32 {
            0
        }
        fn workers(&self) -> Option<&rayon::ThreadPool> {
            Some(&self.workers)
        }
    }

    /// On decode workers, the batches before the one that holds an unreadable record are
    /// delivered, then `next` fails with the error naming that record, and keeps failing; a
    /// panicking fill ends the stream the same way, with the panic's message.
    #[test]
    fn a_streamed_unreadable_record_ends_the_stream_after_the_batches_before_it() {
        let unreadable = Unreadable {
            bad: 13,
            workers: rayon::ThreadPoolBuilder::new()
                .num_threads(4)
                .build()
                .unwrap(),
        };
        let panicking = FnSource::new(40, [1, 1, 3], |i, out: &mut [f32]| {
            assert!(i != 13, "record {i} is unreadable");
            out.fill(i as f32);
        })
        .with_workers(4);
        let sources: [(Arc<dyn RecordSource>, &str); 2] = [
            (Arc::new(unreadable), "record 13 is corrupt"),
            (Arc::new(panicking), "record 13 is unreadable"),
        ];
        for (source, why) in sources {
            let mut reader = TrainReader::start(
                Arc::clone(&source),
                0,
                false,
                4,
                0,
                1,
                0,
                8,
                Transform::identity([1, 1, 3]),
            );
            for m in 0..3 {
                let got = reader.next().unwrap();
                assert_eq!(as_floats(got), direct(&*source, 0, false, m, 4, 0, 1));
            }
            let msg = reader.next().unwrap_err().to_string();
            assert!(msg.contains(why), "{msg}");
            assert!(reader.next().is_err());
            drop(reader);
            assert_eq!(Arc::strong_count(&source), 1, "a job outlived its reader");
        }
    }

    /// A reader of a range of micro-batches delivers those, then says it has stopped, on the
    /// thread and on decode workers alike.
    #[test]
    fn a_range_reader_stops_after_its_last_micro_batch() {
        let workers: Arc<dyn RecordSource> =
            Arc::new(FnSource::new(30, [1, 2, 2], byte_ramp).with_workers(3));
        for source in [digits(), workers] {
            let stream = BatchStream {
                batch: 3,
                rank: 0,
                replicas: 1,
            };
            let order = TrainOrder::new(source.len(), 2, true);
            let identity = Transform::identity(source.record_shape());
            let mut reader =
                TrainReader::start_range(Arc::clone(&source), order, stream, 4..9, 2, identity);
            for m in 4..9 {
                let got = as_floats(reader.next().unwrap());
                assert_eq!(got, direct(&*source, 2, true, m, 3, 0, 1));
            }
            let e = reader.next().unwrap_err().to_string();
            assert!(e.contains("stopped"), "{e}");
        }
    }

    #[test]
    fn decode_workers_keep_several_records_each_in_flight() {
        let image = 3 * 224 * 224;
        // ResNet-50's batches of 64 on 16 workers per rank: `prefetch` batches are plenty.
        let q = ReadyQueue::new(4, 64 * image).for_workers(64, 16);
        assert_eq!(q, ReadyQueue::new(4, 64 * image));
        // On 256 workers: 16 batches of 64 to keep 4 records per worker.
        let q = ReadyQueue::new(4, 64 * image).for_workers(64, 256);
        assert_eq!((q.capacity, q.refill), (16, 1));
        // Never more than MAX_READY_BATCHES.
        let q = ReadyQueue::new(1, 1 << 20).for_workers(1, 1000);
        assert_eq!(q.capacity, MAX_READY_BATCHES);
    }

    #[test]
    fn small_batches_are_kept_ready_by_the_byte_budget_large_ones_by_prefetch() {
        let q = |prefetch, floats| {
            let q = ReadyQueue::new(prefetch, floats);
            (q.capacity, q.refill)
        };
        // The quickstart's batches (32 × 8 × 8): 256 ready, refilled 128 at a time.
        assert_eq!(q(4, 32 * 64), (MAX_READY_BATCHES, MAX_READY_BATCHES / 2));
        // LeNet's on a GPU (64 × 28 × 28): 167 ready, 20 at a time.
        assert_eq!(q(4, 64 * 784), (167, 20));
        // cifar10_quick's at 512 per GPU: 5 ready, refilled as they are taken.
        assert_eq!(q(4, 512 * 3 * 32 * 32), (5, 1));
        // ResNet-50's (64 × 3 × 224 × 224): `prefetch` of them.
        assert_eq!(q(4, 64 * 3 * 224 * 224), (4, 1));
        assert_eq!(q(0, usize::MAX / 8), (1, 1));
        assert_eq!(q(300, 1), (300, 150));
        assert_eq!(ReadyQueue::new(300, 1).low_water(), 150);
    }

    /// The thread sleeps until the queue has drained to its low-water mark, then refills it in one
    /// burst: taking many small batches from a full queue wakes it once per refill, not once per
    /// batch.
    #[test]
    fn the_thread_is_woken_once_per_refill_not_per_batch() {
        let source = digits();
        let identity = Transform::identity(source.record_shape());
        let ReadyQueue {
            capacity, refill, ..
        } = ReadyQueue::new(4, 2 * 64);
        assert_eq!(
            (capacity, refill),
            (MAX_READY_BATCHES, MAX_READY_BATCHES / 2)
        );
        let mut reader = TrainReader::start(Arc::clone(&source), 5, true, 2, 0, 1, 0, 4, identity);
        // Waits (at most 20 s, against a hang) until `done` holds for the queue's state.
        let wait_until = |r: &TrainReader, done: &dyn Fn((usize, u64, bool)) -> bool| {
            let t = Instant::now();
            while !done(r.queue_state()) {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "{:?}",
                    r.queue_state()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        wait_until(&reader, &|(ready, _, asleep)| ready == capacity && asleep);
        assert_eq!(reader.queue_state(), (capacity, 0, true));
        let taken = 4 * capacity;
        for m in 0..taken as u64 {
            let got = reader.next().unwrap();
            assert_eq!(
                as_floats(got.clone()),
                direct(&*source, 5, true, m, 2, 0, 1)
            );
            reader.recycle(got);
            if m % 64 == 63 {
                // A consumer slower than the thread: it has refilled above the low-water mark.
                wait_until(&reader, &|(ready, _, _)| ready > capacity - refill);
            }
        }
        // Woken at least once, and back to sleep: it filled the queue and it has not been drained
        // to the low-water mark since (the consumer may have taken some of that refill already).
        wait_until(&reader, &|(ready, _, asleep)| {
            asleep && ready > capacity - refill
        });
        let refills = reader.queue_state().1;
        let most = (taken / refill) as u64;
        assert!(
            (1..=most).contains(&refills),
            "{refills} refills for {taken} batches"
        );
    }

    #[test]
    fn dropping_a_reader_with_a_full_queue_returns_promptly() {
        let source = digits();
        let identity = Transform::identity(source.record_shape());
        let reader = TrainReader::start(source, 1, true, 4, 0, 1, 0, 1, identity);
        std::thread::sleep(Duration::from_millis(100)); // the producer now blocks on a full queue
        let t = Instant::now();
        drop(reader);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn a_panicking_source_makes_next_fail_instead_of_hang() {
        let mut reader = TrainReader::start(
            // Record 7 cannot be read: its `fill` panics.
            Arc::new(FnSource::new(10, [1, 1, 1], |i, out: &mut [f32]| {
                assert!(i != 7, "record {i} is unreadable");
                out[0] = i as f32;
            })),
            0,
            false,
            2,
            0,
            1,
            0,
            4,
            Transform::identity([1, 1, 1]),
        );
        let mut ok = 0;
        let err = loop {
            match reader.next() {
                Ok(b) => {
                    ok += 1;
                    assert!(ok < 10, "{b:?}");
                }
                Err(e) => break e,
            }
        };
        assert_eq!(ok, 3); // records 0..6; the batch of 6 and 7 fails
        let msg = err.to_string();
        assert!(
            msg.contains("replica 0") && msg.contains("record 7 is unreadable"),
            "{msg}"
        );
        assert_eq!(err.exit_code(), 1);
        assert!(reader.next().is_err());
    }

    #[test]
    fn test_batches_are_read_in_file_order() {
        let source = digits();
        let (mut data, mut labels) = (Vec::new(), Vec::new());
        let identity = Transform::identity(source.record_shape());
        fill_test_batch(&*source, &identity, 30..35, &mut data, &mut labels).unwrap();
        assert_eq!((data.len(), labels.len()), (5 * 64, 5));
        let mut rec = vec![0.0; 64];
        for (k, i) in (30..35).enumerate() {
            source.fill(i, &mut rec);
            assert_eq!(&data[k * 64..(k + 1) * 64], rec.as_slice());
            assert_eq!(labels[k], source.label(i) as f32);
        }
        fill_test_batch(&*source, &identity, 0..2, &mut data, &mut labels).unwrap();
        assert_eq!((data.len(), labels.len()), (2 * 64, 2));
    }
}
