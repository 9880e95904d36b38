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
use crate::config::FillerConfig;
use crate::error::{Error, Result};
use crate::layers::{one_bottom, Ctx, Layer};
use crate::params::ParamSpec;
use crate::tensor::Blob;

/// The fully connected layer; see the module docs.
#[derive(Debug, Clone)]
pub struct InnerProduct {
    name: String,
    num_output: usize,
    bias_term: bool,
    axis: usize,
    weight_filler: FillerConfig,
    bias_filler: FillerConfig,
    /// Input features per row, fixed by the first reshape.
    k: Option<usize>,
    /// Rows of the current bottom.
    m: usize,
    /// `(M)` ones: the bias is added as `ones · bᵀ` and its gradient is `top_diffᵀ · ones`.
    ones: Vec<f32>,
}

impl InnerProduct {
    /// The layer `name` with parameters `p`.
    pub fn new(name: &str, p: &InnerProductParams) -> Self {
        InnerProduct {
            name: name.to_string(),
            num_output: p.num_output,
            bias_term: p.bias_term,
            axis: p.axis,
            weight_filler: p.weight_filler.clone(),
            bias_filler: p.bias_filler.clone(),
            k: None,
            m: 0,
            ones: Vec::new(),
        }
    }
}

impl Layer for InnerProduct {
    fn type_name(&self) -> &'static str {
        "inner_product"
    }

    /// One bottom `(d0, ...)` of more than `axis` axes; top `(d0, ..., d_{axis-1}, num_output)`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        if self.axis >= shape.len() {
            return Err(Error::net(
                &self.name,
                format!("`axis` {} out of range for bottom {shape:?}", self.axis),
            ));
        }
        let m: usize = shape[..self.axis].iter().product();
        let k: usize = shape[self.axis..].iter().product();
        match self.k {
            Some(k0) if k0 != k => {
                return Err(Error::net(
                    &self.name,
                    format!(
                        "bottom {shape:?} has {k} features from axis {}, the weight expects {k0}",
                        self.axis
                    ),
                ))
            }
            _ => self.k = Some(k),
        }
        self.m = m;
        self.ones = vec![1.0; m];
        let mut top = shape[..self.axis].to_vec();
        top.push(self.num_output);
        Ok(vec![top])
    }

    /// `weight` `(num_output, K)`, then `bias` `(num_output)` if `bias_term`.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let mut specs = vec![ParamSpec {
            name: "weight".into(),
            shape: vec![self.num_output, self.k.unwrap_or(0)],
            filler: self.weight_filler.clone(),
        }];
        if self.bias_term {
            specs.push(ParamSpec {
                name: "bias".into(),
                shape: vec![self.num_output],
                filler: self.bias_filler.clone(),
            });
        }
        specs
    }

    /// `top (M, N) = bottom (M, K) · Wᵀ (K, N) + ones (M, 1) · b (1, N)`.
    fn forward(&mut self, ctx: &Ctx, bottoms: &[Blob], params: &[&[f32]], tops: &mut [Blob]) {
        let (m, n, k) = (self.m, self.num_output, self.k.unwrap_or(0));
        let top = &mut tops[0].data;
        ctx.cpu.gemm(
            false,
            true,
            m,
            n,
            k,
            1.0,
            &bottoms[0].data,
            params[0],
            0.0,
            top,
        );
        if self.bias_term {
            ctx.cpu
                .gemm(false, false, m, n, 1, 1.0, &self.ones, params[1], 1.0, top);
        }
    }

    /// `dW (N, K) += top_diffᵀ · bottom`, `db (N) += top_diffᵀ · ones`,
    /// `bottom_diff (M, K) += top_diff (M, N) · W (N, K)`.
    fn backward(
        &mut self,
        ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        params: &[&[f32]],
        param_diffs: &mut [&mut [f32]],
    ) {
        let (m, n, k) = (self.m, self.num_output, self.k.unwrap_or(0));
        let top_diff = &tops[0].diff;
        let bottom = &mut bottoms[0];
        ctx.cpu.gemm(
            true,
            false,
            n,
            k,
            m,
            1.0,
            top_diff,
            &bottom.data,
            1.0,
            param_diffs[0],
        );
        if self.bias_term {
            ctx.cpu.gemm(
                true,
                false,
                n,
                1,
                m,
                1.0,
                top_diff,
                &self.ones,
                1.0,
                param_diffs[1],
            );
        }
        if propagate_down[0] {
            ctx.cpu.gemm(
                false,
                false,
                m,
                k,
                n,
                1.0,
                top_diff,
                params[0],
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
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};
    use crate::layers::test_util::ctx;

    fn ip(extra: &str) -> InnerProduct {
        from_config(
            InnerProduct::new,
            &layer_config(&format!("name = \"ip\"\ntype = \"inner_product\"\n{extra}")),
        )
    }

    #[test]
    fn forward_by_hand() {
        let mut layer = ip("num_output = 2");
        let tops = layer.reshape(&[&[2, 3]]).unwrap();
        assert_eq!(tops, vec![vec![2, 2]]);
        let mut bottom = Blob::new(&[2, 3]);
        bottom.data = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let w = [1.0, 0.0, -1.0, 0.5, 0.5, 0.5];
        let b = [0.1, -0.2];
        let mut top = vec![Blob::new(&tops[0])];
        top[0].data.fill(f32::NAN);
        let cpu = Cpu::new(1);
        layer.forward(&ctx(&cpu, Phase::Train), &[bottom], &[&w, &b], &mut top);
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
        let cpu = Cpu::new(1);
        layer.backward(
            &ctx(&cpu, Phase::Train),
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
        let err = layer_config("name = \"fc\"\ntype = \"inner_product\"")
            .params()
            .unwrap_err()
            .to_string();
        assert!(err.contains("fc") && err.contains("num_output"), "{err}");
    }

    #[test]
    fn gradient_with_bias() {
        let bottom = uniform_blob(&[2, 3, 2, 2], -1.0, 1.0, 11);
        GradientChecker::default()
            .check(&mut ip("num_output = 5"), &[bottom], &[true])
            .unwrap()
            .assert_ok();
    }

    #[test]
    fn gradient_without_bias() {
        let bottom = uniform_blob(&[3, 6], -1.0, 1.0, 12);
        let report = GradientChecker::default()
            .check(
                &mut ip("num_output = 4\nbias_term = false"),
                &[bottom],
                &[true],
            )
            .unwrap();
        report.assert_ok();
        assert_eq!(report.checked, 3 * 6 + 4 * 6);
    }

    #[test]
    fn gradient_with_axis_2() {
        // (2, 3, 4) from axis 2: M = 6, K = 4, top (2, 3, 5).
        let mut layer = ip("num_output = 5\naxis = 2");
        assert_eq!(layer.reshape(&[&[2, 3, 4]]).unwrap(), vec![vec![2, 3, 5]]);
        let bottom = uniform_blob(&[2, 3, 4], -1.0, 1.0, 13);
        let report = GradientChecker::default()
            .check(&mut layer, &[bottom], &[true])
            .unwrap();
        report.assert_ok();
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
            let mut top = vec![Blob::new(&[32, 16])];
            layer.clone().forward(
                &ctx(&cpu, Phase::Train),
                std::slice::from_ref(&bottom),
                &[&w, &b],
                &mut top,
            );
            top.remove(0).data
        };
        let (one, four) = (run(1), run(4));
        for (a, b) in one.iter().zip(&four) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
