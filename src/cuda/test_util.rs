//! Helpers of the GPU tests: a device (or devices and NCCL) for a test or a loud skip where there
//! is none, and float comparison relative to a buffer's scale.
//!
//! ```ignore
//! use crate::cuda::test_util::gpu_or_skip;
//! #[test]
//! fn something_on_the_gpu() {
//!     let gpu = gpu_or_skip!("something_on_the_gpu"); // prints `SKIPPED (no CUDA device): …`
//!     // ...
//! }
//! ```

use super::{available, Gpu};
use crate::config::MathMode;

/// Device 0 in `math`, or `None` after writing `SKIPPED (no CUDA device): <name>` to stderr.
///
/// # Panics
/// When a device is present but cannot be opened: that is a failure, not a skip.
pub(crate) fn gpu_for_test(name: &str, math: MathMode) -> Option<Gpu> {
    if !available() {
        skip_loudly(&format!("SKIPPED (no CUDA device): {name}"));
        return None;
    }
    match Gpu::new(0, math) {
        Ok(gpu) => Some(gpu),
        Err(e) => panic!("{name}: a CUDA device is present but cannot be used: {e}"),
    }
}

/// Whether `n` CUDA devices and NCCL are present; a loud skip of `name` otherwise
/// (`SKIPPED (needs N CUDA device(s) and NCCL; …)`).
pub(crate) fn nccl_devices_or_skip(name: &str, n: usize) -> bool {
    use super::nccl::nccl_available;
    let have = if available() {
        super::device_count().unwrap_or(0)
    } else {
        0
    };
    if have < n || !nccl_available() {
        let nccl = if nccl_available() {
            "present"
        } else {
            "missing"
        };
        skip_loudly(&format!(
            "SKIPPED (needs {n} CUDA device(s) and NCCL; {have} device(s), NCCL {nccl}): {name}"
        ));
        return false;
    }
    true
}

/// Writes `line` to the process's stderr directly, so that the test harness's output capture
/// (which takes `eprintln!`) does not hide it: a skip shows in every `cargo test` run.
pub(crate) fn skip_loudly(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// `let gpu = gpu_or_skip!("test_name");` — device 0 in FP32 math (or the math mode given as a
/// second argument), or a loud skip and `return`.
macro_rules! gpu_or_skip {
    ($name:literal) => {
        match $crate::cuda::test_util::gpu_for_test(
            concat!(module_path!(), "::", $name),
            $crate::config::MathMode::Fp32,
        ) {
            Some(gpu) => gpu,
            None => return,
        }
    };
    ($name:literal, $math:expr) => {
        match $crate::cuda::test_util::gpu_for_test(concat!(module_path!(), "::", $name), $math) {
            Some(gpu) => gpu,
            None => return,
        }
    };
}
pub(crate) use gpu_or_skip;

/// Asserts `|got − want| ≤ rtol · (|want| + scale)` element by element, with `scale` the largest
/// `|want|`: relative for large elements, relative to the buffer's magnitude for those near 0
/// (where summation order alone moves the result). NaN never passes.
pub(crate) fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut worst: Option<(usize, f32)> = None;
    let mut failures = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let tol = rtol * (w.abs() + scale);
        // `err > tol` would let NaN through.
        let within = err <= tol;
        if !within {
            failures += 1;
            let excess = if err.is_nan() {
                f32::INFINITY
            } else {
                err / tol.max(f32::MIN_POSITIVE)
            };
            if worst.is_none_or(|(_, e)| excess > e) {
                worst = Some((i, excess));
            }
        }
    }
    if let Some((i, _)) = worst {
        panic!(
            "{what}: {failures} of {} elements differ beyond rtol {rtol} (scale {scale}); worst at \
             {i}: got {}, want {}",
            got.len(),
            got[i],
            want[i]
        );
    }
}
