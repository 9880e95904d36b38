//! What every launcher shares (the kernels' shared helpers are in `common.cu` beside this file):
//! the [`launch!`] macro every launcher starts its kernel with, the launch geometries of the
//! grid-stride, one-warp-per-row and single-block kernels, the length checks (one buffer at a
//! time, or every buffer of a kernel over `(n)` elements at once), and the
//! stream-holding kernel of the path timings.
//!
//! Every launcher enqueues on the stream it is given and returns at once; nothing synchronises.
//! Lengths are in elements; a launcher panics when a buffer is shorter than the elements it is
//! asked to touch (a bug in the caller, never a data error).

use super::Kernels;
use crate::error::Result;
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

/// The one way every launcher starts a kernel: launches `$func` of `$k` on `$stream` with
/// `$cfg` and the arguments in the kernel's parameter order, mapping an error to one naming the
/// kernel. An argument is `in BUF` (a `DevicePtr` read by the kernel), `out BUF` (a
/// `DevicePtrMut` it writes) or a reference to a value that lives until the launch returns; the
/// device pointers of `in` and `out` buffers are taken on `$stream` and held until the launch
/// has been enqueued. The form `launch!(function F, NAME, stream, cfg, [args])` launches the
/// `CudaFunction` reference `F` instead, for a kernel picked at run time among several of the
/// same parameter list.
macro_rules! launch {
    ($k:expr, $stream:expr, $func:ident, $cfg:expr, [$($args:tt)*]) => {
        launch!(@bind &$k.$func, stringify!($func), $stream, $cfg, [] [$($args)*])
    };
    (function $f:expr, $name:expr, $stream:expr, $cfg:expr, [$($args:tt)*]) => {
        launch!(@bind $f, $name, $stream, $cfg, [] [$($args)*])
    };
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*] []) => {{
        let mut builder = $s.launch_builder($f);
        $(builder.arg($done);)*
        // SAFETY: the arguments match the kernel's parameter list in SOURCE, in order and type
        // (device pointers are passed as 64-bit addresses), and the caller checked that every
        // buffer holds the elements the kernel touches.
        unsafe { builder.launch($cfg) }
            .map(|_| ())
            .map_err(|e| $crate::cuda::gpu_error(&format!("launch {}", $name), e))
    }};
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*]
        [in $x:expr $(, $($rest:tt)*)?]) => {{
        let (ptr, _guard) = $x.device_ptr($s);
        launch!(@bind $f, $name, $s, $cfg, [$($done,)* &ptr] [$($($rest)*)?])
    }};
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*]
        [out $x:expr $(, $($rest:tt)*)?]) => {{
        let (ptr, _guard) = $x.device_ptr_mut($s);
        launch!(@bind $f, $name, $s, $cfg, [$($done,)* &ptr] [$($($rest)*)?])
    }};
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*]
        [$arg:expr $(, $($rest:tt)*)?]) => {
        launch!(@bind $f, $name, $s, $cfg, [$($done,)* $arg] [$($($rest)*)?])
    };
}

/// Threads per block of the grid-stride kernels; a multiple of the warp size.
pub(super) const BLOCK: u32 = 256;
/// Rows per block of the one-warp-per-row kernels (`BLOCK / 32`).
pub(super) const ROWS_PER_BLOCK: usize = (BLOCK / 32) as usize;

pub(super) fn check_len(op: &str, what: &str, have: usize, need: usize) {
    assert!(
        have >= need,
        "{op}: `{what}` holds {have} elements, {need} needed"
    );
}

pub(super) fn to_i32(op: &str, n: usize) -> i32 {
    i32::try_from(n).unwrap_or_else(|_| panic!("{op}: {n} elements exceed the kernel's int range"))
}

/// The checks of a kernel over `(n)` elements: panics unless every buffer of `lens`
/// `(name, elements)` holds `n` elements ([`check_len`]). Returns whether there is anything to
/// launch (`n > 0`).
pub(super) fn check_lens(op: &str, n: usize, lens: &[(&str, usize)]) -> bool {
    for &(what, len) in lens {
        check_len(op, what, len, n);
    }
    n > 0
}

/// [`check_lens`], then `n` as the kernel's `int` (panics beyond its range); `None` when there is
/// nothing to launch.
pub(super) fn int_count(op: &str, n: usize, lens: &[(&str, usize)]) -> Option<i32> {
    check_lens(op, n, lens).then(|| to_i32(op, n))
}

impl Kernels {
    /// One wave of `BLOCK`-thread blocks over `n` elements (at least one block).
    pub(super) fn grid(&self, n: usize) -> LaunchConfig {
        let blocks = n
            .div_ceil(BLOCK as usize)
            .clamp(1, self.max_blocks as usize) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One warp per row over `rows` rows.
    pub(super) fn grid_rows(&self, rows: usize) -> LaunchConfig {
        let blocks = rows
            .div_ceil(ROWS_PER_BLOCK)
            .clamp(1, self.max_blocks as usize) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// A single block (the final step of a reduction).
    pub(super) fn single_block() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One warp, of which thread 0 works (scalar bookkeeping).
    pub(super) fn single_thread() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Keeps `s` busy for `ns` nanoseconds of device time (`hold_stream`, one thread): work
    /// enqueued behind it starts no sooner.
    pub fn hold_stream(&self, s: &CudaStream, ns: u64) -> Result<()> {
        let ns = i64::try_from(ns).unwrap_or(i64::MAX);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, s, hold_stream, one, [&ns])
    }
}
