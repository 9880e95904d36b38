//! `GpuScale`: Caffe's Scale layer, the device twin of `crate::layers::scale`:
//! `y = x · s[d] (+ b[d])` over the view `(outer, dim, inner)` of the bottom `x`, where `d`
//! runs over the axes `axis .. axis + num_axes` (default 1 and 1: one factor per channel).
//! Channels-last blobs only with one factor per channel: the view is then `(N·H·W, C, 1)`.
//!
//! One bottom: `s` is learnable, shape `x.shape[axis .. axis + num_axes]` (`num_axes = -1`:
//! every axis from `axis`). Two bottoms: `s` is the second bottom (shape
//! `x.shape[axis .. axis + its rank]`), not learnable, and gets a gradient like a bottom.
//! Learnable tensors, in order: `scale` (one bottom only) and `bias` when `bias_term`.
//!
//! Backward: `dx (+)= dy · s[d]`; `ds[d] (+)= Σ dy·x`, `db[d] (+)= Σ dy` over `(outer,
//! inner)` in double with fixed chunks and summation trees (deterministic).

use super::{pick, GpuCtx, GpuLayer, Grad};
use crate::config::layer_params::ScaleParams;
use crate::cuda::blob::GpuBlob;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::{CudaView, CudaViewMut};

/// `(outer, dim, inner)` of `shape` around the axes `axis .. axis + num_axes` (`-1`: to the
/// end), or an error naming the layer.
pub(crate) fn channel_view(
    layer: &str,
    shape: &[usize],
    axis: usize,
    num_axes: i64,
) -> Result<(usize, usize, usize)> {
    let end = if num_axes < 0 {
        shape.len()
    } else {
        axis + num_axes as usize
    };
    if axis > shape.len() || end > shape.len() {
        return Err(Error::net(
            layer,
            format!("axes {axis}..{end} do not fit the bottom {shape:?}"),
        ));
    }
    Ok((
        shape[..axis].iter().product(),
        shape[axis..end].iter().product(),
        shape[end..].iter().product(),
    ))
}

/// The scale layer; see the module docs.
#[derive(Debug)]
pub struct GpuScale {
    name: String,
    axis: usize,
    num_axes: i64,
    bias_term: bool,
    /// `(outer, dim, inner)` of the current bottom.
    view: (usize, usize, usize),
    /// How a 4-D bottom is stored (channels-last only over the channel axis alone).
    layout: Layout,
    /// Whether the scale is the second bottom.
    two_bottoms: bool,
}

impl GpuScale {
    /// The layer `name` with its resolved parameters (defaults and ranges: [`ScaleParams`]).
    pub fn new(_gpu: &Gpu, name: &str, p: &ScaleParams, layout: Layout) -> Self {
        GpuScale {
            layout,
            name: name.to_string(),
            axis: p.axis,
            num_axes: p.num_axes,
            bias_term: p.bias_term,
            view: (0, 0, 0),
            two_bottoms: false,
        }
    }

    /// Elements of the scale (and of the bias).
    fn dim(&self) -> usize {
        self.view.1
    }
}

impl GpuLayer for GpuScale {
    fn type_name(&self) -> &'static str {
        "scale"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        match bottoms {
            [x] if self.layout == Layout::Nhwc && self.axis == 1 && self.num_axes == 1 => {
                self.two_bottoms = false;
                self.view = Layout::Nhwc.channel_view(x);
            }
            [x] => {
                self.two_bottoms = false;
                self.view = channel_view(&self.name, x, self.axis, self.num_axes)?;
            }
            [x, s] => {
                self.two_bottoms = true;
                self.view = channel_view(&self.name, x, self.axis, s.len() as i64)?;
            }
            _ => {
                return Err(Error::net(
                    &self.name,
                    format!("takes 1 or 2 bottoms, got {}", bottoms.len()),
                ))
            }
        }
        Ok(())
    }

    fn forward(
        &mut self,
        gpu: &Gpu,
        _ctx: &GpuCtx<'_>,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        params: &CudaView<'_, f32>,
    ) -> Result<()> {
        let d = self.dim();
        let (_, _, inner) = self.view;
        let s = &gpu.compute;
        if self.two_bottoms {
            let [x, sc, y] = pick(blobs, [bottoms[0], bottoms[1], tops[0]]);
            let n = x.count();
            let bias = self.bias_term.then(|| params.slice(..d));
            gpu.kernels.channel_affine(
                s,
                &x.data(),
                Some(&sc.data()),
                bias.as_ref(),
                &mut y.data_mut(),
                n,
                (d, inner),
            )
        } else {
            let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
            let n = x.count();
            let scale = params.slice(..d);
            let bias = self.bias_term.then(|| params.slice(d..2 * d));
            gpu.kernels.channel_affine(
                s,
                &x.data(),
                Some(&scale),
                bias.as_ref(),
                &mut y.data_mut(),
                n,
                (d, inner),
            )
        }
    }

    fn backward(
        &mut self,
        gpu: &Gpu,
        _ctx: &GpuCtx<'_>,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        grads: &[Grad],
        params: &CudaView<'_, f32>,
        param_grad: Grad,
        param_diff: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let d = self.dim();
        let view = self.view;
        let (_, _, inner) = view;
        let s = &gpu.compute;
        let acc = param_grad.accumulate();
        let k = &gpu.kernels;
        if self.two_bottoms {
            let [x, sc, y] = pick(blobs, [bottoms[0], bottoms[1], tops[0]]);
            let n = x.count();
            let dy = y.diff();
            if self.bias_term {
                k.channel_reduce(
                    s,
                    &dy,
                    &dy,
                    false,
                    &mut param_diff.slice_mut(..d),
                    view,
                    acc,
                )?;
            }
            if grads[1].wanted() {
                k.channel_reduce(
                    s,
                    &dy,
                    &x.data(),
                    true,
                    &mut sc.diff_mut(),
                    view,
                    grads[1].accumulate(),
                )?;
            }
            if grads[0].wanted() {
                k.channel_scale_backward(
                    s,
                    &dy,
                    &sc.data(),
                    &mut x.diff_mut(),
                    n,
                    (d, inner),
                    grads[0].accumulate(),
                )?;
            }
        } else {
            let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
            let n = x.count();
            let dy = y.diff();
            if self.bias_term {
                // [Σ dy·x, Σ dy] in one pass.
                k.channel_reduce_pair(
                    s,
                    &dy,
                    &x.data(),
                    &mut param_diff.slice_mut(..2 * d),
                    view,
                    acc,
                )?;
            } else {
                k.channel_reduce(
                    s,
                    &dy,
                    &x.data(),
                    true,
                    &mut param_diff.slice_mut(..d),
                    view,
                    acc,
                )?;
            }
            if grads[0].wanted() {
                k.channel_scale_backward(
                    s,
                    &dy,
                    &params.slice(..d),
                    &mut x.diff_mut(),
                    n,
                    (d, inner),
                    grads[0].accumulate(),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    #[test]
    fn per_channel_with_bias_matches_cpu() {
        let gpu = gpu_or_skip!("per_channel_with_bias_matches_cpu");
        let case = LayerCase::new(
            "name = \"sc\"\ntype = \"scale\"\nbias_term = true",
            vec![vec![3, 4, 5, 6]],
        );
        check_against_cpu(&gpu, &case, 601);
    }

    #[test]
    fn over_two_axes_matches_cpu() {
        let gpu = gpu_or_skip!("over_two_axes_matches_cpu");
        let case = LayerCase::new(
            "name = \"sc\"\ntype = \"scale\"\nnum_axes = 2",
            vec![vec![2, 3, 4, 5]],
        );
        check_against_cpu(&gpu, &case, 602);
    }

    #[test]
    fn second_bottom_as_scale_matches_cpu() {
        let gpu = gpu_or_skip!("second_bottom_as_scale_matches_cpu");
        let case = LayerCase::new(
            "name = \"sc\"\ntype = \"scale\"",
            vec![vec![2, 3, 4, 4], vec![3]],
        );
        check_against_cpu(&gpu, &case, 603);
    }
}
