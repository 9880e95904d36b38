//! `GpuInnerProduct`: the fully connected layer on cuBLAS, `top = bottom · Wᵀ + b`, the device
//! twin of `crate::layers::inner_product`.
//!
//! Shapes: the bottom is viewed as `(M, K)` (axes before `axis` make `M`, the rest `K`); the top
//! is `(M, N)` with `N = num_output`. Learnable tensors, in order: `weight (N, K)` and, when
//! `bias_term`, `bias (N)`.
//!
//! Forward: one SGEMM `top = bottom · Wᵀ` (β = 0), then a broadcast add of `b` over the rows.
//! Backward: `dW (N, K) += top_diffᵀ · bottom` (SGEMM, β = 1), `db (N) += top_diffᵀ · ones (M)`
//! (SGEMV against a ones vector, deterministic), `bottom_diff (M, K) (+)= top_diff · W` (SGEMM,
//! β = 1 to accumulate, 0 to overwrite).
//!
//! In mixed precision, where the pass carries [`HalfOperands`], the three products run as
//! `cublasGemmEx` on half-type operands with FP32 accumulation and FP32 outputs: the weight comes
//! as the net's half copy, the bottom and the top's diff (which hold half-type values) are
//! converted into the layer's own `(M, K)` and `(M, N)` scratch, exactly. The bias and its
//! gradient stay FP32. A layer asks for them only where its products pay for the conversions
//! ([`half_operands_pay`]); elsewhere its GEMMs stay on TF32 tensor cores, whose operands hold
//! the half-type values exactly: the same products, accumulated in FP32.

use super::{one_bottom_with_axis, BackwardPass, BuildGpu, ForwardPass, GpuLayer, HalfOperands};
use crate::config::layer_params::InnerProductParams;
use crate::cuda::layout::Layout;
use crate::cuda::{gpu_error, Gpu};
use crate::error::{Error, Result};
use crate::precision::Half;
use cudarc::driver::CudaSlice;

/// Products per converted value from which an inner product takes half-type operands in mixed
/// precision (see [`half_operands_pay`]).
pub const HALF_OPERANDS_MIN_PRODUCTS: usize = 256;

/// Whether half-type operands pay for a `(K) → (N)` inner product: they halve its three GEMMs'
/// time, but each row's `K` bottom values and `N` top-diff values are converted first, for `K·N`
/// products a row, so they pay where `K·N / (K + N)` reaches `min_products`. Measured on one
/// H200 at 512 rows (forward / backward, ms): cifar10_quick's ip1 (1024 → 64, 60 products a
/// value) 0.022 / 0.039 on half operands against 0.015 / 0.020 on TF32; mlp4096's ip2 (4096 →
/// 4096, 2,048) 0.047 / 0.097 against 0.056 / 0.161.
pub fn half_operands_pay(k: usize, n: usize, min_products: usize) -> bool {
    k * n >= min_products * (k + n)
}

/// The fully connected layer; see the module docs.
#[derive(Debug)]
pub struct GpuInnerProduct {
    name: String,
    num_output: usize,
    bias_term: bool,
    axis: usize,
    /// Input features per row, fixed by the first reshape.
    k: Option<usize>,
    /// Rows of the current bottom.
    m: usize,
    /// `(capacity ≥ M)` ones for the bias gradient.
    ones: CudaSlice<f32>,
    /// Mixed precision's half-type copies of the bottom `(M, K)` and of the top's diff `(M, N)`,
    /// allocated by the first pass that needs them.
    half_bottom: Option<CudaSlice<u16>>,
    half_top_diff: Option<CudaSlice<u16>>,
    /// [`Gpu::half_operands_min_products`] of the device the layer was built for.
    half_min_products: usize,
}

/// `x[..n]` as half-type bit patterns in `scratch`, grown to hold them.
fn to_half<'s>(
    gpu: &Gpu,
    half: &HalfOperands<'_>,
    x: &CudaSlice<f32>,
    n: usize,
    scratch: &'s mut Option<CudaSlice<u16>>,
) -> Result<&'s CudaSlice<u16>> {
    if scratch.as_ref().is_none_or(|s| s.len() < n) {
        let grown = gpu
            .compute
            .alloc_zeros::<u16>(n.max(1))
            .map_err(|e| gpu_error("allocate a half-type operand", e))?;
        *scratch = Some(grown);
    }
    let to = scratch.as_mut().expect("allocated above");
    let fp16 = half.half == Half::Fp16;
    gpu.kernels.to_half(&gpu.compute, x, to, fp16, n)?;
    Ok(to)
}

/// `(n)` ones on the device.
fn ones(gpu: &Gpu, n: usize) -> Result<CudaSlice<f32>> {
    let mut v = gpu
        .compute
        .alloc_zeros::<f32>(n.max(1))
        .map_err(|e| gpu_error("allocate a ones vector", e))?;
    let len = v.len();
    gpu.kernels.fill(&gpu.compute, &mut v, 1.0, len)?;
    Ok(v)
}

impl BuildGpu for InnerProductParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuInnerProduct {
            name: name.to_string(),
            num_output: self.num_output,
            bias_term: self.bias_term,
            axis: self.axis,
            k: None,
            m: 0,
            ones: ones(gpu, 1)?,
            half_bottom: None,
            half_top_diff: None,
            half_min_products: gpu.half_operands_min_products,
        }))
    }
}

impl GpuLayer for GpuInnerProduct {
    fn type_name(&self) -> &'static str {
        "inner_product"
    }

    fn takes_half_operands(&self) -> bool {
        let k = self.k.unwrap_or(0);
        half_operands_pay(k, self.num_output, self.half_min_products)
    }

    /// One bottom of more than `axis` axes whose trailing axes hold the `K` of the first call.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom_with_axis(&self.name, bottoms, self.axis)?;
        let m: usize = shape[..self.axis].iter().product();
        let k: usize = shape[self.axis..].iter().product();
        match self.k {
            Some(k0) if k0 != k => {
                return Err(Error::net(
                    &self.name,
                    format!("bottom {shape:?} has {k} features, the weight expects {k0}"),
                ))
            }
            _ => self.k = Some(k),
        }
        self.m = m;
        if self.ones.len() < m {
            self.ones = ones(gpu, m)?;
        }
        Ok(())
    }

    /// `top (M, N) = bottom (M, K) · Wᵀ (K, N) + ones (M, 1) · b (1, N)`.
    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, params) = (pass.gpu, &pass.params);
        let (m, n, k) = (self.m, self.num_output, self.k.unwrap_or(0));
        let [x, y] = pass.blobs.bottom_top();
        let mut top = y.data_mut();
        match &pass.half {
            Some(h) => {
                let x = to_half(gpu, h, &x.data, m * k, &mut self.half_bottom)?;
                let w = h.params.slice(..n * k);
                gpu.gemm_half(h.half, (false, true), (m, n, k), 1.0, x, &w, 0.0, &mut top)?;
            }
            None => {
                let w = params.slice(..n * k);
                gpu.gemm((false, true), (m, n, k), 1.0, &x.data(), &w, 0.0, &mut top)?;
            }
        }
        if self.bias_term {
            let b = params.slice(n * k..n * k + n);
            gpu.kernels.bias_add(&gpu.compute, &mut top, &b, m, n)?;
        }
        Ok(())
    }

    /// `dW (N, K) (+)= top_diffᵀ · bottom`, `db (N) (+)= top_diffᵀ · ones`,
    /// `bottom_diff (M, K) (+)= top_diff (M, N) · W (N, K)`.
    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad, param_diff) = (pass.gpu, pass.grads[0], &mut pass.param_diff);
        let (m, n, k) = (self.m, self.num_output, self.k.unwrap_or(0));
        let [x, y] = pass.blobs.bottom_top();
        let top_diff = y.diff();
        let beta = pass.param_grad.beta();
        let dw = &mut param_diff.slice_mut(..n * k);
        let half_top_diff = match &pass.half {
            Some(h) => {
                let dy = to_half(gpu, h, &y.diff, m * n, &mut self.half_top_diff)?;
                let x = to_half(gpu, h, &x.data, m * k, &mut self.half_bottom)?;
                gpu.gemm_half(h.half, (true, false), (n, k, m), 1.0, dy, x, beta, dw)?;
                Some((h, dy))
            }
            None => {
                gpu.gemm(
                    (true, false),
                    (n, k, m),
                    1.0,
                    &top_diff,
                    &x.data(),
                    beta,
                    dw,
                )?;
                None
            }
        };
        if self.bias_term {
            gpu.gemv_t(
                m,
                n,
                1.0,
                &top_diff,
                &self.ones,
                beta,
                &mut param_diff.slice_mut(n * k..n * k + n),
            )?;
        }
        if grad.wanted() {
            let dx = &mut x.diff_mut();
            let (dims, beta) = ((m, k, n), grad.beta());
            match half_top_diff {
                Some((h, dy)) => {
                    let w = h.params.slice(..n * k);
                    gpu.gemm_half(h.half, (false, false), dims, 1.0, dy, &w, beta, dx)?;
                }
                None => {
                    let w = pass.params.slice(..n * k);
                    gpu.gemm((false, false), dims, 1.0, &top_diff, &w, beta, dx)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{half_operands_pay, HALF_OPERANDS_MIN_PRODUCTS};
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    /// Runs without a GPU: the measured shapes fall on either side of the rule, and 0 takes half
    /// operands everywhere.
    #[test]
    fn half_operands_pay_for_wide_layers_only() {
        let min = HALF_OPERANDS_MIN_PRODUCTS;
        assert!(half_operands_pay(4096, 4096, min), "mlp4096's ip2");
        assert!(
            half_operands_pay(784, 4096, min),
            "mlp4096's ip1: 658 a value"
        );
        assert!(
            half_operands_pay(2048, 1000, min),
            "ResNet-50's fc1000: 672"
        );
        assert!(!half_operands_pay(1024, 64, min), "cifar10_quick's ip1: 60");
        assert!(!half_operands_pay(64, 10, min), "cifar10_quick's ip2");
        assert!(!half_operands_pay(4096, 10, min), "mlp4096's ip4: 10");
        assert!(half_operands_pay(3, 2, 0) && half_operands_pay(0, 0, 0));
    }

    fn case(extra: &str, bottom: &[usize]) -> LayerCase {
        LayerCase::new(
            &format!("name = \"ip\"\ntype = \"inner_product\"\n{extra}"),
            vec![bottom.to_vec()],
        )
    }

    #[test]
    fn matches_cpu_with_bias() {
        let gpu = gpu_or_skip!("matches_cpu_with_bias");
        check_against_cpu(&gpu, &case("num_output = 7", &[5, 3, 2, 2]), 101);
    }

    #[test]
    fn matches_cpu_without_bias() {
        let gpu = gpu_or_skip!("matches_cpu_without_bias");
        check_against_cpu(
            &gpu,
            &case("num_output = 4\nbias_term = false", &[3, 6]),
            102,
        );
    }

    #[test]
    fn matches_cpu_with_axis_2() {
        let gpu = gpu_or_skip!("matches_cpu_with_axis_2");
        check_against_cpu(&gpu, &case("num_output = 5\naxis = 2", &[2, 3, 4]), 103);
    }

    #[test]
    fn matches_cpu_at_mlp_size() {
        let gpu = gpu_or_skip!("matches_cpu_at_mlp_size");
        check_against_cpu(&gpu, &case("num_output = 256", &[64, 784]), 104);
    }
}
