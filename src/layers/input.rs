//! `Input`: Caffe's Input layer of deploy nets, `shape = [N, C, H, W]`, declaring the net's
//! input blob. p2ptrain's inputs come from `[data]`: the net wires an Input layer to the input
//! blobs `data` (and `label`, with a second top) as its bottoms, and the layer hands them on
//! under its tops' names. `(C, H, W)` must be the records' shape (an error naming `shape`
//! otherwise); `N`, Caffe's batch, is not checked: the batch is `[data]`'s (`batch_size`,
//! `test_batch_size`, or `predict`'s).
//!
//! Shapes: bottoms `data (N, C, H, W)` [, `label (N)`]; tops the same. Forward copies; no
//! gradient flows into the inputs.

use crate::config::layer_params::InputParams;
use crate::error::{Error, Result};
use crate::layers::{BackwardPass, CpuLayer, ForwardPass, Layer};

cpu_layer! {
    /// The input layer; see the module docs.
    pub type Input = CpuLayer<InputParams, ()>;
}

/// The input blobs an Input layer with `tops` tops reads, by name: `data`, then `label`.
pub const INPUT_BLOBS: [&str; 2] = ["data", "label"];

impl Layer for Input {
    fn type_name(&self) -> &'static str {
        "input"
    }

    /// `data (N, C, H, W)` with the `(C, H, W)` of `shape`, and optionally `label`.
    fn reshape(&mut self, bottoms: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let [n, c, h, w] = self.settings.shape;
        let Some(data) = bottoms.first().filter(|_| bottoms.len() <= 2) else {
            return Err(Error::net(
                &self.name,
                format!(
                    "reads the inputs `data` [and `label`], got {} bottoms",
                    bottoms.len()
                ),
            ));
        };
        if data.len() != 4 || data[1..] != [c, h, w] {
            return Err(Error::net(
                &self.name,
                format!(
                    "`shape` [{n}, {c}, {h}, {w}] declares records (C, H, W) = ({c}, {h}, {w}), \
                     but the data are {:?} per record",
                    &data[1.min(data.len())..]
                ),
            ));
        }
        Ok(bottoms.iter().map(|b| b.to_vec()).collect())
    }

    fn forward(&mut self, pass: ForwardPass<'_>) {
        for (top, bottom) in pass.tops.iter_mut().zip(pass.bottoms) {
            top.data.copy_from_slice(&bottom.data);
        }
    }

    /// The inputs take no gradient (the net never asks for one).
    fn backward(&mut self, _pass: BackwardPass<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::gradient_check::uniform_blob;
    use crate::layers::test_util::{blob, forward, layer, params_error};

    fn input(keys: &str) -> Input {
        layer::<InputParams>("input", keys)
    }

    #[test]
    fn hands_the_inputs_on() {
        let x = uniform_blob(&[2, 3, 4, 5], -1.0, 1.0, 51);
        let labels = blob(&[2], &[3.0, 1.0]);
        let mut l = input("shape = [10, 3, 4, 5]");
        let tops = forward(&mut l, &[x.clone(), labels.clone()], &[]);
        assert_eq!((&tops[0].shape, &tops[0].data), (&x.shape, &x.data));
        assert_eq!(tops[1].data, labels.data);
        let tops = forward(&mut l, std::slice::from_ref(&x), &[]);
        assert_eq!(tops.len(), 1);
    }

    #[test]
    fn records_of_another_shape_are_refused_naming_shape() {
        let mut l = input("shape = [1, 3, 4, 5]");
        let err = l.reshape(&[&[2, 3, 5, 4]]).unwrap_err().to_string();
        assert!(
            err.contains("`shape`") && err.contains("(3, 4, 5)"),
            "{err}"
        );
        assert!(params_error("input", "").contains("shape"));
        assert!(params_error("input", "shape = [1, 3, 4]").contains("4 dimensions"));
        assert!(params_error("input", "shape = [1, 0, 4, 4]").contains("shape"));
    }
}
