//! What every launcher shares (the kernels' shared helpers are in `common.cu` beside this file):
//! the `launch!` macro every launcher starts its kernel with, the `launchers!` macro that
//! declares the launchers of one kernel each from compact signatures, the launch geometries of the
//! grid-stride, one-warp-per-row and single-block kernels, the length checks (one buffer at a
//! time, or every buffer of a kernel over `(n)` elements at once), and the
//! stream-holding kernel of the path timings; and [`StoredElem`], the element type by which the
//! launchers of kernels with a half-type twin (`NAME_h`, on half-type blobs) pick the kernel.
//!
//! Every launcher enqueues on the stream it is given and returns at once; nothing synchronises.
//! Lengths are in elements; a launcher panics when a buffer is shorter than the elements it is
//! asked to touch (a bug in the caller, never a data error).

use super::Kernels;
use crate::error::Result;
use crate::precision::Half;
use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

/// The one way every launcher starts a kernel: launches `$func` of `$k` on `$stream` with
/// `$cfg` and the arguments in the kernel's parameter order, mapping an error to one naming the
/// kernel. An argument is `in BUF` (a `DevicePtr` read by the kernel), `out BUF` (a
/// `DevicePtrMut` it writes) or a reference to a value that lives until the launch returns; the
/// device pointers of `in` and `out` buffers are taken on `$stream` and held until the launch
/// has been enqueued. The form `launch!(function F, NAME, stream, cfg, [args])` launches the
/// `CudaFunction` reference `F` instead, for a kernel picked at run time among several of the
/// same parameter list. The form `launch!(self, s, F | F_H for T, cfg, [args])` launches
/// `F`, or its half-type twin `F_H` where `T` ([`StoredElem`]) is the half type's bit patterns:
/// the kernel of a launcher generic over how its activations are stored.
macro_rules! launch {
    ($k:expr, $stream:expr, $func:ident, $cfg:expr, [$($args:tt)*]) => {
        launch!(@bind &$k.$func, stringify!($func), $stream, $cfg, [] [$($args)*])
    };
    ($k:expr, $stream:expr, $func:ident | $func_h:ident for $t:ty, $cfg:expr, [$($args:tt)*]) => {{
        let (function, name) = if <$t as $crate::cuda::kernels::StoredElem>::HALF {
            (&$k.$func_h, stringify!($func_h))
        } else {
            (&$k.$func, stringify!($func))
        };
        launch!(@bind function, name, $stream, $cfg, [] [$($args)*])
    }};
    (function $f:expr, $name:expr, $stream:expr, $cfg:expr, [$($args:tt)*]) => {
        launch!(@bind $f, $name, $stream, $cfg, [] [$($args)*])
    };
    (@bind $f:expr, $name:expr, $s:expr, $cfg:expr, [$($done:expr),*] []) => {{
        #[cfg(test)]
        $crate::cuda::kernels::launched::record(&$name);
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

/// Declares launchers of one kernel each from compact signatures, so that the checks and
/// conversions every launcher makes are written once. Each entry
///
/// ```text
/// /// What it computes, with the shapes.
/// pub fn NAME(PARAM, ..) over [COUNT] { PREP } => launch KERNEL(ARG, ..) GRID;
/// ```
///
/// (`over [COUNT]`, `{ PREP }` and `GRID` optional) becomes
/// `pub fn NAME(&self, s: &CudaStream, PARAM, ..) -> Result<()>`, which
/// 1. panics unless every device buffer holds the elements it needs ([`check_len`]),
/// 2. returns at once when the element count is 0,
/// 3. converts the parameters marked `as i32` / `as i64` to the kernel's integers (panicking
///    beyond `int`'s range, [`to_i32`]),
/// 4. runs the statements `PREP`, which see the launcher's name as `OP`,
/// 5. launches `KERNEL` on `s` with the `ARG`s as `launch!` takes them, over `GRID`:
///    `grid N` one wave over `N` elements, `on CONFIG` that launch configuration, none one wave
///    over the element count.
///
/// A `PARAM` is one of
/// - `x: in T` / `x: out T`: a device buffer the kernel reads (`&impl DevicePtr<T>`) / writes
///   (`&mut impl DevicePtrMut<T>`) holding the element count; `x: in T [LEN]`: holding `LEN`;
/// - `n: elements as i32` / `n: elements as i64`: the element count (`usize`), passed as the
///   kernel's `int` / `long long`; `(a, b, c): elements as i32`: a shape of `usize`s whose
///   product is the element count (within `int`'s range), each passed as an `int`;
/// - `k: usize as i32`, `(a, b): (usize, usize) as i32`: `int`s; `flag: bool as i32`: 0 or 1;
/// - `x: TYPE`, `(a, b): TYPE` or `[a, b]: TYPE`: any other parameter, as it is.
///
/// Where no parameter is the element count, `over [COUNT]` gives it: an expression of the
/// parameters as passed (evaluated where it is needed; `PREP` checks its range where the kernel
/// takes it as an `int`). Without either, nothing is skipped and `GRID` must be given.
macro_rules! launchers {
    ($(
        $(#[$attr:meta])*
        pub fn $name:ident($($params:tt)*) $(over [$count:expr])? $({ $($prep:tt)* })?
            => launch $kernel:ident($($args:tt)*) $($grid:ident $grid_arg:expr)?;
    )*) => {
        // Each launcher: `@param` reads its parameters one at a time into the signature, the
        // buffers to check, the element count and the conversions; `@emit` writes the method.
        // The `self` token travels in the head, so that the receiver and its uses share one
        // hygiene context.
        impl Kernels {$(
            launchers!(@param
                [self [$(#[$attr])*] $name [$($($prep)*)?] $kernel [$($args)*]]
                [$($grid $grid_arg)?] [] [] [$($count)?] [] $($params)*
            );
        )*}
    };
    // Every parameter read: the grid defaults to one wave over the element count.
    (@param $head:tt [] $sig:tt $ops:tt [$($count:tt)+] $conv:tt) => {
        launchers!(@emit $head [grid $($count)+] $sig $ops [$($count)+] $conv);
    };
    (@param $head:tt $grid:tt $sig:tt $ops:tt $count:tt $conv:tt) => {
        launchers!(@emit $head $grid $sig $ops $count $conv);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] [$($ops:tt)*] $count:tt $conv:tt
        $p:ident : in $t:ty $([$len:expr])? $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* $p: &impl DevicePtr<$t>,]
            [$($ops)* ($p $($len)?)] $count $conv $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] [$($ops:tt)*] $count:tt $conv:tt
        $p:ident : out $t:ty $([$len:expr])? $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* $p: &mut impl DevicePtrMut<$t>,]
            [$($ops)* ($p $($len)?)] $count $conv $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt [] [$($conv:tt)*]
        $p:ident : elements as i32 $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* $p: usize,] $ops [$p]
            [$($conv)* let $p = to_i32(OP, $p);] $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt [] [$($conv:tt)*]
        $p:ident : elements as i64 $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* $p: usize,] $ops [$p]
            [$($conv)* let $p = $p as i64;] $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt [] [$($conv:tt)*]
        ($first:ident $(, $p:ident)+) : elements as i32 $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid
            [$($sig)* ($first $(, $p)+): (usize $(, launchers!(@usize $p))+),] $ops
            [$first $(* $p)+]
            [
                $($conv)* to_i32(OP, $first $(* $p)+);
                let $first = to_i32(OP, $first);
                $(let $p = to_i32(OP, $p);)+
            ]
            $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt $count:tt [$($conv:tt)*]
        $p:ident : usize as i32 $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* $p: usize,] $ops $count
            [$($conv)* let $p = to_i32(OP, $p);] $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt $count:tt [$($conv:tt)*]
        $p:ident : bool as i32 $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* $p: bool,] $ops $count
            [$($conv)* let $p = i32::from($p);] $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt $count:tt [$($conv:tt)*]
        ($($p:ident),+) : ($($t:ty),+) as i32 $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* ($($p),+): ($($t),+),] $ops $count
            [$($conv)* $(let $p = to_i32(OP, $p);)+] $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt $count:tt $conv:tt
        $p:ident : $t:ty $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* $p: $t,] $ops $count $conv $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt $count:tt $conv:tt
        ($($p:ident),+) : $t:ty $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* ($($p),+): $t,] $ops $count $conv
            $($($rest)*)?);
    };
    (@param $head:tt $grid:tt [$($sig:tt)*] $ops:tt $count:tt $conv:tt
        [$($p:ident),+] : $t:ty $(, $($rest:tt)*)?) => {
        launchers!(@param $head $grid [$($sig)* [$($p),+]: $t,] $ops $count $conv
            $($($rest)*)?);
    };
    (@emit [$this:tt [$($attr:tt)*] $name:ident [$($prep:tt)*] $kernel:ident [$($args:tt)*]]
        [$how:ident $grid:expr] [$($sig:tt)*] [$(($op:ident $($len:expr)?))*] $count:tt
        [$($conv:tt)*]) => {
        $($attr)*
        #[allow(clippy::too_many_arguments)]
        pub fn $name(&$this, s: &CudaStream, $($sig)*) -> Result<()> {
            const OP: &str = stringify!($name);
            $(check_len(OP, stringify!($op), $op.len(), launchers!(@need $count $($len)?));)*
            launchers!(@return_if_empty $count);
            let grid = launchers!(@grid $this $how $grid);
            $($conv)*
            $($prep)*
            launch!($this, s, $kernel, grid, [$($args)*])
        }
    };
    (@need [$count:expr]) => { $count };
    (@need $count:tt $len:expr) => { $len };
    (@return_if_empty []) => {};
    (@return_if_empty [$count:expr]) => {
        if $count == 0 {
            return Ok(());
        }
    };
    (@grid $this:tt grid $n:expr) => { $this.grid($n) };
    (@grid $this:tt on $config:expr) => { $config };
    (@usize $p:ident) => { usize };
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
    /// Threads of one full wave of a grid-stride kernel ([`Kernels::grid`]'s largest grid): an
    /// elementwise kernel over more than four times as many elements runs
    /// `grid_stride_by_four`'s four-at-a-time loop (`common.cu`), which tests must reach.
    pub fn wave_threads(&self) -> usize {
        self.max_blocks as usize * BLOCK as usize
    }

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

    /// [`Kernels::grid`] over `n` elements for a grid-stride kernel of which `slots` blocks are
    /// resident on the device at once: at most those, so that every block runs from the start
    /// and none waits for a second wave (each block of a grid-stride loop takes an equal share).
    pub(super) fn grid_resident(&self, n: usize, slots: u32) -> LaunchConfig {
        let mut cfg = self.grid(n);
        cfg.grid_dim.0 = cfg.grid_dim.0.min(slots.max(1));
        cfg
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

/// The kernels' `half` argument (`round_if_half` in `elementwise.cu`): 0 none, 1 bf16, 2 fp16.
pub(super) fn half_arg(half: Option<Half>) -> i32 {
    match half {
        None => 0,
        Some(Half::Bf16) => 1,
        Some(Half::Fp16) => 2,
    }
}

/// How the activations of a kernel with a half-type twin are stored, as its launcher's type
/// parameter: `f32`, or `u16` for bit patterns of mixed precision's half type, which the twin
/// (named with `_h`) widens as it loads them and writes rounded (`load_value`, `store_value` in
/// `elementwise.cu`), computing the FP32 kernel's numbers.
pub trait StoredElem: DeviceRepr + Sized {
    /// Whether the elements are half-type bit patterns.
    const HALF: bool;
}

impl StoredElem for f32 {
    const HALF: bool = false;
}

impl StoredElem for u16 {
    const HALF: bool = true;
}

/// [`half_arg`] for a kernel whose activations are stored as `T`: half-type elements need their
/// type (panics without one, a bug of the caller).
pub(super) fn stored_half_arg<T: StoredElem>(op: &str, half: Option<Half>) -> i32 {
    assert!(
        !T::HALF || half.is_some(),
        "{op}: half-type tensors without their half type"
    );
    half_arg(half)
}

/// Under test, the kernels launched on each thread: which of several kernels a launcher picks
/// is decided at run time (by element type, channel count, layout and the buffers' alignment),
/// so a test of one path asserts it was taken.
#[cfg(test)]
pub mod launched {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    thread_local! {
        static NAMES: RefCell<BTreeSet<String>> = const { RefCell::new(BTreeSet::new()) };
    }

    /// Notes that this thread launched the kernel `name`.
    pub fn record(name: &str) {
        NAMES.with(|names| {
            let mut names = names.borrow_mut();
            if !names.contains(name) {
                names.insert(name.to_owned());
            }
        });
    }

    /// The names of the kernels this thread launched since the last call, and forgets them.
    pub fn take() -> BTreeSet<String> {
        NAMES.with(|names| std::mem::take(&mut *names.borrow_mut()))
    }
}
