//! `GpuBatchNorm`: Caffe's BatchNorm (no affine part) on the project's own kernels, the device
//! twin of `crate::layers::batch_norm`, including `sync` over the replicas.
//!
//! Shapes: bottom and top `(N, C, ...)`, statistics per channel over `m = N · S` values
//! (`S` the product of the axes after C) — over every replica's batch when `sync = true`.
//! State, three non-learnable tensors in the flat parameters: running mean `(C)`, running
//! variance `(C)`, moving-average factor `(1)`. The kernels see the bottom as its channel view,
//! `(N, C, S)` stored NCHW or `(N·S, C, 1)` channels-last.
//!
//! Train (batch statistics): per-channel `Σx` and `Σx²` in double (fixed chunks per channel,
//! fixed summation trees), all-reduced (`2C + 1` doubles, the count included) on the compute
//! stream when `sync`; `mean = Σx / m`, biased `var = Σx² / m − mean²`,
//! `y = (x − mean) · inv_std`, `inv_std = 1/√(var + eps)` (as the CPU layer). Then [`GpuLayer::update_state`] updates the running
//! statistics: `factor = factor·maf + 1`, `mean_r = mean_r·maf + mean`,
//! `var_r = var_r·maf + m/(m−1)·var`. Backward: `Σdy` and `Σdy·y` likewise (all-reduced when
//! `sync`), `dx = (dy − mean(dy) − mean(dy·y)·y) / √(var + eps)`, so that N replicas × batch b
//! equal one replica × batch N·b.
//!
//! Global statistics (`use_global_stats`, default in the test phase): `s = factor == 0 ? 0 :
//! 1/factor`, `mean = mean_r·s`, `var = var_r·s`; backward `dx = dy / √(var + eps)`. No state
//! update, no communication.
//!
//! The state tensors have lr_mult 0: their gradient is zero (written as such when the net asks
//! this layer to overwrite the parameter gradient).

use super::{
    one_bottom, scratch, BackwardPass, BlobElem, BuildGpu, ForwardPass, GpuCtx, GpuLayer, Grad,
    StatePass,
};
use crate::config::layer_params::BatchNormParams;
use crate::config::Phase;
use crate::cuda::blob::GpuBlob;
use crate::cuda::kernels::StatsSource;
use crate::cuda::layout::Layout;
use crate::cuda::{gpu_error, Gpu};
use crate::error::{Error, Result};
use crate::precision::Half;
use cudarc::driver::{CudaSlice, CudaView};

/// BatchNorm; see the module docs.
#[derive(Debug)]
pub struct GpuBatchNorm {
    name: String,
    maf: f32,
    eps: f32,
    use_global_stats: Option<bool>,
    sync: bool,
    /// The channel view `(outer, C, inner)` of the current bottom (`(N, C, S)` in NCHW,
    /// `(N·S, C, 1)` channels-last); C fixed by the first reshape.
    dims: (usize, usize, usize),
    layout: Layout,
    channels: Option<usize>,
    /// `(2C + 1)`: `[Σa, Σa·b, m]` of the last forward or backward (after the all-reduce).
    sums: CudaSlice<f64>,
    /// `(C)` the statistics the last forward normalised with.
    mean: CudaSlice<f32>,
    var: CudaSlice<f32>,
    inv_std: CudaSlice<f32>,
    /// Whether the last forward used batch statistics (so that state and backward follow it).
    batch_stats: bool,
}

impl GpuBatchNorm {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`BatchNormParams`]).
    pub fn new(gpu: &Gpu, name: &str, p: &BatchNormParams, layout: Layout) -> Result<Self> {
        Ok(GpuBatchNorm {
            layout,
            name: name.to_string(),
            maf: p.moving_average_fraction,
            eps: p.eps,
            use_global_stats: p.use_global_stats,
            sync: p.sync,
            dims: (0, 0, 0),
            channels: None,
            sums: scratch(gpu, 1)?,
            mean: scratch(gpu, 1)?,
            var: scratch(gpu, 1)?,
            inv_std: scratch(gpu, 1)?,
            batch_stats: false,
        })
    }

    fn global(&self, phase: Phase) -> bool {
        self.use_global_stats.unwrap_or(phase == Phase::Test)
    }

    /// Whether [`Self::reduce`] all-reduces in `ctx`: with `sync`, in the train phase (never in
    /// test passes, whose batch counts may differ between replicas), in a job of several.
    fn reduces(&self, ctx: &GpuCtx<'_>) -> bool {
        self.sync && ctx.phase == Phase::Train && ctx.collective.is_some()
    }

    /// Sums over every replica where [`Self::reduces`].
    pub(super) fn reduce(&mut self, gpu: &Gpu, ctx: &GpuCtx<'_>) -> Result<()> {
        match ctx.collective {
            Some(coll) if self.reduces(ctx) => {
                let n = 2 * self.dims.1 + 1;
                coll.sum_f64(gpu, &mut self.sums, n)
            }
            _ => Ok(()),
        }
    }

    /// The statistics half of forward: `mean`, `var` and `inv_std` of the bottom `x` (batch
    /// statistics, all-reduced when `sync`) or of the running statistics in `state`, as the
    /// phase and `use_global_stats` say; in mixed precision (`round_x`) of `x` rounded to the
    /// half type as it is read. `x` is read as stored as `T` (half-type bit patterns, a
    /// BatchNorm chain's bottom on half-type blobs, need `round_x`).
    pub(super) fn statistics<T: BlobElem>(
        &mut self,
        gpu: &Gpu,
        ctx: &GpuCtx<'_>,
        x: &GpuBlob,
        state: &CudaView<'_, f32>,
        round_x: Option<Half>,
    ) -> Result<()> {
        let (_, c, _) = self.dims;
        let s = &gpu.compute;
        self.batch_stats = !self.global(ctx.phase);
        if self.batch_stats && !self.reduces(ctx) {
            let stats = (&mut self.mean, &mut self.var, &mut self.inv_std);
            let (x, sums) = (&T::data(x), &mut self.sums);
            return gpu
                .kernels
                .bn_sums_and_stats(s, x, sums, self.dims, round_x, self.eps, stats);
        }
        if self.batch_stats {
            gpu.kernels
                .bn_sums(s, &T::data(x), None, &mut self.sums, self.dims, round_x)?;
            self.reduce(gpu, ctx)?;
        }
        let source = if self.batch_stats {
            StatsSource::Batch(&self.sums)
        } else {
            StatsSource::Global(state)
        };
        let stats = (&mut self.mean, &mut self.var, &mut self.inv_std);
        gpu.kernels.bn_stats(s, source, (c, self.eps), stats)
    }

    /// The layer's name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The channel view `(outer, C, inner)` of the current bottom.
    pub(super) fn dims(&self) -> (usize, usize, usize) {
        self.dims
    }

    /// Whether the last forward normalised with batch statistics.
    pub(super) fn batch_stats(&self) -> bool {
        self.batch_stats
    }

    /// `(C)` the mean and `1/√(var + eps)` the last forward normalised with.
    pub(super) fn mean_and_inv_std(&self) -> (&CudaSlice<f32>, &CudaSlice<f32>) {
        (&self.mean, &self.inv_std)
    }

    /// The statistics of the last forward and the sums buffer `(2C + 1)`, for a fused backward
    /// to fill before [`Self::reduce`].
    pub(super) fn stats_and_sums_mut(
        &mut self,
    ) -> (&CudaSlice<f32>, &CudaSlice<f32>, &mut CudaSlice<f64>) {
        (&self.mean, &self.inv_std, &mut self.sums)
    }

    /// The sums after [`Self::reduce`].
    pub(super) fn sums(&self) -> &CudaSlice<f64> {
        &self.sums
    }
}

impl BuildGpu for BatchNormParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuBatchNorm::new(gpu, name, self, layout)?))
    }
}

impl GpuLayer for GpuBatchNorm {
    fn type_name(&self) -> &'static str {
        "batch_norm"
    }

    /// One bottom `(N, C, ...)` with the C of the first call.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom(&self.name, bottoms)?;
        if shape.len() < 2 {
            return Err(Error::net(
                &self.name,
                format!("needs a bottom with a channel axis (N, C, ...), got {shape:?}"),
            ));
        }
        let c = shape[1];
        match self.channels {
            Some(c0) if c0 != c => {
                return Err(Error::net(
                    &self.name,
                    format!("bottom {shape:?} has {c} channels, the statistics {c0}"),
                ))
            }
            Some(_) => {}
            None => {
                self.channels = Some(c);
                self.sums = scratch(gpu, 2 * c + 1)?;
                self.mean = scratch(gpu, c)?;
                self.var = scratch(gpu, c)?;
                self.inv_std = scratch(gpu, c)?;
            }
        }
        self.dims = self.layout.channel_view(shape);
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [x, y] = pass.blobs.bottom_top();
        self.statistics::<f32>(gpu, pass.ctx, x, &pass.params, None)?;
        let stats = (&self.mean, &self.inv_std);
        let s = &gpu.compute;
        gpu.kernels
            .bn_normalize(s, &x.data(), stats, &mut y.data_mut(), self.dims)
    }

    /// The running statistics of a training forward with batch statistics (the sums still hold
    /// the forward's count `m`).
    fn update_state(&mut self, mut pass: StatePass<'_>) -> Result<()> {
        if pass.ctx.phase != Phase::Train || !self.batch_stats {
            return Ok(());
        }
        pass.gpu.kernels.bn_update_running(
            &pass.gpu.compute,
            &mut pass.params,
            &self.mean,
            &self.var,
            &self.sums,
            self.dims.1,
            self.maf,
        )
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad) = (pass.gpu, pass.grads[0]);
        let s = &gpu.compute;
        if pass.param_grad == Grad::Overwrite {
            s.memset_zeros(&mut pass.param_diff)
                .map_err(|e| gpu_error("zero the batch-norm state gradient", e))?;
        }
        if !grad.wanted() {
            return Ok(());
        }
        let acc = grad.accumulate();
        let [x, y] = pass.blobs.bottom_top();
        let top = y.data();
        if self.batch_stats {
            gpu.kernels
                .bn_sums(s, &y.diff(), Some(&top), &mut self.sums, self.dims, None)?;
            self.reduce(gpu, pass.ctx)?;
        }
        let batch = self.batch_stats.then_some((&top, &self.sums));
        let (dy, dx) = (&y.diff(), &mut x.diff_mut());
        gpu.kernels
            .bn_backward(s, dy, batch, &self.inv_std, dx, self.dims, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::cuda::layers::testing::{cpu_ctx, layer_matches_cpu, Fixture};
    use crate::cuda::layers::Collective;
    use crate::cuda::nccl::{nccl_available, NcclComm, NcclId};
    use crate::cuda::test_util::{assert_close, gpu_or_skip, skip_loudly};
    use crate::layers;
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob};
    use crate::tensor::Blob;

    const RTOL: f32 = 1e-5;

    /// Top data, bottom diff (overwritten) and state after forward, state update and backward.
    type Run = (Vec<f32>, Vec<f32>, Vec<f32>);

    fn cfg(extra: &str) -> crate::config::LayerConfig {
        layer_config(&format!("name = \"bn\"\ntype = \"batch_norm\"\n{extra}"))
    }

    fn cpu_run(extra: &str, phase: Phase, x: &Blob, dy: &[f32], state: &[f32]) -> Run {
        let c = x.shape[1];
        let cpu = Cpu::new(1);
        let ctx = cpu_ctx(&cpu, &GpuCtx::local(phase, 0, 1, 0));
        let mut layer = layers::build_from_config(&cfg(extra)).unwrap();
        let tops = layer.reshape(&[&x.shape]).unwrap();
        let mut st = [
            state[..c].to_vec(),
            state[c..2 * c].to_vec(),
            state[2 * c..].to_vec(),
        ];
        let mut top = vec![Blob::new(&tops[0])];
        {
            let p: Vec<&[f32]> = st.iter().map(Vec::as_slice).collect();
            layer.forward(layers::ForwardPass {
                ctx: &ctx,
                bottoms: std::slice::from_ref(x),
                params: &p,
                tops: &mut top,
            });
        }
        {
            let mut v: Vec<&mut [f32]> = st.iter_mut().map(Vec::as_mut_slice).collect();
            layer.update_state(&ctx, &mut v);
        }
        top[0].diff.copy_from_slice(dy);
        let mut bottom = vec![x.clone()];
        bottom[0].diff.fill(0.0);
        let p: Vec<&[f32]> = st.iter().map(Vec::as_slice).collect();
        layer.backward(layers::BackwardPass {
            ctx: &ctx,
            tops: &top,
            propagate_down: &[true],
            bottoms: &mut bottom,
            params: &p,
            param_diffs: &mut [],
        });
        (top[0].data.clone(), bottom[0].diff.clone(), st.concat())
    }

    fn gpu_run(
        gpu: &Gpu,
        collective: Option<Collective<'_>>,
        extra: &str,
        phase: Phase,
        x: &Blob,
        dy: &[f32],
        state: &[f32],
    ) -> Run {
        let ctx = GpuCtx {
            phase,
            iter: 0,
            seed: 1,
            first_sample: 0,
            collective,
        };
        let mut layer = from_config(
            |n, p| GpuBatchNorm::new(gpu, n, p, Layout::Nchw),
            &cfg(extra),
        )
        .unwrap();
        layer.reshape(gpu, &[&x.shape]).unwrap();
        let n = x.count();
        let blobs = vec![
            GpuBlob::from_host(gpu, x).unwrap(),
            GpuBlob::new(gpu, &x.shape, 0).unwrap(),
        ];
        let nan = vec![f32::NAN; state.len()];
        let mut run = Fixture::new(gpu, blobs, 1, state, &nan);
        run.forward(gpu, &ctx, &mut layer);
        run.update_state(gpu, &ctx, &mut layer);
        gpu.compute
            .memcpy_htod(dy, &mut run.blobs[1].diff.slice_mut(..n))
            .unwrap();
        run.backward((gpu, &ctx), &mut layer, &[Grad::Overwrite], Grad::Overwrite);
        let top = run.blobs[1].to_host(gpu).unwrap().data;
        let dx = run.blobs[0].to_host(gpu).unwrap().diff;
        let st = gpu.compute.clone_dtoh(&run.params).unwrap();
        let pd = run.param_diff(gpu);
        assert!(pd.iter().all(|&g| g == 0.0), "state gradient {pd:?}");
        (top, dx, st)
    }

    fn compare(what: &str, got: &Run, want: &Run) {
        assert_close(&format!("{what}: top"), &got.0, &want.0, RTOL);
        assert_close(&format!("{what}: bottom diff"), &got.1, &want.1, RTOL);
        assert_close(&format!("{what}: state"), &got.2, &want.2, RTOL);
    }

    /// Train: batch statistics, the running statistics' update (from a non-trivial state) and
    /// the backward through the statistics, against the CPU layer.
    #[test]
    fn train_matches_cpu() {
        let gpu = gpu_or_skip!("train_matches_cpu");
        let x = uniform_blob(&[4, 3, 5, 6], -2.0, 3.0, 1301);
        let dy = uniform_blob(&[4, 3, 5, 6], -1.0, 1.0, 1302).data;
        let state = [0.1, -0.2, 0.3, 0.5, 0.7, 0.9, 2.0];
        for extra in ["", "moving_average_fraction = 0.9\neps = 1e-3"] {
            let want = cpu_run(extra, Phase::Train, &x, &dy, &state);
            let got = gpu_run(&gpu, None, extra, Phase::Train, &x, &dy, &state);
            compare(&format!("train `{extra}`"), &got, &want);
        }
    }

    /// Test phase (global statistics by default) and `use_global_stats = true` in training:
    /// the scaled running statistics, no state change.
    #[test]
    fn global_stats_match_cpu() {
        let gpu = gpu_or_skip!("global_stats_match_cpu");
        let x = uniform_blob(&[3, 4, 2, 5], -2.0, 3.0, 1311);
        let dy = uniform_blob(&[3, 4, 2, 5], -1.0, 1.0, 1312).data;
        let state = [0.4, -0.6, 0.2, 1.0, 2.0, 0.5, 1.5, 3.0, 2.5];
        for (extra, phase) in [("", Phase::Test), ("use_global_stats = true", Phase::Train)] {
            let want = cpu_run(extra, phase, &x, &dy, &state);
            let got = gpu_run(&gpu, None, extra, phase, &x, &dy, &state);
            compare(&format!("global `{extra}`"), &got, &want);
            assert_eq!(got.2, state, "global statistics leave the state alone");
        }
    }

    /// The statistics in the sums' last launch (where nothing all-reduces the sums) are the
    /// bits of the sums' launches followed by the statistics' own: on FP32 `(N, C, S)`, on a
    /// channels-last bf16 view whose channels take the eight-channel kernels `(96, 64, 1)`, and
    /// on a bf16 `(N, C, S)` that takes the `_h` ones.
    #[test]
    fn statistics_in_the_sums_last_launch_are_the_same_bits() {
        let gpu = gpu_or_skip!("statistics_in_the_sums_last_launch_are_the_same_bits");
        let (s, k) = (&gpu.compute, &gpu.kernels);
        let bf16 = Half::Bf16;
        let raw = uniform_blob(&[96 * 64], -2.0, 3.0, 1331).data;
        let bits: Vec<u16> = raw.iter().map(|&v| bf16.bits(v)).collect();
        let fp32 = s.clone_htod(&raw).unwrap();
        let half = s.clone_htod(&bits).unwrap();
        for (dims, on_half) in [
            ((3, 37, 11), false),
            ((96, 64, 1), true),
            ((4, 24, 13), true),
        ] {
            let (n, c, sp) = dims;
            let count = n * c * sp;
            let buffers = || -> [CudaSlice<f32>; 3] { [0; 3].map(|_| s.alloc_zeros(c).unwrap()) };
            let (mut sums_a, mut sums_b) = (
                scratch(&gpu, 2 * c + 1).unwrap(),
                scratch(&gpu, 2 * c + 1).unwrap(),
            );
            let [mut m_a, mut v_a, mut i_a] = buffers();
            let [mut m_b, mut v_b, mut i_b] = buffers();
            if on_half {
                let x = half.slice(..count);
                k.bn_sums(s, &x, None, &mut sums_a, dims, Some(bf16))
                    .unwrap();
                let stats = (&mut m_b, &mut v_b, &mut i_b);
                k.bn_sums_and_stats(s, &x, &mut sums_b, dims, Some(bf16), 1e-5, stats)
                    .unwrap();
            } else {
                let x = fp32.slice(..count);
                k.bn_sums(s, &x, None, &mut sums_a, dims, None).unwrap();
                let stats = (&mut m_b, &mut v_b, &mut i_b);
                k.bn_sums_and_stats(s, &x, &mut sums_b, dims, None, 1e-5, stats)
                    .unwrap();
            }
            let source = StatsSource::Batch(&sums_a);
            k.bn_stats(s, source, (c, 1e-5), (&mut m_a, &mut v_a, &mut i_a))
                .unwrap();
            let host64 = |b: &CudaSlice<f64>| -> Vec<u64> {
                s.clone_dtoh(b)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            let host32 = |b: &CudaSlice<f32>| -> Vec<u32> {
                s.clone_dtoh(b)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(host64(&sums_a), host64(&sums_b), "{dims:?}: sums");
            for (what, a, b) in [
                ("mean", &m_a, &m_b),
                ("var", &v_a, &v_b),
                ("inv_std", &i_a, &i_b),
            ] {
                assert_eq!(host32(a), host32(b), "{dims:?}: {what}");
            }
        }
    }

    // Batch statistics on a 2-D `(N, C)` bottom through the common harness (accumulating and
    // overwriting gradients).
    layer_matches_cpu!(
        train_on_features_matches_cpu_in_the_harness,
        "name = \"bn\"\ntype = \"batch_norm\"",
        vec![vec![16, 7]],
        1321
    );

    /// `sync = true` on two GPUs (NCCL) with half the batch each equals one GPU with the whole
    /// batch: tops, bottom gradients and the running statistics, the latter bit-identical on
    /// both replicas.
    #[test]
    fn sync_over_two_gpus_equals_one_gpu_with_the_whole_batch() {
        let name = concat!(
            module_path!(),
            "::sync_over_two_gpus_equals_one_gpu_with_the_whole_batch"
        );
        let have = if crate::cuda::available() {
            crate::cuda::device_count().unwrap_or(0)
        } else {
            0
        };
        if have < 2 || !nccl_available() {
            skip_loudly(&format!(
                "SKIPPED (needs 2 CUDA devices and NCCL; {have} device(s)): {name}"
            ));
            return;
        }
        let shape = [6, 3, 4, 4];
        let x = uniform_blob(&shape, -1.0, 2.0, 1331);
        let dy = uniform_blob(&shape, -1.0, 1.0, 1332).data;
        let state = [0.0; 7];
        let extra = "sync = true\nmoving_average_fraction = 0.9";
        let gpu0 = Gpu::new(0, crate::config::MathMode::Fp32).unwrap();
        let whole = gpu_run(&gpu0, None, extra, Phase::Train, &x, &dy, &state);
        drop(gpu0);
        let id = NcclId::new().unwrap();
        let bytes = *id.as_bytes();
        let half = x.count() / 2;
        let halves: Vec<Run> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|r| {
                    let (x, dy) = (&x, &dy);
                    s.spawn(move || {
                        let gpu = Gpu::new(r, crate::config::MathMode::Fp32).unwrap();
                        let comm =
                            NcclComm::from_id(gpu.compute.clone(), r, 2, NcclId::from_bytes(bytes))
                                .unwrap();
                        let mut part = Blob::new(&[3, 3, 4, 4]);
                        part.data.copy_from_slice(&x.data[r * half..(r + 1) * half]);
                        let coll = Collective {
                            comm: &comm,
                            other: None,
                        };
                        let out = gpu_run(
                            &gpu,
                            Some(coll),
                            extra,
                            Phase::Train,
                            &part,
                            &dy[r * half..(r + 1) * half],
                            &state,
                        );
                        gpu.synchronize().unwrap();
                        comm.finish().unwrap();
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let joined = (
            [halves[0].0.clone(), halves[1].0.clone()].concat(),
            [halves[0].1.clone(), halves[1].1.clone()].concat(),
            halves[0].2.clone(),
        );
        compare("2 GPUs × 3 vs 1 GPU × 6", &joined, &whole);
        assert_eq!(
            halves[0].2, halves[1].2,
            "both replicas hold the same state"
        );
    }
}
