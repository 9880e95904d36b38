//! `GpuView`: the device side of the view layers (flatten, reshape): the top holds the bottom's
//! elements under another shape, which the CPU layer's shape rule gives (the net shapes every
//! blob). On the device a view is the identity neuron: `y = x` (a copy) forward and
//! `dx (+)= dy` backward.

use super::neuron::{GpuNeuron, NeuronFn, NeuronGrad, Values, ValuesMut};
use crate::cuda::{gpu_error, Gpu};
use crate::error::Result;

/// A view layer; see the module docs.
pub type GpuView = GpuNeuron<Identity>;

/// The identity under the name of the view layer it serves.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    type_name: &'static str,
}

impl Identity {
    /// The identity of the view layer of config name `type_name`.
    pub(crate) fn named(type_name: &'static str) -> Self {
        Identity { type_name }
    }
}

impl NeuronFn for Identity {
    fn type_name(&self) -> &'static str {
        self.type_name
    }

    fn keeps_half(&self) -> bool {
        true
    }

    fn forward(&self, gpu: &Gpu, x: &Values<'_>, y: &mut ValuesMut<'_>, _n: usize) -> Result<()> {
        gpu.compute
            .memcpy_dtod(x, y)
            .map_err(|e| gpu_error("copy a blob", e))
    }

    fn backward(&self, gpu: &Gpu, mut g: NeuronGrad<'_>) -> Result<()> {
        gpu.kernels
            .scaled_copy(&gpu.compute, &g.dy, &mut g.dx, 1.0, g.n, g.accumulate)
    }
}
