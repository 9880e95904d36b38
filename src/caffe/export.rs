//! `p2ptrain export`: a snapshot's weights written for another framework.
//!
//! - **caffe**: a `.caffemodel` (binary `NetParameter`): every layer of the config with its Caffe
//!   type, bottoms, tops, phase and blobs (`super::weights::to_caffemodel`). Caffe's
//!   `caffe test -model NET.prototxt -weights FILE` loads it (layers matched by name, blob shapes
//!   compared), and `p2ptrain import-caffe NET.prototxt --weights FILE` gives the snapshot's
//!   tensors back bit for bit.
//! - **torchvision**: a safetensors state dict with torchvision's ResNet names, for nets named as
//!   Kaiming He's Caffe ResNets are (`config/resnet50.toml`): `conv1` → `conv1`, `bn_conv1` and
//!   `scale_conv1` → `bn1`, `res{S}{B}_branch2a|2b|2c` → `layer{S−1}.{B}.conv1|2|3`,
//!   `bn…`/`scale…` → `bn1|2|3`, `…_branch1` → `downsample.0` / `downsample.1`, the last inner
//!   product → `fc` (block letters a, b, c… or b1, b2… count from 0). BatchNorm follows
//!   PyTorch's conventions: `running_mean = mean / factor`, `running_var = variance / factor`
//!   (Caffe's unscaled sums; both 0 when the factor is 0), the Scale layer's tensors become
//!   `weight` and `bias` (1 and 0 without one), `num_batches_tracked` is 0. Every tensor is F32
//!   (`load_state_dict` casts `num_batches_tracked`). Load it with
//!   `safetensors.torch.load_file`; `tests/python/check_torchvision_export.py` checks it against
//!   `torchvision.models.resnet50()`.
//!
//! The layers come from the snapshot's `.solverstate` (its `config`), or from `--config`.

use super::weights::{self, NamedTensor};
use crate::config::{LayerConfig, LayerKind};
use crate::error::{Error, Result};
use crate::input_file::{read_regular, UNBOUNDED};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file formats `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Caffe,
    Torchvision,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "caffe" => Ok(ExportFormat::Caffe),
            "torchvision" => Ok(ExportFormat::Torchvision),
            other => Err(format!("unknown format `{other}`: caffe or torchvision")),
        }
    }
}

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// A snapshot's `.safetensors` (or any weights file of p2ptrain's names).
    pub snapshot: PathBuf,
    /// The config whose layers the weights belong to; default: the snapshot's `.solverstate`.
    pub config: Option<PathBuf>,
    pub format: ExportFormat,
    pub output: PathBuf,
}

/// Writes the export; returns the number of tensors (caffe: blobs) written.
pub fn run(opts: &ExportOptions) -> Result<usize> {
    let layers = layers_of(opts)?;
    let tensors = read_tensors(&opts.snapshot)?;
    match opts.format {
        ExportFormat::Caffe => {
            let name = opts
                .snapshot
                .file_stem()
                .map_or_else(|| "net".into(), |s| s.to_string_lossy().into_owned());
            let net = weights::to_caffemodel(&name, &layers, &tensors)
                .map_err(|e| Error::snapshot(&opts.snapshot, e))?;
            weights::write_caffemodel(&opts.output, &net)?;
            Ok(net.layer.iter().map(|l| l.blobs.len()).sum())
        }
        ExportFormat::Torchvision => {
            let dict = torchvision_state_dict(&layers, &tensors)?;
            let views: Vec<_> = dict
                .iter()
                .map(|(k, t)| (k.as_str(), t.shape.as_slice(), t.data.as_slice()))
                .collect();
            crate::snapshot::save_tensors(&opts.output, &views, &[])?;
            Ok(dict.len())
        }
    }
}

/// Only the layers of a config (TOML) or a solver state's config (JSON): the other sections may
/// name sources this build cannot open.
#[derive(serde::Deserialize)]
struct LayersOnly {
    #[serde(rename = "layer")]
    layers: Vec<LayerConfig>,
}

/// The layers of `--config`, or of the config stored in the snapshot's solver state.
fn layers_of(opts: &ExportOptions) -> Result<Vec<LayerConfig>> {
    if let Some(path) = &opts.config {
        let bytes = read_regular(path, UNBOUNDED).map_err(|e| {
            Error::Usage(format!("{}: cannot read the config: {e}", path.display()))
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let parsed: LayersOnly = toml::from_str(&text).map_err(|e| Error::Config {
            file: path.display().to_string(),
            pos: None,
            key: "layer".into(),
            msg: e.message().to_string(),
        })?;
        return Ok(parsed.layers);
    }
    let state = crate::resume::SnapshotFiles::of(&opts.snapshot).state;
    let bytes = read_regular(&state, UNBOUNDED).map_err(|e| {
        Error::snapshot(
            &state,
            format!(
                "cannot read the snapshot's solver state ({e}), which names its layers: give \
                 the config with --config"
            ),
        )
    })?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| Error::snapshot(&state, format!("not a safetensors file: {e}")))?;
    let config = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("config"))
        .ok_or_else(|| Error::snapshot(&state, "holds no `config`: give it with --config"))?;
    let parsed: LayersOnly = serde_json::from_str(config)
        .map_err(|e| Error::snapshot(&state, format!("its `config` cannot be read: {e}")))?;
    Ok(parsed.layers)
}

/// Every F32 tensor of the safetensors file at `path`.
pub fn read_tensors(path: &Path) -> Result<Vec<NamedTensor>> {
    let bytes = read_regular(path, UNBOUNDED)
        .map_err(|e| Error::snapshot(path, format!("cannot read: {e}")))?;
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::snapshot(path, format!("not a complete safetensors file: {e}")))?;
    let mut out = Vec::new();
    for (name, view) in file.tensors() {
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(Error::snapshot(
                path,
                format!("`{name}` is {} where F32 is expected", view.dtype()),
            ));
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.push(NamedTensor {
            name,
            shape: view.shape().to_vec(),
            data,
        });
    }
    Ok(out)
}

/// Where a layer's tensors go in a torchvision ResNet: the module path (`layer1.0.bn2`) and
/// what the layer is there.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    Conv(String),
    BatchNorm(String),
    Scale(String),
    Fc,
}

/// The torchvision module of layer `l` (of a He-style ResNet), or `None` for a layer with no
/// tensors; an error for a learning layer outside the naming scheme.
fn role_of(l: &LayerConfig, last_fc: bool) -> Result<Option<Role>> {
    let unknown = || {
        Error::net(
            &l.name,
            "has learnable tensors but no place in a torchvision ResNet (names as in Kaiming He's \
             Caffe ResNets: conv1, bn_conv1, scale_conv1, res2a_branch2a, bn2a_branch1, …, and \
             a last inner product)",
        )
    };
    let stem = |prefix: &str| l.name.strip_prefix(prefix).map(str::to_string);
    let (module, role): (String, fn(String) -> Role) = match l.kind {
        LayerKind::Convolution => match l.name.as_str() {
            "conv1" => ("conv1".into(), Role::Conv),
            _ => (
                block_module(&stem("res").ok_or_else(unknown)?, false).ok_or_else(unknown)?,
                Role::Conv,
            ),
        },
        LayerKind::BatchNorm => match l.name.as_str() {
            "bn_conv1" => ("bn1".into(), Role::BatchNorm),
            _ => (
                block_module(&stem("bn").ok_or_else(unknown)?, true).ok_or_else(unknown)?,
                Role::BatchNorm,
            ),
        },
        LayerKind::Scale => match l.name.as_str() {
            "scale_conv1" => ("bn1".into(), Role::Scale),
            _ => (
                block_module(&stem("scale").ok_or_else(unknown)?, true).ok_or_else(unknown)?,
                Role::Scale,
            ),
        },
        LayerKind::InnerProduct if last_fc => return Ok(Some(Role::Fc)),
        _ if weights::tensor_specs(l)?.is_empty() => return Ok(None),
        _ => return Err(unknown()),
    };
    Ok(Some(role(module)))
}

/// `2a_branch2b` → `layer1.0.conv2` (`bn2`, with `norm`); `3b1_branch1` → `layer2.1.downsample.0`
/// (`.1`, with `norm`).
fn block_module(rest: &str, norm: bool) -> Option<String> {
    let (block, branch) = rest.split_once("_branch")?;
    let stage: usize = block.get(..1)?.parse().ok()?;
    let letter = block.as_bytes().get(1).copied()?;
    let number = &block[2..];
    let index = match (letter, number) {
        (b'a'..=b'z', "") => usize::from(letter - b'a'),
        (b'b', n) => n.parse().ok()?,
        _ => return None,
    };
    let layer = format!("layer{}.{index}", stage.checked_sub(1)?);
    let part = match (branch, norm) {
        ("1", false) => "downsample.0".to_string(),
        ("1", true) => "downsample.1".to_string(),
        ("2a" | "2b" | "2c", _) => {
            let n = usize::from(branch.as_bytes()[1] - b'a') + 1;
            format!("{}{n}", if norm { "bn" } else { "conv" })
        }
        _ => return None,
    };
    Some(format!("{layer}.{part}"))
}

/// The state dict of a torchvision ResNet holding `tensors` of `layers`.
fn torchvision_state_dict(
    layers: &[LayerConfig],
    tensors: &[NamedTensor],
) -> Result<BTreeMap<String, NamedTensor>> {
    let get = |layer: &str, t: &str| {
        let full = format!("{layer}.{t}");
        tensors
            .iter()
            .find(|x| x.name == full)
            .ok_or_else(|| Error::net(layer, format!("the weights hold no tensor `{full}`")))
    };
    let last_fc = layers
        .iter()
        .rposition(|l| l.kind == LayerKind::InnerProduct);
    let mut dict = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>, data: Vec<f32>| {
        dict.insert(name.clone(), NamedTensor { name, shape, data });
    };
    let mut norms = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        match role_of(l, Some(i) == last_fc)? {
            None => {}
            Some(Role::Conv(m)) => {
                if l.bias_term.unwrap_or(true) {
                    return Err(Error::net(
                        &l.name,
                        "a torchvision ResNet's convolutions have no bias: bias_term must be false",
                    ));
                }
                let w = get(&l.name, "weight")?;
                put(format!("{m}.weight"), w.shape.clone(), w.data.clone());
            }
            Some(Role::BatchNorm(m)) => {
                let factor = get(&l.name, "factor")?.data[0];
                let unscale = |t: &NamedTensor| -> Vec<f32> {
                    let s = if factor == 0.0 { 0.0 } else { 1.0 / factor };
                    t.data.iter().map(|v| v * s).collect()
                };
                let (mean, var) = (get(&l.name, "mean")?, get(&l.name, "variance")?);
                put(
                    format!("{m}.running_mean"),
                    mean.shape.clone(),
                    unscale(mean),
                );
                put(format!("{m}.running_var"), var.shape.clone(), unscale(var));
                put(format!("{m}.num_batches_tracked"), Vec::new(), vec![0.0]);
                norms.push((m, mean.shape.clone()));
            }
            Some(Role::Scale(m)) => {
                let s = get(&l.name, "scale")?;
                put(format!("{m}.weight"), s.shape.clone(), s.data.clone());
                if l.bias_term.unwrap_or(false) {
                    let b = get(&l.name, "bias")?;
                    put(format!("{m}.bias"), b.shape.clone(), b.data.clone());
                }
            }
            Some(Role::Fc) => {
                for t in ["weight", "bias"] {
                    let x = get(&l.name, t)?;
                    put(format!("fc.{t}"), x.shape.clone(), x.data.clone());
                }
            }
        }
    }
    // A BatchNorm without its Scale (or a Scale without bias) is torchvision's with weight 1, bias 0.
    for (m, shape) in norms {
        let n: usize = shape.iter().product();
        for (t, v) in [("weight", 1.0), ("bias", 0.0)] {
            let key = format!("{m}.{t}");
            dict.entry(key.clone()).or_insert_with(|| NamedTensor {
                name: key,
                shape: shape.clone(),
                data: vec![v; n],
            });
        }
    }
    Ok(dict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn he_names_map_to_torchvision_modules() {
        for (rest, norm, want) in [
            ("2a_branch2a", false, "layer1.0.conv1"),
            ("2a_branch1", true, "layer1.0.downsample.1"),
            ("5c_branch2c", true, "layer4.2.bn3"),
            ("4b22_branch2b", false, "layer3.22.conv2"),
            ("3d_branch1", false, "layer2.3.downsample.0"),
        ] {
            assert_eq!(block_module(rest, norm).as_deref(), Some(want), "{rest}");
        }
        for bad in ["2a", "2a_branch3", "xa_branch1", "2_branch1"] {
            assert_eq!(block_module(bad, false), None, "{bad}");
        }
    }

    fn layer(toml: &str) -> LayerConfig {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn batch_norm_statistics_are_unscaled_and_scale_becomes_weight_and_bias() {
        let layers = vec![
            layer("name = \"conv1\"\ntype = \"convolution\"\nbottom = [\"data\"]\ntop = [\"c\"]\nnum_output = 2\nkernel_size = 1\nbias_term = false"),
            layer("name = \"bn_conv1\"\ntype = \"batch_norm\"\nbottom = [\"c\"]\ntop = [\"c\"]"),
            layer("name = \"scale_conv1\"\ntype = \"scale\"\nbottom = [\"c\"]\ntop = [\"c\"]\nbias_term = true"),
            layer("name = \"relu\"\ntype = \"relu\"\nbottom = [\"c\"]\ntop = [\"c\"]"),
            layer("name = \"fc1000\"\ntype = \"inner_product\"\nbottom = [\"c\"]\ntop = [\"f\"]\nnum_output = 3"),
        ];
        let t = |name: &str, shape: Vec<usize>, data: Vec<f32>| NamedTensor {
            name: name.into(),
            shape,
            data,
        };
        let tensors = vec![
            t("conv1.weight", vec![2, 1, 1, 1], vec![1.0, 2.0]),
            t("bn_conv1.mean", vec![2], vec![4.0, 8.0]),
            t("bn_conv1.variance", vec![2], vec![2.0, 6.0]),
            t("bn_conv1.factor", vec![1], vec![2.0]),
            t("scale_conv1.scale", vec![2], vec![0.5, 1.5]),
            t("scale_conv1.bias", vec![2], vec![0.1, 0.2]),
            t("fc1000.weight", vec![3, 2], vec![0.0; 6]),
            t("fc1000.bias", vec![3], vec![0.0; 3]),
        ];
        let d = torchvision_state_dict(&layers, &tensors).unwrap();
        let keys: Vec<_> = d.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "bn1.bias",
                "bn1.num_batches_tracked",
                "bn1.running_mean",
                "bn1.running_var",
                "bn1.weight",
                "conv1.weight",
                "fc.bias",
                "fc.weight"
            ]
        );
        assert_eq!(d["bn1.running_mean"].data, [2.0, 4.0]);
        assert_eq!(d["bn1.running_var"].data, [1.0, 3.0]);
        assert_eq!(d["bn1.weight"].data, [0.5, 1.5]);
        assert_eq!(d["bn1.num_batches_tracked"].shape, Vec::<usize>::new());
    }

    #[test]
    fn a_learning_layer_outside_the_scheme_is_named() {
        let layers = vec![layer(
            "name = \"mystery\"\ntype = \"convolution\"\nbottom = [\"data\"]\ntop = [\"c\"]\nnum_output = 2\nkernel_size = 1\nbias_term = false",
        )];
        let e = torchvision_state_dict(&layers, &[]).unwrap_err();
        assert!(e.to_string().contains("mystery"), "{e}");
    }
}
