//! `Silence`: Caffe's Silence, which reads its bottoms (one or more, any shapes) so that nothing
//! is left unused, and has no top. Its gradient to every bottom is zero: backward adds nothing.

use crate::config::layer_params::SilenceParams;
use crate::error::{Error, Result};
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The silence layer; see the module docs.
    pub type Silence = CpuLayer<SilenceParams, ()>;
}

impl Layer for Silence {
    fn type_name(&self) -> &'static str {
        "silence"
    }

    /// One or more bottoms; no top.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        if bottoms.is_empty() {
            return Err(Error::net(&self.name, "takes 1 or more bottoms, got 0"));
        }
        Ok(Vec::new())
    }

    fn forward(&mut self, _pass: ForwardPass<'_>) {}

    /// The gradient is zero: accumulating it leaves the bottoms' diffs as they are.
    fn backward(&mut self, _pass: BackwardPass<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{backward, layer};

    /// The check runs on bottoms whose diffs it pre-fills: they must come back unchanged (a
    /// zero gradient), and the numeric gradient of an objective without tops is zero too.
    #[test]
    fn gradient_is_zero() {
        let bottoms = [
            uniform_blob(&[2, 3], -1.0, 1.0, 61),
            uniform_blob(&[2, 1, 2, 2], -1.0, 1.0, 62),
        ];
        let mut silence = layer::<SilenceParams>("silence", "");
        let report =
            GradientChecker::default().assert_passes(&mut silence, &bottoms, &[true, true]);
        assert!(report.checked > 0);
        let mut b = bottoms.clone();
        b[0].diff.fill(0.25);
        backward(&mut silence, &[], &[true, true], &mut b, &[], &mut []);
        assert!(b[0].diff.iter().all(|&d| d == 0.25));
    }

    #[test]
    fn takes_a_bottom_and_has_no_top() {
        let mut silence = layer::<SilenceParams>("silence", "");
        assert_eq!(
            silence.reshape(&[&[2, 3]]).unwrap(),
            Vec::<Vec<usize>>::new()
        );
        assert!(silence.reshape(&[]).is_err());
    }
}
