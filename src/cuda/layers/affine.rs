//! `GpuAffine`: the device body of Caffe's Scale and Bias layers (the files `scale` and `bias`
//! build it from their parameters): `y = x · s[d] + b[d]` over the view `(outer, dim, inner)` of
//! the bottom `x`, where `d` runs over the axes `axis .. axis + num_axes` (default 1 and 1: one
//! value per channel). Scale multiplies by `s` and, with `bias_term`, adds `b`; Bias only adds.
//! Channels-last blobs only with one value per channel: the view is then `(N·H·W, C, 1)`.
//!
//! One bottom: the layer's operands are learnable (`s` of shape `x.shape[axis .. axis +
//! num_axes]`, `num_axes = -1`: every axis from `axis`). Two bottoms: the second bottom is the
//! layer's first operand (`s` for Scale, `b` for Bias; shape `x.shape[axis .. axis + its
//! rank]`), not learnable, and gets a gradient like a bottom. Learnable tensors, in order: `s`
//! then `b`, of those the layer has and no bottom provides.
//!
//! Backward: `dx (+)= dy · s[d]` (Scale) or `dx (+)= dy` (Bias); `ds[d] (+)= Σ dy·x`,
//! `db[d] (+)= Σ dy` over `(outer, inner)` in double with fixed chunks and summation trees
//! (deterministic).

use super::{BackwardPass, ForwardPass, GpuLayer};
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

/// The Scale or Bias layer; see the module docs.
#[derive(Debug)]
pub struct GpuAffine {
    /// `scale` or `bias`.
    type_name: &'static str,
    name: String,
    axis: usize,
    num_axes: i64,
    /// Whether `x` is multiplied by `s` (Scale), and whether `b` is added (Bias, or Scale with
    /// `bias_term`).
    scales: bool,
    biases: bool,
    /// `(outer, dim, inner)` of the current bottom.
    view: (usize, usize, usize),
    /// How a 4-D bottom is stored (channels-last only over the channel axis alone).
    layout: Layout,
    /// Whether the first operand is the second bottom.
    two_bottoms: bool,
}

impl GpuAffine {
    /// The layer `name` of config name `type_name` (`scale` or `bias`), stored in `layout`:
    /// `scales` and `biases` say which operands it has, `(axis, num_axes)` the axes they span.
    pub(crate) fn new(
        (type_name, name): (&'static str, &str),
        (scales, biases): (bool, bool),
        (axis, num_axes): (usize, i64),
        layout: Layout,
    ) -> GpuAffine {
        GpuAffine {
            type_name,
            name: name.to_string(),
            axis,
            num_axes,
            scales,
            biases,
            view: (0, 0, 0),
            layout,
            two_bottoms: false,
        }
    }

    /// Offsets in the layer's parameters of the learned `s` and `b`; `None` for an operand the
    /// layer lacks or a bottom provides.
    fn learned(&self) -> (Option<usize>, Option<usize>) {
        let scale = (self.scales && !self.two_bottoms).then_some(0);
        let bias_is_bottom = self.two_bottoms && !self.scales;
        let bias = (self.biases && !bias_is_bottom).then_some(scale.map_or(0, |_| self.view.1));
        (scale, bias)
    }
}

impl GpuLayer for GpuAffine {
    fn type_name(&self) -> &'static str {
        self.type_name
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let axes = (self.axis, self.num_axes);
        (self.view, self.two_bottoms) = operand_view(&self.name, self.layout, axes, bottoms)?;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, params) = (pass.gpu, &pass.params);
        let (_, d, inner) = self.view;
        let (learned_scale, learned_bias) = self.learned();
        let (x, operand, y) = if self.two_bottoms {
            let [x, operand, y] = pass.blobs.two_bottoms_top();
            (x, Some(operand.data()), y)
        } else {
            let [x, y] = pass.blobs.bottom_top();
            (x, None, y)
        };
        let learned = |at: Option<usize>| at.map(|at| params.slice(at..at + d));
        let (scale, bias) = match operand {
            Some(o) if self.scales => (Some(o), learned(learned_bias)),
            Some(o) => (None, Some(o)),
            None => (learned(learned_scale), learned(learned_bias)),
        };
        let n = x.count();
        gpu.kernels.channel_affine(
            &gpu.compute,
            &x.data(),
            scale.as_ref(),
            bias.as_ref(),
            &mut y.data_mut(),
            n,
            (d, inner),
        )
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (grads, param_diff) = (pass.grads, &mut pass.param_diff);
        let view = self.view;
        let (_, d, inner) = view;
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        let acc = pass.param_grad.accumulate();
        let (x, mut operand, y) = if self.two_bottoms {
            let [x, operand, y] = pass.blobs.two_bottoms_top();
            (x, Some(operand), y)
        } else {
            let [x, y] = pass.blobs.bottom_top();
            (x, None, y)
        };
        let (n, dy) = (x.count(), y.diff());
        // The learned operands: [Σ dy·x, Σ dy] in one pass when both are.
        match self.learned() {
            (Some(_), Some(_)) => {
                let both = &mut param_diff.slice_mut(..2 * d);
                k.channel_reduce_pair(s, &dy, &x.data(), both, view, acc)?;
            }
            (Some(_), None) => {
                let ds = &mut param_diff.slice_mut(..d);
                k.channel_reduce(s, &dy, &x.data(), true, ds, view, acc)?;
            }
            (None, Some(_)) => {
                let db = &mut param_diff.slice_mut(..d);
                k.channel_reduce(s, &dy, &dy, false, db, view, acc)?;
            }
            (None, None) => {}
        }
        if let Some(o) = operand.as_mut().filter(|_| grads[1].wanted()) {
            let (acc, d_o) = (grads[1].accumulate(), &mut o.diff_mut());
            if self.scales {
                k.channel_reduce(s, &dy, &x.data(), true, d_o, view, acc)?;
            } else {
                k.channel_reduce(s, &dy, &dy, false, d_o, view, acc)?;
            }
        }
        if !grads[0].wanted() {
            return Ok(());
        }
        let (acc, dx) = (grads[0].accumulate(), &mut x.diff_mut());
        if !self.scales {
            return k.scaled_copy(s, &dy, dx, 1.0, n, acc);
        }
        let scale = match &operand {
            Some(o) => o.data(),
            None => pass.params.slice(..d),
        };
        k.channel_scale_backward(s, &dy, &scale, dx, n, (d, inner), acc)
    }
}
