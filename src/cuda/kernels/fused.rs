//! Launchers of the fused kernels (`fused.cu`): BatchNorm → Scale → ReLU,
//! what [`crate::cuda::layers::bn_scale_relu`] runs in place of three layers, and the two-bottom
//! Eltwise SUM → ReLU of [`crate::cuda::layers::eltwise_relu`].
//!
//! Shapes: activations `(N, C, S)` (`S` the product of the spatial axes); per-channel operands
//! `(C)`; the BatchNorm sums `(2C + 1)` doubles `[Σ t, Σ t·y, N·S]`, `y` the normalised input and
//! `t` the gradient reaching the Scale's output (`g`) or, in mixed precision, the one the Scale
//! passes to the BatchNorm (see [`ChainSums`]).
//!
//! In mixed precision ([`BnScaleRelu::half`]) the BatchNorm → Scale → ReLU kernels round every
//! value the three layers' CPU versions round, where they round it (`crate::precision`).
//!
//! The activations (`x`, `z` and their gradients; `x0`, `x1`, `y` and theirs) are stored as the
//! launchers' type parameter `T` says ([`StoredElem`]): FP32, or bit patterns of the half type
//! (the kernels' `_h` twins, which compute the same numbers and need [`BnScaleRelu::half`] or
//! `half` set). Channels-last half-type tensors of a multiple of 8 channels, 16-byte aligned,
//! take the chain's `_h8` kernels instead, which read several adjacent channels a thread and
//! compute the same bits (`fused.cu`).

use super::channel::channels_last_by_eight;
use super::{check_len, stored_half_arg, to_i32, Kernels, StoredElem};
use crate::cuda::gpu_error;
use crate::error::Result;
use crate::precision::Half;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, PushKernelArg,
    SyncOnDrop,
};
use std::sync::Arc;

/// The per-channel operands of the fused kernels over `dims = (N, C, S)`.
pub struct BnScaleRelu<'a> {
    /// `(C)` the statistics the forward normalises with.
    pub mean: &'a CudaSlice<f32>,
    pub inv_std: &'a CudaSlice<f32>,
    /// `(C)` the Scale's factor, and its bias when it has one.
    pub gamma: CudaView<'a, f32>,
    pub beta: Option<CudaView<'a, f32>>,
    /// The ReLU's negative slope (≥ 0); `None` when no ReLU follows the Scale.
    pub relu: Option<f32>,
    /// The residual sum and ReLU the chain ends in, if it does (then `relu` is `None`): only
    /// the forward reads it, the sum's backward being [`Kernels::sum2_relu_backward`].
    pub sum: Option<ResidualSum>,
    pub dims: (usize, usize, usize),
    /// The half type every layer's result is rounded to, in mixed precision.
    pub half: Option<Half>,
}

/// The Eltwise SUM → ReLU a BatchNorm chain may end in: `relu(c0 · b0 + c1 · b1)` over the sum's
/// bottoms, one the Scale's output and the other the shortcut.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResidualSum {
    /// The sum's coefficients, in the order of its bottoms.
    pub coeff: [f32; 2],
    /// Whether the shortcut is the sum's first bottom (else the Scale's output is).
    pub shortcut_first: bool,
    /// The ReLU's negative slope (≥ 0).
    pub slope: f32,
}

impl ResidualSum {
    /// The coefficients `(of the shortcut, of the Scale's output)`.
    pub fn coeff_of_shortcut_and_chain(&self) -> (f32, f32) {
        let [c0, c1] = self.coeff;
        if self.shortcut_first {
            (c0, c1)
        } else {
            (c1, c0)
        }
    }
}

/// Where [`Kernels::bn_scale_relu_sums`] gets `dz`, the gradient reaching the Scale's output (the
/// ReLU's top's, with a ReLU), `(N, C, S)` each, stored as `T`.
pub enum ChainGrad<'a, T> {
    /// Stored: the chain's top gradient, or what a residual sum's backward wrote for it.
    Stored(CudaView<'a, T>),
    /// From the residual sum → ReLU the chain ends in: its top `y` and top gradient `dy`. The
    /// pass runs that sum's backward for the Scale's output, `dz = coeff · dy · relu'(y)` (the
    /// ReLU's `slope`), rounded as the sum rounds it, and writes it to `dz_out`: the shortcut's
    /// gradient, which is the same value where the sum's coefficients are equal and the
    /// shortcut's gradient is overwritten (the caller's case); the backward's second pass then
    /// reads it as `dz`.
    FromSum {
        y: CudaView<'a, T>,
        dy: CudaView<'a, T>,
        dz_out: CudaViewMut<'a, T>,
        coeff: f32,
        slope: f32,
    },
}

/// Which sums [`Kernels::bn_scale_relu_sums`] takes and where it stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainSums {
    /// `Σ g`, `Σ g·y` into both the Scale's gradient and the BatchNorm's sums (whose backward
    /// multiplies them by `gamma`): without rounding.
    Both,
    /// `Σ g`, `Σ g·y` into the Scale's gradient only.
    Scale,
    /// `Σ g`, `Σ g·y` into the Scale's gradient and, in the same pass, the sums of
    /// `t = gamma · g` rounded into the BatchNorm's: in mixed precision, where the rounding of `t`
    /// keeps them from being `gamma` times the Scale's.
    Separate,
}

impl BnScaleRelu<'_> {
    /// Checks the per-channel operands and returns `(count, (N, C, S) as i32)`.
    fn check(&self, op: &str) -> (usize, (i32, i32, i32)) {
        let (n, c, s) = self.dims;
        check_len(op, "mean", self.mean.len(), c);
        check_len(op, "inv_std", self.inv_std.len(), c);
        check_len(op, "gamma", self.gamma.len(), c);
        if let Some(b) = &self.beta {
            check_len(op, "beta", b.len(), c);
        }
        let count = n * c * s;
        to_i32(op, count);
        (count, (to_i32(op, n), to_i32(op, c), to_i32(op, s)))
    }

    fn relu_args(&self) -> (i32, f32) {
        (self.relu.is_some() as i32, self.relu.unwrap_or(0.0))
    }

    /// The Scale's bias as the kernels take it, `(beta, has_beta)`: an absent bias passes
    /// gamma's address, never read (`has_beta` is 0).
    fn beta_args<'s>(&'s self, s: &'s CudaStream) -> ((CUdeviceptr, SyncOnDrop<'s>), i32) {
        match &self.beta {
            Some(b) => (b.device_ptr(s), 1),
            None => (self.gamma.device_ptr(s), 0),
        }
    }
}

impl Kernels {
    /// `z = relu(gamma · (x − mean) · inv_std + beta)` per channel, or with the chain's
    /// [`ResidualSum`] `z = relu(c0 · b0 + c1 · b1)` of that Scale output and the `shortcut`
    /// (`(N, C, S)`, read only then); `x`, `shortcut` and `z` stored as `T`.
    pub fn bn_scale_relu_forward<T: StoredElem>(
        &self,
        s: &CudaStream,
        op: &BnScaleRelu<'_>,
        x: &impl DevicePtr<T>,
        shortcut: Option<&CudaView<'_, T>>,
        z: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let name = "bn_scale_relu_forward";
        let (count, (_, c, sp)) = op.check(name);
        check_len(name, "x", x.len(), count);
        check_len(name, "z", z.len(), count);
        assert_eq!(
            shortcut.is_some(),
            op.sum.is_some(),
            "{name}: a shortcut exactly with a residual sum"
        );
        if let Some(r) = shortcut {
            check_len(name, "shortcut", r.len(), count);
        }
        if count == 0 {
            return Ok(());
        }
        let ni = count as i32;
        let (relu, slope) = match op.sum {
            Some(sum) => (1, sum.slope),
            None => op.relu_args(),
        };
        let ((bp, _b), has_beta) = op.beta_args(s);
        let half = stored_half_arg::<T>(name, op.half);
        // An absent shortcut passes x's address, never read (`has_res` is 0).
        let (rp, _r) = match shortcut {
            Some(r) => r.device_ptr(s),
            None => x.device_ptr(s),
        };
        let (has_res, res_first) = (
            op.sum.is_some() as i32,
            op.sum.is_some_and(|r| r.shortcut_first) as i32,
        );
        let [c0, c1] = op.sum.map_or([1.0, 1.0], |r| r.coeff);
        let ptrs = [x.device_ptr(s).0, z.device_ptr_mut(s).0, rp];
        if channels_last_by_eight::<T>(op.dims, &ptrs) {
            return launch!(
                self, s, bn_scale_relu_forward_h8,
                self.grid_resident(count / 8, self.chain_slots[0]),
                [
                    in x, in op.mean, in op.inv_std, in op.gamma, &bp, &has_beta, &relu, &slope,
                    &rp, &has_res, &res_first, &c0, &c1, out z, &ni, &c, &half,
                ]
            );
        }
        launch!(
            self, s, bn_scale_relu_forward | bn_scale_relu_forward_h for T, self.grid(count),
            [
                in x, in op.mean, in op.inv_std, in op.gamma, &bp, &has_beta, &relu, &slope, &rp,
                &has_res, &res_first, &c0, &c1, out z, &ni, &c, &sp, &half,
            ]
        )
    }

    /// The backward sums from the gradient `dz` reaching the Scale's output (or the ReLU's
    /// top, [`ChainGrad`]) and the bottom `x` (both stored as `T`; the normalised `y` and the
    /// Scale's output, whose sign is the ReLU's, recomputed from `x`), stored as `which` says:
    /// `sums (2C + 1)` = `[Σ t, Σ t·y, N·S]`, and the Scale's gradient
    /// `dparams = [dgamma (C), dbeta (C) when it has a bias]` (+)= `[Σ g·y, Σ g]`. Deterministic
    /// (the chunked two-stage sums of the BatchNorm layer). `zero_state`: the BatchNorm state's
    /// gradient `(2C + 1)` to overwrite with zeros, in the sums' last launch.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_scale_relu_sums<T: StoredElem>(
        &self,
        s: &Arc<CudaStream>,
        op: &BnScaleRelu<'_>,
        dz: ChainGrad<'_, T>,
        x: &impl DevicePtr<T>,
        sums: &mut CudaSlice<f64>,
        (dparams, accumulate): (&mut impl DevicePtrMut<f32>, bool),
        zero_state: Option<&mut CudaViewMut<'_, f32>>,
        which: ChainSums,
    ) -> Result<()> {
        let name = "bn_scale_relu_sums";
        let (count, (ni, ci, si)) = op.check(name);
        let (n, c, sp) = op.dims;
        check_len(name, "x", x.len(), count);
        match &dz {
            ChainGrad::Stored(dz) => check_len(name, "dz", dz.len(), count),
            ChainGrad::FromSum { y, dy, dz_out, .. } => {
                for (what, len) in [("y", y.len()), ("dy", dy.len()), ("dz", dz_out.len())] {
                    check_len(name, what, len, count);
                }
            }
        }
        check_len(name, "sums", sums.len(), 2 * c + 1);
        let ((bp, _b), has_beta) = op.beta_args(s);
        check_len(name, "dparams", dparams.len(), c * (1 + has_beta as usize));
        if let Some(state) = &zero_state {
            check_len(name, "zero_state", state.len(), 2 * c + 1);
        }
        if c == 0 {
            if let Some(state) = zero_state {
                s.memset_zeros(state)
                    .map_err(|e| gpu_error("zero the batch-norm state gradient", e))?;
            }
            return Ok(());
        }
        let (relu, slope) = op.relu_args();
        let half = stored_half_arg::<T>(name, op.half);
        let quad = which == ChainSums::Separate;
        let (quad_arg, per_element) = (quad as i32, if quad { 4 } else { 2 });
        let store_sums = (which != ChainSums::Scale) as i32;
        // Stored: dz's address for dy and dz_out too, neither read nor written (res_c is 0).
        let (from_sum, res_c, res_slope) = match &dz {
            ChainGrad::Stored(_) => (false, 0.0f32, 0.0f32),
            ChainGrad::FromSum { coeff, slope, .. } => (true, *coeff, *slope),
        };
        assert!(
            !from_sum || res_c != 0.0,
            "{name}: a residual sum's coefficient of 0 leaves no gradient to the chain"
        );
        let mut dz = dz;
        let ([zp, dyp, outp], _guards) = match &mut dz {
            ChainGrad::Stored(dz) => {
                let (p, g) = dz.device_ptr(s);
                ([p, p, p], (g, None, None))
            }
            ChainGrad::FromSum { y, dy, dz_out, .. } => {
                let ((yp, yg), (dyp, dyg)) = (y.device_ptr(s), dy.device_ptr(s));
                let (outp, outg) = dz_out.device_ptr_mut(s);
                ([yp, dyp, outp], (yg, Some(dyg), Some(outg)))
            }
        };
        let ptrs = [zp, dyp, outp, x.device_ptr(s).0];
        let by_eight = channels_last_by_eight::<T>(op.dims, &ptrs);
        let per = to_i32(name, n * sp);
        let acc = accumulate as i32;
        // Without a state gradient to zero, no pointer: the kernel reads none (`zeroing` is 0).
        let zeroing = zero_state.is_some() as i32;
        let (statep, _state) = match zero_state {
            Some(state) => {
                let (p, g) = state.device_ptr_mut(s);
                (p, Some(g))
            }
            None => (0, None),
        };
        self.two_stage_sums(
            s,
            (name, per_element),
            (op.dims, by_eight.then_some(4)),
            |grid, pp, spl| {
                let args = (&zp, &dyp, &outp, &res_c, &res_slope);
                if by_eight {
                    let chain_sums = match from_sum {
                        true => (&self.bn_scale_relu_sums_res_h8, "bn_scale_relu_sums_res_h8"),
                        false => (&self.bn_scale_relu_sums_h8, "bn_scale_relu_sums_h8"),
                    };
                    return launch!(
                        function chain_sums.0, chain_sums.1, s, grid,
                        [
                            args.0, args.1, args.2, args.3, args.4, in x, in op.mean,
                            in op.inv_std, in op.gamma, &bp, &has_beta, &relu, &slope, &pp, &ni,
                            &ci, &spl, &half, &quad_arg,
                        ]
                    );
                }
                launch!(
                    self, s, bn_scale_relu_sums | bn_scale_relu_sums_h for T, grid,
                    [
                        args.0, args.1, args.2, args.3, args.4, in x, in op.mean, in op.inv_std,
                        in op.gamma, &bp, &has_beta, &relu, &slope, &pp, &ni, &ci, &si, &spl,
                        &half, &quad_arg,
                    ]
                )
            },
            |pp, spl| {
                launch!(
                    self, s, bn_scale_relu_finish, self.grid_rows(c),
                    [
                        &pp, out sums, out dparams, &has_beta, &ci, &spl, &per, &acc, &store_sums,
                        &quad_arg, &statep, &zeroing,
                    ]
                )
            },
        )
    }

    /// `dx (+)=` the BatchNorm backward of `gamma · g`: with batch statistics from `sums`
    /// (after any all-reduce: [`ChainSums::Both`]'s, or in mixed precision
    /// [`ChainSums::Separate`]'s), else `gamma · g · inv_std`; `dz`, `x` (read with batch
    /// statistics or a ReLU, whose sign it recomputes) and `dx` stored as `T`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_scale_relu_backward<T: StoredElem>(
        &self,
        s: &CudaStream,
        op: &BnScaleRelu<'_>,
        dz: &impl DevicePtr<T>,
        x: &impl DevicePtr<T>,
        sums: &CudaSlice<f64>,
        batch_stats: bool,
        dx: &mut impl DevicePtrMut<T>,
        accumulate: bool,
    ) -> Result<()> {
        let name = "bn_scale_relu_backward";
        let (count, (_, ci, si)) = op.check(name);
        for (what, len) in [("dz", dz.len()), ("x", x.len()), ("dx", dx.len())] {
            check_len(name, what, len, count);
        }
        check_len(name, "sums", sums.len(), 2 * op.dims.1 + 1);
        if count == 0 {
            return Ok(());
        }
        let ni = count as i32;
        let (relu, slope) = op.relu_args();
        let (bs, acc) = (batch_stats as i32, accumulate as i32);
        let ((bp, _b), has_beta) = op.beta_args(s);
        let half = stored_half_arg::<T>(name, op.half);
        let ptrs = [
            dz.device_ptr(s).0,
            x.device_ptr(s).0,
            dx.device_ptr_mut(s).0,
        ];
        if channels_last_by_eight::<T>(op.dims, &ptrs) {
            return launch!(
                self, s, bn_scale_relu_backward_h8,
                self.grid_resident(count / 8, self.chain_slots[1]),
                [
                    in dz, in x, in op.mean, in op.inv_std, in op.gamma, &bp, &has_beta, in sums,
                    &bs, &relu, &slope, out dx, &ni, &ci, &acc, &half,
                ]
            );
        }
        launch!(
            self, s, bn_scale_relu_backward | bn_scale_relu_backward_h for T, self.grid(count),
            [
                in dz, in x, in op.mean, in op.inv_std, in op.gamma, &bp, &has_beta, in sums, &bs,
                &relu, &slope, out dx, &ni, &ci, &si, &acc, &half,
            ]
        )
    }

    /// From the top's data `y (n)` and gradient `dy (n)`: `dx_k (+)= c_k · dy · relu'(y)` for each
    /// bottom `k` whose entry of `dx` is `Some((gradient, accumulate))`, rounded to `half` in
    /// mixed precision; every tensor stored as `T`.
    #[allow(clippy::too_many_arguments)]
    pub fn sum2_relu_backward<T: StoredElem>(
        &self,
        s: &CudaStream,
        [c0, c1]: [f32; 2],
        slope: f32,
        y: &impl DevicePtr<T>,
        dy: &impl DevicePtr<T>,
        dx: [Option<(&mut CudaViewMut<'_, T>, bool)>; 2],
        n: usize,
        half: Option<Half>,
    ) -> Result<()> {
        let name = "sum2_relu_backward";
        check_len(name, "y", y.len(), n);
        check_len(name, "dy", dy.len(), n);
        for (what, d) in ["dx0", "dx1"].iter().zip(&dx) {
            if let Some((d, _)) = d {
                check_len(name, what, d.len(), n);
            }
        }
        if n == 0 || dx.iter().all(Option::is_none) {
            return Ok(());
        }
        let (ni, half) = (to_i32(name, n), stored_half_arg::<T>(name, half));
        let want = dx.each_ref().map(|d| d.is_some() as i32);
        let acc = dx
            .each_ref()
            .map(|d| d.as_ref().is_some_and(|(_, a)| *a) as i32);
        // An unwanted gradient passes dy's address, never written (its want flag is 0).
        let [dx0, dx1] = dx;
        let (dx0p, _dx0) = match dx0 {
            Some((d, _)) => d.device_ptr_mut(s),
            None => dy.device_ptr(s),
        };
        let (dx1p, _dx1) = match dx1 {
            Some((d, _)) => d.device_ptr_mut(s),
            None => dy.device_ptr(s),
        };
        launch!(
            self, s, sum2_relu_backward | sum2_relu_backward_h for T, self.grid(n),
            [
                in y, in dy, &c0, &c1, &slope, &dx0p, &dx1p, &want[0], &want[1], &acc[0], &acc[1],
                &ni, &half,
            ]
        )
    }

    /// `y (n) = relu(c0 · x0 + c1 · x1)` with the ReLU's negative slope `slope` (≥ 0), rounded to
    /// `half` in mixed precision; every tensor stored as `T`.
    #[allow(clippy::too_many_arguments)]
    pub fn sum2_relu_forward<T: StoredElem>(
        &self,
        s: &CudaStream,
        [c0, c1]: [f32; 2],
        slope: f32,
        x0: &impl DevicePtr<T>,
        x1: &impl DevicePtr<T>,
        y: &mut impl DevicePtrMut<T>,
        n: usize,
        half: Option<Half>,
    ) -> Result<()> {
        let name = "sum2_relu_forward";
        for (what, len) in [("x0", x0.len()), ("x1", x1.len()), ("y", y.len())] {
            check_len(name, what, len, n);
        }
        if n == 0 {
            return Ok(());
        }
        let (ni, half) = (to_i32(name, n), stored_half_arg::<T>(name, half));
        launch!(
            self, s, sum2_relu_forward | sum2_relu_forward_h for T, self.grid(n),
            [in x0, in x1, &c0, &c1, &slope, out y, &ni, &half]
        )
    }
}
