//! `p2ptrain import-caffe NET.prototxt [--solver SOLVER.prototxt] [--weights X.caffemodel] -o
//! DIR`: a Caffe net (and its solver and weights) as `DIR/cluster.toml` and
//! `DIR/weights.safetensors` (see `crate::caffe::import`). One process, no MPI.

use crate::caffe::import::{self, ImportOptions};

/// Imports and returns the exit code (2 for anything p2ptrain cannot read or lacks, 1 when a
/// file cannot be written).
pub fn run(opts: &ImportOptions) -> i32 {
    match import::run(opts) {
        Ok(report) => {
            for w in &report.warnings {
                eprintln!("p2ptrain: warning: {w}");
            }
            println!(
                "{} layer(s) written to {}",
                report.layers,
                report.config.display()
            );
            if let Some(w) = &report.weights {
                println!("{} tensor(s) written to {}", report.tensors, w.display());
            }
            0
        }
        Err(e) => {
            eprintln!("p2ptrain: error: {e}");
            e.exit_code()
        }
    }
}
