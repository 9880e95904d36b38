//! `SharedScores`: local replicas publish partial sums (loss × samples, correct counts, sample
//! counts) into the process's shared memory; the process leader adds them up across ranks; every
//! replica gets the global sums, and universal rank 0 reports them. Sums of counts, not means of
//! means, so a test accuracy is exactly correct/total whatever the topology.

use super::engine::Engine;
use crate::error::Result;

/// Global sums of a fixed list of named scores.
#[derive(Debug, Clone)]
pub struct SharedScores {
    names: Vec<String>,
    values: Vec<f64>,
}

impl SharedScores {
    /// Scores named `names`, all zero.
    pub fn new(names: Vec<String>) -> Self {
        let values = vec![0.0; names.len()];
        SharedScores { names, values }
    }

    /// Adds `v` to the local partial sum of score `i`.
    pub fn add(&mut self, i: usize, v: f64) {
        self.values[i] += v;
    }

    /// Replaces the local partial sums by the global ones (a collective: every replica calls it).
    pub fn reduce(&mut self, engine: &mut dyn Engine) -> Result<()> {
        engine.sum_scores(&mut self.values)
    }

    /// Value of score `i`.
    pub fn get(&self, i: usize) -> f64 {
        self.values[i]
    }

    /// Names of the scores.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}
