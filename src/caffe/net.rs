//! A Caffe net prototxt (`NetParameter` in the text format, `layer { ... }` blocks) turned into
//! p2ptrain's `[data]` table and `[[layer]]` tables.
//!
//! - **Input layers.** A deploy net's `Input` layer stays an `input` layer, its tops renamed
//!   `data` (and `label`); without a Data layer, `[data]` becomes a synthetic placeholder of the
//!   Input's shape (`deploy_data_table`), for `predict --input`.
//! - **Data layers.** The `Data` layers of the TRAIN and TEST phases become `[data]`:
//!   `format = "lmdb"`, `train_source` / `test_source` (the `data_param.source` paths, taken
//!   relative to the prototxt's folder and written relative to the output folder),
//!   `batch_size` / `test_batch_size`, `shuffle = false` (Caffe's Data layer reads in order), and
//!   the `transform_param` keys (`scale`, `mirror`, `crop_size`, `mean_file`, `mean_value`),
//!   which p2ptrain applies to both phases. Their tops become the blobs `data` and `label`.
//! - **Other layers.** Each `layer` becomes a `[[layer]]` of the kind whose name matches its type
//!   (`super::kind_of_caffe_type`). The fields of its own `*_param` block (and `loss_param`) keep
//!   their names (`kernel_h`/`kernel_w` become `kernel_size = [h, w]`, likewise `pad_*`,
//!   `stride_*`; `concat_dim` and `slice_dim` become `axis`), enum values are lower-cased (`MAX` → `"max"`),
//!   fillers become tables, `param { lr_mult decay_mult }` blocks the `lr_mult` / `decay_mult`
//!   lists, `include { phase }` / `exclude { phase }` the `phase` key.
//! - **Errors.** Anything p2ptrain lacks (a layer type, a key, a value such as `pool: STOCHASTIC`
//!   or a shared parameter) is an error naming the layer, its type and the line; every layer's
//!   keys are resolved by `config::layer_params` as a config file's are. The legacy `layers`
//!   (V1LayerParameter) format and net-level inputs are refused with what to do instead.

use super::prototxt::{Field, Message, Scalar, TextPos, Value};
use super::{kind_of_caffe_type, supported_types, text_error};
use crate::config::{LayerConfig, LayerKind, LayerParams};
use crate::error::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use toml_edit::{Array, InlineTable, Item, Table};

/// A net read from a prototxt: its data section, its layers and what the reader noted.
#[derive(Debug, Clone)]
pub struct ImportedNet {
    /// The net's `name`.
    pub name: Option<String>,
    /// `[data]`, from the Data layers.
    pub data: Table,
    /// The layers other than data layers, in order.
    pub layers: Vec<ImportedLayer>,
    /// Things the reader skipped that Caffe ignores too, for the user.
    pub warnings: Vec<String>,
}

/// One `[[layer]]` and where it came from.
#[derive(Debug, Clone)]
pub struct ImportedLayer {
    pub name: String,
    pub kind: LayerKind,
    /// Caffe's type as written.
    pub caffe_type: String,
    /// The position of its `layer` block.
    pub pos: TextPos,
    pub table: Table,
    /// The resolved config of the layer.
    pub config: LayerConfig,
}

impl ImportedLayer {
    /// `name (Type)`, the way errors name a layer.
    pub fn label(&self) -> String {
        format!("layer {} ({})", self.name, self.caffe_type)
    }
}

/// Net-level fields that change nothing p2ptrain does.
const IGNORED_NET_FIELDS: &[&str] = &["name", "force_backward", "debug_info"];

/// Reads the net at `path` (already parsed into `net`); paths in it are written relative to
/// `out_dir`, where the config will be.
pub fn read(path: &Path, net: &Message, out_dir: &Path) -> Result<ImportedNet> {
    let mut reader = NetReader {
        path,
        out_dir,
        renames: HashMap::new(),
        warnings: Vec::new(),
    };
    for f in &net.fields {
        match f.name.as_str() {
            "layer" => {}
            "layers" => {
                return Err(text_error(
                    path,
                    f.pos,
                    "layers",
                    "this net uses the legacy V1 format (`layers { type: CONVOLUTION ... }`); \
                     upgrade it with Caffe's `upgrade_net_proto_text` and import the result",
                ))
            }
            "input" | "input_shape" | "input_dim" => {
                return Err(text_error(
                    path,
                    f.pos,
                    &f.name,
                    "net-level inputs are not supported: declare the input with an Input layer \
                     (`layer { name: \"data\" type: \"Input\" top: \"data\" input_param { shape \
                     { dim: N dim: C dim: H dim: W } } }`)",
                ))
            }
            n if IGNORED_NET_FIELDS.contains(&n) => {}
            n => return Err(text_error(path, f.pos, n, "not supported in a net")),
        }
    }
    let mut data_layers = Vec::new();
    let mut layers = Vec::new();
    for f in net.all("layer") {
        let block = f
            .message()
            .map_err(|m| text_error(path, f.pos, "layer", m))?;
        let ty = required_string(path, f.pos, block, "type", "layer")?;
        if ty == "Data" {
            data_layers.push(reader.data_layer(f.pos, block)?);
        } else {
            if ty == "Input" {
                reader.input_tops(block)?;
            }
            layers.push((f.pos, block, ty));
        }
    }
    let layers = layers
        .into_iter()
        .map(|(pos, block, ty)| reader.layer(pos, block, ty))
        .collect::<Result<Vec<_>>>()?;
    let input = layers.iter().find(|l| l.kind == LayerKind::Input);
    let data = match (data_layers.is_empty(), input) {
        (true, Some(input)) => deploy_data_table(input),
        _ => reader.data_table(&data_layers)?,
    };
    check_wiring(path, &layers)?;
    Ok(ImportedNet {
        name: net
            .last("name")
            .and_then(|f| f.string().ok())
            .map(str::to_string),
        data,
        layers,
        warnings: reader.warnings,
    })
}

/// A string field `key` of `block` that must be there.
fn required_string<'a>(
    path: &Path,
    pos: TextPos,
    block: &'a Message,
    key: &str,
    what: &str,
) -> Result<&'a str> {
    let f = block
        .last(key)
        .ok_or_else(|| text_error(path, pos, what, format!("has no `{key}`")))?;
    f.string().map_err(|m| text_error(path, f.pos, what, m))
}

/// The phase of a layer: `include { phase }`, `exclude { phase }`, or both phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PhaseRule {
    Both,
    Train,
    Test,
}

impl PhaseRule {
    fn name(self) -> Option<&'static str> {
        match self {
            PhaseRule::Both => None,
            PhaseRule::Train => Some("train"),
            PhaseRule::Test => Some("test"),
        }
    }
}

/// One phase's Data layer.
#[derive(Debug, Clone)]
struct DataLayer {
    pos: TextPos,
    name: String,
    phase: PhaseRule,
    source: PathBuf,
    batch_size: i64,
    prefetch: Option<i64>,
    /// `transform_param` keys as `[data]` keys, with their positions.
    transform: Vec<(String, toml_edit::Value, TextPos)>,
    mirror: bool,
}

struct NetReader<'a> {
    path: &'a Path,
    out_dir: &'a Path,
    /// Data layer tops → `data` / `label`.
    renames: HashMap<String, String>,
    warnings: Vec<String>,
}

/// A layer's keys in the making: (key, value, position of the field it came from).
type Entries = Vec<(String, toml_edit::Value, TextPos)>;

impl NetReader<'_> {
    fn err(&self, pos: TextPos, what: &str, msg: impl Into<String>) -> crate::error::Error {
        text_error(self.path, pos, what, msg)
    }

    /// The phase rule of a layer block.
    fn phase(&self, block: &Message, what: &str) -> Result<PhaseRule> {
        let mut rule = PhaseRule::Both;
        for (key, invert) in [("include", false), ("exclude", true)] {
            for f in block.all(key) {
                let m = f.message().map_err(|e| self.err(f.pos, what, e))?;
                for g in &m.fields {
                    if g.name != "phase" {
                        return Err(self.err(
                            g.pos,
                            what,
                            format!(
                                "`{key} {{ {} }}`: only phase rules are supported (no stages or \
                                 levels)",
                                g.name
                            ),
                        ));
                    }
                }
                let Some(p) = m.last("phase") else { continue };
                let train = match p.ident().map_err(|e| self.err(p.pos, what, e))? {
                    "TRAIN" => true,
                    "TEST" => false,
                    other => return Err(self.err(p.pos, what, format!("unknown phase {other}"))),
                };
                let this = if train != invert {
                    PhaseRule::Train
                } else {
                    PhaseRule::Test
                };
                if rule != PhaseRule::Both && rule != this {
                    return Err(self.err(f.pos, what, "phase rules that contradict each other"));
                }
                rule = this;
            }
        }
        Ok(rule)
    }

    fn data_layer(&mut self, pos: TextPos, block: &Message) -> Result<DataLayer> {
        let name = required_string(self.path, pos, block, "name", "layer")?.to_string();
        let what = format!("layer {name} (Data)");
        let phase = self.phase(block, &what)?;
        let mut source = None;
        let mut batch_size = None;
        let mut prefetch = None;
        let mut transform = Vec::new();
        let mut mirror = false;
        for f in &block.fields {
            match f.name.as_str() {
                "name" | "type" | "include" | "exclude" | "top" => {}
                "data_param" => {
                    for g in &f.message().map_err(|e| self.err(f.pos, &what, e))?.fields {
                        let bad = |m: String| self.err(g.pos, &what, m);
                        match g.name.as_str() {
                            "source" => source = Some(g.string().map_err(bad)?.to_string()),
                            "batch_size" => batch_size = Some(g.int().map_err(bad)?),
                            "prefetch" => prefetch = Some(g.int().map_err(bad)?),
                            "backend" => match g.ident().map_err(bad)? {
                                "LMDB" => {}
                                other => {
                                    return Err(bad(format!(
                                        "backend {other} is not supported: p2ptrain reads LMDB \
                                         (convert with Caffe's convert_imageset --backend lmdb)"
                                    )))
                                }
                            },
                            "rand_skip" if g.int().map_err(bad)? == 0 => {}
                            other => {
                                return Err(bad(format!("`data_param.{other}` is not supported")))
                            }
                        }
                    }
                }
                "transform_param" => {
                    let m = f.message().map_err(|e| self.err(f.pos, &what, e))?;
                    mirror = self.transform(m, &what, &mut transform)?;
                }
                other => return Err(self.err(f.pos, &what, format!("`{other}` is not supported"))),
            }
        }
        let tops: Vec<&Field> = block.all("top").collect();
        for (top, ours) in tops.iter().zip(["data", "label"]) {
            let t = top.string().map_err(|e| self.err(top.pos, &what, e))?;
            self.renames.insert(t.to_string(), ours.to_string());
        }
        if tops.len() > 2 {
            return Err(self.err(tops[2].pos, &what, "a Data layer has at most two tops"));
        }
        let source = source.ok_or_else(|| self.err(pos, &what, "has no `data_param.source`"))?;
        Ok(DataLayer {
            pos,
            name,
            phase,
            source: self.path_from_net(&source),
            batch_size: batch_size
                .ok_or_else(|| self.err(pos, &what, "has no `data_param.batch_size`"))?,
            prefetch,
            transform,
            mirror,
        })
    }

    /// An Input layer's tops are the inputs `data` and `label`, as a Data layer's are.
    fn input_tops(&mut self, block: &Message) -> Result<()> {
        for (top, ours) in block.all("top").zip(["data", "label"]) {
            let t = top.string().map_err(|e| self.err(top.pos, "Input", e))?;
            self.renames.insert(t.to_string(), ours.to_string());
        }
        Ok(())
    }

    /// `transform_param`'s keys as `[data]` keys into `out`; returns `mirror`.
    fn transform(&self, m: &Message, what: &str, out: &mut Entries) -> Result<bool> {
        let mut mirror = false;
        for g in &m.fields {
            let bad = |e: String| self.err(g.pos, what, e);
            let value: toml_edit::Value = match g.name.as_str() {
                "scale" => g.float().map_err(bad)?.into(),
                "crop_size" => g.int().map_err(bad)?.into(),
                "mean_value" => g.float().map_err(bad)?.into(),
                "mean_file" => {
                    let p = self.path_from_net(g.string().map_err(bad)?);
                    self.relative(&p).display().to_string().into()
                }
                "mirror" => {
                    mirror = g.boolean().map_err(bad)?;
                    continue;
                }
                "force_color" | "force_gray" if !g.boolean().map_err(bad)? => continue,
                other => {
                    return Err(bad(format!(
                        "`transform_param.{other}` is not supported (p2ptrain's transform: \
                         scale, mirror, crop_size, mean_file, mean_value)"
                    )))
                }
            };
            out.push((g.name.clone(), value, g.pos));
        }
        Ok(mirror)
    }

    /// A path written in the net: relative paths are taken from the prototxt's folder.
    fn path_from_net(&self, p: &str) -> PathBuf {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        dir.join(p)
    }

    /// `p` as written in the config in `out_dir`: relative to it where both can be made
    /// absolute, else as given.
    fn relative(&self, p: &Path) -> PathBuf {
        relative_path(p, self.out_dir)
    }

    /// `[data]` from the Data layers: one for both phases, or one per phase.
    fn data_table(&self, layers: &[DataLayer]) -> Result<Table> {
        let mut t = Table::new();
        t.insert("format", "lmdb".into());
        let find = |phase: PhaseRule| {
            layers
                .iter()
                .find(|l| l.phase == phase || l.phase == PhaseRule::Both)
        };
        let (train, test) = (find(PhaseRule::Train), find(PhaseRule::Test));
        let Some(first) = train.or(test) else {
            return Err(self.err(
                TextPos { line: 1, col: 1 },
                "(net)",
                "has no Data layer: p2ptrain reads its inputs from Data layers (LMDB)",
            ));
        };
        if let Some(l) = train {
            t.insert("train_source", self.source_item(l));
            t.insert("batch_size", Item::Value(l.batch_size.into()));
        }
        if let Some(l) = test {
            t.insert("test_source", self.source_item(l));
            if train.is_none() {
                t.insert("batch_size", Item::Value(l.batch_size.into()));
            } else {
                t.insert("test_batch_size", Item::Value(l.batch_size.into()));
            }
        }
        t.insert("shuffle", Item::Value(false.into()));
        if let (Some(a), Some(b)) = (train, test) {
            self.same_transform(a, b)?;
            if b.mirror && b.phase == PhaseRule::Test {
                return Err(self.err(
                    b.pos,
                    &format!("layer {} (Data)", b.name),
                    "`mirror: true` in the TEST phase: p2ptrain never mirrors test records",
                ));
            }
        }
        for (key, values) in group(&first.transform) {
            t.insert(&key, Item::Value(values));
        }
        if train.is_some_and(|l| l.mirror) {
            t.insert("mirror", Item::Value(true.into()));
        }
        if let Some(n) = first.prefetch {
            t.insert("prefetch", Item::Value(n.into()));
        }
        Ok(t)
    }

    fn source_item(&self, l: &DataLayer) -> Item {
        Item::Value(self.relative(&l.source).display().to_string().into())
    }

    /// The TRAIN and TEST Data layers must transform alike (p2ptrain has one transform).
    fn same_transform(&self, train: &DataLayer, test: &DataLayer) -> Result<()> {
        let text = |l: &DataLayer| {
            let mut v: Vec<String> = l
                .transform
                .iter()
                .map(|(k, v, _)| format!("{k}={}", v.to_string().trim()))
                .collect();
            v.sort();
            v
        };
        if text(train) != text(test) {
            return Err(self.err(
                test.pos,
                &format!("layer {} (Data)", test.name),
                format!(
                    "its transform_param ({}) differs from the TRAIN layer's ({}): p2ptrain \
                     applies one transform to both phases",
                    text(test).join(", "),
                    text(train).join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// One non-data layer.
    fn layer(&mut self, pos: TextPos, block: &Message, ty: &str) -> Result<ImportedLayer> {
        let name = required_string(self.path, pos, block, "name", "layer")?.to_string();
        let what = format!("layer {name} ({ty})");
        let kind = kind_of_caffe_type(ty).ok_or_else(|| {
            let pos = block.last("type").map_or(pos, |f| f.pos);
            self.err(
                pos,
                &what,
                format!(
                    "type {ty} is not supported by p2ptrain (supported: Data, {})",
                    supported_types().join(", ")
                ),
            )
        })?;
        let mut table = Table::new();
        table.insert("name", name.as_str().into());
        table.insert("type", super::kind_name(kind).as_str().into());
        for key in ["bottom", "top"] {
            table.insert(key, Item::Value(self.blobs(block, key, &what)?.into()));
        }
        if let Some(p) = self.phase(block, &what)?.name() {
            table.insert("phase", p.into());
        }
        let entries = self.keys(block, ty, &what)?;
        let allowed = LayerParams::keys(kind);
        if let Some((key, _, at)) = entries.iter().find(|(k, _, _)| {
            !allowed.contains(&k.as_str()) && !matches!(k.as_str(), "lr_mult" | "decay_mult")
        }) {
            return Err(self.err(
                *at,
                &what,
                format!("`{key}` is not supported by p2ptrain's {ty}"),
            ));
        }
        for (key, value) in group(&entries) {
            table.insert(&key, Item::Value(value));
        }
        let config = resolve(self.path, &what, &table, &entries, pos)?;
        Ok(ImportedLayer {
            name,
            kind,
            caffe_type: ty.to_string(),
            pos,
            table,
            config,
        })
    }

    /// The blobs a layer names under `key` (`bottom`, `top`), the Data layers' tops renamed
    /// `data` and `label`.
    fn blobs(&self, block: &Message, key: &str, what: &str) -> Result<Array> {
        let mut list = Array::new();
        for f in block.all(key) {
            let b = f.string().map_err(|e| self.err(f.pos, what, e))?;
            if ["data", "label"].contains(&b) && !self.renames.contains_key(b) {
                return Err(self.err(
                    f.pos,
                    what,
                    format!(
                        "blob `{b}`: p2ptrain's inputs are named `data` and `label`; rename this \
                         blob"
                    ),
                ));
            }
            list.push(self.renames.get(b).map_or(b, String::as_str));
        }
        Ok(list)
    }

    /// A layer's keys beyond its wiring: `loss_weight`, the fields of its `*_param` blocks and
    /// its `param` blocks, each with the position it came from.
    fn keys(&mut self, block: &Message, ty: &str, what: &str) -> Result<Entries> {
        let mut entries: Entries = Vec::new();
        for f in &block.fields {
            let bad = |m: String| self.err(f.pos, what, m);
            match f.name.as_str() {
                "name" | "type" | "bottom" | "top" | "include" | "exclude" | "param" => {}
                "loss_weight" => {
                    entries.push(("loss_weight".into(), f.float().map_err(bad)?.into(), f.pos))
                }
                "propagate_down" if f.boolean().map_err(bad)? => {}
                "propagate_down" => {
                    return Err(bad(
                        "`propagate_down: false` is not supported (p2ptrain decides which \
                         bottoms get gradients)"
                            .into(),
                    ))
                }
                n if n.ends_with("_param") && applies(n, ty) => {
                    flatten_param(self.path, what, f.message().map_err(bad)?, &mut entries)?;
                }
                n if n.ends_with("_param") => self.warnings.push(format!(
                    "{}:{}: {what}: `{n}` ignored (it does not apply to type {ty}; Caffe ignores \
                     it too)",
                    self.path.display(),
                    f.pos
                )),
                other => return Err(bad(format!("`{other}` is not supported"))),
            }
        }
        self.param_specs(block, what, &mut entries)?;
        Ok(entries)
    }

    /// `param { lr_mult decay_mult }` blocks → the `lr_mult` and `decay_mult` lists.
    fn param_specs(&self, block: &Message, what: &str, out: &mut Entries) -> Result<()> {
        let specs: Vec<&Field> = block.all("param").collect();
        if specs.is_empty() {
            return Ok(());
        }
        let (mut lr, mut decay) = (Array::new(), Array::new());
        for f in &specs {
            let m = f.message().map_err(|e| self.err(f.pos, what, e))?;
            let (mut l, mut d) = (1.0, 1.0);
            for g in &m.fields {
                let bad = |e: String| self.err(g.pos, what, e);
                match g.name.as_str() {
                    "lr_mult" => l = g.float().map_err(bad)?,
                    "decay_mult" => d = g.float().map_err(bad)?,
                    "name" => {
                        return Err(bad(
                            "`param { name }`: shared parameters are not supported".into()
                        ))
                    }
                    other => return Err(bad(format!("`param {{ {other} }}` is not supported"))),
                }
            }
            lr.push(l);
            decay.push(d);
        }
        let pos = specs[0].pos;
        out.push(("lr_mult".into(), lr.into(), pos));
        out.push(("decay_mult".into(), decay.into(), pos));
        Ok(())
    }
}

/// `[data]` of a deploy net, which has an Input layer and no Data layer: synthetic records of
/// the Input's `(C, H, W)` in batches of its `N`, a placeholder that `predict --input` replaces
/// with its inputs (and that `train` or `test` would read until `[data]` is edited).
fn deploy_data_table(input: &ImportedLayer) -> Table {
    let shape = input.config.shape.clone().unwrap_or_default();
    let batch = shape.first().copied().unwrap_or(1);
    let mut t = Table::new();
    t.insert("format", "synthetic".into());
    t.insert(
        "shape",
        Item::Value(Array::from_iter(shape.iter().skip(1).copied()).into()),
    );
    for key in ["batch_size", "train_size", "test_size"] {
        t.insert(key, Item::Value(batch.into()));
    }
    t
}

/// Whether the block `param` (`pooling_param`) belongs to a layer of Caffe type `ty`: its own
/// (`<type>_param`, compared as `super::folded` does), `loss_param`, or the ones Caffe shares
/// (`softmax_param` for SoftmaxWithLoss, `convolution_param` for Deconvolution).
fn applies(param: &str, ty: &str) -> bool {
    let block = super::folded(param.trim_end_matches("_param"));
    let ty = super::folded(ty);
    block == ty
        || block == "loss"
        || (block == "softmax" && ty == "softmaxwithloss")
        || (block == "convolution" && ty == "deconvolution")
}

/// Keys whose value is a list even when written once.
const LIST_KEYS: &[&str] = &[
    "coeff",
    "shape",
    "mean_value",
    "lr_mult",
    "decay_mult",
    "slice_point",
];

/// Fields given as a height and a width: (height field, width field, p2ptrain key).
const PAIRS: &[(&str, &str, &str)] = &[
    ("kernel_h", "kernel_w", "kernel_size"),
    ("pad_h", "pad_w", "pad"),
    ("stride_h", "stride_w", "stride"),
];

/// The fields of one `*_param` block as layer keys, into `out`.
fn flatten_param(path: &Path, what: &str, m: &Message, out: &mut Entries) -> Result<()> {
    let mut pairs: HashMap<String, (i64, TextPos)> = HashMap::new();
    for g in &m.fields {
        let bad = |e: String| text_error(path, g.pos, what, e);
        let name = g.name.as_str();
        let value: toml_edit::Value = match name {
            "engine" => continue, // an implementation choice, not a semantic one
            "kernel_h" | "kernel_w" | "pad_h" | "pad_w" | "stride_h" | "stride_w" => {
                pairs.insert(name.to_string(), (g.int().map_err(bad)?, g.pos));
                continue;
            }
            "round_mode" => match g.ident().map_err(bad)? {
                "CEIL" => continue,
                other => {
                    return Err(bad(format!(
                        "`round_mode: {other}` is not supported (p2ptrain pools with Caffe's \
                         CEIL rule)"
                    )))
                }
            },
            "normalization" => match g.ident().map_err(bad)? {
                "VALID" => continue,
                other => {
                    return Err(bad(format!(
                        "`normalization: {other}` is not supported (p2ptrain's loss divides by \
                         the samples not ignored: VALID)"
                    )))
                }
            },
            "normalize" if g.boolean().map_err(bad)? => continue,
            "concat_dim" | "slice_dim" => {
                out.push(("axis".into(), g.int().map_err(bad)?.into(), g.pos));
                continue;
            }
            "weight_filler" | "bias_filler" | "filler" => filler(path, what, g)?.into(),
            "shape" => {
                let dims = g.message().map_err(bad)?;
                let mut list = Array::new();
                for d in &dims.fields {
                    if d.name != "dim" {
                        return Err(text_error(
                            path,
                            d.pos,
                            what,
                            format!("`shape {{ {} }}` is not supported", d.name),
                        ));
                    }
                    list.push(d.int().map_err(|e| text_error(path, d.pos, what, e))?);
                }
                list.into()
            }
            _ => match &g.value {
                Value::Scalar(s) => scalar_value(s),
                Value::Message(_) => {
                    return Err(bad(format!("`{name} {{ ... }}` is not supported")))
                }
            },
        };
        out.push((name.to_string(), value, g.pos));
    }
    for &(h, w, key) in PAIRS {
        match (pairs.get(h), pairs.get(w)) {
            (None, None) => {}
            (Some(&(hv, pos)), Some(&(wv, _))) => {
                out.push((key.into(), Array::from_iter([hv, wv]).into(), pos))
            }
            (Some(&(_, pos)), None) | (None, Some(&(_, pos))) => {
                return Err(text_error(
                    path,
                    pos,
                    what,
                    format!("`{h}` and `{w}` go together"),
                ))
            }
        }
    }
    Ok(())
}

/// A filler block as an inline table.
fn filler(path: &Path, what: &str, f: &Field) -> Result<InlineTable> {
    let m = f.message().map_err(|e| text_error(path, f.pos, what, e))?;
    let mut t = InlineTable::new();
    for g in &m.fields {
        let bad = |e: String| text_error(path, g.pos, what, e);
        let value: toml_edit::Value = match g.name.as_str() {
            "type" => g.string().map_err(bad)?.into(),
            "value" | "min" | "max" | "mean" | "std" => g.float().map_err(bad)?.into(),
            "variance_norm" => g.ident().map_err(bad)?.to_ascii_lowercase().into(),
            "sparse" if g.int().map_err(bad)? < 0 => continue,
            other => return Err(bad(format!("`{}.{other}` is not supported", f.name))),
        };
        t.insert(&g.name, value);
    }
    Ok(t)
}

/// A scalar as a TOML value: integers stay integers, `true`/`false` booleans, enum values
/// lower-cased strings.
fn scalar_value(s: &Scalar) -> toml_edit::Value {
    match s {
        Scalar::Number(n) => match n.parse::<i64>() {
            Ok(i) => i.into(),
            Err(_) => {
                let f = Field {
                    name: String::new(),
                    pos: TextPos::default(),
                    value: Value::Scalar(s.clone()),
                };
                f.float().unwrap_or(f64::NAN).into()
            }
        },
        Scalar::Ident(i) if i == "true" => true.into(),
        Scalar::Ident(i) if i == "false" => false.into(),
        Scalar::Ident(i) => i.to_ascii_lowercase().into(),
        Scalar::Str(s) => s.as_str().into(),
    }
}

/// Entries grouped by key, in first-seen order: a key seen once is its value (a list for
/// [`LIST_KEYS`]), a repeated key a list of its values.
fn group(entries: &[(String, toml_edit::Value, TextPos)]) -> Vec<(String, toml_edit::Value)> {
    let mut order: Vec<String> = Vec::new();
    let mut values: HashMap<&str, Vec<toml_edit::Value>> = HashMap::new();
    for (k, v, _) in entries {
        if !values.contains_key(k.as_str()) {
            order.push(k.clone());
        }
        values.entry(k).or_default().push(v.clone());
    }
    order
        .into_iter()
        .map(|k| {
            let mut vs = values.remove(k.as_str()).unwrap_or_default();
            let value = match vs.len() {
                1 if !LIST_KEYS.contains(&k.as_str())
                    || matches!(vs[0], toml_edit::Value::Array(_)) =>
                {
                    vs.remove(0)
                }
                _ => Array::from_iter(vs).into(),
            };
            (k, value)
        })
        .collect()
}

/// The layer `table` read as a config file's `[[layer]]` and resolved; an error names the key's
/// line (from `entries`) or the layer's (`pos`).
fn resolve(
    path: &Path,
    what: &str,
    table: &Table,
    entries: &Entries,
    pos: TextPos,
) -> Result<LayerConfig> {
    let line_of = |key: &str| {
        let first = key.split(['.', '[']).next().unwrap_or(key);
        entries
            .iter()
            .find(|(k, _, _)| k == first)
            .map_or(pos, |(_, _, p)| *p)
    };
    let config: LayerConfig = match toml::from_str(&table.to_string()) {
        Ok(c) => c,
        Err(_) => {
            // Blame the first key that fails on its own.
            for (key, item) in table.iter() {
                let mut one = Table::new();
                for k in ["name", "type"] {
                    if let Some(v) = table.get(k) {
                        one.insert(k, v.clone());
                    }
                }
                one.insert(key, item.clone());
                if let Err(e) = toml::from_str::<LayerConfig>(&one.to_string()) {
                    return Err(text_error(
                        path,
                        line_of(key),
                        what,
                        format!("`{key}`: {}", e.message()),
                    ));
                }
            }
            return Err(text_error(
                path,
                pos,
                what,
                "cannot be read as a p2ptrain layer",
            ));
        }
    };
    LayerParams::resolve(&config).map_err(|e| {
        text_error(
            path,
            line_of(&e.key),
            what,
            format!("`{}`: {}", e.key, e.msg),
        )
    })?;
    Ok(config)
}

/// Every bottom of a layer is `data`, `label` or a top of an earlier layer.
fn check_wiring(path: &Path, layers: &[ImportedLayer]) -> Result<()> {
    let mut seen: Vec<&str> = vec!["data", "label"];
    for l in layers {
        if let Some(b) = l.config.bottom.iter().find(|b| !seen.contains(&b.as_str())) {
            return Err(text_error(
                path,
                l.pos,
                l.label(),
                format!("bottom `{b}` is produced by no earlier layer"),
            ));
        }
        seen.extend(l.config.top.iter().map(String::as_str));
    }
    Ok(())
}

/// `target` relative to the folder `base` (`../data/x` from `out/` for `data/x`), made from
/// absolute, lexically normalised forms of both; `target` as given when either cannot be made
/// absolute.
pub fn relative_path(target: &Path, base: &Path) -> PathBuf {
    let (Ok(t), Ok(b)) = (std::path::absolute(target), std::path::absolute(base)) else {
        return target.to_path_buf();
    };
    let (t, b) = (normalise(&t), normalise(&b));
    let common = t
        .components()
        .zip(b.components())
        .take_while(|(x, y)| x == y)
        .count();
    let mut rel = PathBuf::new();
    for _ in b.components().skip(common) {
        rel.push("..");
    }
    for c in t.components().skip(common) {
        rel.push(c);
    }
    if rel.as_os_str().is_empty() {
        rel.push(".");
    }
    rel
}

/// `p` with `.` and `..` components resolved lexically.
fn normalise(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caffe::prototxt::parse;

    fn read_text(text: &str) -> Result<ImportedNet> {
        let net = parse(text).unwrap();
        read(Path::new("/nets/n.prototxt"), &net, Path::new("/nets/out"))
    }

    const DATA: &str = r#"
layer { name: "d" type: "Data" top: "img" top: "lbl" include { phase: TRAIN }
  transform_param { scale: 0.5 mirror: true } data_param { source: "train_lmdb" batch_size: 8 backend: LMDB } }
layer { name: "d" type: "Data" top: "img" top: "lbl" include { phase: TEST }
  transform_param { scale: 0.5 } data_param { source: "/data/test_lmdb" batch_size: 4 } }
"#;

    #[test]
    fn data_layers_become_the_data_table_and_their_tops_data_and_label() {
        let net = read_text(&format!(
            "{DATA}layer {{ name: \"ip\" type: \"InnerProduct\" bottom: \"img\" top: \"ip\"
               param {{ lr_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
               inner_product_param {{ num_output: 10 weight_filler {{ type: \"xavier\" variance_norm: AVERAGE }} }} }}
             layer {{ name: \"loss\" type: \"SoftmaxWithLoss\" bottom: \"ip\" bottom: \"lbl\" top: \"loss\" }}"
        ))
        .unwrap();
        let d = net.data.to_string();
        for line in [
            "format = \"lmdb\"",
            "train_source = \"../train_lmdb\"",
            "test_source = \"../../data/test_lmdb\"",
            "batch_size = 8",
            "test_batch_size = 4",
            "shuffle = false",
            "scale = 0.5",
            "mirror = true",
        ] {
            assert!(d.contains(line), "{line} in\n{d}");
        }
        let ip = &net.layers[0].config;
        assert_eq!(ip.bottom, ["data"]);
        assert_eq!(ip.num_output, Some(10));
        assert_eq!(ip.lr_mult, Some(vec![1.0, 2.0]));
        assert_eq!(ip.decay_mult, Some(vec![1.0, 0.0]));
        let wf = ip.weight_filler.as_ref().unwrap();
        assert_eq!(wf.kind, crate::config::FillerKind::Xavier);
        assert_eq!(wf.variance_norm, crate::config::VarianceNorm::Average);
        assert_eq!(net.layers[1].config.bottom, ["ip", "label"]);
    }

    #[test]
    fn spatial_pairs_enums_and_phases_are_translated() {
        let net = read_text(&format!(
            "{DATA}layer {{ name: \"c\" type: \"Convolution\" bottom: \"img\" top: \"c\" exclude {{ phase: TEST }}
               convolution_param {{ num_output: 4 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 engine: CUDNN }} }}
             layer {{ name: \"p\" type: \"Pooling\" bottom: \"c\" top: \"p\" pooling_param {{ pool: AVE kernel_size: 2 stride: 2 }} }}"
        ))
        .unwrap();
        let c = &net.layers[0].config;
        assert_eq!(
            c.kernel_size,
            Some(crate::config::Dims::PerAxis(vec![3, 1]))
        );
        assert_eq!(c.pad, Some(crate::config::Dims::PerAxis(vec![1, 0])));
        assert_eq!(c.phase, Some(crate::config::Phase::Train));
        assert_eq!(
            net.layers[1].config.pool,
            Some(crate::config::PoolMethod::Ave)
        );
    }

    #[test]
    fn elu_prelu_lrn_arg_max_and_euclidean_loss_take_their_params() {
        let net = read_text(&format!(
            "{DATA}layer {{ name: \"e\" type: \"ELU\" bottom: \"img\" top: \"e\" elu_param {{ alpha: 0.5 }} }}
             layer {{ name: \"p\" type: \"PReLU\" bottom: \"e\" top: \"p\"
               prelu_param {{ channel_shared: true filler {{ type: \"constant\" value: 0.1 }} }} }}
             layer {{ name: \"n\" type: \"LRN\" bottom: \"p\" top: \"n\"
               lrn_param {{ local_size: 3 alpha: 0.001 beta: 0.5 k: 2 norm_region: WITHIN_CHANNEL engine: CUDNN }} }}
             layer {{ name: \"a\" type: \"ArgMax\" bottom: \"n\" top: \"a\" argmax_param {{ top_k: 2 out_max_val: true axis: 1 }} }}
             layer {{ name: \"l\" type: \"EuclideanLoss\" bottom: \"n\" bottom: \"img\" top: \"l\" loss_weight: 0.5 }}"
        ))
        .unwrap();
        let params: Vec<LayerParams> = net
            .layers
            .iter()
            .map(|l| l.config.params().unwrap())
            .collect();
        let [LayerParams::Elu(e), LayerParams::Prelu(p), LayerParams::Lrn(n), LayerParams::ArgMax(a), LayerParams::EuclideanLoss(_)] =
            params.as_slice()
        else {
            panic!("{params:?}")
        };
        assert_eq!(e.alpha, 0.5);
        assert!(p.channel_shared);
        assert_eq!(p.filler.value, 0.1);
        assert_eq!(
            (n.local_size, n.alpha, n.beta, n.k, n.norm_region),
            (3, 0.001, 0.5, 2.0, crate::config::NormRegion::WithinChannel)
        );
        assert_eq!((a.top_k, a.out_max_val, a.axis), (2, true, Some(1)));
        assert_eq!(net.layers[4].config.loss_weight, Some(0.5));
    }

    #[test]
    fn what_p2ptrain_lacks_is_named_with_layer_type_and_line() {
        let cases = [
            ("layer { name: \"n\" type: \"BNLL\" bottom: \"img\" top: \"n\" }", 6, "type BNLL is not supported"),
            ("layer { name: \"n\" type: \"LRN\" bottom: \"img\" top: \"n\"\n lrn_param { local_size: 4 } }", 7, "`local_size`: must be odd"),
            ("layer { name: \"a\" type: \"ArgMax\" bottom: \"img\" top: \"a\"\n argmax_param { top_k: 0 } }", 7, "`top_k`"),
            ("layer { name: \"p\" type: \"Pooling\" bottom: \"img\" top: \"p\"\n pooling_param { pool: STOCHASTIC kernel_size: 2 } }", 7, "`pool`"),
            ("layer { name: \"c\" type: \"Convolution\" bottom: \"img\" top: \"c\"\n param { name: \"w\" } convolution_param { num_output: 2 kernel_size: 1 } }", 7, "shared parameters"),
            ("layer { name: \"i\" type: \"InnerProduct\" bottom: \"img\" top: \"i\"\n inner_product_param { num_output: 2 transpose: true } }", 7, "`transpose` is not supported"),
            ("layer { name: \"i\" type: \"InnerProduct\" bottom: \"nothing\" top: \"i\"\n inner_product_param { num_output: 2 } }", 6, "bottom `nothing`"),
            ("layer { name: \"i\" type: \"InnerProduct\" bottom: \"img\" top: \"i\"\n inner_product_param { num_output: 0 } }", 7, "num_output"),
        ];
        for (layer, line, what) in cases {
            let e = read_text(&format!("{DATA}{layer}")).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(&format!("n.prototxt:{line}:")), "{text}");
            assert!(text.contains(what), "{what} in {text}");
            assert!(text.contains("layer "), "{text}");
            assert_eq!(e.exit_code(), 2);
        }
    }

    #[test]
    fn legacy_v1_nets_and_deploy_inputs_are_refused_with_what_to_do() {
        let e = read_text("name: \"x\"\nlayers { name: \"a\" type: CONVOLUTION }").unwrap_err();
        assert!(e.to_string().contains("upgrade_net_proto_text"), "{e}");
        assert!(e.to_string().contains(":2:1"), "{e}");
        let e = read_text("input: \"data\"\ninput_dim: 1").unwrap_err();
        assert!(e.to_string().contains("Input layer"), "{e}");
    }

    /// A deploy net: its Input layer stays an `input` layer with its top renamed `data`, and
    /// `[data]` is a synthetic placeholder of the Input's shape.
    #[test]
    fn deploy_nets_keep_their_input_layer_and_get_a_synthetic_data_table() {
        let net = read_text(
            "layer { name: \"in\" type: \"Input\" top: \"image\"
               input_param { shape { dim: 10 dim: 3 dim: 8 dim: 6 } } }
             layer { name: \"ip\" type: \"InnerProduct\" bottom: \"image\" top: \"ip\"
               inner_product_param { num_output: 4 } }
             layer { name: \"prob\" type: \"Softmax\" bottom: \"ip\" top: \"prob\" }",
        )
        .unwrap();
        let input = &net.layers[0].config;
        assert_eq!(input.kind, LayerKind::Input);
        assert_eq!(input.top, ["data"]);
        assert_eq!(input.shape, Some(vec![10, 3, 8, 6]));
        assert_eq!(net.layers[1].config.bottom, ["data"]);
        let d = net.data.to_string();
        for line in [
            "format = \"synthetic\"",
            "shape = [3, 8, 6]",
            "batch_size = 10",
            "test_size = 10",
        ] {
            assert!(d.contains(line), "{line} in\n{d}");
        }
        let e = read_text("layer { name: \"in\" type: \"Input\" top: \"x\" input_param { shape { dim: 2 dim: 3 } } }")
            .unwrap_err();
        assert!(
            e.to_string().contains("`shape`") && e.to_string().contains(":1:"),
            "{e}"
        );
    }

    /// Split, Slice, Silence and Deconvolution keep Caffe's keys (`slice_point` a list even
    /// when written once; Deconvolution reads `convolution_param`).
    #[test]
    fn split_slice_silence_and_deconvolution_are_translated() {
        let net = read_text(&format!(
            "{DATA}layer {{ name: \"s\" type: \"Split\" bottom: \"img\" top: \"a\" top: \"b\" }}
             layer {{ name: \"up\" type: \"Deconvolution\" bottom: \"a\" top: \"up\"
               param {{ lr_mult: 1 }} param {{ lr_mult: 2 }}
               convolution_param {{ num_output: 3 kernel_size: 4 stride: 2 pad: 1 group: 1
                 weight_filler {{ type: \"gaussian\" std: 0.01 }} bias_filler {{ type: \"constant\" value: 0.2 }} }} }}
             layer {{ name: \"cut\" type: \"Slice\" bottom: \"up\" top: \"x\" top: \"y\"
               slice_param {{ slice_dim: 2 slice_point: 3 }} }}
             layer {{ name: \"quiet\" type: \"Silence\" bottom: \"b\" bottom: \"x\" }}"
        ))
        .unwrap();
        let kinds: Vec<LayerKind> = net.layers.iter().map(|l| l.kind).collect();
        let want = [
            LayerKind::Split,
            LayerKind::Deconvolution,
            LayerKind::Slice,
            LayerKind::Silence,
        ];
        assert_eq!(kinds, want);
        assert_eq!(net.layers[0].config.top, ["a", "b"]);
        let up = &net.layers[1].config;
        assert_eq!(up.num_output, Some(3));
        assert_eq!(up.stride, Some(crate::config::Dims::One(2)));
        assert_eq!(up.lr_mult, Some(vec![1.0, 2.0]));
        assert_eq!(up.bias_filler.as_ref().map(|f| f.value), Some(0.2));
        let cut = &net.layers[2].config;
        assert_eq!(
            (cut.axis, cut.slice_point.clone()),
            (Some(2), Some(vec![3]))
        );
        assert_eq!(net.layers[3].config.bottom, ["b", "x"]);
        assert!(net.layers[3].config.top.is_empty());
    }

    #[test]
    fn relative_paths_climb_out_of_the_output_folder() {
        assert_eq!(
            relative_path(Path::new("/a/b/c"), Path::new("/a/d")),
            Path::new("../b/c")
        );
        assert_eq!(
            relative_path(Path::new("/a/./b/../c"), Path::new("/a")),
            Path::new("c")
        );
        assert_eq!(
            relative_path(Path::new("/a"), Path::new("/a")),
            Path::new(".")
        );
    }
}
