//! `GpuConcat`: bottoms concatenated along `axis` (default 1), the device twin of
//! `crate::layers::concat`. Viewing each bottom as `(outer, dim_k · inner)` and the top as
//! `(outer, Σ dim_k · inner)`, bottom k is one strided copy into its column range; backward
//! copies (or adds) the same range of the top's diff back. [`Columns`] moves pieces both ways,
//! for Slice too.

use super::{BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::ConcatParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::{CudaView, CudaViewMut};

/// Concatenation; see the module docs.
#[derive(Debug)]
pub struct GpuConcat {
    name: String,
    axis: usize,
    columns: Columns,
}

/// Pieces `(outer, cols_k)` side by side in the rows of a whole `(outer, Σ cols_k)`: Concat's
/// bottoms in its top, Slice's tops in its bottom (`super::slice`).
#[derive(Debug, Default)]
pub(super) struct Columns {
    outer: usize,
    /// Per piece, `dim_k · inner` (its columns).
    cols: Vec<usize>,
}

impl Columns {
    /// The pieces of `shapes` along `axis` (an error naming `layer` without any, or where the
    /// axis is out of range).
    pub(super) fn along(layer: &str, axis: usize, shapes: &[&[usize]]) -> Result<Columns> {
        let Some(first) = shapes.first() else {
            return Err(Error::net(layer, "takes at least 1 piece"));
        };
        if axis >= first.len() {
            return Err(Error::net(
                layer,
                format!("`axis` {axis} out of range for {first:?}"),
            ));
        }
        Ok(Columns {
            outer: first[..axis].iter().product(),
            cols: shapes.iter().map(|b| b[axis..].iter().product()).collect(),
        })
    }

    /// Piece `k`'s columns of `whole` ← `part` (`+=` where `accumulate`).
    pub(super) fn join(
        &self,
        gpu: &Gpu,
        part: &CudaView<'_, f32>,
        whole: &mut CudaViewMut<'_, f32>,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (total, off): (usize, usize) = (self.cols.iter().sum(), self.cols[..k].iter().sum());
        let cols = self.cols[k];
        let (src, dst) = ((cols, 0), (total, off));
        let s = &gpu.compute;
        gpu.kernels
            .copy_strided(s, part, whole, self.outer, cols, src, dst, accumulate)
    }

    /// `part` ← piece `k`'s columns of `whole` (`+=` where `accumulate`).
    pub(super) fn cut(
        &self,
        gpu: &Gpu,
        whole: &CudaView<'_, f32>,
        part: &mut CudaViewMut<'_, f32>,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (total, off): (usize, usize) = (self.cols.iter().sum(), self.cols[..k].iter().sum());
        let cols = self.cols[k];
        let (src, dst) = ((total, off), (cols, 0));
        let s = &gpu.compute;
        gpu.kernels
            .copy_strided(s, whole, part, self.outer, cols, src, dst, accumulate)
    }
}

impl BuildGpu for ConcatParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuConcat {
            name: name.to_string(),
            axis: self.axis,
            columns: Columns::default(),
        }))
    }
}

impl GpuLayer for GpuConcat {
    fn type_name(&self) -> &'static str {
        "concat"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        self.columns = Columns::along(&self.name, self.axis, bottoms)?;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (bottoms, top) = (pass.blobs.bottoms, pass.blobs.tops[0]);
        for (k, &b) in bottoms.iter().enumerate() {
            let [x, y] = pass.blobs.pick([b, top]);
            self.columns
                .join(pass.gpu, &x.data(), &mut y.data_mut(), k, false)?;
        }
        Ok(())
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (bottoms, top) = (pass.blobs.bottoms, pass.blobs.tops[0]);
        for (k, (&b, g)) in bottoms.iter().zip(pass.grads).enumerate() {
            if g.wanted() {
                let [x, y] = pass.blobs.pick([b, top]);
                let acc = g.accumulate();
                self.columns
                    .cut(pass.gpu, &y.diff(), &mut x.diff_mut(), k, acc)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        channels_match_cpu: "name = \"c\"\ntype = \"concat\"", vec![vec![2, 3, 4, 5], vec![2, 1, 4, 5], vec![2, 4, 4, 5]], 801;
        axis_2_matches_cpu: "name = \"c\"\ntype = \"concat\"\naxis = 2", vec![vec![2, 3, 4, 5], vec![2, 3, 2, 5]], 802;
    }
}
