//! What a timeline is made of, shared by the engines that record spans (CPU and GPU), the
//! parallel trainer that drives them, and the Chrome-trace writer: the phases of a training step
//! ([`Step`]), span names and tracks, and a replica's [`SpanLog`]. A leaf: it depends on nothing
//! else in the crate.

use std::time::Instant;

/// The phases of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Data,
    Forward,
    Backward,
    AllReduce,
    Update,
}

impl Step {
    pub const ALL: [Step; 5] = [
        Step::Data,
        Step::Forward,
        Step::Backward,
        Step::AllReduce,
        Step::Update,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Step::Data => "data wait",
            Step::Forward => "forward",
            Step::Backward => "backward",
            Step::AllReduce => "all-reduce",
            Step::Update => "update",
        }
    }
}

/// What a span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    /// A phase of the training step.
    Step(Step),
    /// A whole test pass.
    Test,
    /// Local SGD's averaging of the parameters over every replica.
    Average,
    /// The forward of layer `i` (index into `SpanLog::layer_names`).
    Forward(u32),
    /// The backward of layer `i`.
    Backward(u32),
    /// The all-reduce of gradient bucket `index` (in launch order, `parallel::bucket`), which
    /// put `bytes` of gradient on the wire (its floats × the bytes of `cluster.reduce_dtype`).
    Bucket { index: u32, bytes: u64 },
    /// The update of gradient bucket `index`'s part of the parameters behind the backward (a GPU
    /// replica that reduces nothing updates each bucket on a stream of its own).
    UpdatePart { index: u32 },
}

/// Where a span ran: the replica's host thread, its device's compute stream, its device's
/// communication stream (the gradient buckets' all-reduces), or its device's update stream (the
/// update behind the backward).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Track {
    Host,
    Device,
    Comm,
    Update,
}

/// One recorded span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub name: Name,
    pub track: Track,
    /// Nanoseconds since the origin.
    pub start_ns: u64,
    pub dur_ns: u64,
    /// The iteration it belongs to, where known.
    pub iter: Option<u64>,
}

/// Spans against one origin, with the names of the layers they refer to.
#[derive(Debug, Clone)]
pub struct SpanLog {
    origin: Instant,
    pub layer_names: Vec<String>,
    pub spans: Vec<Span>,
}

impl SpanLog {
    /// An empty log with room for `capacity` spans.
    pub fn with_capacity(origin: Instant, capacity: usize) -> Self {
        SpanLog {
            origin,
            layer_names: Vec::new(),
            spans: Vec::with_capacity(capacity),
        }
    }

    /// The instant that time 0 stands for.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Records a span that ran from `start` to `end` (host clock).
    #[inline]
    pub fn push(&mut self, name: Name, track: Track, start: Instant, end: Instant, iter: u64) {
        let start_ns = start.saturating_duration_since(self.origin).as_nanos() as u64;
        let dur_ns = end.saturating_duration_since(start).as_nanos() as u64;
        self.push_ns(name, track, start_ns, dur_ns, Some(iter));
    }

    /// Records a span given in nanoseconds since the origin (a device clock mapped onto it).
    #[inline]
    pub fn push_ns(
        &mut self,
        name: Name,
        track: Track,
        start_ns: u64,
        dur_ns: u64,
        iter: Option<u64>,
    ) {
        self.spans.push(Span {
            name,
            track,
            start_ns,
            dur_ns,
            iter,
        });
    }
}

impl SpanLog {
    /// Per layer `i` (of `layer_names`), the summed duration in seconds and the number of its
    /// forward spans, then of its backward spans: `[fwd_s, fwd_n, bwd_s, bwd_n]` at `4i..4i + 4`.
    /// Device spans where the log has any layer span on the device (a GPU's compute stream),
    /// else the host's.
    pub fn layer_sums(&self) -> Vec<f64> {
        let is_layer = |s: &&Span| matches!(s.name, Name::Forward(_) | Name::Backward(_));
        let track = if self
            .spans
            .iter()
            .filter(is_layer)
            .any(|s| s.track == Track::Device)
        {
            Track::Device
        } else {
            Track::Host
        };
        let mut sums = vec![0.0; 4 * self.layer_names.len()];
        for s in self
            .spans
            .iter()
            .filter(is_layer)
            .filter(|s| s.track == track)
        {
            let at = match s.name {
                Name::Forward(i) => 4 * i as usize,
                Name::Backward(i) => 4 * i as usize + 2,
                _ => continue,
            };
            if let Some(pair) = sums.get_mut(at..at + 2) {
                pair[0] += s.dur_ns as f64 / 1e9;
                pair[1] += 1.0;
            }
        }
        sums
    }
}

/// The recorded timeline of one replica, as handed back at the end of training.
#[derive(Debug, Clone)]
pub struct ReplicaTrace {
    /// Universal rank of the replica.
    pub replica: usize,
    pub log: SpanLog,
}
