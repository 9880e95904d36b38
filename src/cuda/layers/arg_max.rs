//! `GpuArgMax`: the `top_k` largest values' indices (or values) on the device, the device twin
//! of `crate::layers::arg_max` (whose docs give the shapes and the order). One thread per value
//! counts the values ranking above it — its rank, a permutation since ties go by index — and
//! writes its result when the rank is below `top_k`. No backward.

use super::{one_bottom, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::ArgMaxParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;
use crate::layers::arg_max::Search;

/// ArgMax; see the module docs.
#[derive(Debug)]
pub struct GpuArgMax {
    name: String,
    params: ArgMaxParams,
    /// The searches over the current bottom.
    search: Search,
}

impl BuildGpu for ArgMaxParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuArgMax {
            name: name.to_string(),
            params: *self,
            search: Search::default(),
        }))
    }
}

impl GpuLayer for GpuArgMax {
    fn type_name(&self) -> &'static str {
        "arg_max"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom(&self.name, bottoms)?;
        (self.search, _) = self.params.plan(&self.name, shape)?;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let (p, s) = (&self.params, self.search);
        let [x, y] = pass.blobs.bottom_top();
        gpu.kernels.argmax(
            &gpu.compute,
            &x.data(),
            &mut y.data_mut(),
            (s.rows, s.dim, s.stride),
            p.top_k,
            (p.out_max_val, p.axis.is_some()),
        )
    }

    fn backward(&mut self, _pass: BackwardPass<'_>) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        flattened_matches_cpu: "name = \"a\"\ntype = \"arg_max\"\ntop_k = 3", vec![vec![5, 4, 3, 2]], 1501;
        flattened_with_values_matches_cpu: "name = \"a\"\ntype = \"arg_max\"\ntop_k = 4\nout_max_val = true", vec![vec![7, 100]], 1502;
        along_channels_matches_cpu: "name = \"a\"\ntype = \"arg_max\"\naxis = 1\ntop_k = 2", vec![vec![3, 6, 4, 5]], 1503;
        along_an_axis_with_values_matches_cpu: "name = \"a\"\ntype = \"arg_max\"\naxis = 2\nout_max_val = true", vec![vec![3, 6, 4, 5]], 1504;
    }
}
