//! `GpuNet`: the layer graph of one replica run on its GPU. The wiring (which blob each layer
//! reads and writes, which gradients are needed, loss weights, phases) and the layout of the
//! learnable tensors come from a CPU [`Net`] built for the same config; the blobs, the flat
//! [`GpuParams`] and the [`GpuLayer`]s live on the device.
//!
//! Inputs: the blobs `data` (N, C, H, W) and `label` (N), filled by [`GpuNet::load_batch`].
//!
//! A pass knows its place in training ([`PassCtx`]: phase, iteration, first sample — the keys of
//! dropout's mask) and, in a job of several replicas, the [`Collective`] that BatchNorm's `sync`
//! sums statistics with. After each layer's training forward the net calls
//! [`GpuLayer::update_state`] with the layer's range of the parameters (BatchNorm's running
//! statistics live there).
//!
//! Everything a training step does — [`GpuNet::load_batch`], [`GpuNet::forward`],
//! [`GpuNet::add_loss_to_slot`], [`GpuNet::backward`] — is enqueued on the compute stream without
//! host synchronisation; the only device allocations are the small partial-sum buffers of the
//! channel reductions (BatchNorm, Scale, Bias, convolution bias), taken from and returned to the
//! stream-ordered memory pool. [`GpuNet::outputs`], [`GpuNet::loss_window`] and the parameter
//! copies synchronise, and say so.
//!
//! Where nothing else reads their intermediate blobs, BatchNorm → Scale (→ ReLU) chains and
//! two-bottom Eltwise SUM → ReLU pairs run as one fused layer each (the `fusion` module plans
//! which): its forward at the chain's first layer, its backward at the last; the other layers of
//! the chain are skipped and the blobs only they write are left empty.
//!
//! With `cluster.math = "bf16"` or `"fp16"` the layers that can run on blobs stored in the half
//! type (ungrouped convolutions, the fused chains, the poolings) do, as the `storage` module
//! plans, reading converted copies where a neighbour runs on FP32 blobs; the net rounds its FP32
//! blobs and weights where the CPU net does (the `rounding` module) and runs its inner products
//! on half-type operands; its fused chains round each member's result as the CPU does (or are
//! formed only where that rounding changes nothing, see the `fusion` module).
//!
//! Backward follows the CPU net: activation gradients start at zero and loss tops at their loss
//! weight (times the device loss scale, `crate::cuda::loss_scale`, where the loss is scaled),
//! then layers run in reverse and accumulate. Where a blob's gradient has exactly one
//! contributor, that layer overwrites instead of the net zero-filling first (same result, one
//! pass over the blob less).
//!
//! ```no_run
//! # use p2ptrain::config::{MathMode, Phase};
//! # use p2ptrain::cuda::{Gpu, net::GpuNet};
//! # use p2ptrain::net::PassCtx;
//! # fn run(cfg: &p2ptrain::config::Config, data: &[f32], labels: &[f32]) -> p2ptrain::error::Result<()> {
//! let gpu = Gpu::new(0, MathMode::Fp32)?;
//! let mut net = GpuNet::new(cfg, [1, 28, 28], cfg.data.batch_size, &gpu)?;
//! net.params.zero_grad(&gpu)?;
//! net.load_batch(&gpu, data, labels)?;
//! let pass = PassCtx { phase: Phase::Train, iter: 0, first_sample: 0 };
//! net.forward(&gpu, pass, None)?;
//! net.add_loss_to_slot(&gpu, 0, true)?;
//! net.backward(&gpu, None, &mut |_layer, _params| {})?;
//! let window = net.loss_window(&gpu)?; // synchronises
//! # Ok(()) }
//! ```

use super::blob::{Elem, GpuBlob};
use super::cudnn;
use super::device::wait_for_event;
use super::event_clock::EventClock;
use super::kernels::WeightCopies;
use super::layers::{
    self as gpu_layers, BackwardPass, Collective, ForwardPass, GpuCtx, GpuLayer, Grad, LayerBlobs,
    StatePass,
};
use super::layout::{runs_channels_last, Layout};
use super::loss_scale::DeviceLossScale;
use super::params::GpuParams;
use super::{gpu_error, Gpu};
use crate::config::layer_params::LayerParams;
use crate::config::{Config, Phase};
use crate::error::{Error, Result};
use crate::layers::{self, Layer};
use crate::net::{Net, Output, PassCtx, DATA, LABEL};
use crate::params::{ParamSpan, Params};
use crate::precision::Half;
use crate::solver::loss_scale::LossScaler;
use crate::spans::Name;
use cudarc::driver::{
    result as driver, sys, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtrMut,
    PinnedHostSlice,
};
use fusion::Slot;
use rayon::prelude::*;
use rounding::HalfRounding;
use std::sync::Arc;
use storage::{Conversion, StoragePlan};

/// What backward does in one phase, fixed when the net is built.
#[derive(Debug)]
struct BackwardPlan {
    /// Per layer, per bottom: how its gradient is written.
    grads: Vec<Vec<Grad>>,
    /// Blobs whose diff is zeroed before backward: they need a gradient and no layer overwrites
    /// it first (see [`BackwardPlan::new`]).
    zero: Vec<usize>,
    /// Tops of layers with a loss weight, and the weight their diff starts with.
    loss_tops: Vec<(usize, f32)>,
    /// Layers with learnable tensors whose backward does not run in this phase: a backward
    /// that overwrites the parameter gradient zeroes theirs instead.
    idle_param_layers: Vec<usize>,
    /// Per conversion of the storage plan, how the gradient reaching its copy is written into
    /// the blob it was converted from (the layer itself overwrites the copy's).
    converted: Vec<Grad>,
}

impl BackwardPlan {
    /// The plan of `graph` run as `slots` say in `phase`, its parameters laid out as `params`.
    ///
    /// Backward runs in reverse net order, a fused chain at its last layer: of the layers that
    /// add to a blob's gradient, the first to run overwrites it and the others add to it, so
    /// that no activation gradient is zero-filled and then read back as zeros. The blob is
    /// zeroed first only where no layer contributes or the first turn is shared (two layers of
    /// one fused chain reading it; the chains fused today never do).
    ///
    /// A layer's entry follows the blobs it reads (`reads`, [`fusion::reads_of`]): a fused
    /// chain's head has one for each blob the chain reads, as the layer of the chain reading it
    /// would have it.
    fn new(
        graph: &Net,
        phase: Phase,
        params: &[ParamSpan],
        slots: &[Slot],
        reads: &[Vec<fusion::Read>],
    ) -> BackwardPlan {
        let blobs = graph.blob_count();
        let mut is_loss_top = vec![false; blobs];
        let mut loss_tops = Vec::new();
        // Per blob, the turns (the backward position of the layer that runs them) of its
        // contributing bottom slots.
        let mut turns: Vec<Vec<usize>> = vec![Vec::new(); blobs];
        let turn = |i: usize| match slots[i] {
            Slot::Own => i,
            Slot::Head { last, .. } => last,
            Slot::Absorbed { head } => match slots[head] {
                Slot::Head { last, .. } => last,
                _ => unreachable!("an absorbed layer's head heads a chain"),
            },
        };
        for i in 0..graph.len() {
            let node = graph.node(i);
            if !node.runs_in(phase) {
                continue;
            }
            if node.loss_weight != 0.0 {
                for &t in node.tops {
                    is_loss_top[t] = true;
                    loss_tops.push((t, node.loss_weight));
                }
            }
            if node.needs_backward {
                for (&b, &p) in node.bottoms.iter().zip(node.propagate_down) {
                    if p {
                        turns[b].push(turn(i));
                    }
                }
            }
        }
        // The turn that overwrites each blob's gradient, if any: the latest in net order, alone
        // at it.
        let overwriting: Vec<Option<usize>> = turns
            .iter()
            .zip(&is_loss_top)
            .map(|(t, &loss)| {
                let first = *t.iter().max()?;
                (!loss && t.iter().filter(|&&x| x == first).count() == 1).then_some(first)
            })
            .collect();
        let grad_of = |r: &fusion::Read| {
            let node = graph.node(r.layer);
            let runs = node.runs_in(phase) && node.needs_backward;
            match runs && node.propagate_down[r.slot] {
                false => Grad::Skip,
                true if overwriting[r.blob] == Some(turn(r.layer)) => Grad::Overwrite,
                true => Grad::Accumulate,
            }
        };
        let grads = reads
            .iter()
            .map(|layer_reads| layer_reads.iter().map(grad_of).collect())
            .collect();
        let zero = (0..blobs)
            .filter(|&b| graph.blob_needs_grad(b) && !is_loss_top[b] && overwriting[b].is_none())
            .collect();
        let idle_param_layers = (0..graph.len())
            .filter(|&i| {
                let node = graph.node(i);
                params.iter().any(|s| s.layer == i && s.len > 0)
                    && !(node.runs_in(phase) && node.needs_backward)
            })
            .collect();
        BackwardPlan {
            grads,
            zero,
            loss_tops,
            idle_param_layers,
            converted: Vec::new(),
        }
    }

    /// Routes the gradients of converted bottoms through their copies: the layer overwrites
    /// the copy's gradient, which is then transposed into the blob's as the layer would have
    /// written it.
    fn through_copies(mut self, conversions: &[Conversion]) -> BackwardPlan {
        for c in conversions {
            let grad = &mut self.grads[c.layer][c.slot];
            self.converted.push(*grad);
            if grad.wanted() {
                *grad = Grad::Overwrite;
            }
        }
        self
    }
}

fn phase_index(phase: Phase) -> usize {
    match phase {
        Phase::Train => 0,
        Phase::Test => 1,
    }
}

/// Floats of a batch from which [`copy_to_staging`] copies on all cores (4 MiB; below that,
/// waking the cores costs more than it saves), and the piece each core takes at a time.
const PARALLEL_COPY_MIN: usize = 1 << 20;
const COPY_PIECE: usize = 1 << 16;

/// `dst = src` for the pinned staging of a batch's inputs. A large batch is copied in pieces on
/// all cores: copied by the stepping thread alone, cifar10_quick's 6 MB batch at batch 512 left
/// the device waiting for its input in some runs (up to 0.24 ms of a 1.7 ms step).
fn copy_to_staging<T: Copy + Send + Sync>(dst: &mut [T], src: &[T]) {
    if src.len() < PARALLEL_COPY_MIN {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(COPY_PIECE)
        .zip(src.par_chunks(COPY_PIECE))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// One of two input slots: pinned host buffers for a batch's inputs, device buffers the same size
/// as the input blobs (swapped with them once filled), and the events that order their reuse.
/// Two alternate, so filling one never waits for the copy just enqueued from the other, and a
/// batch is copied in on the copy stream while the compute stream still runs the previous one.
struct Staging {
    data: PinnedHostSlice<f32>,
    labels: PinnedHostSlice<f32>,
    /// `(capacity of the data blob)`: the next batch's data, or the last-but-one batch's.
    device_data: CudaSlice<f32>,
    /// `(capacity of the label blob)`.
    device_labels: CudaSlice<f32>,
    /// `(capacity of the data blob)`, only where the data blob is stored channels-last: the
    /// batch as the host gives it (NCHW), transposed from here into `device_data`.
    raw_data: Option<CudaSlice<f32>>,
    /// Pinned and device bytes for batches of 8-bit pixels, allocated by the first one.
    pixels: Option<PixelStaging>,
    /// Recorded on the copy stream after the copy out of the pinned buffers into the device ones.
    copied: CudaEvent,
    /// Recorded on the compute stream once every pass that read `device_*` (as the input blobs)
    /// has been enqueued: the next copy into them waits for it.
    released: CudaEvent,
}

impl Staging {
    fn new(gpu: &Gpu, data: usize, labels: usize, raw_input: bool) -> Result<Staging> {
        // SAFETY: the buffers are written before any element is read.
        let pinned = |n: usize| unsafe { gpu.ctx.alloc_pinned::<f32>(n.max(1)) };
        let device = |n: usize| {
            gpu.compute
                .alloc_zeros::<f32>(n.max(1))
                .map_err(|e| gpu_error("allocate device input staging", e))
        };
        let event = || {
            gpu.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(|e| gpu_error("create a staging event", e))
        };
        let released = event()?;
        // Nothing has read the device buffers yet: the first copy into them waits for nothing.
        released
            .record(&gpu.compute)
            .map_err(|e| gpu_error("record a staging event", e))?;
        Ok(Staging {
            data: pinned(data).map_err(|e| gpu_error("allocate pinned input staging", e))?,
            labels: pinned(labels).map_err(|e| gpu_error("allocate pinned label staging", e))?,
            device_data: device(data)?,
            device_labels: device(labels)?,
            raw_data: raw_input.then(|| device(data)).transpose()?,
            pixels: None,
            copied: event()?,
            released,
        })
    }
}

/// Enqueues on `copy` the copy of the first `n` elements of the pinned `src` into `dst`
/// (`what` names it in an error). The caller keeps `src` alive and unwritten until the slot's
/// `copied` event, recorded by [`GpuNet::end_load`] after the copies, has completed.
fn upload<T>(
    copy: &CudaStream,
    src: &PinnedHostSlice<T>,
    dst: &mut CudaSlice<T>,
    n: usize,
    what: &str,
) -> Result<()>
where
    T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
{
    let src = src
        .as_slice()
        .map_err(|e| gpu_error("map pinned input staging", e))?;
    assert!(
        dst.len() >= n && src.len() >= n,
        "{what}: {n} elements into {} from {}",
        dst.len(),
        src.len()
    );
    let (dst, _record) = dst.device_ptr_mut(copy);
    // SAFETY: `dst` and `src` hold at least `n` elements (asserted); the caller keeps the pinned
    // source alive and unwritten until the copy has completed (above).
    unsafe { driver::memcpy_htod_async(dst, &src[..n], copy.cu_stream()) }
        .map_err(|e| gpu_error(what, e))
}

/// A staging slot's buffers for a batch of 8-bit pixels `(capacity of the data blob)`: pinned
/// on the host, then on the device, where `normalize_u8` turns them into the data blob's floats.
struct PixelStaging {
    host: PinnedHostSlice<u8>,
    device: CudaSlice<u8>,
}

impl PixelStaging {
    /// Buffers for `n` pixels, the device one allocated and zeroed on the `copy` stream, which
    /// writes it next: zeroed on another stream, it could be zeroed after the first batch's
    /// copy into it (the first batches' pixels lost in part, now and then).
    fn new(gpu: &Gpu, copy: &Arc<CudaStream>, n: usize) -> Result<PixelStaging> {
        // SAFETY: the buffer is written before any element is read.
        let host = unsafe { gpu.ctx.alloc_pinned::<u8>(n.max(1)) }
            .map_err(|e| gpu_error("allocate pinned pixel staging", e))?;
        let device = copy
            .alloc_zeros::<u8>(n.max(1))
            .map_err(|e| gpu_error("allocate device pixel staging", e))?;
        Ok(PixelStaging { host, device })
    }
}

impl Drop for Staging {
    /// Pinned memory must outlive the copy reading it.
    fn drop(&mut self) {
        let _ = self.copied.synchronize();
    }
}

/// The parameters with what an update step of them needs besides: mixed precision's copies of
/// the weights and the loss scale ([`GpuNet::backward`]'s callback, [`GpuNet::update_weights`]).
pub struct Updatable<'a> {
    pub params: &'a mut GpuParams,
    rounding: Option<&'a mut HalfRounding>,
    loss_scale: Option<&'a mut DeviceLossScale>,
}

impl<'a> Updatable<'a> {
    fn of(
        params: &'a mut GpuParams,
        rounding: &'a mut Option<HalfRounding>,
        loss_scale: &'a mut Option<DeviceLossScale>,
    ) -> Self {
        Updatable {
            params,
            rounding: rounding.as_mut(),
            loss_scale: loss_scale.as_mut(),
        }
    }

    /// The parameters, the copies of the weights for the update to write (in mixed precision,
    /// where `with_copies`: [`GpuNet::copies_current`] held before the update's first part), and
    /// the loss scale.
    pub fn parts(
        &mut self,
        with_copies: bool,
    ) -> (
        &mut GpuParams,
        Option<WeightCopies<'_>>,
        Option<&mut DeviceLossScale>,
    ) {
        let rounding = self.rounding.as_deref_mut().filter(|_| with_copies);
        let copies = rounding.map(|r| r.copies());
        (self.params, copies, self.loss_scale.as_deref_mut())
    }
}

/// The layer graph of one replica on its GPU; see the module docs.
pub struct GpuNet {
    /// Wiring, phases and loss weights (built at batch 1; its layers never run).
    graph: Net,
    /// CPU layers used only to infer blob shapes when the batch changes.
    shapers: Vec<Box<dyn Layer>>,
    layers: Vec<Box<dyn GpuLayer>>,
    /// Per layer, whether it runs itself or as part of a fused chain.
    slots: Vec<Slot>,
    /// Per blob, whether only the skipped layers of fused chains touch it (kept empty).
    idle_blobs: Vec<bool>,
    /// The graph's blobs, then the converted copies of the storage plan.
    blobs: Vec<GpuBlob>,
    /// The layout of every layer and blob, and the conversions between them.
    storage: StoragePlan,
    /// Mixed precision's rounding (`cluster.math = "bf16"` or `"fp16"`); `None` in FP32 and
    /// TF32.
    rounding: Option<HalfRounding>,
    /// Loss scaling (`cluster.loss_scale`, dynamic by default in fp16): the factor the loss
    /// tops' gradients are seeded with, which the solver judges and moves; `None` when off.
    pub loss_scale: Option<DeviceLossScale>,
    /// Per layer, the blobs it reads (the graph's bottoms, converted ones replaced by copies).
    bottoms: Vec<Vec<usize>>,
    /// The learnable tensors and their gradient, one allocation each.
    pub params: GpuParams,
    record_shape: [usize; 3],
    batch: usize,
    /// The last forward's pass, which backward and `outputs` follow.
    pass: PassCtx,
    /// The run's `random_seed` (dropout's masks).
    seed: u64,
    plans: [BackwardPlan; 2],
    /// Per layer, the config names of its tops.
    top_names: Vec<Vec<String>>,
    /// `(1)` the summed weighted loss of the last forward.
    loss_total: CudaSlice<f32>,
    /// `(average_loss)` per-iteration loss sums, in double.
    loss_slots: CudaSlice<f64>,
    /// `(outputs)` scalars gathered for one copy to the host.
    gathered: CudaSlice<f32>,
    staging: [Staging; 2],
    next_staging: usize,
    /// `(C)` the per-channel means of 8-bit batches on the device, and their host values.
    pixel_mean: Option<(Vec<f32>, CudaSlice<f32>)>,
    /// The stream inputs are copied to the device on, beside the compute stream.
    copy: Arc<CudaStream>,
    /// Per-layer device times, while a timeline or `bench --layers` records them.
    pub layer_clock: EventClock<Name>,
    ordinal: usize,
}

/// Blob shapes for a batch of `batch` records, through the CPU layers' shape rules.
fn infer_shapes(
    graph: &Net,
    shapers: &mut [Box<dyn Layer>],
    record_shape: [usize; 3],
    batch: usize,
) -> Result<Vec<Vec<usize>>> {
    let [c, h, w] = record_shape;
    let mut shapes = vec![Vec::new(); graph.blob_count()];
    shapes[DATA] = vec![batch, c, h, w];
    shapes[LABEL] = vec![batch];
    for (i, shaper) in shapers.iter_mut().enumerate() {
        let node = graph.node(i);
        let bottoms: Vec<&[usize]> = node.bottoms.iter().map(|&b| &shapes[b][..]).collect();
        let tops = shaper.reshape(&bottoms)?;
        for (&t, s) in node.tops.iter().zip(tops) {
            shapes[t] = s;
        }
    }
    Ok(shapes)
}

impl GpuNet {
    /// Builds the net of `cfg` for records of `record_shape` (C, H, W) and batches of up to
    /// `batch` (larger batches later reallocate), with zeroed parameters; fill them with
    /// [`GpuNet::params_from_host`].
    pub fn new(cfg: &Config, record_shape: [usize; 3], batch: usize, gpu: &Gpu) -> Result<GpuNet> {
        gpu.bind()?;
        let (graph, layout) = Net::build(cfg, record_shape, 1)?;
        let mut shapers = (0..graph.len())
            .map(|i| layers::build(graph.node(i).name, graph.node(i).params))
            .collect::<Vec<_>>();
        let shapes = infer_shapes(&graph, &mut shapers, record_shape, batch)?;
        check_layout(&layout.spans, &shapers)?;
        let half = Half::of(cfg.cluster.math);
        let layer_slots = fusion::plan(&graph, &layout.spans, half.is_some());
        let work = storage::ConvolutionWork::of(&graph, &shapers, &shapes);
        let channels_last = gpu.layout.channels_last(gpu.math, work.wide, work.macs);
        // Half-type convolutions run on cuDNN's graph API only, where it has plans for them.
        let half_convolutions = half.is_some() && cudnn::graph::available();
        let half_capable: Vec<bool> = (0..graph.len())
            .map(|i| {
                let node = graph.node(i);
                let capable =
                    storage::runs_on_half_blobs(&graph, &layer_slots, i, half_convolutions);
                match (node.params, half) {
                    (LayerParams::Convolution(p), Some(h)) if capable => {
                        let dims = |b: usize| <[usize; 4]>::try_from(&shapes[b][..]).ok();
                        let (bottom, top) = (dims(node.bottoms[0]), dims(node.tops[0]));
                        let runs_nhwc = channels_last && runs_channels_last(&cfg.layers[i]);
                        let layout = if runs_nhwc {
                            Layout::Nhwc
                        } else {
                            Layout::Nchw
                        };
                        let convolution = |dims| {
                            gpu_layers::convolution::runs_on_half_blobs(gpu, p, dims, layout, h)
                        };
                        bottom.zip(top).is_some_and(convolution)
                    }
                    _ => capable,
                }
            })
            .collect();
        let storage = StoragePlan::new(
            &cfg.layers,
            &graph,
            &shapes,
            &layer_slots,
            channels_last,
            half.map(|h| (h, &half_capable[..])),
        );
        tracing::debug!(
            channels_last,
            wide_convolutions = work.wide,
            convolution_macs = work.macs,
            conversions = storage.conversions.len(),
            layers_on_half_blobs = storage.on_half.iter().filter(|&&h| h).count(),
            "GPU activation storage"
        );
        let mut idle_blobs = fusion::idle_blobs(&graph, &layer_slots);
        idle_blobs.resize(storage.stored.len(), false);
        let shapes = with_copies(shapes, &storage);
        let blobs = (shapes.iter().zip(&idle_blobs).zip(&storage.elem))
            .map(|((s, &idle), &elem)| GpuBlob::new_as(gpu, if idle { &[0] } else { s }, 0, elem))
            .collect::<Result<Vec<_>>>()?;
        let reads = fusion::reads_of(&graph, &layer_slots);
        let layers = (0..graph.len())
            .map(|i| {
                let node = graph.node(i);
                let bottoms: Vec<&[usize]> = node.bottoms.iter().map(|&b| &shapes[b][..]).collect();
                let (runs, on_half) = (storage.runs[i], storage.on_half[i]);
                match layer_slots[i] {
                    Slot::Head { last, .. } => {
                        let read: Vec<&[usize]> =
                            reads[i].iter().map(|r| &shapes[r.blob][..]).collect();
                        let (spans, chain) = (&layout.spans, (i, last));
                        fusion::build(gpu, &graph, spans, chain, &read, runs, half, on_half)
                    }
                    _ => {
                        let (name, params) = (node.name, node.params);
                        gpu_layers::build(gpu, name, params, &bottoms, runs, half, on_half)
                    }
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let plans = [Phase::Train, Phase::Test].map(|phase| {
            BackwardPlan::new(&graph, phase, &layout.spans, &layer_slots, &reads)
                .through_copies(&storage.conversions)
        });
        let bottoms = storage.bottoms();
        let raw_input = storage.input_channels_last();
        let params = GpuParams::new(gpu, layout.spans)?;
        let rounding = half
            .map(|h| {
                let (spans, len) = (&params.spans, params.len());
                let rounds_input = !storage.input_read_through_half_copies_only();
                let conversions = (&storage.conversions[..], rounds_input);
                let runs_at: Vec<usize> = (layer_slots.iter().enumerate())
                    .map(|(i, slot)| match slot {
                        Slot::Absorbed { head } => *head,
                        _ => i,
                    })
                    .collect();
                HalfRounding::new(
                    gpu,
                    h,
                    &graph,
                    &shapers,
                    &layers,
                    &runs_at,
                    &bottoms,
                    conversions,
                    spans,
                    len,
                )
            })
            .transpose()?;
        let scaler = LossScaler::new(&cfg.cluster);
        let loss_scale = match scaler.is_on() {
            true => Some(DeviceLossScale::new(gpu, &scaler)?),
            false => None,
        };
        let top_names: Vec<Vec<String>> = cfg.layers.iter().map(|lc| lc.top.clone()).collect();
        let outputs = top_names.iter().map(Vec::len).sum::<usize>();
        let alloc_f32 = |n: usize, what: &str| {
            gpu.compute
                .alloc_zeros::<f32>(n.max(1))
                .map_err(|e| gpu_error(&format!("allocate the {what}"), e))
        };
        let loss_total = alloc_f32(1, "loss scalar")?;
        let gathered = alloc_f32(outputs, "output gather buffer")?;
        let slots = (cfg.solver.average_loss as usize).max(1);
        let loss_slots = gpu
            .compute
            .alloc_zeros::<f64>(slots)
            .map_err(|e| gpu_error("allocate the loss window", e))?;
        let (nd, nl) = (blobs[DATA].capacity(), blobs[LABEL].capacity());
        let staging = [
            Staging::new(gpu, nd, nl, raw_input)?,
            Staging::new(gpu, nd, nl, raw_input)?,
        ];
        let copy = gpu
            .ctx
            .new_stream()
            .map_err(|e| gpu_error("create the input copy stream", e))?;
        Ok(GpuNet {
            graph,
            shapers,
            layers,
            slots: layer_slots,
            idle_blobs,
            blobs,
            storage,
            rounding,
            loss_scale,
            bottoms,
            params,
            record_shape,
            batch,
            pass: PassCtx {
                phase: Phase::Train,
                iter: 0,
                first_sample: 0,
            },
            seed: cfg.solver.random_seed,
            plans,
            top_names,
            loss_total,
            loss_slots,
            gathered,
            staging,
            next_staging: 0,
            pixel_mean: None,
            copy,
            layer_clock: EventClock::default(),
            ordinal: gpu.ordinal,
        })
    }

    fn check_gpu(&self, gpu: &Gpu) {
        assert_eq!(
            gpu.ordinal, self.ordinal,
            "a GpuNet built on device {} driven with device {}",
            self.ordinal, gpu.ordinal
        );
    }

    /// The CPU net whose wiring this net runs (built at batch 1; for inspection).
    pub fn graph(&self) -> &Net {
        &self.graph
    }

    /// The `(first, last)` layers of every chain the net runs fused (see the `fusion` module).
    pub fn fused_chains(&self) -> Vec<(usize, usize)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match slot {
                Slot::Head { last, .. } => Some((i, *last)),
                _ => None,
            })
            .collect()
    }

    /// Per layer, the name its timeline spans go under: the config's, or for the first layer of
    /// a fused chain (which runs the whole chain) the chain's names joined by `+`.
    pub fn span_names(&self) -> Vec<String> {
        (0..self.layers.len())
            .map(|i| match &self.slots[i] {
                Slot::Head { last, .. } => (i..=*last)
                    .map(|j| self.graph.layer_name(j))
                    .collect::<Vec<_>>()
                    .join("+"),
                _ => self.graph.layer_name(i).to_string(),
            })
            .collect()
    }

    /// Current batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Number of blobs (inputs included), indexed as in [`GpuNet::graph`].
    pub fn blob_count(&self) -> usize {
        self.blobs.len()
    }

    /// Blob `b` (blob 0 is `data`, blob 1 `label`), stored as [`GpuNet::blob_layout`] says.
    pub fn blob(&self, b: usize) -> &GpuBlob {
        &self.blobs[b]
    }

    /// How blob `b` is stored (see [`crate::cuda::layout`]); the blobs past the graph's are
    /// converted copies.
    pub fn blob_layout(&self, b: usize) -> Layout {
        self.storage.stored[b]
    }

    /// Sets the batch size of the next passes. Shrinking only changes logical shapes; growing
    /// past the largest batch so far reallocates (and synchronises to do so safely).
    pub fn set_batch(&mut self, gpu: &Gpu, batch: usize) -> Result<()> {
        self.check_gpu(gpu);
        if batch == self.batch {
            return Ok(());
        }
        let shapes = infer_shapes(&self.graph, &mut self.shapers, self.record_shape, batch)?;
        let shapes = with_copies(shapes, &self.storage);
        for ((blob, s), &idle) in self.blobs.iter_mut().zip(&shapes).zip(&self.idle_blobs) {
            if !idle {
                blob.reshape(gpu, s)?;
            }
        }
        for (i, layer) in self.layers.iter_mut().enumerate() {
            // A fused chain's later layers never run: their head reads for them.
            if matches!(self.slots[i], Slot::Absorbed { .. }) {
                continue;
            }
            let bottoms: Vec<&[usize]> = self.bottoms[i].iter().map(|&b| &shapes[b][..]).collect();
            layer.reshape(gpu, &bottoms)?;
        }
        let (nd, nl) = (self.blobs[DATA].capacity(), self.blobs[LABEL].capacity());
        if self.staging[0].device_data.len() != nd || self.staging[0].device_labels.len() != nl {
            // The old staging buffers may still be read by enqueued copies and passes; the device
            // ones are swapped with the input blobs, so they keep the blobs' capacity.
            gpu.synchronize()?;
            let raw = self.storage.input_channels_last();
            self.staging = [
                Staging::new(gpu, nd, nl, raw)?,
                Staging::new(gpu, nd, nl, raw)?,
            ];
        }
        self.batch = batch;
        Ok(())
    }

    /// Copies a batch in: `data` (N, C, H, W) and `labels` (N) for the current batch N.
    ///
    /// The host slices are copied into one of two pinned staging buffers (waiting, if need be,
    /// for the copy enqueued from that buffer two loads ago), from there to that slot's device
    /// buffers on the copy stream, which then become the input blobs: the compute stream waits
    /// only for the copy's event, so the copy overlaps the passes of the previous batch still
    /// running there, and the caller may reuse its buffers at once.
    ///
    /// # Panics
    /// If the lengths do not match the current batch.
    pub fn load_batch(&mut self, gpu: &Gpu, data: &[f32], labels: &[f32]) -> Result<()> {
        let (slot, nd) = self.begin_load(gpu, data.len(), labels)?;
        let st = &mut self.staging[slot];
        let map_err = |e| gpu_error("map pinned input staging", e);
        copy_to_staging(&mut st.data.as_mut_slice().map_err(map_err)?[..nd], data);
        let dst = st.raw_data.as_mut().unwrap_or(&mut st.device_data);
        upload(&self.copy, &st.data, dst, nd, "copy a batch to the device")?;
        self.end_load(gpu, slot)
    }

    /// [`GpuNet::load_batch`] for a batch of 8-bit pixels `(N, C, H, W)`: the bytes go to the
    /// device (a quarter of the floats' traffic) and the `normalize_u8` kernel writes the data
    /// blob's floats there, `(x − mean[c]) · scale`, bit for bit the floats
    /// [`Normalize::apply`](crate::data::Normalize::apply) computes on the CPU.
    ///
    /// # Panics
    /// If the lengths do not match the current batch or `normalize` the record shape.
    pub fn load_batch_u8(
        &mut self,
        gpu: &Gpu,
        pixels: &[u8],
        normalize: &crate::data::Normalize,
        labels: &[f32],
    ) -> Result<()> {
        let [c, h, w] = self.record_shape;
        assert_eq!(
            (normalize.mean.len(), normalize.plane),
            (c, h * w),
            "load_batch_u8: a normalisation of records {:?}",
            self.record_shape
        );
        self.upload_pixel_mean(&normalize.mean)?;
        let (slot, nd) = self.begin_load(gpu, pixels.len(), labels)?;
        let st = &mut self.staging[slot];
        if st.pixels.is_none() {
            st.pixels = Some(PixelStaging::new(gpu, &self.copy, st.device_data.len())?);
        }
        let px = st.pixels.as_mut().expect("allocated above");
        let map_err = |e| gpu_error("map pinned pixel staging", e);
        copy_to_staging(&mut px.host.as_mut_slice().map_err(map_err)?[..nd], pixels);
        let what = "copy a batch of pixels to the device";
        upload(&self.copy, &px.host, &mut px.device, nd, what)?;
        let floats = st.raw_data.as_mut().unwrap_or(&mut st.device_data);
        let (_, mean) = self.pixel_mean.as_ref().expect("uploaded above");
        gpu.kernels.normalize_u8(
            &self.copy,
            &px.device,
            floats,
            mean,
            c,
            h * w,
            normalize.scale,
            nd,
        )?;
        self.end_load(gpu, slot)
    }

    /// Puts the per-channel means of 8-bit batches on the device, once (again only if they
    /// change, after the copies that read the old ones).
    fn upload_pixel_mean(&mut self, mean: &[f32]) -> Result<()> {
        if self.pixel_mean.as_ref().is_some_and(|(m, _)| m == mean) {
            return Ok(());
        }
        self.copy
            .synchronize()
            .map_err(|e| gpu_error("wait for the input copies", e))?;
        let device = self
            .copy
            .clone_htod(mean)
            .map_err(|e| gpu_error("copy the pixel means to the device", e))?;
        self.pixel_mean = Some((mean.to_vec(), device));
        Ok(())
    }

    /// The start of a load of a batch of `data_len` input values: checks the lengths, takes
    /// the next staging slot (once the copy from it two loads ago is done), orders the copy
    /// stream after the passes that read the slot's device buffers, and enqueues the labels'
    /// copy. Returns the slot and the data blob's element count.
    fn begin_load(&mut self, gpu: &Gpu, data_len: usize, labels: &[f32]) -> Result<(usize, usize)> {
        self.check_gpu(gpu);
        gpu.bind()?;
        let (nd, nl) = (self.blobs[DATA].count(), self.blobs[LABEL].count());
        assert_eq!(
            data_len, nd,
            "load_batch: data for a batch of {}",
            self.batch
        );
        assert_eq!(
            labels.len(),
            nl,
            "load_batch: labels for a batch of {}",
            self.batch
        );
        let slot = self.next_staging;
        self.next_staging ^= 1;
        let st = &mut self.staging[slot];
        wait_for_event(&st.copied, "the input copy of two batches ago")?;
        let map_err = |e| gpu_error("map pinned input staging", e);
        st.labels.as_mut_slice().map_err(map_err)?[..nl].copy_from_slice(labels);
        // The device buffers were last read by the passes before `released` was recorded.
        self.copy
            .wait(&st.released)
            .map_err(|e| gpu_error("order the input copy after the passes that read it", e))?;
        let what = "copy a batch's labels to the device";
        upload(&self.copy, &st.labels, &mut st.device_labels, nl, what)?;
        Ok((slot, nd))
    }

    /// The end of a load into staging slot `slot`, once its data copy is enqueued: the
    /// channels-last transpose where the data blob needs it, then the slot's device buffers
    /// become the input blobs for the passes on the compute stream, after the copy.
    fn end_load(&mut self, gpu: &Gpu, slot: usize) -> Result<()> {
        let st = &mut self.staging[slot];
        if let Some(raw) = &st.raw_data {
            // The data blob is stored channels-last: transposed on the copy stream too.
            let shape = &self.blobs[DATA].shape;
            let matrix = Layout::Nchw.sample_matrix(shape);
            gpu.kernels.transpose(
                &self.copy,
                raw,
                &mut st.device_data,
                shape[0],
                matrix,
                false,
            )?;
        }
        st.copied
            .record(&self.copy)
            .map_err(|e| gpu_error("record the input copy", e))?;
        gpu.compute
            .wait(&st.copied)
            .map_err(|e| gpu_error("order the passes after the input copy", e))?;
        // The new batch becomes the input blobs; the slot keeps the previous inputs, which the
        // passes enqueued so far still read.
        std::mem::swap(&mut self.blobs[DATA].data, &mut st.device_data);
        std::mem::swap(&mut self.blobs[LABEL].data, &mut st.device_labels);
        st.released
            .record(&gpu.compute)
            .map_err(|e| gpu_error("record the end of the input's passes", e))
    }

    /// Runs the layers of `pass.phase` forward and leaves the summed weighted loss of its loss
    /// layers in [`GpuNet::loss_device`]; loss and accuracy tops stay on the device until
    /// [`GpuNet::outputs`]. `collective`: the replicas' all-reduce (BatchNorm's `sync`), `None`
    /// for a replica alone. In the train phase, each layer's state update follows its forward.
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        pass: PassCtx,
        collective: Option<Collective<'_>>,
    ) -> Result<()> {
        self.check_gpu(gpu);
        gpu.bind()?;
        let phase = pass.phase;
        let ctx = GpuCtx {
            phase,
            iter: pass.iter,
            seed: self.seed,
            first_sample: pass.first_sample,
            collective,
        };
        if let Some(r) = &mut self.rounding {
            r.round_weights(gpu, &self.params)?;
            if r.rounds_input {
                let data = &mut self.blobs[DATA];
                let n = data.count();
                r.round(gpu, &mut data.data, n)?;
            }
        }
        let mut reset = true;
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let node = self.graph.node(i);
            if !node.runs_in(phase) {
                continue;
            }
            let (range, tops) = match &self.slots[i] {
                Slot::Own => (self.params.layer_range(i), node.tops),
                Slot::Head { last, params } => (params.clone(), self.graph.node(*last).tops),
                Slot::Absorbed { .. } => continue,
            };
            let params = weights_seen(&self.rounding, self.params.data(), range.clone());
            let half = self
                .rounding
                .as_ref()
                .and_then(|r| r.operands(i, range.clone()));
            let (blobs, bottoms, storage) = (&mut self.blobs, &self.bottoms[i], &self.storage);
            let rounding = self.rounding.as_ref().filter(|r| r.plan.rounds_tops[i]);
            self.layer_clock.time(gpu, Name::Forward(i as u32), || {
                for c in storage.of_layer(i) {
                    convert_forward(gpu, storage, c, blobs)?;
                }
                layer.forward(ForwardPass {
                    gpu,
                    ctx: &ctx,
                    blobs: LayerBlobs::new(blobs, bottoms, tops),
                    params,
                    half,
                })?;
                if let Some(r) = rounding {
                    for &t in tops {
                        let n = blobs[t].count();
                        r.round(gpu, &mut blobs[t].data, n)?;
                    }
                }
                Ok(())
            })?;
            if phase == Phase::Train {
                let params = self.params.data_mut().slice_mut(range);
                layer.update_state(StatePass {
                    gpu,
                    ctx: &ctx,
                    params,
                })?;
            }
            if node.is_loss {
                for &t in node.tops {
                    gpu.kernels.weighted_sum(
                        &gpu.compute,
                        &self.blobs[t].data,
                        node.loss_weight,
                        &mut self.loss_total,
                        reset,
                    )?;
                    reset = false;
                }
            }
        }
        if reset {
            gpu.kernels
                .fill(&gpu.compute, &mut self.loss_total, 0.0, 1)?;
        }
        // The pass wrote only stateful layers' tensors, which each pass copies afresh.
        self.mark_copied();
        self.pass = pass;
        Ok(())
    }

    /// Runs `update` (an update step of the solver) on the master weights with, in mixed
    /// precision, the copies of the weights the layers see, to be written from the new weights
    /// in the same pass, and the loss scale. The copies are handed over only where they hold
    /// the weights before the step; the next forward pass rounds nothing then, and rounds
    /// every weight again otherwise (or where `update` fails).
    pub fn update_weights<T>(
        &mut self,
        update: impl FnOnce(
            &mut GpuParams,
            Option<WeightCopies<'_>>,
            Option<&mut DeviceLossScale>,
        ) -> Result<T>,
    ) -> Result<T> {
        let current = self.copies_current();
        let mut updatable = self.updatable();
        let (params, copies, loss_scale) = updatable.parts(current);
        let out = update(params, copies, loss_scale)?;
        if current {
            self.mark_copied();
        }
        Ok(out)
    }

    /// Whether mixed precision's copies of the weights hold the master weights as they are (an
    /// update that starts from here may write them from the new weights: [`Updatable::parts`]).
    /// False in FP32 and TF32, which keep no copies.
    pub fn copies_current(&self) -> bool {
        let rounding = self.rounding.as_ref();
        rounding.is_some_and(|r| r.copies_current(&self.params))
    }

    /// Records that the copies of the weights hold the master weights: after a pass that wrote
    /// only stateful layers' tensors, or an update that started where
    /// [`GpuNet::copies_current`] held and wrote them with the new weights.
    pub fn mark_copied(&mut self) {
        if let Some(r) = &mut self.rounding {
            r.mark_copied(&self.params);
        }
    }

    /// The parameters with what an update of them needs.
    pub fn updatable(&mut self) -> Updatable<'_> {
        Updatable::of(&mut self.params, &mut self.rounding, &mut self.loss_scale)
    }

    /// `(1)`: the sum over the last forward's loss layers of `loss_weight · loss`, on the device.
    pub fn loss_device(&self) -> &CudaSlice<f32> {
        &self.loss_total
    }

    /// Adds the last forward's loss into slot `slot` of the loss window (`first`: the pass is
    /// the first of its iteration, which resets the slot). On the device.
    pub fn add_loss_to_slot(&mut self, gpu: &Gpu, slot: usize, first: bool) -> Result<()> {
        self.check_gpu(gpu);
        gpu.kernels.loss_slot(
            &gpu.compute,
            &self.loss_total,
            &mut self.loss_slots,
            slot,
            first,
        )
    }

    /// The loss window: one slot per iteration of `average_loss`, each the sum of that
    /// iteration's sub-batch losses. Synchronises.
    pub fn loss_window(&self, gpu: &Gpu) -> Result<Vec<f64>> {
        self.check_gpu(gpu);
        // Waited for first: a copy into pageable memory blocks without a deadline.
        gpu.synchronize()?;
        let v = gpu
            .compute
            .clone_dtoh(&self.loss_slots)
            .map_err(|e| gpu_error("copy the loss window to the host", e))?;
        gpu.synchronize()?;
        Ok(v)
    }

    /// Replaces the loss window (a resumed run's slots; `slots.len()` must be `average_loss`).
    pub fn set_loss_window(&mut self, gpu: &Gpu, slots: &[f64]) -> Result<()> {
        self.check_gpu(gpu);
        if slots.len() != self.loss_slots.len() {
            return Err(Error::Device(format!(
                "CUDA: a loss window of {} slots for {}",
                slots.len(),
                self.loss_slots.len()
            )));
        }
        gpu.compute
            .memcpy_htod(slots, &mut self.loss_slots)
            .map_err(|e| gpu_error("copy the loss window to the device", e))
    }

    /// Runs backward through the layers of the last forward's phase in reverse order,
    /// accumulating into `params.diff`. `on_layer_done(i, params)` is called right after layer
    /// `i`'s backward is enqueued (an event recorded on the compute stream there marks its
    /// parameter gradients complete, and no later layer of the backward reads its weights), with
    /// the parameters and what an update of them needs. `collective` as in [`GpuNet::forward`].
    pub fn backward(
        &mut self,
        gpu: &Gpu,
        collective: Option<Collective<'_>>,
        on_layer_done: &mut dyn FnMut(usize, &mut Updatable<'_>),
    ) -> Result<()> {
        self.run_backward(gpu, Grad::Accumulate, collective, on_layer_done)
    }

    /// [`GpuNet::backward`] for the first (or only) sub-batch of an iteration: it writes
    /// `params.diff` instead of accumulating into it — every element, zeros for tensors whose
    /// layer has no backward in this phase — so the caller skips
    /// [`GpuParams::zero_grad`] (one pass over the gradient less, and the weight-gradient GEMMs
    /// do not read the old gradient).
    pub fn backward_first(
        &mut self,
        gpu: &Gpu,
        collective: Option<Collective<'_>>,
        on_layer_done: &mut dyn FnMut(usize, &mut Updatable<'_>),
    ) -> Result<()> {
        self.run_backward(gpu, Grad::Overwrite, collective, on_layer_done)
    }

    fn run_backward(
        &mut self,
        gpu: &Gpu,
        param_grad: Grad,
        collective: Option<Collective<'_>>,
        on_layer_done: &mut dyn FnMut(usize, &mut Updatable<'_>),
    ) -> Result<()> {
        self.check_gpu(gpu);
        gpu.bind()?;
        let phase = self.pass.phase;
        let ctx = GpuCtx {
            phase,
            iter: self.pass.iter,
            seed: self.seed,
            first_sample: self.pass.first_sample,
            collective,
        };
        let plan = &self.plans[phase_index(phase)];
        for &b in &plan.zero {
            let blob = &mut self.blobs[b];
            let zeroed = match blob.half {
                Some(_) => gpu.compute.memset_zeros(&mut blob.half_diff_mut()),
                None => gpu.compute.memset_zeros(&mut blob.diff_mut()),
            };
            zeroed.map_err(|e| gpu_error("zero an activation gradient", e))?;
        }
        for &(t, w) in &plan.loss_tops {
            let blob = &mut self.blobs[t];
            let n = blob.count();
            match &self.loss_scale {
                Some(ls) => {
                    gpu.kernels
                        .fill_scaled(&gpu.compute, &mut blob.diff, w, &ls.scale, n)?
                }
                None => gpu.kernels.fill(&gpu.compute, &mut blob.diff, w, n)?,
            }
        }
        if param_grad == Grad::Overwrite {
            for &i in &plan.idle_param_layers {
                let range = self.params.layer_range(i);
                gpu.compute
                    .memset_zeros(&mut self.params.diff.slice_mut(range))
                    .map_err(|e| gpu_error("zero an idle layer's gradient", e))?;
            }
        }
        for i in (0..self.layers.len()).rev() {
            let node = self.graph.node(i);
            if !node.runs_in(phase) {
                continue;
            }
            // A fused chain runs its backward at its last layer, so that the gradients of all
            // its layers are complete from there on.
            let run = match &self.slots[i] {
                Slot::Own if node.needs_backward => Some((i, self.params.layer_range(i))),
                Slot::Own | Slot::Head { .. } => None,
                &Slot::Absorbed { head } => match &self.slots[head] {
                    Slot::Head { last, params } if *last == i => {
                        let chain_needs = (head..=i).any(|j| self.graph.node(j).needs_backward);
                        chain_needs.then(|| (head, params.clone()))
                    }
                    _ => None,
                },
            };
            if let Some((at, range)) = run {
                let (master, diff) = self.params.data_and_diff();
                let params = weights_seen(&self.rounding, master, range.clone());
                let half = self
                    .rounding
                    .as_ref()
                    .and_then(|r| r.operands(at, range.clone()));
                let rounding = &self.rounding;
                let graph_bottoms = &self.storage.reads()[at];
                let param_diff = diff.slice_mut(range);
                let (layer, blobs) = (&mut self.layers[at], &mut self.blobs);
                let (bottoms, storage) = (&self.bottoms[at], &self.storage);
                self.layer_clock.time(gpu, Name::Backward(at as u32), || {
                    layer.backward(BackwardPass {
                        gpu,
                        ctx: &ctx,
                        blobs: LayerBlobs::new(blobs, bottoms, node.tops),
                        grads: &plan.grads[at],
                        params,
                        half,
                        param_grad,
                        param_diff,
                    })?;
                    let converted = storage.conversions.iter().zip(&plan.converted);
                    for (c, grad) in converted.filter(|(c, g)| c.layer == at && g.wanted()) {
                        convert_backward(gpu, storage, c, grad.accumulate(), blobs)?;
                    }
                    if let Some(r) = rounding {
                        let read = bottoms
                            .iter()
                            .zip(graph_bottoms.iter())
                            .zip(&plan.grads[at]);
                        for ((&stored, &b), g) in read {
                            // Overwritten in place from half-type top diffs by a layer that
                            // keeps them, or by the widening of a half-type copy's gradient:
                            // already half-type values. A half-type blob's gradient is rounded
                            // where it is written.
                            let p = &r.plan;
                            let widened = stored != b
                                && blobs[stored].half.is_some()
                                && storage.widens_over(stored, &plan.converted);
                            let kept = stored == b
                                && (p.rounds_itself[at]
                                    || p.backward_keeps_half[at] && *g == Grad::Overwrite)
                                || p.diff_left_by[b] == Some(at)
                                || blobs[b].half.is_some()
                                || widened;
                            if g.wanted() && !kept {
                                let n = blobs[b].count();
                                r.round(gpu, &mut blobs[b].diff, n)?;
                            }
                        }
                    }
                    Ok(())
                })?;
            }
            if node.needs_backward {
                // The net's fields one by one: the backward's plan is still borrowed.
                let (p, r, l) = (&mut self.params, &mut self.rounding, &mut self.loss_scale);
                on_layer_done(i, &mut Updatable::of(p, r, l));
            }
        }
        Ok(())
    }

    /// The loss and accuracy outputs of the last forward, in the order of the CPU net's
    /// `forward`: the tops of its loss layers and of layers without backward. Synchronises.
    pub fn outputs(&mut self, gpu: &Gpu) -> Result<Vec<Output>> {
        self.check_gpu(gpu);
        let mut outputs = Vec::new();
        for i in 0..self.layers.len() {
            let node = self.graph.node(i);
            let reported = node.reports_output;
            if !node.runs_in(self.pass.phase) || !reported {
                continue;
            }
            for (j, &t) in node.tops.iter().enumerate() {
                let k = outputs.len();
                gpu.compute
                    .memcpy_dtod(
                        &self.blobs[t].data.slice(..1),
                        &mut self.gathered.slice_mut(k..k + 1),
                    )
                    .map_err(|e| gpu_error("gather an output", e))?;
                outputs.push(Output {
                    name: self.top_names[i][j].clone(),
                    value: 0.0,
                    is_loss: node.is_loss,
                    loss_weight: node.loss_weight,
                });
            }
        }
        if outputs.is_empty() {
            return Ok(outputs);
        }
        // Waited for first: a copy into pageable memory blocks without a deadline.
        gpu.synchronize()?;
        let values = gpu
            .compute
            .clone_dtoh(&self.gathered.slice(..outputs.len()))
            .map_err(|e| gpu_error("copy the outputs to the host", e))?;
        gpu.synchronize()?;
        for (o, v) in outputs.iter_mut().zip(values) {
            o.value = v;
        }
        Ok(outputs)
    }

    /// A host copy of the parameters and their gradient. Synchronises.
    pub fn params_to_host(&self, gpu: &Gpu) -> Result<Params> {
        self.check_gpu(gpu);
        self.params.to_host(gpu)
    }

    /// Replaces the device parameters (and the gradient, unless `params.diff` is empty) by the
    /// host's, which must have this net's layout.
    pub fn params_from_host(&mut self, gpu: &Gpu, params: &Params) -> Result<()> {
        self.check_gpu(gpu);
        if params.spans.len() != self.params.spans.len()
            || params
                .spans
                .iter()
                .zip(&self.params.spans)
                .any(|(a, b)| a.full_name != b.full_name || a.shape != b.shape)
        {
            return Err(Error::Device(
                "CUDA: host parameters of another layout than the net's".into(),
            ));
        }
        self.params.copy_from_host(gpu, params)
    }
}

/// Checks that the learnable tensors' shapes at the real batch are those of the layout built at
/// batch 1 (they differ only for a layer whose features include the batch axis).
fn check_layout(spans: &[ParamSpan], shapers: &[Box<dyn Layer>]) -> Result<()> {
    let mut s = spans.iter();
    for shaper in shapers {
        for spec in shaper.param_specs() {
            let span = s.next().expect("the layout has every layer's tensors");
            if span.shape != spec.shape {
                let layer = span.full_name.split('.').next().unwrap_or("");
                return Err(Error::net(
                    layer,
                    format!(
                        "learnable tensor `{}` changes shape with the batch ({:?} at batch 1, \
                         {:?} at the configured batch); the CUDA backend needs fixed shapes",
                        span.full_name, span.shape, spec.shape
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The weights the layers see in `range` of the flat parameters: the rounded copy in mixed
/// precision, the master weights `master` otherwise.
fn weights_seen<'a>(
    rounding: &'a Option<HalfRounding>,
    master: &'a CudaSlice<f32>,
    range: std::ops::Range<usize>,
) -> CudaView<'a, f32> {
    match rounding {
        Some(r) => r.weights.slice(range),
        None => master.slice(range),
    }
}

/// Fills the copy of conversion `c` from the blob it converts, for its layer's forward: a
/// transpose between layouts, or a conversion between FP32 and the half type (rounding into the
/// half type, widening out of it).
fn convert_forward(
    gpu: &Gpu,
    storage: &StoragePlan,
    c: &Conversion,
    blobs: &mut [GpuBlob],
) -> Result<()> {
    let [from, copy] = gpu_layers::pick(blobs, [c.from, c.copy]);
    let (s, k, n) = (&gpu.compute, &gpu.kernels, from.count());
    match (from.elem(), copy.elem()) {
        (Elem::F32, Elem::F32) => {
            let matrix = storage.stored[c.from].sample_matrix(&from.shape);
            k.transpose(s, &from.data, &mut copy.data, from.shape[0], matrix, false)
        }
        (Elem::F32, Elem::Half(h)) => k.narrow_half(
            s,
            &from.data,
            &mut copy.half_data_mut(),
            h.is_fp16(),
            false,
            n,
        ),
        (Elem::Half(h), Elem::F32) => {
            k.widen_half(s, &from.half_data(), &mut copy.data, h.is_fp16(), false, n)
        }
        (Elem::Half(_), Elem::Half(_)) => unreachable!("the storage plan converts no half blob"),
    }
}

/// Adds (`accumulate`) or writes the gradient its layer's backward left in the copy of
/// conversion `c` into the gradient of the blob it converts: transposed back, or widened into
/// an FP32 gradient, or added to a half-type one and rounded once.
fn convert_backward(
    gpu: &Gpu,
    storage: &StoragePlan,
    c: &Conversion,
    accumulate: bool,
    blobs: &mut [GpuBlob],
) -> Result<()> {
    let [from, copy] = gpu_layers::pick(blobs, [c.from, c.copy]);
    let (s, k, n) = (&gpu.compute, &gpu.kernels, from.count());
    match (from.elem(), copy.elem()) {
        (Elem::F32, Elem::F32) => {
            let matrix = storage.stored[c.copy].sample_matrix(&copy.shape);
            k.transpose(
                s,
                &copy.diff,
                &mut from.diff,
                copy.shape[0],
                matrix,
                accumulate,
            )
        }
        (Elem::F32, Elem::Half(h)) => {
            let fp16 = h.is_fp16();
            k.widen_half(s, &copy.half_diff(), &mut from.diff, fp16, accumulate, n)
        }
        (Elem::Half(h), Elem::F32) => {
            let fp16 = h.is_fp16();
            k.narrow_half(
                s,
                &copy.diff,
                &mut from.half_diff_mut(),
                fp16,
                accumulate,
                n,
            )
        }
        (Elem::Half(_), Elem::Half(_)) => unreachable!("the storage plan converts no half blob"),
    }
}

/// The graph's blob `shapes` followed by those of the storage plan's copies.
fn with_copies(mut shapes: Vec<Vec<usize>>, storage: &StoragePlan) -> Vec<Vec<usize>> {
    for c in &storage.conversions {
        shapes.push(shapes[c.from].clone());
    }
    shapes
}

mod fusion;
mod rounding;
mod storage;

#[cfg(test)]
mod tests;
