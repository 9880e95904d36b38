//! Launchers of the bfloat16 gradient wire's kernels (`wire.cu`): FP32 to bfloat16 bits (round to
//! nearest, ties to even, as `crate::dist::wire::to_wire`) and bfloat16 bits back to FP32 times a
//! scale (`crate::dist::wire::from_wire_scaled`), both over `(n)` elements of the flat gradient;
//! and the copy-engine wire's sum of one bucket slice over the replicas (`crate::cuda::peer_wire`).

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

launchers! {
    /// `w[..n] = bf16(x[..n])`, as bfloat16 bit patterns.
    pub fn to_bf16(x: in f32, w: out u16, n: elements as i64) => launch to_bf16(in x, out w, &n);

    /// `x[..n] = float(w[..n]) · scale`, from bfloat16 bit patterns.
    pub fn from_bf16_scaled(w: in u16, x: out f32, scale: f32, n: elements as i64)
        => launch from_bf16_scaled(in w, out x, &scale, &n);

    /// `own[..n]` ← the bfloat16 sum over `replicas` replicas in rank order, each addition
    /// rounded once (`crate::dist::wire::add`): replica `rank`'s term is `own[i]`, replica `s`'s
    /// `slots[s · stride + i]` (slot `rank` is not read).
    pub fn sum_bf16_slices(
        slots: in u16 [(replicas - 1) * stride + n],
        stride: usize,
        own: out u16,
        rank: usize as i32,
        replicas: usize as i32,
        n: elements as i64
    ) { let stride = stride as i64; } => launch sum_bf16_slices(in slots, &stride, out own, &rank, &replicas, &n);
}
