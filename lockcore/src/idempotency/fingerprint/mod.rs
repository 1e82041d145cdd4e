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
//!   written `"+inf"`, `"-inf"` or `"NaN"` (`serde_json` writes all three as `null`,
//!   as it writes `None`), at any depth: a struct's field, a list's element, a map's
//!   key or value. With
//!   `fingerprint = [a, b]` only those bindings are hashed. A `HashSet` or `HashMap`
//!   binding hashes the same whatever its iteration order (sets are sorted); inside a
//!   struct, write `BTreeSet` for a set (serde cannot tell a `HashSet` field from a list).
//! - handlers (`header = ...`): what the request carries, not the bindings: `method`,
//!   `route` (the route template the framework matched, e.g. `/orders/{id}`; empty when
//!   unknown), `path` (the request path, percent-decoded: the path parameters), `query`
//!   (the query string as decoded `[name, value]` pairs, `+` read as a space, sorted by
//!   name, the values of one name in their order; a name or value that decodes to no
//!   UTF-8 as the array of its bytes) and
//!   `body`: `json:<sha256>` of the canonical JSON of a JSON body (`application/json` or
//!   `*/*+json` that parses), `form:<sha256>` of an `application/x-www-form-urlencoded`
//!   body's fields read as the query is (so reordered fields, `+` or `%20`, `%41` or
//!   `A` are one form), `multipart:<sha256>` of a `multipart/form-data` body's parts
//!   (each part's name, file name, decoded `filename*` when present, content type and
//!   the SHA-256 of its bytes, in order: not the boundary, which clients make anew per
//!   submission; `Content-Disposition` read as RFC 6266 and RFC 7578 say: quoted
//!   strings whole with their backslash escapes, parameter names in any case), else
//!   `bytes:<sha256>` of the raw bytes (a multipart body whose part headers do not parse,
//!   or name a parameter twice, too); empty without a body.
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

mod body;
mod dispatch;
mod probe;
#[cfg(test)]
mod props;

#[cfg(any(feature = "axum", feature = "actix"))]
pub(crate) use body::body_label;
use body::{canonical_query, percent_decode};
pub use dispatch::*;
use probe::{Finite, FloatProbe, non_finite};

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
    /// is refused (see `Fingerprint::failure`).
    pub fn add<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        if let Ok(float) = value.serialize(FloatProbe) {
            return self.add_float(name, float);
        }
        match serde_json::to_value(Finite(value)) {
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
        let v = match non_finite(value) {
            Some(text) => Value::String(text.into()),
            None => serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number),
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
            match serde_json::to_value(Finite(item)) {
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

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use body::{body_label, canonical_json, canonical_number};

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

    /// A quoted parameter is read whole (a `;` inside quotes does not end it, nor does
    /// `\"`) and `filename*` (an RFC 5987 ext-value) is read: two uploads that differ
    /// only there are two payloads. Control: parameter names in any case, a token or a
    /// quoted string of the same text, are one payload (as before).
    #[test]
    fn multipart_quoted_parameters_are_read_whole() {
        let form = |disposition: &str| {
            let body = format!(
                "--b1\r\nContent-Disposition: {disposition}\r\n\r\nPDF bytes\r\n--b1--\r\n"
            );
            body_label(Some(b"multipart/form-data; boundary=b1"), body.as_bytes())
        };
        let a = form(r#"form-data; name="file"; filename="invoice;2025.pdf""#);
        assert!(a.starts_with("multipart:"), "{a}");
        assert_ne!(
            a,
            form(r#"form-data; name="file"; filename="invoice;2026.pdf""#)
        );
        assert_ne!(
            form(r#"form-data; name="file"; filename="a\"b.pdf""#),
            form(r#"form-data; name="file"; filename="a\"c.pdf""#)
        );
        // Escapes kept: a reader that does not unescape sees two names here.
        assert_ne!(
            form(r#"form-data; name="file"; filename="C:\dir\a.pdf""#),
            form(r#"form-data; name="file"; filename="C:dira.pdf""#)
        );
        assert_ne!(
            form("form-data; name=\"file\"; filename*=UTF-8''invoice%E2%82%AC.pdf"),
            form("form-data; name=\"file\"; filename*=UTF-8''invoice%E2%82%A4.pdf")
        );
        // The control: equivalent spellings of one part.
        assert_eq!(
            form(r#"form-data; name="file"; filename="a.pdf""#),
            form(r#"form-data; NAME="file"; Filename=a.pdf"#)
        );
        assert_eq!(
            form("form-data; name=\"file\"; filename*=UTF-8''a%2Epdf"),
            form("form-data; name=\"file\"; FILENAME*=utf-8''a.pdf")
        );
    }

    /// An `application/x-www-form-urlencoded` body is its fields, read as the query is:
    /// reordered fields, `+` or `%20` for a space, `%41` or `A`, are one form. Control:
    /// another value, or the values of one name in another order, are another form.
    #[test]
    fn urlencoded_forms_are_canonical_as_queries() {
        let label = |body: &str| {
            body_label(
                Some(b"application/x-www-form-urlencoded; charset=UTF-8"),
                body.as_bytes(),
            )
        };
        let a = label("amount=12&note=two%20words&to=%41lice");
        assert_eq!(a, label("to=Alice&note=two+words&amount=12"));
        assert_eq!(a, label("note=two+words&&to=Alice&amount=12"));
        // The control: a changed value, or one name's values reordered, differ.
        assert_ne!(a, label("amount=13&note=two+words&to=Alice"));
        assert_ne!(label("id=1&id=2"), label("id=2&id=1"));
        assert_ne!(label("a=%2B"), label("a=+"));
        assert!(body_label(Some(b"text/plain"), b"b=1&a=2").starts_with("bytes:"));
    }

    /// A non-finite float inside a struct, a list or a map has its own encoding, as at
    /// the top level: `NaN`, `+inf`, `-inf` and `None` are four payloads. Control: the
    /// top-level ones and finite nested ones are written as before.
    #[test]
    fn nested_non_finite_floats_have_own_encodings() {
        #[derive(serde::Serialize)]
        struct Reading {
            value: Option<f64>,
            history: Vec<f32>,
        }
        let fp = |r: &Reading| {
            let mut fp = Fingerprint::new();
            fp.add("r", r);
            fp.canonical()
        };
        let one = |v: Option<f64>| {
            fp(&Reading {
                value: v,
                history: vec![],
            })
        };
        let all = [
            None,
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
            Some(1.5),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(one(*a), one(*b), "{a:?} {b:?}");
            }
        }
        let list = |h: Vec<f32>| {
            fp(&Reading {
                value: None,
                history: h,
            })
        };
        assert_ne!(list(vec![f32::NAN]), list(vec![f32::INFINITY]));
        let map = |x: f64| {
            let mut fp = Fingerprint::new();
            fp.add("m", &BTreeMap::from([("k", x)]));
            fp.canonical()
        };
        assert_ne!(map(f64::NAN), map(f64::NEG_INFINITY));
        // The control: finite values as before, and the top level as before.
        assert_eq!(
            fp(&Reading {
                value: Some(2.0),
                history: vec![0.5]
            }),
            r#"{"args":{"r":{"history":[0.5],"value":2}}}"#
        );
        let mut top = Fingerprint::new();
        top.add("x", &f64::NAN);
        top.add("y", &f64::NEG_INFINITY);
        assert_eq!(top.canonical(), r#"{"args":{"x":"NaN","y":"-inf"}}"#);
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
