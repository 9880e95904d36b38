//! `GpuConcat`: bottoms concatenated along `axis` (default 1), the device twin of
//! `crate::layers::concat`. Viewing each bottom as `(outer, dim_k · inner)` and the top as
//! `(outer, Σ dim_k · inner)`, bottom k is one strided copy into its column range; backward
//! copies (or adds) the same range of the top's diff back.

use super::{BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::ConcatParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};

/// Concatenation; see the module docs.
#[derive(Debug)]
pub struct GpuConcat {
    name: String,
    axis: usize,
    outer: usize,
    /// Per bottom, `dim_k · inner` (its columns).
    cols: Vec<usize>,
}

impl BuildGpu for ConcatParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuConcat {
            name: name.to_string(),
            axis: self.axis,
            outer: 0,
            cols: Vec::new(),
        }))
    }
}

impl GpuLayer for GpuConcat {
    fn type_name(&self) -> &'static str {
        "concat"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let Some(first) = bottoms.first() else {
            return Err(Error::net(&self.name, "takes at least 1 bottom"));
        };
        if self.axis >= first.len() {
            return Err(Error::net(
                &self.name,
                format!("`axis` {} out of range for bottom {first:?}", self.axis),
            ));
        }
        self.outer = first[..self.axis].iter().product();
        self.cols = bottoms
            .iter()
            .map(|b| b[self.axis..].iter().product())
            .collect();
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let (bottoms, top) = (pass.blobs.bottoms, pass.blobs.tops[0]);
        let total: usize = self.cols.iter().sum();
        let mut off = 0;
        for (&b, &cols) in bottoms.iter().zip(&self.cols) {
            let [x, y] = pass.blobs.pick([b, top]);
            gpu.kernels.copy_strided(
                &gpu.compute,
                &x.data(),
                &mut y.data_mut(),
                self.outer,
                cols,
                (cols, 0),
                (total, off),
                false,
            )?;
            off += cols;
        }
        Ok(())
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let (bottoms, top) = (pass.blobs.bottoms, pass.blobs.tops[0]);
        let total: usize = self.cols.iter().sum();
        let mut off = 0;
        for ((&b, &cols), g) in bottoms.iter().zip(&self.cols).zip(pass.grads) {
            if g.wanted() {
                let [x, y] = pass.blobs.pick([b, top]);
                gpu.kernels.copy_strided(
                    &gpu.compute,
                    &y.diff(),
                    &mut x.diff_mut(),
                    self.outer,
                    cols,
                    (total, off),
                    (cols, 0),
                    g.accumulate(),
                )?;
            }
            off += cols;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        channels_match_cpu:
            "name = \"c\"\ntype = \"concat\"", vec![vec![2, 3, 4, 5], vec![2, 1, 4, 5], vec![2, 4, 4, 5]], 801;
        axis_2_matches_cpu:
            "name = \"c\"\ntype = \"concat\"\naxis = 2", vec![vec![2, 3, 4, 5], vec![2, 3, 2, 5]], 802;
    }
}
