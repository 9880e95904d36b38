//! A measurement, not a check (hence `#[ignore]`): for every convolution shape of cifar10_quick
//! at batch 512 and of ResNet-50 at batch 64, the best time cuDNN's own benchmark
//! (`cudnnFind*`) gives each direction in NCHW and NHWC under each math type, any algorithm and
//! deterministic ones only, with per-net totals — the figures behind the layout and algorithm
//! choices in docs/benchmarks.md. Run on a GPU machine with
//! `p2ptrain-unittests --ignored --nocapture cudnn::survey`.

use super::*;
use crate::cuda::test_util::gpu_or_skip;

/// `(C, H, W, K, kernel, stride, pad, count)` of one convolution shape.
type Shape = (usize, usize, usize, usize, usize, usize, usize, usize);

/// ResNet-50's convolutions at batch 64.
const SHAPES: &[Shape] = &[
    (3, 224, 224, 64, 7, 2, 3, 1),
    (64, 56, 56, 256, 1, 1, 0, 1),
    (64, 56, 56, 64, 1, 1, 0, 1),
    (256, 56, 56, 64, 1, 1, 0, 2),
    (64, 56, 56, 64, 3, 1, 1, 3),
    (64, 56, 56, 256, 1, 1, 0, 3),
    (256, 56, 56, 512, 1, 2, 0, 1),
    (256, 56, 56, 128, 1, 2, 0, 1),
    (512, 28, 28, 128, 1, 1, 0, 3),
    (128, 28, 28, 128, 3, 1, 1, 4),
    (128, 28, 28, 512, 1, 1, 0, 4),
    (512, 28, 28, 1024, 1, 2, 0, 1),
    (512, 28, 28, 256, 1, 2, 0, 1),
    (1024, 14, 14, 256, 1, 1, 0, 5),
    (256, 14, 14, 256, 3, 1, 1, 6),
    (256, 14, 14, 1024, 1, 1, 0, 6),
    (1024, 14, 14, 2048, 1, 2, 0, 1),
    (1024, 14, 14, 512, 1, 2, 0, 1),
    (2048, 7, 7, 512, 1, 1, 0, 2),
    (512, 7, 7, 512, 3, 1, 1, 3),
    (512, 7, 7, 2048, 1, 1, 0, 3),
];

/// cifar10_quick's convolutions at batch 512.
const QUICK: &[Shape] = &[
    (3, 32, 32, 32, 5, 1, 2, 1),
    (32, 16, 16, 32, 5, 1, 2, 1),
    (32, 8, 8, 64, 5, 1, 2, 1),
];

fn tensor(format: cudnnTensorFormat_t, d: [usize; 4]) -> sys::cudnnTensorDescriptor_t {
    let mut raw = std::ptr::null_mut();
    // SAFETY: live descriptors; Find allocates its own buffers.
    unsafe {
        sys::cudnnCreateTensorDescriptor(&mut raw);
        let s = sys::cudnnSetTensor4dDescriptor(
            raw,
            format,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            d[0] as i32,
            d[1] as i32,
            d[2] as i32,
            d[3] as i32,
        );
        assert_eq!(s, cudnnStatus_t::CUDNN_STATUS_SUCCESS);
    }
    raw
}

fn filter(format: cudnnTensorFormat_t, d: [usize; 4]) -> sys::cudnnFilterDescriptor_t {
    let mut raw = std::ptr::null_mut();
    // SAFETY: live descriptors; Find allocates its own buffers.
    unsafe {
        sys::cudnnCreateFilterDescriptor(&mut raw);
        let s = sys::cudnnSetFilter4dDescriptor(
            raw,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            format,
            d[0] as i32,
            d[1] as i32,
            d[2] as i32,
            d[3] as i32,
        );
        assert_eq!(s, cudnnStatus_t::CUDNN_STATUS_SUCCESS);
    }
    raw
}

fn conv(stride: usize, pad: usize, math: cudnnMathType_t) -> sys::cudnnConvolutionDescriptor_t {
    let mut raw = std::ptr::null_mut();
    // SAFETY: live descriptors; Find allocates its own buffers.
    unsafe {
        sys::cudnnCreateConvolutionDescriptor(&mut raw);
        sys::cudnnSetConvolution2dDescriptor(
            raw,
            pad as i32,
            pad as i32,
            stride as i32,
            stride as i32,
            1,
            1,
            sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
        );
        sys::cudnnSetConvolutionMathType(raw, math);
    }
    raw
}

/// `(best ms, algo, math, deterministic)` and the best deterministic ms of a Find result.
fn summarize(perf: &[RawPerf]) -> (f32, i32, i32, f32, i32) {
    let ok: Vec<&RawPerf> = perf.iter().filter(|p| p.status == 0).collect();
    let best = ok
        .iter()
        .min_by(|a, b| a.time.total_cmp(&b.time))
        .map(|p| (p.time, p.algo, p.math_type))
        .unwrap_or((f32::NAN, -1, -1));
    let det = ok
        .iter()
        .filter(|p| p.determinism == 1)
        .min_by(|a, b| a.time.total_cmp(&b.time))
        .map(|p| (p.time, p.algo))
        .unwrap_or((f32::NAN, -1));
    (best.0, best.1, best.2, det.0, det.1)
}

#[test]
#[ignore]
fn resnet50_algorithms_by_layout_and_math() {
    let gpu = gpu_or_skip!("resnet50_algorithms_by_layout_and_math", MathMode::Tf32);
    let dnn = gpu.cudnn().unwrap();
    for (net, n, shapes) in [("cifar10_quick", 512, QUICK), ("resnet50", 64, SHAPES)] {
        println!("== {net}, batch {n}");
        survey(dnn, n, shapes);
    }
}

fn survey(dnn: &Cudnn, n: usize, shapes: &[Shape]) {
    use cudnnMathType_t::*;
    use cudnnTensorFormat_t::*;
    let layouts = [("NCHW", CUDNN_TENSOR_NCHW), ("NHWC", CUDNN_TENSOR_NHWC)];
    let maths = [
        ("default", CUDNN_DEFAULT_MATH),
        ("tensor_op", CUDNN_TENSOR_OP_MATH),
        ("fma", CUDNN_FMA_MATH),
    ];
    for (lname, layout) in layouts {
        for (mname, math) in maths {
            let mut totals = [0f32; 6];
            for &(c, h, w, k, r, stride, pad, count) in shapes {
                let oh = (h + 2 * pad - r) / stride + 1;
                let ow = (w + 2 * pad - r) / stride + 1;
                let x = tensor(layout, [n, c, h, w]);
                let y = tensor(layout, [n, k, oh, ow]);
                let f = filter(layout, [k, c, r, r]);
                let cd = conv(stride, pad, math);
                let mut perf = [RawPerf::default(); RANKED];
                let mut got = 0i32;
                let mut line = format!("{lname} {mname} c{c} {h}x{w} k{k} r{r} s{stride}:");
                for dir in 0..3 {
                    // SAFETY: live descriptors; Find allocates its own buffers.
                    let s = unsafe {
                        match dir {
                            0 => sys::cudnnFindConvolutionForwardAlgorithm(
                                dnn.raw,
                                x,
                                f,
                                cd,
                                y,
                                RANKED as i32,
                                &mut got,
                                perf.as_mut_ptr() as *mut _,
                            ),
                            1 => sys::cudnnFindConvolutionBackwardDataAlgorithm(
                                dnn.raw,
                                f,
                                y,
                                cd,
                                x,
                                RANKED as i32,
                                &mut got,
                                perf.as_mut_ptr() as *mut _,
                            ),
                            _ => sys::cudnnFindConvolutionBackwardFilterAlgorithm(
                                dnn.raw,
                                x,
                                y,
                                cd,
                                f,
                                RANKED as i32,
                                &mut got,
                                perf.as_mut_ptr() as *mut _,
                            ),
                        }
                    };
                    if s != cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                        line += &format!(" [{dir}: {s:?}]");
                        continue;
                    }
                    let (best, algo, mt, det, dalgo) = summarize(&perf[..got as usize]);
                    totals[2 * dir] += best * count as f32;
                    totals[2 * dir + 1] += det * count as f32;
                    line +=
                        &format!(" [{dir}: best {best:.3} a{algo} m{mt} det {det:.3} a{dalgo}]");
                }
                println!("{line}");
                // SAFETY: live descriptors; Find allocates its own buffers.
                unsafe {
                    sys::cudnnDestroyTensorDescriptor(x);
                    sys::cudnnDestroyTensorDescriptor(y);
                    sys::cudnnDestroyFilterDescriptor(f);
                    sys::cudnnDestroyConvolutionDescriptor(cd);
                }
            }
            println!(
                "TOTAL {lname} {mname}: fwd {:.2} (det {:.2}) bwd_data {:.2} (det {:.2}) \
                 bwd_filter {:.2} (det {:.2}) ms; sum best {:.2} det {:.2}",
                totals[0],
                totals[1],
                totals[2],
                totals[3],
                totals[4],
                totals[5],
                totals[0] + totals[2] + totals[4],
                totals[1] + totals[3] + totals[5]
            );
        }
    }
}
