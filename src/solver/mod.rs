//! The solver's update step: the learning-rate schedule ([`learning_rate`]) and [`Solver`], which
//! owns the update rule (SGD, Nesterov, AdaGrad, RMSProp, Adam, AdamW, AdaDelta) and its history buffers and turns
//! the averaged gradient in [`Params::diff`] into new weights in [`Params::data`]. The training loop,
//! the all-reduce and snapshots live elsewhere (`parallel::sync`, `snapshot`).
//!
//! One iteration, as the caller drives it:
//!
//! ```
//! use p2ptrain::backend::Cpu;
//! use p2ptrain::config::FillerConfig;
//! use p2ptrain::params::{ParamSpan, Params};
//! use p2ptrain::solver::{zero_grad, Solver};
//! # let cfg: p2ptrain::config::SolverConfig = toml::from_str("base_lr = 0.1\nmax_iter = 10").unwrap();
//! let mut params = Params::new(vec![ParamSpan {
//!     layer: 0,
//!     full_name: "ip1.weight".into(),
//!     shape: vec![2, 3],
//!     offset: 0,
//!     len: 0,
//!     lr_mult: 1.0,
//!     decay_mult: 1.0,
//!     filler: FillerConfig::constant(0.0),
//! }]);
//! let mut solver = Solver::new(&cfg, params.len());
//! let cpu = Cpu::default();
//! for iter in 0..cfg.max_iter {
//!     zero_grad(&mut params);
//!     // forward/backward over `iter_size` sub-batches accumulate into params.diff,
//!     // then the replicas average params.diff.
//!     params.diff.fill(1.0);
//!     let lr = solver.apply(&cpu, iter, &mut params);
//!     assert_eq!(lr, 0.1);
//! }
//! ```

pub mod loss_scale;
mod lr_policy;
pub mod non_finite;
mod update;

pub use lr_policy::learning_rate;

use crate::backend::Cpu;
use crate::config::{Regularization, SolverConfig, SolverType};
use crate::params::Params;
use tracing::debug;
use update::{AdamStep, Coeffs};

/// Zeroes the gradient buffer. Backward passes accumulate into `params.diff`, so the caller calls
/// this at the start of every iteration, before the first sub-batch (Caffe's `ClearParamDiffs`).
pub fn zero_grad(params: &mut Params) {
    params.diff.fill(0.0);
}

/// The update rule of one replica and its history. Every replica runs the same rule on the same
/// averaged gradient, so replicas stay bit-identical without broadcasting weights.
///
/// History buffers are flat, in the layout of [`Params::data`] (tensor `s` at `s.range()`):
///
/// | rule       | `history()`              |
/// |------------|--------------------------|
/// | SGD        | `[v]` momentum           |
/// | Nesterov   | `[v]` momentum           |
/// | AdaGrad    | `[h]` running Σ g²       |
/// | RMSProp    | `[h]` running mean of g² |
/// | Adam       | `[m, v]` first and second moment estimates |
/// | AdamW      | `[m, v]` as Adam             |
/// | AdaDelta   | `[h, u]` running means of g² and of the squared steps |
#[derive(Debug, Clone)]
pub struct Solver {
    cfg: SolverConfig,
    history: Vec<Vec<f32>>,
}

impl Solver {
    /// A solver for `n_params` learnable floats ([`Params::len`]), with zeroed history.
    pub fn new(cfg: &SolverConfig, n_params: usize) -> Self {
        let buffers = Solver::buffers(cfg.solver_type);
        Solver {
            cfg: cfg.clone(),
            history: vec![vec![0.0; n_params]; buffers],
        }
    }

    /// The number of history buffers of `rule` (see the table on [`Solver`]).
    pub fn buffers(rule: SolverType) -> usize {
        match rule {
            SolverType::Adam | SolverType::Adamw | SolverType::Adadelta => 2,
            _ => 1,
        }
    }

    /// The `[solver]` config this solver runs.
    pub fn config(&self) -> &SolverConfig {
        &self.cfg
    }

    /// Names of the history buffers, in the order of [`Solver::history`]: `["momentum"]` for SGD
    /// and Nesterov, `["h"]` for AdaGrad and RMSProp, `["m", "v"]` for Adam.
    pub fn history_names(&self) -> &'static [&'static str] {
        match self.cfg.solver_type {
            SolverType::Sgd | SolverType::Nesterov => &["momentum"],
            SolverType::Adagrad | SolverType::Rmsprop => &["h"],
            SolverType::Adam | SolverType::Adamw => &["m", "v"],
            SolverType::Adadelta => &["h", "u"],
        }
    }

    /// The history buffers (see the table on [`Solver`]), each `n_params` long.
    pub fn history(&self) -> &[Vec<f32>] {
        &self.history
    }

    /// The history buffers, writable (to restore a solver state). Keep each `n_params` long:
    /// [`Solver::apply`] panics otherwise.
    pub fn history_mut(&mut self) -> &mut [Vec<f32>] {
        &mut self.history
    }

    /// Applies one update of iteration `iter` (0-based) and returns the learning rate it used.
    ///
    /// On entry `params.diff` holds the gradient summed over the `iter_size` sub-batches of this
    /// iteration and already averaged over the replicas. In this order (Caffe's `ApplyUpdate`):
    ///
    /// 1. **Normalise**: `g = diff / iter_size` (`iter_size` from the config; this function divides,
    ///    the caller must not).
    /// 2. **Clip** (when `clip_gradients > 0`): with `‖g‖` the L2 norm of the whole normalised
    ///    gradient (every tensor together), if `‖g‖ > clip_gradients` then
    ///    `g ← g · clip_gradients / ‖g‖`. Caffe clips before normalising; here the threshold applies
    ///    to the averaged gradient, the same for any `iter_size`.
    /// 3. **Regularise**, per tensor with `λ = weight_decay · decay_mult`: L2 `g ← g + λ·w`,
    ///    L1 `g ← g + λ·sign(w)` (sign(0) = 0).
    /// 4. **Update**, per tensor with `η = learning_rate(cfg, iter) · lr_mult`:
    ///    - SGD: `v ← μ·v + η·g`, `w ← w − v`;
    ///    - Nesterov: `v_prev = v`, `v ← μ·v + η·g`, `w ← w − ((1 + μ)·v − μ·v_prev)`;
    ///    - AdaGrad: `h ← h + g²`, `w ← w − η·g / (√h + δ)`;
    ///    - RMSProp: `h ← ρ·h + (1 − ρ)·g²`, `w ← w − η·g / (√h + δ)`;
    ///    - Adam: `t = iter + 1`, `m ← β₁·m + (1 − β₁)·g`, `v ← β₂·v + (1 − β₂)·g²`,
    ///      `w ← w − η·√(1 − β₂ᵗ)/(1 − β₁ᵗ)·m / (√v + ε)`;
    ///    - AdamW: Adam on the gradient without step 3, and the decay applied to the weight
    ///      instead: `w ← w − η·λ·r(w) − η·√(1 − β₂ᵗ)/(1 − β₁ᵗ)·m / (√v + ε)`;
    ///    - AdaDelta (Caffe's): `h ← μ·h + (1 − μ)·g²`, `s = g·√(u + δ)/√(h + δ)`,
    ///      `u ← μ·u + (1 − μ)·s²`, `w ← w − η·s`;
    ///
    ///    with `μ = β₁ = momentum`, `β₂ = momentum2`, `ρ = rms_decay`, `δ = ε = delta`.
    ///
    /// On return `params.diff` holds the effective gradient `g` of step 4 (normalised, clipped,
    /// regularised); it is not zeroed — the caller calls [`zero_grad`] before the next backward.
    /// Steps 1–3 are folded into one scale factor and fused with step 4, so the whole update is
    /// one pass over the buffers (two with clipping, which first needs the norm), without
    /// allocating.
    ///
    /// # Panics
    /// If `params.len()` is not the `n_params` the solver was built for.
    pub fn apply(&mut self, cpu: &Cpu, iter: u64, params: &mut Params) -> f32 {
        let n = params.len();
        assert!(
            self.history.iter().all(|h| h.len() == n),
            "solver: built for {} parameters, got {n}",
            self.history.first().map_or(0, Vec::len)
        );
        let cfg = &self.cfg;
        let lr = learning_rate(cfg, iter);

        // Steps 1 and 2 as one factor on the raw diff.
        let normalise = 1.0 / cfg.iter_size.max(1) as f64;
        let mut scale = normalise;
        if cfg.clip_gradients > 0.0 {
            let norm = cpu.sumsq(&params.diff).sqrt() * normalise;
            let clip = cfg.clip_gradients as f64;
            if norm > clip {
                debug!(
                    "gradient clipping: L2 norm {norm:.6} > {clip}, scaling by {:.6}",
                    clip / norm
                );
                scale *= clip / norm;
            }
        }
        let scale = scale as f32;

        let l1 = cfg.regularization_type == Regularization::L1;
        let adam = AdamStep {
            beta1: cfg.momentum,
            beta2: cfg.momentum2,
            eps: cfg.delta,
            correction: {
                let t = iter.saturating_add(1).min(i32::MAX as u64) as i32;
                let (b1, b2) = (cfg.momentum as f64, cfg.momentum2 as f64);
                ((1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t))) as f32
            },
        };

        let (h0, h1) = match self.history.as_mut_slice() {
            [a] => (a.as_mut_slice(), &mut [][..]),
            [a, b] => (a.as_mut_slice(), b.as_mut_slice()),
            _ => unreachable!("a solver has one or two history buffers"),
        };
        for s in &params.spans {
            let r = s.range();
            let c = Coeffs {
                scale,
                decay: cfg.weight_decay * s.decay_mult,
                lr: lr * s.lr_mult,
            };
            let w = &mut params.data[r.clone()];
            let g = &mut params.diff[r.clone()];
            let h = &mut h0[r.clone()];
            match (cfg.solver_type, l1) {
                (SolverType::Sgd, false) => update::sgd::<false>(c, cfg.momentum, w, g, h),
                (SolverType::Sgd, true) => update::sgd::<true>(c, cfg.momentum, w, g, h),
                (SolverType::Nesterov, false) => {
                    update::nesterov::<false>(c, cfg.momentum, w, g, h)
                }
                (SolverType::Nesterov, true) => update::nesterov::<true>(c, cfg.momentum, w, g, h),
                (SolverType::Adagrad, false) => update::adagrad::<false>(c, cfg.delta, w, g, h),
                (SolverType::Adagrad, true) => update::adagrad::<true>(c, cfg.delta, w, g, h),
                (SolverType::Rmsprop, false) => {
                    update::rmsprop::<false>(c, cfg.rms_decay, cfg.delta, w, g, h)
                }
                (SolverType::Rmsprop, true) => {
                    update::rmsprop::<true>(c, cfg.rms_decay, cfg.delta, w, g, h)
                }
                (SolverType::Adam, false) => update::adam::<false>(c, adam, w, g, h, &mut h1[r]),
                (SolverType::Adam, true) => update::adam::<true>(c, adam, w, g, h, &mut h1[r]),
                (SolverType::Adamw, false) => update::adamw::<false>(c, adam, w, g, h, &mut h1[r]),
                (SolverType::Adamw, true) => update::adamw::<true>(c, adam, w, g, h, &mut h1[r]),
                (SolverType::Adadelta, false) => {
                    update::adadelta::<false>(c, cfg.momentum, cfg.delta, w, g, h, &mut h1[r])
                }
                (SolverType::Adadelta, true) => {
                    update::adadelta::<true>(c, cfg.momentum, cfg.delta, w, g, h, &mut h1[r])
                }
            }
        }
        lr
    }
}

#[cfg(test)]
mod tests;
