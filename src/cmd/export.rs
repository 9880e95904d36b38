//! `p2ptrain export SNAPSHOT --format caffe|torchvision -o FILE [--config CONFIG]`: a snapshot's
//! weights as a Caffe `.caffemodel` or a torchvision ResNet state dict (see
//! `crate::caffe::export`). One process, no MPI.

use crate::caffe::export::{self, ExportFormat, ExportOptions};

/// Exports and returns the exit code (2 for a snapshot or config that does not fit, 1 when the
/// file cannot be written).
pub fn run(opts: &ExportOptions) -> i32 {
    match export::run(opts) {
        Ok(n) => {
            let what = match opts.format {
                ExportFormat::Caffe => "blob(s)",
                ExportFormat::Torchvision => "tensor(s)",
            };
            println!("{n} {what} written to {}", opts.output.display());
            0
        }
        Err(e) => {
            eprintln!("p2ptrain: error: {e}");
            e.exit_code()
        }
    }
}
