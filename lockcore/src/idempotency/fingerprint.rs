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
//!   `Extension`, `web::Data`, a `Locks`) or it is listed in `skip = [...]`. With
//!   `fingerprint = [a, b]` only those bindings are hashed. A `HashSet` or `HashMap`
//!   binding hashes the same whatever its iteration order (sets are sorted); inside a
//!   struct, write `BTreeSet` for a set (serde cannot tell a `HashSet` field from a list).
//! - handlers (`header = ...`): what the request carries, not the bindings: `method`,
//!   `route` (the route template the framework matched, e.g. `/orders/{id}`; empty when
//!   unknown), `path` (the request path, percent-decoded: the path parameters), `query`
//!   (the query string as decoded `[name, value]` pairs, `+` read as a space, sorted) and
//!   `body`: `json:<sha256>` of the canonical JSON of a JSON body (`application/json` or
//!   `*/*+json` that parses), else `bytes:<sha256>` of the raw bytes; empty without a body.
//!
//! Numbers are written canonically: a number with an integral value is written as an
//! integer (`1`, `1.0` and `1e0` are one number; so are `100` and `1e2`; `-0` is `0`),
//! any other as `serde_json` writes an `f64`. So the order of fields, the whitespace and
//! the spelling of numbers in a JSON body do not change the fingerprint; a changed value
//! does. The digest is lower-case hex.

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

    /// Adds the binding `name`.
    pub fn add<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        match serde_json::to_value(value) {
            Ok(v) => {
                self.args.insert(name, v);
            }
            Err(e) => {
                tracing::warn!(target: "distlock", binding = name, error = %e, "argument left out of the idempotency fingerprint: it failed to serialize");
                self.skipped.push(name);
            }
        }
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
                    tracing::warn!(target: "distlock", binding = name, error = %e, "argument left out of the idempotency fingerprint: it failed to serialize");
                    self.skipped.push(name);
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

/// A query string as sorted `[name, value]` pairs, each percent-decoded with `+` as a
/// space (as `application/x-www-form-urlencoded`, which axum's `Query` and actix's
/// `web::Query` read): `a=%41&b` and `b=&a=A` are one query.
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
    pairs.sort();
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
    if json && let Ok(v) = serde_json::from_slice::<Value>(body) {
        let mut text = String::new();
        write_canonical(&v, &mut text);
        return format!("json:{}", hex(&Sha256::digest(text.as_bytes())));
    }
    format!("bytes:{}", hex(&Sha256::digest(body)))
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
