//! `Prelu`: Caffe's parametric ReLU, `y = max(x, 0) + slope[c] · min(x, 0)` with a learnable
//! slope per channel (axis 1), or one slope for every channel when `channel_shared`.
//!
//! Shapes: bottom `(N, C, ...)` (at least 2 axes), viewed as `(N, C, inner)`; top the same. The
//! tensor `slope` is `(C)`, or `[]` (a scalar, Caffe's shape) when shared; its filler is
//! `filler` (default constant 0.25).
//!
//! Backward: `dx += dy · (x > 0 ? 1 : slope[c])`; `dslope[c] += Σ_{n,i} dy · x · (x ≤ 0)`,
//! summed in f64 per slope.

use crate::config::layer_params::PreluParams;
use crate::error::{Error, Result};
use crate::layers::{elementwise_shape, BackwardPass, CpuLayer, ForwardPass, Layer};
use crate::params::ParamSpec;

cpu_layer! {
    /// The parametric ReLU; see the module docs.
    pub type Prelu = CpuLayer<PreluParams, SlopeView>;
}

/// How the bottom `(N, C, inner)` maps onto the slopes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlopeView {
    /// `C`.
    pub channels: usize,
    /// The product of the axes after the channels.
    pub inner: usize,
}

impl Prelu {
    /// The slope of channel `c`.
    fn slope_index(&self, c: usize) -> usize {
        if self.settings.channel_shared {
            0
        } else {
            c
        }
    }
}

impl Layer for Prelu {
    fn type_name(&self) -> &'static str {
        "prelu"
    }

    /// One bottom `(N, C, ...)`; the top has its shape.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let tops = elementwise_shape(&self.name, bottoms)?;
        let shape = bottoms[0];
        if shape.len() < 2 {
            return Err(Error::net(
                &self.name,
                format!("needs a bottom with channels (N, C, ...), got {shape:?}"),
            ));
        }
        self.state = SlopeView {
            channels: shape[1],
            inner: shape[2..].iter().product(),
        };
        Ok(tops)
    }

    /// `slope`: `(C)`, or `[]` when `channel_shared`.
    fn param_specs(&self) -> Vec<ParamSpec> {
        let shape = match self.settings.channel_shared {
            true => vec![],
            false => vec![self.state.channels],
        };
        vec![ParamSpec::new("slope", shape, &self.settings.filler)]
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        let SlopeView { channels, inner } = self.state;
        let slope = pass.params[0];
        let rows = pass.tops[0].data.chunks_mut(inner.max(1));
        for (r, (yr, xr)) in rows
            .zip(pass.bottoms[0].data.chunks(inner.max(1)))
            .enumerate()
        {
            let a = slope[self.slope_index(r % channels)];
            for (y, &x) in yr.iter_mut().zip(xr) {
                *y = x.max(0.0) + a * x.min(0.0);
            }
        }
    }

    fn backward(&mut self, pass: BackwardPass<'_>) {
        let SlopeView { channels, inner } = self.state;
        let inner = inner.max(1);
        let (slope, dy) = (pass.params[0], &pass.tops[0].diff);
        let x = &mut pass.bottoms[0];
        let mut sums = vec![0.0f64; pass.param_diffs[0].len()];
        for (r, (dyr, xr)) in dy.chunks(inner).zip(x.data.chunks(inner)).enumerate() {
            let s: f64 = dyr
                .iter()
                .zip(xr)
                .filter(|(_, &x)| x <= 0.0)
                .map(|(&g, &x)| g as f64 * x as f64)
                .sum();
            sums[self.slope_index(r % channels)] += s;
        }
        for (d, s) in pass.param_diffs[0].iter_mut().zip(sums) {
            *d += s as f32;
        }
        if pass.propagate_down[0] {
            for (r, (dxr, (dyr, xr))) in x
                .diff
                .chunks_mut(inner)
                .zip(dy.chunks(inner).zip(x.data.chunks(inner)))
                .enumerate()
            {
                let a = slope[self.slope_index(r % channels)];
                for (d, (&g, &v)) in dxr.iter_mut().zip(dyr.iter().zip(xr)) {
                    *d += if v > 0.0 { g } else { a * g };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, forward, layer, params_error};

    fn prelu(keys: &str) -> Prelu {
        layer::<PreluParams>("prelu", keys)
    }

    #[test]
    fn forward_by_hand_per_channel_and_shared() {
        // (N, C, inner) = (1, 2, 2): channel 0 slope 0.1, channel 1 slope -2.
        let x = blob(&[1, 2, 2], &[-1.0, 3.0, -0.5, 2.0]);
        let top = forward(&mut prelu(""), std::slice::from_ref(&x), &[&[0.1, -2.0]]);
        assert_eq!(top[0].data, vec![-0.1, 3.0, 1.0, 2.0]);
        let mut shared = prelu("channel_shared = true");
        let top = forward(&mut shared, &[x], &[&[0.5]]);
        assert_eq!(top[0].data, vec![-0.5, 3.0, -0.25, 2.0]);
    }

    #[test]
    fn slope_shapes_and_default_filler() {
        let mut l = prelu("");
        l.reshape(&[&[2, 3, 4, 5]]).unwrap();
        let specs = l.param_specs();
        assert_eq!(
            (specs[0].name.as_str(), &specs[0].shape),
            ("slope", &vec![3])
        );
        assert_eq!(specs[0].filler.value, 0.25);
        let mut s = prelu("channel_shared = true");
        s.reshape(&[&[2, 3, 4, 5]]).unwrap();
        assert_eq!(s.param_specs()[0].shape, Vec::<usize>::new());
        assert!(prelu("").reshape(&[&[4]]).is_err());
    }

    /// Caffe's PReLU test settings; the slopes' gradient is checked with the bottom's.
    #[test]
    fn gradient_per_channel_and_shared() {
        for keys in ["", "channel_shared = true"] {
            let x = uniform_blob(&[2, 3, 4, 5], -1.0, 1.0, 41);
            let report = GradientChecker::skipping_kink(0.0, 0.01).assert_passes(
                &mut prelu(keys),
                &[x],
                &[true],
            );
            assert!(report.checked > 100, "{report}");
        }
        // A 2-D bottom: one value per channel.
        let x = uniform_blob(&[4, 5], -1.0, 1.0, 42);
        GradientChecker::default().assert_passes(&mut prelu(""), &[x], &[true]);
    }

    /// In a net the slopes are a tensor of the flat parameters like any weight: filled with
    /// 0.25, saved and loaded by a snapshot, and written to a `.caffemodel` and read back, as
    /// `(C)` and as Caffe's scalar `[]` when shared.
    #[test]
    fn slopes_live_in_the_flat_parameters_snapshots_and_caffemodels() {
        use crate::caffe::weights::{import, to_caffemodel, NamedTensor};
        use crate::layers::test_util::{in_place, net_around};
        use crate::net::Net;
        use std::path::Path;
        for (keys, shape) in [("", vec![10]), ("channel_shared = true", vec![])] {
            let text = net_around(&in_place("act", "prelu", keys));
            let (cfg, _) = crate::validate::load_str("t.toml", &text, Path::new("."), &[]).unwrap();
            let (_, mut params) = Net::build(&cfg, [1, 8, 8], 4).unwrap();
            Net::init_params(&mut params, 5);
            let span = params.find("act.slope").expect("a slope tensor").clone();
            assert_eq!(span.shape, shape);
            let slopes = params.data[span.range()].to_vec();
            assert!(slopes.iter().all(|&a| a == 0.25), "{slopes:?}");

            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.safetensors");
            params.data[span.range()].iter_mut().for_each(|a| *a = -0.5);
            crate::snapshot::save_weights(&path, &params, &[]).unwrap();
            let mut back = crate::params::Params::new(params.spans.clone());
            crate::snapshot::load_weights(&path, &mut back).unwrap();
            assert_eq!(back.data, params.data);

            let tensors: Vec<NamedTensor> = params
                .spans
                .iter()
                .map(|s| NamedTensor {
                    name: s.full_name.clone(),
                    shape: s.shape.clone(),
                    data: params.data[s.range()].to_vec(),
                })
                .collect();
            let model = to_caffemodel("n", &cfg.layers, &tensors).unwrap();
            assert_eq!(model.layer[1].r#type.as_deref(), Some("PReLU"));
            let refs: Vec<_> = cfg.layers.iter().collect();
            let (read, _) = import(Path::new("m.caffemodel"), &model, &refs).unwrap();
            assert_eq!(read, tensors);
        }
    }

    #[test]
    fn a_bad_filler_is_named() {
        let e = params_error("prelu", "filler = { type = \"gaussian\", std = 0.0 }");
        assert!(e.contains("filler.std"), "{e}");
    }
}
