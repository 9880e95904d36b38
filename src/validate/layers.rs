//! `[[layer]]`: each layer's parameters (resolved by [`crate::config::layer_params`], errors
//! placed at their keys), its bottoms and tops, the graph (bottoms produced earlier in the same
//! phase, no cycles, a train-phase loss), and the per-sample shapes and tensor sizes.

use super::*;
use crate::config::layer_params::{DeconvolutionParams, EltwiseParams, LayerParams, ParamError};
use crate::config::{LayerConfig, LayerKind, Phase};

impl Validator<'_> {
    pub(super) fn layers(&self, data: &DataFacts) -> Result<()> {
        let layers = &self.cfg.layers;
        if layers.is_empty() {
            return Err(self.err("layer", "the net needs at least one layer"));
        }
        // Per phase (0: train, 1: test), the blobs available so far: name → (producer, shape).
        let mut avail: [Blobs; 2] = Default::default();
        for a in &mut avail {
            a.insert("data".into(), (None, data.record.clone()));
            a.insert("label".into(), (None, Vec::new()));
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, l) in layers.iter().enumerate() {
            let key = |k: &str| format!("layer[{i}].{k}");
            if l.name.trim().is_empty() {
                return Err(self.err(&key("name"), "must not be empty"));
            }
            if let Some(j) = names.insert(&l.name, i) {
                return Err(self.err(
                    &key("name"),
                    format!("layer name `{}` is already used by layer[{j}]", l.name),
                ));
            }
            let params = self.layer_params(i, l)?;
            self.layer_arity(i, l)?;
            let phases: &[usize] = match l.phase {
                None => &[0, 1],
                Some(Phase::Train) => &[0],
                Some(Phase::Test) => &[1],
            };
            let mut bottoms = Vec::new();
            for (j, b) in l.bottom.iter().enumerate() {
                for &q in phases {
                    if !avail[q].contains_key(b) {
                        return Err(self.src.error_at(
                            &key("bottom"),
                            &format!("layer[{i}].bottom[{j}]"),
                            self.missing_bottom(i, b, q, &avail[1 - q]),
                        ));
                    }
                }
                bottoms.push(avail[phases[0]][b].1.clone());
            }
            if l.kind == LayerKind::Input {
                // Wired to the inputs themselves (see `crate::net`), not to the blobs named so.
                bottoms = [data.record.clone(), Vec::new()]
                    .into_iter()
                    .take(l.top.len())
                    .collect();
            }
            let top_shapes = self.layer_shapes(i, l, &params, &bottoms, data)?;
            for (j, t) in l.top.iter().enumerate() {
                if l.top[..j].contains(t) {
                    return Err(self.err(&key("top"), format!("top `{t}` is listed twice")));
                }
                for &q in phases {
                    if let Some((producer, _)) = avail[q].get(t) {
                        // An input layer reads the inputs: naming its top after one is in place.
                        let input = l.kind == LayerKind::Input
                            && crate::layers::input::INPUT_BLOBS.contains(&t.as_str());
                        if !l.bottom.contains(t) && !input {
                            let by = match producer {
                                Some(p) => format!("layer `{}`", layers[*p].name),
                                None => "the data source".into(),
                            };
                            return Err(self.src.error_at(
                                &key("top"),
                                &format!("layer[{i}].top[{j}]"),
                                format!("top `{t}` is already produced by {by}; a layer may reuse a blob name only in place (as one of its bottoms)"),
                            ));
                        }
                    }
                }
            }
            for &q in phases {
                for (t, shape) in l.top.iter().zip(&top_shapes) {
                    avail[q].insert(t.clone(), (Some(i), shape.clone()));
                }
            }
        }
        // A deploy net (one with an input layer) may lack a loss: it predicts, and training
        // it is refused where training starts (`train_loss`).
        if !layers.iter().any(|l| l.kind == LayerKind::Input) {
            train_loss(self.cfg, self.src)?;
        }
        Ok(())
    }

    /// Why bottom `b` of layer `i` is missing in phase `q`.
    fn missing_bottom(&self, i: usize, b: &str, q: usize, other_phase: &Blobs) -> String {
        let layers = &self.cfg.layers;
        let phase = ["train", "test"][q];
        if let Some((Some(p), _)) = other_phase.get(b) {
            let other = ["train", "test"][1 - q];
            return format!(
                "bottom `{b}` is produced only in the {other} phase (by layer `{}`), but this layer also runs in the {phase} phase",
                layers[*p].name
            );
        }
        let later = (i..layers.len()).find(|&j| layers[j].top.iter().any(|t| t == b));
        match later {
            Some(j) if j == i => format!(
                "bottom `{b}` is produced by no earlier layer (only by this layer itself, a cycle)"
            ),
            Some(j) if self.depends_on(j, i) => format!(
                "bottom `{b}` is produced by no earlier layer: layer `{}` produces it from this layer's output, a cycle",
                layers[j].name
            ),
            Some(j) => format!(
                "bottom `{b}` is produced by no earlier layer: only the later layer `{}` produces it; layers run in file order, so move that layer above this one",
                layers[j].name
            ),
            None => format!("bottom `{b}` is produced by no earlier layer"),
        }
    }

    /// Whether layer `j` consumes, directly or through other layers, a top of layer `i`.
    fn depends_on(&self, j: usize, i: usize) -> bool {
        let layers = &self.cfg.layers;
        let mut seen = vec![false; layers.len()];
        let mut stack = vec![j];
        while let Some(k) = stack.pop() {
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            for b in &layers[k].bottom {
                for (p, l) in layers.iter().enumerate() {
                    if l.top.contains(b) && p != k {
                        if p == i {
                            return true;
                        }
                        stack.push(p);
                    }
                }
            }
        }
        false
    }

    /// The parameters of layer `i` resolved from its table (keys that do not apply to its type,
    /// ranges), then the ranges of the keys every layer type shares.
    fn layer_params(&self, i: usize, l: &LayerConfig) -> Result<LayerParams> {
        let key = |k: &str| format!("layer[{i}].{k}");
        let params = LayerParams::resolve(l).map_err(|e| self.param_error(i, e))?;
        let kind = name_of(&l.kind);
        let (learnable, tensors) = params.learnable_tensors(l.bottom.len());
        for (k, mults) in [("lr_mult", &l.lr_mult), ("decay_mult", &l.decay_mult)] {
            let Some(m) = mults else { continue };
            if learnable == 0 && !m.is_empty() {
                return Err(self.err(
                    &key(k),
                    format!("`{k}` does not apply to a layer of type {kind} (it has no learnable tensors)"),
                ));
            }
            if m.len() > learnable {
                return Err(self.err(
                    &key(k),
                    format!("has {} values but the layer has {tensors}", m.len()),
                ));
            }
            for (j, v) in m.iter().enumerate() {
                self.non_negative(&format!("layer[{i}].{k}[{j}]"), *v)?;
            }
        }
        if let Some(w) = l.loss_weight {
            self.finite(&key("loss_weight"), w)?;
        }
        if let LayerParams::Eltwise(EltwiseParams { coeff: Some(c), .. }) = &params {
            if c.len() != l.bottom.len() {
                return Err(self.err(
                    &key("coeff"),
                    format!(
                        "has {} values but the layer has {} bottoms (one coefficient each)",
                        c.len(),
                        l.bottom.len()
                    ),
                ));
            }
        }
        Ok(params)
    }

    /// The error of a key of layer `i`, at its position in the file.
    fn param_error(&self, i: usize, e: ParamError) -> Error {
        let key = format!("layer[{i}].{}", e.key);
        match e.index {
            Some(j) => self.src.error_at(&key, &format!("{key}[{j}]"), e.msg),
            None => self.err(&key, e.msg),
        }
    }

    fn layer_arity(&self, i: usize, l: &LayerConfig) -> Result<()> {
        let kind = name_of(&l.kind);
        let one = 1..=1;
        let (bottoms, tops, what) = match l.kind {
            LayerKind::InnerProduct
            | LayerKind::Relu
            | LayerKind::Sigmoid
            | LayerKind::Tanh
            | LayerKind::Convolution
            | LayerKind::Pooling
            | LayerKind::Flatten
            | LayerKind::Reshape
            | LayerKind::Softmax
            | LayerKind::Power
            | LayerKind::AbsVal => (1..=1, one, "1 bottom"),
            LayerKind::SoftmaxWithLoss | LayerKind::Accuracy => {
                (2..=2, one, "2 bottoms (scores, label)")
            }
            LayerKind::Scale => (1..=2, one, "1 bottom, or 2 (data, scale)"),
            LayerKind::Bias => (1..=2, one, "1 bottom, or 2 (data, bias)"),
            LayerKind::Eltwise => (2..=usize::MAX, one, "2 or more bottoms"),
            LayerKind::Concat => (1..=usize::MAX, one, "1 or more bottoms"),
            LayerKind::Dropout | LayerKind::BatchNorm => (1..=1, one, "1 bottom"),
            LayerKind::Input => (0..=0, 1..=2, "no bottom (it reads the inputs)"),
            LayerKind::Split | LayerKind::Slice => (1..=1, 1..=usize::MAX, "1 bottom"),
            LayerKind::Silence => (1..=usize::MAX, 0..=0, "1 or more bottoms"),
            LayerKind::Deconvolution => (1..=1, one, "1 bottom"),
            LayerKind::Elu | LayerKind::Prelu | LayerKind::ArgMax | LayerKind::Lrn => {
                (1..=1, one, "1 bottom")
            }
            LayerKind::EuclideanLoss => (2..=2, one, "2 bottoms (prediction, target)"),
        };
        if !bottoms.contains(&l.bottom.len()) {
            return Err(self.err(
                &format!("layer[{i}].bottom"),
                format!(
                    "a layer of type {kind} takes {what}, got {}",
                    l.bottom.len()
                ),
            ));
        }
        if !tops.contains(&l.top.len()) {
            let want = match (*tops.start(), *tops.end()) {
                (a, b) if a == b => format!("{a} top{}", if a == 1 { "" } else { "s" }),
                (a, usize::MAX) => format!("{a} or more tops"),
                (a, b) => format!("{a} to {b} tops"),
            };
            return Err(self.err(
                &format!("layer[{i}].top"),
                format!("a layer of type {kind} has {want}, got {}", l.top.len()),
            ));
        }
        for (k, names) in [("bottom", &l.bottom), ("top", &l.top)] {
            if let Some(j) = names.iter().position(|n| n.trim().is_empty()) {
                return Err(self.src.error_at(
                    &format!("layer[{i}].{k}"),
                    &format!("layer[{i}].{k}[{j}]"),
                    "blob names must not be empty",
                ));
            }
        }
        Ok(())
    }

    /// An error at `key` when a tensor `what` of `dims` would exceed the tensor limit.
    fn tensor_fits(&self, key: &str, what: String, dims: &[u64]) -> Result<()> {
        match product(dims).and_then(|e| e.checked_mul(4)) {
            Some(b) if b <= MAX_TENSOR_BYTES => Ok(()),
            Some(b) => Err(self.err(
                key,
                format!(
                    "{what} would need {} GiB of f32 (limit {} GiB)",
                    gib(b),
                    MAX_TENSOR_BYTES / GIB
                ),
            )),
            None => Err(self.err(key, format!("{what} overflows the size of a tensor"))),
        }
    }

    /// The per-sample shapes of layer `i`'s tops from its bottoms' shapes; checks the sizes.
    fn layer_shapes(
        &self,
        i: usize,
        l: &LayerConfig,
        params: &LayerParams,
        bottoms: &[Vec<u64>],
        data: &DataFacts,
    ) -> Result<Vec<Vec<u64>>> {
        match l.kind {
            LayerKind::Input | LayerKind::Split | LayerKind::Silence | LayerKind::Slice => {
                self.shape_by_layer(i, l, params, bottoms, data)
            }
            _ => Ok(vec![self.layer_shape(i, l, params, bottoms, data)?]),
        }
    }

    /// The per-sample shape of the one top of layer `i` from its bottoms' shapes; checks the
    /// sizes.
    fn layer_shape(
        &self,
        i: usize,
        l: &LayerConfig,
        params: &LayerParams,
        bottoms: &[Vec<u64>],
        data: &DataFacts,
    ) -> Result<Vec<u64>> {
        let key = |k: &str| format!("layer[{i}].{k}");
        let axis = match params {
            LayerParams::InnerProduct(p) => p.axis,
            LayerParams::SoftmaxWithLoss(p) => p.axis,
            LayerParams::Accuracy(p) => p.axis,
            _ => 1,
        };
        let split = |shape: &[u64]| -> Result<(Vec<u64>, u64)> {
            if axis > shape.len() {
                return Err(self.err(
                    &key(if l.axis.is_some() { "axis" } else { "bottom" }),
                    format!(
                        "axis {axis} is out of range for bottom `{}` of shape {}",
                        l.bottom[0],
                        shape_str(shape)
                    ),
                ));
            }
            Ok((
                shape[..axis - 1].to_vec(),
                product(&shape[axis - 1..]).unwrap_or(u64::MAX),
            ))
        };
        match params {
            LayerParams::InnerProduct(p) => {
                let n = p.num_output as u64;
                let (mut outer, fan_in) = split(&bottoms[0])?;
                let too_big =
                    |what: String, dims: &[u64]| self.tensor_fits(&key("num_output"), what, dims);
                too_big(format!("the weights ({n} × {fan_in})"), &[n, fan_in])?;
                outer.push(n);
                let batch: Vec<u64> = std::iter::once(data.max_batch)
                    .chain(outer.iter().copied())
                    .collect();
                too_big(
                    format!(
                        "the top `{}` {}, batch {}",
                        l.top[0],
                        shape_str(&outer),
                        data.max_batch
                    ),
                    &batch,
                )?;
                Ok(outer)
            }
            LayerParams::Relu(_) | LayerParams::Sigmoid(_) | LayerParams::Tanh(_) => {
                Ok(bottoms[0].clone())
            }
            LayerParams::SoftmaxWithLoss(_) | LayerParams::Accuracy(_) => {
                let (_, _) = split(&bottoms[0])?;
                let scores = bottoms[0][axis - 1];
                if l.bottom[1] == "label"
                    && bottoms[0].len() == 1
                    && (scores as usize) < data.classes
                {
                    return Err(self.err(
                        &key("bottom"),
                        format!(
                            "bottom `{}` has {scores} scores per sample but the data has {} classes",
                            l.bottom[0], data.classes
                        ),
                    ));
                }
                if let (Some(k), LayerParams::Accuracy(p)) = (l.top_k, params) {
                    if p.top_k as u64 > scores {
                        return Err(self.err(
                            &key("top_k"),
                            format!("top_k {k} exceeds the {scores} scores per sample"),
                        ));
                    }
                }
                Ok(Vec::new())
            }
            LayerParams::Dropout(_) => Ok(bottoms[0].clone()),
            LayerParams::BatchNorm(_) => {
                if bottoms[0].is_empty() {
                    return Err(self.err(
                        &key("bottom"),
                        format!(
                            "batch_norm needs a bottom with channels (N, C, ...); `{}` is a scalar per sample",
                            l.bottom[0]
                        ),
                    ));
                }
                Ok(bottoms[0].clone())
            }
            _ => Ok(self.shape_by_layer(i, l, params, bottoms, data)?.remove(0)),
        }
    }

    /// The per-sample top shapes of a layer computed by the layer's own `reshape` on
    /// `[batch] + bottom`, its refusal reported at the key that most likely causes it; checks
    /// the tops' and (for a convolution or deconvolution) the weights' and column buffer's
    /// sizes.
    fn shape_by_layer(
        &self,
        i: usize,
        l: &LayerConfig,
        params: &LayerParams,
        bottoms: &[Vec<u64>],
        data: &DataFacts,
    ) -> Result<Vec<Vec<u64>>> {
        let key = |k: &str| format!("layer[{i}].{k}");
        // The key blamed for a shape the layer refuses: the first of these that is set.
        let suspects: &[(&str, bool)] = match l.kind {
            LayerKind::Convolution | LayerKind::Deconvolution => &[
                ("group", l.group.is_some()),
                ("kernel_size", l.kernel_size.is_some()),
            ],
            LayerKind::Pooling => &[
                ("kernel_size", l.kernel_size.is_some()),
                ("global_pooling", l.global_pooling.is_some()),
            ],
            LayerKind::Scale | LayerKind::Bias => &[
                ("num_axes", l.num_axes.is_some()),
                ("axis", l.axis.is_some()),
            ],
            LayerKind::Flatten => &[
                ("end_axis", l.end_axis.is_some()),
                ("axis", l.axis.is_some()),
            ],
            LayerKind::Reshape => &[("shape", true)],
            LayerKind::Concat | LayerKind::Softmax => &[("axis", l.axis.is_some())],
            LayerKind::Input => &[("shape", true)],
            LayerKind::Slice => &[
                ("slice_point", l.slice_point.is_some()),
                ("axis", l.axis.is_some()),
            ],
            LayerKind::ArgMax => &[("top_k", l.top_k.is_some()), ("axis", l.axis.is_some())],
            _ => &[],
        };
        let blamed = suspects
            .iter()
            .find_map(|(k, set)| set.then_some(*k))
            .unwrap_or("bottom");
        let fail = |e: Error| match e {
            Error::Net { msg, .. } => self.err(&key(blamed), msg),
            other => other,
        };
        let rank4 = matches!(
            l.kind,
            LayerKind::Convolution | LayerKind::Pooling | LayerKind::Deconvolution
        );
        if rank4 && bottoms[0].len() != 3 {
            return Err(self.err(
                &key("bottom"),
                format!(
                    "bottom `{}` of shape {} is not an image (N, C, H, W)",
                    l.bottom[0],
                    shape_str(&bottoms[0])
                ),
            ));
        }
        let batch = data.max_batch;
        let full: Vec<Vec<usize>> = bottoms
            .iter()
            .map(|b| {
                std::iter::once(batch)
                    .chain(b.iter().copied())
                    .map(|d| d as usize)
                    .collect()
            })
            .collect();
        let views: Vec<&[usize]> = full.iter().map(|b| b.as_slice()).collect();
        if let LayerParams::Convolution(p) | LayerParams::Deconvolution(DeconvolutionParams(p)) =
            params
        {
            let c = bottoms[0][0];
            let g = p.group as u64;
            if !c.is_multiple_of(g) {
                return Err(self.err(
                    &key("group"),
                    format!(
                        "group {g} does not divide the {c} channels of bottom `{}`",
                        l.bottom[0]
                    ),
                ));
            }
        }
        let mut layer = crate::layers::build(&l.name, params);
        let tops = layer.reshape(&views).map_err(fail)?;
        let samples: Vec<Vec<u64>> = tops
            .iter()
            .map(|top| top.iter().skip(1).map(|&d| d as u64).collect())
            .collect();
        let conv = matches!(l.kind, LayerKind::Convolution | LayerKind::Deconvolution);
        let size_key = if conv { "num_output" } else { "top" };
        let too_big = |k: &str, what: String, dims: &[u64]| self.tensor_fits(&key(k), what, dims);
        for (name, sample) in l.top.iter().zip(&samples) {
            let with_batch: Vec<u64> = std::iter::once(batch)
                .chain(sample.iter().copied())
                .collect();
            too_big(
                size_key,
                format!("the top `{name}` {}, batch {batch}", shape_str(sample)),
                &with_batch,
            )?;
        }
        if conv {
            for spec in layer.param_specs() {
                let dims: Vec<u64> = spec.shape.iter().map(|&d| d as u64).collect();
                too_big(
                    "num_output",
                    format!("the {} {:?}", spec.name, spec.shape),
                    &dims,
                )?;
            }
            // The column buffer spans the image the kernel slides over: the bottom's for a
            // convolution, the top's for a deconvolution, against the other's pixels.
            let k = layer.param_specs()[0].shape.clone();
            let (image, other) = match l.kind {
                LayerKind::Convolution => (&bottoms[0], &samples[0]),
                _ => (&samples[0], &bottoms[0]),
            };
            let c = image[0];
            let col = [c, k[2] as u64, k[3] as u64, other[1], other[2]];
            too_big(
                "kernel_size",
                format!(
                    "the column buffer (C·kh·kw × OH·OW = {c}·{}·{} × {}·{})",
                    k[2], k[3], other[1], other[2]
                ),
                &col,
            )?;
        }
        Ok(samples)
    }
}

/// Whether a loss layer runs in the train phase of `cfg`, as training needs; an error at
/// `layer` otherwise. A deploy net (with an input layer) may lack one and still predict:
/// validation lets it through, and the commands that train call this.
pub fn train_loss(cfg: &crate::config::Config, src: &crate::config::Source) -> Result<()> {
    let trains_a_loss = cfg.layers.iter().any(|l| {
        matches!(
            l.kind,
            LayerKind::SoftmaxWithLoss | LayerKind::EuclideanLoss
        ) && l.phase != Some(Phase::Test)
            && l.loss_weight != Some(0.0)
    });
    if !trains_a_loss {
        return Err(src.error(
            "layer",
            "no loss layer runs in the train phase: add a layer of type softmax_with_loss or euclidean_loss (without phase = \"test\" or loss_weight = 0)",
        ));
    }
    Ok(())
}
