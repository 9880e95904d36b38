//! `GpuEngine`: a replica on one GPU behind the `Engine` seam — the `GpuNet` with its flat
//! device parameters, the `GpuSolver`, and an NCCL communicator on a communication stream of its
//! own. Gradients are all-reduced (NCCL `Avg`) in the buckets of `[cluster] reduce`: during the
//! last backward of an iteration, each bucket is launched on the communication stream as soon as
//! the compute stream has passed the backward of the bucket's last layer (ordered by CUDA events,
//! never by host synchronisation).
//!
//! Where the update rule allows it (`GpuSolver::updates_by_part`: no clipping, `non_finite =
//! "stop"`, no dynamic loss scale) the update runs bucket by bucket, each bucket's part of the
//! parameters a lean part (`crate::cuda::update::Part`) — [`UpdatePlan`]:
//!
//! - a replica alone updates behind the backward: each bucket on an update stream of its own as
//!   soon as the backward of its last layer is done, while the compute stream goes on with the
//!   backward of the layers below; the compute stream waits for the update stream before the
//!   next forward;
//! - replicas that all-reduce update after the backward, on the compute stream, each bucket as
//!   soon as its all-reduce has arrived, while the next buckets are still on the wire (an update
//!   beside the backward slowed NCCL's kernels and the GEMMs more than it saved: on 2 × H200,
//!   mlp4096 0.95× in bf16 and 0.97× in tf32).
//!
//! Elsewhere the compute stream waits for the last bucket and updates the whole gradient after
//! the backward. Where the host waits for the
//! device (display, test, snapshot, the end of a run), it waits through
//! [`NcclComm::synchronize`], which polls NCCL's asynchronous error and the collective deadline.
//!
//! Non-finite numbers (`crate::solver::non_finite`): the engine sums each iteration's loss into
//! a device scalar of its own; where that sum is not finite, a one-thread kernel makes one
//! gradient element NaN before the all-reduce, and the solver refuses the update of a
//! non-finite averaged gradient on the device. Nothing of it synchronises. Loss scaling
//! (`crate::cuda::loss_scale`) judges the same averaged gradient on the device first: an
//! overflow under the dynamic rule skips the step on every replica and backs the scale off.
//!
//! Local SGD (`super::local_sgd`): a step's gradient is all-reduced over the replicas of its
//! scope — the job's communicator, the node's (a second NCCL communicator over the node's
//! replicas, `sync_scope = "node"`), or none; an averaging all-reduces the parameters (plain
//! average) or their delta from the anchor (Nesterov, whose anchor and momentum live on the
//! device and are updated with the elementwise kernels, run by run as the CPU does) on the
//! communication stream, ordered by events as the gradient buckets are.
//!
//! The buckets travel in the type of `cluster.reduce_dtype` (`crate::cuda::wire`): FP32 through
//! NCCL's `Avg`, or bfloat16 — a conversion kernel on a rounding stream of its own as the bucket
//! becomes ready (beside the backward that goes on), NCCL's bfloat16 sum (or the copy engines',
//! `cluster.reduce_transport`) on the communication stream, and the sum back to FP32 with the
//! `1/R` of the average: a kernel after the sum on the communication stream, or, where the
//! update runs behind the backward, inside the update's kernels, which read the sum where NCCL
//! left it. The communication stream thus runs NCCL alone where it can.
//!
//! Timeline (and `bench --layers`): the device's step phases and each layer's forward and
//! backward on the compute stream, each gradient bucket's all-reduce on the communication
//! stream (from the first event of its trip there to the last, with the bytes it put on the
//! wire), and each bucket's update behind the backward on the update stream, from the
//! `EventClock`s of the step phases, of the net's layers, of the buckets and of their updates,
//! mapped onto the host clock through one event recorded when the timeline starts. The events
//! are read once, after the timeline's window of iterations: the steps themselves never wait for
//! them.

use super::bucket::{plan_buckets, Bucket};
use super::engine::Engine;
use super::local_sgd::{self, GradientScope, Outer, OuterRun};
use crate::config::{Config, Phase, ReduceDtype};
use crate::cuda::event_clock::{EventClock, PhaseClock};
use crate::cuda::kernels::Kernels;
use crate::cuda::layers::Collective;
use crate::cuda::nccl::{NcclComm, NcclId};
use crate::cuda::net::{GpuNet, Updatable};
use crate::cuda::update::{GpuSolver, Part};
use crate::cuda::wire::GradientWire;
use crate::cuda::{gpu_error, Gpu};
use crate::data::Normalize;
use crate::error::{Error, Result};
use crate::net::Output;
use crate::net::PassCtx;
use crate::params::Params;
use crate::solver::learning_rate;
use crate::solver::loss_scale::LossScaleState;
use crate::solver::non_finite::NonFiniteSteps;
use crate::spans::{Name, SpanLog, Step, Track};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use std::sync::Arc;
use std::time::Instant;

/// A timeline being recorded: the event that stands for `at_ns` after `origin`.
struct TimelineZero {
    origin: Instant,
    zero: CudaEvent,
    at_ns: u64,
}

/// One GPU replica.
pub struct GpuEngine {
    gpu: Gpu,
    net: GpuNet,
    solver: GpuSolver,
    comm: NcclComm,
    comm_stream: Arc<CudaStream>,
    /// Where the bfloat16 wire rounds each bucket, beside the backward that goes on.
    pack_stream: Arc<CudaStream>,
    /// Orders the communication stream after a bucket's rounding on `pack_stream`.
    packed: CudaEvent,
    buckets: Vec<Bucket>,
    /// The element type the buckets travel in, with its staging buffer.
    wire: GradientWire,
    /// Device time of each bucket's all-reduce on the communication stream (timeline only).
    bucket_clock: EventClock<Name>,
    /// Per bucket, the event recorded on the communication stream after its all-reduce.
    arrived: Vec<CudaEvent>,
    /// Buckets launched during the current iteration's last backward.
    launched: bool,
    /// Where a replica alone updates behind the backward, bucket by bucket.
    update_stream: Arc<CudaStream>,
    /// Device time of each bucket's update on the update stream (timeline only).
    update_clock: EventClock<Name>,
    /// How the current iteration's update runs, decided by its last backward.
    update_plan: UpdatePlan,
    iter_size: u64,
    /// Index of the current sub-batch within its iteration.
    sub: u64,
    /// Device time per step phase, for `bench`.
    clock: PhaseClock,
    /// The event that orders the compute and communication streams.
    fence: CudaEvent,
    /// Set while a timeline records the device's phases (through `clock`).
    timeline: Option<TimelineZero>,
    /// `(1)` this iteration's summed loss so far, in double.
    iter_loss: CudaSlice<f64>,
    /// Local SGD: the communicator over this replica's node (`sync_scope = "node"`).
    node_comm: Option<NcclComm>,
    /// Which replicas average the current iteration's gradient.
    scope: GradientScope,
    /// Local SGD's outer rule with its coefficients per stretch of the parameters (Nesterov).
    outer: Outer,
    outer_runs: Vec<OuterRun>,
    /// The Nesterov rule's `(n)` anchor and momentum on the device.
    anchor: Option<CudaSlice<f32>>,
    outer_momentum: Option<CudaSlice<f32>>,
    /// `(n)` this replica's own parameters while the mean is held in their place.
    own: Option<CudaSlice<f32>>,
}

/// Where a node's NCCL communicator comes from: this replica's rank among the node's replicas,
/// their number, and the node's unique id (`NcclId::per_node`).
#[derive(Debug, Clone, Copy)]
pub struct NodeClique {
    pub rank: usize,
    pub size: usize,
    pub id: NcclId,
}

impl GpuEngine {
    /// Opens GPU `ordinal`, builds the replica's net from `initial`, and joins the NCCL clique
    /// `id` as universal rank `rank` of `size`. Blocks until every replica has joined; call it on
    /// the replica's own thread (an NCCL communicator cannot move between threads).
    pub fn new(
        cfg: &Config,
        record_shape: [usize; 3],
        ordinal: usize,
        rank: usize,
        size: usize,
        id: NcclId,
        initial: &Params,
    ) -> Result<Self> {
        let mut gpu = Gpu::new(ordinal, cfg.cluster.math)?;
        gpu.conv_algorithm = cfg.cluster.conv_algorithm;
        gpu.conv_exact = cfg.cluster.conv_exact;
        gpu.layout = cfg.cluster.gpu_layout;
        let mut net = GpuNet::new(cfg, record_shape, cfg.data.batch_size, &gpu)?;
        net.params_from_host(&gpu, initial)?;
        let solver = GpuSolver::new(&gpu, &cfg.solver, &net.params.spans)?;
        let comm_stream = gpu
            .ctx
            .new_stream()
            .map_err(|e| gpu_error("create the communication stream", e))?;
        let fence = gpu
            .ctx
            .new_event(None)
            .map_err(|e| gpu_error("create the stream-ordering event", e))?;
        let pack_stream = gpu
            .ctx
            .new_stream()
            .map_err(|e| gpu_error("create the gradient wire's rounding stream", e))?;
        let packed = gpu
            .ctx
            .new_event(None)
            .map_err(|e| gpu_error("create the rounding stream's event", e))?;
        let update_stream = gpu
            .ctx
            .new_stream()
            .map_err(|e| gpu_error("create the update stream", e))?;
        let iter_loss = gpu
            .compute
            .alloc_zeros::<f64>(1)
            .map_err(|e| gpu_error("allocate the iteration's loss", e))?;
        let comm = NcclComm::from_id(comm_stream.clone(), rank, size, id)?;
        // A replica alone puts nothing on a wire, but its buckets are the parts of an update
        // behind the backward all the same.
        let buckets = plan_buckets(&net.params.spans, cfg.cluster.reduce, cfg.cluster.bucket_mb);
        let dtype = match size {
            1 => ReduceDtype::Fp32, // nothing goes on a wire
            _ => cfg.cluster.reduce_dtype,
        };
        let ranges: Vec<_> = buckets.iter().map(|b| b.range.clone()).collect();
        let transport = cfg.cluster.reduce_transport;
        let wire = GradientWire::over(&gpu, dtype, transport, &comm, &ranges, net.params.len())?;
        let arrived = buckets
            .iter()
            .map(|_| gpu.ctx.new_event(None))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| gpu_error("create the buckets' events", e))?;
        let outer = Outer::of(&cfg.cluster);
        let n = net.params.len();
        let (outer_runs, anchor, outer_momentum) = match outer {
            Outer::Average => (Vec::new(), None, None),
            Outer::Nesterov { lr, momentum } => {
                let zeros = || {
                    gpu.compute
                        .alloc_zeros::<f32>(n.max(1))
                        .map_err(|e| gpu_error("allocate local SGD's outer state", e))
                };
                let runs = local_sgd::outer_runs(&net.params.spans, n, lr, momentum);
                (runs, Some(zeros()?), Some(zeros()?))
            }
        };
        Ok(GpuEngine {
            gpu,
            net,
            solver,
            comm,
            comm_stream,
            pack_stream,
            packed,
            buckets,
            wire,
            bucket_clock: EventClock::default(),
            arrived,
            launched: false,
            update_stream,
            update_plan: UpdatePlan::Whole,
            update_clock: EventClock::default(),
            iter_size: cfg.solver.iter_size,
            sub: 0,
            clock: PhaseClock::default(),
            fence,
            timeline: None,
            iter_loss,
            node_comm: None,
            scope: GradientScope::All,
            outer,
            outer_runs,
            anchor,
            outer_momentum,
            own: None,
        })
    }

    /// Joins the NCCL communicator of this replica's node (local SGD's `sync_scope = "node"`),
    /// on the communication stream. Blocks until every replica of the node has joined.
    pub fn with_node_clique(mut self, clique: Option<NodeClique>) -> Result<Self> {
        if let Some(c) = clique {
            let stream = self.comm_stream.clone();
            self.node_comm = Some(NcclComm::from_id(stream, c.rank, c.size, c.id)?);
        }
        Ok(self)
    }

    /// Averages `buf[..n]` (the parameters, or the gradient buffer) over every replica on the
    /// communication stream, ordered after the compute stream's work and before its next
    /// (nothing to do for a replica alone).
    fn average_over_all(&mut self, which: Buffer) -> Result<()> {
        if self.comm.size() == 1 {
            return Ok(());
        }
        let n = self.net.params.len();
        let buf = match which {
            Buffer::Data => self.net.params.data_mut(),
            Buffer::Diff => &mut self.net.params.diff,
        };
        order(&self.fence, &self.gpu.compute, &self.comm_stream)?;
        self.comm.all_reduce_avg(buf, 0..n, &self.comm_stream)?;
        order(&self.fence, &self.comm_stream, &self.gpu.compute)
    }

    /// The Nesterov step on the device (`local_sgd::nesterov_step`, run by run), with the mean
    /// delta in the gradient buffer; then the parameters take the anchor.
    fn nesterov_on_device(&mut self) -> Result<()> {
        let (Some(anchor), Some(momentum)) = (&mut self.anchor, &mut self.outer_momentum) else {
            return Ok(());
        };
        let (s, k, p) = (&self.gpu.compute, &self.gpu.kernels, &mut self.net.params);
        for run in &self.outer_runs {
            let (r, len) = (run.range.clone(), run.range.len());
            let delta = p.diff.slice(r.clone());
            k.scale(s, &mut momentum.slice_mut(r.clone()), run.momentum, len)?;
            k.axpy(s, 1.0, &delta, &mut momentum.slice_mut(r.clone()), len)?;
            k.axpy(s, -run.lr, &delta, &mut anchor.slice_mut(r.clone()), len)?;
            let lr_mu = -(run.lr * run.momentum);
            k.axpy(
                s,
                lr_mu,
                &momentum.slice(r.clone()),
                &mut anchor.slice_mut(r),
                len,
            )?;
        }
        let n = p.len();
        s.memcpy_dtod(&anchor.slice(..n), &mut p.data_mut().slice_mut(..n))
            .map_err(|e| gpu_error("copy the anchor into the parameters", e))
    }

    /// Waits for the compute stream (ordered after every collective launched so far), watching
    /// NCCL's asynchronous error and the deadline; `op` names what is awaited in a report.
    fn wait_for_device(&self, op: &str) -> Result<()> {
        self.comm.synchronize(&self.gpu.compute, op)
    }

    /// The name of the device, e.g. `NVIDIA H200`.
    pub fn device_name(&self) -> String {
        self.gpu.name()
    }
}

/// How an iteration's update runs (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpdatePlan {
    /// At once on the compute stream, after the backward and the all-reduce.
    Whole,
    /// Bucket by bucket on the update stream during the backward (a replica alone, or a local
    /// step): the update joins the update stream.
    Behind,
    /// Bucket by bucket on the compute stream after the backward, each after its all-reduce.
    AsReduced,
}

/// Which flat buffer of the parameters.
#[derive(Debug, Clone, Copy)]
enum Buffer {
    Data,
    Diff,
}

/// The communicator that averages a step's gradient under `scope`: `None` where the replica
/// steps on its own gradient (alone, or a local step of `sync_scope = "replica"`).
fn reducing<'a>(
    scope: GradientScope,
    comm: &'a NcclComm,
    node: Option<&'a NcclComm>,
) -> Option<&'a NcclComm> {
    let c = match scope {
        GradientScope::All => Some(comm),
        GradientScope::Node => node,
        GradientScope::Own => None,
    };
    c.filter(|c| c.size() > 1)
}

/// The communicator as the layers use it (BatchNorm's `sync`), ordered after the gradient
/// all-reduce's stream; `None` for a replica alone.
fn collective<'a>(
    comm: &'a NcclComm,
    fence: &'a CudaEvent,
    comm_stream: &'a CudaStream,
) -> Option<Collective<'a>> {
    (comm.size() > 1).then_some(Collective {
        comm,
        other: Some((fence, comm_stream)),
    })
}

/// Makes `waiter` wait for everything enqueued so far on `on`, through `fence`. One event serves
/// every ordering: a stream wait captures the event's latest record when it is enqueued, so
/// recording it again later does not disturb earlier waits (and no event is created per step).
fn order(fence: &CudaEvent, on: &CudaStream, waiter: &CudaStream) -> Result<()> {
    fence
        .record(on)
        .map_err(|e| gpu_error("record an event", e))?;
    waiter
        .wait(fence)
        .map_err(|e| gpu_error("wait for an event", e))
}

/// On the compute stream: element `at` of `diff` becomes NaN where `loss` (the iteration's) is not
/// finite.
fn poison(gpu: &Gpu, loss: &CudaSlice<f64>, diff: &mut CudaSlice<f32>, at: usize) -> Result<()> {
    if at >= diff.len() {
        return Ok(());
    }
    gpu.kernels
        .poison_gradient(&gpu.compute, loss, &mut diff.slice_mut(at..at + 1))
}

/// What launching a bucket's all-reduce needs besides the gradient: the wire, the kernels it
/// converts with, the compute stream that produced the bucket, the stream it is rounded on
/// beside the backward, the events that order the streams, the clock that times the trip, the
/// buckets' arrival events, and whether the wire's sum stays in its staging buffer for an
/// update that reads it there.
struct Launcher<'a> {
    wire: &'a mut GradientWire,
    kernels: &'a Kernels,
    compute: &'a CudaStream,
    pack_stream: &'a CudaStream,
    fence: &'a CudaEvent,
    packed: &'a CudaEvent,
    clock: &'a mut EventClock<Name>,
    arrived: &'a [CudaEvent],
    keep_sum: bool,
}

impl Launcher<'_> {
    /// Launches the all-reduce (average) of bucket `b` over `comm`: packed for the wire on the
    /// rounding stream once the compute stream has produced it (the FP32 wire packs nothing),
    /// then reduced on `comm`'s stream (the bucket's span on the timeline) and, unless the sum is
    /// kept, written back over the bucket there; the bucket's arrival event follows.
    fn launch(
        &mut self,
        comm: &NcclComm,
        diff: &mut CudaSlice<f32>,
        b: usize,
        bucket: &Bucket,
    ) -> Result<()> {
        let name = Name::Bucket {
            index: b as u32,
            bytes: self.wire.bytes(bucket.len()),
        };
        let (wire, kernels, range) = (&mut *self.wire, self.kernels, bucket.range.clone());
        let packed_on = match wire.packs() {
            true => {
                order(self.fence, self.compute, self.pack_stream)?;
                wire.pack(kernels, self.pack_stream, diff, range.clone())?;
                order(self.packed, self.pack_stream, comm.stream())?;
                self.pack_stream
            }
            false => {
                order(self.fence, self.compute, comm.stream())?;
                self.compute
            }
        };
        let keep_sum = self.keep_sum;
        self.clock.time_on(comm.stream(), name, || {
            wire.reduce(kernels, packed_on, comm, diff, range.clone())?;
            match keep_sum {
                true => Ok(()),
                false => wire.unpack(kernels, comm, diff, range),
            }
        })?;
        self.arrived[b]
            .record(comm.stream())
            .map_err(|e| gpu_error("record a bucket's arrival", e))
    }
}

/// What the update of a bucket behind the backward needs: the solver, the update stream, its
/// clock, and whether the update writes the weights' copies.
struct Behind<'a> {
    solver: &'a mut GpuSolver,
    stream: &'a CudaStream,
    clock: &'a mut EventClock<Name>,
    with_copies: bool,
}

/// What follows a bucket's last backward: its all-reduce, or (a replica that reduces nothing)
/// its update behind the backward.
enum BucketWork<'a> {
    Reduce(&'a NcclComm),
    Update(Behind<'a>),
}

/// What follows bucket `b`'s last backward (`bucket`: its index and plan): the all-reduce,
/// launched by `launcher`, or the bucket's update on the update stream after the compute
/// stream's backward so far — a lean part (`crate::cuda::update::Part`). The first bucket is
/// poisoned first where the iteration's loss (`loss.0`, of iteration `loss.1`) is not finite.
fn bucket_done(
    gpu: &Gpu,
    launcher: &mut Launcher<'_>,
    work: BucketWork<'_>,
    updatable: &mut Updatable<'_>,
    (b, bucket): (usize, &Bucket),
    (loss, iter): (&CudaSlice<f64>, u64),
) -> Result<()> {
    if b == 0 {
        poison(gpu, loss, &mut updatable.params.diff, bucket.range.start)?;
    }
    let Behind {
        solver,
        stream,
        clock,
        with_copies,
    } = match work {
        BucketWork::Reduce(comm) => {
            return launcher.launch(comm, &mut updatable.params.diff, b, bucket)
        }
        BucketWork::Update(behind) => behind,
    };
    order(launcher.fence, &gpu.compute, stream)?;
    let (params, copies, loss_scale) = updatable.parts(with_copies);
    let part = Part {
        range: bucket.range.clone(),
        later: b > 0,
        sum: None,
        copies,
        lean: true,
    };
    let name = Name::UpdatePart { index: b as u32 };
    clock.time_on(stream, name, || {
        solver.apply_part(gpu, stream, iter, params, part, loss_scale)
    })?;
    Ok(())
}

impl Engine for GpuEngine {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn param_count(&self) -> usize {
        self.net.params.len()
    }

    fn broadcast_params(&mut self) -> Result<()> {
        order(&self.fence, &self.gpu.compute, &self.comm_stream)?;
        let n = self.net.params.data().len();
        self.comm
            .broadcast(self.net.params.data_mut(), 0..n, 0, &self.comm_stream)?;
        order(&self.fence, &self.comm_stream, &self.gpu.compute)?;
        // The outer rule starts from the parameters every replica starts from.
        if let Some(anchor) = &mut self.anchor {
            let s = &self.gpu.compute;
            s.memcpy_dtod(self.net.params.data(), anchor)
                .map_err(|e| gpu_error("copy the parameters into the anchor", e))?;
        }
        Ok(())
    }

    fn set_batch(&mut self, n: usize) -> Result<()> {
        self.net.set_batch(&self.gpu, n)
    }

    fn load_batch(&mut self, data: &[f32], labels: &[f32]) -> Result<()> {
        let (gpu, net) = (&self.gpu, &mut self.net);
        self.clock
            .time(gpu, Step::Data, || net.load_batch(gpu, data, labels))
    }

    fn load_batch_u8(
        &mut self,
        pixels: &[u8],
        normalize: &Normalize,
        labels: &[f32],
    ) -> Result<()> {
        let (gpu, net) = (&self.gpu, &mut self.net);
        self.clock.time(gpu, Step::Data, || {
            net.load_batch_u8(gpu, pixels, normalize, labels)
        })
    }

    /// Nothing to do: the first backward of an iteration overwrites the gradients.
    fn zero_grad(&mut self) -> Result<()> {
        Ok(())
    }

    fn forward_train(&mut self, ctx: PassCtx, slot: usize, first: bool) -> Result<()> {
        debug_assert_eq!(ctx.phase, Phase::Train);
        self.sub = if first { 0 } else { self.sub + 1 };
        let (gpu, net) = (&self.gpu, &mut self.net);
        let coll = collective(&self.comm, &self.fence, &self.comm_stream);
        self.clock
            .time(gpu, Step::Forward, || net.forward(gpu, ctx, coll))?;
        self.net.add_loss_to_slot(&self.gpu, slot, first)?;
        let loss = self.net.loss_device();
        self.gpu
            .kernels
            .loss_slot(&self.gpu.compute, loss, &mut self.iter_loss, 0, first)
    }

    /// The last backward of an iteration launches each bucket's all-reduce as the bucket
    /// becomes ready (where there are several, or the update runs bucket by bucket), and decides
    /// the [`UpdatePlan`]; under `Behind` it updates each bucket on the update stream as the
    /// backward completes it: the update of the last layers runs beside the backward of the
    /// first.
    fn backward(&mut self, ctx: PassCtx) -> Result<()> {
        let last = self.sub + 1 == self.iter_size;
        let first = self.sub == 0;
        let GpuEngine {
            gpu,
            net,
            solver,
            comm,
            node_comm,
            scope,
            comm_stream,
            pack_stream,
            packed,
            buckets,
            wire,
            bucket_clock,
            arrived,
            launched,
            update_stream,
            update_plan,
            update_clock,
            clock,
            fence,
            iter_loss,
            ..
        } = self;
        let reduce = reducing(*scope, comm, node_comm.as_ref());
        let by_part = last && solver.updates_by_part(net.loss_scale.as_ref());
        let behind = by_part && reduce.is_none();
        let launching = last && reduce.is_some() && (buckets.len() > 1 || by_part);
        // The copies of the weights are written by the parts' updates where they hold the
        // weights as the first part starts; nothing else writes the weights before.
        let with_copies = net.copies_current();
        let mut launcher = Launcher {
            wire,
            kernels: &gpu.kernels,
            compute: &gpu.compute,
            pack_stream,
            fence,
            packed,
            clock: bucket_clock,
            arrived,
            keep_sum: by_part,
        };
        let coll = collective(comm, fence, comm_stream);
        let mut failure: Option<Error> = None;
        // The next bucket in launch order; every bucket is done once (those whose last layer
        // has no backward in this pass after the backward).
        let mut next = 0;
        let mut done_down_to = |layer: usize, updatable: &mut Updatable<'_>| -> Result<()> {
            while next < buckets.len() && buckets[next].ready_after_layer >= layer {
                // Called only where `launching || behind`, which exclude each other.
                let work = match reduce.filter(|_| launching) {
                    Some(comm) => BucketWork::Reduce(comm),
                    None => BucketWork::Update(Behind {
                        solver: &mut *solver,
                        stream: update_stream,
                        clock: &mut *update_clock,
                        with_copies,
                    }),
                };
                bucket_done(
                    gpu,
                    &mut launcher,
                    work,
                    updatable,
                    (next, &buckets[next]),
                    (iter_loss, ctx.iter),
                )?;
                next += 1;
            }
            Ok(())
        };
        let mut on_layer_done = |layer: usize, updatable: &mut Updatable<'_>| {
            if failure.is_none() && (launching || behind) {
                failure = done_down_to(layer, updatable).err();
            }
        };
        clock.time(gpu, Step::Backward, || {
            if first {
                net.backward_first(gpu, coll, &mut on_layer_done)
            } else {
                net.backward(gpu, coll, &mut on_layer_done)
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if launching || behind {
            done_down_to(0, &mut net.updatable())?;
        }
        if behind && with_copies {
            net.mark_copied();
        }
        *launched = launching;
        *update_plan = match (by_part, behind) {
            (false, _) => UpdatePlan::Whole,
            (true, true) => UpdatePlan::Behind,
            (true, false) => UpdatePlan::AsReduced,
        };
        Ok(())
    }

    fn forward_test(&mut self, ctx: PassCtx) -> Result<Vec<Output>> {
        let coll = collective(&self.comm, &self.fence, &self.comm_stream);
        self.net.forward(&self.gpu, ctx, coll)?;
        self.wait_for_device("test pass")?;
        self.net.outputs(&self.gpu)
    }

    fn forward_blob(&mut self, ctx: PassCtx, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let b = self
            .net
            .graph()
            .blob_named(name)
            .ok_or_else(|| Error::net(name, "no layer writes a blob of this name"))?;
        let coll = collective(&self.comm, &self.fence, &self.comm_stream);
        self.net.forward(&self.gpu, ctx, coll)?;
        self.wait_for_device("forward pass")?;
        let blob = self.net.blob(b);
        let spatial: usize = blob.shape.iter().skip(2).product();
        if self.net.blob_layout(b) != crate::cuda::layout::Layout::Nchw && spatial > 1 {
            return Err(Error::net(
                name,
                "is stored channels-last on the GPU: read a blob of shape (N, C) or (N, C, 1, 1)",
            ));
        }
        let host = blob.to_host(&self.gpu)?;
        Ok((host.shape, host.data))
    }

    fn all_reduce_gradients(&mut self) -> Result<()> {
        let launched = std::mem::take(&mut self.launched);
        if self.update_plan != UpdatePlan::Whole {
            // Updated during the backward, or launched then and awaited bucket by bucket.
            return Ok(());
        }
        let Some(reduce) = reducing(self.scope, &self.comm, self.node_comm.as_ref()) else {
            // The replica steps on its own gradient (alone, or a local step).
            return poison(&self.gpu, &self.iter_loss, &mut self.net.params.diff, 0);
        };
        if !launched {
            poison(&self.gpu, &self.iter_loss, &mut self.net.params.diff, 0)?;
            let mut launcher = Launcher {
                wire: &mut self.wire,
                kernels: &self.gpu.kernels,
                compute: &self.gpu.compute,
                pack_stream: &self.pack_stream,
                fence: &self.fence,
                packed: &self.packed,
                clock: &mut self.bucket_clock,
                arrived: &self.arrived,
                keep_sum: false,
            };
            for (b, bucket) in self.buckets.iter().enumerate() {
                launcher.launch(reduce, &mut self.net.params.diff, b, bucket)?;
            }
        }
        // On the compute stream, the time of this wait is the communication left exposed.
        let (gpu, comm_stream, fence) = (&self.gpu, &self.comm_stream, &self.fence);
        self.clock.time(gpu, Step::AllReduce, || {
            order(fence, comm_stream, &gpu.compute)
        })
    }

    fn set_gradient_scope(&mut self, scope: GradientScope) {
        self.scope = scope;
    }

    fn average_params(&mut self) -> Result<()> {
        if self.outer == Outer::Average {
            return self.average_over_all(Buffer::Data);
        }
        let Some(anchor) = &self.anchor else {
            return Ok(());
        };
        // The gradient buffer is free after the update: it holds the delta, anchor − θ.
        let (s, k, p) = (&self.gpu.compute, &self.gpu.kernels, &mut self.net.params);
        let n = p.len();
        s.memcpy_dtod(&anchor.slice(..n), &mut p.diff.slice_mut(..n))
            .map_err(|e| gpu_error("copy the anchor", e))?;
        let (data, diff) = p.data_and_diff();
        k.axpy(s, -1.0, &data.slice(..n), &mut diff.slice_mut(..n), n)?;
        self.average_over_all(Buffer::Diff)?;
        self.nesterov_on_device()
    }

    fn hold_mean_params(&mut self, on: bool) -> Result<()> {
        let n = self.net.params.len();
        let s = &self.gpu.compute;
        let own = match &mut self.own {
            Some(own) => own,
            None => self.own.insert(
                s.alloc_zeros::<f32>(n.max(1))
                    .map_err(|e| gpu_error("allocate the replica's own parameters", e))?,
            ),
        };
        let data = self.net.params.data_mut();
        if !on {
            return s
                .memcpy_dtod(&own.slice(..n), &mut data.slice_mut(..n))
                .map_err(|e| gpu_error("restore the replica's own parameters", e));
        }
        s.memcpy_dtod(&data.slice(..n), &mut own.slice_mut(..n))
            .map_err(|e| gpu_error("keep the replica's own parameters", e))?;
        self.average_over_all(Buffer::Data)
    }

    fn outer_state(&mut self) -> Result<Vec<Vec<f32>>> {
        let n = self.net.params.len();
        // Waited for first: a copy into pageable memory blocks without a deadline.
        self.wait_for_device("local SGD's outer state")?;
        [&self.anchor, &self.outer_momentum]
            .into_iter()
            .flatten()
            .map(|b| {
                self.gpu
                    .compute
                    .clone_dtoh(&b.slice(..n))
                    .map_err(|e| gpu_error("copy local SGD's outer state to the host", e))
            })
            .collect()
    }

    fn restore_apart(&mut self, params: Option<&[f32]>, outer: &[Vec<f32>]) -> Result<()> {
        let n = self.net.params.len();
        let fits = |v: &[f32]| v.len() == n;
        if !params.is_none_or(fits) || !outer.iter().all(|v| fits(v)) {
            return Err(Error::Device(format!(
                "CUDA: restoring a replica's state of another size than its {n} parameters"
            )));
        }
        let s = &self.gpu.compute;
        let htod = |e| gpu_error("copy a replica's resumed state to the device", e);
        if let Some(p) = params {
            s.memcpy_htod(p, &mut self.net.params.data_mut().slice_mut(..n))
                .map_err(htod)?;
        }
        if let (Some(anchor), Some(momentum)) = (&mut self.anchor, &mut self.outer_momentum) {
            match outer {
                [a, m] => {
                    s.memcpy_htod(a, &mut anchor.slice_mut(..n)).map_err(htod)?;
                    s.memcpy_htod(m, &mut momentum.slice_mut(..n))
                        .map_err(htod)?;
                }
                _ => s
                    .memcpy_dtod(
                        &self.net.params.data().slice(..n),
                        &mut anchor.slice_mut(..n),
                    )
                    .map_err(htod)?,
            }
        }
        self.gpu.synchronize()
    }

    fn broadcast_host(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        let s = &self.gpu.compute;
        let mut dev = s
            .clone_htod(buf)
            .map_err(|e| gpu_error("copy a host buffer to broadcast", e))?;
        order(&self.fence, s, &self.comm_stream)?;
        let n = buf.len();
        self.comm
            .broadcast(&mut dev, 0..n, root, &self.comm_stream)?;
        order(&self.fence, &self.comm_stream, s)?;
        self.wait_for_device("host buffer broadcast")?;
        s.memcpy_dtoh(&dev, buf)
            .map_err(|e| gpu_error("copy a broadcast buffer to the host", e))
    }

    /// The update of the averaged gradient as the [`UpdatePlan`] says: at once; or bucket by
    /// bucket in launch order, each after the compute stream has waited for its all-reduce,
    /// reading the bfloat16 wire's sum where it was kept (the update phase then holds the
    /// communication left exposed as well); or, where it ran behind the backward, the compute
    /// stream's wait for the update stream.
    fn update(&mut self, iter: u64) -> Result<f32> {
        let plan = std::mem::replace(&mut self.update_plan, UpdatePlan::Whole);
        let (gpu, solver, net) = (&self.gpu, &mut self.solver, &mut self.net);
        let (buckets, arrived) = (&self.buckets, &self.arrived);
        let reduce = reducing(self.scope, &self.comm, self.node_comm.as_ref());
        let sum = reduce.and_then(|c| self.wire.sum(c));
        let (update_stream, fence) = (&self.update_stream, &self.fence);
        self.clock.time(gpu, Step::Update, || match plan {
            UpdatePlan::Behind => {
                order(fence, update_stream, &gpu.compute)?;
                Ok(learning_rate(solver.config(), iter))
            }
            UpdatePlan::Whole => net.update_weights(|params, copies, loss_scale| {
                solver.apply_scaled(gpu, iter, params, copies, loss_scale)
            }),
            UpdatePlan::AsReduced => net.update_weights(|params, mut copies, mut loss_scale| {
                let mut lr = learning_rate(solver.config(), iter);
                for (b, (bucket, event)) in buckets.iter().zip(arrived).enumerate() {
                    gpu.compute
                        .wait(event)
                        .map_err(|e| gpu_error("wait for a bucket's all-reduce", e))?;
                    let part = Part {
                        range: bucket.range.clone(),
                        later: b > 0,
                        sum,
                        copies: copies.as_mut().map(|c| c.reborrow()),
                        lean: true,
                    };
                    let loss_scale = loss_scale.as_deref_mut();
                    lr = solver.apply_part(gpu, &gpu.compute, iter, params, part, loss_scale)?;
                }
                Ok(lr)
            }),
        })
    }

    fn loss_scale(&mut self) -> Result<Option<LossScaleState>> {
        match &self.net.loss_scale {
            Some(ls) => {
                self.wait_for_device("the loss scale")?;
                ls.state(&self.gpu)
            }
            None => Ok(None),
        }
    }

    fn restore_loss_scale(&mut self, state: &LossScaleState) -> Result<()> {
        match &mut self.net.loss_scale {
            Some(ls) => ls.restore(&self.gpu, state),
            None => Ok(()),
        }
    }

    fn non_finite_steps(&mut self) -> Result<NonFiniteSteps> {
        self.wait_for_device("the refused-step record")?;
        self.solver.non_finite_steps(&self.gpu)
    }

    /// The host waits for the device only where it must (the loop's agreements among replicas,
    /// the display, tests and snapshots), not each step.
    fn host_waits_each_step(&self) -> bool {
        false
    }

    fn inject_nan_loss(&mut self, _slot: usize) -> Result<()> {
        self.gpu
            .compute
            .memcpy_htod(&[f64::NAN], &mut self.iter_loss)
            .map_err(|e| gpu_error("inject a NaN loss", e))
    }

    fn time_device_phases(&mut self, on: bool) {
        self.clock.set(on);
    }

    fn device_phase_seconds(&mut self) -> Result<Option<[f64; 5]>> {
        self.clock.seconds().map(Some)
    }

    fn start_spans(&mut self, origin: Instant, _iters: u64) -> Result<()> {
        // With the stream idle, the event completes as it is recorded: its time is the host's.
        self.gpu.synchronize()?;
        let zero = PhaseClock::event(&self.gpu)?;
        self.gpu.synchronize()?;
        let at_ns = origin.elapsed().as_nanos() as u64;
        self.timeline = Some(TimelineZero {
            origin,
            zero,
            at_ns,
        });
        self.clock.set(true);
        self.net.layer_clock.set(true);
        self.bucket_clock.set(true);
        self.update_clock.set(true);
        Ok(())
    }

    fn take_spans(&mut self) -> Result<Option<SpanLog>> {
        let Some(t) = self.timeline.take() else {
            return Ok(None);
        };
        let steps = self.clock.spans(&t.zero)?;
        let layers = self.net.layer_clock.spans(&t.zero)?;
        let buckets = self.bucket_clock.spans(&t.zero)?;
        let updates = self.update_clock.spans(&t.zero)?;
        self.clock.set(false);
        self.net.layer_clock.set(false);
        self.bucket_clock.set(false);
        self.update_clock.set(false);
        let capacity = steps.len() + layers.len() + buckets.len() + updates.len();
        let mut log = SpanLog::with_capacity(t.origin, capacity);
        log.layer_names = self.net.span_names();
        let steps = steps.into_iter().map(|(p, s, d)| (Name::Step(p), s, d));
        let compute = steps.chain(layers).map(|s| (Track::Device, s));
        let comm = buckets.into_iter().map(|s| (Track::Comm, s));
        let update = updates.into_iter().map(|s| (Track::Update, s));
        for (track, (name, start_ms, dur_ms)) in compute.chain(comm).chain(update) {
            let start_ns = t.at_ns + (start_ms.max(0.0) * 1e6) as u64;
            let dur_ns = (dur_ms.max(0.0) * 1e6) as u64;
            log.push_ns(name, track, start_ns, dur_ns, None);
        }
        Ok(Some(log))
    }

    fn loss_window(&mut self) -> Result<Vec<f64>> {
        self.wait_for_device("gradient all-reduce")?;
        self.net.loss_window(&self.gpu)
    }

    fn sum_scores(&mut self, values: &mut [f64]) -> Result<()> {
        // Collectives of this communicator may still run on the compute stream (BatchNorm's
        // sync): the communication stream waits for them, so that two never run at once.
        order(&self.fence, &self.gpu.compute, &self.comm_stream)?;
        self.comm.sum_f64(values)
    }

    fn barrier(&mut self) -> Result<()> {
        let mut one = [0.0];
        self.sum_scores(&mut one)
    }

    fn params_to_host(&mut self) -> Result<Params> {
        self.wait_for_device("gradient all-reduce")?;
        self.net.params_to_host(&self.gpu)
    }

    fn solver_history(&mut self) -> Result<Vec<Vec<f32>>> {
        self.solver.history_to_host(&self.gpu)
    }

    fn history_names(&self) -> &'static [&'static str] {
        self.solver.history_names()
    }

    fn restore_state(&mut self, history: &[Vec<f32>], loss_slots: &[f64]) -> Result<()> {
        self.solver.history_from_host(&self.gpu, history)?;
        self.net.set_loss_window(&self.gpu, loss_slots)?;
        self.gpu.synchronize()
    }

    fn perturb_param(&mut self) -> Result<()> {
        let mut host = self.net.params_to_host(&self.gpu)?;
        if let Some(w) = host.data.first_mut() {
            *w = super::cpu_engine::next_float(*w);
        }
        self.net.params_from_host(&self.gpu, &host)?;
        self.gpu.synchronize()
    }

    fn finish(self) -> Result<()> {
        self.wait_for_device("end of run")?;
        self.comm.synchronize(&self.comm_stream, "end of run")?;
        self.gpu.synchronize()?;
        self.comm.finish()
    }
}
