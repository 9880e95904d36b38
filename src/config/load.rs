//! Reading a config: the file (or an embedded string) as UTF-8 text, the `--set section.key=value`
//! overrides applied to its `toml_edit` document, deserialisation into [`Config`] with every
//! error turned into `file:line:col: `dotted.key`: message` (unknown keys and values get the
//! nearest valid name suggested), and relative data paths resolved against the config's
//! directory. The whole-config validation (ranges, data file headers, the layer graph and its
//! shapes) is [`crate::validate`]'s: `validate::load` runs both, and is what callers use.
//!
//! ```no_run
//! use p2ptrain::config;
//! use std::path::Path;
//! let sets = vec!["solver.base_lr=0.1".to_string(), "layer[0].num_output=64".to_string()];
//! let (config, source) = config::parse(Path::new("cluster.toml"), &sets)?;
//! assert_eq!(config.solver.base_lr, 0.1);
//! # Ok::<(), p2ptrain::error::Error>(())
//! ```
//!
//! Overrides keep every other key where it was: errors about keys of the file point into the
//! file as written, errors about an overridden key name the `--set` argument instead.

use super::locate::{key_at, key_near, line_col, locate, set_error, KeyPath, Seg};
use super::Config;
use crate::error::{Error, Result};
use crate::input_file::read_regular;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use toml_edit::{DocumentMut, InlineTable, Item, TableLike, Value};

/// A config text and where it came from.
#[derive(Debug, Clone)]
pub struct Source {
    /// The config file as given, or the name of an embedded config.
    pub path: PathBuf,
    /// The text as read, before `--set` overrides (positions in errors refer to it).
    pub text: String,
    /// The `--set` overrides applied on top of `text`, in order: (dotted key, argument as given),
    /// e.g. `("layer[0].num_output", "layer.0.num_output=64")`.
    pub overrides: Vec<(String, String)>,
}

/// Largest config file read (16 MiB); a config is a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The top-level tables a `--set` may address.
const SECTIONS: [&str; 4] = ["cluster", "data", "solver", "layer"];

/// Reads, overrides and deserialises the config file at `path` (not yet validated as a whole:
/// see `validate::load`). Relative data paths
/// in the file are resolved against the file's directory; relative paths given by `--set`
/// against the current directory.
pub fn parse(path: &Path, sets: &[String]) -> Result<(Config, Source)> {
    let bytes = read_regular(path, MAX_CONFIG_BYTES).map_err(|e| {
        Error::Usage(format!(
            "{}: cannot read the config file: {e}",
            path.display()
        ))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    parse_owned(path.to_path_buf(), bytes, dir, sets)
}

/// Like [`parse`], for a config file's bytes held in memory (which need not be UTF-8: that is
/// reported as for a file): `name` stands for the file in messages and relative data paths are
/// resolved against `base_dir`. Never panics, whatever the bytes (the fuzz targets' entry).
pub fn parse_bytes(
    name: &str,
    bytes: &[u8],
    base_dir: &Path,
    sets: &[String],
) -> Result<(Config, Source)> {
    parse_owned(PathBuf::from(name), bytes.to_vec(), base_dir, sets)
}

fn parse_owned(
    path: PathBuf,
    bytes: Vec<u8>,
    base_dir: &Path,
    sets: &[String],
) -> Result<(Config, Source)> {
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            return Err(utf8_error(
                &path,
                e.as_bytes(),
                e.utf8_error().valid_up_to(),
            ))
        }
    };
    parse_text(path, text, base_dir, sets)
}

/// Like [`parse`], for a config held in memory: `name` stands for the file in messages and
/// relative data paths are resolved against `base_dir`.
pub fn parse_str(
    name: &str,
    text: &str,
    base_dir: &Path,
    sets: &[String],
) -> Result<(Config, Source)> {
    parse_text(PathBuf::from(name), text.to_string(), base_dir, sets)
}

fn parse_text(
    path: PathBuf,
    text: String,
    base_dir: &Path,
    sets: &[String],
) -> Result<(Config, Source)> {
    let file = path.display().to_string();
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| syntax_error(&file, &text, &e))?;
    let mut overrides = Vec::new();
    for arg in sets {
        overrides.push((apply_set(&mut doc, arg)?, arg.clone()));
    }
    let source = Source {
        path,
        text,
        overrides,
    };
    let effective = if sets.is_empty() {
        Cow::Borrowed(source.text.as_str())
    } else {
        Cow::Owned(doc.to_string())
    };
    let mut config: Config =
        toml::from_str(&effective).map_err(|e| deserialize_error(&source, &effective, &e))?;
    resolve_paths(&mut config, &source, base_dir);
    Ok((config, source))
}

/// The key to name when no key can be found.
fn or_top_level(key: KeyPath) -> String {
    if key.is_empty() {
        "(top level)".into()
    } else {
        key.to_string()
    }
}

fn utf8_error(path: &Path, bytes: &[u8], valid_up_to: usize) -> Error {
    let lossy = String::from_utf8_lossy(bytes);
    Error::Config {
        file: path.display().to_string(),
        pos: Some(line_col(&lossy, valid_up_to)),
        key: or_top_level(key_near(&lossy, valid_up_to)),
        msg: format!(
            "not valid UTF-8 (byte 0x{:02x}); a config file must be UTF-8 text",
            bytes[valid_up_to]
        ),
    }
}

/// One line of `toml_edit`'s multi-line parser message.
fn one_line(msg: &str) -> String {
    msg.trim()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn syntax_error(file: &str, text: &str, e: &toml_edit::TomlError) -> Error {
    let at = e.span().map_or(0, |s| s.start);
    Error::Config {
        file: file.to_string(),
        pos: Some(line_col(text, at)),
        key: or_top_level(key_near(text, at)),
        msg: format!("TOML syntax: {}", one_line(e.message())),
    }
}

/// Turns a deserialisation error about `effective` (the text after overrides) into a config
/// error naming the dotted key, positioned in the original text or naming the `--set` argument.
fn deserialize_error(source: &Source, effective: &str, e: &toml::de::Error) -> Error {
    let span = e.span().unwrap_or(0..0);
    let (key, msg) = explain(key_at(effective, &span), &one_line(e.message()));
    let key_str = or_top_level(key.clone());
    if let Some(arg) = source.override_of(&key_str) {
        return set_error(&key_str, format!("{msg} (from `--set {arg}`)"));
    }
    let pos = if span.is_empty() && key.0.len() <= 1 {
        None // a missing section: nowhere in the file
    } else if source.overrides.is_empty() {
        Some(line_col(effective, span.start))
    } else {
        locate(&source.text, &key)
    };
    Error::Config {
        file: source.path.display().to_string(),
        pos,
        key: key_str,
        msg,
    }
}

/// The backticked words of serde's "expected one of `a`, `b`" tail.
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

/// The candidate nearest to `name`, if it is near enough to be a likely typo.
fn nearest<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(name, c), *c))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, c)| *d <= (name.len().min(c.len()) / 3).max(1))
        .map(|(_, c)| c)
}

/// Rewrites serde's message for the value at `at` into (dotted key, message).
fn explain(at: KeyPath, msg: &str) -> (KeyPath, String) {
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let (name, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected = backticked(tail);
        let key = if at.last_key() == Some(name) {
            at
        } else {
            at.join(name)
        };
        let what = if key.0.len() == 1 {
            "unknown section"
        } else {
            "unknown key"
        };
        let hint = match nearest(name, &expected) {
            Some(c) => format!("did you mean `{c}`?"),
            None if expected.is_empty() => "this table takes no keys".into(),
            None => format!("expected one of `{}`", expected.join("`, `")),
        };
        return (key, format!("{what}; {hint}"));
    }
    if let Some(rest) = msg.strip_prefix("unknown variant `") {
        let (name, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected = backticked(tail);
        let hint = match nearest(name, &expected) {
            Some(c) => format!("did you mean \"{c}\"?"),
            None => format!("expected one of \"{}\"", expected.join("\", \"")),
        };
        return (at, format!("unknown value \"{name}\"; {hint}"));
    }
    if let Some(rest) = msg.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or(rest);
        let key = at.join(name);
        let msg = match (key.0.len(), name) {
            (1, "layer") => "no [[layer]] tables; the net needs at least one layer".to_string(),
            (1, _) => format!("missing section [{name}]"),
            _ => "missing required key".to_string(),
        };
        return (key, msg);
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            if let Some((found, expected)) = rest.rsplit_once(", expected ") {
                return (
                    at,
                    format!("expected {}, found {found}", friendly(expected)),
                );
            }
        }
    }
    (at, msg.to_string())
}

/// serde's type names in the config's words.
fn friendly(expected: &str) -> &str {
    match expected {
        "f32" | "f64" => "a number",
        "usize" | "u64" | "u32" | "u16" | "u8" => "a non-negative integer",
        "i64" | "i32" | "isize" => "an integer",
        "a boolean" => "true or false",
        "a sequence" => "an array",
        e if e.starts_with("struct ") => "a table",
        e => e,
    }
}

/// Applies one `--set key=value` to `doc` and returns the dotted key it set.
fn apply_set(doc: &mut DocumentMut, arg: &str) -> Result<String> {
    let bad = |key: &str, msg: String| set_error(key, format!("{msg} (in `--set {arg}`)"));
    let Some((key, value)) = arg.split_once('=') else {
        return Err(bad(
            arg.trim(),
            "expected `section.key=value`, e.g. `solver.base_lr=0.1`".into(),
        ));
    };
    let key = key.trim();
    let path = KeyPath::parse(key).map_err(|e| bad(key, format!("not a key path: {e}")))?;
    let section = match path.0.first() {
        Some(Seg::Key(s)) => s.as_str(),
        _ => return Err(bad(key, "a key path starts with a section name".into())),
    };
    if !SECTIONS.contains(&section) {
        let hint = match nearest(section, &SECTIONS) {
            Some(c) => format!("did you mean `{c}`?"),
            None => format!("expected one of `{}`", SECTIONS.join("`, `")),
        };
        return Err(bad(key, format!("unknown section `{section}`; {hint}")));
    }
    if section == "layer" && !matches!(path.0.get(1), Some(Seg::Index(_))) {
        return Err(bad(
            key,
            "`layer` is an array of tables; pick one by index, e.g. `layer[0].num_output=64`"
                .into(),
        ));
    }
    if path.0.len() < 2 || (section == "layer" && path.0.len() < 3) {
        return Err(bad(
            key,
            "name a key inside the section, e.g. `solver.base_lr`".into(),
        ));
    }
    let value = parse_value(value.trim()).ok_or_else(|| {
        bad(
            key,
            format!(
                "`{}` is not a TOML value (quote text: key='text')",
                value.trim()
            ),
        )
    })?;
    let canonical = path.to_string();
    set_item(doc.as_item_mut(), &path.0, value, &mut Vec::new())
        .map_err(|msg| bad(&canonical, msg))?;
    Ok(canonical)
}

/// A TOML value, or a bare word such as `adam` or `inner_product` taken as a string.
fn parse_value(s: &str) -> Option<Value> {
    if let Ok(v) = s.parse::<Value>() {
        return Some(v);
    }
    let bare = s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    bare.then(|| Value::from(s))
}

/// Sets `path` below `item` to `value`; `done` is the path walked so far, for messages.
fn set_item(
    item: &mut Item,
    path: &[Seg],
    value: Value,
    done: &mut Vec<Seg>,
) -> std::result::Result<(), String> {
    match &path[0] {
        Seg::Key(_) => match item.as_table_like_mut() {
            Some(t) => set_in_table(t, path, value, done),
            None => Err(format!("`{}` is not a table", KeyPath(done.clone()))),
        },
        Seg::Index(i) => {
            let here = KeyPath(done.clone());
            done.push(Seg::Index(*i));
            match item {
                Item::ArrayOfTables(a) => {
                    let n = a.len();
                    let t = a
                        .get_mut(*i)
                        .ok_or_else(|| format!("`{here}` has {n} table(s); there is no [{i}]"))?;
                    if path.len() == 1 {
                        return Err(format!(
                            "a whole table cannot be set; set its keys, e.g. `{here}[{i}].name`"
                        ));
                    }
                    set_in_table(t, &path[1..], value, done)
                }
                Item::Value(Value::Array(a)) => {
                    let n = a.len();
                    let e = a
                        .get_mut(*i)
                        .ok_or_else(|| format!("`{here}` has {n} element(s); there is no [{i}]"))?;
                    if path.len() == 1 {
                        replace_value(e, value);
                        return Ok(());
                    }
                    match e {
                        Value::InlineTable(t) => set_in_table(t, &path[1..], value, done),
                        _ => Err(format!("`{}` is not a table", KeyPath(done.clone()))),
                    }
                }
                _ => Err(format!("`{here}` is not an array")),
            }
        }
    }
}

fn set_in_table(
    t: &mut dyn TableLike,
    path: &[Seg],
    value: Value,
    done: &mut Vec<Seg>,
) -> std::result::Result<(), String> {
    let Seg::Key(k) = &path[0] else {
        return Err(format!("`{}` is not an array", KeyPath(done.clone())));
    };
    done.push(Seg::Key(k.clone()));
    if path.len() == 1 {
        match t.get_mut(k) {
            Some(Item::Value(old)) => replace_value(old, value),
            Some(old) => *old = Item::Value(value),
            None => {
                t.insert(k, Item::Value(value));
            }
        }
        return Ok(());
    }
    if !t.contains_key(k) {
        if let Seg::Index(_) = path[1] {
            return Err(format!("`{}` is not in the config", KeyPath(done.clone())));
        }
        t.insert(k, Item::Value(Value::InlineTable(InlineTable::new())));
    }
    let child = t.get_mut(k).expect("inserted above");
    set_item(child, &path[1..], value, done)
}

/// Replaces `old` by `new`, keeping the spacing and comment around it.
fn replace_value(old: &mut Value, mut new: Value) {
    *new.decor_mut() = old.decor().clone();
    *old = new;
}

/// Makes the data paths (the four IDX paths, the CIFAR-10 file lists, the image sources and
/// their root folder) absolute: relative to `base_dir` when they come from the file,
/// to the current directory when they come from `--set`.
fn resolve_paths(config: &mut Config, source: &Source, base_dir: &Path) {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let base = std::fs::canonicalize(base_dir).unwrap_or_else(|_| cwd.join(base_dir));
    let d = &mut config.data;
    for (name, slot) in [
        ("train_images", &mut d.train_images),
        ("train_labels", &mut d.train_labels),
        ("test_images", &mut d.test_images),
        ("test_labels", &mut d.test_labels),
        ("mean_file", &mut d.mean_file),
        ("train_source", &mut d.train_source),
        ("test_source", &mut d.test_source),
        ("root_folder", &mut d.root_folder),
    ] {
        if let Some(p) = slot.as_mut().filter(|p| p.is_relative()) {
            let from_set = source.override_of(&format!("data.{name}")).is_some();
            let joined = if from_set {
                cwd.join(&*p)
            } else {
                base.join(&*p)
            };
            *p = std::fs::canonicalize(&joined).unwrap_or_else(|_| normalize(&joined));
        }
    }
    for (name, list) in [
        ("train_files", &mut d.train_files),
        ("test_files", &mut d.test_files),
    ] {
        let from_set = source.override_of(&format!("data.{name}")).is_some();
        for p in list.iter_mut().flatten().filter(|p| p.is_relative()) {
            let joined = if from_set {
                cwd.join(&*p)
            } else {
                base.join(&*p)
            };
            *p = std::fs::canonicalize(&joined).unwrap_or_else(|_| normalize(&joined));
        }
    }
}

/// `a/b/../c` → `a/c`, without touching the file system (for paths that do not exist, which
/// are only shown in messages).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `/..` is `/`.
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(c),
            },
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DataFormat, LrPolicy};
    use crate::config_text::{digits_head, mlp};
    use crate::error::Pos;
    use crate::validate::{load, load_str};
    use std::sync::LazyLock;

    /// The digits MLP (32 hidden units, Xavier weights in `ip2`) on the CPU.
    static BASE: LazyLock<String> = LazyLock::new(|| {
        let solver = "base_lr = 0.05 # comment kept\nmax_iter = 100\nlr_policy = \"fixed\"\n";
        let head = digits_head("backend = \"cpu\"\n", solver);
        head + &mlp(32, "weight_filler = { type = \"xavier\" }\n")
    });

    fn sets(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    fn load_base(set: &[&str]) -> Result<(Config, Source)> {
        load_str("base.toml", &BASE, Path::new("."), &sets(set))
    }

    fn err(text: &str, set: &[&str]) -> String {
        let e = load_str("t.toml", text, Path::new("."), &sets(set)).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        e.to_string()
    }

    fn has(e: &str, want: &str) {
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    }

    fn line_of(text: &str, needle: &str) -> usize {
        text[..text.find(needle).unwrap()].matches('\n').count() + 1
    }

    #[test]
    fn loads_the_base_config() {
        let (c, s) = load_base(&[]).unwrap();
        assert_eq!(c.data.format, DataFormat::Digits);
        assert_eq!(c.layers.len(), 4);
        assert_eq!(s.text, *BASE);
        assert!(s.overrides.is_empty());
    }

    #[test]
    fn set_overrides_values_of_every_kind() {
        let (c, s) = load_base(&[
            "solver.base_lr=0.1",
            "data.shuffle=false",
            "cluster.replicas_per_rank=2",
            "layer.0.num_output=64",
            "layer[2].weight_filler={ type = \"gaussian\", std = 0.01 }",
            "layer[2].weight_filler.std=0.02",
            "solver.lr_policy=step",
            "solver.stepsize=10",
            "solver.gamma=0.5",
            "layer[1].top[0]='ip1'",
        ])
        .unwrap();
        assert_eq!(c.solver.base_lr, 0.1);
        assert!(!c.data.shuffle);
        assert_eq!(c.cluster.replicas_per_rank, 2);
        assert_eq!(c.layers[0].num_output, Some(64));
        assert_eq!(c.layers[2].weight_filler.as_ref().unwrap().std, 0.02);
        assert_eq!(c.solver.lr_policy, LrPolicy::Step);
        assert_eq!(s.overrides[3].0, "layer[0].num_output");
        assert_eq!(s.text, *BASE, "the source keeps the file's own text");
    }

    #[test]
    fn set_creates_missing_sections_and_keys() {
        let text = BASE.replace("[cluster]\nbackend = \"cpu\"\n", "");
        let (c, _) = load_str(
            "t.toml",
            &text,
            Path::new("."),
            &sets(&[
                "cluster.replicas_per_rank=3",
                "layer[0].bias_filler.type=constant",
            ]),
        )
        .unwrap();
        assert_eq!(c.cluster.replicas_per_rank, 3);
        assert!(c.layers[0].bias_filler.is_some());
    }

    #[test]
    fn bad_set_arguments_are_named() {
        let cases = [
            ("solver.base_lr", "expected `section.key=value`"),
            ("solver.base_lr=[1,", "is not a TOML value"),
            (
                "solvr.base_lr=1",
                "unknown section `solvr`; did you mean `solver`?",
            ),
            ("layer.num_output=3", "pick one by index"),
            ("layer[9].num_output=3", "has 4 table(s); there is no [9]"),
            ("solver=1", "name a key inside the section"),
            ("solver.base_lr.x=1", "`solver.base_lr` is not a table"),
            ("a b=1", "not a key path"),
        ];
        for (arg, want) in cases {
            let e = err(&BASE, &[arg]);
            assert!(e.starts_with("--set: "), "{arg}: {e}");
            assert!(e.contains(want), "{arg}: {e}");
            assert!(e.contains(&format!("`--set {arg}`")), "{arg}: {e}");
        }
    }

    #[test]
    fn errors_about_overridden_keys_name_the_set() {
        let e = err(&BASE, &["solver.base_lr=abc"]);
        assert!(
            e.starts_with("--set: `solver.base_lr`: expected a number, found string \"abc\""),
            "{e}"
        );
        assert!(e.ends_with("(from `--set solver.base_lr=abc`)"), "{e}");
        let e = err(&BASE, &["solver.base_rl=0.1"]);
        assert!(
            e.contains("`solver.base_rl`: unknown key; did you mean `base_lr`?"),
            "{e}"
        );
        let e = err(&BASE, &["solver.base_lr=-1"]);
        assert!(e.starts_with("--set: `solver.base_lr`: must be"), "{e}");
        let e = err(&BASE, &["layer[0].num_output=0"]);
        assert!(e.starts_with("--set: `layer[0].num_output`"), "{e}");
    }

    #[test]
    fn set_keeps_the_positions_of_other_keys() {
        let text = BASE.replace(
            "num_output = 10\n",
            "num_output = 10\nnegative_slope = 0.1\n",
        );
        let want = format!(
            "t.toml:{}:1: `layer[2].negative_slope`",
            line_of(&text, "negative_slope")
        );
        // Adds a key to [data], two lines above the error, and rewrites an earlier value.
        let e = err(
            &text,
            &["data.test_batch_size=16", "layer[0].num_output=64"],
        );
        assert!(e.starts_with(&want), "{e}");
        let e = err(&text, &[]);
        assert!(e.starts_with(&want), "{e}");
    }

    #[test]
    fn unknown_keys_get_a_suggestion_and_a_position() {
        let text = BASE.replace("base_lr = 0.05", "base_rl = 0.05");
        let e = err(&text, &[]);
        let line = line_of(&text, "base_rl");
        assert_eq!(
            e,
            format!("t.toml:{line}:1: `solver.base_rl`: unknown key; did you mean `base_lr`?")
        );
        has(
            &err(&text.replace("base_rl", "learning_rate"), &[]),
            "unknown key; expected one of `type`, `base_lr`",
        );
        has(
            &err(&BASE.replace("[solver]", "[solvr]"), &[]),
            "`solvr`: unknown section; did you mean `solver`?",
        );
    }

    #[test]
    fn unknown_values_get_a_suggestion() {
        has(
            &err(&BASE.replace("\"xavier\"", "\"xavir\""), &[]),
            "`layer[2].weight_filler.type`: unknown value \"xavir\"; did you mean \"xavier\"?",
        );
        has(
            &err(&BASE.replace("\"relu\"", "\"rectifier\""), &[]),
            "`layer[1].type`: unknown value \"rectifier\"; expected one of",
        );
    }

    #[test]
    fn wrong_types_and_missing_keys() {
        let text = BASE.replace("batch_size = 32", "batch_size = \"32\"");
        let e = err(&text, &[]);
        let line = line_of(&text, "batch_size");
        assert_eq!(
            e,
            format!("t.toml:{line}:14: `data.batch_size`: expected a non-negative integer, found string \"32\"")
        );
        has(
            &err(
                &BASE.replace("bottom = [\"data\"]", "bottom = \"data\""),
                &[],
            ),
            "`layer[0].bottom`: expected an array",
        );
        // A missing key is reported at its table's header.
        has(
            &err(&BASE.replace("max_iter = 100\n", ""), &[]),
            &format!(
                "t.toml:{}:1: `solver.max_iter`: missing required key",
                line_of(&BASE, "[solver]")
            ),
        );
        has(
            &err(&BASE.replace("name = \"relu1\"\n", ""), &[]),
            "`layer[1].name`: missing required key",
        );
        let text: String = BASE.split("[solver]").next().unwrap().to_string();
        assert_eq!(
            err(&text, &[]),
            "t.toml: `solver`: missing section [solver]"
        );
    }

    #[test]
    fn syntax_errors_are_positioned() {
        let text = BASE.replace("base_lr = 0.05", "base_lr = 0.05.1");
        let e = err(&text, &[]);
        let line = line_of(&text, "base_lr");
        assert!(e.starts_with(&format!("t.toml:{line}:")), "{e}");
        assert!(e.contains("`solver.base_lr`: TOML syntax:"), "{e}");
    }

    #[test]
    fn reading_a_file_resolves_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("d");
        std::fs::create_dir(&data).unwrap();
        let digits = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
        for f in [
            "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz",
            "test-images-idx3-ubyte.gz",
            "test-labels-idx1-ubyte.gz",
        ] {
            std::fs::copy(digits.join(f), data.join(f)).unwrap();
        }
        let text = BASE.replace(
            "format = \"digits\"",
            "format = \"idx\"\ntrain_images = \"d/train-images-idx3-ubyte.gz\"\n\
             train_labels = \"d/train-labels-idx1-ubyte.gz\"\n\
             test_images = \"d/test-images-idx3-ubyte.gz\"\n\
             test_labels = \"d/test-labels-idx1-ubyte.gz\"",
        );
        let path = dir.path().join("c.toml");
        std::fs::write(&path, &text).unwrap();
        let (c, s) = load(&path, &[]).unwrap();
        let want = std::fs::canonicalize(data.join("train-images-idx3-ubyte.gz")).unwrap();
        assert_eq!(c.data.train_images.as_deref(), Some(want.as_path()));
        assert_eq!(s.path, path);
        // Through load_str, relative to base_dir.
        let (c, _) = load_str("c.toml", &text, dir.path(), &[]).unwrap();
        assert_eq!(c.data.train_images.as_deref(), Some(want.as_path()));
    }

    #[test]
    fn normalizes_paths_that_do_not_exist() {
        assert_eq!(
            normalize(Path::new("/a/b/../../c/./d")),
            PathBuf::from("/c/d")
        );
        assert_eq!(normalize(Path::new("../a/../b")), PathBuf::from("../b"));
        assert_eq!(normalize(Path::new("/..")), PathBuf::from("/"));
    }

    #[test]
    fn unreadable_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        let e = load(&missing, &[]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string()
                .contains("nope.toml: cannot read the config file"),
            "{e}"
        );
        let bad = dir.path().join("bad.toml");
        let mut bytes = b"[data]\nformat = \"dig".to_vec();
        bytes.push(0xff);
        bytes.extend_from_slice(b"its\"\n");
        std::fs::write(&bad, bytes).unwrap();
        let e = load(&bad, &[]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Config {
                    pos: Some(Pos { line: 2, col: 14 }),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("`data.format`: not valid UTF-8 (byte 0xff)"),
            "{e}"
        );
    }
}
