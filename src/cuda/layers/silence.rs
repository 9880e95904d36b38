//! `GpuSilence`: reads its bottoms and writes nothing, the device twin of
//! `crate::layers::silence`; its gradient is zero, so backward writes zeros where told to
//! overwrite a bottom's diff and leaves an accumulated one alone.

use super::{zero_gradient, BackwardPass, ForwardPass, GpuLayer};
use crate::config::layer_params::SilenceParams;
use crate::error::Result;

stateless_layer! {
    /// Silence; see the module docs.
    pub struct GpuSilence for SilenceParams;
}

impl GpuLayer for GpuSilence {
    fn type_name(&self) -> &'static str {
        "silence"
    }

    fn forward(&mut self, _pass: ForwardPass<'_>) -> Result<()> {
        Ok(())
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        zero_gradient(&mut pass)
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"s\"\ntype = \"silence\"\ntop = []",
        vec![vec![2, 3, 4, 5], vec![2, 7]],
        831
    );
}
