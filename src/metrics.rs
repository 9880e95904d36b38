//! `MetricsLog`: the `metrics.jsonl` file of a run, one JSON object per line, flushed per line so a
//! killed job keeps what it logged. Written by universal rank 0 only.

use crate::error::{Error, Result};
use crate::solver::loss_scale::LossScaleState;
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// An open `metrics.jsonl`.
pub struct MetricsLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsLog {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let file =
            File::create(path).map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    /// Opens `path` for appending (a resumed run), creating it if needed.
    pub fn append(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    /// `{"iter", "phase": "train", "loss", "lr", "samples_per_sec", "elapsed_s"}`, and with loss
    /// scaling `"loss_scale"` (the scale of the next step) and `"overflow_skipped"` (steps
    /// skipped for an overflow so far).
    pub fn train(
        &mut self,
        iter: u64,
        loss: f64,
        lr: f32,
        samples_per_sec: f64,
        elapsed_s: f64,
        loss_scale: Option<&LossScaleState>,
    ) -> Result<()> {
        let mut line = json!({
            "iter": iter, "phase": "train", "loss": loss, "lr": lr,
            "samples_per_sec": samples_per_sec, "elapsed_s": elapsed_s,
        });
        if let (Some(ls), Some(m)) = (loss_scale, line.as_object_mut()) {
            m.insert("loss_scale".into(), json!(ls.scale));
            m.insert("overflow_skipped".into(), json!(ls.skipped));
        }
        self.line(line)
    }

    /// `{"iter", "phase": "skip", "steps", "skipped_total"}`: `steps` updates refused for
    /// non-finite numbers since the previous such line, the latest at iteration `iter`
    /// (`[solver] non_finite = "skip"`).
    pub fn skip(&mut self, iter: u64, steps: u64, skipped_total: u64) -> Result<()> {
        self.line(json!({
            "iter": iter, "phase": "skip", "steps": steps, "skipped_total": skipped_total,
        }))
    }

    /// `{"iter", "phase": "test", "loss", "accuracy", ...}`; `extra` adds further named outputs
    /// (a second accuracy layer, say).
    pub fn test(
        &mut self,
        iter: u64,
        loss: f64,
        accuracy: Option<f64>,
        extra: &[(String, f64)],
    ) -> Result<()> {
        let mut m = Map::new();
        m.insert("iter".into(), json!(iter));
        m.insert("phase".into(), json!("test"));
        m.insert("loss".into(), json!(loss));
        if let Some(a) = accuracy {
            m.insert("accuracy".into(), json!(a));
        }
        for (k, v) in extra {
            m.insert(k.clone(), json!(v));
        }
        self.line(Value::Object(m))
    }

    fn line(&mut self, v: Value) -> Result<()> {
        let ctx = |e| Error::io(format!("writing {}", self.path.display()), e);
        writeln!(self.out, "{v}").map_err(ctx)?;
        self.out.flush().map_err(ctx)
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
