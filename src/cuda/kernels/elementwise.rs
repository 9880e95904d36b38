//! Launchers of the elementwise kernels (`elementwise.cu`): fill, scale, axpy, the activations
//! of the neuron layers ([`Activation`]: ReLU, sigmoid, tanh, absolute value, power, ELU) forward and
//! backward, bias rows, scaled copies, elementwise products and Eltwise MAX. Every operand is
//! `(n)` unless a method says otherwise.

use super::{check_len, check_lens, int_count, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

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

impl Kernels {
    /// `x[..n] = value`.
    pub fn fill(
        &self,
        s: &CudaStream,
        x: &mut impl DevicePtrMut<f32>,
        value: f32,
        n: usize,
    ) -> Result<()> {
        if !check_lens("fill", n, &[("x", x.len())]) {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, fill, self.grid(n), [out x, &value, &n64])
    }

    /// `x[..n] *= alpha`.
    pub fn scale(
        &self,
        s: &CudaStream,
        x: &mut impl DevicePtrMut<f32>,
        alpha: f32,
        n: usize,
    ) -> Result<()> {
        if !check_lens("scale", n, &[("x", x.len())]) {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, scale, self.grid(n), [out x, &alpha, &n64])
    }

    /// `y[..n] += alpha · x[..n]`.
    pub fn axpy(
        &self,
        s: &CudaStream,
        alpha: f32,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        if !check_lens("axpy", n, &[("x", x.len()), ("y", y.len())]) {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, axpy, self.grid(n), [in x, out y, &alpha, &n64])
    }

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

    /// `y (+)= alpha · x` over `(n)`.
    pub fn scaled_copy(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        alpha: f32,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let Some(ni) = int_count("scaled_copy", n, &[("x", x.len()), ("y", y.len())]) else {
            return Ok(());
        };
        let acc = accumulate as i32;
        launch!(self, s, scaled_copy, self.grid(n), [in x, out y, &alpha, &ni, &acc])
    }

    /// `y = a · b` over `(n)`.
    pub fn mul_into(
        &self,
        s: &CudaStream,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        let lens = [("a", a.len()), ("b", b.len()), ("y", y.len())];
        let Some(ni) = int_count("mul_into", n, &lens) else {
            return Ok(());
        };
        launch!(self, s, mul_into, self.grid(n), [in a, in b, out y, &ni])
    }

    /// `y *= x` over `(n)`.
    pub fn mul_inplace(
        &self,
        s: &CudaStream,
        y: &mut impl DevicePtrMut<f32>,
        x: &impl DevicePtr<f32>,
        n: usize,
    ) -> Result<()> {
        let Some(ni) = int_count("mul_inplace", n, &[("x", x.len()), ("y", y.len())]) else {
            return Ok(());
        };
        launch!(self, s, mul_inplace, self.grid(n), [out y, in x, &ni])
    }

    /// Eltwise MAX with bottom `k`: `k = 0` sets `y = x, mask = 0`; later bottoms replace where
    /// strictly greater (`mask = k`). `(n)` each.
    pub fn eltwise_max_step(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        mask: &mut CudaSlice<i32>,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let op = "eltwise_max_step";
        let lens = [("x", x.len()), ("y", y.len()), ("mask", mask.len())];
        let Some(ni) = int_count(op, n, &lens) else {
            return Ok(());
        };
        let ki = to_i32(op, k);
        launch!(self, s, eltwise_max_step, self.grid(n), [in x, out y, out mask, &ki, &ni])
    }

    /// `dx (+)= mask == k ? dy : 0` over `(n)`.
    #[allow(clippy::too_many_arguments)]
    pub fn eltwise_max_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        mask: &CudaSlice<i32>,
        dx: &mut impl DevicePtrMut<f32>,
        k: usize,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let op = "eltwise_max_backward";
        let lens = [("dy", dy.len()), ("mask", mask.len()), ("dx", dx.len())];
        let Some(ni) = int_count(op, n, &lens) else {
            return Ok(());
        };
        let (ki, acc) = (to_i32(op, k), accumulate as i32);
        launch!(
            self, s, eltwise_max_backward, self.grid(n),
            [in dy, in mask, out dx, &ki, &ni, &acc]
        )
    }
}
