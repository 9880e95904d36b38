//! Positions in a config text. Owns the dotted key path (`layer[2].num_output`) that every config
//! error names, the search for where such a key stands in the file (1-based line:col, from the
//! spans `toml_edit`'s `ImDocument` keeps), the reverse search from a byte offset to the key
//! around it, and the constructors of positioned [`Error::Config`] values on a [`Source`].
//!
//! ```text
//! locate(text, "layer[1].num_output")  -> the key `num_output` in the second [[layer]] table
//!                                          (else that table's header, else `[layer]`, else None)
//! key_at(text, span of a serde error)  -> `layer[1].num_output`
//! ```

use super::Source;
use crate::error::{Error, Pos};
use std::fmt;
use std::ops::Range;
use toml_edit::{ImDocument, Item, Table, TableLike, Value};

/// One step of a key path: a table key or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A dotted key path such as `solver.base_lr` or `layer[2].weight_filler.std`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(pub(crate) Vec<Seg>);

impl KeyPath {
    /// Parses `a.b[2].c`; a purely numeric part is an index too, so `layer.2.c` is the same path.
    pub(crate) fn parse(s: &str) -> std::result::Result<KeyPath, String> {
        let mut segs = Vec::new();
        if s.trim().is_empty() {
            return Err("empty key".into());
        }
        for part in s.trim().split('.') {
            let (name, mut rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if name.is_empty() {
                if segs.is_empty() || rest.is_empty() {
                    return Err(format!("empty part in key `{s}`"));
                }
            } else if name.bytes().all(|b| b.is_ascii_digit()) {
                segs.push(Seg::Index(parse_index(name, s)?));
            } else if name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                segs.push(Seg::Key(name.to_string()));
            } else {
                return Err(format!("`{name}` is not a key name"));
            }
            while !rest.is_empty() {
                let close = rest
                    .find(']')
                    .ok_or_else(|| format!("unclosed `[` in `{s}`"))?;
                segs.push(Seg::Index(parse_index(&rest[1..close], s)?));
                rest = &rest[close + 1..];
                if !rest.is_empty() && !rest.starts_with('[') {
                    return Err(format!("expected `.` or `[` after `]` in `{s}`"));
                }
            }
        }
        Ok(KeyPath(segs))
    }

    /// This path with `key` appended.
    pub(crate) fn join(&self, key: &str) -> KeyPath {
        let mut p = self.clone();
        p.0.push(Seg::Key(key.to_string()));
        p
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name of the last key, if the path ends in one.
    pub(crate) fn last_key(&self) -> Option<&str> {
        match self.0.last() {
            Some(Seg::Key(k)) => Some(k),
            _ => None,
        }
    }
}

fn parse_index(digits: &str, whole: &str) -> std::result::Result<usize, String> {
    digits
        .trim()
        .parse()
        .map_err(|_| format!("`{digits}` is not an index in `{whole}`"))
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> Pos {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Pos {
        line: before.matches('\n').count() + 1,
        col: before[line_start..].chars().count() + 1,
    }
}

/// A node of the parsed document while walking a key path.
#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Table(&'a Table),
    Value(&'a Value),
}

impl<'a> Node<'a> {
    fn table_like(self) -> Option<&'a dyn TableLike> {
        match self {
            Node::Item(i) => i.as_table_like(),
            Node::Table(t) => Some(t),
            Node::Value(Value::InlineTable(t)) => Some(t),
            Node::Value(_) => None,
        }
    }
}

/// Where `path` stands in `text`: the key itself, else the deepest table on the path that the
/// text has (its header), else `None`. `None` too when the text does not parse.
pub(crate) fn locate(text: &str, path: &KeyPath) -> Option<Pos> {
    let doc = ImDocument::parse(text).ok()?;
    let mut best: Option<usize> = None;
    let mut node = Node::Item(doc.as_item());
    for seg in &path.0 {
        match seg {
            Seg::Key(k) => {
                let Some((key, item)) = node.table_like().and_then(|t| t.get_key_value(k)) else {
                    break;
                };
                let start = match item {
                    // A `[table]` header starts at its `[`; a dotted-key table has no span.
                    Item::Table(_) | Item::ArrayOfTables(_) => item.span().or_else(|| key.span()),
                    _ => key.span().or_else(|| item.span()),
                };
                best = start.map(|s| s.start).or(best);
                node = Node::Item(item);
            }
            Seg::Index(i) => {
                let next = match node {
                    Node::Item(Item::ArrayOfTables(a)) => {
                        a.get(*i).map(|t| (t.span(), Node::Table(t)))
                    }
                    Node::Item(Item::Value(Value::Array(a))) | Node::Value(Value::Array(a)) => {
                        a.get(*i).map(|v| (v.span(), Node::Value(v)))
                    }
                    _ => None,
                };
                let Some((span, n)) = next else { break };
                best = span.map(|s| s.start).or(best);
                node = n;
            }
        }
    }
    best.map(|o| line_col(text, o))
}

/// Whether the item at `item` covers the error span `err`. An empty error span (serde's span of
/// the whole document) matches only an identical span.
fn covers(item: Option<Range<usize>>, err: &Range<usize>) -> bool {
    match item {
        Some(s) if err.is_empty() => s == *err,
        Some(s) => s.start <= err.start && err.end <= s.end,
        None => false,
    }
}

/// The deepest key of `text` whose key or value covers the byte range `err` (a span reported by
/// the deserialiser); the empty path when none does or the text does not parse.
pub(crate) fn key_at(text: &str, err: &Range<usize>) -> KeyPath {
    let Ok(doc) = ImDocument::parse(text) else {
        return KeyPath::default();
    };
    let mut path = Vec::new();
    search_table(doc.as_table(), err, &mut path).unwrap_or_default()
}

fn search_table(t: &dyn TableLike, err: &Range<usize>, path: &mut Vec<Seg>) -> Option<KeyPath> {
    for (k, item) in t.iter() {
        path.push(Seg::Key(k.to_string()));
        if let Some(found) = search_item(item, err, path) {
            return Some(found);
        }
        if covers(t.key(k).and_then(|key| key.span()), err) {
            return Some(KeyPath(path.clone()));
        }
        path.pop();
    }
    None
}

fn search_item(item: &Item, err: &Range<usize>, path: &mut Vec<Seg>) -> Option<KeyPath> {
    match item {
        Item::None => None,
        Item::Value(v) => search_value(v, err, path),
        Item::Table(t) => search_table(t, err, path)
            .or_else(|| covers(t.span(), err).then(|| KeyPath(path.clone()))),
        Item::ArrayOfTables(a) => {
            for (i, t) in a.iter().enumerate() {
                path.push(Seg::Index(i));
                let found = search_table(t, err, path)
                    .or_else(|| covers(t.span(), err).then(|| KeyPath(path.clone())));
                if found.is_some() {
                    return found;
                }
                path.pop();
            }
            None
        }
    }
}

fn search_value(v: &Value, err: &Range<usize>, path: &mut Vec<Seg>) -> Option<KeyPath> {
    let inner = match v {
        Value::InlineTable(t) => search_table(t, err, path),
        Value::Array(a) => {
            let mut found = None;
            for (i, e) in a.iter().enumerate() {
                path.push(Seg::Index(i));
                found = search_value(e, err, path);
                path.pop();
                if found.is_some() {
                    break;
                }
            }
            found
        }
        _ => None,
    };
    inner.or_else(|| covers(v.span(), err).then(|| KeyPath(path.clone())))
}

/// A best guess at the key around byte `offset` of a text that may not parse: the table of the
/// last header above it, and the key the offset's line assigns, if any.
pub(crate) fn key_near(text: &str, offset: usize) -> KeyPath {
    let offset = offset.min(text.len());
    let line_no = line_col(text, offset).line;
    let mut table: Vec<Seg> = Vec::new();
    // Array-of-tables names seen so far and how many elements each has.
    let mut arrays: Vec<(String, usize)> = Vec::new();
    for (n, line) in text.lines().enumerate().take(line_no) {
        let t = line.trim();
        let is_current = n + 1 == line_no;
        if let Some(h) = t.strip_prefix("[[") {
            let name = h.split("]]").next().unwrap_or("").trim().to_string();
            match arrays.iter_mut().find(|(a, _)| *a == name) {
                Some(e) => e.1 += 1,
                None => arrays.push((name.clone(), 1)),
            }
            table = header_path(&name, &arrays);
        } else if let Some(h) = t.strip_prefix('[') {
            let name = h.split(']').next().unwrap_or("").trim();
            table = header_path(name, &arrays);
        } else if is_current {
            let lhs = t.split('=').next().unwrap_or("");
            if t.contains('=') {
                if let Ok(p) = KeyPath::parse(lhs.trim()) {
                    table.extend(p.0);
                }
            }
        }
    }
    KeyPath(table)
}

/// The path of header `name`: each prefix that names an array of tables gets its last index.
fn header_path(name: &str, arrays: &[(String, usize)]) -> Vec<Seg> {
    let mut segs = Vec::new();
    let mut prefix = String::new();
    for part in name.split('.') {
        let part = part.trim().trim_matches('"');
        if !prefix.is_empty() {
            prefix.push('.');
        }
        prefix.push_str(part);
        segs.push(Seg::Key(part.to_string()));
        if let Some((_, n)) = arrays.iter().find(|(a, _)| *a == prefix) {
            segs.push(Seg::Index(n - 1));
        }
    }
    segs
}

/// Whether `key` is `prefix` or lies below it (`layer[0].weight_filler.std` below
/// `layer[0].weight_filler`).
fn is_under(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

impl Source {
    /// The `--set` argument that gave `key` (or a table above it) its value, if any; the last one
    /// when several did.
    pub fn override_of(&self, key: &str) -> Option<&str> {
        self.overrides
            .iter()
            .rev()
            .find(|(k, _)| is_under(key, k))
            .map(|(_, arg)| arg.as_str())
    }

    /// Where dotted `key` stands in the file: the key, else its nearest enclosing table, else
    /// `None`.
    pub fn position(&self, key: &str) -> Option<Pos> {
        KeyPath::parse(key)
            .ok()
            .and_then(|p| locate(&self.text, &p))
    }

    /// An [`Error::Config`] about dotted `key`, positioned in the file, or naming the `--set`
    /// argument that set the key.
    pub fn error(&self, key: &str, msg: impl fmt::Display) -> Error {
        self.error_at(key, key, msg)
    }

    /// Like [`Source::error`], but positioned at `at` (e.g. one element of the array `key`).
    pub fn error_at(&self, key: &str, at: &str, msg: impl fmt::Display) -> Error {
        match self.override_of(key) {
            Some(arg) => set_error(key, format!("{msg} (from `--set {arg}`)")),
            None => Error::Config {
                file: self.path.display().to_string(),
                pos: self.position(at).or_else(|| self.position(key)),
                key: key.to_string(),
                msg: msg.to_string(),
            },
        }
    }
}

/// An error about a `--set` argument, which has no position.
pub(crate) fn set_error(key: &str, msg: impl fmt::Display) -> Error {
    Error::Config {
        file: "--set".into(),
        pos: None,
        key: key.to_string(),
        msg: msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
[data]
batch_size = 32   # per replica

[[layer]]
name = \"ip1\"
bottom = [\"data\", \"x\"]
weight_filler = { type = \"xavier\" }

[[layer]]
name = \"relu1\"
bias_filler.type = \"constant\"
[layer.weight_filler]
std = 0.1
";

    fn p(s: &str) -> KeyPath {
        KeyPath::parse(s).unwrap()
    }

    fn pos(line: usize, col: usize) -> Option<Pos> {
        Some(Pos { line, col })
    }

    #[test]
    fn parses_and_prints_paths() {
        assert_eq!(p("layer[2].num_output").to_string(), "layer[2].num_output");
        assert_eq!(p("layer.2.num_output"), p("layer[2].num_output"));
        assert_eq!(p("solver.stepvalue[1]").0.last(), Some(&Seg::Index(1)));
        assert_eq!(p("a[1][2]").0.len(), 3);
        for bad in ["", "a..b", "a[x]", "a[1", "a]b", "a b", "a[1]b"] {
            assert!(KeyPath::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncd", 0), Pos { line: 1, col: 1 });
        assert_eq!(line_col("ab\ncd", 4), Pos { line: 2, col: 2 });
        assert_eq!(line_col("é=1\nx", 2), Pos { line: 1, col: 2 });
        assert_eq!(line_col("é=1\nx", 3), Pos { line: 1, col: 3 });
        assert_eq!(line_col("ab", 99), Pos { line: 1, col: 3 });
    }

    #[test]
    fn locates_keys_tables_and_elements() {
        assert_eq!(locate(TEXT, &p("data.batch_size")), pos(2, 1));
        assert_eq!(locate(TEXT, &p("data")), pos(1, 1));
        assert_eq!(locate(TEXT, &p("layer[0].name")), pos(5, 1));
        assert_eq!(locate(TEXT, &p("layer[0].bottom[1]")), pos(6, 19));
        assert_eq!(locate(TEXT, &p("layer[0].weight_filler.type")), pos(7, 19));
        assert_eq!(locate(TEXT, &p("layer[1].bias_filler.type")), pos(11, 13));
        assert_eq!(locate(TEXT, &p("layer[1].weight_filler.std")), pos(13, 1));
        // Fallbacks: the enclosing table, then nothing.
        assert_eq!(locate(TEXT, &p("layer[1].num_output")), pos(9, 1));
        assert_eq!(locate(TEXT, &p("data.shape")), pos(1, 1));
        assert_eq!(locate(TEXT, &p("layer[7].num_output")), pos(4, 1));
        assert_eq!(locate(TEXT, &p("solver.base_lr")), None);
        assert_eq!(locate("not [ toml", &p("data")), None);
    }

    #[test]
    fn finds_the_key_at_a_span() {
        let at = |needle: &str| {
            let start = TEXT.find(needle).unwrap();
            key_at(TEXT, &(start..start + needle.len())).to_string()
        };
        assert_eq!(at("32"), "data.batch_size");
        assert_eq!(at("batch_size"), "data.batch_size");
        assert_eq!(at("\"x\""), "layer[0].bottom[1]");
        assert_eq!(at("\"xavier\""), "layer[0].weight_filler.type");
        assert_eq!(at("\"relu1\""), "layer[1].name");
        assert_eq!(at("0.1"), "layer[1].weight_filler.std");
        assert_eq!(key_at(TEXT, &(0..0)).to_string(), "");
        let table = TEXT.find("[[layer]]\nname = \"relu1\"").unwrap();
        let end = TEXT.find("[layer.weight_filler]").unwrap() - 1;
        assert_eq!(key_at(TEXT, &(table..end)).to_string(), "layer[1]");
    }

    #[test]
    fn guesses_the_key_near_a_syntax_error() {
        let text = "[solver]\nbase_lr = 0.1.2\n[[layer]]\nname = 'a'\n[[layer]]\nnum_output = 1x\n[layer.weight_filler]\n";
        let near = |needle: &str| key_near(text, text.find(needle).unwrap()).to_string();
        assert_eq!(near("0.1.2"), "solver.base_lr");
        assert_eq!(near("1x"), "layer[1].num_output");
        assert_eq!(near("[layer.w"), "layer[1].weight_filler");
        assert_eq!(key_near("x = = 1", 4).to_string(), "x");
    }

    #[test]
    fn errors_name_the_set_argument_of_overridden_keys() {
        let src = Source {
            path: "c.toml".into(),
            text: TEXT.into(),
            overrides: vec![(
                "layer[0].weight_filler".into(),
                "layer[0].weight_filler={type=\"gaussian\"}".into(),
            )],
        };
        assert_eq!(
            src.override_of("layer[0].weight_filler.std"),
            Some("layer[0].weight_filler={type=\"gaussian\"}")
        );
        assert_eq!(src.override_of("layer[0].weight_fillers"), None);
        assert_eq!(src.override_of("layer[1].weight_filler"), None);
        let e = src
            .error("layer[0].weight_filler.std", "must be > 0")
            .to_string();
        assert!(
            e.starts_with("--set: `layer[0].weight_filler.std`: must be > 0 (from `--set layer[0]"),
            "{e}"
        );
        let e = src
            .error("data.batch_size", "must be at least 1")
            .to_string();
        assert_eq!(e, "c.toml:2:1: `data.batch_size`: must be at least 1");
        let e = src
            .error_at("layer[0].bottom", "layer[0].bottom[1]", "no")
            .to_string();
        assert_eq!(e, "c.toml:6:19: `layer[0].bottom`: no");
    }
}
