//! A Caffe solver prototxt (`SolverParameter` in the text format) turned into p2ptrain's
//! `[solver]` table and the `[cluster] backend` its `solver_mode` asks for.
//!
//! The keys keep Caffe's names and values (`base_lr`, `lr_policy`, `stepvalue`, ...); the
//! update rule comes from `type` (or the legacy `solver_type` enum), lower-cased. Caffe's
//! defaults that differ from p2ptrain's are written out: `test_initialization` (true in Caffe),
//! and `solver_mode` (GPU in Caffe: `backend = "auto"`, the GPUs when there are enough). Fields
//! about Caffe's own running (`device_id`, `debug_info`, `snapshot_format`, `net`) are skipped;
//! fields p2ptrain lacks (several test nets, inline nets, net states, `snapshot_after_train:
//! false`) are errors naming the line.

use super::prototxt::{Field, Message};
use super::text_error;
use crate::error::Result;
use std::path::Path;
use toml_edit::{Array, Item, Table};

/// `[solver]` and the backend.
#[derive(Debug, Clone)]
pub struct ImportedSolver {
    pub solver: Table,
    /// `cpu` or `auto`.
    pub backend: &'static str,
    /// Notes for the user.
    pub warnings: Vec<String>,
}

/// Float fields with the same name in p2ptrain.
const FLOATS: &[&str] = &[
    "base_lr",
    "momentum",
    "momentum2",
    "delta",
    "rms_decay",
    "weight_decay",
    "gamma",
    "power",
    "clip_gradients",
];

/// Non-negative integer fields with the same name in p2ptrain.
const COUNTS: &[&str] = &[
    "stepsize",
    "max_iter",
    "iter_size",
    "display",
    "average_loss",
    "test_interval",
    "snapshot",
];

/// Fields about how Caffe runs, which change nothing p2ptrain computes.
const SKIPPED: &[&str] = &[
    "net",
    "device_id",
    "debug_info",
    "snapshot_format",
    "snapshot_diff",
    "test_compute_loss",
    "layer_wise_reduce",
];

/// The update rules p2ptrain has, by Caffe's `type` (lower-cased) and legacy `solver_type`.
const TYPES: &[(&str, &str)] = &[
    ("sgd", "sgd"),
    ("nesterov", "nesterov"),
    ("adagrad", "adagrad"),
    ("rmsprop", "rmsprop"),
    ("adam", "adam"),
    ("adadelta", "adadelta"),
];

/// The lr policies p2ptrain has.
const POLICIES: &[&str] = &[
    "fixed",
    "step",
    "multistep",
    "exp",
    "inv",
    "poly",
    "sigmoid",
];

/// Reads the solver at `path` (already parsed into `m`).
pub fn read(path: &Path, m: &Message) -> Result<ImportedSolver> {
    let mut t = Table::new();
    let mut backend = "auto";
    let mut warnings = Vec::new();
    let mut stepvalues = Array::new();
    let mut test_iters: Vec<&Field> = Vec::new();
    let mut test_initialization = true;
    for f in &m.fields {
        let name = f.name.as_str();
        let bad = |e: String| text_error(path, f.pos, format!("solver.{name}"), e);
        match name {
            n if FLOATS.contains(&n) => {
                t.insert(n, Item::Value(f.float().map_err(bad)?.into()));
            }
            n if COUNTS.contains(&n) => {
                t.insert(n, Item::Value(count(f).map_err(bad)?.into()));
            }
            "stepvalue" => stepvalues.push(count(f).map_err(bad)?),
            "test_iter" => test_iters.push(f),
            "test_initialization" => test_initialization = f.boolean().map_err(bad)?,
            "snapshot_prefix" => {
                t.insert(name, Item::Value(f.string().map_err(bad)?.into()));
            }
            "regularization_type" => {
                let r = f.string().map_err(bad)?;
                if !["L1", "L2"].contains(&r) {
                    return Err(bad(format!("\"{r}\": p2ptrain has L1 and L2")));
                }
                t.insert(name, Item::Value(r.into()));
            }
            "lr_policy" => {
                let p = f.string().map_err(bad)?;
                if !POLICIES.contains(&p) {
                    return Err(bad(format!(
                        "\"{p}\" is not supported (p2ptrain has {})",
                        POLICIES.join(", ")
                    )));
                }
                t.insert(name, Item::Value(p.into()));
            }
            "type" | "solver_type" => {
                let given = match name {
                    "type" => f.string().map_err(bad)?,
                    _ => f.ident().map_err(bad)?,
                };
                let ours = TYPES
                    .iter()
                    .find(|(caffe, _)| given.eq_ignore_ascii_case(caffe))
                    .map(|(_, ours)| *ours)
                    .ok_or_else(|| {
                        bad(format!(
                            "{given} is not supported (p2ptrain has SGD, Nesterov, AdaGrad, \
                             RMSProp, AdaDelta, Adam)"
                        ))
                    })?;
                t.insert("type", Item::Value(ours.into()));
            }
            "random_seed" => {
                let seed = f.int().map_err(bad)?;
                if seed >= 0 {
                    t.insert(name, Item::Value(seed.into()));
                } else {
                    warnings.push(format!(
                        "{}:{}: random_seed {seed} (a seed from the clock in Caffe): p2ptrain \
                         uses its default seed, 1",
                        path.display(),
                        f.pos
                    ));
                }
            }
            "solver_mode" => {
                backend = match f.ident().map_err(bad)? {
                    "CPU" => "cpu",
                    "GPU" => "auto",
                    other => return Err(bad(format!("unknown mode {other}"))),
                }
            }
            "snapshot_after_train" if f.boolean().map_err(bad)? => {}
            "snapshot_after_train" => {
                return Err(bad(
                    "false is not supported: p2ptrain always snapshots at the end".into(),
                ))
            }
            n if SKIPPED.contains(&n) => {}
            "train_net" | "test_net" | "net_param" | "train_net_param" | "test_net_param"
            | "train_state" | "test_state" => {
                return Err(bad(
                    "not supported: p2ptrain trains one net, given on the command line, with \
                     its TRAIN and TEST phases"
                        .into(),
                ))
            }
            other => return Err(bad(format!("`{other}` is not supported"))),
        }
    }
    if !stepvalues.is_empty() {
        t.insert("stepvalue", Item::Value(stepvalues.into()));
    }
    if let Some(extra) = test_iters.get(1) {
        return Err(text_error(
            path,
            extra.pos,
            "solver.test_iter",
            "one test_iter per test net: p2ptrain has one test net",
        ));
    }
    if let Some(f) = test_iters.first() {
        let n = count(f).map_err(|e| text_error(path, f.pos, "solver.test_iter", e))?;
        t.insert("test_iter", Item::Value(n.into()));
    }
    t.insert(
        "test_initialization",
        Item::Value(test_initialization.into()),
    );
    Ok(ImportedSolver {
        solver: t,
        backend,
        warnings,
    })
}

/// A non-negative integer field.
fn count(f: &Field) -> std::result::Result<i64, String> {
    let v = f.int()?;
    if v < 0 {
        return Err(format!("`{}` must not be negative, got {v}", f.name));
    }
    Ok(v)
}

/// The `[solver]` of a net imported without a solver: Caffe's SolverParameter defaults where
/// p2ptrain needs a value (a rate of 0.01 and one iteration, to be edited before training).
pub fn placeholder() -> Table {
    let mut t = Table::new();
    t.insert("base_lr", Item::Value(0.01.into()));
    t.insert("max_iter", Item::Value(1i64.into()));
    t.insert("test_initialization", Item::Value(true.into()));
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caffe::prototxt::parse;

    #[test]
    fn caffes_names_and_values_are_kept() {
        let m = parse(
            "net: \"n.prototxt\" test_iter: 6 test_interval: 300 base_lr: 0.01 momentum: 0.9 \
             weight_decay: 0.0005 lr_policy: \"multistep\" gamma: 0.1 stepvalue: 100 stepvalue: 200 \
             max_iter: 600 snapshot_prefix: \"s/x\" random_seed: 1 solver_mode: CPU type: \"Adam\"",
        )
        .unwrap();
        let s = read(Path::new("s.prototxt"), &m).unwrap();
        assert_eq!(s.backend, "cpu");
        let text = s.solver.to_string();
        for line in [
            "test_iter = 6",
            "base_lr = 0.01",
            "lr_policy = \"multistep\"",
            "stepvalue = [100, 200]",
            "snapshot_prefix = \"s/x\"",
            "type = \"adam\"",
            "test_initialization = true",
            "random_seed = 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn what_p2ptrain_lacks_names_the_line() {
        for (text, what) in [
            ("base_lr: 0.1\nlr_policy: \"triangular\"", "triangular"),
            ("test_iter: 1\ntest_iter: 2", "one test net"),
            ("base_lr: 0.1\ntype: \"Lion\"", "Lion"),
            ("base_lr: 0.1\ntest_net: \"x\"", "one net"),
            ("base_lr: 0.1\nmax_iter: -5", "negative"),
        ] {
            let e = read(Path::new("s.prototxt"), &parse(text).unwrap()).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("s.prototxt:2:"), "{msg}");
            assert!(msg.contains(what), "{what} in {msg}");
        }
    }
}
