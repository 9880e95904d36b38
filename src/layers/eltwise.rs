//! `Eltwise`: Caffe's element-wise combination of two or more bottoms of equal shape `(N, …)`.
//!
//! - `sum` (default): `top = Σ_b coeff_b · bottom_b` (`coeff` default all 1); `dbottom_b += coeff_b · dtop`.
//! - `prod`: `top = Π_b bottom_b`; `dbottom_b += dtop · Π_{c≠b} bottom_c` (computed without division).
//! - `max`: `top = max_b bottom_b`; the first bottom holding the maximum gets the whole gradient.

use crate::config::layer_params::EltwiseParams;
use crate::config::EltwiseOp;
use crate::error::{Error, Result};
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The element-wise layer; see the module docs. Its state (max): per top element, the index of
    /// the winning bottom.
    pub type Eltwise = CpuLayer<EltwiseParams, Vec<u32>>;
}

impl Eltwise {
    /// The coefficient of bottom `b` in a sum.
    fn coeff(&self, b: usize) -> f32 {
        self.settings.coeff.as_ref().map_or(1.0, |c| c[b])
    }
}

impl Layer for Eltwise {
    fn type_name(&self) -> &'static str {
        "eltwise"
    }

    /// Two or more bottoms of one shape; top of that shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let err = |msg: String| Err(Error::net(&self.name, msg));
        if bottoms.len() < 2 {
            return err(format!("takes 2 or more bottoms, got {}", bottoms.len()));
        }
        if let Some(b) = bottoms.iter().find(|b| **b != bottoms[0]) {
            return err(format!(
                "bottoms must have one shape, got {:?} and {b:?}",
                bottoms[0]
            ));
        }
        if let Some(c) = &self.settings.coeff {
            if c.len() != bottoms.len() {
                return err(format!(
                    "`coeff` has {} values for {} bottoms",
                    c.len(),
                    bottoms.len()
                ));
            }
        }
        Ok(vec![bottoms[0].to_vec()])
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let (bottoms, y) = (pass.bottoms, &mut pass.tops[0].data);
        match self.settings.operation {
            EltwiseOp::Sum => {
                y.fill(0.0);
                for (b, bottom) in bottoms.iter().enumerate() {
                    let c = self.coeff(b);
                    for (v, &x) in y.iter_mut().zip(&bottom.data) {
                        *v += c * x;
                    }
                }
            }
            EltwiseOp::Prod => {
                y.copy_from_slice(&bottoms[0].data);
                for bottom in &bottoms[1..] {
                    for (v, &x) in y.iter_mut().zip(&bottom.data) {
                        *v *= x;
                    }
                }
            }
            EltwiseOp::Max => {
                self.state.clear();
                self.state.resize(y.len(), 0);
                y.copy_from_slice(&bottoms[0].data);
                for (b, bottom) in bottoms.iter().enumerate().skip(1) {
                    for ((v, a), &x) in y.iter_mut().zip(&mut self.state).zip(&bottom.data) {
                        if x > *v {
                            *v = x;
                            *a = b as u32;
                        }
                    }
                }
            }
        }
    }

    fn backward(&mut self, pass: BackwardPass<'_>) {
        let (dy, propagate_down, bottoms) = (&pass.tops[0].diff, pass.propagate_down, pass.bottoms);
        for b in 0..bottoms.len() {
            if !propagate_down[b] {
                continue;
            }
            match self.settings.operation {
                EltwiseOp::Sum => {
                    let c = self.coeff(b);
                    for (d, &g) in bottoms[b].diff.iter_mut().zip(dy) {
                        *d += c * g;
                    }
                }
                EltwiseOp::Prod => {
                    for (i, &g) in dy.iter().enumerate() {
                        let others: f32 = (0..bottoms.len())
                            .filter(|&c| c != b)
                            .map(|c| bottoms[c].data[i])
                            .product();
                        bottoms[b].diff[i] += g * others;
                    }
                }
                EltwiseOp::Max => {
                    for ((d, &g), &a) in bottoms[b].diff.iter_mut().zip(dy).zip(&self.state) {
                        if a as usize == b {
                            *d += g;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer};
    use crate::tensor::Blob;

    fn eltwise(keys: &str) -> Eltwise {
        layer::<EltwiseParams>("eltwise", keys)
    }

    /// The default gradient check of `eltwise(keys)` on three random bottoms.
    fn gradient(keys: &str, seed: u64, propagate: [bool; 3]) {
        let bottoms: Vec<Blob> = (0..3)
            .map(|i| uniform_blob(&[2, 3, 2], -1.0, 1.0, seed + i))
            .collect();
        GradientChecker::default().assert_passes(&mut eltwise(keys), &bottoms, &propagate);
    }

    #[test]
    fn forward_by_hand() {
        let a = blob(&[1, 3], &[1.0, -2.0, 3.0]);
        let b = blob(&[1, 3], &[2.0, 5.0, -1.0]);
        let both = [a, b];
        let sum = forward(&mut eltwise("coeff = [1.0, -0.5]"), &both, &[]);
        assert_eq!(sum[0].data, vec![0.0, -4.5, 3.5]);
        let prod = forward(&mut eltwise("operation = \"prod\""), &both, &[]);
        assert_eq!(prod[0].data, vec![2.0, -10.0, -3.0]);
        let max = forward(&mut eltwise("operation = \"max\""), &both, &[]);
        assert_eq!(max[0].data, vec![2.0, 5.0, 3.0]);
    }

    #[test]
    fn gradient_sum_with_coeff() {
        gradient("coeff = [1.0, -2.0, 0.5]", 71, [true; 3]);
    }

    #[test]
    fn gradient_prod() {
        gradient("operation = \"prod\"", 72, [true; 3]);
    }

    #[test]
    fn gradient_max_with_one_bottom_not_propagated() {
        // Uniform random inputs: ties closer than the step are improbable at this size and
        // the seed is fixed.
        gradient("operation = \"max\"", 73, [true, false, true]);
    }

    #[test]
    fn rejects_bad_bottoms() {
        assert!(eltwise("").reshape(&[&[1, 2]]).is_err());
        assert!(eltwise("").reshape(&[&[1, 2], &[1, 3]]).is_err());
        assert!(eltwise("coeff = [1.0]")
            .reshape(&[&[1, 2], &[1, 2]])
            .is_err());
    }
}
