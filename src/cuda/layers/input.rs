//! `GpuInput`: the device twin of `crate::layers::input`, which hands the inputs (`data`, and
//! `label` with a second top) on under its tops' names: forward copies them; no gradient flows
//! into the inputs.

use super::{copy_data, zero_gradient, BackwardPass, ForwardPass, GpuLayer};
use crate::config::layer_params::InputParams;
use crate::error::Result;

stateless_layer! {
    /// The input layer; see the module docs.
    pub struct GpuInput for InputParams;
}

impl GpuLayer for GpuInput {
    fn type_name(&self) -> &'static str {
        "input"
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (bottoms, tops) = (pass.blobs.bottoms, pass.blobs.tops);
        for (&b, &t) in bottoms.iter().zip(tops) {
            let [x, y] = pass.blobs.pick([b, t]);
            copy_data(pass.gpu, x, y)?;
        }
        Ok(())
    }

    /// The inputs' gradient is zero (the net never asks for it).
    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        zero_gradient(&mut pass)
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"in\"\ntype = \"input\"\ntop = [\"x\", \"y\"]\nshape = [1, 3, 4, 5]",
        vec![vec![2, 3, 4, 5], vec![2]],
        841
    );
}
