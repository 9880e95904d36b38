//! `Relu`: the rectifier, elementwise `y = max(x, 0) + negative_slope · min(x, 0)` (Caffe's leaky
//! ReLU; `negative_slope` defaults to 0). Bottom and top have the same shape `(N, ...)`.

use crate::config::layer_params::ReluParams;
use crate::error::Result;
use crate::layers::{elementwise_shape, Ctx, Layer};
use crate::tensor::Blob;

/// The rectifier; see the module docs.
#[derive(Debug, Clone)]
pub struct Relu {
    name: String,
    negative_slope: f32,
}

impl Default for Relu {
    /// A plain ReLU (slope 0) named `relu`.
    fn default() -> Self {
        Relu {
            name: "relu".into(),
            negative_slope: 0.0,
        }
    }
}

impl Relu {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`ReluParams`]).
    pub fn new(name: &str, p: &ReluParams) -> Self {
        Relu {
            name: name.to_string(),
            negative_slope: p.negative_slope,
        }
    }
}

impl Layer for Relu {
    fn type_name(&self) -> &'static str {
        "relu"
    }

    /// One bottom `(N, ...)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        elementwise_shape(&self.name, bottoms)
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        let slope = self.negative_slope;
        for (y, &x) in tops[0].data.iter_mut().zip(&bottoms[0].data) {
            *y = if x > 0.0 { x } else { slope * x };
        }
    }

    /// `dx += dy · (x > 0 ? 1 : negative_slope)`.
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
        let slope = self.negative_slope;
        let b = &mut bottoms[0];
        for ((dx, &x), &dy) in b.diff.iter_mut().zip(&b.data).zip(&tops[0].diff) {
            *dx += if x > 0.0 { dy } else { slope * dy };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::config::Phase;
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};

    fn relu(slope: f32) -> Relu {
        from_config(
            Relu::new,
            &layer_config(&format!(
                "name = \"r\"\ntype = \"relu\"\nnegative_slope = {slope:?}"
            )),
        )
    }

    fn forward(layer: &mut Relu, x: &[f32]) -> Vec<f32> {
        let mut bottom = Blob::new(&[1, x.len()]);
        bottom.data = x.to_vec();
        let mut top = vec![Blob::new(&layer.reshape(&[&bottom.shape]).unwrap()[0])];
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
        top.remove(0).data
    }

    #[test]
    fn forward_by_hand() {
        let x = [-2.0, -0.5, 0.0, 1.5];
        assert_eq!(forward(&mut relu(0.0), &x), vec![0.0, 0.0, 0.0, 1.5]);
        assert_eq!(forward(&mut Relu::default(), &x), vec![0.0, 0.0, 0.0, 1.5]);
        let leaky = forward(&mut relu(0.1), &x);
        let want = [-0.2, -0.05, 0.0, 1.5];
        for (g, w) in leaky.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{leaky:?} vs {want:?}");
        }
    }

    /// Caffe's ReLU test settings: the kink at 0 is skipped within one step.
    fn check(slope: f32) {
        let bottom = uniform_blob(&[2, 3, 4, 5], -1.0, 1.0, 21);
        let checker = GradientChecker {
            kink: 0.0,
            kink_range: 0.01,
            ..GradientChecker::default()
        };
        let report = checker.check(&mut relu(slope), &[bottom], &[true]).unwrap();
        report.assert_ok();
        assert!(report.checked > 100, "{report}");
    }

    #[test]
    fn gradient_slope_0() {
        check(0.0);
    }

    #[test]
    fn gradient_slope_0_1() {
        check(0.1);
    }

    #[test]
    fn rejects_two_bottoms() {
        assert!(relu(0.0).reshape(&[&[1, 2], &[1, 2]]).is_err());
    }
}
