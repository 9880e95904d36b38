//! Mixed precision's rounding (`cluster.math = "bf16" | "fp16"`): the half type of a run and
//! how an FP32 value is rounded to it. The CPU backend keeps every tensor in `f32` and rounds it
//! in place at the points the contract names (docs/design.md, "Mixed precision"), so that its
//! numbers are those of a GPU that stores the tensor in the half type:
//!
//! - the net's input `data` after normalisation, once per forward pass;
//! - every top a layer writes, except the outputs of loss layers and of layers the net reports
//!   (accuracy), which stay FP32;
//! - every bottom gradient a layer's backward leaves (after it accumulated into it in FP32);
//! - the learnable tensors, as a half copy of the FP32 master weights made at each forward
//!   pass; a stateful layer's tensors (BatchNorm's running statistics) are not rounded;
//! - a convolution's weight gradient (not its bias's): each backward's contribution,
//!   accumulated in FP32, is rounded once before it is added in FP32 to the parameter gradient,
//!   as cuDNN's weight gradient of half-type tensors comes out in the half type.
//!
//! The other parameter gradients, the loss, the update, the solver state and snapshots stay
//! FP32. Rounding is to nearest, ties to even; a NaN stays a NaN; in fp16 a value beyond ±65504
//! (more exactly, from 65520 on) becomes ±∞ and one below 2⁻²⁴ in magnitude flushes to a signed
//! zero or a subnormal, as a GPU's conversion does.
//!
//! ```
//! use p2ptrain::precision::Half;
//! assert_eq!(Half::Bf16.round(1.0 + 2f32.powi(-9)), 1.0); // 8 significant bits
//! assert_eq!(Half::Fp16.round(1.0 + 2f32.powi(-9)), 1.0 + 2f32.powi(-9)); // 11 bits
//! assert_eq!(Half::Fp16.round(70000.0), f32::INFINITY);
//! ```

use crate::config::MathMode;
use half::{bf16, f16};

/// A 16-bit floating-point type activations are kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// bfloat16: 8 significant bits, FP32's exponent range.
    Bf16,
    /// IEEE binary16: 11 significant bits, largest finite 65504.
    Fp16,
}

impl Half {
    /// The half type of `math`; `None` for FP32 and TF32 (nothing is rounded).
    pub fn of(math: MathMode) -> Option<Half> {
        match math {
            MathMode::Fp32 | MathMode::Tf32 => None,
            MathMode::Bf16 => Some(Half::Bf16),
            MathMode::Fp16 => Some(Half::Fp16),
        }
    }

    /// `x` rounded to this type and widened back to FP32 (exactly).
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Half::Bf16 => bf16::from_f32(x).to_f32(),
            Half::Fp16 => f16::from_f32(x).to_f32(),
        }
    }

    /// Rounds every element of `values` in place.
    pub fn round_slice(self, values: &mut [f32]) {
        match self {
            Half::Bf16 => values
                .iter_mut()
                .for_each(|v| *v = bf16::from_f32(*v).to_f32()),
            Half::Fp16 => values
                .iter_mut()
                .for_each(|v| *v = f16::from_f32(*v).to_f32()),
        }
    }

    /// Whether this is fp16 (the kernels' `fp16` flag).
    pub fn is_fp16(self) -> bool {
        self == Half::Fp16
    }

    /// The value of the bit pattern `bits` of this type, widened to FP32 (exactly).
    #[inline]
    pub fn widen(self, bits: u16) -> f32 {
        match self {
            Half::Bf16 => bf16::from_bits(bits).to_f32(),
            Half::Fp16 => f16::from_bits(bits).to_f32(),
        }
    }

    /// The bit pattern of `x` rounded to this type.
    #[inline]
    pub fn bits(self, x: f32) -> u16 {
        match self {
            Half::Bf16 => bf16::from_f32(x).to_bits(),
            Half::Fp16 => f16::from_f32(x).to_bits(),
        }
    }

    /// Whether `x` is a value of this type (rounding leaves it unchanged; NaN counts).
    pub fn holds(self, x: f32) -> bool {
        x.is_nan() || self.round(x) == x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_half_modes_round() {
        assert_eq!(Half::of(MathMode::Fp32), None);
        assert_eq!(Half::of(MathMode::Tf32), None);
        assert_eq!(Half::of(MathMode::Bf16), Some(Half::Bf16));
        assert_eq!(Half::of(MathMode::Fp16), Some(Half::Fp16));
    }

    /// Ties go to the even neighbour; the ranges are the types' own.
    #[test]
    fn rounding_is_to_nearest_even_within_each_types_range() {
        let one_and = |bits: i32| 1.0 + 2f32.powi(-bits);
        assert_eq!(Half::Bf16.round(one_and(8)), 1.0); // a tie: even wins
        assert_eq!(Half::Bf16.round(one_and(7)), one_and(7));
        assert_eq!(Half::Fp16.round(one_and(11)), 1.0);
        assert_eq!(Half::Fp16.round(one_and(10)), one_and(10));
        assert_eq!(Half::Fp16.round(65504.0), 65504.0);
        assert_eq!(Half::Fp16.round(-1e6), f32::NEG_INFINITY);
        assert!(Half::Bf16.round(1e30).is_finite());
        assert_eq!(Half::Fp16.round(2f32.powi(-26)), 0.0);
        assert!(Half::Fp16.round(f32::NAN).is_nan());
        let mut v = [0.1f32, -3.3, 1e-3];
        Half::Fp16.round_slice(&mut v);
        assert!(v.iter().all(|&x| Half::Fp16.holds(x)));
        assert!(!Half::Bf16.holds(0.1));
    }
}
