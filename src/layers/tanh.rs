//! `TanH`: the hyperbolic tangent, elementwise `y = tanh(x)`. Bottom and top have the same shape
//! `(N, ...)`.

use crate::config::layer_params::TanhParams;
use crate::error::Result;
use crate::layers::{elementwise_shape, Ctx, Layer};
use crate::tensor::Blob;

/// The hyperbolic tangent; see the module docs.
#[derive(Debug, Clone)]
pub struct TanH {
    name: String,
}

impl Default for TanH {
    /// A layer named `tanh`.
    fn default() -> Self {
        TanH {
            name: "tanh".into(),
        }
    }
}

impl TanH {
    pub fn new(name: &str, _params: &TanhParams) -> Self {
        TanH {
            name: name.to_string(),
        }
    }
}

impl Layer for TanH {
    fn type_name(&self) -> &'static str {
        "tanh"
    }

    /// One bottom `(N, ...)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        elementwise_shape(&self.name, bottoms)
    }

    fn forward(&mut self, _ctx: &Ctx, bottoms: &[Blob], _params: &[&[f32]], tops: &mut [Blob]) {
        for (y, &x) in tops[0].data.iter_mut().zip(&bottoms[0].data) {
            *y = x.tanh();
        }
    }

    /// `dx += dy · (1 − y²)`, from the top's data.
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
            *dx += dy * (1.0 - y * y);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::config::Phase;
    use crate::layers::gradient_check::{from_config, layer_config, uniform_blob, GradientChecker};

    fn tanh() -> TanH {
        from_config(TanH::new, &layer_config("name = \"t\"\ntype = \"tanh\""))
    }

    #[test]
    fn forward_by_hand() {
        let mut layer = tanh();
        let mut bottom = Blob::new(&[1, 5]);
        bottom.data = vec![0.0, 0.5, -1.0, 50.0, -50.0];
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
        let want = [0.0, 0.462_117_16, -0.761_594_2, 1.0, -1.0];
        for (g, w) in top[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", top[0].data);
        }
    }

    #[test]
    fn gradient() {
        let bottom = uniform_blob(&[2, 3, 4], -2.0, 2.0, 41);
        GradientChecker::default()
            .check(&mut tanh(), &[bottom], &[true])
            .unwrap()
            .assert_ok();
    }
}
