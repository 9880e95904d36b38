//! Local SGD (`[cluster] sync = "local_sgd"`): the schedule that says, step by step, which
//! replicas average their gradients and when the replicas average their parameters, and the
//! outer rule applied at an averaging, on host slices (the CPU engine's; the GPU engine runs the
//! same formulas with its kernels).
//!
//! Step `iter` (0-based; `done = iter + 1` steps after it):
//!
//! - `done ≤ sync_warmup`: a synchronous step, the gradient averaged over every replica (as
//!   `sync = "allreduce"`);
//! - otherwise a local step: the gradient averaged over the replica's node (`sync_scope =
//!   "node"`) or not at all (`"replica"`), the replica's own update rule applied to it; once
//!   `sync_period` steps have passed since the replicas last agreed, they average their
//!   parameters through the outer rule ([`Outer`]) and agree again.
//!
//! The replicas agree after a synchronous step and after an averaging ([`Schedule::in_sync`]);
//! those are the points where the loop also exchanges its small messages (signals), and where
//! [`super::verify`] compares every replica. In between, they differ on purpose.
//!
//! The outer rules, per element, with `θ_r` replica r's parameters, `a` the parameters of the
//! last averaging (the anchor) and `R` replicas:
//!
//! - average: `θ_r ← (1/R) Σ θ_r`;
//! - Nesterov (DiLoCo's outer step): `d = (1/R) Σ (a − θ_r)`, `v ← μ·v + d`,
//!   `a ← a − η·d − η·μ·v`, `θ_r ← a` (η `outer_lr`, μ `outer_momentum`; `a` and `v` are the
//!   outer state a snapshot carries); tensors that do not learn (`lr_mult = 0`, such as
//!   BatchNorm's running statistics) take the plain mean instead ([`outer_runs`]).
//!
//! With `sync_period = 1`, plain averaging and an update rule linear in the gradient (SGD, with
//! or without momentum), the mean of the replicas' steps is the step of the mean gradient:
//! local SGD trains synchronous SGD's weights up to rounding (tests/local_sgd.rs).

use crate::config::{ClusterConfig, OuterOptimizer, SyncMode, SyncScope};
use crate::params::ParamSpan;
use std::ops::Range;

/// Which replicas average the gradient of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GradientScope {
    /// Every replica of the job (synchronous SGD).
    #[default]
    All,
    /// The replicas of this replica's node.
    Node,
    /// None: the replica's own gradient.
    Own,
}

/// The outer rule of an averaging.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outer {
    /// The mean of the replicas' parameters.
    Average,
    /// Nesterov momentum on the mean delta from the anchor.
    Nesterov { lr: f32, momentum: f32 },
}

impl Outer {
    /// The rule `cluster` asks for.
    pub fn of(cluster: &ClusterConfig) -> Outer {
        match cluster.outer_optimizer {
            OuterOptimizer::Average => Outer::Average,
            OuterOptimizer::Nesterov => Outer::Nesterov {
                lr: cluster.outer_lr,
                momentum: cluster.outer_momentum,
            },
        }
    }
}

/// When the replicas average what: see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// `None` under `sync = "allreduce"`: every step is synchronous.
    local: Option<LocalSteps>,
    /// Steps done when the replicas last agreed (a synchronous step or an averaging).
    last_sync: u64,
}

/// The local-SGD part of a schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LocalSteps {
    period: u64,
    warmup: u64,
    scope: GradientScope,
}

/// What ends a step, after its update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterStep {
    /// The gradient was averaged over every replica: they agree.
    Synchronous,
    /// A local step; the replicas go on apart.
    Apart,
    /// A local step after which the replicas average their parameters (and agree again).
    Average,
}

impl Schedule {
    /// The schedule of `cluster`, the replicas having last agreed after `last_sync` steps (the
    /// start, or a resumed snapshot's).
    pub fn new(cluster: &ClusterConfig, last_sync: u64) -> Schedule {
        let local = (cluster.sync == SyncMode::LocalSgd).then(|| LocalSteps {
            period: cluster.sync_period.max(1),
            warmup: cluster.sync_warmup,
            scope: match cluster.sync_scope {
                SyncScope::Replica => GradientScope::Own,
                SyncScope::Node => GradientScope::Node,
            },
        });
        Schedule { local, last_sync }
    }

    /// Whether this is local SGD.
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// Which replicas average the gradient of step `iter`.
    pub fn scope(&self, iter: u64) -> GradientScope {
        match self.local {
            Some(l) if iter >= l.warmup => l.scope,
            _ => GradientScope::All,
        }
    }

    /// Ends step `iter` (its update applied): says what follows, and counts an averaging (which
    /// the caller then runs) or a synchronous step as the replicas' latest agreement.
    pub fn after_step(&mut self, iter: u64) -> AfterStep {
        let done = iter + 1;
        let Some(l) = self
            .local
            .filter(|_| self.scope(iter) != GradientScope::All)
        else {
            self.last_sync = done;
            return AfterStep::Synchronous;
        };
        if done.saturating_sub(self.last_sync) >= l.period {
            self.last_sync = done;
            AfterStep::Average
        } else {
            AfterStep::Apart
        }
    }

    /// Whether every replica holds the same parameters after `done` steps: they agreed then.
    pub fn in_sync(&self, done: u64) -> bool {
        self.local.is_none() || self.last_sync == done
    }

    /// Steps done when the replicas last agreed.
    pub fn last_sync(&self) -> u64 {
        self.last_sync
    }
}

/// The Nesterov outer step on host slices, each `(n)`: `delta` holds `(1/R) Σ (a − θ_r)`;
/// `momentum` (`v`) and `anchor` (`a`) are updated in place (see the module docs). The caller
/// then copies the anchor into the parameters.
pub fn nesterov_step(lr: f32, mu: f32, delta: &[f32], momentum: &mut [f32], anchor: &mut [f32]) {
    assert!(delta.len() == momentum.len() && delta.len() == anchor.len());
    let lr_mu = lr * mu;
    for ((d, v), a) in delta.iter().zip(momentum.iter_mut()).zip(anchor.iter_mut()) {
        *v = mu * *v + *d;
        *a += -lr * *d;
        *a += -lr_mu * *v;
    }
}

/// A stretch of the flat parameters and the Nesterov step's coefficients on it.
#[derive(Debug, Clone, PartialEq)]
pub struct OuterRun {
    pub range: Range<usize>,
    pub lr: f32,
    pub momentum: f32,
}

/// The Nesterov rule's coefficients over the `n` flat floats of `spans`, in as few contiguous
/// runs as there are changes: `(lr, momentum)` where a tensor learns, `(1, 0)` — the plain mean
/// — where it does not (`lr_mult = 0`: BatchNorm's running statistics, which an extrapolation
/// could leave negative, and frozen tensors). Each tensor's run reaches to the next tensor (the
/// alignment gap between them holds zeros, which every rule keeps at zero).
pub fn outer_runs(spans: &[ParamSpan], n: usize, lr: f32, momentum: f32) -> Vec<OuterRun> {
    let mut runs: Vec<OuterRun> = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        let start = if i == 0 { 0 } else { s.offset };
        let end = spans.get(i + 1).map_or(n, |next| next.offset);
        let (lr, momentum) = if s.lr_mult == 0.0 {
            (1.0, 0.0)
        } else {
            (lr, momentum)
        };
        match runs.last_mut() {
            Some(r) if r.lr == lr && r.momentum == momentum => r.range.end = end,
            _ => runs.push(OuterRun {
                range: start..end,
                lr,
                momentum,
            }),
        }
    }
    runs
}

/// `delta ← anchor − params`, elementwise over `(n)`: a replica's part of the Nesterov step.
pub fn delta_from_anchor(anchor: &[f32], params: &[f32], delta: &mut [f32]) {
    assert!(anchor.len() == params.len() && params.len() == delta.len());
    for ((d, a), p) in delta.iter_mut().zip(anchor).zip(params) {
        *d = *a - *p;
    }
}

/// The floats one replica hands to all-reduces, by what they carried: the payload, not the
/// bytes on the wire (a ring all-reduce of `n` floats over `R` replicas sends each replica's
/// `2(R − 1)/R · n`, see [`Traffic::ring_bytes`]). Gradients travel in `gradient_width` bytes an
/// element (`cluster.reduce_dtype`: 4 for FP32, 2 for bfloat16); parameters always in 4.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Gradients averaged over every replica.
    pub gradient_all: u64,
    /// Gradients averaged over a node's replicas.
    pub gradient_node: u64,
    /// Parameters (or deltas) averaged over every replica: averagings, and the mean parameters
    /// of tests and snapshots between averagings.
    pub parameters: u64,
    /// Bytes of one gradient element on the wire.
    pub gradient_width: u64,
}

impl Default for Traffic {
    /// Nothing yet, gradients in FP32.
    fn default() -> Self {
        Traffic::new(4)
    }
}

impl Traffic {
    /// Nothing yet, gradients in `gradient_width` bytes an element.
    pub fn new(gradient_width: usize) -> Self {
        Traffic {
            gradient_all: 0,
            gradient_node: 0,
            parameters: 0,
            gradient_width: gradient_width as u64,
        }
    }

    /// Counts the all-reduce of `floats` over the replicas `scope` names.
    pub fn gradient(&mut self, scope: GradientScope, floats: usize) {
        match scope {
            GradientScope::All => self.gradient_all += floats as u64,
            GradientScope::Node => self.gradient_node += floats as u64,
            GradientScope::Own => {}
        }
    }

    /// Bytes of gradients over every replica, gradients within nodes, and parameters.
    pub fn bytes(&self) -> [u64; 3] {
        let w = self.gradient_width;
        [
            w * self.gradient_all,
            w * self.gradient_node,
            4 * self.parameters,
        ]
    }

    /// Bytes each replica sends in ring all-reduces of this payload, with `replicas` in the job
    /// and `node_replicas` in its node: `2(R − 1)/R` per byte of each kind.
    pub fn ring_bytes(&self, replicas: usize, node_replicas: usize) -> f64 {
        let ring = |bytes: u64, r: usize| {
            let r = r.max(1) as f64;
            bytes as f64 * 2.0 * (r - 1.0) / r
        };
        let [all, node, params] = self.bytes();
        ring(all + params, replicas) + ring(node, node_replicas)
    }

    /// The payload in bytes.
    pub fn payload_bytes(&self) -> u64 {
        self.bytes().iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(period: u64, warmup: u64, scope: SyncScope) -> ClusterConfig {
        ClusterConfig {
            sync: SyncMode::LocalSgd,
            sync_period: period,
            sync_warmup: warmup,
            sync_scope: scope,
            ..Default::default()
        }
    }

    /// Runs `iters` steps from `first`, returning what each ended with.
    fn run(s: &mut Schedule, first: u64, iters: u64) -> Vec<AfterStep> {
        (first..first + iters).map(|i| s.after_step(i)).collect()
    }

    #[test]
    fn allreduce_is_synchronous_every_step() {
        let mut s = Schedule::new(&ClusterConfig::default(), 0);
        assert!(!s.is_local());
        assert_eq!(s.scope(5), GradientScope::All);
        assert!(run(&mut s, 0, 4)
            .iter()
            .all(|a| *a == AfterStep::Synchronous));
        assert!(s.in_sync(4) && s.in_sync(3), "never apart");
    }

    #[test]
    fn warmup_then_an_average_every_period() {
        use AfterStep::*;
        let mut s = Schedule::new(&cluster(3, 2, SyncScope::Replica), 0);
        assert_eq!(s.scope(1), GradientScope::All);
        assert_eq!(s.scope(2), GradientScope::Own);
        let seen = run(&mut s, 0, 8);
        assert_eq!(
            seen,
            [
                Synchronous,
                Synchronous,
                Apart,
                Apart,
                Average,
                Apart,
                Apart,
                Average
            ]
        );
        assert!(s.in_sync(8));
        assert_eq!(s.last_sync(), 8);
        s.after_step(8);
        assert!(!s.in_sync(9), "apart after a local step");
    }

    #[test]
    fn period_one_averages_after_every_local_step_and_node_scope_reduces_in_the_node() {
        let mut s = Schedule::new(&cluster(1, 0, SyncScope::Node), 0);
        assert_eq!(s.scope(0), GradientScope::Node);
        assert!(run(&mut s, 0, 3).iter().all(|a| *a == AfterStep::Average));
    }

    /// A resumed schedule counts its period from the snapshot's last agreement, whatever the
    /// period was then.
    #[test]
    fn a_resumed_schedule_goes_on_from_the_last_agreement() {
        let mut s = Schedule::new(&cluster(4, 0, SyncScope::Replica), 6);
        assert!(!s.in_sync(7));
        assert_eq!(s.after_step(7), AfterStep::Apart, "8 − 6 = 2 < 4");
        assert_eq!(s.after_step(8), AfterStep::Apart);
        assert_eq!(s.after_step(9), AfterStep::Average);
    }

    #[test]
    fn nesterov_step_follows_its_formula() {
        let (lr, mu) = (0.5f32, 0.9f32);
        let anchor0 = [1.0f32, -2.0, 0.25];
        let params = [0.5f32, -1.0, 0.25];
        let mut delta = [0.0; 3];
        delta_from_anchor(&anchor0, &params, &mut delta);
        assert_eq!(delta, [0.5, -1.0, 0.0]);
        let (mut v, mut a) = ([0.1f32, 0.0, -0.2], anchor0);
        nesterov_step(lr, mu, &delta, &mut v, &mut a);
        for i in 0..3 {
            let v1 = mu * [0.1f32, 0.0, -0.2][i] + delta[i];
            assert_eq!(v[i], v1);
            let want = anchor0[i] - lr * delta[i] - lr * mu * v1;
            assert!((a[i] - want).abs() <= 1e-6, "{i}: {} vs {want}", a[i]);
        }
    }

    /// With lr 1 and no momentum, the Nesterov rule lands on the mean (up to rounding).
    #[test]
    fn nesterov_with_unit_rate_and_no_momentum_is_the_average() {
        let anchor = [1.0f32, 3.0, -0.5];
        let replicas = [[0.5f32, 2.0, -0.25], [0.25f32, 3.5, 0.75]];
        let mut mean_delta = [0.0f32; 3];
        for r in &replicas {
            let mut d = [0.0; 3];
            delta_from_anchor(&anchor, r, &mut d);
            for (m, x) in mean_delta.iter_mut().zip(d) {
                *m += x / 2.0;
            }
        }
        let (mut v, mut a) = ([0.0f32; 3], anchor);
        nesterov_step(1.0, 0.0, &mean_delta, &mut v, &mut a);
        for i in 0..3 {
            let mean = (replicas[0][i] + replicas[1][i]) / 2.0;
            assert!((a[i] - mean).abs() < 1e-6, "{i}: {} vs {mean}", a[i]);
        }
    }

    #[test]
    fn outer_runs_average_what_does_not_learn_and_cover_every_float() {
        let span = |offset: usize, len: usize, lr_mult: f32| ParamSpan {
            layer: 0,
            full_name: String::new(),
            shape: vec![len],
            offset,
            len,
            lr_mult,
            decay_mult: 1.0,
            filler: crate::config::FillerConfig::constant(0.0),
        };
        // weight, bias (learning), two statistics (not), a weight again.
        let spans = [
            span(0, 10, 1.0),
            span(64, 3, 2.0),
            span(128, 3, 0.0),
            span(131, 3, 0.0),
            span(192, 5, 1.0),
        ];
        let runs = outer_runs(&spans, 197, 0.7, 0.9);
        let want = |range: Range<usize>, lr, momentum| OuterRun {
            range,
            lr,
            momentum,
        };
        assert_eq!(
            runs,
            [
                want(0..128, 0.7, 0.9),
                want(128..192, 1.0, 0.0),
                want(192..197, 0.7, 0.9)
            ]
        );
    }

    #[test]
    fn traffic_counts_payload_and_ring_bytes() {
        let mut t = Traffic::default();
        t.gradient(GradientScope::All, 100);
        t.gradient(GradientScope::Node, 10);
        t.gradient(GradientScope::Own, 1000);
        t.parameters += 50;
        assert_eq!(t.payload_bytes(), 4 * 160);
        // 4 replicas: 2·3/4 = 1.5 floats sent per float; nodes of 2: 1 per float.
        assert_eq!(t.ring_bytes(4, 2), 4.0 * (150.0 * 1.5 + 10.0));
        assert_eq!(t.ring_bytes(1, 1), 0.0);
        // On the bfloat16 wire the gradients take half the bytes, the parameters do not.
        let mut h = Traffic::new(2);
        (h.gradient_all, h.gradient_node, h.parameters) = (100, 10, 50);
        assert_eq!(h.bytes(), [200, 20, 200]);
        assert_eq!(h.payload_bytes(), 420);
        assert_eq!(h.ring_bytes(4, 2), 1.5 * 400.0 + 20.0);
    }
}
