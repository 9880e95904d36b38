//! `ReshapingLayer<S>`: the one body of the layers that only change the shape (Flatten,
//! Reshape). One bottom, one top holding the same elements in the same order under the shape the
//! [`ShapeRule`] `S` gives; forward copies the data and backward passes the gradient through
//! unchanged. The rules live in their own files (`flatten.rs`, `reshape.rs`), each a `ShapeRule`
//! and a type alias `ReshapingLayer<ThatRule>` under the layer's name.

use crate::error::Result;
use crate::layers::{one_bottom, BackwardPass, ForwardPass, Layer};

/// How a shape-only layer derives its top shape from its bottom's.
pub trait ShapeRule: Send {
    /// The config name of the layer type, e.g. `flatten`.
    const TYPE_NAME: &'static str;

    /// The top shape for `bottom` (same element count), or an error naming `layer`.
    fn top_shape(&self, layer: &str, bottom: &[usize]) -> Result<Vec<usize>>;
}

/// A layer that copies its bottom into a top of the shape `S` gives.
#[derive(Debug, Clone)]
pub struct ReshapingLayer<S> {
    name: String,
    rule: S,
}

impl<S: ShapeRule> ReshapingLayer<S> {
    /// A layer named `name` shaping its top by `rule`.
    pub fn with_rule(name: impl Into<String>, rule: S) -> Self {
        ReshapingLayer {
            name: name.into(),
            rule,
        }
    }
}

impl<S: ShapeRule> Layer for ReshapingLayer<S> {
    fn type_name(&self) -> &'static str {
        S::TYPE_NAME
    }

    /// One bottom; the top shape is the rule's.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let bottom = one_bottom(&self.name, bottoms)?;
        Ok(vec![self.rule.top_shape(&self.name, bottom)?])
    }

    /// Copies the data.
    fn forward(&mut self, pass: ForwardPass<'_>) {
        pass.tops[0].data.copy_from_slice(&pass.bottoms[0].data);
    }

    /// `bottom.diff += top.diff`.
    fn backward(&mut self, pass: BackwardPass<'_>) {
        if let Some((top, bottom)) = pass.top_and_bottom() {
            for (d, &g) in bottom.diff.iter_mut().zip(&top.diff) {
                *d += g;
            }
        }
    }
}
