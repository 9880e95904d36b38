//! The GPU backend's own kernels: the CUDA C sources of `kernels/` ([`SOURCE`], one family per
//! file: `kernels/NAME.cu` beside `kernels/NAME.rs`, which launches its kernels) with every
//! elementwise, reduction, layer and update kernel the GPU layers and the GPU solver need,
//! compiled by NVRTC as one program once per process and compute capability, loaded once per
//! context into [`Kernels`], and launched through typed methods that check buffer lengths (all
//! of them through the `launch!` macro of `kernels/common.rs`, most of them declared by its
//! `launchers!`). The kernels of the layers that run on half-type blobs (the fused chains, the
//! poolings) have a twin `NAME_h` over half-type bit patterns, which their launchers pick by the
//! element type of the buffers they are given ([`StoredElem`]).
//!
//! The source is compiled to PTX for the virtual architecture `compute_XY` of the device (the
//! driver turns it into machine code for the exact chip when the module is loaded) with
//! `--fmad=false`, so that multiply-adds round like the CPU code and the update rules match the
//! CPU solver bit for bit.
//!
//! Every method enqueues on the stream it is given and returns at once; nothing synchronises.
//! Lengths are in elements; a method panics when a buffer is shorter than the elements it is
//! asked to touch (a bug in the caller, never a data error).

use super::gpu_error;
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Declares the kernel sources, `kernels/NAME.cu` for each family `NAME` in order (each beside
/// `kernels/NAME.rs`, which launches its kernels): [`SOURCE`] and [`SOURCE_FILES`].
macro_rules! kernel_sources {
    ($($family:literal),* $(,)?) => {
        /// The CUDA C source of every kernel: the families' sources concatenated in order (the
        /// shared helpers of `common.cu` first), compiled as one program.
        pub const SOURCE: &str = concat!($(include_str!(concat!("kernels/", $family, ".cu"))),*);

        /// Each family's file name and source, in the order of [`SOURCE`].
        pub const SOURCE_FILES: &[(&str, &str)] =
            &[$((concat!($family, ".cu"), include_str!(concat!("kernels/", $family, ".cu")))),*];

        /// Each family's source and the Rust source of its launchers (`kernels/NAME.rs`).
        #[cfg(test)]
        const FAMILIES: &[(&str, &str, &str)] = &[$((
            $family,
            include_str!(concat!("kernels/", $family, ".cu")),
            include_str!(concat!("kernels/", $family, ".rs")),
        )),*];
    };
}

kernel_sources!(
    "common",
    "elementwise",
    "loss",
    "solver",
    "copy",
    "pooling",
    "dropout",
    "channel",
    "normalization",
    "fused",
    "im2col",
    "convolution_implicit_gemm",
    "convolution_direct",
    "softmax",
    "wire",
    "input",
);

/// Resident blocks per multiprocessor that one wave of a grid-stride kernel aims for.
const BLOCKS_PER_SM: u32 = 8;

/// Declares the kernels: the fields of [`Kernels`], [`KERNEL_NAMES`] and the loader, from one
/// list, so that a name cannot be loaded without being checked against the source.
macro_rules! kernel_set {
    ($($name:ident),* $(,)?) => {
        /// The loaded kernels of one context, with the launch geometry of its device.
        #[derive(Debug)]
        pub struct Kernels {
            $($name: CudaFunction,)*
            /// Blocks of one full wave of a grid-stride kernel on this device.
            max_blocks: u32,
            /// Resident blocks of each of [`IMPLICIT_WGRAD_TILES`]'s kernels on the whole
            /// device.
            implicit_wgrad_slots: [usize; IMPLICIT_WGRAD_TILES.len()],
            /// Resident blocks of the fused chain's elementwise `_h8` kernels on the whole
            /// device (forward, backward): their grids ([`Kernels::grid_resident`]).
            chain_slots: [u32; 2],
        }

        /// The names of every kernel [`Kernels`] loads from [`SOURCE`].
        pub const KERNEL_NAMES: &[&str] = &[$(stringify!($name)),*];

        impl Kernels {
            fn from_module(module: &Arc<CudaModule>, max_blocks: u32) -> Result<Kernels> {
                Ok(Kernels {
                    $($name: module
                        .load_function(stringify!($name))
                        .map_err(|e| gpu_error(concat!("load kernel ", stringify!($name)), e))?,)*
                    max_blocks,
                    implicit_wgrad_slots: [1; IMPLICIT_WGRAD_TILES.len()],
                    chain_slots: [max_blocks; 2],
                })
            }
        }
    };
}

kernel_set!(
    hold_stream,
    fill,
    fill_scaled,
    scale,
    axpy,
    relu_forward,
    relu_backward,
    sigmoid_forward,
    sigmoid_backward,
    tanh_forward,
    tanh_backward,
    bias_add,
    softmax_loss_forward,
    loss_finalize,
    softmax_loss_backward,
    accuracy_rows,
    accuracy_finalize,
    weighted_sum,
    loss_slot,
    poison_gradient,
    sumsq_partial,
    sumsq_partial_bf16,
    clip_scale,
    sgd_update,
    nesterov_update,
    adagrad_update,
    rmsprop_update,
    adam_update,
    adamw_update,
    adadelta_update,
    copy_strided,
    unstride_planes,
    transpose_batched,
    transpose_to_half,
    transpose_widen,
    widen_half,
    narrow_half,
    add_rounded,
    scaled_copy,
    mul_into,
    mul_inplace,
    round_half,
    round_half_copy,
    to_half,
    eltwise_max_step,
    eltwise_max_backward,
    max_pool_forward,
    max_pool_forward_h,
    max_pool_forward_h8,
    ave_pool_forward,
    ave_pool_forward_h,
    max_pool_backward,
    max_pool_backward_h,
    max_pool_backward_h8,
    ave_pool_backward,
    ave_pool_backward_h,
    pool_backward_planes,
    pool_backward_planes_h,
    max_pool_backward_scatter,
    max_pool_backward_scatter_h,
    dropout_forward,
    dropout_backward,
    channel_reduce,
    channel_reduce_h,
    channel_reduce_finish,
    pair_reduce_finish,
    bn_scale_relu_forward,
    bn_scale_relu_forward_h,
    bn_scale_relu_forward_h8,
    bn_scale_relu_sums,
    bn_scale_relu_sums_h,
    bn_scale_relu_sums_h8,
    bn_scale_relu_sums_res_h8,
    bn_scale_relu_finish,
    bn_scale_relu_backward,
    bn_scale_relu_backward_h,
    bn_scale_relu_backward_h8,
    sum2_relu_forward,
    sum2_relu_forward_h,
    sum2_relu_backward,
    sum2_relu_backward_h,
    im2col_batch,
    wgrad_partial_4x8_w2,
    wgrad_partial_4x8_w3,
    wgrad_partial_4x8_w4,
    wgrad_partial_4x8_w5,
    wgrad_partial_8x8_w2,
    wgrad_partial_8x8_w3,
    wgrad_partial_8x8_w4,
    wgrad_sum_partials,
    conv_forward_direct,
    direct_sum_splits,
    swap_outer,
    channel_affine,
    channel_scale_backward,
    bn_sums,
    bn_sums_h,
    bn_sums_h8,
    bn_sums_finish,
    bn_sums_finish_stats,
    bn_batch_stats,
    bn_global_stats,
    bn_normalize,
    bn_update_running,
    bn_backward,
    bn_backward_global,
    softmax_forward,
    softmax_backward,
    power_forward,
    power_backward,
    abs_forward,
    abs_backward,
    elu_forward,
    elu_backward,
    prelu_forward,
    prelu_backward,
    prelu_negative_part,
    scaled_by_top_diff,
    argmax_rank,
    lrn_forward,
    lrn_backward,
    to_bf16,
    from_bf16_scaled,
    sum_bf16_slices,
    normalize_u8,
);

#[macro_use]
mod common;
mod channel;
mod convolution_direct;
mod convolution_implicit_gemm;
mod copy;
mod dropout;
mod elementwise;
mod fused;
mod im2col;
mod input;
mod loss;
mod normalization;
mod pooling;
mod softmax;
mod solver;
mod wire;
#[cfg(test)]
pub use common::launched;
pub use common::StoredElem;
use common::{check_len, check_lens, half_arg, int_count, stored_half_arg, to_i32, BLOCK};
pub use convolution_direct::DirectTile;
pub use convolution_implicit_gemm::{WgradTile, IMPLICIT_WGRAD_TILES};
pub use dropout::DropoutMask;
pub use elementwise::Activation;
pub use fused::{BnScaleRelu, ChainGrad, ChainSums, ResidualSum};
pub use im2col::ConvGeom;
pub use loss::LabelledRows;
pub use normalization::LrnWindow;
pub use normalization::{BatchStats, StatsSource};
pub use pooling::PoolGeom;
pub use solver::{LeanCheck, LossScaleArgs, Rule, UpdateArgs, WeightCopies, WeightCopy, WireSum};

impl Kernels {
    /// Compiles [`SOURCE`] for the device of `ctx` (once per process and compute capability)
    /// and loads every kernel into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| gpu_error("query compute capability", e))?;
        let ptx = compiled_ptx(major, minor)?;
        let module = ctx
            .load_module(Ptx::from_src(ptx.as_str()))
            .map_err(|e| gpu_error(&format!("load the kernel module for sm_{major}{minor}"), e))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| gpu_error("query the multiprocessor count", e))?;
        let sms = sms.max(1) as u32;
        let mut kernels = Kernels::from_module(&module, sms * BLOCKS_PER_SM)?;
        // Blocks of `threads` of `kernel` resident on the whole device at once.
        let resident = |kernel: &CudaFunction, threads: u32, what: &str| -> Result<u32> {
            let per_sm = kernel
                .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
                .map_err(|e| gpu_error(&format!("query {what}' occupancy"), e))?;
            Ok(per_sm.max(1) * sms)
        };
        let mut slots = [1; IMPLICIT_WGRAD_TILES.len()];
        for (slot, tile) in slots.iter_mut().zip(IMPLICIT_WGRAD_TILES) {
            let kernel = kernels
                .wgrad_partial_kernel(tile)
                .expect("every tile has a kernel");
            let threads = tile.threads() as u32;
            *slot = resident(kernel, threads, "the weight-gradient kernels")? as usize;
        }
        kernels.implicit_wgrad_slots = slots;
        let chain = [
            &kernels.bn_scale_relu_forward_h8,
            &kernels.bn_scale_relu_backward_h8,
        ];
        let mut chain_slots = [0; 2];
        for (slot, kernel) in chain_slots.iter_mut().zip(chain) {
            let most = BLOCKS_PER_SM * sms;
            *slot = resident(kernel, BLOCK, "the fused chain's kernels")?.min(most);
        }
        kernels.chain_slots = chain_slots;
        Ok(kernels)
    }
}

/// PTX of [`SOURCE`] per compute capability, compiled at most once per process.
fn compiled_ptx(major: i32, minor: i32) -> Result<Arc<String>> {
    /// PTX by compute capability `(major, minor)`.
    type PtxCache = Mutex<HashMap<(i32, i32), Arc<String>>>;
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // A panic while compiling cannot leave the map half-written, so a poisoned lock is usable.
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ptx) = map.get(&(major, minor)) {
        return Ok(ptx.clone());
    }
    let ptx = Arc::new(compile(&format!("compute_{major}{minor}"))?);
    map.insert((major, minor), ptx.clone());
    Ok(ptx)
}

/// Compiles [`SOURCE`] to PTX for the virtual architecture `arch` (e.g. `compute_90`).
pub fn compile(arch: &str) -> Result<String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Device(
            "CUDA: the NVRTC library (libnvrtc.so) cannot be loaded; add the directory that \
             holds it to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let opts = CompileOptions {
        fmad: Some(false),
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("kernels.cu".into()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
        CompileError::CompileError { log, .. } => gpu_error(
            &format!("NVRTC compile of kernels.cu for {arch}"),
            log.to_string_lossy(),
        ),
        other => gpu_error(&format!("NVRTC compile of kernels.cu for {arch}"), other),
    })?;
    Ok(ptx.to_src())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `source` with each kernel's `__launch_bounds__(..)` taken out of its declaration, so that
    /// every kernel reads `extern "C" __global__ void NAME(`.
    fn without_launch_bounds(source: &str) -> String {
        let bounds = "__launch_bounds__(";
        let mut out = String::with_capacity(source.len());
        let mut rest = source;
        while let Some(at) = rest.find(bounds) {
            out.push_str(&rest[..at]);
            let close = rest[at..].find(')').expect("a closed __launch_bounds__");
            rest = rest[at + close + 1..].trim_start_matches(' ');
        }
        out.push_str(rest);
        out
    }

    /// Runs without a GPU: every kernel the host loads is defined in the source, so a typo
    /// fails here rather than at load time on a GPU machine.
    #[test]
    fn source_defines_every_loaded_kernel() {
        assert!(!SOURCE.trim().is_empty());
        let source = without_launch_bounds(SOURCE);
        for name in KERNEL_NAMES {
            let decl = format!("extern \"C\" __global__ void {name}(");
            assert_eq!(
                source.matches(&decl).count(),
                1,
                "the sources must define `{name}` exactly once"
            );
        }
        let defined = source.matches("extern \"C\" __global__ void ").count();
        assert_eq!(
            defined,
            KERNEL_NAMES.len(),
            "a kernel in the sources is never loaded"
        );
    }

    /// The kernels a launcher file names: `launch!(self, s, NAME, ..)` (both of
    /// `launch!(self, s, NAME | NAME_H for T, ..)`), `launch_rule!(NAME, ..)`, `=> launch NAME(..)` (in `launchers!`) and `&self.NAME` where
    /// `NAME` is a loaded kernel.
    fn launched_kernels(launcher: &str) -> Vec<String> {
        let ident = |rest: &str| -> String {
            let rest = rest.trim_start();
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let mut names = Vec::new();
        for (at, _) in launcher.match_indices("launch!(") {
            let args: Vec<&str> = launcher[at + 8..].splitn(4, ',').collect();
            if args.len() == 4 && args[0].trim() == "self" && args[1].trim() == "s" {
                // `F | F_H for T`: a kernel and its half-type twin.
                names.extend(args[2].split('|').map(ident));
            }
        }
        for marker in ["launch_rule!(", "=> launch ", "&self."] {
            for (at, _) in launcher.match_indices(marker) {
                names.push(ident(&launcher[at + marker.len()..]));
            }
        }
        names.retain(|name| KERNEL_NAMES.contains(&name.as_str()));
        names
    }

    /// Kernels a family launches from another family's source: `(launcher family, kernel)`.
    /// The Scale layer's pair of channel sums runs BatchNorm's two-sum kernel.
    const BORROWED: &[(&str, &str)] = &[("channel", "bn_sums")];

    /// Runs without a GPU: each `kernels/NAME.rs` launches only kernels that `kernels/NAME.cu`
    /// defines (but for [`BORROWED`]), and every kernel is launched from some family's file, so
    /// that the sources mirror their launchers and a kernel named in a launcher exists in the
    /// compiled program.
    #[test]
    fn each_family_launches_the_kernels_of_its_own_source() {
        let mut launched = Vec::new();
        for (family, source, launcher) in FAMILIES {
            let names = launched_kernels(launcher);
            for name in &names {
                if BORROWED.contains(&(*family, name.as_str())) {
                    continue;
                }
                let decl = format!("extern \"C\" __global__ void {name}(");
                assert!(
                    without_launch_bounds(source).contains(&decl),
                    "kernels/{family}.rs launches `{name}`, which kernels/{family}.cu lacks"
                );
            }
            launched.extend(names);
        }
        for name in KERNEL_NAMES {
            assert!(
                launched.iter().any(|l| l == name),
                "no launcher file launches `{name}`"
            );
        }
        let listed: Vec<&str> = FAMILIES.iter().map(|f| f.0).collect();
        let files: Vec<&str> = SOURCE_FILES.iter().map(|f| f.0).collect();
        assert_eq!(listed.len(), files.len(), "{listed:?} / {files:?}");
    }

    /// The index of the bracket closing the one that `text` starts with (`(`, `[` or `{`).
    fn closing(text: &str) -> usize {
        let mut depth = 0;
        for (i, c) in text.char_indices() {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return i;
                    }
                }
                _ => {}
            }
        }
        panic!("unbalanced brackets in {text:.80}");
    }

    /// The comma-separated items of `list` outside any bracket, trimmed, empty ones (a trailing
    /// comma) dropped.
    fn items(list: &str) -> Vec<&str> {
        let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
        for (i, c) in list.char_indices() {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(list[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(list[start..].trim());
        out.retain(|item| !item.is_empty());
        out
    }

    /// The contents of the bracket that `text` starts with.
    fn inside(text: &str) -> &str {
        &text[1..closing(text)]
    }

    /// Every kernel of [`SOURCE`] and its number of parameters, a parameter-list macro
    /// (`#define UPDATE_PARAMS ...`, continued by backslashes) counted as the parameters it holds.
    fn kernel_parameters() -> HashMap<String, usize> {
        let mut lists = HashMap::new();
        for (at, _) in SOURCE.match_indices("#define ") {
            let rest = &SOURCE[at + "#define ".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.ends_with("_PARAMS") {
                let mut body = String::new();
                for line in rest[name.len()..].lines() {
                    body.push_str(line.trim_end().trim_end_matches('\\'));
                    if !line.trim_end().ends_with('\\') {
                        break;
                    }
                }
                lists.insert(name, items(&body).len());
            }
        }
        let decl = "extern \"C\" __global__ void ";
        let source = without_launch_bounds(SOURCE);
        source
            .match_indices(decl)
            .map(|(at, _)| {
                let rest = &source[at + decl.len()..];
                let open = rest.find('(').unwrap();
                let params = items(inside(&rest[open..]));
                let count = params
                    .iter()
                    .map(|p| lists.get(*p).copied().unwrap_or(1))
                    .sum();
                (rest[..open].to_string(), count)
            })
            .collect()
    }

    /// The kernels a dynamic launch (`launch!(function F, ..)`) may start, by the expression
    /// `F`: the channel sums' two stages, the BatchNorm chain's channels-last backward sums
    /// (with a residual sum or without), and the implicit GEMM's weight-gradient tiles.
    fn dynamic_kernels(function: &str) -> Vec<&'static str> {
        let named: &[&'static str] = match function {
            "stage1.0" => &["bn_sums", "channel_reduce", "channel_reduce_h"],
            "finish.0" => &["pair_reduce_finish", "channel_reduce_finish"],
            "chain_sums.0" => &["bn_scale_relu_sums_h8", "bn_scale_relu_sums_res_h8"],
            _ => &[],
        };
        let tiles = KERNEL_NAMES
            .iter()
            .copied()
            .filter(|k| function == "func" && k.starts_with("wgrad_partial_"));
        named.iter().copied().chain(tiles).collect()
    }

    /// Runs without a GPU: every launch in the launcher files passes each kernel as many
    /// arguments as the kernel's source declares parameters (a launch with one too few reads
    /// past its arguments on the GPU): `launch!(self, STREAM, NAME, GRID, [ARGS])` (both kernels
    /// of `NAME | NAME_H for T`, which take the same arguments), the dynamic
    /// `launch!(function F, ..)` for each kernel `F` may be, `=> launch NAME(ARGS)` in
    /// `launchers!`, and `launch_rule!(NAME, [EXTRA])` (its template's arguments and `EXTRA`).
    #[test]
    fn every_launch_passes_each_kernel_parameter() {
        let params = kernel_parameters();
        assert_eq!(params.len(), KERNEL_NAMES.len());
        let mut checked = 0;
        let mut check = |file: &str, kernel: &str, args: usize| {
            let want = params
                .get(kernel)
                .unwrap_or_else(|| panic!("kernels/{file}.rs launches `{kernel}`, not in SOURCE"));
            assert_eq!(
                args, *want,
                "kernels/{file}.rs passes `{kernel}` {args} arguments; it takes {want}"
            );
            checked += 1;
        };
        for (file, _, source) in FAMILIES {
            // The code without its comments (which show the macros' forms).
            let launcher: String = source
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .map(|line| format!("{line}\n"))
                .collect();
            let launcher = launcher.as_str();
            let mut rule_base = None;
            for (at, _) in launcher.match_indices("launch!(") {
                let call = items(inside(&launcher[at + 7..]));
                let args = items(inside(call.last().unwrap())).len();
                let function = call[0].strip_prefix("function ").map(str::trim);
                if let Some(function) = function.filter(|f| !f.starts_with('$')) {
                    let kernels = dynamic_kernels(function);
                    assert!(
                        !kernels.is_empty(),
                        "kernels/{file}.rs: unknown `{function}`"
                    );
                    for kernel in kernels {
                        check(file, kernel, args);
                    }
                } else if call[0] == "self" && call[2].starts_with('$') {
                    // launch_rule!'s template: `$($extra)*` stands for the rule's own arguments.
                    rule_base = Some(args - 1);
                } else if call[0] == "self" {
                    // `F | F_H for T` launches either kernel with the same arguments.
                    for kernel in call[2].split('|') {
                        let kernel = kernel.split_whitespace().next().unwrap_or_default();
                        check(file, kernel, args);
                    }
                }
            }
            for (at, _) in launcher.match_indices("=> launch ") {
                let rest = &launcher[at + "=> launch ".len()..];
                let open = rest.find('(').unwrap();
                let kernel = rest[..open].trim();
                if !kernel.starts_with('$') {
                    check(file, kernel, items(inside(&rest[open..])).len());
                }
            }
            for (at, _) in launcher.match_indices("launch_rule!(") {
                let call = items(inside(&launcher[at + "launch_rule!".len()..]));
                if call[0].starts_with('$') {
                    continue;
                }
                let base = rule_base.expect("launch_rule!'s template precedes its uses");
                check(file, call[0], base + items(inside(call[1])).len());
            }
        }
        assert!(
            checked >= KERNEL_NAMES.len(),
            "{checked} launches checked for {} kernels",
            KERNEL_NAMES.len()
        );
    }

    /// Compiles the source with NVRTC where the library is present (it needs no GPU), and says
    /// so loudly where it is not.
    #[test]
    fn source_compiles_with_nvrtc() {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            crate::cuda::test_util::skip_loudly(concat!(
                "SKIPPED (no NVRTC library): ",
                module_path!(),
                "::source_compiles_with_nvrtc"
            ));
            return;
        }
        // Turing (the oldest architecture CUDA 13 compiles for) and Ampere, on either side of
        // the source's `__CUDA_ARCH__` branches.
        for arch in ["compute_75", "compute_80"] {
            let ptx = compile(arch).unwrap_or_else(|e| panic!("{e}"));
            for name in KERNEL_NAMES {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "the PTX for {arch} lacks the entry `{name}`"
                );
            }
        }
    }
}
