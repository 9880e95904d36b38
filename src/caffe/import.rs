//! `p2ptrain import-caffe`: a Caffe net prototxt, optionally its solver and a `.caffemodel`,
//! written as `DIR/cluster.toml` (`[cluster]`, `[data]`, `[solver]`, `[[layer]]`) and
//! `DIR/weights.safetensors`, so that `p2ptrain train DIR/cluster.toml --weights
//! DIR/weights.safetensors` trains the same net from the same weights.

use super::{net, read_prototxt, solver, weights};
use crate::error::Result;
use std::path::PathBuf;
use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

/// What to import and where to.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub net: PathBuf,
    pub solver: Option<PathBuf>,
    pub weights: Option<PathBuf>,
    pub out_dir: PathBuf,
}

/// What an import wrote.
#[derive(Debug, Clone)]
pub struct ImportReport {
    pub config: PathBuf,
    pub weights: Option<PathBuf>,
    pub layers: usize,
    pub tensors: usize,
    /// Things skipped that Caffe skips too.
    pub warnings: Vec<String>,
}

/// The config file an import writes into its folder.
pub const CONFIG_FILE: &str = "cluster.toml";
/// The weights file an import writes into its folder.
pub const WEIGHTS_FILE: &str = "weights.safetensors";

/// Reads everything first, then writes the config and the weights (each atomically).
pub fn run(opts: &ImportOptions) -> Result<ImportReport> {
    let net_text = read_prototxt(&opts.net)?;
    let imported = net::read(&opts.net, &net_text, &opts.out_dir)?;
    let mut warnings = imported.warnings.clone();
    let solver = match &opts.solver {
        Some(path) => {
            let s = solver::read(path, &read_prototxt(path)?)?;
            warnings.extend(s.warnings.iter().cloned());
            Some(s)
        }
        None => None,
    };
    let tensors = match &opts.weights {
        Some(path) => {
            let model = weights::read_caffemodel(path)?;
            let configs: Vec<_> = imported.layers.iter().map(|l| &l.config).collect();
            let (tensors, skipped) = weights::import(path, &model, &configs)?;
            if !skipped.is_empty() {
                warnings.push(format!(
                    "{}: layer(s) not in the net, skipped as Caffe skips them: {}",
                    path.display(),
                    skipped.join(", ")
                ));
            }
            Some(tensors)
        }
        None => None,
    };
    let text = config_text(opts, &imported, solver.as_ref());
    let config = opts.out_dir.join(CONFIG_FILE);
    crate::snapshot::write_atomic(&config, "config", |tmp| std::fs::write(tmp, &text))?;
    let weights = match &tensors {
        Some(tensors) => {
            let path = opts.out_dir.join(WEIGHTS_FILE);
            let views: Vec<_> = tensors
                .iter()
                .map(|t| (t.name.as_str(), t.shape.as_slice(), t.data.as_slice()))
                .collect();
            let source = opts.weights.as_ref().map(|p| p.display().to_string());
            let meta = vec![("source".to_string(), source.unwrap_or_default())];
            crate::snapshot::save_tensors(&path, &views, &meta)?;
            Some(path)
        }
        None => None,
    };
    Ok(ImportReport {
        config,
        weights,
        layers: imported.layers.len(),
        tensors: tensors.map_or(0, |t| t.len()),
        warnings,
    })
}

/// The config file's text: a header saying where it came from, then the four sections.
fn config_text(
    opts: &ImportOptions,
    imported: &net::ImportedNet,
    solver: Option<&solver::ImportedSolver>,
) -> String {
    let mut doc = DocumentMut::new();
    let mut cluster = Table::new();
    cluster.insert(
        "backend",
        Item::Value(solver.map_or("auto", |s| s.backend).into()),
    );
    doc.insert("cluster", Item::Table(cluster));
    doc.insert("data", Item::Table(imported.data.clone()));
    let solver_table = solver.map_or_else(solver::placeholder, |s| s.solver.clone());
    doc.insert("solver", Item::Table(solver_table));
    let mut layers = ArrayOfTables::new();
    for l in &imported.layers {
        layers.push(l.table.clone());
    }
    doc.insert("layer", Item::ArrayOfTables(layers));
    let mut header = format!(
        "# Imported by `p2ptrain import-caffe` from {}",
        opts.net.display()
    );
    if let Some(name) = &imported.name {
        header.push_str(&format!(" (net \"{name}\")"));
    }
    if let Some(s) = &opts.solver {
        header.push_str(&format!("\n# and the solver {}", s.display()));
    }
    header.push_str(
        "\n# Paths are relative to this file. Caffe's Data layers read their LMDB in order: \
         shuffle = false.\n",
    );
    if imported
        .layers
        .iter()
        .any(|l| l.kind == crate::config::LayerKind::Input)
    {
        header.push_str(
            "# A deploy net (an Input layer): without a Data layer, [data] is a synthetic \
             placeholder of the Input's shape for `p2ptrain predict --input`.\n",
        );
    }
    if solver.is_none() {
        header.push_str(
            "# No solver was given: [solver] holds placeholders (base_lr, max_iter) to edit \
             before training.\n",
        );
    }
    format!("{header}\n{doc}")
}
