//! Launchers of the elementwise kernels (`elementwise.cu`): fill, scale, axpy, the activations
//! of the neuron layers ([`Activation`]: ReLU, sigmoid, tanh, absolute value, power, ELU) forward and
//! backward, bias rows, scaled copies, elementwise products, Eltwise MAX and mixed precision's
//! rounding to the half type. Every operand is
//! `(n)` unless a method says otherwise.

use super::{check_len, int_count, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

/// An elementwise activation and its parameters: which pair of kernels a neuron layer runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `y = x > 0 ? x : negative_slope · x`.
    Relu { negative_slope: f32 },
    /// `y = 1 / (1 + e^(−x))`.
    Sigmoid,
    /// `y = tanh(x)`.
    Tanh,
    /// `y = |x|`.
    Abs,
    /// `y = (shift + scale · x)^power`.
    Power { power: f32, scale: f32, shift: f32 },
    /// `y = max(x, 0) + alpha · (e^min(x, 0) − 1)`.
    Elu { alpha: f32 },
}

impl Activation {
    /// Whether the derivative is computed from the top's data `y` (sigmoid, tanh) rather than
    /// from the bottom's data `x`.
    pub fn derivative_reads_top(self) -> bool {
        matches!(self, Activation::Sigmoid | Activation::Tanh)
    }
}

launchers! {
    /// `x[..n] = value`.
    pub fn fill(x: out f32, value: f32, n: elements as i64)
        => launch fill(out x, &value, &n);

    /// `x[..n] = value · factor[0]`, a device scalar.
    pub fn fill_scaled(x: out f32, value: f32, factor: in f32 [1], n: elements as i64)
        => launch fill_scaled(out x, &value, in factor, &n);

    /// `x[..n] *= alpha`.
    pub fn scale(x: out f32, alpha: f32, n: elements as i64)
        => launch scale(out x, &alpha, &n);

    /// `y[..n] += alpha · x[..n]`.
    pub fn axpy(alpha: f32, x: in f32, y: out f32, n: elements as i64)
        => launch axpy(in x, out y, &alpha, &n);

    /// `y (+)= alpha · x` over `(n)`.
    pub fn scaled_copy(
        x: in f32, y: out f32, alpha: f32, n: elements as i32, accumulate: bool as i32,
    ) => launch scaled_copy(in x, out y, &alpha, &n, &accumulate);

    /// `y = a · b` over `(n)`.
    pub fn mul_into(a: in f32, b: in f32, y: out f32, n: elements as i32)
        => launch mul_into(in a, in b, out y, &n);

    /// `y *= x` over `(n)`.
    pub fn mul_inplace(y: out f32, x: in f32, n: elements as i32)
        => launch mul_inplace(out y, in x, &n);

    /// Eltwise MAX with bottom `k`: `k = 0` sets `y = x, mask = 0`; later bottoms replace where
    /// strictly greater (`mask = k`). `(n)` each.
    pub fn eltwise_max_step(
        x: in f32, y: out f32, mask: out i32, k: usize as i32, n: elements as i32,
    ) => launch eltwise_max_step(in x, out y, out mask, &k, &n);

    /// `dx (+)= mask == k ? dy : 0` over `(n)`.
    pub fn eltwise_max_backward(
        dy: in f32, mask: in i32, dx: out f32,
        k: usize as i32, n: elements as i32, accumulate: bool as i32,
    ) => launch eltwise_max_backward(in dy, in mask, out dx, &k, &n, &accumulate);

    /// `x[..n]` rounded in place to bf16, or to fp16 when `fp16` (to nearest, ties to even, as
    /// [`Half::round`](crate::precision::Half::round)).
    pub fn round_half(x: out f32, fp16: bool as i32, n: elements as i64)
        => launch round_half(out x, &fp16, &n);

    /// `y[..n] = x[..n]` rounded as [`Kernels::round_half`] does.
    pub fn round_half_copy(x: in f32, y: out f32, fp16: bool as i32, n: elements as i64)
        => launch round_half_copy(in x, out y, &fp16, &n);

    /// `h[..n]` the half-type bit patterns of `x[..n]` rounded as [`Kernels::round_half`]
    /// rounds (a plain conversion where `x` holds half-type values).
    pub fn to_half(x: in f32, h: out u16, fp16: bool as i32, n: elements as i64)
        => launch to_half(in x, out h, &fp16, &n);
}

impl Kernels {
    /// `y = f(x)` over `(n)`.
    pub fn activation_forward(
        &self,
        s: &CudaStream,
        f: Activation,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        let Some(ni) = int_count("activation_forward", n, &[("x", x.len()), ("y", y.len())]) else {
            return Ok(());
        };
        let grid = self.grid(n);
        match f {
            Activation::Relu { negative_slope } => {
                launch!(self, s, relu_forward, grid, [in x, out y, &negative_slope, &ni])
            }
            Activation::Sigmoid => launch!(self, s, sigmoid_forward, grid, [in x, out y, &ni]),
            Activation::Tanh => launch!(self, s, tanh_forward, grid, [in x, out y, &ni]),
            Activation::Abs => launch!(self, s, abs_forward, grid, [in x, out y, &ni]),
            Activation::Power {
                power,
                scale,
                shift,
            } => launch!(
                self, s, power_forward, grid,
                [in x, out y, &ni, &power, &scale, &shift]
            ),
            Activation::Elu { alpha } => {
                launch!(self, s, elu_forward, grid, [in x, out y, &alpha, &ni])
            }
        }
    }

    /// `dx (+)= dy · f'` over `(n)`, `f'` computed from `input`: the top's data `y` where
    /// [`Activation::derivative_reads_top`], else the bottom's data `x`. ReLU:
    /// `dy · (x > 0 ? 1 : negative_slope)`; sigmoid: `dy · y · (1 − y)`; tanh: `dy · (1 − y²)`;
    /// absolute value: `sign(x) · dy`; power: `dy · power · scale · (shift + scale · x)^(power −
    /// 1)`; ELU: `dy · (x > 0 ? 1 : alpha · (e^x − 1) + alpha)`.
    #[allow(clippy::too_many_arguments)]
    pub fn activation_backward(
        &self,
        s: &CudaStream,
        f: Activation,
        input: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let lens = [("input", input.len()), ("dy", dy.len()), ("dx", dx.len())];
        let Some(ni) = int_count("activation_backward", n, &lens) else {
            return Ok(());
        };
        let (grid, acc) = (self.grid(n), accumulate as i32);
        match f {
            Activation::Relu { negative_slope } => launch!(
                self, s, relu_backward, grid,
                [in input, in dy, out dx, &negative_slope, &ni, &acc]
            ),
            Activation::Sigmoid => {
                launch!(self, s, sigmoid_backward, grid, [in input, in dy, out dx, &ni, &acc])
            }
            Activation::Tanh => {
                launch!(self, s, tanh_backward, grid, [in input, in dy, out dx, &ni, &acc])
            }
            Activation::Abs => {
                launch!(self, s, abs_backward, grid, [in input, in dy, out dx, &ni, &acc])
            }
            Activation::Power {
                power,
                scale,
                shift,
            } => launch!(
                self, s, power_backward, grid,
                [in input, in dy, out dx, &ni, &power, &scale, &shift, &acc]
            ),
            Activation::Elu { alpha } => launch!(
                self, s, elu_backward, grid,
                [in input, in dy, out dx, &alpha, &ni, &acc]
            ),
        }
    }

    /// `y (rows, cols) += b (cols)` on every row.
    pub fn bias_add(
        &self,
        s: &CudaStream,
        y: &mut impl DevicePtrMut<f32>,
        b: &impl DevicePtr<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        check_len("bias_add", "y", y.len(), rows * cols);
        check_len("bias_add", "b", b.len(), cols);
        if rows * cols == 0 {
            return Ok(());
        }
        let (r, c) = (to_i32("bias_add", rows), to_i32("bias_add", cols));
        to_i32("bias_add", rows * cols);
        launch!(self, s, bias_add, self.grid(rows * cols), [out y, in b, &r, &c])
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::test_util::gpu_or_skip;
    use crate::precision::Half;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Both half types, in place, into a copy and as half-type bit patterns (`to_half`), on random floats of every magnitude and on the edges
    /// (ties, the largest finite fp16 and the first value that overflows it, fp16's subnormals
    /// and what flushes to zero, infinities, NaN): the device's values, and the bit patterns
    /// widened, are `Half::round`'s bit for bit.
    #[test]
    fn round_half_matches_the_cpu_bit_for_bit() {
        let gpu = gpu_or_skip!("round_half_matches_the_cpu_bit_for_bit");
        let (s, k) = (&gpu.compute, &gpu.kernels);
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        let mut values: Vec<f32> = (0..100_000)
            .map(|_| f32::from_bits(rng.gen::<u32>()))
            .collect();
        values.extend((0..10_000).map(|_| rng.gen_range(-4.0f32..4.0)));
        values.extend([
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            1.0 + 2f32.powi(-11),
            65504.0,
            65519.0,
            65520.0,
            -2f32.powi(-24),
            2f32.powi(-25),
            3.0 * 2f32.powi(-26),
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
        ]);
        let x = s.clone_htod(&values).unwrap();
        for half in [Half::Bf16, Half::Fp16] {
            let fp16 = half == Half::Fp16;
            let mut copy = s.alloc_zeros::<f32>(values.len()).unwrap();
            k.round_half_copy(s, &x, &mut copy, fp16, values.len())
                .unwrap();
            let mut in_place = x.clone();
            k.round_half(s, &mut in_place, fp16, values.len()).unwrap();
            let mut converted = s.alloc_zeros::<u16>(values.len()).unwrap();
            k.to_half(s, &x, &mut converted, fp16, values.len())
                .unwrap();
            let converted = s.clone_dtoh(&converted).unwrap();
            for (&v, g) in values.iter().zip(converted) {
                let widened = match half {
                    Half::Bf16 => half::bf16::from_bits(g).to_f32(),
                    Half::Fp16 => half::f16::from_bits(g).to_f32(),
                };
                let w = half.round(v);
                let same = match w.is_nan() {
                    true => widened.is_nan(),
                    false => widened.to_bits() == w.to_bits(),
                };
                assert!(same, "{half:?}: {v:e} as half bits {g:#x}, want {w:e}");
            }
            for got in [
                s.clone_dtoh(&copy).unwrap(),
                s.clone_dtoh(&in_place).unwrap(),
            ] {
                for (&v, g) in values.iter().zip(got) {
                    let w = half.round(v);
                    let same = if w.is_nan() {
                        g.is_nan()
                    } else {
                        g.to_bits() == w.to_bits()
                    };
                    assert!(
                        same,
                        "{half:?}: {v:e} ({:#x}) rounded to {g:e}, want {w:e}",
                        v.to_bits()
                    );
                }
            }
        }
    }
}
