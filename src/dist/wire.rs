//! The bfloat16 gradient wire (`[cluster] reduce_dtype = "bf16"`): how a gradient element is
//! rounded to bfloat16 and back, and how two wire values add — the arithmetic the GPU backend's
//! conversion kernels and NCCL's `ncclBfloat16` sum perform, written once for the CPU backend
//! (`CpuComm::all_reduce_avg_bf16`) and as the reference the GPU kernels are tested against bit
//! for bit.
//!
//! - **Rounding** (`to_wire`): to nearest, ties to even (`half::bf16::from_f32`); a NaN stays a
//!   NaN (quiet bit set, sign and upper payload kept), values beyond bfloat16's largest finite
//!   round to ±∞ as round-to-nearest says. bfloat16 keeps FP32's exponent range and 8
//!   significant bits: a relative rounding error of at most 2⁻⁸ per element.
//! - **Adding** (`add`): the exact sum of two wire values rounded once to bfloat16 (their FP32
//!   sum is exact, or off by less than can move the bfloat16 rounding). This is NCCL's bfloat16
//!   sum on every device and algorithm of two operands, so two replicas' all-reduce is emulated
//!   exactly. With R > 2 replicas the partial sums are rounded R − 1 times in an order NCCL's
//!   ring or tree picks (and the CPU backend fixes: local replicas in slot order, then MPI's
//!   order over processes); two orders differ by at most about 2·(R − 1)·2⁻⁸·Σ|gᵣ| per element.
//! - **Back** (`from_wire_scaled`): the bfloat16 sum widened to FP32 (exact) times `1/R` in
//!   FP32: the averaged gradient.
//!
//! ```
//! use p2ptrain::dist::wire::{add, from_wire_scaled, to_wire};
//! let (a, b) = (to_wire(1.0), to_wire(2f32.powi(-8))); // 1 + 2⁻⁸ is a tie: even wins
//! assert_eq!(from_wire_scaled(add(a, b), 1.0), 1.0);
//! assert_eq!(from_wire_scaled(to_wire(0.1), 0.5), 0.050048828125); // 0.1 → 0.10009765625
//! ```

use half::bf16;

/// `x` rounded to bfloat16: to nearest, ties to even; NaN stays NaN.
#[inline]
pub fn to_wire(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// The sum of two wire values as NCCL's bfloat16 sum delivers it: rounded once.
#[inline]
pub fn add(a: bf16, b: bf16) -> bf16 {
    a + b
}

/// A wire value widened to FP32 (exact) and multiplied by `scale` (`1/R` for the average).
#[inline]
pub fn from_wire_scaled(v: bf16, scale: f32) -> f32 {
    v.to_f32() * scale
}

/// `out ← to_wire(x)` elementwise (`out` resized to `x`).
pub fn round_into(x: &[f32], out: &mut Vec<bf16>) {
    out.clear();
    out.extend(x.iter().map(|&v| to_wire(v)));
}

/// `dst[i] ← add(src[i], dst[i])`: one bfloat16 reduction step over two wire buffers (the MPI
/// operation of `MpiLink::sum_bf16`).
pub fn add_into(src: &[bf16], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "wire buffers of different lengths");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = add(*s, *d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(x: f32) -> u16 {
        to_wire(x).to_bits()
    }

    /// Round to nearest, ties to even, at the 16-bit boundary of the FP32 pattern.
    #[test]
    fn rounding_is_to_nearest_with_ties_to_even() {
        // 1.0 = 0x3F80_0000; the bfloat16 step there is 2⁻⁷ (low half 0x1_0000).
        let cases: [(u32, u16, &str); 9] = [
            (0x3F80_7FFF, 0x3F80, "below half: down"),
            (0x3F80_8000, 0x3F80, "tie, even below: down"),
            (0x3F81_8000, 0x3F82, "tie, odd below: up"),
            (0x3F80_8001, 0x3F81, "above half: up"),
            (0xBF80_0000, 0xBF80, "-1 exactly"),
            (0x7F7F_FFFF, 0x7F80, "the largest finite rounds up to +inf"),
            (0x7F80_0000, 0x7F80, "+inf"),
            (0x7F80_0001, 0x7FC0, "a signalling NaN is quieted"),
            (0x0000_8001, 0x0001, "subnormals round too"),
        ];
        for (x, want, what) in cases {
            assert_eq!(bits(f32::from_bits(x)), want, "{x:#010x}: {what}");
        }
        assert!(to_wire(f32::NAN).is_nan());
    }

    /// The relative error of one rounding is at most 2⁻⁸ (normal range).
    #[test]
    fn one_rounding_is_within_half_a_step() {
        let mut x = 1.0e-30f32;
        while x < 1.0e30 {
            for v in [x, -x * 1.37] {
                let r = from_wire_scaled(to_wire(v), 1.0);
                assert!(((r - v) / v).abs() <= 2f32.powi(-8), "{v} → {r}");
            }
            x *= 1.618;
        }
    }

    /// Two operands: one rounding of the exact sum, the same in either order; a sum far below
    /// the larger operand's step leaves it unchanged.
    #[test]
    fn adding_two_wire_values_rounds_once() {
        let (a, b) = (to_wire(1.0), to_wire(3.0 * 2f32.powi(-9)));
        // 1 + 0.75·2⁻⁷ → nearest step of 2⁻⁷ above 1.
        assert_eq!(add(a, b).to_f32(), 1.0 + 2f32.powi(-7));
        assert_eq!(add(a, b), add(b, a));
        assert_eq!(add(a, to_wire(1e-20)), a);
        let mut dst = vec![to_wire(1.0), to_wire(-2.0)];
        add_into(&[to_wire(1.0), to_wire(0.5)], &mut dst);
        assert_eq!(dst, [to_wire(2.0), to_wire(-1.5)]);
    }

    #[test]
    fn round_into_rounds_each_element() {
        let mut out = Vec::new();
        round_into(&[0.1, 1.0, f32::NAN], &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].to_bits(), 0x3DCD);
        assert_eq!(out[1], to_wire(1.0));
        assert!(out[2].is_nan());
    }
}
