//! Launchers of the input kernels (`input.cu`): a batch of 8-bit pixels `(n, C, H, W)` turned
//! into the net's floats on the device, `(x − mean[c]) · scale`, bit for bit as
//! [`Normalize::apply`](crate::data::Normalize::apply) computes them on the CPU.

use super::{check_len, check_lens, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

impl Kernels {
    /// `y[i] = (x[i] − mean[c]) · scale` for the first `n` pixels of `x` `(n, C, H, W)`, where
    /// `c = (i / plane) % C`, `C = mean.len()` and `plane = H·W`.
    #[allow(clippy::too_many_arguments)]
    pub fn normalize_u8(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<u8>,
        y: &mut impl DevicePtrMut<f32>,
        mean: &impl DevicePtr<f32>,
        channels: usize,
        plane: usize,
        scale: f32,
        n: usize,
    ) -> Result<()> {
        let op = "normalize_u8";
        assert!(
            channels > 0 && plane > 0,
            "{op}: {channels} channels of {plane}"
        );
        check_len(op, "mean", mean.len(), channels);
        if !check_lens(op, n, &[("x", x.len()), ("y", y.len())]) {
            return Ok(());
        }
        let c = to_i32(op, channels);
        let (plane, n64) = (plane as i64, n as i64);
        launch!(
            self, s, normalize_u8, self.grid(n),
            [in x, out y, in mean, &c, &plane, &scale, &n64]
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::test_util::gpu_or_skip;
    use crate::data::Normalize;

    /// Every pixel value in every channel, against ImageNet's means and scale and a few others:
    /// the device's floats are the CPU's bit for bit (no multiply-add contraction).
    #[test]
    fn normalize_u8_matches_the_cpu_bit_for_bit() {
        let gpu = gpu_or_skip!("normalize_u8_matches_the_cpu_bit_for_bit");
        let (s, k) = (&gpu.compute, &gpu.kernels);
        let plane = 256 + 3; // every value once per plane, and a few more
        let cases: [(&[f32], f32); 4] = [
            (&[123.675, 116.28, 103.53], 0.017_124_7),
            (&[0.0, 0.0, 0.0], 1.0),
            (&[104.0, 117.0, 123.0], 1.0 / 255.0),
            (&[0.5, 127.5, 255.0], 0.007_843_138),
        ];
        let records = 5;
        let pixels: Vec<u8> = (0..records * 3 * plane)
            .map(|i| ((i % plane) * 7 + i / plane) as u8)
            .collect();
        let x = s.clone_htod(&pixels).unwrap();
        let mut y = s.alloc_zeros::<f32>(pixels.len()).unwrap();
        for (mean, scale) in cases {
            let normalize = Normalize {
                mean: mean.to_vec(),
                scale,
                plane,
            };
            let dmean = s.clone_htod(mean).unwrap();
            k.normalize_u8(s, &x, &mut y, &dmean, 3, plane, scale, pixels.len())
                .unwrap();
            let got = s.clone_dtoh(&y).unwrap();
            let mut want = vec![0.0; pixels.len()];
            normalize.apply(&pixels, &mut want);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "pixel {i} = {} with means {mean:?}, scale {scale}: {g:e} vs {w:e}",
                    pixels[i]
                );
            }
        }
    }
}
