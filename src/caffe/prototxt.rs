//! Protocol Buffers' text format, as Caffe's `.prototxt` files use it, read into a tree of
//! named fields that keep their line and column for messages. It knows no schema: what a field
//! means is decided by its reader ([`crate::caffe::import`]).
//!
//! ```text
//! layer {                      Field { name: "layer", pos: 1:1, value: Message([
//!   name: "conv1"                Field { name: "name", value: Scalar(Str("conv1")) },
//!   convolution_param {          Field { name: "convolution_param", value: Message([
//!     kernel_size: 3               Field { name: "kernel_size", value: Scalar(Number("3")) },
//!     pool: MAX                    Field { name: "pool", value: Scalar(Ident("MAX")) } ]) } ]) }
//! ```
//!
//! Accepted: `#` comments; `name: value` and `name { ... }` (or `name: { ... }`, `name < ... >`);
//! numbers (decimal, hexadecimal, `inf`, `nan`, an `f` suffix); strings in single or double quotes
//! with C escapes, adjacent strings joined; identifiers (enum values, `true`, `false`); lists
//! `name: [1, 2, 3]` (one field per element); `,` or `;` after a field. Anything else is an error
//! naming its line and column.

use std::fmt;

/// A position in the text, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TextPos {
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for TextPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A syntax error and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub pos: TextPos,
    pub msg: String,
}

/// A message: its fields in the order written (a repeated field appears once per value).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    pub fields: Vec<Field>,
}

/// One field of a message.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    /// Where the field's name is.
    pub pos: TextPos,
    pub value: Value,
}

/// What a field holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Scalar(Scalar),
    Message(Message),
}

/// A scalar as written; its reader decides the type.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    /// A number's text (`3`, `-0.5`, `1e-4`, `0x10`, `inf`).
    Number(String),
    /// A string, escapes decoded.
    Str(String),
    /// An identifier: an enum value, `true` or `false`.
    Ident(String),
}

impl Message {
    /// Every field called `name`, in order.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Field> + 'a {
        self.fields.iter().filter(move |f| f.name == name)
    }

    /// The last field called `name` (a repeated singular field keeps its last value, as
    /// protobuf's parser does).
    pub fn last(&self, name: &str) -> Option<&Field> {
        self.fields.iter().rev().find(|f| f.name == name)
    }
}

/// Parses a whole text-format message.
pub fn parse(text: &str) -> Result<Message, SyntaxError> {
    let mut p = Parser::new(text);
    let msg = p.message(None)?;
    Ok(msg)
}

/// A token and where it starts.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Number(String),
    Str(String),
    Punct(char),
    End,
}

struct Parser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    pos: TextPos,
    /// The next token and its position, once peeked.
    peeked: Option<(Token, TextPos)>,
    /// Blocks open around the current position.
    depth: usize,
}

/// The deepest nesting of blocks read (Caffe's messages nest a few levels).
const MAX_DEPTH: usize = 64;

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            chars: text.chars().peekable(),
            pos: TextPos { line: 1, col: 1 },
            peeked: None,
            depth: 0,
        }
    }

    fn error<T>(&self, pos: TextPos, msg: impl Into<String>) -> Result<T, SyntaxError> {
        Err(SyntaxError {
            pos,
            msg: msg.into(),
        })
    }

    /// The fields up to `close` (or the end of the text when `None`).
    fn message(&mut self, close: Option<char>) -> Result<Message, SyntaxError> {
        if self.depth == MAX_DEPTH {
            return self.error(self.pos, format!("blocks nested deeper than {MAX_DEPTH}"));
        }
        self.depth += 1;
        let msg = self.fields(close);
        self.depth -= 1;
        msg
    }

    fn fields(&mut self, close: Option<char>) -> Result<Message, SyntaxError> {
        let mut msg = Message::default();
        loop {
            let (tok, pos) = self.next()?;
            match tok {
                Token::End if close.is_none() => return Ok(msg),
                Token::End => {
                    return self.error(
                        pos,
                        format!("`{}` expected before the end", close.unwrap_or('}')),
                    )
                }
                Token::Punct(c) if Some(c) == close => return Ok(msg),
                Token::Punct(',' | ';') if !msg.fields.is_empty() => continue,
                Token::Word(name) => self.field(name, pos, &mut msg)?,
                other => {
                    return self.error(
                        pos,
                        format!("a field name expected, found {}", describe(&other)),
                    )
                }
            }
        }
    }

    /// The rest of field `name` (at `pos`): `: value`, `: [values]`, `{ ... }` or `: { ... }`.
    fn field(&mut self, name: String, pos: TextPos, msg: &mut Message) -> Result<(), SyntaxError> {
        let (tok, at) = self.next()?;
        let (tok, at, colon) = match tok {
            Token::Punct(':') => {
                let (t, a) = self.next()?;
                (t, a, true)
            }
            other => (other, at, false),
        };
        let value = match tok {
            Token::Punct('{') => Value::Message(self.message(Some('}'))?),
            Token::Punct('<') => Value::Message(self.message(Some('>'))?),
            Token::Punct('[') if colon => {
                for value in self.list()? {
                    msg.fields.push(Field {
                        name: name.clone(),
                        pos,
                        value,
                    });
                }
                return Ok(());
            }
            tok if colon => Value::Scalar(self.scalar(tok, at)?),
            other => {
                return self.error(
                    at,
                    format!(
                        "`:` or `{{` expected after `{name}`, found {}",
                        describe(&other)
                    ),
                )
            }
        };
        msg.fields.push(Field { name, pos, value });
        Ok(())
    }

    /// The values of a `[a, b, c]` list, after its `[`.
    fn list(&mut self) -> Result<Vec<Value>, SyntaxError> {
        let mut values = Vec::new();
        loop {
            let (tok, at) = self.next()?;
            match tok {
                Token::Punct(']') if values.is_empty() => return Ok(values),
                Token::Punct('{') => values.push(Value::Message(self.message(Some('}'))?)),
                tok => values.push(Value::Scalar(self.scalar(tok, at)?)),
            }
            match self.next()? {
                (Token::Punct(','), _) => continue,
                (Token::Punct(']'), _) => return Ok(values),
                (other, at) => {
                    return self.error(
                        at,
                        format!("`,` or `]` expected, found {}", describe(&other)),
                    )
                }
            }
        }
    }

    /// A scalar value starting with `tok`; adjacent strings are joined.
    fn scalar(&mut self, tok: Token, at: TextPos) -> Result<Scalar, SyntaxError> {
        match tok {
            Token::Number(n) => Ok(Scalar::Number(n)),
            Token::Word(w) if is_number_word(&w) => Ok(Scalar::Number(w)),
            Token::Word(w) => Ok(Scalar::Ident(w)),
            Token::Punct('-') => match self.next()? {
                (Token::Number(n), _) => Ok(Scalar::Number(format!("-{n}"))),
                (Token::Word(w), _) if is_number_word(&w) => Ok(Scalar::Number(format!("-{w}"))),
                (other, at) => self.error(
                    at,
                    format!("a number expected after `-`, found {}", describe(&other)),
                ),
            },
            Token::Str(mut s) => {
                while let Some((Token::Str(_), _)) = self.peek()? {
                    if let (Token::Str(more), _) = self.next()? {
                        s.push_str(&more);
                    }
                }
                Ok(Scalar::Str(s))
            }
            other => self.error(at, format!("a value expected, found {}", describe(&other))),
        }
    }

    fn peek(&mut self) -> Result<Option<&(Token, TextPos)>, SyntaxError> {
        if self.peeked.is_none() {
            let t = self.lex()?;
            self.peeked = Some(t);
        }
        Ok(self.peeked.as_ref())
    }

    fn next(&mut self) -> Result<(Token, TextPos), SyntaxError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lex(),
        }
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.pos.line += 1;
            self.pos.col = 1;
        } else {
            self.pos.col += 1;
        }
        Some(c)
    }

    /// The next token, after white space and comments.
    fn lex(&mut self) -> Result<(Token, TextPos), SyntaxError> {
        loop {
            match self.chars.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => {
                    while self.chars.peek().is_some_and(|&c| c != '\n') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
        let start = self.pos;
        let Some(&c) = self.chars.peek() else {
            return Ok((Token::End, start));
        };
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            Token::Word(self.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        } else if c.is_ascii_digit() || c == '.' {
            Token::Number(
                self.take_while(|c| c.is_ascii_alphanumeric() || c == '.' || c == '+' || c == '-'),
            )
        } else if c == '"' || c == '\'' {
            self.bump();
            Token::Str(self.string(c, start)?)
        } else if "{}<>[]:,;-".contains(c) {
            self.bump();
            Token::Punct(c)
        } else {
            return self.error(start, format!("unexpected character `{c}`"));
        };
        Ok((tok, start))
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(&c) = self.chars.peek() {
            if !keep(c) {
                break;
            }
            // `1e-4` keeps its sign; `3-` would not be a number anyway and fails later.
            s.push(c);
            self.bump();
        }
        s
    }

    /// A quoted string's body up to its closing `quote`, escapes decoded.
    fn string(&mut self, quote: char, start: TextPos) -> Result<String, SyntaxError> {
        let mut s = String::new();
        loop {
            match self.bump() {
                None | Some('\n') => return self.error(start, "string not closed on its line"),
                Some(c) if c == quote => return Ok(s),
                Some('\\') => {
                    let at = self.pos;
                    match self.bump() {
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some('r') => s.push('\r'),
                        Some(c @ ('\\' | '\'' | '"' | '?')) => s.push(c),
                        Some(c) if c.is_digit(8) => {
                            let mut v = c.to_digit(8).unwrap_or(0);
                            for _ in 0..2 {
                                match self.chars.peek().and_then(|c| c.to_digit(8)) {
                                    Some(d) => {
                                        v = v * 8 + d;
                                        self.bump();
                                    }
                                    None => break,
                                }
                            }
                            s.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                        }
                        other => {
                            return self
                                .error(at, format!("unknown escape `\\{}`", other.unwrap_or(' ')))
                        }
                    }
                }
                Some(c) => s.push(c),
            }
        }
    }
}

/// Words that are numbers: `inf`, `infinity`, `nan` (any case).
fn is_number_word(w: &str) -> bool {
    matches!(w.to_ascii_lowercase().as_str(), "inf" | "infinity" | "nan")
}

fn describe(t: &Token) -> String {
    match t {
        Token::Word(w) => format!("`{w}`"),
        Token::Number(n) => format!("the number {n}"),
        Token::Str(s) => format!("the string {s:?}"),
        Token::Punct(c) => format!("`{c}`"),
        Token::End => "the end of the file".into(),
    }
}

impl Scalar {
    /// The value as written, for messages.
    pub fn text(&self) -> String {
        match self {
            Scalar::Number(n) | Scalar::Ident(n) => n.clone(),
            Scalar::Str(s) => format!("{s:?}"),
        }
    }
}

impl Field {
    /// The scalar this field holds; `Err` says it holds a message.
    pub fn scalar(&self) -> Result<&Scalar, String> {
        match &self.value {
            Value::Scalar(s) => Ok(s),
            Value::Message(_) => Err(format!("`{}` holds a value, not a block", self.name)),
        }
    }

    /// The message this field holds; `Err` says it holds a scalar.
    pub fn message(&self) -> Result<&Message, String> {
        match &self.value {
            Value::Message(m) => Ok(m),
            Value::Scalar(s) => Err(format!(
                "`{}` is a block, not the value {}",
                self.name,
                s.text()
            )),
        }
    }

    /// A string value.
    pub fn string(&self) -> Result<&str, String> {
        match self.scalar()? {
            Scalar::Str(s) => Ok(s),
            other => Err(format!(
                "`{}` must be a quoted string, found {}",
                self.name,
                other.text()
            )),
        }
    }

    /// An enum value or `true`/`false`, as written.
    pub fn ident(&self) -> Result<&str, String> {
        match self.scalar()? {
            Scalar::Ident(s) => Ok(s),
            other => Err(format!(
                "`{}` must be a name, found {}",
                self.name,
                other.text()
            )),
        }
    }

    /// A boolean: `true`/`false` (also `True`, `t`, `1`, `0`, as protobuf reads them).
    pub fn boolean(&self) -> Result<bool, String> {
        let text = match self.scalar()? {
            Scalar::Ident(s) | Scalar::Number(s) => s.as_str(),
            Scalar::Str(_) => "",
        };
        match text {
            "true" | "True" | "t" | "1" => Ok(true),
            "false" | "False" | "f" | "0" => Ok(false),
            _ => Err(format!("`{}` must be true or false", self.name)),
        }
    }

    /// A floating-point value.
    pub fn float(&self) -> Result<f64, String> {
        let Scalar::Number(n) = self.scalar()? else {
            return Err(format!("`{}` must be a number", self.name));
        };
        let special = match n.to_ascii_lowercase().trim_start_matches('-') {
            "inf" | "infinity" => Some(f64::INFINITY),
            "nan" => Some(f64::NAN),
            _ => None,
        };
        // A float may carry a C suffix: `2f`, `1.5F`.
        let t = n.trim_end_matches(['f', 'F']);
        match special {
            Some(v) if n.starts_with('-') => Ok(-v),
            Some(v) => Ok(v),
            None => parse_int(t)
                .map(|i| i as f64)
                .or_else(|| t.parse().ok())
                .ok_or_else(|| format!("`{}` must be a number, found {n}", self.name)),
        }
    }

    /// An integer value.
    pub fn int(&self) -> Result<i64, String> {
        match self.scalar()? {
            Scalar::Number(n) => {
                parse_int(n).ok_or_else(|| format!("`{}` must be an integer, found {n}", self.name))
            }
            other => Err(format!(
                "`{}` must be an integer, found {}",
                self.name,
                other.text()
            )),
        }
    }
}

/// A decimal or `0x` hexadecimal integer, optionally negative.
fn parse_int(t: &str) -> Option<i64> {
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t),
    };
    let v = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None => digits.parse().ok()?,
    };
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_blocks_repeated_fields_and_positions() {
        let text = "name: \"net\" # the net\nlayer {\n  name: 'a' \"b\"\n  top: \"x\" top: \"y\"\n  p { k: 3 v: -1.5e-2 e: MAX ok: true }\n}\nlayer: < name: \"c\" >\n";
        let m = parse(text).unwrap();
        assert_eq!(m.last("name").unwrap().string().unwrap(), "net");
        let layers: Vec<_> = m.all("layer").collect();
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[0].pos, TextPos { line: 2, col: 1 });
        let l0 = layers[0].message().unwrap();
        assert_eq!(l0.last("name").unwrap().string().unwrap(), "ab");
        let tops: Vec<_> = l0.all("top").map(|f| f.string().unwrap()).collect();
        assert_eq!(tops, ["x", "y"]);
        let p = l0.last("p").unwrap().message().unwrap();
        assert_eq!(p.last("k").unwrap().int().unwrap(), 3);
        assert_eq!(p.last("v").unwrap().float().unwrap(), -1.5e-2);
        assert_eq!(p.last("e").unwrap().ident().unwrap(), "MAX");
        assert!(p.last("ok").unwrap().boolean().unwrap());
        assert_eq!(p.last("k").unwrap().pos, TextPos { line: 5, col: 7 });
        let l1 = layers[1].message().unwrap();
        assert_eq!(l1.last("name").unwrap().string().unwrap(), "c");
    }

    #[test]
    fn lists_numbers_and_escapes() {
        let m = parse("dim: [1, 3, 0x10]\nx: inf y: -nan z: 2f s: \"a\\\"b\\n\\101\"").unwrap();
        let dims: Vec<i64> = m.all("dim").map(|f| f.int().unwrap()).collect();
        assert_eq!(dims, [1, 3, 16]);
        assert_eq!(m.last("x").unwrap().float().unwrap(), f64::INFINITY);
        assert!(m.last("y").unwrap().float().unwrap().is_nan());
        assert_eq!(m.last("z").unwrap().float().unwrap(), 2.0);
        assert_eq!(m.last("s").unwrap().string().unwrap(), "a\"b\nA");
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        for (text, line, col, what) in [
            ("layer {\n  name: \"a\"\n", 3, 1, "`}` expected"),
            ("a: 1\nb 2\n", 2, 3, "`:` or `{` expected"),
            ("a: \"open\n", 1, 4, "not closed"),
            ("a: 1 }", 1, 6, "a field name expected"),
            ("a: @", 1, 4, "unexpected character"),
            ("a: [1 2]", 1, 7, "`,` or `]` expected"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!((e.pos.line, e.pos.col), (line, col), "{text:?}: {e:?}");
            assert!(e.msg.contains(what), "{text:?}: {}", e.msg);
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let text = "a {".repeat(100_000);
        let e = parse(&text).unwrap_err();
        assert!(e.msg.contains("nested deeper"), "{e:?}");
    }

    #[test]
    fn values_of_the_wrong_kind_are_reported() {
        let m = parse("a: \"x\" b { } c: 1.5").unwrap();
        assert!(m.last("a").unwrap().int().unwrap_err().contains("integer"));
        assert!(m.last("b").unwrap().string().unwrap_err().contains("block"));
        assert!(m.last("c").unwrap().int().unwrap_err().contains("integer"));
        assert!(m
            .last("a")
            .unwrap()
            .message()
            .unwrap_err()
            .contains("block"));
    }
}
