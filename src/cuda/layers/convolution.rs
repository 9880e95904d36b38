//! `GpuConvolution`: 2-D convolution (Caffe's cross-correlation) on cuDNN, the device twin of
//! `crate::layers::convolution`.
//!
//! Shapes: bottom `(N, C, H, W)`, top `(N, K, OH, OW)` with `K = num_output` and
//! `OH = (H + 2·pad_h − (dilation_h·(kh − 1) + 1)) / stride_h + 1` (floor), likewise `OW`.
//! Learnable tensors, in order: `weight (K, C/group, kh, kw)` and, when `bias_term`, `bias (K)`
//! — cuDNN's KCRS filter layout, so the flat parameters are used as they are.
//!
//! Forward: `cudnnConvolutionForward` (β = 0) then `cudnnAddTensor` for the bias.
//! Backward: `cudnnConvolutionBackwardBias` and `cudnnConvolutionBackwardFilter` into the
//! parameter gradient (β = 1 to accumulate, 0 to overwrite), `cudnnConvolutionBackwardData`
//! into the bottom's diff (likewise). Groups through `cudnnSetConvolutionGroupCount`.
//!
//! Descriptors and algorithms are made per bottom shape and cached (train and test batches
//! differ), with one workspace for the layer sized for the largest choice; see
//! [`crate::cuda::cudnn`] for how algorithms are chosen in each math mode.

use super::{grow, nchw, pick, scratch, GpuCtx, GpuLayer, Grad};
use crate::config::LayerConfig;
use crate::cuda::blob::GpuBlob;
use crate::cuda::cudnn::{self, ConvAlgos, ConvDesc, ConvGeometry, FilterDesc, TensorDesc};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

/// The descriptors and algorithms of one bottom shape.
#[derive(Debug)]
struct Plan {
    bottom: [usize; 4],
    x: TensorDesc,
    y: TensorDesc,
    w: FilterDesc,
    b: TensorDesc,
    conv: ConvDesc,
    algos: ConvAlgos,
}

/// 2-D convolution on cuDNN; see the module docs.
#[derive(Debug)]
pub struct GpuConvolution {
    name: String,
    num_output: usize,
    bias_term: bool,
    kernel: [usize; 2],
    geometry: ConvGeometry,
    /// Input channels, fixed by the first reshape.
    channels: Option<usize>,
    /// Plans by bottom shape; `current` indexes the one of the last reshape.
    plans: Vec<Plan>,
    current: usize,
    /// Bytes of scratch for the algorithms of every cached plan.
    workspace: CudaSlice<u8>,
}

/// The value per spatial axis `[h, w]` of an optional `Dims` key, `default` when absent.
fn dims2(
    cfg: &LayerConfig,
    key: &str,
    v: &Option<crate::config::Dims>,
    default: usize,
) -> Result<[usize; 2]> {
    match v {
        None => Ok([default; 2]),
        Some(d) => match d.per_axis(2) {
            Some(v) => Ok([v[0], v[1]]),
            None => Err(Error::net(
                &cfg.name,
                format!("`{key}` must give one value or one per spatial axis (2)"),
            )),
        },
    }
}

impl GpuConvolution {
    /// Reads `num_output` (> 0), `kernel_size` (required), `stride` (1), `pad` (0),
    /// `dilation` (1), `group` (1) and `bias_term` (true). Loads cuDNN (an error naming the
    /// library where it is missing).
    pub fn new(gpu: &Gpu, cfg: &LayerConfig) -> Result<Self> {
        let num_output = match cfg.num_output {
            Some(n) if n > 0 => n,
            _ => return Err(Error::net(&cfg.name, "`num_output` must be positive")),
        };
        if cfg.kernel_size.is_none() {
            return Err(Error::net(&cfg.name, "`kernel_size` is required"));
        }
        let kernel = dims2(cfg, "kernel_size", &cfg.kernel_size, 1)?;
        let stride = dims2(cfg, "stride", &cfg.stride, 1)?;
        let pad = dims2(cfg, "pad", &cfg.pad, 0)?;
        let dilation = dims2(cfg, "dilation", &cfg.dilation, 1)?;
        let group = cfg.group.unwrap_or(1);
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) || group == 0 {
            return Err(Error::net(
                &cfg.name,
                "`kernel_size`, `stride`, `dilation` and `group` must be positive",
            ));
        }
        if num_output % group != 0 {
            return Err(Error::net(
                &cfg.name,
                format!("`num_output` {num_output} is not a multiple of `group` {group}"),
            ));
        }
        // A missing cuDNN is the machine's problem, not the config's: a runtime error (exit 1)
        // that names the library and the layer.
        gpu.cudnn()
            .map_err(|e| Error::Comm(format!("layer `{}` (convolution): {e}", cfg.name)))?;
        Ok(GpuConvolution {
            name: cfg.name.clone(),
            num_output,
            bias_term: cfg.bias_term.unwrap_or(true),
            kernel,
            geometry: ConvGeometry {
                pad,
                stride,
                dilation,
                group,
            },
            channels: None,
            plans: Vec::new(),
            current: 0,
            workspace: scratch(gpu, 1)?,
        })
    }

    fn weight_len(&self) -> usize {
        let c = self.channels.unwrap_or(0);
        self.num_output * (c / self.geometry.group) * self.kernel[0] * self.kernel[1]
    }

    /// The output size of one spatial axis, or an error when the kernel does not fit.
    fn out_size(&self, axis: usize, size: usize) -> Result<usize> {
        let g = &self.geometry;
        let extent = g.dilation[axis] * (self.kernel[axis] - 1) + 1;
        let padded = size + 2 * g.pad[axis];
        if padded < extent {
            return Err(Error::net(
                &self.name,
                format!("the kernel extent {extent} exceeds the padded input {padded}"),
            ));
        }
        Ok((padded - extent) / g.stride[axis] + 1)
    }
}

impl GpuLayer for GpuConvolution {
    fn type_name(&self) -> &'static str {
        "convolution"
    }

    /// One `(N, C, H, W)` bottom with the `C` of the first call (a multiple of `group`).
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let [shape] = bottoms else {
            return Err(Error::net(
                &self.name,
                format!("takes 1 bottom, got {}", bottoms.len()),
            ));
        };
        let bottom = nchw(&self.name, shape)?;
        let [n, c, h, w] = bottom;
        match self.channels {
            Some(c0) if c0 != c => {
                return Err(Error::net(
                    &self.name,
                    format!("bottom {shape:?} has {c} channels, the weight expects {c0}"),
                ))
            }
            _ if c % self.geometry.group != 0 => {
                return Err(Error::net(
                    &self.name,
                    format!(
                        "{c} input channels are not a multiple of `group` {}",
                        self.geometry.group
                    ),
                ))
            }
            _ => self.channels = Some(c),
        }
        if let Some(i) = self.plans.iter().position(|p| p.bottom == bottom) {
            self.current = i;
            return Ok(());
        }
        let (oh, ow) = (self.out_size(0, h)?, self.out_size(1, w)?);
        let k = self.num_output;
        let dnn = gpu.cudnn()?;
        // cuDNN rejects empty tensors: an empty batch is described as one sample and skipped.
        let nd = n.max(1);
        let x = TensorDesc::new([nd, c, h, w])?;
        let y = TensorDesc::new([nd, k, oh, ow])?;
        let wd = FilterDesc::new([k, c / self.geometry.group, self.kernel[0], self.kernel[1]])?;
        let b = TensorDesc::new([1, k, 1, 1])?;
        let conv = ConvDesc::new(self.geometry, gpu.math)?;
        let algos = ConvAlgos::choose(dnn, &x, &wd, &conv, &y)
            .map_err(|e| Error::Comm(format!("layer `{}` (convolution): {e}", self.name)))?;
        grow(gpu, &mut self.workspace, algos.workspace)?;
        self.plans.push(Plan {
            bottom,
            x,
            y,
            w: wd,
            b,
            conv,
            algos,
        });
        self.current = self.plans.len() - 1;
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
        let wlen = self.weight_len();
        let k = self.num_output;
        let plan = &self.plans[self.current];
        if plan.bottom[0] == 0 {
            return Ok(());
        }
        let dnn = gpu.cudnn()?;
        let s = &gpu.compute;
        let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
        assert!(x.count() == plan.x.count() && y.count() == plan.y.count());
        let w = params.slice(..wlen);
        let (xp, _gx) = x.data.device_ptr(s);
        let (yp, _gy) = y.data.device_ptr_mut(s);
        let (wp, _gw) = w.device_ptr(s);
        let bytes = self.workspace.len();
        let (wsp, _gws) = self.workspace.device_ptr_mut(s);
        let ws = cudnn::Workspace { ptr: wsp, bytes };
        // SAFETY: x and y hold the elements of their descriptors (asserted above), w the
        // weight's, the workspace `bytes` bytes; all on this device and alive while enqueued
        // work reads them (the net owns them).
        unsafe {
            cudnn::conv_forward(
                dnn,
                (&plan.x, xp),
                (&plan.w, wp),
                &plan.conv,
                plan.algos.fwd,
                ws,
                0.0,
                (&plan.y, yp),
            )?;
        }
        if self.bias_term {
            let b = params.slice(wlen..wlen + k);
            let (bp, _gb) = b.device_ptr(s);
            // SAFETY: b holds K floats, y its descriptor's elements.
            unsafe { cudnn::add_bias(dnn, (&plan.b, bp), (&plan.y, yp))? };
        }
        Ok(())
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
        let wlen = self.weight_len();
        let k = self.num_output;
        let beta = param_grad.beta();
        let plan = &self.plans[self.current];
        let s = &gpu.compute;
        if plan.bottom[0] == 0 {
            // No samples: the gradient of the parameters is zero.
            if !param_grad.accumulate() {
                let n = param_diff.len();
                gpu.kernels.fill(s, param_diff, 0.0, n)?;
            }
            return Ok(());
        }
        let dnn = gpu.cudnn()?;
        let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
        let bytes = self.workspace.len();
        let (wsp, _gws) = self.workspace.device_ptr_mut(s);
        let ws = cudnn::Workspace { ptr: wsp, bytes };
        let (dyp, _gdy) = y.diff.device_ptr(s);
        if self.bias_term {
            let mut db = param_diff.slice_mut(wlen..wlen + k);
            let (dbp, _gdb) = db.device_ptr_mut(s);
            // SAFETY: dy holds the top's elements, db K floats.
            unsafe { cudnn::bias_grad(dnn, (&plan.y, dyp), beta, (&plan.b, dbp))? };
        }
        {
            let (xp, _gx) = x.data.device_ptr(s);
            let mut dw = param_diff.slice_mut(..wlen);
            let (dwp, _gdw) = dw.device_ptr_mut(s);
            // SAFETY: x, dy and dw hold their descriptors' elements; workspace as in forward.
            unsafe {
                cudnn::conv_backward_filter(
                    dnn,
                    (&plan.x, xp),
                    (&plan.y, dyp),
                    &plan.conv,
                    plan.algos.bwd_filter,
                    ws,
                    beta,
                    (&plan.w, dwp),
                )?;
            }
        }
        if grads[0].wanted() {
            let w = params.slice(..wlen);
            let (wp, _gw) = w.device_ptr(s);
            let (dxp, _gdx) = x.diff.device_ptr_mut(s);
            // SAFETY: as above; dx holds the bottom's elements.
            unsafe {
                cudnn::conv_backward_data(
                    dnn,
                    (&plan.w, wp),
                    (&plan.y, dyp),
                    &plan.conv,
                    plan.algos.bwd_data,
                    ws,
                    grads[0].beta(),
                    (&plan.x, dxp),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::MathMode;
    use crate::cuda::layers::testing::{check_against_cpu, check_against_cpu_rtol, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    fn case(extra: &str, bottom: &[usize]) -> LayerCase {
        LayerCase::new(
            &format!("name = \"conv\"\ntype = \"convolution\"\n{extra}"),
            vec![bottom.to_vec()],
        )
    }

    #[test]
    fn matches_cpu_3x3_pad_1() {
        let gpu = gpu_or_skip!("matches_cpu_3x3_pad_1");
        check_against_cpu(
            &gpu,
            &case("num_output = 8\nkernel_size = 3\npad = 1", &[2, 3, 9, 9]),
            301,
        );
    }

    #[test]
    fn matches_cpu_strided_without_bias() {
        let gpu = gpu_or_skip!("matches_cpu_strided_without_bias");
        check_against_cpu(
            &gpu,
            &case(
                "num_output = 5\nkernel_size = [3, 2]\nstride = [2, 1]\npad = [0, 1]\nbias_term = false",
                &[3, 4, 11, 8],
            ),
            302,
        );
    }

    #[test]
    fn matches_cpu_dilated() {
        let gpu = gpu_or_skip!("matches_cpu_dilated");
        check_against_cpu(
            &gpu,
            &case(
                "num_output = 6\nkernel_size = 3\ndilation = 2\npad = 2",
                &[2, 3, 10, 10],
            ),
            303,
        );
    }

    #[test]
    fn matches_cpu_grouped() {
        let gpu = gpu_or_skip!("matches_cpu_grouped");
        check_against_cpu(
            &gpu,
            &case(
                "num_output = 6\nkernel_size = 3\ngroup = 3\nstride = 2\npad = 1",
                &[2, 6, 9, 7],
            ),
            304,
        );
    }

    #[test]
    fn matches_cpu_1x1_at_cnn_size() {
        let gpu = gpu_or_skip!("matches_cpu_1x1_at_cnn_size");
        check_against_cpu(
            &gpu,
            &case("num_output = 64\nkernel_size = 1", &[8, 32, 16, 16]),
            305,
        );
    }

    /// TF32 tensor cores round the inputs to 10 mantissa bits: agreement to about 1e-3.
    #[test]
    fn matches_cpu_in_tf32_within_its_precision() {
        let gpu = gpu_or_skip!("matches_cpu_in_tf32_within_its_precision", MathMode::Tf32);
        check_against_cpu_rtol(
            &gpu,
            &case("num_output = 16\nkernel_size = 3\npad = 1", &[4, 8, 12, 12]),
            306,
            5e-3,
        );
    }
}
