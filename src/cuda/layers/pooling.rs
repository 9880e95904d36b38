//! `GpuPooling`: 2-D max and average pooling with Caffe's output sizes and divisor, the device
//! twin of `crate::layers::pooling`, on the project's own kernels (Caffe's pooling kernels):
//! cuDNN pools with floor output sizes and another average divisor, so it cannot match.
//!
//! Shapes: bottom `(N, C, H, W)`, top `(N, C, PH, PW)` with
//! `PH = ceil((H + 2·pad_h − kh) / stride_h) + 1`, minus one when `pad_h > 0` and the last
//! window would start at or beyond `H + pad_h`; likewise `PW`. `global_pooling`: the kernel is
//! the whole `H × W`, pad 0, stride 1.
//!
//! Max: one thread per top element keeps the window's maximum and its index (the first maximum
//! in row-major order wins); backward gives each bottom element the sum of the top diffs whose
//! index it is — no atomics, deterministic. Ave: the window sum divided by the window clipped to
//! `[−pad, size + pad)`; backward spreads `dy / pool_size` back the same way.
//!
//! Fused with a ReLU ([`fused_relu`], [`GpuPooling::with_relu`]; the net runs such a pair as one
//! layer where nothing else reads the blob between them, see `cuda::net::fusion`, saving the
//! ReLU's two passes over it): a max pooling followed by a ReLU (slope 0) — the two commute, so
//! the forward clamps each maximum at 0 and records no argmax for a clamped one, and the plain
//! backward then passes no gradient where the ReLU's derivative is 0; or a ReLU followed by an
//! average pooling — the forward averages the ReLU of each value it reads, the backward
//! multiplies each bottom gradient by the ReLU's derivative at the bottom's value. The same
//! operations in the same order as the two layers, so the same values (a clamped maximum is +0
//! where the pair writes −0).
//!
//! In mixed precision ([`GpuPooling::rounding_to`]) the kernels round what they read (the
//! bottom's values, the top's diffs) and what they write (the top, the bottom's diff), where the
//! CPU's pooling and fused ReLU round: the layer [`rounds_itself`](GpuLayer::rounds_itself) and
//! [`rounds_on_load`](GpuLayer::rounds_on_load), so that the net rounds neither its top nor the
//! diff it writes, nor the convolution's top it reads or the gradient on its way back to it.
//! A fused ReLU has slope 0 there (`cuda::net::fusion`), which keeps half-type values.
//!
//! On half-type blobs ([`GpuPooling::on_half_blobs`]: bottom and top stored as
//! [`Elem::Half`](crate::cuda::blob::Elem::Half), values and gradients) the kernels' half-type
//! twins read the bottom's values and the top's diffs as bit patterns, widened, and write the top
//! and the bottom's diff as the bit patterns of what they round (the diff after the addition to
//! what it held, in FP32): the numbers of the same layer on FP32 blobs. The argmax stays `int`.
//!
//! Bottom and top are both NCHW or both channels-last (the layer's layout); the kernels index
//! either, and the argmax is a pixel of its `(n, c)` plane in both. Backward, NCHW planes that
//! fit in shared memory run a "plane" kernel (a block per `(n, c)` plane at a time, the top
//! gradient plane staged in shared memory): for max pooling the "scatter" kernel, which adds each
//! top diff at its argmax in rounds ordered as the covering windows, for average pooling (and max
//! pooling whose windows overlap many times) one that loops over each pixel's covering windows
//! from per-row tables, several small planes per pass of a block so that each thread has a few
//! elements' loads in flight. Both compute the same sums in the same order as the generic
//! kernels: the choice changes speed only.

use super::{
    grow, nchw, one_bottom, scratch, BackwardPass, BlobElem, BuildGpu, ForwardPass, GpuLayer,
};
use crate::config::layer_params::{LayerParams, PoolingParams};
use crate::config::PoolMethod;
use crate::cuda::kernels::PoolGeom;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::net::NodeView;
use crate::precision::Half;
use cudarc::driver::CudaSlice;

/// Max or average pooling; see the module docs.
#[derive(Debug)]
pub struct GpuPooling {
    name: String,
    method: PoolMethod,
    global: bool,
    kernel: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    batch: usize,
    geom: PoolGeom,
    /// `(capacity ≥ N·C·PH·PW)` argmax plane indices of the last max forward.
    mask: CudaSlice<i32>,
    /// How bottom and top are stored (the kernels index either layout).
    layout: Layout,
    /// A ReLU that runs fused with the pooling.
    relu: Option<FusedRelu>,
    /// The half type of mixed precision whose rounding the kernels apply.
    half: Option<Half>,
    /// Whether the bottom and the top are stored in the half type.
    half_blobs: bool,
}

/// A ReLU fused with a pooling; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FusedRelu {
    /// After a max pooling, without a negative slope (with one, a clamped maximum would need its
    /// argmax after all).
    After,
    /// Before an average pooling, with its negative slope (≥ 0).
    Before(f32),
}

/// How the layers `chain` (two layers, the second reading the first's top, in net order) run as
/// one [`GpuPooling::with_relu`]: a max Pooling then a ReLU of slope 0, or a ReLU of slope ≥ 0
/// then an average Pooling; `None` for any other pair. The net checks the wiring (single
/// consumer, same phases).
pub fn fused_relu(chain: &[NodeView]) -> Option<FusedRelu> {
    match chain {
        [a, b] => match (a.params, b.params) {
            (LayerParams::Pooling(pool), LayerParams::Relu(relu)) => {
                (pool.method == PoolMethod::Max && relu.negative_slope == 0.0)
                    .then_some(FusedRelu::After)
            }
            (LayerParams::Relu(relu), LayerParams::Pooling(pool)) => {
                let s = relu.negative_slope;
                (pool.method == PoolMethod::Ave && s >= 0.0).then_some(FusedRelu::Before(s))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Caffe's pooled size of one axis.
pub(crate) fn pooled_size(size: usize, kernel: usize, stride: usize, pad: usize) -> usize {
    let span = (size + 2 * pad).saturating_sub(kernel);
    let mut out = span.div_ceil(stride) + 1;
    if pad > 0 && (out - 1) * stride >= size + pad {
        out -= 1;
    }
    out
}

fn int(name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::net(name, format!("pooling size {v} exceeds int")))
}

impl GpuPooling {
    /// The pooling `name` with parameters `p`.
    pub fn new(gpu: &Gpu, name: &str, p: &PoolingParams, layout: Layout) -> Result<Self> {
        Ok(GpuPooling {
            name: name.to_string(),
            method: p.method,
            global: p.global,
            kernel: p.kernel,
            stride: p.stride,
            pad: p.pad,
            batch: 0,
            geom: PoolGeom::default(),
            mask: scratch(gpu, 1)?,
            layout,
            relu: None,
            half: None,
            half_blobs: false,
        })
    }

    /// The same layer rounding to `half` in its kernels (see the module docs).
    pub fn rounding_to(mut self, half: Option<Half>) -> Self {
        self.half = half;
        self
    }

    /// The same layer on half-type blobs (its bottom and top stored as
    /// [`Elem::Half`](crate::cuda::blob::Elem::Half)) where `yes`; needs [`Self::rounding_to`]
    /// a half type first.
    pub fn on_half_blobs(mut self, yes: bool) -> Self {
        assert!(
            !yes || self.half.is_some(),
            "pooling on half-type blobs needs the half type"
        );
        self.half_blobs = yes;
        self
    }

    /// The pair `chain` (checked by [`fused_relu`]) as one layer: its pooling with its ReLU.
    pub fn with_relu(gpu: &Gpu, chain: &[NodeView], layout: Layout) -> Result<Self> {
        let relu = fused_relu(chain).expect("a fusable Pooling and ReLU pair");
        let pool = match relu {
            FusedRelu::After => chain[0],
            FusedRelu::Before(_) => chain[1],
        };
        let LayerParams::Pooling(params) = pool.params else {
            unreachable!("fused_relu found a pooling");
        };
        let mut layer = GpuPooling::new(gpu, pool.name, params, layout)?;
        layer.relu = Some(relu);
        Ok(layer)
    }

    /// The slope of a ReLU fused before an average pooling.
    fn relu_before(&self) -> Option<f32> {
        match self.relu {
            Some(FusedRelu::Before(slope)) => Some(slope),
            _ => None,
        }
    }
}

impl BuildGpu for PoolingParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuPooling::new(gpu, name, self, layout)?))
    }
}

impl GpuLayer for GpuPooling {
    /// The maximum of half-type values is one of them.
    fn forward_keeps_half(&self) -> bool {
        self.method == PoolMethod::Max
    }

    fn rounds_itself(&self) -> bool {
        self.half.is_some()
    }

    fn rounds_on_load(&self) -> bool {
        self.half.is_some()
    }

    fn type_name(&self) -> &'static str {
        match self.relu {
            None => "pooling",
            Some(FusedRelu::After) => "pooling+relu",
            Some(FusedRelu::Before(_)) => "relu+pooling",
        }
    }

    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom(&self.name, bottoms)?;
        let [n, c, h, w] = nchw(&self.name, shape)?;
        let (kernel, stride, pad) = if self.global {
            ([h, w], [1, 1], [0, 0])
        } else {
            (self.kernel, self.stride, self.pad)
        };
        let ph = pooled_size(h, kernel[0], stride[0], pad[0]);
        let pw = pooled_size(w, kernel[1], stride[1], pad[1]);
        let name = &self.name;
        self.geom = PoolGeom {
            channels: int(name, c)?,
            height: int(name, h)?,
            width: int(name, w)?,
            pooled_h: int(name, ph)?,
            pooled_w: int(name, pw)?,
            kernel_h: int(name, kernel[0])?,
            kernel_w: int(name, kernel[1])?,
            stride_h: int(name, stride[0])?,
            stride_w: int(name, stride[1])?,
            pad_h: int(name, pad[0])?,
            pad_w: int(name, pad[1])?,
            nhwc: (self.layout == Layout::Nhwc) as i32,
            half: 0,
        }
        .rounding_to(self.half);
        self.batch = n;
        if self.method == PoolMethod::Max {
            grow(gpu, &mut self.mask, n * c * ph * pw)?;
        }
        Ok(())
    }

    fn forward(&mut self, pass: ForwardPass<'_>) -> Result<()> {
        if self.half_blobs {
            self.forward_as::<u16>(pass)
        } else {
            self.forward_as::<f32>(pass)
        }
    }

    fn backward(&mut self, pass: BackwardPass<'_>) -> Result<()> {
        if self.half_blobs {
            self.backward_as::<u16>(pass)
        } else {
            self.backward_as::<f32>(pass)
        }
    }
}

impl GpuPooling {
    /// Forward on blobs stored as `T`.
    fn forward_as<T: BlobElem>(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [x, y] = pass.blobs.bottom_top();
        let s = &gpu.compute;
        match self.method {
            PoolMethod::Max => gpu.kernels.max_pool_forward(
                s,
                &T::data(x),
                &mut T::data_mut(y),
                &mut self.mask,
                self.batch,
                self.geom,
                self.relu == Some(FusedRelu::After),
            ),
            PoolMethod::Ave => gpu.kernels.ave_pool_forward(
                s,
                &T::data(x),
                &mut T::data_mut(y),
                self.batch,
                self.geom,
                self.relu_before(),
            ),
        }
    }

    /// Backward on blobs stored as `T`.
    fn backward_as<T: BlobElem>(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad) = (pass.gpu, pass.grads[0]);
        if !grad.wanted() {
            return Ok(());
        }
        let [x, y] = pass.blobs.bottom_top();
        let s = &gpu.compute;
        let acc = grad.accumulate();
        match self.method {
            PoolMethod::Max => gpu.kernels.max_pool_backward(
                s,
                &T::diff(y),
                &self.mask,
                &mut T::diff_mut(x),
                self.batch,
                self.geom,
                acc,
            ),
            PoolMethod::Ave => {
                let (data, mut dx) = T::data_and_diff_mut(x);
                let relu = self.relu_before().map(|slope| (&data, slope));
                let (batch, geom) = (self.batch, self.geom);
                gpu.kernels
                    .ave_pool_backward(s, &T::diff(y), &mut dx, batch, geom, acc, relu)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pooled_size, GpuPooling};
    use crate::config::layer_params::LayerParams;
    use crate::config::Phase;
    use crate::cuda::kernels::launched;
    use crate::cuda::layers::testing::{
        check_against_cpu, half_blobs_match_fp32_blobs, layer_matches_cpu, net_of, HalfBlobsCase,
        LayerCase,
    };
    use crate::cuda::layers::{build, GpuLayer, Grad};
    use crate::cuda::layout::Layout;
    use crate::cuda::test_util::gpu_or_skip;
    use crate::cuda::Gpu;
    use crate::precision::Half;

    fn case(extra: &str, bottom: &[usize]) -> LayerCase {
        LayerCase::new(
            &format!("name = \"pool\"\ntype = \"pooling\"\n{extra}"),
            vec![bottom.to_vec()],
        )
    }

    /// Runs without a GPU: Caffe's ceil rule and its correction for padding.
    #[test]
    fn pooled_size_follows_caffe() {
        assert_eq!(pooled_size(6, 3, 2, 0), 3); // ceil(3/2) + 1
        assert_eq!(pooled_size(7, 3, 2, 0), 3);
        assert_eq!(pooled_size(5, 2, 2, 1), 3); // ceil(5/2) + 1 = 4, last starts at 6 ≥ 6: 3
        assert_eq!(pooled_size(4, 4, 1, 0), 1);
        assert_eq!(pooled_size(112, 3, 2, 1), 57); // ceil(111/2) + 1; 56·2 < 113 keeps it
    }

    layer_matches_cpu! {
        max_matches_cpu_with_ceil_sizes: "name = \"pool\"\ntype = \"pooling\"\nkernel_size = 3\nstride = 2", vec![vec![2, 3, 8, 7]], 401;
        max_matches_cpu_padded_rectangular: "name = \"pool\"\ntype = \"pooling\"\nkernel_size = [3, 2]\nstride = [2, 1]\npad = [1, 1]", vec![vec![2, 4, 9, 6]], 402;
        ave_matches_cpu_padded: "name = \"pool\"\ntype = \"pooling\"\npool = \"ave\"\nkernel_size = 3\nstride = 2\npad = 1", vec![vec![2, 3, 7, 7]], 403;
        ave_matches_cpu_overlapping_unpadded: "name = \"pool\"\ntype = \"pooling\"\npool = \"ave\"\nkernel_size = 3\nstride = 2", vec![vec![3, 2, 8, 9]], 404;
        // Three windows cover a pixel along each axis: channels-last, max pooling's backward
        // takes its covering-window loop rather than the 2 x 2 case of the cases above.
        max_matches_cpu_with_three_windows_a_pixel: "name = \"pool\"\ntype = \"pooling\"\nkernel_size = 3\nstride = 1", vec![vec![2, 3, 6, 7]], 410;
    }

    /// NCHW backward runs a plane kernel when a plane fits in shared memory (every case above:
    /// the scatter kernel for max pooling, the covering-window one for averages and global max
    /// pooling); a 160 × 160 plane does not, and takes the generic kernel.
    #[test]
    fn max_and_ave_match_cpu_on_planes_beyond_shared_memory() {
        let gpu = gpu_or_skip!("max_and_ave_match_cpu_on_planes_beyond_shared_memory");
        let big = [1, 2, 160, 160];
        check_against_cpu(&gpu, &case("kernel_size = 3\nstride = 2", &big), 407);
        check_against_cpu(
            &gpu,
            &case("pool = \"ave\"\nkernel_size = 3\nstride = 2\npad = 1", &big),
            408,
        );
    }

    // 111 planes of 8 × 8: the average's plane kernel takes them four at a time, the last
    // pass three.
    layer_matches_cpu!(
        ave_matches_cpu_over_many_planes_in_passes,
        "name = \"pool\"\ntype = \"pooling\"\npool = \"ave\"\nkernel_size = 3\nstride = 2",
        vec![vec![3, 37, 8, 8]],
        409
    );

    /// Max-pooling windows with nothing above −FLT_MAX (all −inf, NaN beside −inf) give −FLT_MAX
    /// and pass no gradient, on the GPU as on the CPU (Caffe's mask −1); a NaN beside a number
    /// loses to it. The backward's scatter and covering-window kernels both meet such windows.
    #[test]
    fn max_of_windows_without_numbers_matches_cpu() {
        let gpu = gpu_or_skip!("max_of_windows_without_numbers_matches_cpu");
        let shape = [2, 3, 4, 4];
        let mut x = crate::layers::gradient_check::uniform_blob(&shape, -2.0, 2.0, 411).data;
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        // Top-left 2 × 2 windows of planes 0, 1 and 2 (then every plane of sample 1 likewise).
        for (plane, values) in [
            (0, [-inf, -inf, -inf, -inf]),
            (1, [nan, -inf, -inf, nan]),
            (2, [nan, -inf, 1.5, nan]),
        ] {
            for sample in 0..2 {
                let base = (sample * 3 + plane) * 16;
                for (i, v) in values.into_iter().enumerate() {
                    x[base + (i / 2) * 4 + i % 2] = v;
                }
            }
        }
        for keys in ["kernel_size = 2\nstride = 2", "kernel_size = 2\nstride = 1"] {
            let mut c = case(keys, &shape);
            c.fixed = Some((x.clone(), Vec::new()));
            check_against_cpu(&gpu, &c, 412);
        }
    }

    #[test]
    fn global_ave_and_max_match_cpu() {
        let gpu = gpu_or_skip!("global_ave_and_max_match_cpu");
        check_against_cpu(
            &gpu,
            &case("pool = \"ave\"\nglobal_pooling = true", &[4, 5, 6, 6]),
            405,
        );
        check_against_cpu(&gpu, &case("global_pooling = true", &[4, 5, 3, 7]), 406);
    }

    /// Where a ReLU runs with the pooling in [`half_blobs_match_fp32_blobs_in`]'s nets.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Relu {
        None,
        /// After a max pooling, or before an average pooling.
        Fused,
    }

    /// The pooling `keys` (max, or average where `ave`), alone or fused with its ReLU, on
    /// bottoms of `shape` stored in `layout`: on FP32 blobs and on half-type blobs, the same
    /// bits.
    #[allow(clippy::too_many_arguments)]
    fn half_blobs_match_fp32_blobs_in(
        gpu: &Gpu,
        shape: [usize; 4],
        keys: &str,
        ave: bool,
        relu: Relu,
        layout: Layout,
        half: Half,
        seed: u64,
    ) {
        let [n, c, h, w] = shape;
        let method = if ave { "ave" } else { "max" };
        let table = |name: &str, kind: &str, bottom: &str, top: &str, keys: &str| {
            format!(
                "[[layer]]\nname = \"{name}\"\ntype = \"{kind}\"\nbottom = [\"{bottom}\"]\n\
                 top = [\"{top}\"]\n{keys}\n\n"
            )
        };
        let pool_keys = format!("pool = \"{method}\"\n{keys}");
        // The chain's last top is `pool`; a classifier and its loss read it.
        let chain = match (relu, ave) {
            (Relu::None, _) => table("pool", "pooling", "data", "pool", &pool_keys),
            (Relu::Fused, false) => {
                table("pool", "pooling", "data", "pool", &pool_keys)
                    + &table("relu", "relu", "pool", "pool", "")
            }
            (Relu::Fused, true) => {
                table("relu", "relu", "data", "rectified", "")
                    + &table("pool", "pooling", "rectified", "pool", &pool_keys)
            }
        };
        let classifier = table("ip", "inner_product", "pool", "ip", "num_output = 10")
            + "[[layer]]\nname = \"loss\"\ntype = \"softmax_with_loss\"\n\
               bottom = [\"ip\", \"label\"]\ntop = [\"loss\"]\n";
        let (graph, _) = net_of(&(chain + &classifier), [c, h, w]);
        let pool_node = (0..graph.len())
            .map(|i| graph.node(i))
            .find(|node| node.name == "pool")
            .unwrap();
        let LayerParams::Pooling(p) = pool_node.params else {
            unreachable!("the pooling layer");
        };
        let (kernel, stride, pad) = if p.global {
            ([h, w], [1, 1], [0, 0])
        } else {
            (p.kernel, p.stride, p.pad)
        };
        let top = [
            n,
            c,
            pooled_size(h, kernel[0], stride[0], pad[0]),
            pooled_size(w, kernel[1], stride[1], pad[1]),
        ];
        let case = HalfBlobsCase {
            what: format!("{shape:?} `{pool_keys}`, ReLU {relu:?}, {layout:?}, {half:?}"),
            half,
            phase: Phase::Train,
            bottoms: vec![shape.to_vec()],
            tops: vec![top.to_vec()],
            params: Vec::new(),
            backward: vec![
                (vec![Grad::Accumulate], Grad::Accumulate),
                (vec![Grad::Overwrite], Grad::Overwrite),
            ],
            seed,
        };
        launched::take();
        half_blobs_match_fp32_blobs(gpu, &case, |half_blobs| match relu {
            Relu::None => build(
                gpu,
                "pool",
                pool_node.params,
                &[&shape],
                layout,
                Some(half),
                half_blobs,
            )
            .unwrap(),
            Relu::Fused => {
                let nodes = [graph.node(0), graph.node(1)];
                let layer = GpuPooling::with_relu(gpu, &nodes, layout)
                    .unwrap()
                    .rounding_to(Some(half))
                    .on_half_blobs(half_blobs);
                let mut layer: Box<dyn GpuLayer> = Box::new(layer);
                layer.reshape(gpu, &[&shape]).unwrap();
                layer
            }
        });
        // Max pooling's half-type blobs take the `_h8` kernels exactly where they can (the FP32
        // blobs never).
        let launched = launched::take();
        let by_eight = !ave && layout == Layout::Nhwc && c % 8 == 0;
        for kernel in ["max_pool_forward_h8", "max_pool_backward_h8"] {
            assert_eq!(
                launched.contains(kernel),
                by_eight,
                "{kernel} launched for {}",
                case.what
            );
        }
    }

    /// On half-type blobs max and average pooling, alone and fused with their ReLU, compute,
    /// bit for bit, what they compute on FP32 blobs in mixed precision from the same half-type
    /// values: the top and the bottom gradient, accumulated and overwritten, in both half types.
    /// Channels-last takes the generic kernels, and for max pooling over a multiple of 8
    /// channels (16 and 24 here) on half-type blobs the `_h8` ones; NCHW the plane kernels — the
    /// scatter kernel for max pooling of 3 × 3 windows by 2, the covering-window one for averages
    /// and for max pooling whose windows overlap 16 times — and, on 160 × 160 planes, beyond
    /// shared memory, the generic ones.
    #[test]
    fn half_blobs_match_rounded_fp32_blobs() {
        let gpu = gpu_or_skip!("half_blobs_match_rounded_fp32_blobs");
        let cases = [
            ([2, 3, 9, 7], "kernel_size = 3\nstride = 2\npad = 1"),
            ([2, 3, 8, 8], "kernel_size = 4\nstride = 1"),
            ([1, 2, 160, 160], "kernel_size = 3\nstride = 2"),
            ([2, 16, 9, 7], "kernel_size = 3\nstride = 2\npad = 1"),
            ([1, 24, 8, 8], "kernel_size = 4\nstride = 1"),
        ];
        let mut seed = 2400;
        for half in [Half::Bf16, Half::Fp16] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                for (shape, keys) in cases {
                    for ave in [false, true] {
                        for relu in [Relu::None, Relu::Fused] {
                            seed += 10;
                            half_blobs_match_fp32_blobs_in(
                                &gpu, shape, keys, ave, relu, layout, half, seed,
                            );
                        }
                    }
                }
            }
        }
    }
}
