//! `p2ptrain test CONFIG --weights W`: the test phase alone, over the whole test set, on every
//! rank and replica (shards as in training); no update, no snapshot. The run's loss and accuracy
//! outputs are printed and appended to `metrics.jsonl` in the output folder exactly as the test
//! of a training run is, as the test of the weights' iteration (`<prefix>_iter_<N>` names it;
//! 0 otherwise).
//!
//! Top-1 and top-5: a net whose test phase has an Accuracy layer gets the one it lacks, on the
//! same bottoms (`accuracy_top1` or `accuracy_top5`, a top-5 only with at least 5 classes).
//! The flow is `train`'s (`super::train`, `Action::Test`).

use crate::config::{Config, LayerConfig, LayerKind, Phase};
use crate::error::Result;
use crate::metrics::MetricsLog;
use crate::output_folder::OutputLock;
use crate::parallel::{Outputs, TestResult};
use crate::resume::Lineage;
use std::path::Path;

/// Makes `cfg`'s test pass cover the whole test set (no `test_iter`) and report top-1 and top-5
/// accuracy (see the module docs).
pub fn whole_test_set(cfg: &mut Config) {
    cfg.solver.test_iter = None;
    let in_test = |l: &&LayerConfig| l.phase.is_none_or(|p| p == Phase::Test);
    let Some(acc) = cfg
        .layers
        .iter()
        .filter(in_test)
        .find(|l| l.kind == LayerKind::Accuracy)
        .cloned()
    else {
        return;
    };
    let has = |cfg: &Config, k: usize| {
        cfg.layers.iter().filter(in_test).any(|l| {
            l.kind == LayerKind::Accuracy && l.top_k.unwrap_or(1) == k && l.bottom == acc.bottom
        })
    };
    let classes = cfg.data.classes.unwrap_or(crate::data::DEFAULT_CLASSES);
    for k in [1, 5] {
        if has(cfg, k) || k > classes {
            continue;
        }
        let name = unique(cfg, &format!("accuracy_top{k}"));
        cfg.layers.push(LayerConfig {
            name: name.clone(),
            top: vec![name],
            top_k: Some(k),
            phase: Some(Phase::Test),
            ..acc.clone()
        });
    }
}

/// `base`, or `base_2`, `base_3`… : a layer and blob name the config does not use yet.
fn unique(cfg: &Config, base: &str) -> String {
    let taken = |n: &str| {
        cfg.layers
            .iter()
            .any(|l| l.name == n || l.top.iter().any(|t| t == n))
    };
    (1..)
        .map(|i| {
            if i == 1 {
                base.to_string()
            } else {
                format!("{base}_{i}")
            }
        })
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_string())
}

/// Universal rank 0's outputs: the output folder's lock and `metrics.jsonl`, appended to.
pub fn open_outputs(dir: &Path, host: &str) -> Result<Outputs> {
    let lock = OutputLock::acquire(dir, host)?;
    Ok(Outputs {
        dir: dir.to_path_buf(),
        metrics: MetricsLog::append(&dir.join("metrics.jsonl"))?,
        progress: None,
        lineage: Lineage::fresh(host),
        _lock: lock,
    })
}

/// The line `test` prints: loss and every accuracy output, over how many samples.
pub fn summary(t: &TestResult) -> String {
    let outputs: String = t
        .outputs
        .iter()
        .map(|(name, v)| format!(", {name} {:.4}%", 100.0 * v))
        .collect();
    format!(
        "test: loss {:.6}{outputs} over {} samples",
        t.loss, t.samples
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Config {
        let text = format!(
            "[data]\nformat = \"digits\"\nbatch_size = 2\n[solver]\nbase_lr = 0.1\nmax_iter = 1\ntest_iter = 3\n\
             [[layer]]\nname = \"ip\"\ntype = \"inner_product\"\nbottom = [\"data\"]\ntop = [\"ip\"]\nnum_output = 10\n{extra}"
        );
        toml::from_str(&text).unwrap()
    }

    const ACC: &str = "[[layer]]\nname = \"accuracy\"\ntype = \"accuracy\"\nbottom = [\"ip\", \"label\"]\ntop = [\"accuracy\"]\nphase = \"test\"\n";

    #[test]
    fn a_top1_accuracy_gets_its_top5_twin_and_the_whole_test_set() {
        let mut c = cfg(ACC);
        whole_test_set(&mut c);
        assert_eq!(c.solver.test_iter, None);
        let added: Vec<_> = c.layers.iter().skip(2).collect();
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].name, "accuracy_top5");
        assert_eq!(added[0].top_k, Some(5));
        assert_eq!(added[0].bottom, ["ip", "label"]);
    }

    #[test]
    fn nothing_is_added_twice_or_without_an_accuracy_layer() {
        let top5 = ACC
            .replace("name = \"accuracy\"", "name = \"a5\"\ntop_k = 5")
            .replace("top = [\"accuracy\"]", "top = [\"a5\"]");
        let mut c = cfg(&format!("{ACC}{top5}"));
        whole_test_set(&mut c);
        assert_eq!(c.layers.len(), 3);
        let mut c = cfg("");
        whole_test_set(&mut c);
        assert_eq!(c.layers.len(), 1);
    }
}
