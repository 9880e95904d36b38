//! `p2ptrain predict CONFIG --weights W --input FILE... -o predictions.jsonl [--top-k 5]`: the
//! net's class probabilities for each input record, one JSON line per input in input order
//! (`crate::predict`), computed by every rank and replica on its contiguous shard (CPU or GPUs,
//! as `[cluster] backend` says) and gathered on rank 0, which writes the file. The flow is
//! `train`'s (`super::train`, `Action::Predict`).

use crate::config::Config;
use crate::data::{self, DataSplit};
use crate::dist::bootstrap::report_error;
use crate::dist::Bootstrap;
use crate::error::{Error, Result};
use crate::parallel::RunReport;
use crate::predict::{inputs, Classifier, Job};
use std::path::PathBuf;

/// What `predict` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Input files, read in order as one list of records.
    pub inputs: Vec<PathBuf>,
    /// `predictions.jsonl`.
    pub output: PathBuf,
    /// Classes per input, most probable first.
    pub top_k: usize,
}

/// The inputs as the data split the replicas read (its test half; the transform is the
/// config's) and the job.
pub fn open(request: &Request, cfg: &Config) -> Result<(DataSplit, Job)> {
    let source = inputs::open_all(&request.inputs)?;
    let transform = data::transform_of(&cfg.data, source.record_shape(), cfg.solver.random_seed)?;
    let records: std::sync::Arc<dyn data::RecordSource> = source.clone();
    let split = DataSplit {
        train: records.clone(),
        test: records,
        transform,
    };
    let job = Job {
        inputs: source,
        classifier: Classifier::of(cfg)?,
        top_k: request.top_k,
    };
    Ok((split, job))
}

/// Creates the output file before anything runs, so that a bad path fails at once.
pub fn create_output(request: &Request) -> Result<()> {
    std::fs::File::create(&request.output)
        .map(drop)
        .map_err(|e| Error::Usage(format!("-o {}: {e}", request.output.display())))
}

/// Gathers every process's lines on rank 0, which writes them in input order (ranks hold
/// consecutive shards); returns the exit code.
pub fn write_lines(boot: &Bootstrap, request: &Request, report: &RunReport) -> i32 {
    let mine = report.predictions.join("\n");
    let Some(all) = boot.gather_bytes(mine.as_bytes()) else {
        return 0;
    };
    let mut text = String::new();
    for part in all.iter().filter(|p| !p.is_empty()) {
        text.push_str(&String::from_utf8_lossy(part));
        text.push('\n');
    }
    let lines = text.lines().count();
    match crate::snapshot::write_atomic(&request.output, "predictions", |tmp| {
        std::fs::write(tmp, &text)
    }) {
        Ok(()) => {
            crate::logging::out_line(&format!(
                "predictions: {lines} input(s) in {:.2} s written to {}",
                report.seconds,
                request.output.display()
            ));
            0
        }
        Err(e) => {
            report_error(boot.rank, &e);
            e.exit_code()
        }
    }
}
