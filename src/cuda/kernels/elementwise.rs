//! Launchers of the elementwise kernels (`elementwise.cu`): fill, scale, axpy, the activations
//! (ReLU, sigmoid, tanh, power, absolute value) forward and backward, bias rows, scaled copies,
//! elementwise products and Eltwise MAX. Every operand is `(n)` unless a method says otherwise.

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

impl Kernels {
    /// `x[..n] = value`.
    pub fn fill(
        &self,
        s: &CudaStream,
        x: &mut impl DevicePtrMut<f32>,
        value: f32,
        n: usize,
    ) -> Result<()> {
        check_len("fill", "x", x.len(), n);
        if n == 0 {
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
        check_len("scale", "x", x.len(), n);
        if n == 0 {
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
        check_len("axpy", "x", x.len(), n);
        check_len("axpy", "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, axpy, self.grid(n), [in x, out y, &alpha, &n64])
    }

    /// `y = x > 0 ? x : slope · x` over `(n)`.
    pub fn relu_forward(
        &self,
        s: &CudaStream,
        slope: f32,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        check_len("relu_forward", "x", x.len(), n);
        check_len("relu_forward", "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32("relu_forward", n);
        launch!(self, s, relu_forward, self.grid(n), [in x, out y, &slope, &ni])
    }

    /// `dx (+)= dy · (x > 0 ? 1 : slope)` over `(n)`; overwrites unless `accumulate`.
    #[allow(clippy::too_many_arguments)]
    pub fn relu_backward(
        &self,
        s: &CudaStream,
        slope: f32,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        for (what, len) in [("x", x.len()), ("dy", dy.len()), ("dx", dx.len())] {
            check_len("relu_backward", what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32("relu_backward", n);
        let acc = accumulate as i32;
        launch!(self, s, relu_backward, self.grid(n), [in x, in dy, out dx, &slope, &ni, &acc])
    }

    /// `y = 1 / (1 + e^(−x))` over `(n)`.
    pub fn sigmoid_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        self.unary("sigmoid_forward", &self.sigmoid_forward, s, x, y, n)
    }

    /// `dx (+)= dy · y · (1 − y)` over `(n)`, from the top's data `y`.
    pub fn sigmoid_backward(
        &self,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.unary_backward(
            "sigmoid_backward",
            &self.sigmoid_backward,
            s,
            y,
            dy,
            dx,
            n,
            accumulate,
        )
    }

    /// `y = tanh(x)` over `(n)`.
    pub fn tanh_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        self.unary("tanh_forward", &self.tanh_forward, s, x, y, n)
    }

    /// `dx (+)= dy · (1 − y²)` over `(n)`, from the top's data `y`.
    pub fn tanh_backward(
        &self,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.unary_backward(
            "tanh_backward",
            &self.tanh_backward,
            s,
            y,
            dy,
            dx,
            n,
            accumulate,
        )
    }

    /// A kernel `(const float* x, float* y, int n)`.
    fn unary(
        &self,
        op: &str,
        f: &CudaFunction,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        launch!(function f, op, s, self.grid(n), [in x, out y, &ni])
    }

    /// A kernel `(const float* y, const float* dy, float* dx, int n, int accumulate)`.
    #[allow(clippy::too_many_arguments)]
    fn unary_backward(
        &self,
        op: &str,
        f: &CudaFunction,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        for (what, len) in [("y", y.len()), ("dy", dy.len()), ("dx", dx.len())] {
            check_len(op, what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        let (ni, acc) = (to_i32(op, n), accumulate as i32);
        launch!(function f, op, s, self.grid(n), [in y, in dy, out dx, &ni, &acc])
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
        let op = "scaled_copy";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
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
        let op = "mul_into";
        check_len(op, "a", a.len(), n);
        check_len(op, "b", b.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
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
        let op = "mul_inplace";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
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
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        check_len(op, "mask", mask.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, ki) = (to_i32(op, n), to_i32(op, k));
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
        check_len(op, "dy", dy.len(), n);
        check_len(op, "mask", mask.len(), n);
        check_len(op, "dx", dx.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, ki, acc) = (to_i32(op, n), to_i32(op, k), accumulate as i32);
        launch!(
            self, s, eltwise_max_backward, self.grid(n),
            [in dy, in mask, out dx, &ki, &ni, &acc]
        )
    }

    /// `y = (shift + scale · x)^power` over `(n)`; `(power, scale, shift)`.
    pub fn power_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
        (power, scale, shift): (f32, f32, f32),
    ) -> Result<()> {
        let op = "power_forward";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        launch!(self, s, power_forward, self.grid(n), [in x, out y, &ni, &power, &scale, &shift])
    }

    /// `dx (+)= dy · power · scale · (shift + scale · x)^(power − 1)` over `(n)`.
    #[allow(clippy::too_many_arguments)]
    pub fn power_backward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        (power, scale, shift): (f32, f32, f32),
        accumulate: bool,
    ) -> Result<()> {
        let op = "power_backward";
        for (what, len) in [("x", x.len()), ("dy", dy.len()), ("dx", dx.len())] {
            check_len(op, what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        let ni = to_i32(op, n);
        let acc = accumulate as i32;
        launch!(
            self, s, power_backward, self.grid(n),
            [in x, in dy, out dx, &ni, &power, &scale, &shift, &acc]
        )
    }

    /// `y = |x|` over `(n)`.
    pub fn abs_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        self.unary("abs_forward", &self.abs_forward, s, x, y, n)
    }

    /// `dx (+)= sign(x) · dy` over `(n)`, from the bottom's data `x`.
    pub fn abs_backward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.unary_backward(
            "abs_backward",
            &self.abs_backward,
            s,
            x,
            dy,
            dx,
            n,
            accumulate,
        )
    }
}
