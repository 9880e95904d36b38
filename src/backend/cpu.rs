//! The CPU backend: row-major single-precision GEMM with BLAS semantics over the `gemm` crate,
//! and the few vector kernels the solver and the layers share.

use gemm::{gemm, Parallelism};

/// Smallest GEMM (in multiply-adds) worth splitting over several threads.
const PARALLEL_MIN_MACS: usize = 1 << 20;

/// CPU kernels. `threads` is the parallelism of one GEMM; 1 when several replicas share the cores.
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    pub threads: usize,
}

impl Default for Cpu {
    fn default() -> Self {
        Cpu { threads: 1 }
    }
}

impl Cpu {
    pub fn new(threads: usize) -> Self {
        Cpu {
            threads: threads.max(1),
        }
    }

    /// `c = alpha · op(a) · op(b) + beta · c`, all row-major; `op(a)` is `(m, k)`, `op(b)` is `(k, n)`,
    /// `c` is `(m, n)`. With `trans_a`, `a` is stored `(k, m)`; with `trans_b`, `b` is stored `(n, k)`.
    /// `beta = 0` ignores the old contents of `c` (NaN included).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &[f32],
        b: &[f32],
        beta: f32,
        c: &mut [f32],
    ) {
        assert!(a.len() >= m * k, "gemm: a has {} < {}·{}", a.len(), m, k);
        assert!(b.len() >= k * n, "gemm: b has {} < {}·{}", b.len(), k, n);
        assert!(c.len() >= m * n, "gemm: c has {} < {}·{}", c.len(), m, n);
        if m == 0 || n == 0 {
            return;
        }
        if k == 0 {
            self.scale(beta, &mut c[..m * n]);
            return;
        }
        // Row-major strides: element (i, j) of a matrix stored (rows, cols) sits at i·cols + j.
        let (a_rs, a_cs) = if trans_a {
            (1, m as isize)
        } else {
            (k as isize, 1)
        };
        let (b_rs, b_cs) = if trans_b {
            (1, k as isize)
        } else {
            (n as isize, 1)
        };
        // Below about a million multiply-adds, waking other threads costs more than it saves.
        let par = if self.threads > 1 && m * n * k >= PARALLEL_MIN_MACS {
            Parallelism::Rayon(self.threads)
        } else {
            Parallelism::None
        };
        // The gemm crate computes dst = alpha·dst + beta·lhs·rhs (names swapped against BLAS).
        // SAFETY: the asserts above bound every index the strides reach.
        unsafe {
            gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                beta != 0.0,
                a.as_ptr(),
                a_cs,
                a_rs,
                b.as_ptr(),
                b_cs,
                b_rs,
                beta,
                alpha,
                false,
                false,
                false,
                par,
            );
        }
    }

    /// `y += alpha · x`.
    pub fn axpy(&self, alpha: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy: length mismatch");
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi += alpha * xi;
        }
    }

    /// `x *= alpha`; `alpha = 0` writes zeros.
    pub fn scale(&self, alpha: f32, x: &mut [f32]) {
        if alpha == 0.0 {
            x.fill(0.0);
        } else {
            x.iter_mut().for_each(|v| *v *= alpha);
        }
    }

    /// Σ x², accumulated in f64.
    pub fn sumsq(&self, x: &[f32]) -> f64 {
        x.iter().map(|&v| (v as f64) * (v as f64)).sum()
    }
}
