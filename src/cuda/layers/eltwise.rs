//! `GpuEltwise`: elementwise combination of ≥ 2 bottoms of one shape, the device twin of
//! `crate::layers::eltwise`.
//!
//! SUM: `y = Σ coeff_k · x_k` (coefficients default 1), backward `dx_k (+)= coeff_k · dy`.
//! PROD: `y = Π x_k`, backward `dx_k (+)= dy · Π_{j≠k} x_j` (the product of the others, not
//! `dy · y / x_k`, so a zero input is no problem). MAX: `y = max_k x_k` with the index of the
//! first maximum kept per element; backward routes `dy` to that bottom only.

use super::{grow, pick, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::EltwiseParams;
use crate::config::EltwiseOp;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;

/// Elementwise SUM, PROD or MAX; see the module docs.
#[derive(Debug)]
pub struct GpuEltwise {
    name: String,
    op: EltwiseOp,
    coeff: Option<Vec<f32>>,
    /// `(capacity ≥ count)` the argmax bottom per element (MAX).
    mask: CudaSlice<i32>,
    /// `(capacity ≥ count)` the product of the other bottoms (PROD backward).
    product: CudaSlice<f32>,
}

impl GpuEltwise {
    fn coeff(&self, k: usize) -> f32 {
        self.coeff
            .as_ref()
            .and_then(|c| c.get(k))
            .copied()
            .unwrap_or(1.0)
    }
}

impl BuildGpu for EltwiseParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuEltwise {
            name: name.to_string(),
            op: self.operation,
            coeff: self.coeff.clone(),
            mask: scratch(gpu, 1)?,
            product: scratch(gpu, 1)?,
        }))
    }
}

impl GpuLayer for GpuEltwise {
    fn type_name(&self) -> &'static str {
        "eltwise"
    }

    /// At least 2 bottoms of one shape.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        if bottoms.len() < 2 || bottoms.iter().any(|b| *b != bottoms[0]) {
            return Err(Error::net(
                &self.name,
                format!("takes at least 2 bottoms of one shape, got {bottoms:?}"),
            ));
        }
        if let Some(c) = &self.coeff {
            if c.len() != bottoms.len() {
                return Err(Error::net(
                    &self.name,
                    format!(
                        "`coeff` has {} values for {} bottoms",
                        c.len(),
                        bottoms.len()
                    ),
                ));
            }
        }
        let count: usize = bottoms[0].iter().product();
        match self.op {
            EltwiseOp::Max => grow(gpu, &mut self.mask, count)?,
            EltwiseOp::Prod => grow(gpu, &mut self.product, count)?,
            EltwiseOp::Sum => {}
        }
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        let (bottoms, top) = (pass.blobs.bottoms, pass.blobs.tops[0]);
        for (i, &b) in bottoms.iter().enumerate() {
            let [x, y] = pass.blobs.pick([b, top]);
            let n = x.count();
            let (xd, mut yd) = (x.data(), y.data_mut());
            match self.op {
                EltwiseOp::Sum if i == 0 => {
                    k.scaled_copy(s, &xd, &mut yd, self.coeff(0), n, false)?
                }
                EltwiseOp::Sum => k.axpy(s, self.coeff(i), &xd, &mut yd, n)?,
                EltwiseOp::Prod if i == 0 => k.scaled_copy(s, &xd, &mut yd, 1.0, n, false)?,
                EltwiseOp::Prod => k.mul_inplace(s, &mut yd, &xd, n)?,
                EltwiseOp::Max => k.eltwise_max_step(s, &xd, &mut yd, &mut self.mask, i, n)?,
            }
        }
        Ok(())
    }

    fn backward(&mut self, pass: BackwardPass<'_>) -> Result<()> {
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        let (grads, blobs) = (pass.grads, pass.blobs);
        let (bottoms, top) = (blobs.bottoms, blobs.tops[0]);
        let blobs = blobs.all;
        for (i, &b) in bottoms.iter().enumerate() {
            if !grads[i].wanted() {
                continue;
            }
            let acc = grads[i].accumulate();
            match self.op {
                EltwiseOp::Sum => {
                    let [x, y] = pick(blobs, [b, top]);
                    let n = x.count();
                    k.scaled_copy(s, &y.diff(), &mut x.diff_mut(), self.coeff(i), n, acc)?;
                }
                EltwiseOp::Max => {
                    let [x, y] = pick(blobs, [b, top]);
                    let n = x.count();
                    k.eltwise_max_backward(s, &y.diff(), &self.mask, &mut x.diff_mut(), i, n, acc)?;
                }
                EltwiseOp::Prod => {
                    let n = blobs[b].count();
                    k.scaled_copy(s, &blobs[top].diff(), &mut self.product, 1.0, n, false)?;
                    for &other in bottoms.iter().filter(|&&o| o != b) {
                        k.mul_inplace(s, &mut self.product, &blobs[other].data(), n)?;
                    }
                    k.scaled_copy(s, &self.product, &mut blobs[b].diff_mut(), 1.0, n, acc)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    fn case(extra: &str, bottoms: usize) -> LayerCase {
        LayerCase::new(
            &format!("name = \"e\"\ntype = \"eltwise\"\n{extra}"),
            vec![vec![2, 3, 4, 5]; bottoms],
        )
    }

    #[test]
    fn sum_with_coefficients_matches_cpu() {
        let gpu = gpu_or_skip!("sum_with_coefficients_matches_cpu");
        check_against_cpu(&gpu, &case("coeff = [0.5, -2.0, 1.5]", 3), 701);
    }

    #[test]
    fn prod_matches_cpu() {
        let gpu = gpu_or_skip!("prod_matches_cpu");
        check_against_cpu(&gpu, &case("operation = \"prod\"", 3), 702);
    }

    #[test]
    fn max_matches_cpu() {
        let gpu = gpu_or_skip!("max_matches_cpu");
        check_against_cpu(&gpu, &case("operation = \"max\"", 3), 703);
    }
}
