//! `Dropout` (Caffe's inverted dropout): in the train phase each element is kept and scaled by
//! `1 / (1 − ratio)` or zeroed; in the test phase the layer is the identity. Bottom and top have
//! the same shape `(N, ...)`.
//!
//! The mask is counter-based, so it is the same for every topology: element `e` (index within
//! the sample, `0..C·H·W`) of the sample at global stream position `s = ctx.first_sample + n` is
//! kept iff `dropout_uniform(layer_seed, ctx.iter, s, e) >= ratio`, with
//! `layer_seed = ctx.seed ^ fnv1a64(layer name)`. N replicas × batch b and 1 replica × batch N·b
//! therefore drop the same elements of the same records. [`dropout_uniform`] and [`fnv1a64`] are
//! public so that other backends draw the identical mask.

use crate::config::layer_params::DropoutParams;
use crate::config::Phase;
use crate::error::Result;
use crate::layers::{elementwise_shape, BackwardPass, CpuLayer, ForwardPass, Layer};

/// FNV-1a, 64 bits (offset 0xcbf29ce484222325, prime 0x100000001b3): the layer's share of the seed.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A uniform number in `[0, 1)` (24 bits) keyed by (seed, iteration, sample, element): a
/// SplitMix64 finaliser over the mixed counters.
pub fn dropout_uniform(seed: u64, iter: u64, sample: u64, elem: u64) -> f32 {
    let mut z = seed
        ^ iter.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ sample.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ elem.wrapping_mul(0x1656_67B1_9E37_79F9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// The seed of a layer's masks: `seed ^ fnv1a64(name)`.
pub fn layer_seed(seed: u64, name: &str) -> u64 {
    seed ^ fnv1a64(name.as_bytes())
}

cpu_layer! {
    /// Inverted dropout; see the module docs. Its state is the mask of the last train forward
    /// `(N, ...)`: `1 / (1 − ratio)` where kept, 0 where dropped; backward multiplies by it.
    pub type Dropout = CpuLayer<DropoutParams, Vec<f32>>;
}

impl Layer for Dropout {
    fn type_name(&self) -> &'static str {
        "dropout"
    }

    /// One bottom `(N, ...)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let tops = elementwise_shape(&self.name, bottoms)?;
        self.state.resize(tops[0].iter().product(), 0.0);
        Ok(tops)
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let (ctx, bottom) = (pass.ctx, &pass.bottoms[0]);
        let (x, y) = (&bottom.data, &mut pass.tops[0].data);
        if ctx.phase == Phase::Test {
            y.copy_from_slice(x);
            return;
        }
        let seed = layer_seed(ctx.seed, &self.name);
        let (ratio, mask) = (self.settings.ratio, &mut self.state);
        let scale = 1.0 / (1.0 - ratio);
        let inner = bottom.inner().max(1);
        for (n, ((ys, xs), ms)) in y
            .chunks_exact_mut(inner)
            .zip(x.chunks_exact(inner))
            .zip(mask.chunks_exact_mut(inner))
            .enumerate()
        {
            let s = ctx.first_sample + n as u64;
            for (e, ((y, &x), m)) in ys.iter_mut().zip(xs).zip(ms).enumerate() {
                let keep = dropout_uniform(seed, ctx.iter, s, e as u64) >= ratio;
                *m = if keep { scale } else { 0.0 };
                *y = x * *m;
            }
        }
    }

    /// `dx += dy · mask` (train phase; the mask of the last forward).
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let phase = pass.ctx.phase;
        let Some((top, bottom)) = pass.top_and_bottom() else {
            return;
        };
        let (dx, dy) = (&mut bottom.diff, &top.diff);
        if phase == Phase::Test {
            dx.iter_mut().zip(dy).for_each(|(d, &g)| *d += g);
            return;
        }
        for ((d, &g), &m) in dx.iter_mut().zip(dy).zip(&self.state) {
            *d += g * m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{self, forward_in, named};
    use crate::layers::Ctx;
    use crate::tensor::Blob;

    fn dropout(ratio: f32) -> Dropout {
        named::<DropoutParams>("drop", "dropout", &format!("dropout_ratio = {ratio:?}"))
    }

    fn ctx(cpu: &Cpu, phase: Phase, iter: u64, first_sample: u64) -> Ctx<'_> {
        Ctx {
            iter,
            seed: 1701,
            first_sample,
            ..test_util::ctx(cpu, phase)
        }
    }

    fn forward(layer: &mut Dropout, c: &Ctx, x: &Blob) -> Vec<f32> {
        forward_in(c, layer, std::slice::from_ref(x), &[])
            .remove(0)
            .data
    }

    #[test]
    fn fnv1a64_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// The uniform numbers lie in [0, 1) and are spread evenly (mean and fraction below 0.3).
    #[test]
    fn dropout_uniform_is_uniform() {
        let n = 100_000;
        let us: Vec<f32> = (0..n)
            .map(|e| dropout_uniform(7, 3, e / 100, e % 100))
            .collect();
        assert!(us.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = us.iter().map(|&u| u as f64).sum::<f64>() / n as f64;
        let below = us.iter().filter(|&&u| u < 0.3).count() as f64 / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((below - 0.3).abs() < 0.01, "fraction below 0.3: {below}");
    }

    /// Kept elements are scaled by 1/(1−ratio), the rest are 0, about `ratio` of them dropped,
    /// and each element's fate is the counter formula's.
    #[test]
    fn train_forward_follows_the_counter_mask() {
        let cpu = Cpu::new(1);
        let mut layer = dropout(0.25);
        let x = uniform_blob(&[8, 3, 10, 10], 0.5, 1.5, 3);
        let c = ctx(&cpu, Phase::Train, 5, 40);
        let y = forward(&mut layer, &c, &x);
        let seed = layer_seed(1701, "drop");
        let mut dropped = 0;
        for (i, (&y, &x)) in y.iter().zip(&x.data).enumerate() {
            let (n, e) = (i / 300, i % 300);
            let keep = dropout_uniform(seed, 5, 40 + n as u64, e as u64) >= 0.25;
            if keep {
                assert_eq!(y, x * (1.0 / 0.75));
            } else {
                assert_eq!(y, 0.0);
                dropped += 1;
            }
        }
        let frac = dropped as f64 / y.len() as f64;
        assert!((frac - 0.25).abs() < 0.03, "dropped {frac}");
    }

    /// One batch of 2b equals two batches of b at first_sample 0 and b; another iteration or
    /// another layer name draws another mask.
    #[test]
    fn the_mask_depends_on_the_global_sample_not_the_batch_split() {
        let cpu = Cpu::new(1);
        let mut layer = dropout(0.5);
        let x = uniform_blob(&[6, 20], 0.5, 1.5, 4);
        let whole = forward(&mut layer, &ctx(&cpu, Phase::Train, 2, 10), &x);
        let mut halves = Vec::new();
        for h in 0..2 {
            let mut part = Blob::new(&[3, 20]);
            part.data.copy_from_slice(&x.data[h * 60..(h + 1) * 60]);
            halves.extend(forward(
                &mut layer,
                &ctx(&cpu, Phase::Train, 2, 10 + 3 * h as u64),
                &part,
            ));
        }
        assert_eq!(whole, halves);
        let next_iter = forward(&mut layer, &ctx(&cpu, Phase::Train, 3, 10), &x);
        assert_ne!(whole, next_iter);
        let mut other = named::<DropoutParams>("drop2", "dropout", "dropout_ratio = 0.5");
        assert_ne!(
            whole,
            forward(&mut other, &ctx(&cpu, Phase::Train, 2, 10), &x)
        );
    }

    #[test]
    fn test_phase_is_the_identity() {
        let cpu = Cpu::new(1);
        let mut layer = dropout(0.5);
        let x = uniform_blob(&[4, 7], -1.0, 1.0, 5);
        assert_eq!(
            forward(&mut layer, &ctx(&cpu, Phase::Test, 0, 0), &x),
            x.data
        );
    }

    /// The gradient checker's train context keeps (iter, first_sample) fixed, so every forward
    /// of the check draws the same mask: dy/dx is that mask.
    #[test]
    fn gradient_check_with_a_fixed_mask() {
        for ratio in [0.0, 0.3, 0.5] {
            let mut layer = dropout(ratio);
            let x = uniform_blob(&[3, 2, 4, 4], -1.0, 1.0, 6);
            GradientChecker::default().assert_passes(&mut layer, &[x], &[true]);
        }
    }
}
