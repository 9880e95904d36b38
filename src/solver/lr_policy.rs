//! Learning-rate schedules: the rate of iteration `iter` under `[solver] lr_policy`, with Caffe's
//! formulas (`SGDSolver::GetLearningRate`). Pure functions of the config and the iteration, so a
//! resumed run gets the same rate as an uninterrupted one.

use crate::config::{LrPolicy, SolverConfig};

/// The learning rate of iteration `iter` (0-based), computed in f64 and returned as f32.
///
/// With `lr = base_lr`, `γ = gamma`:
///
/// | policy      | rate                                                              |
/// |-------------|-------------------------------------------------------------------|
/// | `fixed`     | `lr`                                                              |
/// | `step`      | `lr · γ^⌊iter / stepsize⌋`                                        |
/// | `exp`       | `lr · γ^iter`                                                     |
/// | `inv`       | `lr · (1 + γ · iter)^(−power)`                                    |
/// | `multistep` | `lr · γ^k`, `k` = number of leading `stepvalue` entries ≤ `iter`  |
/// | `poly`      | `lr · (1 − iter / max_iter)^power`                                |
/// | `sigmoid`   | `lr · 1 / (1 + exp(−γ · (iter − stepsize)))`                      |
/// | `cosine`    | `lr · (1 + cos(π · min(iter / max_iter, 1))) / 2`                 |
///
/// A linear warmup (`warmup_iter = W > 0`, as NVIDIA Caffe's ramp-up) multiplies the rate of
/// any policy by `(iter + 1) / W` for `iter < W`: the first iteration gets `1/W` of it, iteration
/// `W − 1` and later all of it.
///
/// `multistep` follows Caffe's `current_step` semantics: the step counter advances past
/// `stepvalue[k]` once `iter ≥ stepvalue[k]`, in list order, so for a sorted list `k` is the count
/// of step values ≤ `iter`.
///
/// Degenerate settings, which config validation rejects, stay finite here: `step` with
/// `stepsize = 0` never steps, and `poly` clamps `iter / max_iter` to at most 1 (`max_iter = 0`
/// counts as finished), so past the end the rate is 0 rather than NaN.
pub fn learning_rate(cfg: &SolverConfig, iter: u64) -> f32 {
    let base = cfg.base_lr as f64;
    let gamma = cfg.gamma as f64;
    let power = cfg.power as f64;
    let it = iter as f64;
    let rate = match cfg.lr_policy {
        LrPolicy::Fixed => base,
        LrPolicy::Step => {
            let k = iter.checked_div(cfg.stepsize).unwrap_or(0);
            base * gamma.powf(k as f64)
        }
        LrPolicy::Exp => base * gamma.powf(it),
        LrPolicy::Inv => base * (1.0 + gamma * it).powf(-power),
        LrPolicy::Multistep => {
            let k = cfg.stepvalue.iter().take_while(|&&s| iter >= s).count();
            base * gamma.powi(k as i32)
        }
        LrPolicy::Poly => {
            let done = if cfg.max_iter == 0 {
                1.0
            } else {
                (it / cfg.max_iter as f64).min(1.0)
            };
            base * (1.0 - done).powf(power)
        }
        LrPolicy::Sigmoid => base / (1.0 + (-gamma * (it - cfg.stepsize as f64)).exp()),
        LrPolicy::Cosine => {
            let done = if cfg.max_iter == 0 {
                1.0
            } else {
                (it / cfg.max_iter as f64).min(1.0)
            };
            base * (1.0 + (std::f64::consts::PI * done).cos()) / 2.0
        }
    };
    let warmup = match cfg.warmup_iter {
        w if iter < w => (it + 1.0) / w as f64,
        _ => 1.0,
    };
    (rate * warmup) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `base_lr = 0.1`, `gamma = 0.5`, `power = 2`, `stepsize = 10`, `max_iter = 100`; the rest
    /// at the config file's defaults.
    fn cfg(policy: LrPolicy) -> SolverConfig {
        let mut c: SolverConfig = toml::from_str(
            "base_lr = 0.1\ngamma = 0.5\npower = 2.0\nstepsize = 10\nmax_iter = 100",
        )
        .unwrap();
        c.lr_policy = policy;
        c
    }

    fn close(a: f32, b: f64) {
        assert!(
            ((a as f64) - b).abs() <= 1e-7 * b.abs().max(1e-30),
            "{a} != {b}"
        );
    }

    #[test]
    fn cosine_falls_from_base_lr_to_zero_at_max_iter() {
        let c = cfg(LrPolicy::Cosine);
        close(learning_rate(&c, 0), 0.1);
        close(learning_rate(&c, 50), 0.05);
        // (1 + cos(π/4)) / 2 = 0.853553390593...
        close(learning_rate(&c, 25), 0.1 * 0.853_553_390_593_273_7);
        assert_eq!(learning_rate(&c, 100), 0.0);
        assert_eq!(learning_rate(&c, 150), 0.0, "stays at 0 past the end");
    }

    #[test]
    fn warmup_ramps_any_policy_linearly() {
        let mut c = cfg(LrPolicy::Step);
        c.warmup_iter = 4;
        close(learning_rate(&c, 0), 0.025);
        close(learning_rate(&c, 1), 0.05);
        close(learning_rate(&c, 3), 0.1);
        close(learning_rate(&c, 4), 0.1);
        close(learning_rate(&c, 10), 0.05);
        let mut c = cfg(LrPolicy::Cosine);
        c.warmup_iter = 10;
        // iteration 4: 5/10 of the cosine rate (1 + cos(0.04π)) / 2 · 0.1
        let cosine = 0.1 * (1.0 + (0.04 * std::f64::consts::PI).cos()) / 2.0;
        close(learning_rate(&c, 4), 0.5 * cosine);
    }

    #[test]
    fn fixed_is_base_lr() {
        let c = cfg(LrPolicy::Fixed);
        close(learning_rate(&c, 0), 0.1);
        close(learning_rate(&c, 12345), 0.1);
    }

    #[test]
    fn step_decays_every_stepsize() {
        let c = cfg(LrPolicy::Step);
        close(learning_rate(&c, 0), 0.1);
        close(learning_rate(&c, 9), 0.1);
        close(learning_rate(&c, 10), 0.05);
        close(learning_rate(&c, 25), 0.025);
    }

    #[test]
    fn step_with_zero_stepsize_never_steps() {
        let mut c = cfg(LrPolicy::Step);
        c.stepsize = 0;
        close(learning_rate(&c, 50), 0.1);
    }

    #[test]
    fn exp_decays_every_iteration() {
        let mut c = cfg(LrPolicy::Exp);
        c.gamma = 0.9;
        close(learning_rate(&c, 0), 0.1);
        close(learning_rate(&c, 1), 0.09);
        close(learning_rate(&c, 3), 0.0729);
    }

    #[test]
    fn inv_matches_caffe() {
        let mut c = cfg(LrPolicy::Inv);
        c.gamma = 1e-4;
        c.power = 0.75;
        close(learning_rate(&c, 0), 0.1);
        // (1 + 1e-4 · 10000)^−0.75 = 2^−0.75 = 0.594603557501...
        close(learning_rate(&c, 10000), 0.1 * 0.594_603_557_501_360_5);
        // 1.01^−0.75 = 0.992565...
        close(learning_rate(&c, 100), 0.1 * 1.01f64.powf(-0.75));
    }

    #[test]
    fn multistep_counts_reached_step_values() {
        let mut c = cfg(LrPolicy::Multistep);
        c.stepvalue = vec![5, 8, 20];
        close(learning_rate(&c, 0), 0.1);
        close(learning_rate(&c, 4), 0.1);
        close(learning_rate(&c, 5), 0.05);
        close(learning_rate(&c, 7), 0.05);
        close(learning_rate(&c, 8), 0.025);
        close(learning_rate(&c, 19), 0.025);
        close(learning_rate(&c, 20), 0.0125);
        close(learning_rate(&c, 1000), 0.0125);
    }

    #[test]
    fn poly_reaches_zero_at_max_iter() {
        let c = cfg(LrPolicy::Poly);
        close(learning_rate(&c, 0), 0.1);
        // (1 − 50/100)² = 0.25
        close(learning_rate(&c, 50), 0.025);
        // (1 − 90/100)² = 0.01
        close(learning_rate(&c, 90), 0.001);
        assert_eq!(learning_rate(&c, 100), 0.0);
        assert_eq!(learning_rate(&c, 150), 0.0);
    }

    #[test]
    fn sigmoid_is_half_at_stepsize() {
        let mut c = cfg(LrPolicy::Sigmoid);
        c.gamma = -0.1;
        close(learning_rate(&c, 10), 0.05);
        // iter 0: 1/(1 + e^(0.1·(0 − 10))) = 1/(1 + e^−1) = 0.731058578630005...
        close(learning_rate(&c, 0), 0.1 * 0.731_058_578_630_004_9);
        // iter 20: 1/(1 + e^1) = 0.268941421369995...
        close(learning_rate(&c, 20), 0.1 * 0.268_941_421_369_995_1);
    }
}
