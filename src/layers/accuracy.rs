//! `Accuracy`: the fraction of samples whose label is among the `top_k` highest scores (Caffe's
//! layer of the same name). No backward.
//!
//! Bottoms: scores `(N, C)` (flattened at `axis` as in
//! [`SoftmaxWithLoss`](crate::layers::softmax_with_loss)) and labels `(N)`, integral values stored
//! as f32. Top: scalar `[]`, `correct / N`.
//!
//! Ranking follows Caffe: a sample is correct when fewer than `top_k` classes score *strictly*
//! higher than its label, so ties favour the label. A NaN score ranks above every score, so a
//! sample whose label scores NaN is never correct (a net that computes NaN scores nothing). A sample whose label is `ignore_label` is
//! never correct but still counts in `N`, so the top is always a fraction of the batch (Caffe
//! divides by the non-ignored samples instead).
//!
//! Exact counts: the top is `correct as f32 / N as f32`, within a relative 2⁻²⁴ of `correct / N`,
//! so `(top as f64 · N).round()` is exactly `correct` for any batch below 2²³ samples
//! ([`count_from_fraction`] does this); that is how the net turns test accuracies back into
//! topology-independent counts.

use crate::config::layer_params::AccuracyParams;
use crate::error::{Error, Result};
use crate::layers::softmax_with_loss::{class_of, rows_and_classes};
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// Top-k accuracy; see the module docs.
    pub type Accuracy = CpuLayer<AccuracyParams, Counts>;
}

/// The classes of the current scores and the counts of the last forward.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    classes: usize,
    correct: usize,
    counted: usize,
}

/// The number of correct samples behind an accuracy `fraction` of a batch of `n`: exact for
/// `n < 2²³` (see the module docs).
pub fn count_from_fraction(fraction: f32, n: usize) -> u64 {
    (fraction as f64 * n as f64).round() as u64
}

impl Accuracy {
    /// Correct samples of the last forward.
    pub fn correct(&self) -> usize {
        self.state.correct
    }

    /// Samples of the last forward whose label is not `ignore_label`.
    pub fn counted(&self) -> usize {
        self.state.counted
    }
}

impl Layer for Accuracy {
    fn type_name(&self) -> &'static str {
        "accuracy"
    }

    /// Scores `(N, C)` with `1 <= top_k <= C`, labels `(N)`; top `[]`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let (_, classes) = rows_and_classes(&self.name, self.settings.axis, bottoms)?;
        let top_k = self.settings.top_k;
        if top_k == 0 || top_k > classes {
            return Err(Error::net(
                &self.name,
                format!("`top_k` {top_k} must be in [1, {classes}] (the classes)"),
            ));
        }
        self.state.classes = classes;
        Ok(vec![vec![]])
    }

    fn has_backward(&self) -> bool {
        false
    }

    /// # Panics
    /// On a label that is not `ignore_label` and not an integer in `[0, C)`.
    fn forward(&mut self, pass: ForwardPass<'_>) {
        let AccuracyParams {
            top_k,
            ignore_label,
            ..
        } = self.settings;
        let (c, state) = (self.state.classes, &mut self.state);
        let (scores, labels) = (&pass.bottoms[0].data, &pass.bottoms[1].data);
        state.correct = 0;
        state.counted = 0;
        for (i, row) in scores.chunks_exact(c).enumerate() {
            let Some(label) = class_of(&self.name, labels[i], ignore_label, c, i) else {
                continue;
            };
            state.counted += 1;
            let score = row[label];
            let better = row.iter().filter(|&&s| s > score || s.is_nan()).count();
            if !score.is_nan() && better < top_k {
                state.correct += 1;
            }
        }
        let n = labels.len();
        pass.tops[0].data[0] = if n == 0 {
            0.0
        } else {
            state.correct as f32 / n as f32
        };
    }

    /// Nothing: accuracy is not differentiated.
    fn backward(&mut self, _pass: BackwardPass<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::config::Phase;
    use crate::layers::test_util::{blob, ctx, forward_in, layer, params_error};

    fn accuracy(keys: &str) -> Accuracy {
        layer::<AccuracyParams>("accuracy", keys)
    }

    /// The top of a test-phase forward of `layer` on `scores` `(4, 4)` and [`LABELS`].
    fn top_of(layer: &mut Accuracy, scores: &[f32]) -> f32 {
        let bottoms = [blob(&[4, 4], scores), blob(&[4], &LABELS)];
        let cpu = Cpu::new(1);
        let top = forward_in(&ctx(&cpu, Phase::Test), layer, &bottoms, &[]);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].shape, Vec::<usize>::new());
        top[0].data[0]
    }

    /// Rows: label 1 tied for the top; label 0 behind two; label 0 behind one; all tied.
    const SCORES: [f32; 16] = [
        1.0, 3.0, 3.0, 0.0, //
        1.0, 3.0, 3.0, 0.0, //
        0.5, 0.2, 0.1, 0.9, //
        2.0, 2.0, 2.0, 2.0,
    ];
    const LABELS: [f32; 4] = [1.0, 0.0, 0.0, 3.0];

    fn run(layer: &mut Accuracy) -> f32 {
        top_of(layer, &SCORES)
    }

    #[test]
    fn top_1_with_ties() {
        let mut layer = accuracy("");
        assert_eq!(run(&mut layer), 0.5);
        assert_eq!((layer.correct(), layer.counted()), (2, 4));
        assert!(!layer.has_backward());
    }

    #[test]
    fn top_2_with_ties() {
        let mut layer = accuracy("top_k = 2");
        assert_eq!(run(&mut layer), 0.75);
        assert_eq!(layer.correct(), 3);
        // Row 1 needs k = 3: two classes score strictly higher than its label.
        let mut k3 = accuracy("top_k = 3");
        assert_eq!(run(&mut k3), 1.0);
    }

    #[test]
    fn ignored_samples_count_in_n_but_never_as_correct() {
        let mut layer = accuracy("ignore_label = 0");
        assert_eq!(run(&mut layer), 0.5);
        assert_eq!((layer.correct(), layer.counted()), (2, 2));
    }

    /// Regression: NaN compares false with everything, so NaN scores were counted as correct
    /// and a net of NaN weights scored 100%.
    #[test]
    fn nan_scores_are_never_correct() {
        let mut nan_label = SCORES;
        nan_label[1] = f32::NAN; // row 0: its label (1) scores NaN
        nan_label[12..16].fill(f32::NAN); // row 3: every class scores NaN
        nan_label[8 + 3] = f32::NAN; // row 2: another class scores NaN, ahead of the label
        let mut layer = accuracy("top_k = 2");
        let top = top_of(&mut layer, &nan_label);
        // Rows 0 and 3: the label scores NaN. Row 1: two classes ahead, as without NaNs.
        // Row 2: only the NaN ahead of the label, which is within the top 2: correct.
        assert_eq!(layer.correct(), 1, "top {top}");
        assert_eq!(top, 0.25);
    }

    #[test]
    fn top_k_must_fit_the_classes() {
        let err = accuracy("top_k = 5").reshape(&[&[4, 4], &[4]]).unwrap_err();
        assert!(err.to_string().contains("top_k"), "{err}");
        assert!(params_error("accuracy", "top_k = 0").contains("top_k"));
    }

    #[test]
    fn fraction_times_n_recovers_the_count() {
        for n in (1..=2048).chain([60_000, 1 << 20]) {
            let step = (n / 2048).max(1);
            for correct in (0..=n).step_by(step).chain([n - 1, n]) {
                let fraction = correct as f32 / n as f32;
                assert_eq!(
                    count_from_fraction(fraction, n),
                    correct as u64,
                    "{correct}/{n}"
                );
            }
        }
    }
}
