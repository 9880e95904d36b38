//! `SoftmaxWithLoss`: softmax over classes fused with the multinomial logistic loss (Caffe's
//! layer of the same name).
//!
//! Bottoms: scores `(N, C)` — a bottom `(d0, ..., d_{axis-1}, d_axis, ...)` is viewed as
//! `(N, C)` with `N = d0 ⋯ d_{axis-1}` and `C = d_axis ⋯` (`axis` defaults to 1; unlike Caffe,
//! trailing axes are classes, not spatial positions) — and labels `(N)`, integral values stored as
//! f32. Top: the scalar loss, shape `[]`.
//!
//! `loss = −(1/V) Σ_{i valid} ln max(p_i[label_i], f32::MIN_POSITIVE)`, with `p_i` the softmax of
//! row `i` (computed stably, after subtracting the row max) and `V` the number of samples whose label
//! is not `ignore_label` (Caffe's `VALID` normalisation; `V = 0` gives a loss of 0).
//!
//! Backward: `dscores_i += w · (p_i − onehot(label_i)) / V` for valid rows, where `w` is the top's
//! diff, the loss weight the net sets there. Labels get no gradient.

use crate::config::layer_params::SoftmaxWithLossParams;
use crate::error::{Error, Result};
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// Softmax and multinomial logistic loss; see the module docs.
    pub type SoftmaxWithLoss = CpuLayer<SoftmaxWithLossParams, Probabilities>;
}

/// What SoftmaxWithLoss keeps from its last forward for its backward.
#[derive(Debug, Clone, Default)]
pub struct Probabilities {
    /// Classes `C` of the current scores.
    classes: usize,
    /// `(N, C)` softmax probabilities.
    prob: Vec<f32>,
    /// `(N)` label of each row; `None` where ignored.
    targets: Vec<Option<usize>>,
    /// Valid rows `V`.
    valid: usize,
}

impl SoftmaxWithLoss {
    /// `(N, C)` softmax probabilities of the last forward.
    pub fn prob(&self) -> &[f32] {
        &self.state.prob
    }

    /// Samples of the last forward whose label is not `ignore_label`.
    pub fn valid(&self) -> usize {
        self.state.valid
    }
}

/// Checks the two bottoms of a classifier layer (this one and Accuracy): scores flattened at
/// `axis` into `(N, C)` and labels holding `N` values; returns `(N, C)`.
pub(crate) fn rows_and_classes(
    name: &str,
    axis: usize,
    bottoms: &[&[usize]],
) -> Result<(usize, usize)> {
    let [scores, labels] = bottoms else {
        return Err(Error::net(
            name,
            format!("takes 2 bottoms (scores, labels), got {}", bottoms.len()),
        ));
    };
    if axis == 0 || axis >= scores.len() {
        return Err(Error::net(
            name,
            format!("`axis` {axis} out of range for scores {scores:?}"),
        ));
    }
    let rows: usize = scores[..axis].iter().product();
    let classes: usize = scores[axis..].iter().product();
    let label_count: usize = labels.iter().product();
    if classes == 0 {
        return Err(Error::net(
            name,
            format!("scores {scores:?} have no classes"),
        ));
    }
    if label_count != rows {
        return Err(Error::net(
            name,
            format!("scores {scores:?} have {rows} rows but labels {labels:?} hold {label_count}"),
        ));
    }
    Ok((rows, classes))
}

/// The class sample `i`'s `label` names, `None` when it is `ignore_label` (a classifier layer's
/// reading of its labels).
///
/// # Panics
/// On a label that is not `ignore_label` and not an integer in `[0, classes)`.
pub(crate) fn class_of(
    layer: &str,
    label: f32,
    ignore_label: Option<i64>,
    classes: usize,
    i: usize,
) -> Option<usize> {
    if ignore_label.is_some_and(|ig| label == ig as f32) {
        return None;
    }
    assert!(
        label >= 0.0 && label.fract() == 0.0 && (label as usize) < classes,
        "layer `{layer}`: label {label} of sample {i} is not a class in [0, {classes})"
    );
    Some(label as usize)
}

impl Layer for SoftmaxWithLoss {
    fn type_name(&self) -> &'static str {
        "softmax_with_loss"
    }

    /// Scores `(N, C)` and labels `(N)`; top `[]`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let (rows, classes) = rows_and_classes(&self.name, self.settings.axis, bottoms)?;
        let state = &mut self.state;
        state.classes = classes;
        state.prob.resize(rows * classes, 0.0);
        state.targets.resize(rows, None);
        Ok(vec![vec![]])
    }

    fn is_loss(&self) -> bool {
        true
    }

    /// # Panics
    /// On a label that is not `ignore_label` and not an integer in `[0, C)`.
    fn forward(&mut self, pass: ForwardPass<'_>) {
        let (ignore_label, state) = (self.settings.ignore_label, &mut self.state);
        let c = state.classes;
        let scores = &pass.bottoms[0].data;
        let labels = &pass.bottoms[1].data;
        let mut loss = 0.0f64;
        state.valid = 0;
        for (i, (row, prob)) in scores
            .chunks_exact(c)
            .zip(state.prob.chunks_exact_mut(c))
            .enumerate()
        {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for (p, &x) in prob.iter_mut().zip(row) {
                *p = (x - max).exp();
                sum += *p;
            }
            let inv = 1.0 / sum;
            prob.iter_mut().for_each(|p| *p *= inv);

            state.targets[i] = class_of(&self.name, labels[i], ignore_label, c, i);
            if let Some(l) = state.targets[i] {
                loss -= (prob[l].max(f32::MIN_POSITIVE) as f64).ln();
                state.valid += 1;
            }
        }
        pass.tops[0].data[0] = (loss / state.valid.max(1) as f64) as f32;
    }

    /// `dscores += w · (p − onehot) / V` on valid rows, `w = tops[0].diff[0]`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let Some((top, scores)) = pass.top_and_bottom() else {
            return;
        };
        let state = &self.state;
        let c = state.classes;
        let scale = top.diff[0] / state.valid.max(1) as f32;
        let rows = scores
            .diff
            .chunks_exact_mut(c)
            .zip(state.prob.chunks_exact(c));
        for ((diff, prob), target) in rows.zip(&state.targets) {
            if let Some(l) = *target {
                for (d, &p) in diff.iter_mut().zip(prob) {
                    *d += scale * p;
                }
                diff[l] -= scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{label_blob, uniform_blob, GradientChecker};
    use crate::layers::test_util::{self, blob, layer};

    fn softmax_loss(keys: &str) -> SoftmaxWithLoss {
        layer::<SoftmaxWithLossParams>("softmax_with_loss", keys)
    }

    fn loss_of(layer: &mut SoftmaxWithLoss, scores: &[f32], labels: &[f32]) -> f32 {
        let n = labels.len();
        let c = scores.len() / n;
        let bottoms = [blob(&[n, c], scores), blob(&[n], labels)];
        let top = test_util::forward(layer, &bottoms, &[]);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].shape, Vec::<usize>::new());
        top[0].data[0]
    }

    #[test]
    fn forward_by_hand() {
        // Row 0: −ln(e³ / (e + e² + e³)) = ln(1 + e⁻¹ + e⁻²) = 0.407_605_96;
        // row 1: −ln(1/3) = 1.098_612_3.
        let scores = [1.0, 2.0, 3.0, 0.0, 0.0, 0.0];
        let mut layer = softmax_loss("");
        let loss = loss_of(&mut layer, &scores, &[2.0, 0.0]);
        assert!((loss - 0.753_109_1).abs() < 1e-6, "{loss}");
        let p = layer.prob();
        assert!(
            (p[2] - 0.665_240_96).abs() < 1e-6 && (p[3] - 1.0 / 3.0).abs() < 1e-6,
            "{p:?}"
        );

        let mut ignoring = softmax_loss("ignore_label = 0");
        let loss = loss_of(&mut ignoring, &scores, &[2.0, 0.0]);
        assert!((loss - 0.407_605_96).abs() < 1e-6, "{loss}");
        assert_eq!(ignoring.valid(), 1);
        let none = loss_of(&mut ignoring, &scores, &[0.0, 0.0]);
        assert_eq!(none, 0.0);
    }

    #[test]
    fn stable_for_large_scores() {
        let mut layer = softmax_loss("");
        let right = loss_of(&mut layer, &[1000.0, 0.0], &[0.0]);
        assert_eq!(right, 0.0);
        // p = e^−1000 underflows; the clamp at f32::MIN_POSITIVE gives −ln(2^−126) ≈ 87.3365.
        let wrong = loss_of(&mut layer, &[1000.0, 0.0], &[1.0]);
        assert!((wrong - 87.336_55).abs() < 1e-3, "{wrong}");
        assert!(layer.prob().iter().all(|p| p.is_finite()));
    }

    #[test]
    fn gradient() {
        let scores = uniform_blob(&[4, 5], -2.0, 2.0, 51);
        let labels = label_blob(4, 5, 52);
        let bottoms = [scores, labels];
        GradientChecker::default().assert_passes(&mut softmax_loss(""), &bottoms, &[true, false]);
    }

    #[test]
    fn gradient_with_ignore_label() {
        let scores = uniform_blob(&[6, 3, 2], -2.0, 2.0, 53);
        let mut labels = label_blob(6, 6, 54);
        labels.data[1] = -1.0;
        labels.data[4] = -1.0;
        let mut layer = softmax_loss("ignore_label = -1");
        GradientChecker::default().assert_passes(&mut layer, &[scores, labels], &[true, false]);
        assert_eq!(layer.valid(), 4);
    }

    #[test]
    fn ignored_rows_get_no_gradient() {
        let mut layer = softmax_loss("ignore_label = 7");
        let mut bottoms = [
            blob(&[2, 2], &[1.0, -1.0, 0.5, 0.5]),
            blob(&[2], &[7.0, 1.0]),
        ];
        let mut top = test_util::forward(&mut layer, &bottoms, &[]);
        top[0].diff[0] = 2.0;
        test_util::backward(&mut layer, &top, &[true, false], &mut bottoms, &[], &mut []);
        // Row 1: 2 · ([0.5, 0.5] − [0, 1]) / 1.
        assert_eq!(bottoms[0].diff, vec![0.0, 0.0, 1.0, -1.0]);
        assert_eq!(bottoms[1].diff, vec![0.0, 0.0]);
    }

    #[test]
    fn reshape_checks_the_bottoms() {
        let mut layer = softmax_loss("");
        assert!(layer.reshape(&[&[4, 5]]).is_err());
        let err = layer.reshape(&[&[4, 5], &[3]]).unwrap_err().to_string();
        assert!(err.contains("loss") && err.contains("4 rows"), "{err}");
        assert!(layer.reshape(&[&[4, 5], &[4, 1]]).is_ok());
    }

    #[test]
    #[should_panic(expected = "not a class")]
    fn rejects_an_out_of_range_label() {
        loss_of(&mut softmax_loss(""), &[0.0, 0.0], &[2.0]);
    }
}
