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

use super::{BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::ScaleParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};

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

/// Scale's and Bias's reading of their bottoms: `((outer, dim, inner), two_bottoms)`. One
/// bottom: the learned operand spans `axis .. axis + num_axes` of `x` (channels-last: the
/// channel axis, last in storage). Two: the second bottom is the operand, over as many axes as
/// it has.
pub(crate) fn operand_view(
    layer: &str,
    layout: Layout,
    (axis, num_axes): (usize, i64),
    bottoms: &[&[usize]],
) -> Result<((usize, usize, usize), bool)> {
    match bottoms {
        [x] if layout == Layout::Nhwc && axis == 1 && num_axes == 1 => {
            Ok((Layout::Nhwc.channel_view(x), false))
        }
        [x] => Ok((channel_view(layer, x, axis, num_axes)?, false)),
        [x, operand] => Ok((channel_view(layer, x, axis, operand.len() as i64)?, true)),
        _ => Err(Error::net(
            layer,
            format!("takes 1 or 2 bottoms, got {}", bottoms.len()),
        )),
    }
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
    /// Elements of the scale (and of the bias).
    fn dim(&self) -> usize {
        self.view.1
    }
}

impl BuildGpu for ScaleParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuScale {
            layout,
            name: name.to_string(),
            axis: self.axis,
            num_axes: self.num_axes,
            bias_term: self.bias_term,
            view: (0, 0, 0),
            two_bottoms: false,
        }))
    }
}

impl GpuLayer for GpuScale {
    fn type_name(&self) -> &'static str {
        "scale"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let axes = (self.axis, self.num_axes);
        (self.view, self.two_bottoms) = operand_view(&self.name, self.layout, axes, bottoms)?;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, params) = (pass.gpu, &pass.params);
        let d = self.dim();
        let (_, _, inner) = self.view;
        let s = &gpu.compute;
        if self.two_bottoms {
            let [x, sc, y] = pass.blobs.two_bottoms_top();
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
            let [x, y] = pass.blobs.bottom_top();
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

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (grads, param_diff) = (pass.grads, &mut pass.param_diff);
        let d = self.dim();
        let view = self.view;
        let (_, _, inner) = view;
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        let acc = pass.param_grad.accumulate();
        if self.two_bottoms {
            let [x, sc, y] = pass.blobs.two_bottoms_top();
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
            let [x, y] = pass.blobs.bottom_top();
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
                    &pass.params.slice(..d),
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
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        per_channel_with_bias_matches_cpu,
        "name = \"sc\"\ntype = \"scale\"\nbias_term = true",
        vec![vec![3, 4, 5, 6]],
        601
    );

    layer_matches_cpu!(
        over_two_axes_matches_cpu,
        "name = \"sc\"\ntype = \"scale\"\nnum_axes = 2",
        vec![vec![2, 3, 4, 5]],
        602
    );

    layer_matches_cpu!(
        second_bottom_as_scale_matches_cpu,
        "name = \"sc\"\ntype = \"scale\"",
        vec![vec![2, 3, 4, 4], vec![3]],
        603
    );
}
