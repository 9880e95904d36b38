//! Launchers of the im2col kernels (`im2col.cu`) and the convolution geometry every
//! convolution kernel takes ([`ConvGeom`]). Weight gradient by GEMM:
//! [`Kernels::im2col_batch`] lays a batch out as one matrix and [`Kernels::swap_outer`] brings
//! the top's gradient into the matching order, so that
//! `dW (K, C·kh·kw) = swap(dy) (K, N·OH·OW) · colᵀ` is one cuBLAS GEMM. The convolution's
//! other kernels: `convolution_implicit_gemm` (the same product without the column matrix) and
//! `convolution_direct` (the forward from shared memory).

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};

/// A convolution's geometry as the kernels' `ConvGeom` (passed by value): input `(n, c, h, w)`,
/// kernel `kh × kw`, padding, stride and dilation per axis, output `oh × ow`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConvGeom {
    pub n: i32,
    pub c: i32,
    pub h: i32,
    pub w: i32,
    pub kh: i32,
    pub kw: i32,
    pub ph: i32,
    pub pw: i32,
    pub sh: i32,
    pub sw: i32,
    pub dh: i32,
    pub dw: i32,
    pub oh: i32,
    pub ow: i32,
}

// SAFETY: `#[repr(C)]` of fourteen i32, the layout of the C struct of the same fields.
unsafe impl DeviceRepr for ConvGeom {}

impl ConvGeom {
    /// Rows of the column matrix and columns of the weight as a matrix: `C·kh·kw`.
    pub(super) fn filter_rows(&self) -> usize {
        [self.c, self.kh, self.kw]
            .iter()
            .map(|&v| v as usize)
            .product()
    }

    /// Columns of the column matrix: `N·OH·OW`.
    pub(super) fn positions(&self) -> usize {
        [self.n, self.oh, self.ow]
            .iter()
            .map(|&v| v as usize)
            .product()
    }

    /// Elements of the column matrix: `(C·kh·kw, N·OH·OW)`; `None` beyond the kernels' int range.
    pub fn col_len(&self) -> Option<usize> {
        self.filter_rows()
            .checked_mul(self.positions())
            .filter(|&len| i32::try_from(len).is_ok())
    }

    /// [`ConvGeom::col_len`], panicking (naming `op`) beyond the kernels' int range.
    fn checked_col_len(&self, op: &str) -> usize {
        self.col_len()
            .unwrap_or_else(|| panic!("{op}: the column matrix exceeds the int range"))
    }

    /// Elements of the top `(n, k, oh, ow)` for `k` outputs.
    pub(super) fn output_len(&self, k: usize) -> usize {
        self.positions() * k
    }

    pub(super) fn input_len(&self) -> usize {
        [self.n, self.c, self.h, self.w]
            .iter()
            .map(|&v| v as usize)
            .product()
    }
}

launchers! {
    /// `col (C·kh·kw, N, OH·OW)` of the batch `x (N, C, H, W)`; see im2col.cu.
    ///
    /// # Panics
    /// If the column matrix exceeds the kernels' int range ([`ConvGeom::col_len`]) or a buffer
    /// is too short.
    pub fn im2col_batch(x: in f32 [geom.input_len()], geom: ConvGeom, col: out f32)
        over [geom.checked_col_len(OP)]
        => launch im2col_batch(in x, out col, &geom);

    /// `y (b, a, p) = x (a, b, p)`.
    pub fn swap_outer(x: in f32, y: out f32, (a, b, p): elements as i32)
        => launch swap_outer(in x, out y, &a, &b, &p);
}

/// A square convolution geometry for the tests of the convolution kernels' launchers.
#[cfg(test)]
pub(super) fn geom(n: i32, c: i32, hw: i32, kernel: i32, pad: i32) -> ConvGeom {
    let out = hw + 2 * pad - kernel + 1;
    ConvGeom {
        n,
        c,
        h: hw,
        w: hw,
        kh: kernel,
        kw: kernel,
        ph: pad,
        pw: pad,
        sh: 1,
        sw: 1,
        dh: 1,
        dw: 1,
        oh: out,
        ow: out,
    }
}
