//! `p2ptrain predict`: class probabilities of new inputs. This module owns what is not the
//! trainer's: which blob of a net holds its class scores ([`Classifier`]), the top-k of a row of
//! scores, the JSON line of one input, and the inputs themselves ([`inputs`]). The replicas run
//! the test-phase forward (`parallel::P2PSync::predict`) over contiguous shards of the inputs, in
//! batches of the config's test batch size.
//!
//! ```text
//! {"input": "images.idx#0", "top_k": [{"class": 3, "prob": 0.91}, {"class": 8, "prob": 0.05}]}
//! ```

pub mod inputs;

use crate::config::{Config, LayerKind, Phase};
use crate::error::{Error, Result};
use std::sync::Arc;

/// The blob of a net that holds its class scores `(N, classes)` and whether they are
/// probabilities already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classifier {
    pub blob: String,
    /// `true` for a Softmax layer's top; `false` for scores that a softmax turns into
    /// probabilities (what SoftmaxWithLoss and Accuracy read).
    pub probabilities: bool,
}

impl Classifier {
    /// The class scores of the net `cfg` in the test phase: the top of its last Softmax layer,
    /// else the scores its SoftmaxWithLoss (or Accuracy) layer reads.
    pub fn of(cfg: &Config) -> Result<Classifier> {
        let in_test: Vec<_> = cfg
            .layers
            .iter()
            .filter(|l| l.phase.is_none_or(|p| p == Phase::Test))
            .collect();
        let first_bottom = |kind: LayerKind| {
            in_test
                .iter()
                .find(|l| l.kind == kind)
                .and_then(|l| l.bottom.first())
        };
        let found = in_test
            .iter()
            .rev()
            .find(|l| l.kind == LayerKind::Softmax)
            .and_then(|l| l.top.first())
            .map(|t| (t, true))
            .or_else(|| first_bottom(LayerKind::SoftmaxWithLoss).map(|b| (b, false)))
            .or_else(|| first_bottom(LayerKind::Accuracy).map(|b| (b, false)));
        found
            .map(|(blob, probabilities)| Classifier {
                blob: blob.clone(),
                probabilities,
            })
            .ok_or_else(|| {
                Error::Usage(
                    "predict: the net has no Softmax, SoftmaxWithLoss or Accuracy layer in its \
                     test phase to name its class scores"
                        .into(),
                )
            })
    }
}

/// What the replicas of `predict` are given: the inputs, the classifier, and `k`.
pub struct Job {
    pub inputs: Arc<dyn inputs::InputSource>,
    pub classifier: Classifier,
    pub top_k: usize,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("inputs", &self.inputs.name())
            .field("records", &self.inputs.len())
            .field("classifier", &self.classifier)
            .field("top_k", &self.top_k)
            .finish()
    }
}

/// The `k` most probable classes of one row of `scores` as `(class, probability)`, most probable
/// first (the lower class first on a tie); a softmax (in f64) first unless `probabilities`.
pub fn top_k(scores: &[f32], probabilities: bool, k: usize) -> Vec<(usize, f64)> {
    let probs: Vec<f64> = if probabilities {
        scores.iter().map(|&s| f64::from(s)).collect()
    } else {
        let max = scores
            .iter()
            .fold(f64::NEG_INFINITY, |m, &s| m.max(f64::from(s)));
        let exp: Vec<f64> = scores.iter().map(|&s| (f64::from(s) - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        exp.into_iter().map(|e| e / sum).collect()
    };
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.into_iter().take(k).map(|c| (c, probs[c])).collect()
}

/// One input's line of `predictions.jsonl`.
pub fn json_line(input: &str, top: &[(usize, f64)]) -> String {
    let top: Vec<serde_json::Value> = top
        .iter()
        .map(|&(class, prob)| serde_json::json!({"class": class, "prob": prob}))
        .collect();
    serde_json::json!({"input": input, "top_k": top}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_takes_a_softmax_and_orders_by_probability() {
        let top = top_k(&[1.0, 3.0, 2.0, 3.0], false, 3);
        let classes: Vec<usize> = top.iter().map(|t| t.0).collect();
        assert_eq!(classes, [1, 3, 2], "ties go to the lower class");
        let z = 2.0 * 3f64.exp() + 2f64.exp() + 1f64.exp();
        assert!((top[0].1 - 3f64.exp() / z).abs() < 1e-12);
        let p = top_k(&[0.25, 0.75], true, 5);
        assert_eq!(p, [(1, 0.75), (0, 0.25)]);
    }

    #[test]
    fn the_classifier_is_a_softmax_top_or_what_the_loss_reads() {
        let cfg = |layers: &str| -> Config {
            let text = format!(
                "[data]\nformat = \"digits\"\nbatch_size = 2\n[solver]\nbase_lr = 0.1\nmax_iter = 1\n{layers}"
            );
            toml::from_str(&text).unwrap()
        };
        let ip = "[[layer]]\nname = \"ip\"\ntype = \"inner_product\"\nbottom = [\"data\"]\ntop = [\"ip\"]\nnum_output = 10\n";
        let loss = "[[layer]]\nname = \"loss\"\ntype = \"softmax_with_loss\"\nbottom = [\"ip\", \"label\"]\ntop = [\"loss\"]\n";
        let prob = "[[layer]]\nname = \"prob\"\ntype = \"softmax\"\nbottom = [\"ip\"]\ntop = [\"prob\"]\nphase = \"test\"\n";
        let c = Classifier::of(&cfg(&format!("{ip}{loss}"))).unwrap();
        assert_eq!((c.blob.as_str(), c.probabilities), ("ip", false));
        let c = Classifier::of(&cfg(&format!("{ip}{prob}{loss}"))).unwrap();
        assert_eq!((c.blob.as_str(), c.probabilities), ("prob", true));
        assert!(Classifier::of(&cfg(ip)).is_err());
    }

    #[test]
    fn a_line_names_the_input_and_its_classes() {
        let line = json_line("a.idx#3", &[(7, 0.5)]);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["input"], "a.idx#3");
        assert_eq!(v["top_k"][0]["class"], 7);
        assert_eq!(v["top_k"][0]["prob"], 0.5);
    }
}
