//! Caffe's files: nets and solvers in the protobuf text format (`.prototxt`), learned weights in
//! the binary `NetParameter` (`.caffemodel`), read into p2ptrain's config and safetensors weights
//! (`p2ptrain import-caffe`) and written back (`p2ptrain export --format caffe`).
//!
//! - [`prototxt`]: the text format, a schema-less tree with line numbers.
//! - [`proto`]: the binary messages through prost (`BlobProto` is `data::mean_file`'s).
//! - here: Caffe's layer type names and p2ptrain's layer kinds ([`CAFFE_TYPES`],
//!   [`kind_of_caffe_type`], [`caffe_type_of`]).
//! - [`net`]: a net prototxt → `[data]` and `[[layer]]` tables; [`solver`]: a solver prototxt →
//!   `[solver]` (and `[cluster] backend`); [`weights`]: `.caffemodel` ↔ named tensors;
//!   [`import`]: the three together, written as `cluster.toml` and `weights.safetensors`.
//! - [`export`]: a snapshot → `.caffemodel`, or → a state dict with torchvision's ResNet names.

pub mod export;
pub mod import;
pub mod net;
pub mod proto;
pub mod prototxt;
pub mod solver;
pub mod weights;

use crate::config::LayerKind;
use crate::error::{Error, Pos};
use prototxt::TextPos;
use std::path::Path;

/// Caffe's type names of the layers p2ptrain has or may have, as `type:` spells them. A kind of
/// p2ptrain matches the entry equal to its config name once both are lower-cased with the
/// underscores removed (`inner_product` ↔ `InnerProduct`, `relu` ↔ `ReLU`).
pub const CAFFE_TYPES: &[&str] = &[
    "AbsVal",
    "Accuracy",
    "ArgMax",
    "BatchNorm",
    "Bias",
    "Concat",
    "Convolution",
    "Deconvolution",
    "Dropout",
    "ELU",
    "Eltwise",
    "EuclideanLoss",
    "Flatten",
    "InnerProduct",
    "Input",
    "LRN",
    "PReLU",
    "Pooling",
    "Power",
    "ReLU",
    "Reshape",
    "Scale",
    "Sigmoid",
    "Silence",
    "Slice",
    "Softmax",
    "SoftmaxWithLoss",
    "Split",
    "TanH",
];

/// `name` lower-cased without underscores: the form Caffe's and p2ptrain's names are matched in.
fn folded(name: &str) -> String {
    name.chars()
        .filter(|&c| c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

macro_rules! kind_list {
    ($($kind:ident => $params:ident,)*) => {
        &[$(LayerKind::$kind,)*]
    };
}

/// Every layer kind p2ptrain has.
const ALL_KINDS: &[LayerKind] = crate::config::layer_params::for_each_layer_kind!(kind_list);

/// The config name of `kind` (`inner_product`).
pub fn kind_name(kind: LayerKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{kind:?}"),
    }
}

/// The layer kind of Caffe's type `caffe_type`, if p2ptrain has it.
pub fn kind_of_caffe_type(caffe_type: &str) -> Option<LayerKind> {
    let want = folded(caffe_type);
    ALL_KINDS
        .iter()
        .copied()
        .find(|&k| folded(&kind_name(k)) == want)
}

/// Caffe's type name of `kind` (`InnerProduct` for `inner_product`).
pub fn caffe_type_of(kind: LayerKind) -> Option<&'static str> {
    let want = folded(&kind_name(kind));
    CAFFE_TYPES.iter().copied().find(|t| folded(t) == want)
}

/// The Caffe types p2ptrain has, for messages.
pub fn supported_types() -> Vec<&'static str> {
    ALL_KINDS.iter().filter_map(|&k| caffe_type_of(k)).collect()
}

/// An error about the text file `file` at `pos`, on `what` (a layer, a solver key).
pub fn text_error(
    file: &Path,
    pos: TextPos,
    what: impl Into<String>,
    msg: impl Into<String>,
) -> Error {
    Error::Config {
        file: file.display().to_string(),
        pos: Some(Pos {
            line: pos.line,
            col: pos.col,
        }),
        key: what.into(),
        msg: msg.into(),
    }
}

/// The largest prototxt read (64 MiB; a net with its comments is a few hundred KiB).
pub const MAX_PROTOTXT_BYTES: u64 = 64 << 20;

/// Reads and parses the text-format file at `path`; a syntax error names its line and column.
pub fn read_prototxt(path: &Path) -> crate::error::Result<prototxt::Message> {
    let bytes = crate::input_file::read_regular(path, MAX_PROTOTXT_BYTES)
        .map_err(|e| Error::Usage(format!("{}: cannot read: {e}", path.display())))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| Error::Usage(format!("{}: not UTF-8 text: {e}", path.display())))?;
    prototxt::parse(&text).map_err(|e| text_error(path, e.pos, "(syntax)", e.msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_caffe_type_and_back() {
        for &kind in ALL_KINDS {
            let caffe = caffe_type_of(kind).unwrap_or_else(|| panic!("{kind:?} has no Caffe type"));
            assert_eq!(kind_of_caffe_type(caffe), Some(kind), "{caffe}");
        }
        assert_eq!(kind_of_caffe_type("ReLU"), Some(LayerKind::Relu));
        assert_eq!(kind_of_caffe_type("TanH"), Some(LayerKind::Tanh));
        assert_eq!(
            kind_of_caffe_type("InnerProduct"),
            Some(LayerKind::InnerProduct)
        );
        assert_eq!(kind_of_caffe_type("Data"), None);
    }
}
