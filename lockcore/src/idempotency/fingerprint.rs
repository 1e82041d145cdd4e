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
//! - `args`: each parameter binding (the names the parameter patterns introduce, such as
//!   `id` in `Path(id): Path<u64>` or `order` in `Json(order): Json<Order>`) whose type
//!   implements `serde::Serialize`, under its name, as `serde_json` serializes it.
//!   Bindings of other types (`State`, pools, clients) are left out; so is `self`.
//!   With `fingerprint = [a, b]` only those bindings are hashed, and they must be
//!   `Serialize`.
//! - handlers only: `method`, `route` (the route template the framework matched, e.g.
//!   `/orders/{id}`; empty when unknown) and `query` (the raw query string split on `&`,
//!   empty parts dropped, sorted, joined with `&`).
//!
//! Because arguments are hashed after deserialization, the order of fields and the
//! whitespace in a JSON request body do not change the fingerprint; a changed value does.
//! The digest is lower-case hex.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

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
    query: String,
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

    /// Adds the request line of a handler call.
    pub(crate) fn http(&mut self, method: &str, route: &str, query: &str) {
        let mut parts: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
        parts.sort_unstable();
        self.http = Some(Http {
            method: method.to_owned(),
            route: route.to_owned(),
            query: parts.join("&"),
        });
    }

    /// The bindings left out.
    pub(crate) fn skipped(&self) -> &[&'static str] {
        &self.skipped
    }

    /// The canonical document (see the module docs).
    pub(crate) fn canonical(&self) -> String {
        let mut doc = serde_json::Map::new();
        doc.insert(
            "args".into(),
            Value::Object(
                self.args
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect(),
            ),
        );
        if let Some(h) = &self.http {
            doc.insert("method".into(), Value::String(h.method.clone()));
            doc.insert("route".into(), Value::String(h.route.clone()));
            doc.insert("query".into(), Value::String(h.query.clone()));
        }
        let mut out = String::new();
        write_canonical(&Value::Object(doc), &mut out);
        out
    }

    /// SHA-256 of [`canonical`](Self::canonical), lower-case hex.
    pub(crate) fn digest(&self) -> String {
        let hash = Sha256::digest(self.canonical().as_bytes());
        let mut hex = String::with_capacity(64);
        for b in hash.iter() {
            let _ = write!(hex, "{b:02x}");
        }
        hex
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
                out.push_str(&Value::String(k.clone()).to_string());
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
        other => out.push_str(&other.to_string()),
    }
}

/// One argument offered to the fingerprint by generated code:
/// `(&&FpArg(name, &binding)).__distlock_fp(&mut fp)` adds it when its type is
/// `Serialize` ([`FpSerialize`], found first) and skips it otherwise ([`FpSkip`]).
#[doc(hidden)]
pub struct FpArg<'a, T: ?Sized>(pub &'static str, pub &'a T);

/// Adds a `Serialize` argument (autoref specialization, preferred).
#[doc(hidden)]
pub trait FpSerialize {
    /// Adds the argument.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: Serialize + ?Sized> FpSerialize for &FpArg<'_, T> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.add(self.0, self.1);
    }
}

/// Skips any other argument (autoref specialization, fallback).
#[doc(hidden)]
pub trait FpSkip {
    /// Records the argument as left out.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: ?Sized> FpSkip for FpArg<'_, T> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.skip(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pool;

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
    fn autoref_skips_what_cannot_be_serialized() {
        let id = 7u64;
        let pool = Pool;
        let mut fp = Fingerprint::new();
        (&&FpArg("id", &id)).__distlock_fp(&mut fp);
        (&&FpArg("pool", &pool)).__distlock_fp(&mut fp);
        assert_eq!(fp.skipped(), ["pool"]);
        fp.http("POST", "/x/{id}", "b=2&&a=1");
        assert_eq!(
            fp.canonical(),
            r#"{"args":{"id":7},"method":"POST","query":"a=1&b=2","route":"/x/{id}"}"#
        );
        assert_eq!(fp.digest().len(), 64);
    }
}
