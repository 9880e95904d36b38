//! The resolved plan of a run: a validated [`Config`] with its [`Source`], the topology it runs on
//! (world size × replicas per rank), the global batch (batch × replicas × iter_size, design
//! decision 1), and a stable 64-bit fingerprint of the config that every rank compares before
//! training. Its `Display` (and [`Plan::describe`], to which the caller adds lines such as the
//! parameter count and devices) is what `p2ptrain check` prints.

use super::name_of;
use super::{Config, DataFormat, LrPolicy, Source};
use crate::error::{Error, Result};
use std::fmt;

/// A config resolved against the process topology.
#[derive(Debug, Clone)]
pub struct Plan {
    pub config: Config,
    pub source: Source,
    /// MPI ranks (processes).
    pub world_size: usize,
    /// Replicas (threads, later GPUs) per rank.
    pub replicas_per_rank: usize,
    /// `world_size × replicas_per_rank`.
    pub total_replicas: usize,
    /// `batch_size × total_replicas × iter_size`: the records one iteration consumes.
    pub global_batch: usize,
    /// `fingerprint` of `config`.
    pub fingerprint: u64,
    /// [`state_fingerprint`] of `config`: what a snapshot must match to resume under this plan.
    pub state_fingerprint: u64,
}

/// FNV-1a, 64 bits: stable across processes, builds and machines (unlike std's hasher).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ b as u64).wrapping_mul(PRIME))
}

/// The summary's precision line: mixed precision's half type and loss scaling, `None` for a run
/// in FP32 (or TF32, named on the GPU line) without loss scaling.
fn precision_row(c: &super::ClusterConfig) -> Option<String> {
    use super::{LossScale, MathMode};
    let scale = match (c.loss_scale, c.math) {
        (Some(LossScale::Fixed(s)), _) => format!("loss scale {s}"),
        (Some(LossScale::Dynamic), _) | (None, MathMode::Fp16) => format!(
            "loss scale dynamic from {} (×{} on overflow, ×2 after {} good steps)",
            c.loss_scale_init, c.loss_scale_backoff, c.loss_scale_growth_interval
        ),
        (None, _) => "no loss scaling".to_string(),
    };
    match (c.math.is_half(), c.loss_scale) {
        (false, None) => None,
        (false, Some(_)) => Some(scale),
        (true, _) => Some(format!(
            "{} activations and gradients, FP32 master weights, {scale}",
            name_of(&c.math)
        )),
    }
}

/// The fingerprint of a config: FNV-1a of its canonical serialisation (serde_json, keys in
/// declaration order, data paths as resolved). Equal configs give equal fingerprints on every rank.
pub fn fingerprint(config: &Config) -> u64 {
    let canonical =
        serde_json::to_vec(config).unwrap_or_else(|_| format!("{config:?}").into_bytes());
    fnv1a64(&canonical)
}

/// The keys a resumed run may change: they touch neither the net, nor the solver's state, nor the
/// data stream the snapshot continues. Everything else must match the snapshot's config.
///
/// `[cluster]` (topology, backend, threads, reduce schedule, math, verify_interval),
/// `data.batch_size` and `solver.iter_size` (the global batch is checked on its own),
/// `data.test_batch_size`, `data.prefetch`, `data.test_images` / `data.test_labels`, and
/// `solver.max_iter`, `display`, `average_loss`, `test_interval`, `test_iter`,
/// `test_initialization`, `snapshot`, `snapshot_prefix`, `snapshot_keep`, `sigint_effect`,
/// `sighup_effect`, `non_finite`.
pub const RESUME_FREE_KEYS: &str = "[cluster], data.batch_size, data.test_batch_size, \
    data.prefetch, data.test_images, data.test_labels, solver.iter_size, solver.max_iter, \
    solver.display, solver.average_loss, solver.test_interval, solver.test_iter, \
    solver.test_initialization, solver.snapshot, solver.snapshot_prefix, solver.snapshot_keep, \
    solver.sigint_effect, solver.sighup_effect, solver.non_finite";

/// The fingerprint of what a snapshot's state depends on: `fingerprint` of `config` with the
/// [`RESUME_FREE_KEYS`] set to fixed values. A snapshot resumes under a config only when the two
/// state fingerprints are equal.
pub fn state_fingerprint(config: &Config) -> u64 {
    let mut c = config.clone();
    c.cluster = Default::default();
    let (d, s) = (&mut c.data, &mut c.solver);
    d.batch_size = 1;
    d.test_batch_size = None;
    d.prefetch = 1;
    d.test_images = None;
    d.test_labels = None;
    s.iter_size = 1;
    s.max_iter = 1;
    s.display = 0;
    s.average_loss = 1;
    s.test_interval = 0;
    s.test_iter = None;
    s.test_initialization = false;
    s.snapshot = 0;
    s.snapshot_prefix = String::new();
    s.snapshot_keep = 0;
    s.sigint_effect = super::SignalEffect::SnapshotStop;
    s.sighup_effect = super::SignalEffect::Snapshot;
    s.non_finite = Default::default();
    fingerprint(&c)
}

/// The fingerprint the ranks compare at start-up: [`fingerprint`] with every data path cut to its
/// file name, so that ranks reading node-local copies from other directories agree; the records
/// themselves are compared by `crate::data::fingerprint`.
pub fn rank_fingerprint(config: &Config) -> u64 {
    let mut c = config.clone();
    let d = &mut c.data;
    let file_name = |p: &mut std::path::PathBuf| {
        if let Some(name) = p.file_name() {
            *p = name.into();
        }
    };
    for p in [
        &mut d.train_images,
        &mut d.train_labels,
        &mut d.test_images,
        &mut d.test_labels,
        &mut d.mean_file,
        &mut d.train_source,
        &mut d.test_source,
        &mut d.root_folder,
    ]
    .into_iter()
    .flatten()
    {
        file_name(p);
    }
    for list in [&mut d.train_files, &mut d.test_files]
        .into_iter()
        .flatten()
    {
        list.iter_mut().for_each(file_name);
    }
    fingerprint(&c)
}

/// The `sync` line of the plan: synchronous, or local SGD's period, warm-up, scope and rule.
fn sync_row(c: &super::ClusterConfig) -> String {
    use super::{OuterOptimizer, SyncMode, SyncScope};
    if c.sync == SyncMode::Allreduce {
        return match c.reduce_dtype {
            super::ReduceDtype::Fp32 => "allreduce (gradients averaged every step)".into(),
            super::ReduceDtype::Bf16 => match c.reduce_transport {
                super::ReduceTransport::Nccl => {
                    "allreduce (gradients averaged every step, in bf16 on the wire)".into()
                }
                super::ReduceTransport::CopyEngines => "allreduce (gradients averaged every \
                    step, in bf16 on the wire, moved by the GPUs' copy engines)"
                    .into(),
            },
        };
    }
    let scope = match (c.sync_scope, c.node_ranks) {
        (SyncScope::Replica, _) => "each replica steps alone".to_string(),
        (SyncScope::Node, 0) => "gradients all-reduced within each host".to_string(),
        (SyncScope::Node, n) => format!("gradients all-reduced within nodes of {n} ranks"),
    };
    let outer = match c.outer_optimizer {
        OuterOptimizer::Average => "plain averaging".to_string(),
        OuterOptimizer::Nesterov => format!(
            "Nesterov outer step (outer_lr {}, outer_momentum {})",
            c.outer_lr, c.outer_momentum
        ),
    };
    format!(
        "local_sgd: parameters averaged every {} steps after {} synchronous; {scope}; {outer}",
        c.sync_period, c.sync_warmup
    )
}

impl Plan {
    /// Resolves a validated `config` for `world_size` processes.
    pub fn new(config: Config, source: Source, world_size: usize) -> Result<Plan> {
        if world_size == 0 {
            return Err(Error::Usage("the world size must be at least 1".into()));
        }
        let replicas_per_rank = config.cluster.replicas_per_rank;
        let total_replicas = world_size.checked_mul(replicas_per_rank).ok_or_else(|| {
            source.error(
                "cluster.replicas_per_rank",
                format!("{world_size} processes × {replicas_per_rank} replicas overflows"),
            )
        })?;
        let batch = config.data.batch_size;
        let iter_size = config.solver.iter_size;
        let global_batch = usize::try_from(iter_size)
            .ok()
            .and_then(|k| batch.checked_mul(total_replicas)?.checked_mul(k))
            .ok_or_else(|| {
                source.error(
                    "data.batch_size",
                    format!(
                        "the global batch {batch} × {total_replicas} replicas × iter_size {iter_size} overflows"
                    ),
                )
            })?;
        let node_ranks = config.cluster.node_ranks;
        if node_ranks > 0 && !world_size.is_multiple_of(node_ranks) {
            return Err(source.error(
                "cluster.node_ranks",
                format!(
                    "{world_size} process(es) do not split into nodes of {node_ranks} ranks \
                     (0: the hosts as MPI finds them)"
                ),
            ));
        }
        let fingerprint = fingerprint(&config);
        let state_fingerprint = state_fingerprint(&config);
        Ok(Plan {
            config,
            source,
            world_size,
            replicas_per_rank,
            total_replicas,
            global_batch,
            fingerprint,
            state_fingerprint,
        })
    }

    /// The plan as aligned `name  value` lines, with `extra` lines (e.g. `("parameters", …)`)
    /// appended after the plan's own.
    pub fn describe(&self, extra: &[(&str, String)]) -> String {
        let mut rows = self.rows();
        rows.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let width = rows
            .iter()
            .map(|(k, _)| k.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = format!("plan of {}\n", self.source.path.display());
        for (k, v) in rows {
            out.push_str(&format!("  {k:<width$}  {v}\n"));
        }
        out.pop();
        out
    }

    fn rows(&self) -> Vec<(String, String)> {
        let c = &self.config;
        let (d, s) = (&c.data, &c.solver);
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
        row("world size", format!("{} process(es)", self.world_size));
        row("replicas per rank", self.replicas_per_rank.to_string());
        row("total replicas", self.total_replicas.to_string());
        let test = d.test_batch_size.unwrap_or(d.batch_size);
        row(
            "batch per replica",
            format!("{} (test {test})", d.batch_size),
        );
        row("iter_size", s.iter_size.to_string());
        row(
            "global batch",
            format!(
                "{} = {} × {} replicas × iter_size {}",
                self.global_batch, d.batch_size, self.total_replicas, s.iter_size
            ),
        );
        row("backend", name_of(&c.cluster.backend));
        row("sync", sync_row(&c.cluster));
        if let Some(text) = precision_row(&c.cluster) {
            row("precision", text);
        }
        if c.cluster.backend != super::BackendKind::Cpu {
            let cl = &c.cluster;
            let algorithms = if cl.conv_exact {
                "exact"
            } else {
                "any algorithm"
            };
            let layout = match (cl.gpu_layout, cl.math) {
                (super::GpuLayout::Auto, super::MathMode::Tf32) => {
                    "channels-last (if wide) or NCHW"
                }
                (super::GpuLayout::Auto, super::MathMode::Bf16 | super::MathMode::Fp16) => {
                    "channels-last (if wide or large) or NCHW"
                }
                (layout, math) if layout.channels_last(math, true, 0.0) => "channels-last",
                _ => "NCHW",
            };
            row(
                "on GPUs",
                format!(
                    "math {}, {layout} activations, convolutions {} ({algorithms}), reduce {} \
                     ({} MiB buckets)",
                    name_of(&cl.math),
                    name_of(&cl.conv_algorithm),
                    name_of(&cl.reduce),
                    cl.bucket_mb
                ),
            );
        }
        let order = if d.shuffle {
            "shuffled"
        } else {
            "not shuffled"
        };
        let mean = match (&d.mean_file, &d.mean_value) {
            (Some(f), _) => format!("mean image {}", f.display()),
            (None, Some(m)) => format!("{m:?}"),
            (None, None) => d.mean.to_string(),
        };
        let mut pixels = format!("(x - {mean}) × {}", d.scale);
        if d.crop_size > 0 {
            pixels = format!("crop {}, {pixels}", d.crop_size);
        }
        if d.mirror {
            pixels = format!("mirror, {pixels}");
        }
        match d.format {
            DataFormat::Idx => {
                row("data", format!("idx, {order}, {pixels}"));
                let show = |p: &Option<std::path::PathBuf>| {
                    p.as_ref()
                        .map_or("-".to_string(), |p| p.display().to_string())
                };
                row(
                    "  train",
                    format!("{} + {}", show(&d.train_images), show(&d.train_labels)),
                );
                row(
                    "  test",
                    format!("{} + {}", show(&d.test_images), show(&d.test_labels)),
                );
            }
            DataFormat::Synthetic => row(
                "data",
                format!(
                    "synthetic {:?}, {} classes, {} train / {} test records, {order}",
                    d.shape.as_deref().unwrap_or(&[]),
                    d.classes.unwrap_or(0),
                    d.train_size.unwrap_or(0),
                    d.test_size.unwrap_or(0)
                ),
            ),
            DataFormat::Cifar10 => {
                row("data", format!("cifar10, {order}, {pixels}"));
                let show = |p: &Option<Vec<std::path::PathBuf>>| {
                    p.iter()
                        .flatten()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                row("  train", show(&d.train_files));
                row("  test", show(&d.test_files));
            }
            DataFormat::Digits => row(
                "data",
                format!(
                    "digits (bundled, 1500 train / 297 test, 1×8×8, 10 classes), {order}, {pixels}"
                ),
            ),
            DataFormat::Lmdb | DataFormat::ImageList | DataFormat::ImageFolder => {
                if d.random_resized_crop > 0 {
                    pixels = format!("random_resized_crop {}, {pixels}", d.random_resized_crop);
                }
                if d.new_height > 0 {
                    pixels = format!("resize {}×{}, {pixels}", d.new_height, d.new_width);
                }
                let color = if d.is_color { "colour" } else { "grey" };
                row(
                    "data",
                    format!("{}, {color}, {order}, {pixels}", name_of(&d.format)),
                );
                let show = |p: &Option<std::path::PathBuf>| {
                    p.as_ref()
                        .map_or("-".to_string(), |p| p.display().to_string())
                };
                row("  train", show(&d.train_source));
                row("  test", show(&d.test_source));
            }
        }
        let mut solver = format!("{}, base_lr {}", name_of(&s.solver_type), s.base_lr);
        if s.momentum != 0.0 {
            solver.push_str(&format!(", momentum {}", s.momentum));
        }
        if s.weight_decay != 0.0 {
            solver.push_str(&format!(
                ", weight_decay {} ({})",
                s.weight_decay,
                name_of(&s.regularization_type)
            ));
        }
        if s.clip_gradients > 0.0 {
            solver.push_str(&format!(", clip_gradients {}", s.clip_gradients));
        }
        row("solver", solver);
        let policy = match s.lr_policy {
            LrPolicy::Fixed => String::new(),
            LrPolicy::Step => format!(": gamma {} every {} iterations", s.gamma, s.stepsize),
            LrPolicy::Multistep => format!(": gamma {} at {:?}", s.gamma, s.stepvalue),
            LrPolicy::Exp => format!(": gamma {}", s.gamma),
            LrPolicy::Inv => format!(": gamma {}, power {}", s.gamma, s.power),
            LrPolicy::Poly => format!(": power {}", s.power),
            LrPolicy::Sigmoid => format!(": gamma {}, stepsize {}", s.gamma, s.stepsize),
            LrPolicy::Cosine => format!(" to 0 at iteration {}", s.max_iter),
        };
        let policy = match s.warmup_iter {
            0 => policy,
            w => format!("{policy}, linear warmup over {w} iterations"),
        };
        row("lr policy", format!("{}{policy}", name_of(&s.lr_policy)));
        row("max_iter", s.max_iter.to_string());
        let layers: Vec<String> = c
            .layers
            .iter()
            .map(|l| {
                let mut t = name_of(&l.kind);
                if let Some(n) = l.num_output {
                    t.push_str(&format!(" {n}"));
                }
                if let Some(p) = l.phase {
                    t.push_str(&format!(", {} only", name_of(&p)));
                }
                format!("{} ({t})", l.name)
            })
            .collect();
        row("layers", layers.join(" → "));
        if !self.source.overrides.is_empty() {
            let sets: Vec<&str> = self
                .source
                .overrides
                .iter()
                .map(|(_, a)| a.as_str())
                .collect();
            row("overrides", format!("--set {}", sets.join(" --set ")));
        }
        row("fingerprint", format!("{:016x}", self.fingerprint));
        rows
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(&[]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_text::{digits_head, inner_product, softmax_loss};
    use crate::validate::load_str;
    use std::path::Path;
    use std::sync::LazyLock;

    /// One inner product and its loss on the digits, 4 replicas a rank, 2 micro-batches.
    static TEXT: LazyLock<String> = LazyLock::new(|| {
        let solver = "base_lr = 0.05\nmomentum = 0.9\nlr_policy = \"inv\"\ngamma = 1e-4\n\
                      power = 0.75\niter_size = 2\nmax_iter = 100\n";
        let head = digits_head("replicas_per_rank = 4\n", solver);
        format!(
            "{head}{}\n{}",
            inner_product("ip1", "data", 10, ""),
            softmax_loss("ip1")
        )
    });

    fn plan(sets: &[&str], world: usize) -> Result<Plan> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let (c, s) = load_str("p.toml", &TEXT, Path::new("."), &sets)?;
        Plan::new(c, s, world)
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn resolves_the_topology_and_global_batch() {
        let p = plan(&[], 3).unwrap();
        assert_eq!(p.world_size, 3);
        assert_eq!(p.replicas_per_rank, 4);
        assert_eq!(p.total_replicas, 12);
        assert_eq!(p.global_batch, 32 * 12 * 2);
        assert!(matches!(plan(&[], 0), Err(Error::Usage(_))));
        let e = plan(&["data.batch_size=4611686018427387904"], 4).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
    }

    /// Ranks reading node-local copies from other directories resolve the same config; another
    /// file name (or anything else) still differs.
    #[test]
    fn the_rank_fingerprint_compares_data_paths_by_file_name() {
        let with = |train: &str| {
            let mut c = plan(&[], 1).unwrap().config;
            c.data.train_files = Some(vec![train.into(), "/b/test.bin".into()]);
            c.data.mean_file = Some(train.replace("train.bin", "mean.binaryproto").into());
            c
        };
        let (a, b) = (with("/node0/data/train.bin"), with("/scratch/x/train.bin"));
        assert_ne!(
            fingerprint(&a),
            fingerprint(&b),
            "the full fingerprint keeps the paths"
        );
        assert_eq!(rank_fingerprint(&a), rank_fingerprint(&b));
        assert_ne!(
            rank_fingerprint(&a),
            rank_fingerprint(&with("/node0/data/train2.bin"))
        );
        let mut lr = a.clone();
        lr.solver.base_lr = 0.5;
        assert_ne!(rank_fingerprint(&a), rank_fingerprint(&lr));
    }

    #[test]
    fn the_fingerprint_is_stable_and_follows_the_config() {
        let a = plan(&[], 1).unwrap().fingerprint;
        assert_eq!(
            a,
            plan(&[], 2).unwrap().fingerprint,
            "topology is not part of it"
        );
        assert_eq!(a, fingerprint(&plan(&[], 1).unwrap().config));
        assert_ne!(a, plan(&["solver.base_lr=0.1"], 1).unwrap().fingerprint);
        // Formatting and comments do not count; values do.
        let spaced = TEXT.replace("base_lr = 0.05", "base_lr   =   0.05   # tuned");
        let (c, _) = load_str("p.toml", &spaced, Path::new("."), &[]).unwrap();
        assert_eq!(fingerprint(&c), a);
    }

    /// Ranks that would put gradients on the wire in different types are stopped before
    /// training (their fingerprints differ), while a resume may change the type (`[cluster]` is
    /// resume-free).
    #[test]
    fn the_reduce_dtype_is_in_the_rank_fingerprint_and_free_on_resume() {
        let fp32 = plan(&[], 1).unwrap();
        let bf16 = plan(&["cluster.reduce_dtype=\"bf16\""], 1).unwrap();
        assert_eq!(
            fp32.config.cluster.reduce_dtype,
            super::super::ReduceDtype::Fp32
        );
        assert_eq!(
            bf16.config.cluster.reduce_dtype,
            super::super::ReduceDtype::Bf16
        );
        assert_ne!(
            rank_fingerprint(&fp32.config),
            rank_fingerprint(&bf16.config)
        );
        assert_eq!(fp32.state_fingerprint, bf16.state_fingerprint);
        assert!(fp32
            .to_string()
            .contains("sync               allreduce (gradients averaged every step)\n"));
        assert!(bf16.to_string().contains("in bf16 on the wire"), "{bf16}");
    }

    #[test]
    fn describes_the_plan_with_extra_lines() {
        let p = plan(&["solver.base_lr=0.1"], 2).unwrap();
        let text = p.describe(&[("parameters", "650".to_string())]);
        for want in [
            "plan of p.toml",
            "world size         2 process(es)",
            "replicas per rank  4",
            "total replicas     8",
            "batch per replica  32 (test 32)",
            "iter_size          2",
            "global batch       512 = 32 × 8 replicas × iter_size 2",
            "backend            cpu",
            "data               digits",
            "solver             sgd, base_lr 0.1, momentum 0.9",
            "lr policy          inv: gamma 0.0001, power 0.75",
            "max_iter           100",
            "layers             ip1 (inner_product 10) → loss (softmax_with_loss)",
            "overrides          --set solver.base_lr=0.1",
            &format!("fingerprint        {:016x}", p.fingerprint),
            "parameters         650",
        ] {
            assert!(text.contains(want), "{text}\nlacks {want:?}");
        }
        assert!(text.ends_with("650"));
        assert_eq!(p.to_string(), p.describe(&[]));
        assert!(!text.contains("on GPUs"), "{text}");
    }

    /// A GPU (or auto) backend's plan says how the GPUs compute and reduce.
    #[test]
    fn describes_the_gpu_settings_of_a_gpu_backend() {
        let sets = [
            "cluster.backend=\"auto\"",
            "cluster.math=\"tf32\"",
            "cluster.conv_exact=false",
        ];
        let text = plan(&sets, 1).unwrap().to_string();
        let want = "on GPUs            math tf32, channels-last (if wide) or NCHW activations, \
                    convolutions measured (any algorithm), reduce bucketed (25 MiB buckets)";
        assert!(text.contains(want), "{text}\nlacks {want:?}");
        let nchw = plan(&[sets[0], sets[1], "cluster.gpu_layout=\"nchw\""], 1)
            .unwrap()
            .to_string();
        assert!(nchw.contains("math tf32, NCHW activations"), "{nchw}");
        let bf16 = plan(&[sets[0], "cluster.math=\"bf16\""], 1)
            .unwrap()
            .to_string();
        let want = "math bf16, channels-last (if wide or large) or NCHW activations";
        assert!(bf16.contains(want), "{bf16}\nlacks {want:?}");
    }
}
