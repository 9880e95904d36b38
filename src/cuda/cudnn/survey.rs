//! A measurement, not a check (hence `#[ignore]`): for every convolution shape of cifar10_quick
//! at batch 512 and of ResNet-50 at batch 64, the best time cuDNN's own benchmark
//! (`cudnnFind*`) gives each direction in NCHW and NHWC under each math type, any algorithm and
//! deterministic ones only, with per-net totals — the figures behind the layout and algorithm
//! choices in docs/benchmarks.md; and what half-type tensors would give ResNet-50's
//! convolutions; and what one convolution call costs the host through the legacy API and through
//! the graph API. Run on a GPU machine with
//! `p2ptrain-unittests --ignored --nocapture cudnn::survey`.

use super::*;
use crate::cuda::test_util::gpu_or_skip;

/// `(C, H, W, K, kernel, stride, pad, count)` of one convolution shape.
type Shape = (usize, usize, usize, usize, usize, usize, usize, usize);

/// A shape's output `(P, Q)` and its convolution geometry (square kernel, stride and padding, no
/// dilation or groups).
fn output_and_geometry(&(_, h, w, _, r, stride, pad, _): &Shape) -> ([usize; 2], ConvGeometry) {
    let out = |x: usize| (x + 2 * pad - r) / stride + 1;
    let geometry = ConvGeometry {
        pad: [pad; 2],
        stride: [stride; 2],
        dilation: [1; 2],
        group: 1,
    };
    ([out(h), out(w)], geometry)
}

/// The zeroed operands of one convolution `shape` at batch `n` on `s`: the dims of `x`
/// `(N, C, H, W)`, `w` `(K, C, R, S)` and `y` `(N, K, P, Q)`, the geometry, the buffers and
/// their device addresses, in that order.
struct Operands {
    dims: [[usize; 4]; 3],
    geometry: ConvGeometry,
    _buffers: Vec<CudaSlice<f32>>,
    ptrs: [u64; 3],
}

impl Operands {
    fn new(s: &Arc<CudaStream>, n: usize, shape: &Shape) -> Operands {
        let &(c, h, w, k, r, _, _, _) = shape;
        let ([oh, ow], geometry) = output_and_geometry(shape);
        let dims = [[n, c, h, w], [k, c, r, r], [n, k, oh, ow]];
        let mut buffers: Vec<CudaSlice<f32>> = dims
            .iter()
            .map(|d| s.alloc_zeros::<f32>(d.iter().product()).unwrap())
            .collect();
        let mut ptrs = [0u64; 3];
        for (p, b) in ptrs.iter_mut().zip(&mut buffers) {
            (*p, _) = b.device_ptr_mut(s);
        }
        Operands {
            dims,
            geometry,
            _buffers: buffers,
            ptrs,
        }
    }
}

/// A pair of timing events on `s`'s context.
fn timing_events(s: &CudaStream) -> [cudarc::driver::CudaEvent; 2] {
    [(); 2].map(|_| {
        s.context()
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap()
    })
}

/// The three convolutions of a layer, in the graph API's terms.
const DIRECTIONS: [super::graph::Direction; 3] = [
    super::graph::Direction::Forward,
    super::graph::Direction::BackwardData,
    super::graph::Direction::BackwardFilter,
];

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
    let layouts = [("NCHW", Layout::Nchw), ("NHWC", Layout::Nhwc)];
    let maths = [
        ("default", CUDNN_DEFAULT_MATH),
        ("tensor_op", CUDNN_TENSOR_OP_MATH),
        ("fma", CUDNN_FMA_MATH),
    ];
    for (lname, layout) in layouts {
        for (mname, math) in maths {
            let mut totals = [0f32; 6];
            for shape in shapes {
                let &(c, h, w, k, r, stride, _, count) = shape;
                let ([oh, ow], geometry) = output_and_geometry(shape);
                let x = TensorDesc::new([n, c, h, w], layout).unwrap();
                let y = TensorDesc::new([n, k, oh, ow], layout).unwrap();
                let f = FilterDesc::new([k, c, r, r], layout).unwrap();
                let cd = ConvDesc::with_math_type(geometry, dnn.math, math).unwrap();
                let mut line = format!("{lname} {mname} c{c} {h}x{w} k{k} r{r} s{stride}:");
                for dir in 0..3 {
                    let descs = (&x, &f, &cd, &y);
                    let perf = match rank_once(dnn, dir, ConvAlgorithm::Measured, descs) {
                        Ok(perf) => perf,
                        Err(e) => {
                            line += &format!(" [{dir}: {e}]");
                            continue;
                        }
                    };
                    let (best, algo, mt, det, dalgo) = summarize(&perf);
                    totals[2 * dir] += best * count as f32;
                    totals[2 * dir + 1] += det * count as f32;
                    line +=
                        &format!(" [{dir}: best {best:.3} a{algo} m{mt} det {det:.3} a{dalgo}]");
                }
                println!("{line}");
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

/// What half-type convolutions would give ResNet-50 at batch 64 (channels-last, tensor-op math,
/// FP32 accumulation), for docs/design.md's half-type storage (Mixed precision, step 2): the best
/// time cuDNN's benchmark gives each direction with FP32 tensors (TF32), and with bf16 and with
/// fp16 ones, per shape and in total; and, shape by shape, whether cuDNN takes an FP32 weight
/// gradient from half-type input and top gradient (the mixed-precision contract's parameter
/// gradient) and an FP32 top from half-type input and weights.
#[test]
#[ignore]
fn resnet50_half_type_convolutions() {
    use cudnnDataType_t::{CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_DATA_HALF};
    let gpu = gpu_or_skip!("resnet50_half_type_convolutions", MathMode::Tf32);
    let dnn = gpu.cudnn().unwrap();
    let (n, nhwc) = (64, Layout::Nhwc);
    let types = [
        ("fp32", CUDNN_DATA_FLOAT),
        ("bf16", CUDNN_DATA_BFLOAT16),
        ("fp16", CUDNN_DATA_HALF),
    ];
    // The best time of a Find, or why there is none.
    let verdict = |found: Result<Vec<RawPerf>>| match found {
        Ok(perf) => match summarize(&perf).0 {
            best if best.is_finite() => format!("{best:.3} ms"),
            _ => "no algorithm".to_string(),
        },
        Err(e) => format!("refused ({e})"),
    };
    let mut totals = [[0f32; 3]; 3];
    for shape in SHAPES {
        let &(c, h, w, k, r, stride, _, count) = shape;
        let ([oh, ow], geometry) = output_and_geometry(shape);
        let math = cudnnMathType_t::CUDNN_TENSOR_OP_MATH;
        let cd = ConvDesc::with_math_type(geometry, dnn.math, math).unwrap();
        let x_of = |ty| TensorDesc::typed([n, c, h, w], nhwc, ty).unwrap();
        let y_of = |ty| TensorDesc::typed([n, k, oh, ow], nhwc, ty).unwrap();
        let w_of = |ty| FilterDesc::typed([k, c, r, r], nhwc, ty).unwrap();
        let mut line = format!("c{c} {h}x{w} k{k} r{r} s{stride} (x{count}):");
        for (t, &(name, ty)) in types.iter().enumerate() {
            let (x, f, y) = (x_of(ty), w_of(ty), y_of(ty));
            line += &format!(" {name}");
            for (dir, total) in totals[t].iter_mut().enumerate() {
                match rank_once(dnn, dir, ConvAlgorithm::Measured, (&x, &f, &cd, &y)) {
                    Ok(perf) => {
                        let best = summarize(&perf).0;
                        *total += best * count as f32;
                        line += &format!(" {best:.3}");
                    }
                    Err(e) => line += &format!(" [{dir}: {e}]"),
                }
            }
        }
        for &(name, ty) in &types[1..] {
            let (x, y) = (x_of(ty), y_of(ty));
            let wgrad = rank_once(
                dnn,
                2,
                ConvAlgorithm::Measured,
                (&x, &w_of(CUDNN_DATA_FLOAT), &cd, &y),
            );
            let fwd = rank_once(
                dnn,
                0,
                ConvAlgorithm::Measured,
                (&x, &w_of(ty), &cd, &y_of(CUDNN_DATA_FLOAT)),
            );
            line += &format!(
                " | {name} x and dy into an FP32 dw: {}; {name} x and w into an FP32 y: {}",
                verdict(wgrad),
                verdict(fwd)
            );
        }
        println!("{line}");
    }
    for (t, (name, _)) in types.iter().enumerate() {
        let [fwd, data, filter] = totals[t];
        println!(
            "TOTAL NHWC {name} (tensor ops): fwd {fwd:.2} bwd_data {data:.2} bwd_filter \
             {filter:.2} ms; sum {:.2}",
            fwd + data + filter
        );
    }
}

/// What cuDNN's graph API gives ResNet-50's convolutions (`super::graph`): per shape and
/// direction, the best of the first eight execution plans of the heuristics (mode A), each timed
/// over ten runs after two, channels-last — TF32 on FP32 tensors, bf16 tensors, and the mixed
/// calls half-type storage needs (bf16 `x` and `dy` into an FP32 `dw`; bf16 `x` and `w` into an
/// FP32 `y`), or why there is none. Set against `scripts/gpu/conv_survey.py` (PyTorch) and
/// `resnet50_half_type_convolutions` (the legacy API).
#[test]
#[ignore]
fn resnet50_graph_api_convolutions() {
    use super::graph::{execute, plans, Conv, Direction};
    use cudnnDataType_t::{CUDNN_DATA_BFLOAT16 as BF16, CUDNN_DATA_FLOAT as F32};
    let gpu = gpu_or_skip!("resnet50_graph_api_convolutions", MathMode::Tf32);
    let dnn = gpu.cudnn().unwrap();
    let s = &gpu.compute;
    let [start, end] = timing_events(s);
    let n = 64;
    let mut totals = [[0f32; 3]; 2];
    for shape in SHAPES {
        let &(c, h, w, k, r, stride, _, count) = shape;
        // Bound whole: the buffers live as long as `operands`.
        let operands = Operands::new(s, n, shape);
        let (dims, geometry, ptrs) = (operands.dims, operands.geometry, operands.ptrs);
        // The best time of the plans of one call, or why there is none.
        let best = |dir: Direction, types| -> std::result::Result<f32, String> {
            let conv = Conv {
                direction: dir,
                dims,
                types,
                layout: Layout::Nhwc,
                geometry,
                bias: false,
            };
            let found = plans(dnn, &conv, 0.0, 8, |_| true).map_err(|e| e.to_string())?;
            let mut best = f32::INFINITY;
            for plan in &found {
                let mut ws = s.alloc_zeros::<u8>(plan.workspace.max(1)).unwrap();
                let (wsp, _g) = ws.device_ptr_mut(s);
                let run = || unsafe { execute(dnn, plan, &ptrs, wsp) };
                if run().and_then(|_| run()).is_err() {
                    continue;
                }
                start.record(s).unwrap();
                for _ in 0..10 {
                    run().unwrap();
                }
                end.record(s).unwrap();
                end.synchronize().unwrap();
                best = best.min(start.elapsed_ms(&end).unwrap() / 10.0);
            }
            match best.is_finite() {
                true => Ok(best),
                false => Err(format!("none of {} plans ran", found.len())),
            }
        };
        let mut line = format!("c{c} {h}x{w} k{k} r{r} s{stride} (x{count}):");
        for (t, (name, ty)) in [("tf32", F32), ("bf16", BF16)].into_iter().enumerate() {
            line += &format!(" {name}");
            for (d, &dir) in DIRECTIONS.iter().enumerate() {
                match best(dir, [ty; 3]) {
                    Ok(ms) => {
                        totals[t][d] += ms * count as f32;
                        line += &format!(" {ms:.3}");
                    }
                    Err(e) => line += &format!(" [{dir:?}: {e}]"),
                }
            }
        }
        let say = |r: std::result::Result<f32, String>| match r {
            Ok(ms) => format!("{ms:.3} ms"),
            Err(e) => format!("none ({e})"),
        };
        line += &format!(
            " | bf16 x, dy into FP32 dw: {}; bf16 x, w into FP32 y: {}",
            say(best(Direction::BackwardFilter, [BF16, F32, BF16])),
            say(best(Direction::Forward, [BF16, BF16, F32]))
        );
        println!("{line}");
    }
    for (t, name) in ["tf32", "bf16"].iter().enumerate() {
        let [f, d, w] = totals[t];
        println!(
            "TOTAL graph API NHWC {name}: fwd {f:.2} bwd_data {d:.2} bwd_filter {w:.2} ms; sum {:.2}",
            f + d + w
        );
    }
}

/// The host's time to enqueue one convolution call, legacy API against graph API (a variant pack
/// built per call, as [`super::graph::execute`] does, and one built once), for cifar10_quick's
/// shapes at batch 512 and ResNet-50's first five at batch 64, channels-last, TF32: per shape
/// and direction, microseconds per call (the least of three rounds of 100 calls, enqueued behind
/// a hold of the stream so that the queue never makes the host wait), then the device's
/// milliseconds per call for the legacy call and the graph plan. The legacy calls take
/// algorithm 1 of each direction (implicit precomputed GEMM forward, ALGO_1 backward), the
/// graph calls the heuristics' first plan that runs.
#[test]
#[ignore]
fn host_time_of_a_convolution_call() {
    use super::graph::{execute, execute_pack, plans, Conv, Direction, VariantPack};
    use cudnnDataType_t::CUDNN_DATA_FLOAT as F32;
    use std::time::Instant;
    let gpu = gpu_or_skip!("host_time_of_a_convolution_call", MathMode::Tf32);
    let dnn = gpu.cudnn().unwrap();
    let (s, k) = (&gpu.compute, &gpu.kernels);
    let [start, end] = timing_events(s);
    let mut ws = s.alloc_zeros::<u8>(512 << 20).unwrap();
    let (wsp, _ws_guard) = ws.device_ptr_mut(s);
    let workspace = Workspace {
        ptr: wsp,
        bytes: 512 << 20,
    };
    const CALLS: usize = 100;
    // (host µs per call, device ms per call) of `CALLS` runs of `call`, the least of 3 rounds.
    let time = |call: &mut dyn FnMut() -> Result<()>| -> std::result::Result<(f32, f32), String> {
        call().map_err(|e| e.to_string())?;
        let (mut host, mut device) = (f32::INFINITY, f32::INFINITY);
        for _ in 0..3 {
            k.hold_stream(s, 200_000_000).unwrap();
            start.record(s).unwrap();
            let t = Instant::now();
            for _ in 0..CALLS {
                call().map_err(|e| e.to_string())?;
            }
            host = host.min(t.elapsed().as_secs_f32() * 1e6 / CALLS as f32);
            end.record(s).unwrap();
            end.synchronize().unwrap();
            device = device.min(start.elapsed_ms(&end).unwrap() / CALLS as f32);
        }
        Ok((host, device))
    };
    let shapes = QUICK
        .iter()
        .map(|q| (512, q))
        .chain(SHAPES[..5].iter().map(|r| (64, r)));
    println!("shape direction: legacy µs | graph, pack per call µs | graph, pack once µs | device ms legacy / graph");
    for (n, shape) in shapes {
        let &(c, h, w, kk, r, stride, _, _) = shape;
        // Bound whole: the buffers live as long as `operands`.
        let operands = Operands::new(s, n, shape);
        let (dims, geometry, ptrs) = (operands.dims, operands.geometry, operands.ptrs);
        let x = TensorDesc::new(dims[0], Layout::Nhwc).unwrap();
        let wd = FilterDesc::new(dims[1], Layout::Nhwc).unwrap();
        let y = TensorDesc::new(dims[2], Layout::Nhwc).unwrap();
        let conv = ConvDesc::new(geometry, MathMode::Tf32).unwrap();
        for dir in DIRECTIONS {
            // SAFETY: every pointer addresses a buffer of its descriptor's elements, alive
            // (with the workspace) until the end of the test, which synchronises after each round.
            let mut legacy = || unsafe {
                match dir {
                    Direction::Forward => conv_forward(
                        dnn,
                        (&x, ptrs[0]),
                        (&wd, ptrs[1]),
                        (&conv, fwd_algo(1).unwrap()),
                        workspace,
                        0.0,
                        (&y, ptrs[2]),
                    ),
                    Direction::BackwardData => conv_backward_data(
                        dnn,
                        (&wd, ptrs[1]),
                        (&y, ptrs[2]),
                        (&conv, bwd_data_algo(1).unwrap()),
                        workspace,
                        0.0,
                        (&x, ptrs[0]),
                    ),
                    Direction::BackwardFilter => conv_backward_filter(
                        dnn,
                        (&x, ptrs[0]),
                        (&y, ptrs[2]),
                        (&conv, bwd_filter_algo(1).unwrap()),
                        workspace,
                        0.0,
                        (&wd, ptrs[1]),
                    ),
                }
            };
            let legacy = time(&mut legacy);
            let conv = Conv {
                direction: dir,
                dims,
                types: [F32; 3],
                layout: Layout::Nhwc,
                geometry,
                bias: false,
            };
            let found = plans(dnn, &conv, 0.0, 8, |_| true).unwrap_or_default();
            let pointers = ptrs;
            // SAFETY: as above; a plan's workspace fits in the 512 MiB.
            let plan = found.iter().find(|p| {
                p.workspace <= workspace.bytes && unsafe { execute(dnn, p, &pointers, wsp) }.is_ok()
            });
            let say = |r: &std::result::Result<(f32, f32), String>| match r {
                Ok((host, _)) => format!("{host:.1}"),
                Err(e) => format!("[{e}]"),
            };
            let device = |r: &std::result::Result<(f32, f32), String>| match r {
                Ok((_, d)) => format!("{d:.3}"),
                Err(_) => "-".into(),
            };
            let mut line = format!(
                "n{n} c{c} {h}x{w} k{kk} r{r} s{stride} {dir:?}: {}",
                say(&legacy)
            );
            match plan {
                Some(plan) => {
                    // SAFETY: as above.
                    let fresh = time(&mut || unsafe { execute(dnn, plan, &pointers, wsp) });
                    let pack = VariantPack::new(&pointers, wsp).unwrap();
                    // SAFETY: as above.
                    let once = time(&mut || unsafe { execute_pack(dnn, plan, &pack) });
                    line += &format!(
                        " | {} | {} | {} / {}",
                        say(&fresh),
                        say(&once),
                        device(&legacy),
                        device(&once)
                    );
                }
                None => line += &format!(" | no graph plan of {} ran", found.len()),
            }
            println!("{line}");
        }
    }
}

/// What cuDNN's graph API offers for a forward convolution that adds its bias before the one
/// rounding of its half-type output (`graph::Conv::bias`), for cifar10_quick's three shapes at
/// batch 512 in bf16, in both layouts (`graph::biased_forward_offers`): the answer behind
/// which convolutions with a bias run on half-type blobs. Run with `CUDNN_LOGLEVEL_DBG=2
/// CUDNN_LOGDEST_DBG=stderr` for cuDNN's reasons.
#[test]
#[ignore]
fn biased_half_type_forward_plans() {
    use super::graph::{biased_forward_offers, Conv, Direction};
    use cudnnDataType_t::CUDNN_DATA_BFLOAT16 as BF16;
    let gpu = gpu_or_skip!("biased_half_type_forward_plans", MathMode::Bf16);
    let dnn = gpu.cudnn().unwrap();
    let n = 512;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for shape in QUICK {
            let &(c, h, w, k, r, ..) = shape;
            let ([p, q], geometry) = output_and_geometry(shape);
            let conv = Conv {
                direction: Direction::Forward,
                dims: [[n, c, h, w], [k, c, r, r], [n, k, p, q]],
                types: [BF16; 3],
                layout,
                geometry,
                bias: true,
            };
            for line in biased_forward_offers(dnn, &conv) {
                eprintln!("{layout:?} {shape:?}: {line}");
            }
        }
    }
}
