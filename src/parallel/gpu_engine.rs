//! `GpuEngine`: a replica on one GPU behind the `Engine` seam — the `GpuNet` with its flat
//! device parameters, the `GpuSolver`, and an NCCL communicator on a communication stream of its
//! own. Gradients are all-reduced (NCCL `Avg`) in the buckets of `[cluster] reduce`: during the
//! last backward of an iteration, each bucket is launched on the communication stream as soon as
//! the compute stream has passed the backward of the bucket's last layer (ordered by CUDA events,
//! never by host synchronisation); before the update the compute stream waits for the last
//! bucket. Where the host waits for the device (display, test, snapshot, the end of a run), it
//! waits through [`NcclComm::synchronize`], which polls NCCL's asynchronous error and the
//! collective deadline.
//!
//! Non-finite numbers (`crate::solver::non_finite`): the engine sums each iteration's loss into
//! a device scalar of its own; where that sum is not finite, a one-thread kernel makes one
//! gradient element NaN before the all-reduce, and the solver refuses the update of a
//! non-finite averaged gradient on the device. Nothing of it synchronises.
//!
//! Timeline (and `bench --layers`): the device's step phases and each layer's forward and
//! backward, from the `EventClock`s of the step phases and of the net's layers, mapped onto the
//! host clock through one event recorded when the timeline starts (per-bucket all-reduce spans
//! are not recorded).

use super::bucket::{plan_buckets, Bucket};
use super::engine::Engine;
use crate::config::{Config, Phase, ReduceMode};
use crate::cuda::event_clock::PhaseClock;
use crate::cuda::layers::Collective;
use crate::cuda::nccl::{NcclComm, NcclId};
use crate::cuda::net::GpuNet;
use crate::cuda::update::GpuSolver;
use crate::cuda::{gpu_error, Gpu};
use crate::error::{Error, Result};
use crate::net::Output;
use crate::net::PassCtx;
use crate::params::Params;
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
    buckets: Vec<Bucket>,
    /// Per layer, the buckets its backward completes.
    ready_after: Vec<Vec<usize>>,
    /// Buckets launched during the current iteration's last backward.
    launched: bool,
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
        let iter_loss = gpu
            .compute
            .alloc_zeros::<f64>(1)
            .map_err(|e| gpu_error("allocate the iteration's loss", e))?;
        let comm = NcclComm::from_id(comm_stream.clone(), rank, size, id)?;
        let mode = match cfg.cluster.reduce {
            _ if size == 1 => ReduceMode::Flat,
            m => m,
        };
        let buckets = plan_buckets(&net.params.spans, mode, cfg.cluster.bucket_mb);
        let mut ready_after = vec![Vec::new(); net.graph().len()];
        for (b, bucket) in buckets.iter().enumerate() {
            ready_after[bucket.ready_after_layer].push(b);
        }
        Ok(GpuEngine {
            gpu,
            net,
            solver,
            comm,
            comm_stream,
            buckets,
            ready_after,
            launched: false,
            iter_size: cfg.solver.iter_size,
            sub: 0,
            clock: PhaseClock::default(),
            fence,
            timeline: None,
            iter_loss,
        })
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

/// Launches the all-reduce (average) of `bucket` on the communicator's stream.
fn launch(comm: &NcclComm, diff: &mut CudaSlice<f32>, bucket: &Bucket) -> Result<()> {
    comm.all_reduce_avg(diff, bucket.range.clone(), comm.stream())
}

impl Engine for GpuEngine {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn broadcast_params(&mut self) -> Result<()> {
        order(&self.fence, &self.gpu.compute, &self.comm_stream)?;
        let n = self.net.params.data.len();
        self.comm
            .broadcast(&mut self.net.params.data, 0..n, 0, &self.comm_stream)?;
        order(&self.fence, &self.comm_stream, &self.gpu.compute)
    }

    fn set_batch(&mut self, n: usize) -> Result<()> {
        self.net.set_batch(&self.gpu, n)
    }

    fn load_batch(&mut self, data: &[f32], labels: &[f32]) -> Result<()> {
        let (gpu, net) = (&self.gpu, &mut self.net);
        self.clock
            .time(gpu, Step::Data, || net.load_batch(gpu, data, labels))
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

    fn backward(&mut self, _ctx: PassCtx) -> Result<()> {
        let last = self.sub + 1 == self.iter_size;
        let first = self.sub == 0;
        let GpuEngine {
            gpu,
            net,
            comm,
            comm_stream,
            buckets,
            ready_after,
            launched,
            clock,
            fence,
            iter_loss,
            ..
        } = self;
        let overlap = last && buckets.len() > 1;
        let coll = collective(comm, fence, comm_stream);
        let mut failure: Option<Error> = None;
        let mut on_layer_done = |layer: usize, diff: &mut CudaSlice<f32>| {
            if !overlap || failure.is_some() {
                return;
            }
            for &b in &ready_after[layer] {
                let poisoned = match b {
                    0 => poison(gpu, iter_loss, diff, buckets[0].range.start),
                    _ => Ok(()),
                };
                let r = poisoned
                    .and_then(|_| order(fence, &gpu.compute, comm_stream))
                    .and_then(|_| launch(comm, diff, &buckets[b]));
                if let Err(e) = r {
                    failure = Some(e);
                    return;
                }
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
        *launched = overlap;
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
        if self.comm.size() == 1 {
            // The average over one replica is its own gradient.
            return poison(&self.gpu, &self.iter_loss, &mut self.net.params.diff, 0);
        }
        if !self.launched {
            poison(&self.gpu, &self.iter_loss, &mut self.net.params.diff, 0)?;
            order(&self.fence, &self.gpu.compute, &self.comm_stream)?;
            for b in &self.buckets {
                launch(&self.comm, &mut self.net.params.diff, b)?;
            }
        }
        self.launched = false;
        // On the compute stream, the time of this wait is the communication left exposed.
        let (gpu, comm_stream, fence) = (&self.gpu, &self.comm_stream, &self.fence);
        self.clock.time(gpu, Step::AllReduce, || {
            order(fence, comm_stream, &gpu.compute)
        })
    }

    fn update(&mut self, iter: u64) -> Result<f32> {
        let (gpu, solver, params) = (&self.gpu, &mut self.solver, &mut self.net.params);
        self.clock
            .time(gpu, Step::Update, || solver.apply(gpu, iter, params))
    }

    fn non_finite_steps(&mut self) -> Result<NonFiniteSteps> {
        self.wait_for_device("the refused-step record")?;
        self.solver.non_finite_steps(&self.gpu)
    }

    /// With other replicas the loop agrees on signals every step, waiting for the device.
    fn host_waits_each_step(&self) -> bool {
        self.comm.size() > 1
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
        Ok(())
    }

    fn take_spans(&mut self) -> Result<Option<SpanLog>> {
        let Some(t) = self.timeline.take() else {
            return Ok(None);
        };
        let steps = self.clock.spans(&t.zero)?;
        let layers = self.net.layer_clock.spans(&t.zero)?;
        self.clock.set(false);
        self.net.layer_clock.set(false);
        let mut log = SpanLog::with_capacity(t.origin, steps.len() + layers.len());
        log.layer_names = self.net.span_names();
        let steps = steps.into_iter().map(|(p, s, d)| (Name::Step(p), s, d));
        for (name, start_ms, dur_ms) in steps.chain(layers) {
            let start_ns = t.at_ns + (start_ms.max(0.0) * 1e6) as u64;
            let dur_ns = (dur_ms.max(0.0) * 1e6) as u64;
            log.push_ns(name, Track::Device, start_ns, dur_ns, None);
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
