//! `Split`: Caffe's Split, one bottom copied to every top; backward adds every top's gradient
//! into the bottom's.
//!
//! Shapes: bottom `(N, ...)`, each top the same. The net needs no Split of its own (a blob read
//! by several layers gets the sum of their gradients, since backward accumulates); the layer is
//! there for nets that name one, as Caffe's own prototxts may, and gives the same results.

use crate::config::layer_params::SplitParams;
use crate::error::{Error, Result};
use crate::layers::{one_bottom, BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The split layer; see the module docs.
    pub type Split = CpuLayer<SplitParams, ()>;
}

impl Layer for Split {
    fn type_name(&self) -> &'static str {
        "split"
    }

    /// One bottom; as many tops of its shape as the config names (at least 1).
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let shape = one_bottom(&self.name, bottoms)?;
        if self.settings.tops == 0 {
            return Err(Error::net(&self.name, "needs at least 1 top"));
        }
        Ok(vec![shape.to_vec(); self.settings.tops])
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        for top in pass.tops.iter_mut() {
            top.data.copy_from_slice(&pass.bottoms[0].data);
        }
    }

    /// `bottom.diff += Σ_t top_t.diff`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        if !pass.propagate_down[0] {
            return;
        }
        let dx = &mut pass.bottoms[0].diff;
        for top in pass.tops {
            dx.iter_mut().zip(&top.diff).for_each(|(d, &g)| *d += g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::config::Phase;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{blob, ctx, forward, layer, layer_table};
    use crate::net::Net;
    use crate::validate::load_str;
    use std::path::Path;

    fn split(tops: usize) -> Split {
        let names: Vec<String> = (0..tops).map(|t| format!("t{t}")).collect();
        layer::<SplitParams>("split", &format!("top = {names:?}"))
    }

    #[test]
    fn forward_copies_to_every_top() {
        let x = blob(&[2, 2], &[1.0, -2.0, 3.0, 0.5]);
        let tops = forward(&mut split(3), std::slice::from_ref(&x), &[]);
        assert_eq!(tops.len(), 3);
        for t in tops {
            assert_eq!((t.shape, t.data), (x.shape.clone(), x.data.clone()));
        }
    }

    #[test]
    fn gradient_sums_the_tops() {
        let bottom = uniform_blob(&[2, 3, 2], -1.0, 1.0, 71);
        let report = GradientChecker::default().assert_passes(&mut split(3), &[bottom], &[true]);
        assert!(report.checked > 0);
    }

    /// A net whose blob `ip` feeds two layers (`a`, `b`) directly, and the same net with an
    /// explicit Split between: the same losses and the same parameter gradients, bit for bit.
    #[test]
    fn explicit_split_equals_the_implicit_one() {
        let run = |explicit: bool| {
            let (x, y) = if explicit {
                ("ip_a", "ip_b")
            } else {
                ("ip", "ip")
            };
            let mut layers =
                layer_table("ip", "inner_product", &["data"], &["ip"], "num_output = 6");
            if explicit {
                layers += &layer_table("split", "split", &["ip"], &["ip_a", "ip_b"], "");
            }
            layers += &layer_table("a", "inner_product", &[x], &["a"], "num_output = 10");
            layers += &layer_table("b", "inner_product", &[y], &["b"], "num_output = 10");
            layers += &layer_table("la", "softmax_with_loss", &["a", "label"], &["la"], "");
            layers += &layer_table("lb", "softmax_with_loss", &["b", "label"], &["lb"], "");
            let text = format!(
                "data = {{ format = \"digits\", batch_size = 4 }}\n\
                 solver = {{ base_lr = 0.1, max_iter = 1 }}\n{layers}"
            );
            let (cfg, _) = load_str("t.toml", &text, Path::new("."), &[]).unwrap();
            let (mut net, mut params) = Net::build(&cfg, [1, 8, 8], 4).unwrap();
            Net::init_params(&mut params, 5);
            let (d, l) = net.inputs_mut();
            let x = uniform_blob(&[4, 1, 8, 8], -1.0, 1.0, 72);
            d.copy_from_slice(&x.data);
            l.copy_from_slice(&[1.0, 7.0, 0.0, 4.0]);
            let cpu = Cpu::new(1);
            let ctx = ctx(&cpu, Phase::Train);
            params.diff.fill(0.0);
            let outputs = net.forward(&ctx, &mut params);
            net.backward(&ctx, &mut params, &mut |_| {});
            let losses: Vec<f32> = outputs.iter().map(|o| o.value).collect();
            (losses, params.diff.clone())
        };
        let (implicit, explicit) = (run(false), run(true));
        assert!(implicit.1.iter().any(|&g| g != 0.0));
        assert_eq!(implicit, explicit);
    }
}
