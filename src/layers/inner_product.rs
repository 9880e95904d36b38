//! `InnerProduct`: the fully connected layer, `top = bottom · Wᵀ + b`.
//!
//! Shapes: the bottom `(d0, ..., d_{axis-1}, d_axis, ...)` is viewed as `(M, K)` with
//! `M = d0 ⋯ d_{axis-1}` and `K = d_axis ⋯` (`axis` defaults to 1, so `(N, C, H, W)` becomes
//! `(N, C·H·W)`); the top is `(d0, ..., d_{axis-1}, num_output)`.
//!
//! Learnable tensors, in order: `weight` `(num_output, K)` — PyTorch's `[out, in]` layout, as in
//! Caffe — filled by `weight_filler` (default xavier), and `bias` `(num_output)` when `bias_term`
//! (default true), filled by `bias_filler` (default constant 0). `K` is fixed by the first reshape.

use crate::config::layer_params::InnerProductParams;
use crate::error::{Error, Result};
use crate::layers::{one_bottom, weight_and_bias, BackwardPass, CpuLayer, ForwardPass, Layer};
use crate::params::ParamSpec;

cpu_layer! {
    /// The fully connected layer; see the module docs.
    pub type InnerProduct = CpuLayer<InnerProductParams, Rows>;
}

/// The current bottom viewed as `(M, K)` rows of features.
#[derive(Debug, Clone, Default)]
pub struct Rows {
    /// Input features per row, fixed by the first reshape.
    k: Option<usize>,
    /// Rows of the current bottom.
    m: usize,
    /// `(M)` ones: the bias is added as `ones · bᵀ` and its gradient is `top_diffᵀ · ones`.
    ones: Vec<f32>,
}

impl InnerProduct {
    /// `(M, N, K)`: rows, outputs and input features.
    fn dims(&self) -> (usize, usize, usize) {
        (
            self.state.m,
            self.settings.num_output,
            self.state.k.unwrap_or(0),
        )
    }
}

impl Layer for InnerProduct {
    fn type_name(&self) -> &'static str {
        "inner_product"
    }

    /// One bottom `(d0, ...)` of more than `axis` axes; top `(d0, ..., d_{axis-1}, num_output)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        let axis = self.settings.axis;
        let err = |msg: String| Err(Error::net(&self.name, msg));
        if axis >= shape.len() {
            return err(format!("`axis` {axis} out of range for bottom {shape:?}"));
        }
        let m: usize = shape[..axis].iter().product();
        let k: usize = shape[axis..].iter().product();
        match self.state.k {
            Some(k0) if k0 != k => {
                return err(format!(
                    "bottom {shape:?} has {k} features from axis {axis}, the weight expects {k0}"
                ))
            }
            _ => self.state.k = Some(k),
        }
        self.state.m = m;
        self.state.ones = vec![1.0; m];
        let mut top = shape[..axis].to_vec();
        top.push(self.settings.num_output);
        Ok(vec![top])
    }

    /// `weight` `(num_output, K)`, then `bias` `(num_output)` if `bias_term`.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let s = &self.settings;
        weight_and_bias(
            vec![s.num_output, self.state.k.unwrap_or(0)],
            &s.weight_filler,
            s.bias_term.then_some(&s.bias_filler),
        )
    }

    /// `top (M, N) = bottom (M, K) · Wᵀ (K, N) + ones (M, 1) · b (1, N)`.
    fn forward(&mut self, pass: ForwardPass<'_>) {
        let (m, n, k) = self.dims();
        let (cpu, params) = (pass.ctx.cpu, pass.params);
        let top = &mut pass.tops[0].data;
        let bottom = &pass.bottoms[0].data;
        cpu.gemm(false, true, m, n, k, 1.0, bottom, params[0], 0.0, top);
        if self.settings.bias_term {
            cpu.gemm(
                false,
                false,
                m,
                n,
                1,
                1.0,
                &self.state.ones,
                params[1],
                1.0,
                top,
            );
        }
    }

    /// `dW (N, K) += top_diffᵀ · bottom`, `db (N) += top_diffᵀ · ones`,
    /// `bottom_diff (M, K) += top_diff (M, N) · W (N, K)`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let (m, n, k) = self.dims();
        let (cpu, dy, param_diffs) = (pass.ctx.cpu, &pass.tops[0].diff, pass.param_diffs);
        let bottom = &mut pass.bottoms[0];
        cpu.gemm(
            true,
            false,
            n,
            k,
            m,
            1.0,
            dy,
            &bottom.data,
            1.0,
            param_diffs[0],
        );
        if self.settings.bias_term {
            cpu.gemm(
                true,
                false,
                n,
                1,
                m,
                1.0,
                dy,
                &self.state.ones,
                1.0,
                param_diffs[1],
            );
        }
        if pass.propagate_down[0] {
            cpu.gemm(
                false,
                false,
                m,
                k,
                n,
                1.0,
                dy,
                pass.params[0],
                1.0,
                &mut bottom.diff,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::config::{FillerKind, Phase};
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{self, blob, ctx, forward, forward_in, named, params_error};
    use crate::tensor::Blob;

    fn ip(keys: &str) -> InnerProduct {
        named::<InnerProductParams>("ip", "inner_product", keys)
    }

    #[test]
    fn forward_by_hand() {
        let mut layer = ip("num_output = 2");
        let bottom = blob(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let w = [1.0, 0.0, -1.0, 0.5, 0.5, 0.5];
        let b = [0.1, -0.2];
        let top = forward(&mut layer, &[bottom], &[&w, &b]);
        assert_eq!(top[0].shape, vec![2, 2]);
        let want = [-1.9, 2.8, -1.9, 7.3];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{:?} vs {want:?}", top[0].data);
        }
    }

    #[test]
    fn backward_by_hand() {
        // M = 1, K = 2, N = 2: top = (x·w0, x·w1) without bias.
        let mut layer = ip("num_output = 2\nbias_term = false");
        layer.reshape(&[&[1, 2]]).unwrap();
        let mut bottom = vec![Blob::new(&[1, 2])];
        bottom[0].data = vec![2.0, 3.0];
        bottom[0].diff = vec![10.0, 20.0];
        let mut top = Blob::new(&[1, 2]);
        top.diff = vec![1.0, -1.0];
        let w = [1.0, 2.0, 3.0, 4.0];
        let mut dw = [100.0; 4];
        test_util::backward(
            &mut layer,
            &[top],
            &[true],
            &mut bottom,
            &[&w],
            &mut [&mut dw],
        );
        // dW = top_diffᵀ·x = [[2, 3], [-2, -3]]; dx = top_diff·W = [1-3, 2-4].
        assert_eq!(dw, [102.0, 103.0, 98.0, 97.0]);
        assert_eq!(bottom[0].diff, vec![8.0, 18.0]);
    }

    #[test]
    fn params_and_default_fillers() {
        let mut layer = ip("num_output = 10");
        layer.reshape(&[&[4, 1, 28, 28]]).unwrap();
        let specs = layer.param_specs();
        assert_eq!(specs.len(), 2);
        assert_eq!(
            (specs[0].name.as_str(), &specs[0].shape),
            ("weight", &vec![10, 784])
        );
        assert_eq!(
            (specs[1].name.as_str(), &specs[1].shape),
            ("bias", &vec![10])
        );
        assert_eq!(specs[0].filler.kind, FillerKind::Xavier);
        assert_eq!(
            (specs[1].filler.kind, specs[1].filler.value),
            (FillerKind::Constant, 0.0)
        );
        let mut no_bias = ip("num_output = 10\nbias_term = false");
        no_bias.reshape(&[&[4, 784]]).unwrap();
        assert_eq!(no_bias.param_specs().len(), 1);
    }

    #[test]
    fn reshape_keeps_k_and_accepts_a_new_batch() {
        let mut layer = ip("num_output = 3");
        layer.reshape(&[&[4, 2, 5]]).unwrap();
        assert_eq!(layer.reshape(&[&[7, 10]]).unwrap(), vec![vec![7, 3]]);
        let err = layer.reshape(&[&[7, 11]]).unwrap_err().to_string();
        assert!(err.contains("ip") && err.contains("expects 10"), "{err}");
        assert!(layer.reshape(&[&[7, 10], &[7]]).is_err());
    }

    #[test]
    fn new_rejects_a_missing_num_output() {
        let err = params_error("inner_product", "");
        assert!(
            err.contains("`inner_product`") && err.contains("num_output"),
            "{err}"
        );
    }

    #[test]
    fn gradient_with_bias() {
        let bottom = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 11);
        GradientChecker::default().assert_passes(&mut ip("num_output = 5"), &[bottom], &[true]);
    }

    #[test]
    fn gradient_without_bias() {
        let bottom = uniform_blob(&[3, 6], -1.0, 1.0, 12);
        let mut layer = ip("num_output = 4\nbias_term = false");
        let report = GradientChecker::default().assert_passes(&mut layer, &[bottom], &[true]);
        assert_eq!(report.checked, 3 * 6 + 4 * 6);
    }

    #[test]
    fn gradient_with_axis_2() {
        // (2, 3, 4) from axis 2: M = 6, K = 4, top (2, 3, 5).
        let mut layer = ip("num_output = 5\naxis = 2");
        assert_eq!(layer.reshape(&[&[2, 3, 4]]).unwrap(), vec![vec![2, 3, 5]]);
        let bottom = uniform_blob(&[2, 3, 4], -1.0, 1.0, 13);
        let report = GradientChecker::default().assert_passes(&mut layer, &[bottom], &[true]);
        assert_eq!(report.checked, 24 + 5 * 4 + 5);
    }

    #[test]
    fn gemm_threads_do_not_change_the_result() {
        let mut layer = ip("num_output = 16");
        layer.reshape(&[&[32, 64]]).unwrap();
        let bottom = uniform_blob(&[32, 64], -1.0, 1.0, 14);
        let w = uniform_blob(&[16, 64], -1.0, 1.0, 15).data;
        let b = uniform_blob(&[16], -1.0, 1.0, 16).data;
        let run = |threads| {
            let cpu = Cpu::new(threads);
            let bottoms = std::slice::from_ref(&bottom);
            let ctx = ctx(&cpu, Phase::Train);
            forward_in(&ctx, &mut layer.clone(), bottoms, &[&w, &b])
                .remove(0)
                .data
        };
        let (one, four) = (run(1), run(4));
        for (a, b) in one.iter().zip(&four) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
