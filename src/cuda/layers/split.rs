//! `GpuSplit`: the bottom copied to every top, the device twin of `crate::layers::split`;
//! backward writes (or adds) the first top's diff into the bottom's and adds the others'.

use super::{copy_data, BackwardPass, ForwardPass, GpuLayer};
use crate::config::layer_params::SplitParams;
use crate::error::Result;

stateless_layer! {
    /// Splitting; see the module docs.
    pub struct GpuSplit for SplitParams;
}

impl GpuLayer for GpuSplit {
    fn type_name(&self) -> &'static str {
        "split"
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (bottom, tops) = (pass.blobs.bottoms[0], pass.blobs.tops);
        for &t in tops {
            let [x, y] = pass.blobs.pick([bottom, t]);
            copy_data(pass.gpu, x, y)?;
        }
        Ok(())
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let g = pass.grads[0];
        if !g.wanted() {
            return Ok(());
        }
        let (gpu, bottom, tops) = (pass.gpu, pass.blobs.bottoms[0], pass.blobs.tops);
        for (j, &t) in tops.iter().enumerate() {
            let [x, y] = pass.blobs.pick([bottom, t]);
            let n = x.count();
            let accumulate = j > 0 || g.accumulate();
            gpu.kernels.scaled_copy(
                &gpu.compute,
                &y.diff(),
                &mut x.diff_mut(),
                1.0,
                n,
                accumulate,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"s\"\ntype = \"split\"\ntop = [\"a\", \"b\", \"c\"]",
        vec![vec![2, 3, 4, 5]],
        821
    );
}
