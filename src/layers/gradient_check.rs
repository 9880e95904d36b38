//! `GradientChecker`: Caffe's gradient check, reusable by every layer's tests. It compares each
//! layer's analytic backward against central differences of its forward, for every element of
//! every checked bottom and every learnable tensor, and checks the accumulation contract of
//! [`crate::layers::Layer::backward`].
//!
//! The objective is `E = Σ_t Σ_i w_t[i] · top_t[i]` with fixed random weights `w` of magnitude in
//! `[0.5, 1.5]` and random sign, accumulated in f64; backward receives `top_t.diff = w_t`. For a loss
//! layer (a scalar top) this is the loss times a random loss weight, which also checks that the
//! layer scales by its top's diff.
//!
//! Per point, with `a` the analytic and `n` the numeric derivative, the check passes when
//! `|a − n| ≤ threshold · max(|a|, |n|, 1)` (Caffe's relative rule). Points whose value lies within
//! `kink_range` of `kink` (ReLU at 0) are skipped; a negative `kink_range` skips none.
//!
//! Accumulation: backward runs once on zeroed diffs (giving the gradient `g`) and once on diffs
//! pre-filled with known non-zero values `p`; every element must then read `p + g`. Bottoms that are
//! not propagated (labels) must keep their pre-filled diff untouched.
//!
//! ```
//! use p2ptrain::config::layer_params::TanhParams;
//! use p2ptrain::layers::gradient_check::{uniform_blob, GradientChecker};
//! use p2ptrain::layers::BuildCpu;
//!
//! let mut layer = TanhParams.build("tanh");
//! let bottom = uniform_blob(&[2, 3], -1.0, 1.0, 7);
//! GradientChecker::default().assert_passes(&mut layer, &[bottom], &[true]);
//! ```

use crate::backend::Cpu;
use crate::config::Phase;
use crate::error::{Error, Result};
use crate::layers::{BackwardPass, Ctx, ForwardPass, Layer};
use crate::tensor::Blob;
use rand::distributions::{Distribution, Uniform};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;

/// Settings of a gradient check (Caffe's `GradientChecker`).
#[derive(Debug, Clone, Copy)]
pub struct GradientChecker {
    /// Half-width `h` of the central difference `(E(x+h) − E(x−h)) / 2h`.
    pub step: f32,
    /// Relative tolerance, see the module docs.
    pub threshold: f32,
    /// Location of a non-differentiable point of the layer.
    pub kink: f32,
    /// Points with `|x − kink| ≤ kink_range` are skipped; negative: none.
    pub kink_range: f32,
    /// Seed of the top weights, the random parameters and the pre-filled diffs.
    pub seed: u64,
}

impl Default for GradientChecker {
    /// Caffe's usual test settings: step 1e-2, threshold 1e-3, no kink, seed 1701.
    fn default() -> Self {
        GradientChecker {
            step: 1e-2,
            threshold: 1e-3,
            kink: 0.0,
            kink_range: -1.0,
            seed: 1701,
        }
    }
}

impl GradientChecker {
    /// The default settings, skipping the points within `kink_range` of the non-differentiable
    /// point `kink` (Caffe's ReLU test: kink 0, range 0.01).
    pub fn skipping_kink(kink: f32, kink_range: f32) -> Self {
        GradientChecker {
            kink,
            kink_range,
            ..GradientChecker::default()
        }
    }
}

/// Which tensor a derivative is taken with respect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrt {
    /// `bottoms[i]`.
    Bottom(usize),
    /// The layer's `i`-th learnable tensor, in `param_specs()` order.
    Param(usize),
}

/// What a [`Mismatch`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Analytic (`actual`) against numeric (`expected`) derivative.
    Gradient,
    /// After backward on pre-filled diffs: `actual` should equal `expected` = pre-fill + gradient.
    Accumulation,
    /// A bottom not propagated to: its diff (`actual`) should keep its pre-fill (`expected`).
    Untouched,
}

/// One checked element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mismatch {
    pub check: Check,
    pub wrt: Wrt,
    /// Flat (row-major) index into the tensor.
    pub index: usize,
    pub actual: f64,
    pub expected: f64,
    /// `|actual − expected| / max(|actual|, |expected|, 1)`.
    pub scaled_error: f64,
}

impl Mismatch {
    fn new(check: Check, wrt: Wrt, index: usize, actual: f64, expected: f64) -> Self {
        let scale = actual.abs().max(expected.abs()).max(1.0);
        let scaled_error = if actual.is_nan() || expected.is_nan() {
            f64::INFINITY
        } else {
            (actual - expected).abs() / scale
        };
        Mismatch {
            check,
            wrt,
            index,
            actual,
            expected,
            scaled_error,
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, exp) = match self.check {
            Check::Gradient => ("analytic", "numeric"),
            Check::Accumulation => ("accumulated", "prefill + gradient"),
            Check::Untouched => ("diff", "prefill"),
        };
        write!(
            f,
            "{:?} {:?}[{}]: {what} {:.6e} vs {exp} {:.6e} (scaled error {:.3e})",
            self.check, self.wrt, self.index, self.actual, self.expected, self.scaled_error
        )
    }
}

/// Outcome of [`GradientChecker::check`].
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub layer: &'static str,
    pub threshold: f32,
    /// Gradient points compared.
    pub checked: usize,
    /// Gradient points skipped for being at the kink.
    pub skipped_at_kink: usize,
    /// The largest scaled gradient error, within tolerance or not.
    pub worst: Option<Mismatch>,
    /// Every element that failed, of any [`Check`].
    pub failures: Vec<Mismatch>,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Panics with the report if any element failed.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert!(self.is_ok(), "{self}");
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gradient check of `{}`: {} points checked, {} skipped at the kink, {} failures \
             (threshold {:e})",
            self.layer,
            self.checked,
            self.skipped_at_kink,
            self.failures.len(),
            self.threshold
        )?;
        if let Some(w) = &self.worst {
            write!(f, "\n  worst: {w}")?;
        }
        for m in self.failures.iter().take(10) {
            write!(f, "\n  failed: {m}")?;
        }
        if self.failures.len() > 10 {
            write!(f, "\n  ... and {} more", self.failures.len() - 10)?;
        }
        Ok(())
    }
}

/// A blob of `shape` with data uniform in `[min, max)` from `seed` (diff zero).
pub fn uniform_blob(shape: &[usize], min: f32, max: f32, seed: u64) -> Blob {
    let mut b = Blob::new(shape);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    b.data.iter_mut().for_each(|v| *v = rng.gen_range(min..max));
    b
}

/// A label blob `(n)` of integral values in `[0, classes)` from `seed`.
pub fn label_blob(n: usize, classes: usize, seed: u64) -> Blob {
    let mut b = Blob::new(&[n]);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    b.data
        .iter_mut()
        .for_each(|v| *v = rng.gen_range(0..classes) as f32);
    b
}

/// A `[[layer]]` table parsed from TOML, e.g. `name = "ip"\ntype = "inner_product"\nnum_output = 3`,
/// for layer tests.
#[cfg(test)]
pub(crate) fn layer_config(toml_text: &str) -> crate::config::LayerConfig {
    toml::from_str(toml_text).unwrap_or_else(|e| panic!("bad test layer config: {e}"))
}

/// The layer `new` builds from the resolved parameters of the `[[layer]]` table `cfg`, for
/// layer tests (e.g. `from_config(Relu::new, &layer_config("name = \"r\"\ntype = \"relu\""))`).
#[cfg(test)]
pub(crate) fn from_config<P: crate::config::layer_params::KindParams, L>(
    new: impl Fn(&str, &P) -> L,
    cfg: &crate::config::LayerConfig,
) -> L {
    let params = P::resolve(cfg).unwrap_or_else(|e| panic!("bad test layer config: {e:?}"));
    new(&cfg.name, &params)
}

/// Values of magnitude in `[0.5, 1.5]` with random sign.
fn signed_weights(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mag = Uniform::new(0.5f32, 1.5);
    (0..n)
        .map(|_| {
            let m = mag.sample(rng);
            if rng.gen::<bool>() {
                m
            } else {
                -m
            }
        })
        .collect()
}

/// The context of a training step at iteration 0 of one replica, seeded by `seed`.
pub(crate) fn train_ctx(cpu: &Cpu, seed: u64) -> Ctx<'_> {
    Ctx {
        cpu,
        phase: Phase::Train,
        iter: 0,
        seed,
        first_sample: 0,
        reducer: None,
    }
}

/// The layer, its inputs and the fixed top weights of one check.
struct Problem<'l> {
    layer: &'l mut dyn Layer,
    cpu: Cpu,
    seed: u64,
    bottoms: Vec<Blob>,
    params: Vec<Vec<f32>>,
    tops: Vec<Blob>,
    top_weights: Vec<Vec<f32>>,
}

impl Problem<'_> {
    /// Runs forward and returns `E = Σ w · top` in f64.
    fn objective(&mut self) -> f64 {
        let cpu = self.cpu;
        let ctx = train_ctx(&cpu, self.seed);
        let params: Vec<&[f32]> = self.params.iter().map(|p| p.as_slice()).collect();
        self.layer.forward(ForwardPass {
            ctx: &ctx,
            bottoms: &self.bottoms,
            params: &params,
            tops: &mut self.tops,
        });
        self.tops
            .iter()
            .zip(&self.top_weights)
            .map(|(t, w)| {
                t.data
                    .iter()
                    .zip(w)
                    .map(|(&y, &w)| y as f64 * w as f64)
                    .sum::<f64>()
            })
            .sum()
    }

    /// Forward, then backward on bottom and parameter diffs pre-filled with `bottom_fill` and
    /// `param_fill`; returns the resulting (bottom diffs, parameter diffs).
    fn backward(
        &mut self,
        propagate: &[bool],
        bottom_fill: &[Vec<f32>],
        param_fill: &[Vec<f32>],
    ) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        self.objective();
        for (t, w) in self.tops.iter_mut().zip(&self.top_weights) {
            t.diff.copy_from_slice(w);
        }
        for (b, fill) in self.bottoms.iter_mut().zip(bottom_fill) {
            b.diff.copy_from_slice(fill);
        }
        let mut diffs: Vec<Vec<f32>> = param_fill.to_vec();
        let cpu = self.cpu;
        let ctx = train_ctx(&cpu, self.seed);
        let params: Vec<&[f32]> = self.params.iter().map(|p| p.as_slice()).collect();
        let mut diff_views: Vec<&mut [f32]> = diffs.iter_mut().map(|d| d.as_mut_slice()).collect();
        self.layer.backward(BackwardPass {
            ctx: &ctx,
            tops: &self.tops,
            propagate_down: propagate,
            bottoms: &mut self.bottoms,
            params: &params,
            param_diffs: &mut diff_views,
        });
        let bottom_diffs = self.bottoms.iter().map(|b| b.diff.clone()).collect();
        (bottom_diffs, diffs)
    }

    /// The value of the element a derivative is taken against.
    fn value(&mut self, wrt: Wrt, index: usize) -> &mut f32 {
        match wrt {
            Wrt::Bottom(i) => &mut self.bottoms[i].data[index],
            Wrt::Param(i) => &mut self.params[i][index],
        }
    }
}

impl GradientChecker {
    /// Checks `layer` at the bottoms given (shapes and data; their diffs are ignored), with
    /// learnable tensors drawn uniformly from `[-1, 1]`. `check_bottom[i]` says whether
    /// `bottoms[i]` is differentiated (false for labels); it is also the `propagate_down` that
    /// backward receives. Fails when `reshape` rejects the bottoms or the layer has no backward.
    pub fn check(
        &self,
        layer: &mut dyn Layer,
        bottoms: &[Blob],
        check_bottom: &[bool],
    ) -> Result<CheckReport> {
        let shapes: Vec<&[usize]> = bottoms.iter().map(|b| b.shape.as_slice()).collect();
        layer.reshape(&shapes)?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x5eed_9a4a);
        let params = layer
            .param_specs()
            .iter()
            .map(|s| {
                let n: usize = s.shape.iter().product();
                (0..n).map(|_| rng.gen_range(-1.0f32..=1.0)).collect()
            })
            .collect::<Vec<Vec<f32>>>();
        self.check_with_params(layer, bottoms, params, check_bottom)
    }

    /// [`check`](Self::check), asserting that it ran and every element passed; returns the
    /// report for further checks (the number of points compared).
    #[track_caller]
    pub fn assert_passes(
        &self,
        layer: &mut dyn Layer,
        bottoms: &[Blob],
        check_bottom: &[bool],
    ) -> CheckReport {
        let report = self
            .check(layer, bottoms, check_bottom)
            .unwrap_or_else(|e| panic!("gradient check did not run: {e}"));
        report.assert_ok();
        report
    }

    /// As [`check`](Self::check), with the learnable tensors given (in `param_specs()` order).
    pub fn check_with_params(
        &self,
        layer: &mut dyn Layer,
        bottoms: &[Blob],
        params: Vec<Vec<f32>>,
        check_bottom: &[bool],
    ) -> Result<CheckReport> {
        let name = layer.type_name();
        let fail = |msg: String| Err(Error::net(format!("gradient check of {name}"), msg));
        if !layer.has_backward() {
            return fail("the layer has no backward pass".into());
        }
        if check_bottom.len() != bottoms.len() {
            return fail(format!(
                "{} check flags for {} bottoms",
                check_bottom.len(),
                bottoms.len()
            ));
        }
        let shapes: Vec<&[usize]> = bottoms.iter().map(|b| b.shape.as_slice()).collect();
        let top_shapes = layer.reshape(&shapes)?;
        let specs = layer.param_specs();
        if specs.len() != params.len() {
            return fail(format!(
                "{} tensors given, the layer has {}",
                params.len(),
                specs.len()
            ));
        }
        for (s, p) in specs.iter().zip(&params) {
            if s.shape.iter().product::<usize>() != p.len() {
                return fail(format!(
                    "`{}` {:?} given {} values",
                    s.name,
                    s.shape,
                    p.len()
                ));
            }
        }

        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let tops: Vec<Blob> = top_shapes.iter().map(|s| Blob::new(s)).collect();
        let top_weights = tops
            .iter()
            .map(|t| signed_weights(&mut rng, t.count()))
            .collect();
        let mut bottoms = bottoms.to_vec();
        for b in &mut bottoms {
            let n = b.count();
            assert_eq!(b.data.len(), n, "bottom data does not match its shape");
            b.diff = vec![0.0; n];
        }
        let bottom_prefill: Vec<Vec<f32>> = bottoms
            .iter()
            .map(|b| signed_weights(&mut rng, b.count()))
            .collect();
        let param_prefill: Vec<Vec<f32>> = params
            .iter()
            .map(|p| signed_weights(&mut rng, p.len()))
            .collect();
        let mut pb = Problem {
            layer,
            cpu: Cpu::new(1),
            seed: self.seed,
            bottoms,
            params,
            tops,
            top_weights,
        };
        let mut report = CheckReport {
            layer: name,
            threshold: self.threshold,
            checked: 0,
            skipped_at_kink: 0,
            worst: None,
            failures: Vec::new(),
        };

        // Analytic gradients, on zeroed diffs.
        let zero_b: Vec<Vec<f32>> = pb.bottoms.iter().map(|b| vec![0.0; b.count()]).collect();
        let zero_p: Vec<Vec<f32>> = pb.params.iter().map(|p| vec![0.0; p.len()]).collect();
        let (grad_b, grad_p) = pb.backward(check_bottom, &zero_b, &zero_p);

        // Accumulation on pre-filled diffs; non-propagated bottoms untouched.
        let (acc_b, acc_p) = pb.backward(check_bottom, &bottom_prefill, &param_prefill);
        let targets = (0..grad_b.len())
            .map(Wrt::Bottom)
            .chain((0..grad_p.len()).map(Wrt::Param));
        for wrt in targets {
            let (grad, pre, acc, propagated) = match wrt {
                Wrt::Bottom(i) => (&grad_b[i], &bottom_prefill[i], &acc_b[i], check_bottom[i]),
                Wrt::Param(i) => (&grad_p[i], &param_prefill[i], &acc_p[i], true),
            };
            for (j, ((&g, &p), &a)) in grad.iter().zip(pre).zip(acc).enumerate() {
                let m = if propagated {
                    Mismatch::new(Check::Accumulation, wrt, j, a as f64, p as f64 + g as f64)
                } else {
                    Mismatch::new(Check::Untouched, wrt, j, a as f64, p as f64)
                };
                // Only f32 rounding of one addition separates the two passes.
                if m.scaled_error > 1e-5 {
                    report.failures.push(m);
                }
            }
        }

        // Central differences. A stateful layer's tensors (running statistics) are not learned
        // and get no gradient: only its bottoms are differentiated.
        let stateful = pb.layer.has_state();
        let targets = (0..grad_b.len())
            .filter(|&i| check_bottom[i])
            .map(Wrt::Bottom)
            .chain((0..grad_p.len()).filter(|_| !stateful).map(Wrt::Param));
        for wrt in targets {
            let analytic = match wrt {
                Wrt::Bottom(i) => &grad_b[i],
                Wrt::Param(i) => &grad_p[i],
            };
            for (j, &a) in analytic.iter().enumerate() {
                let x = *pb.value(wrt, j);
                if self.kink_range >= 0.0 && (x - self.kink).abs() <= self.kink_range {
                    report.skipped_at_kink += 1;
                    continue;
                }
                let (hi, lo) = (x + self.step, x - self.step);
                *pb.value(wrt, j) = hi;
                let e_hi = pb.objective();
                *pb.value(wrt, j) = lo;
                let e_lo = pb.objective();
                *pb.value(wrt, j) = x;
                // The step actually taken, after rounding to f32.
                let numeric = (e_hi - e_lo) / (hi as f64 - lo as f64);
                let m = Mismatch::new(Check::Gradient, wrt, j, a as f64, numeric);
                report.checked += 1;
                if report.worst.is_none_or(|w| m.scaled_error > w.scaled_error) {
                    report.worst = Some(m);
                }
                if m.scaled_error > self.threshold as f64 {
                    report.failures.push(m);
                }
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FillerConfig;
    use crate::params::ParamSpec;

    /// How the test layer `y = a · x²` (one learnable scalar `a`) gets its backward wrong.
    #[derive(Clone, Copy, PartialEq)]
    enum Bug {
        None,
        /// `dx` off by a factor.
        BottomGradient,
        /// `da` off by a constant.
        ParamGradient,
        /// `dx = ...` instead of `dx += ...`.
        Overwrite,
        /// Writes the diff of the second bottom although it is not propagated to.
        WritesLabels,
        /// Ignores the top diff (assumes 1).
        IgnoresTopDiff,
    }

    struct Square {
        bug: Bug,
    }

    impl Layer for Square {
        fn type_name(&self) -> &'static str {
            "square"
        }
        fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
            Ok(vec![bottoms[0].to_vec()])
        }
        fn param_specs(&self) -> Vec<ParamSpec> {
            vec![ParamSpec::new(
                "weight",
                vec![1],
                &FillerConfig::constant(1.0),
            )]
        }
        fn forward(&mut self, pass: ForwardPass<'_>) {
            let a = pass.params[0][0];
            for (y, &x) in pass.tops[0].data.iter_mut().zip(&pass.bottoms[0].data) {
                *y = a * x * x;
            }
        }
        fn backward(&mut self, pass: BackwardPass<'_>) {
            let (tops, propagate_down, param_diffs) =
                (pass.tops, pass.propagate_down, pass.param_diffs);
            let (a, bottoms) = (pass.params[0][0], pass.bottoms);
            let bug = self.bug;
            let (first, rest) = bottoms.split_at_mut(1);
            let b = &mut first[0];
            for ((dx, &x), &dy) in b.diff.iter_mut().zip(&b.data).zip(&tops[0].diff) {
                let dy = if bug == Bug::IgnoresTopDiff { 1.0 } else { dy };
                let g = dy
                    * 2.0
                    * a
                    * x
                    * if bug == Bug::BottomGradient {
                        1.01
                    } else {
                        1.0
                    };
                if propagate_down[0] {
                    if bug == Bug::Overwrite {
                        *dx = g;
                    } else {
                        *dx += g;
                    }
                }
                param_diffs[0][0] += dy * x * x;
            }
            if bug == Bug::ParamGradient {
                param_diffs[0][0] += 0.1;
            }
            if bug == Bug::WritesLabels {
                rest[0].diff[0] += 1.0;
            }
        }
    }

    fn run(bug: Bug) -> CheckReport {
        let x = uniform_blob(&[3, 4], -2.0, 2.0, 3);
        let labels = label_blob(3, 4, 4);
        GradientChecker::default()
            .check(&mut Square { bug }, &[x, labels], &[true, false])
            .unwrap()
    }

    fn first_failure(r: &CheckReport) -> Mismatch {
        assert!(!r.is_ok(), "the bug went unnoticed: {r}");
        r.failures[0]
    }

    #[test]
    fn a_correct_layer_passes() {
        let r = run(Bug::None);
        r.assert_ok();
        assert_eq!(r.checked, 12 + 1);
        assert!(r.worst.unwrap().scaled_error < 1e-4, "{r}");
    }

    #[test]
    fn catches_a_wrong_bottom_gradient() {
        let m = first_failure(&run(Bug::BottomGradient));
        assert_eq!((m.check, m.wrt), (Check::Gradient, Wrt::Bottom(0)));
    }

    #[test]
    fn catches_a_wrong_param_gradient() {
        let r = run(Bug::ParamGradient);
        let m = first_failure(&r);
        assert_eq!(
            (m.check, m.wrt, m.index),
            (Check::Gradient, Wrt::Param(0), 0)
        );
        assert_eq!(r.failures.len(), 1, "{r}");
    }

    #[test]
    fn catches_an_overwriting_backward() {
        let r = run(Bug::Overwrite);
        let m = first_failure(&r);
        assert_eq!((m.check, m.wrt), (Check::Accumulation, Wrt::Bottom(0)));
        // The gradient itself is right.
        assert!(r.failures.iter().all(|m| m.check == Check::Accumulation));
    }

    #[test]
    fn catches_a_write_to_a_non_propagated_bottom() {
        let m = first_failure(&run(Bug::WritesLabels));
        assert_eq!(
            (m.check, m.wrt, m.index),
            (Check::Untouched, Wrt::Bottom(1), 0)
        );
    }

    #[test]
    fn catches_an_ignored_top_diff() {
        let m = first_failure(&run(Bug::IgnoresTopDiff));
        assert_eq!(m.check, Check::Gradient);
    }

    #[test]
    fn skips_points_at_the_kink() {
        let mut x = uniform_blob(&[4], 0.5, 1.0, 3);
        x.data[2] = 0.001;
        let checker = GradientChecker {
            kink_range: 0.01,
            ..GradientChecker::default()
        };
        let r = checker
            .check(&mut Square { bug: Bug::None }, &[x], &[true])
            .unwrap();
        r.assert_ok();
        assert_eq!((r.checked, r.skipped_at_kink), (4, 1));
    }

    #[test]
    fn reports_name_the_failure() {
        let text = run(Bug::BottomGradient).to_string();
        assert!(text.contains("Bottom(0)["), "{text}");
        assert!(text.contains("`square`"), "{text}");
    }
}
