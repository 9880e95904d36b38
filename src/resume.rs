//! Resumable snapshots: everything a run needs to go on exactly where it stopped, in two files
//! written by universal rank 0 after the same iteration on every replica:
//!
//! - `<prefix>_iter_<N>.safetensors`: the weights, as before (PyTorch-loadable), metadata `iter`
//!   and `fingerprint`;
//! - `<prefix>_iter_<N>.solverstate`: a safetensors file too, holding the solver history as
//!   tensors `<buffer>/<tensor>` (`momentum/ip1.weight`, or `m/…` and `v/…` for Adam; see
//!   `Solver::history_names`) and, in its metadata, the iteration, the data-stream position
//!   (records consumed, `iter × global batch`), the global batch and how it was made, the seed,
//!   shuffle flag and training-set size that key the data order and augmentation, the loss
//!   window of the displayed loss, the config's state fingerprint and its canonical JSON (to name
//!   the keys that differ when a resume is refused), and, when the loss is scaled
//!   (`crate::solver::loss_scale`), `loss_scale`, `loss_scale_good_steps` and
//!   `loss_scale_skipped`. Weights and history are FP32 whatever `cluster.math` is, so a run
//!   resumes in another precision (a snapshot without loss scaling starts the scale afresh).
//!
//! Under local SGD (`[cluster] sync = "local_sgd"`) the replicas differ between averagings, and
//! their solver histories always: the weights file then holds the mean of the replicas'
//! parameters (the model a test measures), and the solver state holds, instead of one history,
//! every replica's own parameters and history (`replica<r>/weights/<tensor>`,
//! `replica<r>/<buffer>/<tensor>`), the outer rule's state (`outer/anchor/<tensor>`,
//! `outer/momentum/<tensor>`), and in its metadata `sync = "local_sgd"`, `last_sync` (the
//! iteration after which the replicas last agreed) and `outer` (the outer buffers' names). Such
//! a snapshot resumes exactly under local SGD with as many replicas and the same outer rule, and
//! is refused otherwise; a synchronous snapshot resumes under local SGD too (every replica
//! starts from it, the outer rule afresh).
//!
//! The weights are written first, then the solver state, each atomically; a snapshot counts
//! (for `--resume latest` and for `snapshot_keep`) only when both files exist. Loading checks
//! the pair against the run before anything is trained: same state fingerprint (only
//! [`RESUME_FREE_KEYS`] may change), same global batch (unless allowed), same training set,
//! matching shapes; every refusal is an [`Error::Snapshot`] naming the file (exit code 2).

use crate::config::{Config, Plan, RESUME_FREE_KEYS};
use crate::error::{Error, Result};
use crate::input_file::{read_regular, UNBOUNDED};
use crate::params::Params;
use crate::snapshot;
use crate::solver::loss_scale::LossScaleState;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The `format` metadata of a solver-state file.
pub const FORMAT: &str = "p2ptrain-solverstate-1";
const WEIGHTS_EXT: &str = "safetensors";
const STATE_EXT: &str = "solverstate";
/// The solver-state metadata naming the lineage of the run that wrote it.
const LINEAGE_KEY: &str = "lineage";
/// The solver-state metadata saying the replicas trained apart, and its value.
const SYNC_KEY: &str = "sync";
const LOCAL_SGD: &str = "local_sgd";
/// The solver-state metadata of loss scaling: the scale, the run of good steps, the steps
/// skipped for an overflow (absent when the loss was not scaled).
const LOSS_SCALE_KEY: &str = "loss_scale";
const GOOD_STEPS_KEY: &str = "loss_scale_good_steps";
const SKIPPED_KEY: &str = "loss_scale_skipped";

/// What a run resumes from besides the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct SolverState {
    /// Iterations done; training goes on with iteration `iter`.
    pub iter: u64,
    /// The solver's history buffers, each `Params::len()` long, in `Solver::history` order.
    pub history: Vec<Vec<f32>>,
    /// The displayed-loss window: `(iteration, loss)` with the loss averaged over the replicas
    /// and sub-batches of that iteration, oldest first.
    pub loss_window: Vec<(u64, f64)>,
    /// Training records consumed before iteration `iter` (the data-stream position).
    pub data_position: u64,
    /// The lineage of the run that wrote the snapshot (see [`Lineage`]); `None` in snapshots
    /// written before lineages were recorded.
    pub lineage: Option<String>,
    /// Local SGD's replicas, each with its own state (`history` is then empty).
    pub apart: Option<ReplicasApart>,
    /// Loss scaling's state, `None` when the run that wrote it did not scale its loss (or
    /// predates loss scaling).
    pub loss_scale: Option<LossScaleState>,
}

/// Local SGD's state in a snapshot, beyond the weights (the replicas' mean).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicasApart {
    /// Iterations done when the replicas last agreed (a synchronous step or an averaging).
    pub last_sync: u64,
    /// Per universal rank, its own parameters `(n)`.
    pub params: Vec<Vec<f32>>,
    /// Per universal rank, its solver history, in `Solver::history` order.
    pub history: Vec<Vec<Vec<f32>>>,
    /// The outer rule's state, in `OuterOptimizer::state_names` order.
    pub outer: Vec<Vec<f32>>,
}

impl SolverState {
    /// The `average_loss` slots of one replica restored from the window, each the sum of
    /// `iter_size` sub-batch losses as the engines keep them. Every replica gets the global
    /// mean, so the global displayed loss comes out the same (up to rounding).
    pub fn loss_slots(&self, average_loss: u64, iter_size: u64) -> Vec<f64> {
        let mut slots = vec![0.0; average_loss.max(1) as usize];
        for &(j, v) in &self.loss_window {
            if j + average_loss >= self.iter {
                slots[(j % average_loss.max(1)) as usize] = v * iter_size as f64;
            }
        }
        slots
    }
}

/// The two files of snapshot `iter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFiles {
    pub iter: u64,
    pub weights: PathBuf,
    pub state: PathBuf,
}

impl SnapshotFiles {
    /// The files of snapshot `iter` of `prefix` (relative to `dir`, may contain `/`).
    pub fn new(dir: &Path, prefix: &str, iter: u64) -> Self {
        let base = dir.join(format!("{prefix}_iter_{iter}"));
        SnapshotFiles {
            iter,
            weights: base.with_extension(WEIGHTS_EXT),
            state: base.with_extension(STATE_EXT),
        }
    }

    /// The pair a user names by either file (`.safetensors` or `.solverstate`).
    pub fn of(path: &Path) -> Self {
        let iter = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.rsplit_once("_iter_"))
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or(0);
        SnapshotFiles {
            iter,
            weights: path.with_extension(WEIGHTS_EXT),
            state: path.with_extension(STATE_EXT),
        }
    }
}

/// What universal rank 0 writes at a snapshot, beyond the weights.
pub struct SaveState<'a> {
    pub iter: u64,
    pub history_names: &'a [&'a str],
    pub history: &'a [Vec<f32>],
    pub loss_window: &'a [(u64, f64)],
    pub train_records: usize,
    /// The id of the run's lineage, stored so that a resumed run recognises its own snapshots.
    pub lineage: &'a str,
    /// Local SGD: every replica's own state (then `history` is not written).
    pub apart: Option<&'a ReplicasApart>,
    /// Loss scaling's state, when the loss is scaled.
    pub loss_scale: Option<LossScaleState>,
}

/// Writes snapshot `state.iter` of `plan` into `dir`: the weights, then the solver state.
pub fn save(dir: &Path, plan: &Plan, params: &Params, state: &SaveState) -> Result<SnapshotFiles> {
    let cfg = &plan.config;
    let files = SnapshotFiles::new(dir, &cfg.solver.snapshot_prefix, state.iter);
    let fingerprint = format!("{:016x}", plan.fingerprint);
    snapshot::save_weights(
        &files.weights,
        params,
        &[
            ("iter".into(), state.iter.to_string()),
            ("fingerprint".into(), fingerprint.clone()),
        ],
    )?;

    let outer_names = cfg.cluster.outer_optimizer.state_names();
    let mut buffers: Vec<(String, &[f32])> = Vec::new();
    match state.apart {
        None => buffers.extend(
            state
                .history_names
                .iter()
                .map(|h| h.to_string())
                .zip(state.history.iter().map(Vec::as_slice)),
        ),
        Some(apart) => {
            for (r, (p, history)) in apart.params.iter().zip(&apart.history).enumerate() {
                buffers.push((format!("replica{r}/weights"), p));
                for (h, buf) in state.history_names.iter().zip(history) {
                    buffers.push((format!("replica{r}/{h}"), buf));
                }
            }
            for (o, buf) in outer_names.iter().zip(&apart.outer) {
                buffers.push((format!("outer/{o}"), buf));
            }
        }
    }
    let names: Vec<String> = buffers
        .iter()
        .flat_map(|(b, _)| {
            params
                .spans
                .iter()
                .map(move |s| format!("{b}/{}", s.full_name))
        })
        .collect();
    let mut name = names.iter();
    let mut tensors = Vec::with_capacity(names.len());
    for (_, buf) in &buffers {
        for s in &params.spans {
            let n = name.next().map(String::as_str).unwrap_or_default();
            tensors.push((n, s.shape.as_slice(), &buf[s.range()]));
        }
    }
    let window = serde_json::to_string(state.loss_window).unwrap_or_default();
    let mut meta: Vec<(String, String)> = [
        ("format", FORMAT.to_string()),
        ("iter", state.iter.to_string()),
        ("fingerprint", fingerprint),
        (
            "state_fingerprint",
            format!("{:016x}", plan.state_fingerprint),
        ),
        ("config", canonical(&cfg_for_state(cfg)).to_string()),
        ("history", state.history_names.join(",")),
        ("global_batch", plan.global_batch.to_string()),
        ("batch_size", cfg.data.batch_size.to_string()),
        ("replicas", plan.total_replicas.to_string()),
        ("iter_size", cfg.solver.iter_size.to_string()),
        (
            "data_position",
            (state.iter * plan.global_batch as u64).to_string(),
        ),
        ("random_seed", cfg.solver.random_seed.to_string()),
        ("shuffle", cfg.data.shuffle.to_string()),
        ("train_records", state.train_records.to_string()),
        ("loss_window", window),
        (LINEAGE_KEY, state.lineage.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(ls) = state.loss_scale {
        meta.push((LOSS_SCALE_KEY.into(), ls.scale.to_string()));
        meta.push((GOOD_STEPS_KEY.into(), ls.good_steps.to_string()));
        meta.push((SKIPPED_KEY.into(), ls.skipped.to_string()));
    }
    if let Some(apart) = state.apart {
        meta.push((SYNC_KEY.into(), LOCAL_SGD.into()));
        meta.push(("last_sync".into(), apart.last_sync.to_string()));
        meta.push(("outer".into(), outer_names.join(",")));
    }
    snapshot::save_tensors(&files.state, &tensors, &meta)?;
    Ok(files)
}

/// The config as stored in a solver state, `[cluster]` left out (free keys elsewhere are kept and
/// skipped when naming differences).
fn cfg_for_state(cfg: &Config) -> Config {
    let mut c = cfg.clone();
    c.cluster = Default::default();
    c
}

fn canonical(cfg: &Config) -> serde_json::Value {
    serde_json::to_value(cfg).unwrap_or(serde_json::Value::Null)
}

/// Every complete snapshot (both files) of `prefix` in `dir`, oldest first.
pub fn list(dir: &Path, prefix: &str) -> Vec<SnapshotFiles> {
    let base = dir.join(prefix);
    let (Some(parent), Some(stem)) = (base.parent(), base.file_name().and_then(|s| s.to_str()))
    else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let start = format!("{stem}_iter_");
    let mut found: Vec<SnapshotFiles> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u64 = name
                .strip_prefix(&start)?
                .strip_suffix(&format!(".{STATE_EXT}"))?
                .parse()
                .ok()?;
            let files = SnapshotFiles::new(dir, prefix, n);
            files.weights.is_file().then_some(files)
        })
        .collect();
    found.sort_by_key(|f| f.iter);
    found
}

/// The newest complete snapshot of `prefix` in `dir` (`--resume latest`).
pub fn latest(dir: &Path, prefix: &str) -> Result<SnapshotFiles> {
    list(dir, prefix).pop().ok_or_else(|| {
        let base = dir.join(prefix);
        Error::snapshot(
            base.parent().unwrap_or(dir),
            format!(
                "--resume latest: no snapshot to resume (no `{}_iter_<N>.{STATE_EXT}` with its `.{WEIGHTS_EXT}`)",
                base.file_name().map(|s| s.to_string_lossy()).unwrap_or_default()
            ),
        )
    })
}

/// The snapshots a run may delete for `snapshot_keep`: those written by the run itself and by
/// the runs it resumed from (one lineage, from a fresh start through every `--resume`), never
/// another run's that share the output folder and prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    /// Stored in every solver state the lineage writes; made once by its fresh start.
    pub id: String,
    /// The lineage's complete snapshots in the output folder, oldest first.
    pub snapshots: Vec<SnapshotFiles>,
}

impl Lineage {
    /// A fresh start: a new id (host, process, time), no snapshots yet.
    pub fn fresh(host: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Lineage {
            id: format!("{host}-{}-{nanos}", std::process::id()),
            snapshots: Vec::new(),
        }
    }

    /// The lineage of a run resumed from `state`: the snapshots of `prefix` in `dir` that the same
    /// lineage wrote up to the resumed iteration (later ones belong to an abandoned branch and
    /// are left alone). A snapshot without a lineage starts a new one that owns nothing yet.
    pub fn resumed(state: &SolverState, dir: &Path, prefix: &str, host: &str) -> Self {
        let Some(id) = &state.lineage else {
            return Lineage::fresh(host);
        };
        let snapshots = list(dir, prefix)
            .into_iter()
            .filter(|f| f.iter <= state.iter)
            .filter(|f| lineage_of(&f.state).as_deref() == Some(id.as_str()))
            .collect();
        Lineage {
            id: id.clone(),
            snapshots,
        }
    }

    /// Records snapshot `files`, just written, and deletes the oldest of the lineage's beyond
    /// the newest `keep` (`keep = 0` keeps all). Returns the files removed.
    pub fn add_and_prune(&mut self, files: SnapshotFiles, keep: usize) -> Vec<PathBuf> {
        self.snapshots.retain(|f| f.iter != files.iter);
        self.snapshots.push(files);
        self.snapshots.sort_by_key(|f| f.iter);
        let excess = match keep {
            0 => 0,
            k => self.snapshots.len().saturating_sub(k),
        };
        let mut removed = Vec::new();
        for old in self.snapshots.drain(..excess) {
            for path in [old.weights, old.state] {
                if std::fs::remove_file(&path).is_ok() {
                    removed.push(path);
                }
            }
        }
        removed
    }
}

/// The `lineage` metadata of the solver state at `path`, read from its header only.
fn lineage_of(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).ok()?;
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    if len > 100 << 20 {
        return None;
    }
    let mut header = vec![0u8; len];
    file.read_exact(&mut header).ok()?;
    let header: serde_json::Value = serde_json::from_slice(&header).ok()?;
    header
        .get("__metadata__")?
        .get(LINEAGE_KEY)?
        .as_str()
        .map(str::to_owned)
}

/// How a resume may differ from the run that wrote the snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResumeRules {
    /// `--allow-batch-change`: accept another global batch.
    pub allow_batch_change: bool,
}

/// Loads snapshot `files` for `plan`: the weights into `params` (shaped by the net), the solver
/// state returned. `history_names` are the solver's buffers; `train_records` the size of the
/// training set. Every check failure is an [`Error::Snapshot`] naming the file.
pub fn load(
    files: &SnapshotFiles,
    plan: &Plan,
    params: &mut Params,
    history_names: &[&str],
    train_records: usize,
    rules: ResumeRules,
) -> Result<SolverState> {
    let path = &files.state;
    let bytes = read_regular(path, UNBOUNDED)
        .map_err(|e| Error::snapshot(path, format!("cannot read the solver state: {e}")))?;
    let st = snapshot::parse(path, &bytes)?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| Error::snapshot(path, format!("corrupt header: {e}")))?;
    let meta: BTreeMap<String, String> = header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let get = |k: &str| {
        meta.get(k).ok_or_else(|| {
            Error::snapshot(
                path,
                format!("not a p2ptrain solver state: metadata `{k}` is missing"),
            )
        })
    };
    let num = |k: &str| -> Result<u64> {
        get(k)?.parse().map_err(|_| {
            Error::snapshot(
                path,
                format!("metadata `{k}` = {:?} is not a number", meta[k]),
            )
        })
    };
    if get("format")? != FORMAT {
        return Err(Error::snapshot(
            path,
            format!("format {:?}, expected {FORMAT:?}", meta["format"]),
        ));
    }
    let iter = num("iter")?;
    let cfg = &plan.config;

    let theirs = format!("{:016x}", plan.state_fingerprint);
    if get("state_fingerprint")? != &theirs {
        let keys = differing_keys(get("config")?, cfg);
        return Err(Error::snapshot(
            path,
            format!(
                "written under another config (state fingerprint {} here {theirs}); differing: {}. \
                 Only these may change on resume: {RESUME_FREE_KEYS}",
                meta["state_fingerprint"],
                if keys.is_empty() {
                    "(could not tell which keys)".to_string()
                } else {
                    keys.join(", ")
                },
            ),
        ));
    }

    let (g, b, r, k) = (
        num("global_batch")?,
        num("batch_size")?,
        num("replicas")?,
        num("iter_size")?,
    );
    if g != plan.global_batch as u64 && !rules.allow_batch_change {
        return Err(Error::snapshot(
            path,
            format!(
                "global batch {g} (batch_size {b} × {r} replicas × iter_size {k}) in the snapshot, \
                 {} (batch_size {} × {} replicas × iter_size {}) in this run; resuming with another \
                 global batch changes the training: pass --allow-batch-change to do it anyway",
                plan.global_batch,
                cfg.data.batch_size,
                plan.total_replicas,
                cfg.solver.iter_size
            ),
        ));
    }
    let records = num("train_records")?;
    if records != train_records as u64 {
        return Err(Error::snapshot(
            path,
            format!(
                "trained on {records} records, this run's training set has {train_records}: \
                 the data order would differ"
            ),
        ));
    }
    let position = num("data_position")?;
    if position != iter * g {
        return Err(Error::snapshot(
            path,
            format!("data position {position} is not iter {iter} × global batch {g}"),
        ));
    }
    if iter >= cfg.solver.max_iter {
        return Err(Error::snapshot(
            path,
            format!(
                "taken after iteration {iter}, and solver.max_iter is {}: nothing left to train",
                cfg.solver.max_iter
            ),
        ));
    }
    let names = get("history")?;
    if names.split(',').ne(history_names.iter().copied()) {
        return Err(Error::snapshot(
            path,
            format!("solver history {names:?}, this solver keeps {history_names:?}"),
        ));
    }
    let loss_window: Vec<(u64, f64)> = serde_json::from_str(get("loss_window")?)
        .map_err(|e| Error::snapshot(path, format!("metadata `loss_window`: {e}")))?;

    let loss_scale = match meta.contains_key(LOSS_SCALE_KEY) {
        false => None,
        true => Some(LossScaleState {
            scale: get(LOSS_SCALE_KEY)?
                .parse::<f32>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| {
                    Error::snapshot(
                        path,
                        format!(
                            "metadata `{LOSS_SCALE_KEY}` = {:?} is not a positive number",
                            meta[LOSS_SCALE_KEY]
                        ),
                    )
                })?,
            good_steps: num(GOOD_STEPS_KEY)?,
            skipped: num(SKIPPED_KEY)?,
        }),
    };
    let apart_meta = match meta.get(SYNC_KEY).map(String::as_str) == Some(LOCAL_SGD) {
        false => None,
        true => Some((num("last_sync")?, get("outer")?.as_str())),
    };
    let mut buffers = Buffers {
        st: &st,
        params,
        problems: Vec::new(),
        read: Vec::new(),
    };
    let (history, apart) = match apart_meta {
        None => {
            let history = history_names.iter().map(|h| buffers.read(h)).collect();
            (history, None)
        }
        Some((last_sync, outer)) => {
            check_apart(path, plan, r, outer)?;
            let apart = ReplicasApart {
                last_sync,
                params: (0..r)
                    .map(|i| buffers.read(&format!("replica{i}/weights")))
                    .collect(),
                history: (0..r)
                    .map(|i| {
                        let h = history_names.iter();
                        h.map(|h| buffers.read(&format!("replica{i}/{h}")))
                            .collect()
                    })
                    .collect(),
                outer: (cfg.cluster.outer_optimizer.state_names().iter())
                    .map(|o| buffers.read(&format!("outer/{o}")))
                    .collect(),
            };
            (Vec::new(), Some(apart))
        }
    };
    if !buffers.problems.is_empty() {
        return Err(Error::snapshot(
            path,
            format!(
                "the solver history does not fit the net:\n  {}",
                buffers.problems.join("\n  ")
            ),
        ));
    }
    let read = std::mem::take(&mut buffers.read);
    snapshot::check_finite(path, read.iter().map(|(n, v)| (n, v.as_slice())))?;
    snapshot::load_weights(&files.weights, params)?;
    let weights_iter = snapshot::load_metadata(&files.weights)?
        .into_iter()
        .find(|(k, _)| k == "iter")
        .map(|(_, v)| v);
    if weights_iter.as_deref() != Some(iter.to_string().as_str()) {
        return Err(Error::snapshot(
            &files.weights,
            format!(
                "weights of iteration {}, solver state {} of iteration {iter}: not one snapshot",
                weights_iter.as_deref().unwrap_or("(none)"),
                path.display()
            ),
        ));
    }
    Ok(SolverState {
        iter,
        history,
        loss_window,
        data_position: position,
        lineage: meta.get(LINEAGE_KEY).cloned(),
        apart,
        loss_scale,
    })
}

/// The tensors of a solver state read so far, by name, and what did not fit.
struct Buffers<'a, 'b> {
    st: &'a SafeTensors<'b>,
    params: &'a Params,
    problems: Vec<String>,
    /// Every tensor read, for the finiteness check.
    read: Vec<(String, Vec<f32>)>,
}

impl Buffers<'_, '_> {
    /// The flat buffer `prefix` (tensors `<prefix>/<tensor>` in the layout of the parameters);
    /// a missing or misshapen tensor is noted in `problems` and left zero.
    fn read(&mut self, prefix: &str) -> Vec<f32> {
        let mut buf = vec![0.0f32; self.params.len()];
        for s in &self.params.spans {
            let name = format!("{prefix}/{}", s.full_name);
            match self.st.tensor(&name) {
                Ok(t) if t.dtype() == Dtype::F32 && t.shape() == s.shape.as_slice() => {
                    for (w, b) in buf[s.range()].iter_mut().zip(t.data().chunks_exact(4)) {
                        *w = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                    self.read.push((name, buf[s.range()].to_vec()));
                }
                Ok(t) => self.problems.push(format!(
                    "`{name}`: {} {:?}, expected F32 {:?}",
                    t.dtype(),
                    t.shape(),
                    s.shape
                )),
                Err(_) => self.problems.push(format!("`{name}` is missing")),
            }
        }
        buf
    }
}

/// Refuses a snapshot of `replicas` replicas trained apart (local SGD, outer buffers `outer`)
/// where this run cannot go on from each one's own state.
fn check_apart(path: &Path, plan: &Plan, replicas: u64, outer: &str) -> Result<()> {
    use crate::config::SyncMode;
    let cluster = &plan.config.cluster;
    if cluster.sync != SyncMode::LocalSgd {
        return Err(Error::snapshot(
            path,
            format!(
                "written by {replicas} replicas training apart (cluster.sync = \"local_sgd\"), \
                 each with its own parameters and solver history: resume it with \
                 cluster.sync = \"local_sgd\""
            ),
        ));
    }
    if replicas != plan.total_replicas as u64 {
        return Err(Error::snapshot(
            path,
            format!(
                "written by {replicas} replicas training apart (local SGD), this run has {}: \
                 each replica goes on from its own state, so resume it with {replicas} replicas",
                plan.total_replicas
            ),
        ));
    }
    let ours = cluster.outer_optimizer.state_names().join(",");
    if outer != ours {
        return Err(Error::snapshot(
            path,
            format!(
                "local SGD's outer rule kept [{outer}] in the snapshot, this run's \
                 (cluster.outer_optimizer = \"{}\") keeps [{ours}]: resume with the same outer \
                 optimizer",
                match cluster.outer_optimizer {
                    crate::config::OuterOptimizer::Average => "average",
                    crate::config::OuterOptimizer::Nesterov => "nesterov",
                }
            ),
        ));
    }
    Ok(())
}

/// The dotted keys whose values differ between the snapshot's config (JSON) and `cfg`, free keys
/// excluded.
fn differing_keys(snapshot_json: &str, cfg: &Config) -> Vec<String> {
    let Ok(theirs) = serde_json::from_str::<serde_json::Value>(snapshot_json) else {
        return Vec::new();
    };
    let ours = canonical(&cfg_for_state(cfg));
    let mut out = Vec::new();
    diff("", &theirs, &ours, &mut out);
    // A key of the free list is not a difference that refused the resume.
    out.retain(|k| {
        let short = k.split(" (").next().unwrap_or(k);
        !RESUME_FREE_KEYS
            .split(", ")
            .any(|f| f == short || f.trim_matches(['[', ']']) == short)
    });
    out
}

fn diff(at: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let sub = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => diff(&sub, p, q, out),
                    _ => out.push(sub),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(&format!("{at}[{i}]"), p, q, out);
            }
        }
        (Value::Number(x), Value::Number(y)) if same_number(x, y) => {}
        _ if a != b => out.push(format!("{at} (snapshot {a}, here {b})")),
        _ => {}
    }
}

/// Two config numbers that are one value: equal integers, or floats that differ only by the
/// rounding of their text form (a float written to JSON and parsed back may come out one or two
/// units in the last place away).
fn same_number(x: &serde_json::Number, y: &serde_json::Number) -> bool {
    if x == y {
        return true;
    }
    if x.is_f64() || y.is_f64() {
        let (a, b) = (
            x.as_f64().unwrap_or(f64::NAN),
            y.as_f64().unwrap_or(f64::NAN),
        );
        return (a - b).abs() <= 4.0 * f64::EPSILON * a.abs().max(b.abs());
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, name: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), b"x").unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn latest_considers_complete_snapshots_only() {
        let root = tempfile::tempdir().unwrap();
        let snap = root.path().join("s");
        assert!(latest(root.path(), "s/m")
            .unwrap_err()
            .to_string()
            .contains("no snapshot to resume"));
        for n in [10, 20, 30] {
            touch(&snap, &format!("m_iter_{n}.safetensors"));
            touch(&snap, &format!("m_iter_{n}.solverstate"));
        }
        // Weights without a solver state (a write cut short), another prefix, a temporary.
        touch(&snap, "m_iter_40.safetensors");
        touch(&snap, "other_iter_5.solverstate");
        touch(&snap, ".m_iter_50.safetensors.tmp-1-0");
        assert_eq!(latest(root.path(), "s/m").unwrap().iter, 30);
    }

    #[test]
    fn a_lineage_prunes_only_its_own_snapshots() {
        let root = tempfile::tempdir().unwrap();
        let snap = root.path().join("s");
        // Another run's snapshots under the same prefix.
        for n in [50, 100] {
            touch(&snap, &format!("m_iter_{n}.safetensors"));
            touch(&snap, &format!("m_iter_{n}.solverstate"));
        }
        let mut lineage = Lineage::fresh("host");
        for n in [10, 20, 30] {
            touch(&snap, &format!("m_iter_{n}.safetensors"));
            touch(&snap, &format!("m_iter_{n}.solverstate"));
            lineage.add_and_prune(SnapshotFiles::new(root.path(), "s/m", n), 2);
        }
        assert_eq!(
            names(&snap),
            [
                "m_iter_100.safetensors",
                "m_iter_100.solverstate",
                "m_iter_20.safetensors",
                "m_iter_20.solverstate",
                "m_iter_30.safetensors",
                "m_iter_30.solverstate",
                "m_iter_50.safetensors",
                "m_iter_50.solverstate",
            ]
        );
        let iters: Vec<u64> = lineage.snapshots.iter().map(|f| f.iter).collect();
        assert_eq!(iters, [20, 30]);
    }

    #[test]
    fn a_config_round_tripped_through_its_stored_json_differs_in_no_key() {
        let text = "[data]\nformat = \"digits\"\nbatch_size = 8\nscale = 0.00390625\n\
                    [solver]\ntype = \"adam\"\nbase_lr = 0.001\nmomentum = 0.9\nmax_iter = 10\n\
                    [[layer]]\nname = \"ip\"\ntype = \"inner_product\"\nbottom = [\"data\"]\n\
                    top = [\"ip\"]\nnum_output = 10\n\
                    [[layer]]\nname = \"loss\"\ntype = \"softmax_with_loss\"\n\
                    bottom = [\"ip\", \"label\"]\ntop = [\"loss\"]\n";
        let (cfg, _) = crate::validate::load_str("t.toml", text, Path::new("."), &[]).unwrap();
        let stored = canonical(&cfg_for_state(&cfg)).to_string();
        assert_eq!(differing_keys(&stored, &cfg), Vec::<String>::new());
    }

    #[test]
    fn either_file_names_the_pair() {
        let a = SnapshotFiles::of(Path::new("d/m_iter_7.solverstate"));
        let b = SnapshotFiles::of(Path::new("d/m_iter_7.safetensors"));
        assert_eq!(a, b);
        assert_eq!(a.iter, 7);
        assert_eq!(a.state, Path::new("d/m_iter_7.solverstate"));
    }

    #[test]
    fn loss_slots_follow_the_new_window() {
        let s = SolverState {
            iter: 10,
            history: vec![],
            loss_window: vec![(6, 1.0), (7, 2.0), (8, 3.0), (9, 4.0)],
            data_position: 0,
            lineage: None,
            apart: None,
            loss_scale: None,
        };
        // Same window, iter_size 2: slot j % 4 holds 2 × the mean of iteration j.
        assert_eq!(s.loss_slots(4, 2), [6.0, 8.0, 2.0, 4.0]);
        // A shorter window keeps the newest iterations.
        assert_eq!(s.loss_slots(2, 1), [3.0, 4.0]);
    }
}
