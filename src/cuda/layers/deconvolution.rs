//! `GpuDeconvolution`: Caffe's transposed 2-D convolution on cuDNN, the device twin of
//! `crate::layers::deconvolution`.
//!
//! Shapes: bottom `(N, C, H, W)`, top `(N, K, OH, OW)` with `K = num_output` and
//! `OH = sh·(H − 1) + dh·(kh − 1) + 1 − 2·ph`, likewise `OW`. Learnable tensors, in order:
//! `weight (C, K/group, kh, kw)` and, when `bias_term`, `bias (K)`.
//!
//! The layer is the convolution from the top's shape to the bottom's run backwards, with the
//! weight as that convolution's KCRS filter (`C` outputs of `K/group` channels) and the same
//! descriptors and algorithm choice as the convolution layer (`ConvAlgos::choose`, as
//! `cluster.conv_algorithm` and `cluster.conv_exact` say), with the roles swapped:
//! forward `top = cudnnConvolutionBackwardData(w, bottom)` then the project's channel kernel
//! adds the bias; backward `dbottom (+)= cudnnConvolutionForward(dtop, w)`,
//! `dw (+)= cudnnConvolutionBackwardFilter(dtop, bottom)` and the bias gradient by the project's
//! channel sum of `dtop`. Everything runs on the compute stream.
//!
//! NCHW only: the layer does not run channels-last ([`crate::cuda::layout::runs_channels_last`]
//! is false for it), so under `cluster.gpu_layout = "nhwc"` the net gives it an NCHW copy of its
//! bottom and stores its top NCHW.

use super::convolution::{bias_gradient, empty_batch_param_gradient, fix_channels};
use super::{grow, nchw, one_bottom, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::DeconvolutionParams;
use crate::cuda::cudnn::{self, ConvAlgos, ConvGeometry, FilterDesc, TensorDesc};
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

/// The descriptors and algorithms of one bottom shape.
#[derive(Debug)]
struct Plan {
    bottom: [usize; 4],
    /// The top `(N, K, OH, OW)`: the input of the convolution run backwards.
    top: TensorDesc,
    /// The bottom `(N, C, H, W)`: that convolution's output.
    bot: TensorDesc,
    w: FilterDesc,
    algos: ConvAlgos,
}

/// Transposed convolution on cuDNN; see the module docs.
#[derive(Debug)]
pub struct GpuDeconvolution {
    name: String,
    params: DeconvolutionParams,
    /// Input channels, fixed by the first reshape.
    channels: Option<usize>,
    /// Plans by bottom shape; `current` indexes the one of the last reshape.
    plans: Vec<Plan>,
    current: usize,
    /// Bytes of scratch for the algorithms of every cached plan.
    workspace: CudaSlice<u8>,
}

impl BuildGpu for DeconvolutionParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        if layout != Layout::Nchw {
            return Err(Error::net(
                name,
                "deconvolution runs on NCHW blobs only (the net gives it an NCHW copy)",
            ));
        }
        gpu.cudnn()
            .map_err(|e| Error::Device(format!("layer `{name}` (deconvolution): {e}")))?;
        Ok(Box::new(GpuDeconvolution {
            name: name.to_string(),
            params: self.clone(),
            channels: None,
            plans: Vec::new(),
            current: 0,
            workspace: scratch(gpu, 1)?,
        }))
    }
}

impl GpuDeconvolution {
    fn weight_len(&self) -> usize {
        let p = &self.params.0;
        self.channels.unwrap_or(0) * (p.num_output / p.group) * p.kernel[0] * p.kernel[1]
    }
}

impl GpuLayer for GpuDeconvolution {
    fn type_name(&self) -> &'static str {
        "deconvolution"
    }

    /// One `(N, C, H, W)` bottom with the `C` of the first call (a multiple of `group`).
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom(&self.name, bottoms)?;
        let bottom @ [n, c, h, w] = nchw(&self.name, shape)?;
        let p = &self.params.0;
        fix_channels(&self.name, &mut self.channels, shape, p.group)?;
        if let Some(i) = self.plans.iter().position(|p| p.bottom == bottom) {
            self.current = i;
            return Ok(());
        }
        let no_output = || Error::net(&self.name, format!("`pad` leaves no output for {shape:?}"));
        let oh = self.params.out_size(0, h).ok_or_else(no_output)?;
        let ow = self.params.out_size(1, w).ok_or_else(no_output)?;
        let k = p.num_output;
        let dnn = gpu.cudnn()?;
        // cuDNN rejects empty tensors: an empty batch is described as one sample and skipped.
        let nd = n.max(1);
        let top = TensorDesc::new([nd, k, oh, ow], Layout::Nchw)?;
        let bot = TensorDesc::new([nd, c, h, w], Layout::Nchw)?;
        let wd = FilterDesc::new([c, k / p.group, p.kernel[0], p.kernel[1]], Layout::Nchw)?;
        let geometry = ConvGeometry {
            pad: p.pad,
            stride: p.stride,
            dilation: p.dilation,
            group: p.group,
        };
        let algos = ConvAlgos::choose(
            (dnn, &gpu.kernels),
            gpu.conv_algorithm,
            gpu.conv_exact,
            &top,
            &wd,
            geometry,
            &bot,
        )
        .map_err(|e| Error::Device(format!("layer `{}` (deconvolution): {e}", self.name)))?;
        grow(gpu, &mut self.workspace, algos.workspace)?;
        self.plans.push(Plan {
            bottom,
            top,
            bot,
            w: wd,
            algos,
        });
        self.current = self.plans.len() - 1;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (gpu, params) = (pass.gpu, &pass.params);
        let (wlen, k) = (self.weight_len(), self.params.0.num_output);
        let plan = &self.plans[self.current];
        if plan.bottom[0] == 0 {
            return Ok(());
        }
        let s = &gpu.compute;
        let [x, y] = pass.blobs.bottom_top();
        assert!(x.count() == plan.bot.count() && y.count() == plan.top.count());
        {
            let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, s);
            let weight = params.slice(..wlen);
            let (wp, _gw) = weight.device_ptr(s);
            let (xp, _gx) = x.data.device_ptr(s);
            let (yp, _gy) = y.data.device_ptr_mut(s);
            let bwd = &plan.algos.bwd_data;
            // SAFETY: x and y hold the elements of the plan's bottom and top descriptors (checked
            // above), the weight view the filter's, the workspace `bytes`; all on this device
            // and alive while the enqueued call reads them.
            unsafe {
                cudnn::conv_backward_data(
                    gpu.cudnn()?,
                    (&plan.w, wp),
                    (&plan.bot, xp),
                    (&bwd.conv, bwd.algo),
                    ws,
                    0.0,
                    (&plan.top, yp),
                )?;
            }
        }
        if self.params.0.bias_term {
            let b = params.slice(wlen..wlen + k);
            let (_, _, inner) = Layout::Nchw.channel_view(&y.shape);
            let n = y.count();
            gpu.kernels
                .channel_bias_inplace(s, &mut y.data_mut(), &b, n, (k, inner))?;
        }
        Ok(())
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad, params) = (pass.gpu, pass.grads[0], &pass.params);
        let (param_grad, param_diff) = (pass.param_grad, &mut pass.param_diff);
        let (wlen, k) = (self.weight_len(), self.params.0.num_output);
        let plan = &self.plans[self.current];
        let s = &gpu.compute;
        if plan.bottom[0] == 0 {
            return empty_batch_param_gradient(gpu, param_grad, param_diff);
        }
        let dnn = gpu.cudnn()?;
        let [x, y] = pass.blobs.bottom_top();
        if self.params.0.bias_term {
            let db = &mut param_diff.slice_mut(wlen..wlen + k);
            bias_gradient(gpu, s, y, Layout::Nchw, db, param_grad.accumulate())?;
        }
        let (ws, _gws) = cudnn::Workspace::of(&mut self.workspace, s);
        {
            let mut dw = param_diff.slice_mut(..wlen);
            let (dwp, _gdw) = dw.device_ptr_mut(s);
            let (dyp, _gdy) = y.diff.device_ptr(s);
            let (xp, _gx) = x.data.device_ptr(s);
            let filter = &plan.algos.bwd_filter;
            // SAFETY: as in forward; `dw` is the weight's range of the flat gradient.
            unsafe {
                cudnn::conv_backward_filter(
                    dnn,
                    (&plan.top, dyp),
                    (&plan.bot, xp),
                    (&filter.conv, filter.algo),
                    ws,
                    param_grad.beta(),
                    (&plan.w, dwp),
                )?;
            }
        }
        if grad.wanted() {
            let weight = params.slice(..wlen);
            let (wp, _gw) = weight.device_ptr(s);
            let (dyp, _gdy) = y.diff.device_ptr(s);
            let (dxp, _gdx) = x.diff.device_ptr_mut(s);
            let fwd = &plan.algos.fwd;
            // SAFETY: as in forward.
            unsafe {
                cudnn::conv_forward(
                    dnn,
                    (&plan.top, dyp),
                    (&plan.w, wp),
                    (&fwd.conv, fwd.algo),
                    ws,
                    grad.beta(),
                    (&plan.bot, dxp),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, layer_matches_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    layer_matches_cpu! {
        matches_cpu_stride_2_pad_1: "name = \"up\"\ntype = \"deconvolution\"\nnum_output = 4\nkernel_size = 4\nstride = 2\npad = 1", vec![vec![2, 3, 5, 6]], 851;
        matches_cpu_grouped_dilated_without_bias: "name = \"up\"\ntype = \"deconvolution\"\nnum_output = 6\nkernel_size = [3, 2]\nstride = [1, 2]\ndilation = [2, 1]\ngroup = 2\nbias_term = false", vec![vec![2, 4, 4, 5]], 852;
    }

    /// cuDNN's heuristic choice (no timing) computes the same transposed convolution.
    #[test]
    fn matches_cpu_with_heuristic_algorithms() {
        let mut gpu = gpu_or_skip!("matches_cpu_with_heuristic_algorithms");
        gpu.conv_algorithm = crate::config::ConvAlgorithm::Heuristic;
        let case = LayerCase::new(
            "name = \"up\"\ntype = \"deconvolution\"\nnum_output = 5\nkernel_size = 3\nstride = 3",
            vec![vec![3, 2, 4, 4]],
        );
        check_against_cpu(&gpu, &case, 853);
    }
}
