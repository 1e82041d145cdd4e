//! The payload fingerprint: SHA-256 over a canonical JSON document.
//!
//! # What is hashed
//!
//! One JSON object, written with object keys sorted (at every depth), no whitespace, and
//! strings and numbers as `serde_json` writes them:
//!
//! ```json
//! {"args":{"amount":1250,"order":{"id":7,"sku":"a"}},"method":"POST","query":"a=1&b=2","route":"/orders/{id}"}
//! ```
//!
//! - `args` (fns, `key = ...`): each parameter binding (the names the parameter patterns
//!   introduce, such as `id` in `Path(id): Path<u64>`) as `serde_json` serializes it,
//!   under its name; `self` is left out. A binding whose type is not `Serialize` is a
//!   compile error naming it, unless its parameter is a known non-payload type (`State`,
//!   `Extension`, `web::Data`, a `Locks`) or it is listed in `skip = [...]`. A binding
//!   that fails to serialize at run time (a `u128` above `u64::MAX`, a map with
//!   non-string keys) is never left out: the call fails with `Unrepresentable` before
//!   anything is claimed. A float binding (or `Some` of one) that is not finite is
//!   written `"+inf"`, `"-inf"` or `"NaN"` (`serde_json` writes all three as `null`;
//!   inside a struct they still are). With
//!   `fingerprint = [a, b]` only those bindings are hashed. A `HashSet` or `HashMap`
//!   binding hashes the same whatever its iteration order (sets are sorted); inside a
//!   struct, write `BTreeSet` for a set (serde cannot tell a `HashSet` field from a list).
//! - handlers (`header = ...`): what the request carries, not the bindings: `method`,
//!   `route` (the route template the framework matched, e.g. `/orders/{id}`; empty when
//!   unknown), `path` (the request path, percent-decoded: the path parameters), `query`
//!   (the query string as decoded `[name, value]` pairs, `+` read as a space, sorted by
//!   name, the values of one name in their order) and
//!   `body`: `json:<sha256>` of the canonical JSON of a JSON body (`application/json` or
//!   `*/*+json` that parses), `multipart:<sha256>` of a `multipart/form-data` body's
//!   parts (each part's name, file name, content type and the SHA-256 of its bytes, in
//!   order: not the boundary, which clients make anew per submission), else
//!   `bytes:<sha256>` of the raw bytes; empty without a body.
//!
//! Numbers are written canonically: a number with an integral value is written as an
//! integer (`1`, `1.0` and `1e0` are one number; so are `100` and `1e2`; `-0` is `0`),
//! any other as `serde_json` writes an `f64`. In a request body they are read from the
//! text by their exact decimal value: `18446744073709551616` and `...617`, or `0.1` and
//! `0.10000000000000000001`, which one `f64` cannot tell apart but a `u128` or a decimal
//! handler can, are two numbers (a value no `f64` spells exactly is written as
//! `<digits>e<exponent>`). So the order of fields, the whitespace and the spelling of
//! numbers in a JSON body do not change the fingerprint; a changed value does. The
//! digest is lower-case hex.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::util::push_json_str;

/// Collects what the fingerprint covers; built by generated code.
#[derive(Debug, Default, Clone)]
pub struct Fingerprint {
    args: BTreeMap<&'static str, Value>,
    skipped: Vec<&'static str>,
    /// Bindings that failed to serialize, with why: the call is refused.
    failed: Vec<(&'static str, String)>,
    http: Option<Http>,
}

#[derive(Debug, Clone)]
struct Http {
    method: String,
    route: String,
    path: String,
    query: Value,
    body: String,
}

impl Fingerprint {
    /// Nothing hashed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the binding `name`. One that fails to serialize is never left out: the call
    /// is refused (see [`failure`](Self::failure)).
    pub fn add<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        if let Ok(float) = value.serialize(FloatProbe) {
            return self.add_float(name, float);
        }
        match serde_json::to_value(value) {
            Ok(v) => {
                self.args.insert(name, v);
            }
            Err(e) => self.failed.push((name, e.to_string())),
        }
    }

    /// Adds a float binding: a finite one as the number, `+inf`, `-inf` and `NaN` each as
    /// its own string (`serde_json` writes all three as `null`, so they would share a
    /// fingerprint). Within one fn a binding has one type, so such a string cannot be a
    /// string argument's.
    fn add_float(&mut self, name: &'static str, value: f64) {
        let v = match serde_json::Number::from_f64(value) {
            Some(n) => Value::Number(n),
            None if value.is_nan() => Value::String("NaN".into()),
            None if value > 0.0 => Value::String("+inf".into()),
            None => Value::String("-inf".into()),
        };
        self.args.insert(name, v);
    }

    /// Why the payload cannot be fingerprinted, if a binding failed to serialize.
    pub(crate) fn failure(&self) -> Option<String> {
        let (name, error) = self.failed.first()?;
        Some(format!(
            "argument `{name}` cannot be part of the payload fingerprint (it fails to \
             serialize: {error}); the call is refused rather than fingerprinted without it"
        ))
    }

    /// Records that the binding `name` is left out (its type is not `Serialize`).
    pub fn skip(&mut self, name: &'static str) {
        self.skipped.push(name);
    }

    /// Adds what a handler's request carries: its request line and the label of its body
    /// (see [`body_label`]).
    pub(crate) fn http(
        &mut self,
        method: &str,
        route: &str,
        path: &str,
        query: &str,
        body: String,
    ) {
        self.http = Some(Http {
            method: method.to_owned(),
            route: route.to_owned(),
            path: String::from_utf8_lossy(&percent_decode(path.as_bytes(), false)).into_owned(),
            query: canonical_query(query),
            body,
        });
    }

    /// Adds a set binding: its elements sorted by their canonical JSON.
    pub fn add_set<'a, T: Serialize + 'a>(
        &mut self,
        name: &'static str,
        items: impl IntoIterator<Item = &'a T>,
    ) {
        let mut elems: Vec<(String, Value)> = Vec::new();
        for item in items {
            match serde_json::to_value(item) {
                Ok(v) => {
                    let mut text = String::new();
                    write_canonical(&v, &mut text);
                    elems.push((text, v));
                }
                Err(e) => {
                    self.failed.push((name, e.to_string()));
                    return;
                }
            }
        }
        elems.sort_by(|a, b| a.0.cmp(&b.0));
        self.args.insert(
            name,
            Value::Array(elems.into_iter().map(|(_, v)| v).collect()),
        );
    }

    /// The bindings left out.
    pub(crate) fn skipped(&self) -> &[&'static str] {
        &self.skipped
    }

    /// The canonical document (see the module docs).
    pub(crate) fn canonical(&self) -> String {
        // Written in place, keys in sorted order, as `write_canonical` of the document
        // `{"args": {...}}` or `{"body", "method", "path", "query", "route"}` would.
        let mut out = String::with_capacity(128);
        if let Some(h) = &self.http {
            out.push_str("{\"body\":");
            push_json_str(&h.body, &mut out);
            out.push_str(",\"method\":");
            push_json_str(&h.method, &mut out);
            out.push_str(",\"path\":");
            push_json_str(&h.path, &mut out);
            out.push_str(",\"query\":");
            write_canonical(&h.query, &mut out);
            out.push_str(",\"route\":");
            push_json_str(&h.route, &mut out);
            out.push('}');
            return out;
        }
        out.push_str("{\"args\":{");
        // A BTreeMap: already sorted by name.
        for (i, (k, v)) in self.args.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(k, &mut out);
            out.push(':');
            write_canonical(v, &mut out);
        }
        out.push_str("}}");
        out
    }

    /// SHA-256 of [`canonical`](Self::canonical), lower-case hex.
    pub(crate) fn digest(&self) -> String {
        hex(&Sha256::digest(self.canonical().as_bytes()))
    }
}

/// JSON with object keys sorted at every depth, whatever map type `serde_json` was built
/// with (its `preserve_order` feature keeps insertion order).
fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_json_str(k, out);
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Number(n) => write_number(n, out),
        Value::String(s) => push_json_str(s, out),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Null => out.push_str("null"),
    }
}

/// An integral value as an integer (`1.0`, `1e0` and `1` are one number; `-0` is `0`),
/// any other as `serde_json` writes it.
fn write_number(n: &serde_json::Number, out: &mut String) {
    if n.is_u64() || n.is_i64() {
        out.push_str(&n.to_string());
        return;
    }
    let Some(f) = n.as_f64() else {
        out.push_str(&n.to_string());
        return;
    };
    if f == 0.0 {
        out.push('0');
    } else if f.fract() == 0.0 && f.abs() < 1e19 {
        // Exact: an integral f64 below 2^63 converts without loss.
        if f.is_sign_negative() {
            out.push_str(&(f as i64).to_string());
        } else {
            out.push_str(&(f as u64).to_string());
        }
    } else {
        out.push_str(&n.to_string());
    }
}

/// `%XX` decoded (a bad escape stays as it is); with `plus`, `+` is a space.
fn percent_decode(raw: &[u8], plus: bool) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' if i + 2 < raw.len() => match (hex(raw[i + 1]), hex(raw[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// A query string as `[name, value]` pairs, each percent-decoded with `+` as a space (as
/// `application/x-www-form-urlencoded`, which axum's `Query` and actix's `web::Query`
/// read), sorted by name; the values of one name keep their order, which a handler may
/// read (`Query<HashMap>` keeps the last, `Vec` all in order): `a=%41&b` and `b=&a=A`
/// are one query, `a=1&a=2` and `a=2&a=1` are two.
fn canonical_query(query: &str) -> Value {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (name, value) = p.split_once('=').unwrap_or((p, ""));
            let text =
                |s: &str| String::from_utf8_lossy(&percent_decode(s.as_bytes(), true)).into_owned();
            (text(name), text(value))
        })
        .collect();
    // Stable: equal names keep their order.
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    Value::Array(
        pairs
            .into_iter()
            .map(|(n, v)| Value::Array(vec![Value::String(n), Value::String(v)]))
            .collect(),
    )
}

/// What the fingerprint records of a request body: `json:<sha256>` of its canonical JSON
/// when `content_type` is JSON and the body parses, else `bytes:<sha256>` of the bytes;
/// empty for no body.
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
pub(crate) fn body_label(content_type: Option<&[u8]>, body: &[u8]) -> String {
    if body.is_empty() {
        return String::new();
    }
    let json = content_type.is_some_and(|ct| {
        let mime = ct
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        mime.eq_ignore_ascii_case(b"application/json")
            || (mime.len() >= 5 && mime[mime.len() - 5..].eq_ignore_ascii_case(b"+json"))
    });
    if json && let Some(text) = canonical_json(body) {
        return format!("json:{}", hex(&Sha256::digest(text.as_bytes())));
    }
    if let Some(parts) = content_type.and_then(|ct| multipart_parts(ct, body)) {
        return format!("multipart:{}", hex(&Sha256::digest(parts.as_bytes())));
    }
    format!("bytes:{}", hex(&Sha256::digest(body)))
}

/// A `multipart/form-data` body by its parts, not its boundary (every client makes a new
/// random one per submission, so a form sent again differs in its bytes): a JSON array,
/// in order, of each part's `name`, `filename` (`null` when absent), `content_type`
/// (lower case, empty when absent) and the SHA-256 of its bytes. `None` when the type is
/// not multipart with a boundary, or the body does not parse as one (the bytes are the
/// payload then).
fn multipart_parts(content_type: &[u8], body: &[u8]) -> Option<String> {
    let ct = std::str::from_utf8(content_type).ok()?;
    let mut params = ct.split(';');
    if !params
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    let boundary = params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"'))
    })?;
    if boundary.is_empty() {
        return None;
    }
    let delimiter = [b"--", boundary.as_bytes()].concat();
    let next_delimiter = [b"\r\n--", boundary.as_bytes()].concat();
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    // The first delimiter: at the start, or after a preamble and a CRLF.
    let mut at = if body.starts_with(&delimiter) {
        delimiter.len()
    } else {
        find(body, &next_delimiter)? + next_delimiter.len()
    };
    let mut out = String::from("[");
    loop {
        let rest = body.get(at..)?;
        if rest.starts_with(b"--") {
            break; // the close delimiter
        }
        let rest = rest.strip_prefix(b"\r\n")?;
        let end = find(rest, &next_delimiter)?;
        let part = &rest[..end];
        let split = find(part, b"\r\n\r\n");
        let (head, content) = match split {
            Some(i) => (&part[..i], &part[i + 4..]),
            // No headers: the part starts with the blank line.
            None => (&b""[..], part.strip_prefix(b"\r\n")?),
        };
        let (mut name, mut filename, mut part_type) = (None, None, String::new());
        for line in std::str::from_utf8(head).ok()?.split("\r\n") {
            let Some((field, value)) = line.split_once(':') else {
                continue;
            };
            let field = field.trim();
            if field.eq_ignore_ascii_case("content-type") {
                part_type = value.trim().to_ascii_lowercase();
            } else if field.eq_ignore_ascii_case("content-disposition") {
                for param in value.split(';').skip(1) {
                    let Some((k, v)) = param.split_once('=') else {
                        continue;
                    };
                    let v = v.trim().trim_matches('"').to_owned();
                    match k.trim().to_ascii_lowercase().as_str() {
                        "name" => name = Some(v),
                        "filename" => filename = Some(v),
                        _ => {}
                    }
                }
            }
        }
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str("{\"content_type\":");
        push_json_str(&part_type, &mut out);
        out.push_str(",\"filename\":");
        match &filename {
            Some(f) => push_json_str(f, &mut out),
            None => out.push_str("null"),
        }
        out.push_str(",\"name\":");
        push_json_str(name.as_deref().unwrap_or(""), &mut out);
        out.push_str(",\"sha256\":\"");
        out.push_str(&hex(&Sha256::digest(content)));
        out.push_str("\"}");
        at += 2 + end + next_delimiter.len();
    }
    out.push(']');
    Some(out)
}

/// The canonical JSON of a request body read from its text (see the module docs): object
/// keys sorted at every depth (a repeated key keeps its last value, as `serde_json`
/// does), no whitespace, strings as `serde_json` writes them, numbers by their exact
/// decimal value ([`canonical_number`]). `None` when it is not JSON (then the bytes are
/// the payload), nested deeper than `serde_json` reads (128), or holds a lone surrogate.
fn canonical_json(body: &[u8]) -> Option<String> {
    let mut reader = JsonText { text: body, at: 0 };
    let mut out = String::with_capacity(body.len());
    reader.value(&mut out, 0)?;
    reader.space();
    (reader.at == body.len()).then_some(out)
}

/// A reader of JSON text that writes its canonical form as it goes.
struct JsonText<'a> {
    text: &'a [u8],
    at: usize,
}

impl JsonText<'_> {
    fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.space();
        (self.text.get(self.at) == Some(&byte)).then(|| self.at += 1)
    }

    fn value(&mut self, out: &mut String, depth: usize) -> Option<()> {
        if depth >= 128 {
            return None;
        }
        self.space();
        match *self.text.get(self.at)? {
            b'{' => {
                self.at += 1;
                let mut entries: Vec<(String, String)> = Vec::new();
                self.space();
                if self.text.get(self.at) == Some(&b'}') {
                    self.at += 1;
                } else {
                    loop {
                        self.space();
                        let key = self.string()?;
                        self.eat(b':')?;
                        let mut value = String::new();
                        self.value(&mut value, depth + 1)?;
                        entries.push((key, value));
                        self.space();
                        match self.text.get(self.at)? {
                            b',' => self.at += 1,
                            b'}' => {
                                self.at += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                // Stable: of equal keys the last one read comes last, and is kept.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                out.push('{');
                let mut first = true;
                for (i, (key, value)) in entries.iter().enumerate() {
                    if entries.get(i + 1).is_some_and(|next| next.0 == *key) {
                        continue;
                    }
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    push_json_str(key, out);
                    out.push(':');
                    out.push_str(value);
                }
                out.push('}');
            }
            b'[' => {
                self.at += 1;
                out.push('[');
                self.space();
                if self.text.get(self.at) == Some(&b']') {
                    self.at += 1;
                } else {
                    loop {
                        self.value(out, depth + 1)?;
                        self.space();
                        match self.text.get(self.at)? {
                            b',' => {
                                self.at += 1;
                                out.push(',');
                            }
                            b']' => {
                                self.at += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                out.push(']');
            }
            b'"' => {
                let s = self.string()?;
                push_json_str(&s, out);
            }
            b't' => self.literal(b"true", out)?,
            b'f' => self.literal(b"false", out)?,
            b'n' => self.literal(b"null", out)?,
            _ => {
                let start = self.at;
                self.number()?;
                let text = std::str::from_utf8(&self.text[start..self.at]).ok()?;
                out.push_str(&canonical_number(text)?);
            }
        }
        Some(())
    }

    fn literal(&mut self, word: &[u8], out: &mut String) -> Option<()> {
        let end = self.at + word.len();
        (self.text.get(self.at..end)? == word).then_some(())?;
        self.at = end;
        out.push_str(std::str::from_utf8(word).ok()?);
        Some(())
    }

    /// Past a number as JSON spells it: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let digits = |r: &mut Self| {
            let start = r.at;
            while r.text.get(r.at).is_some_and(u8::is_ascii_digit) {
                r.at += 1;
            }
            (r.at > start).then_some(())
        };
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        if self.text.get(self.at) == Some(&b'0') {
            self.at += 1;
        } else {
            digits(self)?;
        }
        if self.text.get(self.at) == Some(&b'.') {
            self.at += 1;
            digits(self)?;
        }
        if let Some(b'e' | b'E') = self.text.get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.text.get(self.at) {
                self.at += 1;
            }
            digits(self)?;
        }
        Some(())
    }

    /// A string's value (escapes decoded), the reader past its closing quote.
    fn string(&mut self) -> Option<String> {
        if self.text.get(self.at) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        let mut bytes = Vec::new();
        loop {
            let b = *self.text.get(self.at)?;
            self.at += 1;
            match b {
                b'"' => return String::from_utf8(bytes).ok(),
                b'\\' => {
                    let e = *self.text.get(self.at)?;
                    self.at += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let high = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&high) {
                                (self.text.get(self.at..self.at + 2)? == b"\\u").then_some(())?;
                                self.at += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return None;
                                }
                                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                            } else {
                                high
                            };
                            char::from_u32(code)?
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return None,
                b => bytes.push(b),
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = std::str::from_utf8(self.text.get(self.at..self.at + 4)?).ok()?;
        let code = u32::from_str_radix(digits, 16).ok()?;
        self.at += 4;
        Some(code)
    }
}

/// A JSON number's text written by its exact decimal value, so that two numbers share it
/// only when they are equal: `0` for zero (`-0`, `0.0`, `0e5`); an integral value as an
/// integer (`1`, `1.0`, `1e0` and `10e-1` are `1`; `18446744073709551616` stays itself,
/// not the `f64` nearest to it); any other value as `serde_json` writes the `f64`
/// nearest to it when that is the same value (`0.1`, `2.5`), else exactly, as
/// `<digits>e<exponent>` (`0.10000000000000000001` is `10000000000000000001e-20`).
/// Beyond 40 integer digits an integral value is written that way too. `None` for text
/// that is not a number.
fn canonical_number(text: &str) -> Option<String> {
    let (negative, digits, exponent) = decimal(text)?;
    if digits.is_empty() {
        return Some("0".to_owned());
    }
    let sign = if negative { "-" } else { "" };
    if exponent >= 0 {
        let zeros = usize::try_from(exponent).ok()?;
        if digits.len() + zeros <= 40 {
            return Some(format!("{sign}{digits}{}", "0".repeat(zeros)));
        }
        return Some(format!("{sign}{digits}e{exponent}"));
    }
    // Not integral: `serde_json`'s spelling of the nearest `f64`, where it is this value.
    if let Ok(f) = text.parse::<f64>()
        && let Some(n) = serde_json::Number::from_f64(f)
    {
        let spelled = n.to_string();
        if decimal(&spelled).is_some_and(|d| d == (negative, digits.clone(), exponent)) {
            return Some(spelled);
        }
    }
    Some(format!("{sign}{digits}e{exponent}"))
}

/// The exact decimal value of a number's text: its sign, its significant digits (no
/// leading or trailing zeros; empty for zero) and the power of ten they are scaled by.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits: String = int.chars().chain(frac.chars()).collect();
    let significant = digits.trim_start_matches('0');
    let kept = significant.trim_end_matches('0');
    let exponent = exponent
        .checked_sub(i64::try_from(frac.len()).ok()?)?
        .checked_add(i64::try_from(significant.len() - kept.len()).ok()?)?;
    if kept.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, kept.to_owned(), exponent))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// A serializer that accepts a float (an `f32` or `f64` binding, or `Some` of one) and
/// refuses anything else: how [`Fingerprint::add`] tells a float binding from the rest.
struct FloatProbe;

/// What [`FloatProbe`] refuses.
#[derive(Debug)]
struct NotFloat;

impl std::fmt::Display for NotFloat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a float")
    }
}

impl std::error::Error for NotFloat {}

impl serde::ser::Error for NotFloat {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        NotFloat
    }
}

macro_rules! refuse {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {$(
        fn $method(self, $(_: $arg),*) -> Result<f64, NotFloat> {
            Err(NotFloat)
        }
    )*};
}

impl serde::Serializer for FloatProbe {
    type Ok = f64;
    type Error = NotFloat;
    type SerializeSeq = serde::ser::Impossible<f64, NotFloat>;
    type SerializeTuple = serde::ser::Impossible<f64, NotFloat>;
    type SerializeTupleStruct = serde::ser::Impossible<f64, NotFloat>;
    type SerializeTupleVariant = serde::ser::Impossible<f64, NotFloat>;
    type SerializeMap = serde::ser::Impossible<f64, NotFloat>;
    type SerializeStruct = serde::ser::Impossible<f64, NotFloat>;
    type SerializeStructVariant = serde::ser::Impossible<f64, NotFloat>;

    fn serialize_f64(self, v: f64) -> Result<f64, NotFloat> {
        Ok(v)
    }

    fn serialize_f32(self, v: f32) -> Result<f64, NotFloat> {
        Ok(f64::from(v))
    }

    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<f64, NotFloat> {
        v.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<f64, NotFloat> {
        v.serialize(self)
    }

    refuse!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<f64, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotFloat> {
        Err(NotFloat)
    }
}

/// One argument offered to the fingerprint by generated code:
/// `(&&&&FpArg(name, &binding)).__distlock_fp(&mut fp)` adds a set sorted ([`FpSet`],
/// found first), else adds a `Serialize` value ([`FpSerialize`]), else skips a known
/// non-payload type ([`FpNonPayload`]), else is a compile error ([`FpNone`]).
#[doc(hidden)]
pub struct FpArg<'a, T: ?Sized>(pub &'static str, pub &'a T);

/// Adds a set, its elements sorted (autoref specialization, first).
#[doc(hidden)]
pub trait FpSet {
    /// Adds the argument.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: Serialize, S> FpSet for &&&FpArg<'_, std::collections::HashSet<T, S>> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.add_set(self.0, self.1.iter());
    }
}

impl<T: Serialize, S> FpSet for &&&FpArg<'_, &std::collections::HashSet<T, S>> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.add_set(self.0, self.1.iter());
    }
}

/// Adds a `Serialize` argument (autoref specialization, second).
#[doc(hidden)]
pub trait FpSerialize {
    /// Adds the argument.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: Serialize + ?Sized> FpSerialize for &&FpArg<'_, T> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.add(self.0, self.1);
    }
}

/// Skips a known non-payload argument (autoref specialization, third).
#[doc(hidden)]
pub trait FpNonPayload {
    /// Records the argument as left out.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: NonPayload + ?Sized> FpNonPayload for &FpArg<'_, T> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.skip(self.0);
    }
}

/// Types that are never part of a call's payload: the client, and the frameworks'
/// application state.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is named like application state, so `#[idempotent]` leaves its bindings out of the fingerprint, but it is not axum's `State` or `Extension`, actix-web's `web::Data` or a `distlock::Locks`",
    label = "left out of the fingerprint by its name",
    note = "if it is part of the payload, name the payload's bindings with `fingerprint = [...]`, or give the type another name"
)]
pub trait NonPayload {}

/// Compiles only for a [`NonPayload`] type (generated code checks a parameter left out
/// of the fingerprint by its type's name).
#[doc(hidden)]
pub fn assert_non_payload<T: NonPayload + ?Sized>() {}

impl NonPayload for crate::Locks {}
impl<T: NonPayload + ?Sized> NonPayload for &T {}
impl<T: NonPayload + ?Sized> NonPayload for std::sync::Arc<T> {}
#[cfg(feature = "axum")]
impl<T> NonPayload for axum::extract::State<T> {}
#[cfg(feature = "axum")]
impl<T> NonPayload for axum::Extension<T> {}
#[cfg(feature = "actix")]
impl<T: ?Sized> NonPayload for actix_web::web::Data<T> {}

/// Any other argument: a compile error (autoref specialization, last).
#[doc(hidden)]
pub trait FpNone {
    /// Never callable: the binding's type is not `Serialize`.
    fn __distlock_fp(&self, fp: &mut Fingerprint)
    where
        Self: FpChecked;
}

impl<T: ?Sized> FpNone for FpArg<'_, T> {
    fn __distlock_fp(&self, _fp: &mut Fingerprint)
    where
        Self: FpChecked,
    {
        unreachable!("`Fingerprintable` is implemented by `Serialize` types only")
    }
}

/// Holds for an argument whose type is [`Fingerprintable`].
#[doc(hidden)]
pub trait FpChecked {}

impl<T: Fingerprintable + ?Sized> FpChecked for FpArg<'_, T> {}

/// A type a binding may have to be part of the fingerprint.
#[diagnostic::on_unimplemented(
    message = "this parameter binding cannot be part of the idempotency fingerprint: `{Self}` is not `serde::Serialize`",
    label = "not `Serialize`: a different value here would replay the first call's result",
    note = "derive `serde::Serialize` for it; or, if it is not part of the payload (a pool, a client, a counter), list the binding in `skip = [...]`; or name the payload's bindings with `fingerprint = [...]`"
)]
pub trait Fingerprintable {}

#[diagnostic::do_not_recommend]
impl<T: Serialize + ?Sized> Fingerprintable for T {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-place writer gives what `serde_json` gives, for every character class.
    #[test]
    fn strings_are_escaped_as_serde_json_does() {
        for s in [
            "",
            "plain",
            "quote \" and \\ backslash",
            "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f} controls",
            "é ☃ 😀 / <script>",
            "\u{7f}\u{80}",
        ] {
            let mut out = String::new();
            push_json_str(s, &mut out);
            assert_eq!(out, serde_json::to_string(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn order_and_whitespace_do_not_matter() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        let mut fa = Fingerprint::new();
        fa.add("body", &a);
        let mut fb = Fingerprint::new();
        fb.add("body", &b);
        assert_eq!(fa.digest(), fb.digest());
        assert_eq!(
            fa.canonical(),
            r#"{"args":{"body":{"a":{"x":"s","y":[1,2]},"b":1}}}"#
        );
        let mut fc = Fingerprint::new();
        fc.add(
            "body",
            &serde_json::json!({"a": {"x": "s", "y": [2, 1]}, "b": 1}),
        );
        assert_ne!(fa.digest(), fc.digest());
    }

    #[test]
    #[allow(clippy::needless_borrow)] // the borrows select the impl
    fn autoref_adds_sets_sorted_and_skips_non_payload() {
        let id = 7u64;
        let locks = crate::Locks::in_memory();
        let mut fp = Fingerprint::new();
        (&&&&FpArg("id", &id)).__distlock_fp(&mut fp);
        (&&&&FpArg("locks", &locks)).__distlock_fp(&mut fp);
        assert_eq!(fp.skipped(), ["locks"]);
        let digest = |set: &std::collections::HashSet<String>| {
            let mut fp = Fingerprint::new();
            (&&&&FpArg("tags", set)).__distlock_fp(&mut fp);
            fp.canonical()
        };
        let mut a = std::collections::HashSet::new();
        let mut b = std::collections::HashSet::new();
        for i in 0..50 {
            a.insert(format!("t{i}"));
            b.insert(format!("t{}", 49 - i));
        }
        assert_ne!(
            a.iter().collect::<Vec<_>>(),
            b.iter().collect::<Vec<_>>(),
            "the control: two equal sets iterate in different orders"
        );
        assert_eq!(digest(&a), digest(&b));
        // Non-finite floats each have their own encoding (serde_json: all `null`).
        let float = |x: f64| {
            let mut fp = Fingerprint::new();
            (&&&&FpArg("x", &x)).__distlock_fp(&mut fp);
            fp.canonical()
        };
        let all = [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1.5, 0.0];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(float(*a), float(*b), "{a} {b}");
            }
        }
        assert_eq!(float(1.0), r#"{"args":{"x":1}}"#);
        let mut fp = Fingerprint::new();
        fp.add("x", &&2.5f32);
        fp.add("y", &Some(f64::NAN));
        fp.add("z", &[1.5f64]);
        assert_eq!(fp.canonical(), r#"{"args":{"x":2.5,"y":"NaN","z":[1.5]}}"#);
    }

    #[test]
    fn request_fingerprint() {
        let mut fp = Fingerprint::new();
        fp.add("ignored", &1);
        fp.http("POST", "/x/{id}", "/x/a%20b", "b=2&&a=%41+c", String::new());
        assert_eq!(
            fp.canonical(),
            r#"{"body":"","method":"POST","path":"/x/a b","query":[["a","A c"],["b","2"]],"route":"/x/{id}"}"#
        );
        let same = |q: &str| {
            let mut fp = Fingerprint::new();
            fp.http("POST", "/x", "/x", q, String::new());
            fp.digest()
        };
        assert_eq!(same("a=%41&b"), same("b=&a=A"));
        assert_ne!(same("a=1"), same("a=2"));
        // The values of one name keep their order (`Query<HashMap>` reads the last).
        assert_ne!(same("amount=1&amount=100"), same("amount=100&amount=1"));
        assert_eq!(
            same("b=1&amount=1&amount=100"),
            same("amount=1&amount=100&b=1")
        );
    }

    /// A form sent again with another boundary is the same payload; another part's
    /// bytes, name, file name or type is another.
    #[test]
    fn multipart_forms_are_their_parts_not_their_boundary() {
        let form = |boundary: &str, file: &str, name: &str| {
            let body = format!(
                "--{boundary}\r\ncontent-disposition: form-data; name=\"note\"\r\n\r\nhello\r\n\
                 --{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"a.txt\"\r\n\
                 Content-Type: text/plain\r\n\r\n{file}\r\n--{boundary}--\r\n"
            );
            let ct = format!("multipart/form-data; boundary={boundary}");
            body_label(Some(ct.as_bytes()), body.as_bytes())
        };
        let first = form("----a1", "file bytes", "doc");
        assert!(first.starts_with("multipart:"), "{first}");
        assert_eq!(
            first,
            form("xyz-2", "file bytes", "doc"),
            "another boundary"
        );
        assert_ne!(first, form("xyz-2", "other bytes", "doc"));
        assert_ne!(first, form("xyz-2", "file bytes", "other"));
        let quoted = body_label(
            Some(b"multipart/form-data; boundary=\"q q\""),
            b"--q q\r\ncontent-disposition: form-data; name=\"note\"\r\n\r\nhello\r\n--q q--",
        );
        assert!(quoted.starts_with("multipart:"), "{quoted}");
        // Not multipart as declared: the bytes.
        assert!(
            body_label(Some(b"multipart/form-data; boundary=zz"), b"no parts here")
                .starts_with("bytes:")
        );
        assert!(
            body_label(Some(b"multipart/form-data"), b"--a\r\n\r\nx\r\n--a--")
                .starts_with("bytes:")
        );
    }

    /// Numbers are compared by their exact decimal value, not the `f64` nearest to it;
    /// the JSON text is read as `serde_json` reads it otherwise.
    #[test]
    fn json_numbers_beyond_f64_stay_apart() {
        let label = |body: &str| body_label(Some(b"application/json"), body.as_bytes());
        assert_ne!(
            label(r#"{"amount":18446744073709551616}"#),
            label(r#"{"amount":18446744073709551617}"#)
        );
        assert_ne!(
            label(r#"{"n":0.1}"#),
            label(r#"{"n":0.10000000000000000001}"#)
        );
        assert_ne!(label(r#"{"n":1e400}"#), label(r#"{"n":1e401}"#));
        assert_eq!(label(r#"{"n":0.1}"#), label(r#"{"n":1e-1}"#));
        assert_eq!(label(r#"{"n":10e-1}"#), label(r#"{"n":1}"#));
        for (text, canonical) in [
            ("1", "1"),
            ("1.0", "1"),
            ("1e0", "1"),
            ("-0.0", "0"),
            ("1.5", "1.5"),
            ("0.1", "0.1"),
            ("-2.50", "-2.5"),
            ("1e-7", "1e-7"),
            ("18446744073709551616", "18446744073709551616"),
            ("0.10000000000000000001", "10000000000000000001e-20"),
            ("1e400", "1e400"),
        ] {
            assert_eq!(canonical_number(text).as_deref(), Some(canonical), "{text}");
        }
        // The same canonical text as through `serde_json::Value` for what it reads exactly.
        let body = r#" {"b": [1, 2.5, "x\u00e9\ud83d\ude00\n", null, true], "a": {"z": -7, "y": {}}, "a": 3} "#;
        let mut old = String::new();
        write_canonical(&serde_json::from_str(body).unwrap(), &mut old);
        assert_eq!(canonical_json(body.as_bytes()).unwrap(), old);
        for bad in [
            "{",
            "[1,]",
            "01",
            "1.",
            "\"\\ud800\"",
            "{\"a\":1}x",
            "\"\u{1}\"",
        ] {
            assert_eq!(canonical_json(bad.as_bytes()), None, "{bad}");
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(canonical_json(deep.as_bytes()), None);
    }

    #[test]
    fn equal_json_numbers_are_one_number() {
        let label = |body: &str| body_label(Some(b"application/json"), body.as_bytes());
        assert_eq!(label(r#"{"n":1}"#), label(r#"{"n": 1.0}"#));
        assert_eq!(label(r#"{"n":1}"#), label(r#"{"n":1e0}"#));
        assert_eq!(label(r#"{"n":100}"#), label(r#"{"n":1e2}"#));
        assert_eq!(label(r#"{"n":0}"#), label(r#"{"n":-0}"#));
        assert_eq!(label(r#"{"n":0}"#), label(r#"{"n":-0.0}"#));
        assert_eq!(label(r#"{"n":-3}"#), label(r#"{"n":-3.0}"#));
        assert_ne!(label(r#"{"n":1}"#), label(r#"{"n":1.5}"#));
        assert_ne!(label(r#"{"n":1}"#), label(r#"{"n":"1"}"#));
        assert!(label("[1]").starts_with("json:"));
        assert!(body_label(Some(b"text/plain"), b"[1]").starts_with("bytes:"));
        assert!(
            body_label(Some(b"application/problem+json; charset=utf-8"), b"[1]")
                .starts_with("json:")
        );
        assert!(body_label(Some(b"application/json"), b"{not json").starts_with("bytes:"));
        assert_eq!(body_label(None, b""), "");
        let mut fp = Fingerprint::new();
        fp.add("n", &1.0f64);
        let mut fq = Fingerprint::new();
        fq.add("n", &1u8);
        assert_eq!(fp.digest(), fq.digest());
    }
}
