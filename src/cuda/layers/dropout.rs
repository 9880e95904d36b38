//! `GpuDropout`: the device twin of `crate::layers::dropout`, with the same counter-based mask
//! bit for bit (the layer contract): element `e` of the sample at global stream position
//! `s = first_sample + n` is kept, times `1 / (1 − ratio)`, iff
//! `dropout_uniform(seed ^ fnv1a64(name), iter, s, e) ≥ ratio`. The mask therefore depends only
//! on the seed, the layer, the iteration and the sample's position — the same for any topology.
//! Backward recomputes it (no mask buffer). Test phase: identity.
//!
//! Shapes: bottom and top `(N, ...)`; `e` runs over the `count / N` elements of a sample in
//! NCHW order, also where the blobs are stored channels-last (the mask does not depend on the
//! layout).

use super::{copy_data, BackwardPass, BuildGpu, ForwardPass, GpuCtx, GpuLayer};
use crate::config::layer_params::DropoutParams;
use crate::config::Phase;
use crate::cuda::kernels::DropoutMask;
use crate::cuda::layout::{layout_matters, Layout};
use crate::cuda::Gpu;
use crate::error::Result;

/// FNV-1a, 64 bits, of `bytes` (the contract's per-layer seed).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Dropout; see the module docs.
#[derive(Debug, Clone)]
pub struct GpuDropout {
    ratio: f32,
    scale: f32,
    /// `fnv1a64(name)`, xored with the run's seed at each pass.
    name_hash: u64,
    layout: Layout,
}

impl GpuDropout {
    /// The mask of a pass in `ctx` over a blob of `shape` `(N, ...)`: its elements per sample,
    /// its channels per pixel when stored channels-last (the kernels number a channels-last
    /// sample's elements in NCHW order), and the key `(layer seed, iteration, first sample)`.
    fn mask(&self, shape: &[usize], ctx: &GpuCtx<'_>) -> DropoutMask {
        let channels_last = self.layout == Layout::Nhwc && layout_matters(shape);
        DropoutMask {
            per_sample: shape.iter().skip(1).product(),
            chans: if channels_last { shape[1] } else { 0 },
            key: (ctx.seed ^ self.name_hash, ctx.iter, ctx.first_sample),
            ratio: self.ratio,
            scale: self.scale,
        }
    }
}

impl BuildGpu for DropoutParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        let ratio = self.ratio;
        Ok(Box::new(GpuDropout {
            ratio,
            scale: 1.0 / (1.0 - ratio),
            name_hash: fnv1a64(name.as_bytes()),
            layout,
        }))
    }
}

impl GpuLayer for GpuDropout {
    fn type_name(&self) -> &'static str {
        "dropout"
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, ctx) = (pass.gpu, pass.ctx);
        let [x, y] = pass.blobs.bottom_top();
        if ctx.phase == Phase::Test {
            return copy_data(gpu, x, y);
        }
        let (mask, n) = (self.mask(&x.shape, ctx), x.count());
        gpu.kernels
            .dropout_forward(&gpu.compute, &mask, &x.data(), &mut y.data_mut(), n)
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, ctx, grad) = (pass.gpu, pass.ctx, pass.grads[0]);
        if !grad.wanted() {
            return Ok(());
        }
        let [x, y] = pass.blobs.bottom_top();
        let n = x.count();
        let acc = grad.accumulate();
        if ctx.phase == Phase::Test {
            return gpu.kernels.scaled_copy(
                &gpu.compute,
                &y.diff(),
                &mut x.diff_mut(),
                1.0,
                n,
                acc,
            );
        }
        let mask = self.mask(&x.shape, ctx);
        let (dy, dx) = (&y.diff(), &mut x.diff_mut());
        gpu.kernels
            .dropout_backward(&gpu.compute, &mask, dy, dx, n, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::cuda::blob::GpuBlob;
    use crate::cuda::layers::build;
    use crate::cuda::layers::testing::{cpu_ctx, layer_matches_cpu, Fixture};
    use crate::cuda::test_util::gpu_or_skip;
    use crate::layers;
    use crate::layers::gradient_check::{layer_config, uniform_blob};
    use crate::tensor::Blob;

    /// Runs without a GPU: the contract's FNV-1a constants.
    #[test]
    fn fnv1a64_of_known_strings() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    layer_matches_cpu!(
        matches_cpu,
        "name = \"drop\"\ntype = \"dropout\"\ndropout_ratio = 0.3",
        vec![vec![4, 3, 5, 5]],
        501
    );

    /// The kept elements are exactly the CPU's, at a later iteration and sample offset, and
    /// the kept values are bit-identical.
    #[test]
    fn mask_is_bit_identical_to_cpu() {
        let gpu = gpu_or_skip!("mask_is_bit_identical_to_cpu");
        let cfg = layer_config("name = \"fc6/drop\"\ntype = \"dropout\"");
        let shape = vec![6, 100];
        let gctx = GpuCtx::local(Phase::Train, 12345, 987, 4242);
        let cpu = Cpu::new(1);
        let ctx = cpu_ctx(&cpu, &gctx);
        let mut cpu_layer = layers::build_from_config(&cfg).unwrap();
        let tops = cpu_layer.reshape(&[&shape]).unwrap();
        // Strictly positive inputs, so a dropped element (0) is never a kept one.
        let mut x = uniform_blob(&shape, 0.5, 2.0, 7);
        x.diff.fill(0.0);
        let mut want = vec![Blob::new(&tops[0])];
        cpu_layer.forward(layers::ForwardPass {
            ctx: &ctx,
            bottoms: std::slice::from_ref(&x),
            params: &[],
            tops: &mut want,
        });

        let params = cfg.params().unwrap();
        let mut layer = build(
            &gpu,
            &cfg.name,
            &params,
            &[&shape],
            Layout::Nchw,
            None,
            false,
        )
        .unwrap();
        let blobs = vec![
            GpuBlob::from_host(&gpu, &x).unwrap(),
            GpuBlob::new(&gpu, &tops[0], 0).unwrap(),
        ];
        let mut run = Fixture::new(&gpu, blobs, 1, &[], &[]);
        run.forward(&gpu, &gctx, layer.as_mut());
        let got = run.blobs[1].to_host(&gpu).unwrap();
        let kept = want[0].data.iter().filter(|&&v| v != 0.0).count();
        assert!(
            kept > 200 && kept < 400,
            "about half kept, got {kept} of 600"
        );
        for (i, (g, w)) in got.data.iter().zip(&want[0].data).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "element {i}: GPU {g}, CPU {w}");
        }
    }
}
