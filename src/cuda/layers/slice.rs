//! `GpuSlice`: the bottom cut along `axis` into one piece per top, the device twin of
//! `crate::layers::slice`, moving Concat's [`Columns`] the other way: forward copies each top's
//! columns out of the bottom's rows, backward copies (or adds) the tops' diffs back into them.

use super::concat::Columns;
use super::{one_bottom_with_axis, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::SliceParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};

/// Slicing; see the module docs.
#[derive(Debug)]
pub struct GpuSlice {
    name: String,
    params: SliceParams,
    columns: Columns,
}

impl BuildGpu for SliceParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuSlice {
            name: name.to_string(),
            params: self.clone(),
            columns: Columns::default(),
        }))
    }
}

impl GpuLayer for GpuSlice {
    fn type_name(&self) -> &'static str {
        "slice"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let axis = self.params.axis;
        let shape = one_bottom_with_axis(&self.name, bottoms, axis)?;
        let pieces = self
            .params
            .pieces(shape[axis])
            .map_err(|m| Error::net(&self.name, m))?;
        let tops: Vec<Vec<usize>> = pieces
            .iter()
            .map(|&a| {
                let mut top = shape.to_vec();
                top[axis] = a;
                top
            })
            .collect();
        let views: Vec<&[usize]> = tops.iter().map(Vec::as_slice).collect();
        self.columns = Columns::along(&self.name, axis, &views)?;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (bottom, tops) = (pass.blobs.bottoms[0], pass.blobs.tops);
        for (k, &t) in tops.iter().enumerate() {
            let [x, y] = pass.blobs.pick([bottom, t]);
            self.columns
                .cut(pass.gpu, &x.data(), &mut y.data_mut(), k, false)?;
        }
        Ok(())
    }

    /// The pieces cover the bottom: each writes its own columns, so an overwrite needs no
    /// zeroing first.
    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let g = pass.grads[0];
        if !g.wanted() {
            return Ok(());
        }
        let (bottom, tops) = (pass.blobs.bottoms[0], pass.blobs.tops);
        for (k, &t) in tops.iter().enumerate() {
            let [x, y] = pass.blobs.pick([bottom, t]);
            let acc = g.accumulate();
            self.columns
                .join(pass.gpu, &y.diff(), &mut x.diff_mut(), k, acc)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        slice_points_match_cpu: "name = \"s\"\ntype = \"slice\"\ntop = [\"a\", \"b\", \"c\"]\nslice_point = [1, 4]", vec![vec![2, 6, 3, 4]], 811;
        equal_pieces_on_axis_2_match_cpu: "name = \"s\"\ntype = \"slice\"\ntop = [\"a\", \"b\"]\naxis = 2", vec![vec![2, 3, 4, 5]], 812;
    }
}
