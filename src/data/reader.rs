//! The per-replica data reader: a prefetch thread that fills a queue with the training batches of
//! one replica (Caffe's producer/consumer data reader), refilling it in bursts
//! ([`ReadyQueue`]: the thread sleeps on a full queue until a refill's worth has been taken), with
//! consumed buffers handed back for reuse; and the synchronous filling of test batches.
//!
//! Dropping a [`TrainReader`] stops its thread: a flag is raised in the queue, a thread asleep on
//! a full queue is woken, and the thread is joined. A producer that panics (say, in a source's
//! `fill`) marks the queue as ended as it unwinds, and [`TrainReader::next`] returns an error with
//! the panic message instead of blocking forever; a record that cannot be read (a corrupt image)
//! ends the thread too, and `next` returns that error, which names the record.
//!
//! Sources with decode workers ([`RecordSource::workers`]) have every batch filled in parallel on
//! them, several batches in one pass where one holds too few records to give each worker
//! [`RECORDS_PER_WORKER`] ([`ReadyQueue::for_workers`]); other sources only batches of at least
//! [`PARALLEL_FILL_MIN`] floats, on the rank's pool. Which records a batch holds and how each is
//! transformed never depend on how batches are grouped.

use super::order::{micro_batch_positions, TrainOrder};
use super::transform::{Scratch, Transform};
use super::{Read, RecordSource};
use crate::error::{Error, Result};
use rayon::prelude::*;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Floats per batch from which records are filled in parallel.
const PARALLEL_FILL_MIN: usize = 1 << 17;

/// One replica's part of a training micro-batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// `(b, C, H, W)`, normalised.
    pub data: Vec<f32>,
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
fn fill_records<J: Sync>(
    source: &dyn RecordSource,
    jobs: &[J],
    outs: Vec<&mut [f32]>,
    fill: impl Fn(&J, &mut [f32], &mut Scratch) -> Result<Read> + Sync,
) -> Vec<Result<Read>> {
    let floats: usize = outs.iter().map(|o| o.len()).sum();
    let fill = &fill;
    let parallel = |outs: Vec<&mut [f32]>| {
        jobs.par_iter()
            .zip(outs)
            .map_init(Scratch::default, |scratch, (job, out)| {
                fill(job, out, scratch)
            })
            .collect()
    };
    match source.workers() {
        Some(pool) => pool.install(|| parallel(outs)),
        None if floats >= PARALLEL_FILL_MIN => parallel(outs),
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
/// micro-batch `m`: `batch` records from the stream positions of
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
        data: std::mem::take(data),
        labels: std::mem::take(labels),
        ..Batch::default()
    }];
    let stream = BatchStream {
        batch,
        rank,
        replicas,
    };
    let filled = stream.fill(source, order, m, transform, &mut one);
    let [b] = one;
    (*data, *labels) = (b.data, b.labels);
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
    /// Fills `out[i]` (buffers resized, allocations kept) with micro-batch `first + i`, every
    /// record of every batch in one parallel pass (so that decode workers get several records
    /// each where one batch holds too few), each transformed by `transform` (train mode); sets
    /// each batch's `micro_batch`, `first_position` and `skipped`. Returns, per batch, whether
    /// it could be read (an error naming its first unreadable record).
    pub fn fill(
        &self,
        source: &dyn RecordSource,
        order: &mut TrainOrder,
        first: u64,
        transform: &Transform,
        out: &mut [Batch],
    ) -> Vec<Result<()>> {
        let size = transform.output_size();
        let mut records = Vec::with_capacity(out.len() * self.batch);
        for (m, b) in (first..).zip(out.iter_mut()) {
            let positions = micro_batch_positions(m, self.batch, self.rank, self.replicas);
            (b.micro_batch, b.first_position) = (m, positions.start);
            b.data.resize(self.batch * size, 0.0);
            b.labels.resize(self.batch, 0.0);
            records.extend(positions.map(|p| (p, order.record(p))));
        }
        let outs = out
            .iter_mut()
            .flat_map(|b| b.data.chunks_exact_mut(size))
            .collect();
        let reads = fill_records(source, &records, outs, |(p, rec), out, scratch| {
            transform.train(source, *rec, *p, out, scratch)
        });
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

/// Records a parallel fill gives each decode worker at least, where one batch holds too few for
/// that: several batches are then filled in one pass (a worker with a single image per pass
/// waits on the slowest image of the batch, the pool idling between passes).
pub const RECORDS_PER_WORKER: usize = 4;

/// The most batches filled in one pass.
pub const MAX_BATCHES_PER_PASS: usize = 16;

/// The size of a reader's queue of ready batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyQueue {
    /// Batches kept ready at most: at least `data.prefetch` (and 1), as many as fit
    /// [`READY_BYTES`], at most [`MAX_READY_BATCHES`].
    pub capacity: usize,
    /// Batches filled per wake-up: the thread sleeps on a full queue until this many have been
    /// taken.
    pub refill: usize,
    /// Batches filled in one parallel pass: 1, or more on decode workers (see
    /// [`ReadyQueue::for_workers`]).
    pub per_pass: usize,
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
        ReadyQueue {
            capacity,
            refill,
            per_pass: 1,
        }
    }

    /// This queue for batches of `batch` records filled by `workers` decode workers: enough
    /// batches per pass that each worker gets [`RECORDS_PER_WORKER`] records (at most
    /// [`MAX_BATCHES_PER_PASS`]), with room for two passes and a refill of at least one pass.
    pub fn for_workers(self, batch: usize, workers: usize) -> Self {
        let per_pass = (RECORDS_PER_WORKER * workers)
            .div_ceil(batch.max(1))
            .clamp(1, MAX_BATCHES_PER_PASS);
        if per_pass == 1 {
            return self;
        }
        let capacity = self.capacity.max(2 * per_pass).min(MAX_READY_BATCHES);
        let refill = self.refill.max(per_pass).min(capacity / 2);
        ReadyQueue {
            capacity,
            refill,
            per_pass: per_pass.min(refill),
        }
    }

    /// The queue length at which a thread asleep on a full queue is woken.
    pub fn low_water(&self) -> usize {
        self.capacity - self.refill
    }
}

/// The queue between a [`TrainReader`] and its thread, under one mutex.
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
    /// The thread has ended (stopped, failed, or panicked).
    producer_gone: bool,
    /// Why the thread ended, when a record could not be read.
    failed: Option<Error>,
    /// The reader asks the thread to end.
    stop: bool,
    /// Times the thread has been woken from a full queue.
    #[cfg(test)]
    refills: u64,
}

/// A [`Queue`] and the two conditions its sides wait on.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// A batch is ready, or the thread has ended.
    filled: Condvar,
    /// The queue has drained to the low-water mark, or the reader stops.
    drained: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic never happens while the lock is held (fills run outside it).
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Replica `rank`'s training batches, prepared ahead by a thread.
///
/// The thread fills the queue up to its capacity, then sleeps until the reader has taken a
/// refill's worth ([`ReadyQueue`]): on small batches it is woken once per hundred batches or so,
/// not once per batch. (A thread woken for every batch, thousands of times a second on small CPU
/// batches, with one rank per core, kept the other processes of a node from running at all.)
pub struct TrainReader {
    shared: Arc<Shared>,
    /// The thread, until its end has been reported.
    handle: Option<JoinHandle<()>>,
    rank: usize,
    queue: ReadyQueue,
}

impl TrainReader {
    /// Starts the thread that produces replica `rank` of `replicas`'s batches of `batch` records
    /// for micro-batches `first_micro_batch`, `first_micro_batch + 1`, …, over the training order
    /// of (`seed`, `shuffle`), each record transformed by `transform`, keeping up to
    /// [`ReadyQueue::new`]`(prefetch, …)` batches ready.
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
        assert!(batch > 0, "batch size must be positive");
        assert!(rank < replicas, "rank {rank} of {replicas} replicas");
        let workers = source.workers().map_or(0, |p| p.current_num_threads());
        let queue =
            ReadyQueue::new(prefetch, batch * transform.output_size()).for_workers(batch, workers);
        let shared = Arc::new(Shared::default());
        let producer = Producer {
            order: TrainOrder::new(source.len(), seed, shuffle),
            source,
            stream: BatchStream {
                batch,
                rank,
                replicas,
            },
            transform,
            next: first_micro_batch,
            queue,
            shared: Arc::clone(&shared),
        };
        let handle = std::thread::Builder::new()
            .name(format!("data-reader-{rank}"))
            .spawn(move || producer.run())
            .expect("spawning the data reader thread");
        TrainReader {
            shared,
            handle: Some(handle),
            rank,
            queue,
        }
    }

    /// The next batch, waiting for it when the thread has not prepared it yet. An error when the
    /// thread has stopped (it panicked).
    #[allow(clippy::should_implement_trait)] // blocking and fallible, never exhausted: no Iterator
    pub fn next(&mut self) -> Result<Batch> {
        if self.handle.is_none() {
            return Err(self.stopped("stopped earlier"));
        }
        let mut q = self.shared.lock();
        loop {
            if let Some(batch) = q.ready.pop_front() {
                if q.producer_waiting && q.ready.len() <= self.queue.low_water() {
                    q.producer_waiting = false;
                    self.shared.drained.notify_one();
                }
                return Ok(batch);
            }
            if q.producer_gone {
                if let Some(e) = q.failed.take() {
                    drop(q);
                    if let Some(h) = self.handle.take() {
                        let _ = h.join();
                    }
                    return Err(e);
                }
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
        drop(q);
        let why = match self.handle.take().map(JoinHandle::join) {
            Some(Err(payload)) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                format!("panicked: {msg}")
            }
            _ => "stopped".to_string(),
        };
        Err(self.stopped(&why))
    }

    /// Hands a consumed batch's buffers back to the thread, to be refilled without allocating.
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

    fn stopped(&self, why: &str) -> Error {
        Error::io(
            format!("data reader of replica {}", self.rank),
            std::io::Error::other(format!("its thread {why}")),
        )
    }
}

impl Drop for TrainReader {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.drained.notify_one();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The thread's side of a [`TrainReader`].
struct Producer {
    source: Arc<dyn RecordSource>,
    order: TrainOrder,
    stream: BatchStream,
    transform: Transform,
    next: u64,
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
            if q.stop {
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
            let n = self.queue.per_pass.min(self.queue.capacity - q.ready.len());
            let mut pass: Vec<Batch> = (0..n).map(|_| q.free.pop().unwrap_or_default()).collect();
            drop(q);
            let filled = self.stream.fill(
                &*self.source,
                &mut self.order,
                self.next,
                &self.transform,
                &mut pass,
            );
            self.next += n as u64;
            q = self.shared.lock();
            // The batches before the first unreadable one are delivered; that one ends the thread.
            for (b, filled) in pass.into_iter().zip(filled) {
                if let Err(e) = filled {
                    q.failed = Some(e);
                    return;
                }
                q.ready.push_back(b);
            }
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
        let mut batch = Batch {
            micro_batch: m,
            ..Batch::default()
        };
        batch.first_position = fill_train_batch(
            source,
            &mut order,
            m,
            b,
            r,
            replicas,
            &Transform::identity(source.record_shape()),
            &mut batch.data,
            &mut batch.labels,
        )
        .unwrap()
        .0;
        batch
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
                                data.extend(part.data);
                                labels.extend(part.labels);
                            }
                            assert_eq!(data, one.data, "b {b} R {replicas} m {m}");
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

    #[test]
    fn reader_delivers_the_direct_batches() {
        let source = digits();
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
                assert_eq!(got, direct(&*source, 3, true, m, 16, rank, replicas));
                if m % 2 == 0 {
                    reader.recycle(got);
                }
            }
        }
    }

    #[test]
    fn batches_filled_several_per_pass_are_the_direct_batches() {
        let fill = |i: usize, out: &mut [f32]| {
            for (k, v) in out.iter_mut().enumerate() {
                *v = (i * 100 + k) as f32;
            }
        };
        let source: Arc<dyn RecordSource> = Arc::new(
            FnSource::new(37, [1, 2, 3], fill)
                .labelled(|i| (i % 2) as u32)
                .with_workers(8),
        );
        // 8 workers, batches of 4: 8 batches per pass.
        let shape = source.record_shape();
        let q = ReadyQueue::new(2, 4 * shape.iter().product::<usize>()).for_workers(4, 8);
        assert_eq!(q.per_pass, 8);
        let mut reader = TrainReader::start(
            Arc::clone(&source),
            5,
            true,
            4,
            1,
            3,
            7,
            2,
            Transform::identity(shape),
        );
        for m in 7..7 + 50 {
            let got = reader.next().unwrap();
            assert_eq!(got, direct(&*source, 5, true, m, 4, 1, 3));
            reader.recycle(got);
        }
    }

    #[test]
    fn decode_workers_get_several_batches_per_pass_where_one_is_too_small() {
        let image = 3 * 224 * 224;
        // ResNet-50's batches of 64 on 16 workers per rank: one batch per pass, as before.
        let q = ReadyQueue::new(4, 64 * image).for_workers(64, 16);
        assert_eq!(q, ReadyQueue::new(4, 64 * image));
        // On 64 workers: 4 per pass, room for two passes, refilled a pass at a time.
        let q = ReadyQueue::new(4, 64 * image).for_workers(64, 64);
        assert_eq!((q.capacity, q.refill, q.per_pass), (8, 4, 4));
        // Never more than MAX_BATCHES_PER_PASS, nor more than a refill.
        let q = ReadyQueue::new(1, 1 << 20).for_workers(1, 1000);
        assert_eq!(q.per_pass, MAX_BATCHES_PER_PASS);
        assert!(q.refill >= q.per_pass && q.capacity >= 2 * q.per_pass);
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
            assert_eq!(got, direct(&*source, 5, true, m, 2, 0, 1));
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
