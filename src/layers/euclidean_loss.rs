//! `EuclideanLoss`: Caffe's sum-of-squares regression loss between a prediction `a` and a
//! target `b`.
//!
//! Bottoms: `a (N, ...)` and `b (N, ...)` with the same batch `N` and the same number of values
//! per sample (the shapes may differ otherwise: `(N, 1)` against labels `(N)`). Top: the scalar
//! loss, shape `[]`.
//!
//! `loss = Σ_i (a_i − b_i)² / 2N` (the squares summed in f64).
//!
//! Backward, as Caffe: `da += (w / N) · (a − b)` and `db += −(w / N) · (a − b)`, where `w` is the
//! top's diff (the loss weight the net sets there); both bottoms get their gradient where
//! propagated.

use crate::config::layer_params::EuclideanLossParams;
use crate::error::{Error, Result};
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The Euclidean loss; see the module docs.
    pub type EuclideanLoss = CpuLayer<EuclideanLossParams, Difference>;
}

/// What the loss keeps from its forward for its backward.
#[derive(Debug, Clone, Default)]
pub struct Difference {
    /// The batch `N`.
    num: usize,
    /// `a − b`, laid out as `a`.
    diff: Vec<f32>,
}

/// The batch of a Euclidean loss's bottoms `[a (N, ...), b (N, ...)]` and their values per
/// sample, or an error naming the layer when they do not pair up.
pub(crate) fn paired_bottoms(name: &str, bottoms: &[&[usize]]) -> Result<(usize, usize)> {
    let [a, b] = bottoms else {
        return Err(Error::net(
            name,
            format!(
                "takes 2 bottoms (prediction, target), got {}",
                bottoms.len()
            ),
        ));
    };
    let per_sample = |s: &[usize]| s.iter().skip(1).product::<usize>();
    if a.is_empty() || b.first() != a.first() || per_sample(a) != per_sample(b) {
        return Err(Error::net(
            name,
            format!(
                "the prediction {a:?} and the target {b:?} must have the same batch and the same \
                 number of values per sample"
            ),
        ));
    }
    Ok((a[0], a.iter().product()))
}

impl Layer for EuclideanLoss {
    fn type_name(&self) -> &'static str {
        "euclidean_loss"
    }

    /// Bottoms `a (N, ...)` and `b (N, ...)`; top `[]`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let (num, count) = paired_bottoms(&self.name, bottoms)?;
        self.state.num = num;
        self.state.diff.resize(count, 0.0);
        Ok(vec![vec![]])
    }

    fn is_loss(&self) -> bool {
        true
    }

    /// `diff = a − b`; `loss = Σ diff² / N / 2`.
    fn forward(&mut self, pass: ForwardPass<'_>) {
        let state = &mut self.state;
        let (a, b) = (&pass.bottoms[0].data, &pass.bottoms[1].data);
        for (d, (&x, &y)) in state.diff.iter_mut().zip(a.iter().zip(b)) {
            *d = x - y;
        }
        let dot: f64 = state.diff.iter().map(|&d| d as f64 * d as f64).sum();
        pass.tops[0].data[0] = (dot / state.num.max(1) as f64 / 2.0) as f32;
    }

    /// `d{a,b} += ±(w / N) · diff`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        let w = pass.tops[0].diff[0];
        for (i, sign) in [(0, 1.0f32), (1, -1.0)] {
            if !pass.propagate_down[i] {
                continue;
            }
            let alpha = sign * w / self.state.num.max(1) as f32;
            for (g, &d) in pass.bottoms[i].diff.iter_mut().zip(&self.state.diff) {
                *g += alpha * d;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::{uniform_blob, GradientChecker};
    use crate::layers::test_util::{backward, blob, forward, layer, params_error};

    fn loss() -> EuclideanLoss {
        layer::<EuclideanLossParams>("euclidean_loss", "")
    }

    #[test]
    fn forward_by_hand() {
        // N = 2: differences (1, -2) and (0.5, 3); Σ d² = 1 + 4 + 0.25 + 9 = 14.25; / 2N = 3.5625.
        let a = blob(&[2, 2], &[1.0, 0.0, 2.5, 3.0]);
        let b = blob(&[2, 2], &[0.0, 2.0, 2.0, 0.0]);
        let top = forward(&mut loss(), &[a, b], &[]);
        assert_eq!(top[0].shape, Vec::<usize>::new());
        assert_eq!(top[0].data, vec![3.5625]);
    }

    #[test]
    fn both_bottoms_get_opposite_gradients_scaled_by_the_loss_weight() {
        let mut l = loss();
        let mut bottoms = vec![blob(&[2, 1], &[1.0, 4.0]), blob(&[2], &[3.0, 1.0])];
        let mut tops = forward(&mut l, &bottoms, &[]);
        assert_eq!(tops[0].data, vec![(4.0 + 9.0) / 4.0]);
        tops[0].diff[0] = 0.5;
        backward(&mut l, &tops, &[true, true], &mut bottoms, &[], &mut []);
        // (w / N) · (a − b) = 0.25 · (-2, 3).
        assert_eq!(bottoms[0].diff, vec![-0.5, 0.75]);
        assert_eq!(bottoms[1].diff, vec![0.5, -0.75]);
    }

    #[test]
    fn gradient_of_both_bottoms() {
        let a = uniform_blob(&[3, 4, 2], -1.0, 1.0, 51);
        let b = uniform_blob(&[3, 8], -1.0, 1.0, 52);
        GradientChecker::default().assert_passes(&mut loss(), &[a, b], &[true, true]);
    }

    #[test]
    fn mismatched_bottoms_are_refused() {
        assert!(loss().reshape(&[&[2, 3], &[2, 4]]).is_err());
        assert!(loss().reshape(&[&[2, 3], &[3, 2]]).is_err());
        assert!(loss().reshape(&[&[2, 3]]).is_err());
        assert!(params_error("euclidean_loss", "axis = 1").contains("`axis`"));
    }
}
