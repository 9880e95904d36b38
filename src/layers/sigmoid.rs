//! `Sigmoid`: the logistic function, elementwise `y = 1 / (1 + e^(−x))`. Bottom and top have the
//! same shape `(N, ...)`.

use crate::config::layer_params::SigmoidParams;
use crate::error::Result;
use crate::layers::{elementwise_shape, Ctx, Layer};
use crate::tensor::Blob;

/// The logistic function; see the module docs.
#[derive(Debug, Clone)]
pub struct Sigmoid {
    name: String,
}

impl Default for Sigmoid {
    /// A layer named `sigmoid`.
    fn default() -> Self {
        Sigmoid {
            name: "sigmoid".into(),
        }
    }
}

impl Sigmoid {
    pub fn new(name: &str, _params: &SigmoidParams) -> Self {
        Sigmoid {
            name: name.to_string(),
        }
    }
}

impl Layer for Sigmoid {
    fn type_name(&self) -> &'static str {
        "sigmoid"
    }

    /// One bottom `(N, ...)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        elementwise_shape(&self.name, bottoms)
    }

    /// Saturates to exactly 0 and 1 for large |x|, never NaN.
    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        for (y, &x) in tops[0].data.iter_mut().zip(&bottoms[0].data) {
            *y = 1.0 / (1.0 + (-x).exp());
        }
    }

    /// `dx += dy · y · (1 − y)`, from the top's data.
    fn backward(
        &mut self,
        _ctx: &Ctx,
        tops: &[Blob],
        propagate_down: &[bool],
        bottoms: &mut [Blob],
        _params: &[&[f32]],
        _param_diffs: &mut [&mut [f32]],
    ) {
        if !propagate_down[0] {
            return;
        }
        let top = &tops[0];
        for ((dx, &y), &dy) in bottoms[0].diff.iter_mut().zip(&top.data).zip(&top.diff) {
            *dx += dy * y * (1.0 - y);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::config::Phase;
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};

    fn sigmoid() -> Sigmoid {
        from_config(
            Sigmoid::new,
            &layer_config("name = \"s\"\ntype = \"sigmoid\""),
        )
    }

    #[test]
    fn forward_by_hand() {
        let mut layer = sigmoid();
        let mut bottom = Blob::new(&[1, 5]);
        bottom.data = vec![0.0, 1.0, -2.0, 100.0, -100.0];
        let mut top = vec![Blob::new(&layer.reshape(&[&[1, 5]]).unwrap()[0])];
        let cpu = Cpu::new(1);
        let ctx = Ctx {
            cpu: &cpu,
            phase: Phase::Train,
            iter: 0,
            seed: 1,
            first_sample: 0,
            reducer: None,
        };
        layer.forward(&ctx, &[bottom], &[], &mut top);
        let want = [0.5, 0.731_058_6, 0.119_202_92, 1.0, 0.0];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", top[0].data);
        }
    }

    #[test]
    fn gradient() {
        let bottom = uniform_blob(&[2, 3, 4], -3.0, 3.0, 31);
        GradientChecker::default()
            .check(&mut sigmoid(), &[bottom], &[true])
            .unwrap()
            .assert_ok();
    }
}
