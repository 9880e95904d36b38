//! Learned weights between a `.caffemodel` (a binary `NetParameter` whose layers carry their
//! `blobs`) and p2ptrain's named tensors (`<layer>.<tensor>`, as in a snapshot).
//!
//! A layer's blobs are its tensors in Caffe's order, which is p2ptrain's: `weight`, `bias`
//! (InnerProduct, Convolution, Deconvolution — whose weight is `(C_in, C_out/g, kh, kw)`); `scale`, `bias` (Scale); `bias` (Bias); `mean`, `variance`,
//! `factor` (BatchNorm's running statistics, stored unscaled as Caffe stores them). Shapes are
//! the same (a convolution's weight `(O, C/g, kh, kw)`, an inner product's `(N, K)`); the legacy
//! 4-D dimensions of old files (`(1, 1, N, K)`) lose their leading ones. Layers are matched by
//! name, as Caffe's `CopyTrainedLayersFrom` does; a layer of the file that the net lacks is
//! skipped (and named), a learning layer of the net that the file lacks is an error.

use super::proto::{
    BlobProto, LayerParameter, NetParameter, NetStateRule, PHASE_TEST, PHASE_TRAIN,
};
use crate::config::{LayerConfig, Phase};
use crate::error::{Error, Result};
use crate::input_file::{read_regular, UNBOUNDED};
use prost::Message;
use std::path::Path;

/// A named f32 tensor: `data` holds `shape`'s product of values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// The tensors of a layer in Caffe's blob order: their names (`weight`, `bias`) and ranks (0
/// where it depends on the bottoms' shapes).
pub fn tensor_specs(config: &LayerConfig) -> Result<Vec<(String, usize)>> {
    let params = config.params()?;
    let layer = crate::layers::build(&config.name, &params);
    let specs = layer.param_specs();
    let count = if layer.has_state() {
        specs.len()
    } else {
        params.learnable_tensors(config.bottom.len()).0
    };
    // A layer that takes a tensor from a second bottom (Scale) learns only the last ones.
    Ok(specs[specs.len().saturating_sub(count)..]
        .iter()
        .map(|s| (s.name.clone(), s.shape.len()))
        .collect())
}

/// Reads a `.caffemodel`; a file in the legacy V1 format is refused with what to do.
pub fn read_caffemodel(path: &Path) -> Result<NetParameter> {
    let bytes = read_regular(path, UNBOUNDED)
        .map_err(|e| Error::snapshot(path, format!("cannot read: {e}")))?;
    parse_caffemodel(path, &bytes)
}

/// The `.caffemodel` in `bytes` (read from `path`, named in errors), as [`read_caffemodel`].
pub fn parse_caffemodel(path: &Path, bytes: &[u8]) -> Result<NetParameter> {
    let net = NetParameter::decode(bytes).map_err(|e| {
        Error::snapshot(path, format!("not a Caffe NetParameter (.caffemodel): {e}"))
    })?;
    if net.layer.is_empty() && !net.layers.is_empty() {
        let first = net.layers[0].name.clone().unwrap_or_default();
        return Err(Error::snapshot(
            path,
            format!(
                "its layers (the first is `{first}`) are in the legacy V1LayerParameter format; \
                 upgrade the file with Caffe's `upgrade_net_proto_binary` and import the result"
            ),
        ));
    }
    Ok(net)
}

/// The tensors of `layers` from `model` (read from `path`), under p2ptrain's names, and the
/// names of the file's layers with blobs that none of `layers` takes.
pub fn import(
    path: &Path,
    model: &NetParameter,
    layers: &[&LayerConfig],
) -> Result<(Vec<NamedTensor>, Vec<String>)> {
    let mut tensors = Vec::new();
    let mut used = Vec::new();
    for config in layers {
        let specs = tensor_specs(config)?;
        if specs.is_empty() {
            continue;
        }
        let source = model
            .layer
            .iter()
            .find(|l| l.name.as_deref() == Some(config.name.as_str()))
            .ok_or_else(|| {
                Error::snapshot(
                    path,
                    format!(
                        "has no layer `{}`, whose {} tensor(s) the net learns (Caffe would keep \
                         their initial values; p2ptrain's weights file must hold every tensor)",
                        config.name,
                        specs.len()
                    ),
                )
            })?;
        used.push(config.name.as_str());
        if source.blobs.len() != specs.len() {
            return Err(Error::snapshot(
                path,
                format!(
                    "layer `{}` holds {} blob(s) where the net's layer has {} ({})",
                    config.name,
                    source.blobs.len(),
                    specs.len(),
                    names(&specs)
                ),
            ));
        }
        for ((name, rank), blob) in specs.iter().zip(&source.blobs) {
            let full = format!("{}.{name}", config.name);
            let shape = blob_shape(blob, *rank)
                .map_err(|m| Error::snapshot(path, format!("`{full}`: {m}")))?;
            let data = blob.values();
            let want: usize = shape.iter().product();
            if data.len() != want {
                return Err(Error::snapshot(
                    path,
                    format!(
                        "`{full}`: shape {shape:?} needs {want} values, the blob holds {}",
                        data.len()
                    ),
                ));
            }
            tensors.push(NamedTensor {
                name: full,
                shape,
                data,
            });
        }
    }
    let skipped = model
        .layer
        .iter()
        .filter(|l| !l.blobs.is_empty())
        .filter_map(|l| l.name.clone())
        .filter(|n| !used.contains(&n.as_str()))
        .collect();
    Ok((tensors, skipped))
}

fn names(specs: &[(String, usize)]) -> String {
    specs
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A blob's shape as p2ptrain's tensor of rank `rank` (0: unknown): legacy 4-D dimensions
/// lose leading ones down to that rank (down to one axis when it is unknown).
fn blob_shape(blob: &BlobProto, rank: usize) -> std::result::Result<Vec<usize>, String> {
    let dims = blob.dims();
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(format!("negative dimension {d} in {dims:?}"));
    }
    let mut shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    let legacy = blob.shape.is_none()
        || [blob.num, blob.channels, blob.height, blob.width]
            .iter()
            .any(Option::is_some);
    if legacy {
        let keep = if rank > 0 { rank } else { 1 };
        while shape.len() > keep && shape[0] == 1 {
            shape.remove(0);
        }
    }
    if rank > 0 && shape.len() != rank {
        return Err(format!(
            "dimensions {dims:?} where a tensor of {rank} axes is expected"
        ));
    }
    Ok(shape)
}

/// A `.caffemodel` of `layers` (in order) holding `tensors` (p2ptrain's names), named `name`:
/// each layer with its Caffe type, wiring, phase and blobs. A learning layer whose tensors are
/// not all in `tensors` is an error naming the first missing one.
pub fn to_caffemodel(
    name: &str,
    layers: &[LayerConfig],
    tensors: &[NamedTensor],
) -> Result<NetParameter> {
    let mut net = NetParameter {
        name: Some(name.to_string()),
        ..Default::default()
    };
    for config in layers {
        let caffe_type = super::caffe_type_of(config.kind)
            .ok_or_else(|| Error::net(&config.name, "its type has no Caffe counterpart"))?;
        let mut blobs = Vec::new();
        for (spec, _) in tensor_specs(config)? {
            let full = format!("{}.{spec}", config.name);
            let t = tensors.iter().find(|t| t.name == full).ok_or_else(|| {
                Error::net(&config.name, format!("the weights hold no tensor `{full}`"))
            })?;
            blobs.push(BlobProto::with_shape(&t.shape, &t.data));
        }
        let include = config
            .phase
            .map(|p| NetStateRule {
                phase: Some(match p {
                    Phase::Train => PHASE_TRAIN,
                    Phase::Test => PHASE_TEST,
                }),
            })
            .into_iter()
            .collect();
        net.layer.push(LayerParameter {
            name: Some(config.name.clone()),
            r#type: Some(caffe_type.to_string()),
            bottom: config.bottom.clone(),
            top: config.top.clone(),
            loss_weight: config.loss_weight.into_iter().collect(),
            blobs,
            include,
            phase: None,
        });
    }
    Ok(net)
}

/// Writes `net` to `path` atomically.
pub fn write_caffemodel(path: &Path, net: &NetParameter) -> Result<()> {
    let bytes = net.encode_to_vec();
    crate::snapshot::write_atomic(path, "caffemodel", |tmp| std::fs::write(tmp, &bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caffe::proto::BlobShape;

    fn layer(toml: &str) -> LayerConfig {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn tensor_names_follow_caffes_blob_order() {
        let ip = layer("name = \"ip\"\ntype = \"inner_product\"\nbottom = [\"x\"]\ntop = [\"y\"]\nnum_output = 3");
        assert_eq!(
            tensor_specs(&ip).unwrap(),
            [("weight".into(), 2), ("bias".into(), 1)]
        );
        let bn = layer("name = \"bn\"\ntype = \"batch_norm\"\nbottom = [\"x\"]\ntop = [\"x\"]");
        let names: Vec<_> = tensor_specs(&bn)
            .unwrap()
            .into_iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(names, ["mean", "variance", "factor"]);
        let sc = layer("name = \"s\"\ntype = \"scale\"\nbottom = [\"x\", \"g\"]\ntop = [\"x\"]\nbias_term = true");
        let names: Vec<_> = tensor_specs(&sc)
            .unwrap()
            .into_iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(names, ["bias"]);
        let up = layer("name = \"up\"\ntype = \"deconvolution\"\nbottom = [\"x\"]\ntop = [\"y\"]\nnum_output = 3\nkernel_size = 2");
        assert_eq!(
            tensor_specs(&up).unwrap(),
            [("weight".into(), 4), ("bias".into(), 1)]
        );
        for kind in ["split", "slice", "silence"] {
            let l = layer(&format!(
                "name = \"l\"\ntype = \"{kind}\"\nbottom = [\"x\"]"
            ));
            assert!(tensor_specs(&l).unwrap().is_empty(), "{kind}");
        }
    }

    #[test]
    fn legacy_dimensions_lose_leading_ones() {
        let legacy = |d: [i32; 4]| BlobProto {
            num: Some(d[0]),
            channels: Some(d[1]),
            height: Some(d[2]),
            width: Some(d[3]),
            ..Default::default()
        };
        assert_eq!(blob_shape(&legacy([1, 1, 10, 200]), 2).unwrap(), [10, 200]);
        assert_eq!(blob_shape(&legacy([1, 1, 1, 10]), 1).unwrap(), [10]);
        assert_eq!(
            blob_shape(&legacy([20, 1, 3, 3]), 4).unwrap(),
            [20, 1, 3, 3]
        );
        assert_eq!(blob_shape(&legacy([1, 1, 1, 7]), 0).unwrap(), [7]);
        assert!(blob_shape(&legacy([2, 1, 10, 200]), 2).is_err());
        let modern = BlobProto {
            shape: Some(BlobShape { dim: vec![1, 5] }),
            ..Default::default()
        };
        assert_eq!(
            blob_shape(&modern, 2).unwrap(),
            [1, 5],
            "a modern shape is kept as written"
        );
    }

    #[test]
    fn a_caffemodel_written_and_imported_gives_the_tensors_back_bit_for_bit() {
        let layers = vec![
            layer("name = \"ip\"\ntype = \"inner_product\"\nbottom = [\"data\"]\ntop = [\"ip\"]\nnum_output = 2"),
            layer("name = \"loss\"\ntype = \"softmax_with_loss\"\nbottom = [\"ip\", \"label\"]\ntop = [\"loss\"]"),
        ];
        let tensors = vec![
            NamedTensor {
                name: "ip.weight".into(),
                shape: vec![2, 3],
                data: vec![1.0, -0.0, f32::MIN_POSITIVE, 3.5, 1e-30, -7.25],
            },
            NamedTensor {
                name: "ip.bias".into(),
                shape: vec![2],
                data: vec![0.125, -2.0],
            },
        ];
        let net = to_caffemodel("n", &layers, &tensors).unwrap();
        assert_eq!(net.layer[0].r#type.as_deref(), Some("InnerProduct"));
        assert_eq!(net.layer[1].r#type.as_deref(), Some("SoftmaxWithLoss"));
        let decoded = NetParameter::decode(&net.encode_to_vec()[..]).unwrap();
        let refs: Vec<&LayerConfig> = layers.iter().collect();
        let (back, skipped) = import(Path::new("m.caffemodel"), &decoded, &refs).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(back.len(), 2);
        for (a, b) in back.iter().zip(&tensors) {
            assert_eq!((&a.name, &a.shape), (&b.name, &b.shape));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.data), bits(&b.data));
        }
    }

    #[test]
    fn a_missing_layer_or_a_wrong_blob_count_is_named() {
        let ip = layer("name = \"ip\"\ntype = \"inner_product\"\nbottom = [\"data\"]\ntop = [\"ip\"]\nnum_output = 2");
        let empty = NetParameter::default();
        let e = import(Path::new("m.caffemodel"), &empty, &[&ip]).unwrap_err();
        assert!(e.to_string().contains("has no layer `ip`"), "{e}");
        let one_blob = NetParameter {
            layer: vec![LayerParameter {
                name: Some("ip".into()),
                blobs: vec![BlobProto::with_shape(&[2, 1], &[1.0, 2.0])],
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = import(Path::new("m.caffemodel"), &one_blob, &[&ip]).unwrap_err();
        assert!(
            e.to_string()
                .contains("1 blob(s) where the net's layer has 2 (weight, bias)"),
            "{e}"
        );
    }
}
