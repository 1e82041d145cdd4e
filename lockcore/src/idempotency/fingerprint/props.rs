//! Property tests of the canonicalisers: equal payloads (reordered fields and parameters,
//! equivalent encodings) give equal fingerprints, different payloads different ones, and
//! no input panics. A fixed number of cases per run.

use proptest::prelude::*;
use serde_json::Map;

use super::body::{canonical_form, canonical_number, disposition_params, part_headers};
use super::*;

const CASES: u32 = 256;

/// Text for a header parameter: anything but CR and LF, the separators included.
fn param_text() -> impl Strategy<Value = String> {
    "[^\r\n]{0,12}"
}

/// `s` as a quoted string: `"` and `\` escaped with a backslash.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `s` as an RFC 8187 ext-value in UTF-8, every byte but letters and digits escaped
/// (`lower` picks the case of the hex digits).
fn ext(s: &str, lower: bool) -> String {
    let mut out = String::from(if lower { "utf-8''" } else { "UTF-8''" });
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(char::from(b));
        } else if lower {
            out.push_str(&format!("%{b:02x}"));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `word` with the case of each letter flipped where `flips` says.
fn recase(word: &str, flips: u32) -> String {
    word.chars()
        .enumerate()
        .map(|(i, c)| {
            if flips >> (i % 32) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

/// One form part: its name, file name (plain, or as `filename*`), type and bytes.
#[derive(Debug, Clone)]
struct Part {
    name: String,
    filename: Option<String>,
    ext: bool,
    content_type: Option<String>,
    content: String,
}

fn part() -> impl Strategy<Value = Part> {
    (
        param_text(),
        proptest::option::of(param_text()),
        any::<bool>(),
        proptest::option::of("[a-z]{1,8}/[a-z]{1,8}"),
        "[a-z0-9 ]{0,20}",
    )
        .prop_map(|(name, filename, ext, content_type, content)| Part {
            name,
            filename,
            ext,
            content_type,
            content,
        })
}

/// A multipart body of `parts` with `boundary`; `flips` and `lower` vary the spelling
/// (the case of names and hex digits, the spaces) but not the payload.
fn multipart(parts: &[Part], boundary: &str, flips: u32, lower: bool) -> String {
    let mut body = String::new();
    let space = if lower { " " } else { "  " };
    for p in parts {
        body.push_str(&format!(
            "--{boundary}\r\n{}:{space}form-data;{space}{}={}",
            recase("content-disposition", flips),
            recase("name", flips),
            quoted(&p.name)
        ));
        if let Some(f) = &p.filename {
            if p.ext {
                body.push_str(&format!(
                    "; {}={}",
                    recase("filename*", flips),
                    ext(f, lower)
                ));
            } else {
                body.push_str(&format!("; {}={}", recase("filename", flips), quoted(f)));
            }
        }
        body.push_str("\r\n");
        if let Some(t) = &p.content_type {
            body.push_str(&format!(
                "{}: {}\r\n",
                recase("content-type", flips),
                recase(t, flips)
            ));
        }
        body.push_str(&format!("\r\n{}\r\n", p.content));
    }
    body.push_str(&format!("--{boundary}--\r\n"));
    body
}

fn multipart_label(parts: &[Part], boundary: &str, flips: u32, lower: bool) -> String {
    let ct = format!("multipart/form-data; boundary={boundary}");
    body_label(
        Some(ct.as_bytes()),
        multipart(parts, boundary, flips, lower).as_bytes(),
    )
}

/// A form's fields percent-encoded: letters and digits literal or escaped as `escape`
/// says, a space as `+` or `%20`, anything else escaped (hex digits in either case).
fn urlencode(pairs: &[(String, String)], escape: &[bool]) -> String {
    let mut n = 0;
    let mut flag = || {
        n += 1;
        escape
            .get(n % escape.len().max(1))
            .copied()
            .unwrap_or(false)
    };
    let mut enc = |s: &str| {
        let mut out = String::new();
        for b in s.bytes() {
            let f = flag();
            match b {
                b' ' if f => out.push_str("%20"),
                b' ' => out.push('+'),
                b if b.is_ascii_alphanumeric() && !f => out.push(char::from(b)),
                b if f => out.push_str(&format!("%{b:02x}")),
                b => out.push_str(&format!("%{b:02X}")),
            }
        }
        out
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The fields reordered by `keys` (one per name: the values of one name keep their
/// order, which a handler may read).
fn reorder(pairs: &[(String, String)], keys: &[u8]) -> Vec<(String, String)> {
    let mut names: Vec<&String> = Vec::new();
    for (k, _) in pairs {
        if !names.contains(&k) {
            names.push(k);
        }
    }
    let mut out = pairs.to_vec();
    out.sort_by_key(|(k, _)| {
        let at = names.iter().position(|n| *n == k).unwrap_or(0);
        keys.get(at).copied().unwrap_or(0)
    });
    out
}

fn pairs() -> impl Strategy<Value = Vec<(String, String)>> {
    proptest::collection::vec(("[a-c é&=+%]{1,4}", "[a-z0-9 é&=+%/]{0,6}"), 0..6)
}

fn form_label(body: &str) -> String {
    body_label(Some(b"application/x-www-form-urlencoded"), body.as_bytes())
}

/// JSON values: integers, non-integral floats (an integral float is the integer), strings,
/// lists and objects.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("non-integral and finite", |f| f.is_finite()
                && f.fract() != 0.0)
            .prop_map(Value::from),
        "[a-z\"\\\\é\u{1}]{0,5}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map("[a-e]{1,2}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// `v` as JSON text with each object's keys in reverse order and spaces between tokens.
fn respelled(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            out.push_str("{ ");
            for (i, (k, v)) in map.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(" : ");
                respelled(v, out);
            }
            out.push_str(" }");
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                respelled(item, out);
            }
            out.push_str(" ]");
        }
        v => out.push_str(&serde_json::to_string(v).unwrap()),
    }
}

/// `v` with each object's keys inserted in reverse order (a map that keeps insertion
/// order, as `serde_json`'s `preserve_order` makes it, iterates them so).
fn reversed(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .rev()
                .map(|(k, v)| (k.clone(), reversed(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
        v => v.clone(),
    }
}

fn json_label(text: &str) -> String {
    body_label(Some(b"application/json"), text.as_bytes())
}

/// What a float contributes to the fingerprint: each non-finite one its own, zero one.
fn float_class(x: f64) -> (u8, u64) {
    if x.is_nan() {
        (1, 0)
    } else if x == 0.0 {
        (0, 0)
    } else {
        (2, x.to_bits())
    }
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(-0.0),
        Just(1.5),
        any::<f64>(),
    ]
}

#[derive(serde::Serialize)]
struct Nested {
    first: Option<f64>,
    rest: Vec<f64>,
}

fn nested_fp(first: Option<f64>, rest: &[f64]) -> String {
    let mut fp = Fingerprint::new();
    fp.add(
        "n",
        &Nested {
            first,
            rest: rest.to_vec(),
        },
    );
    fp.digest()
}

proptest! {
    // No regression files written beside the crate: a failure prints its input.
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    })]

    /// A form sent again (another boundary, names and hex digits in another case, other
    /// spaces) is one payload.
    #[test]
    fn multipart_respelled_is_equal(
        parts in proptest::collection::vec(part(), 1..4),
        b1 in "[a-zA-Z0-9]{8,16}",
        b2 in "[a-zA-Z0-9]{8,16}",
        flips in any::<u32>(),
    ) {
        let a = multipart_label(&parts, &b1, 0, true);
        prop_assert!(a.starts_with("multipart:"), "{}", a);
        prop_assert_eq!(a, multipart_label(&parts, &b2, flips, false));
    }

    /// Another name or file name in a part is another payload.
    #[test]
    fn multipart_other_names_differ(
        parts in proptest::collection::vec(part(), 1..4),
        at in any::<prop::sample::Index>(),
        other in param_text(),
        on_filename in any::<bool>(),
    ) {
        let mut changed = parts.clone();
        let p = &mut changed[at.index(parts.len())];
        if on_filename {
            prop_assume!(p.filename.as_deref() != Some(other.as_str()));
            p.filename = Some(other);
        } else {
            prop_assume!(p.name != other);
            p.name = other;
        }
        prop_assert_ne!(
            multipart_label(&parts, "bnd", 0, true),
            multipart_label(&changed, "bnd", 0, true)
        );
    }

    /// A quoted parameter reads back as the text between its quotes (escapes kept), a
    /// `filename*` as the text that was encoded.
    #[test]
    fn disposition_parameters_read_back(name in param_text(), file in param_text(), lower in any::<bool>()) {
        let value = format!(" form-data; name={}; filename={}", quoted(&name), quoted(&file));
        let inner = |s: &str| quoted(s)[1..].strip_suffix('"').unwrap().to_owned();
        prop_assert_eq!(
            disposition_params(&value),
            Some(vec![("name".to_owned(), inner(&name)), ("filename".to_owned(), inner(&file))])
        );
        let head = format!("Content-Disposition: form-data; name={}; filename*={}", quoted(&name), ext(&file, lower));
        let headers = part_headers(head.as_bytes()).unwrap();
        prop_assert_eq!(headers.name, Some(inner(&name)));
        prop_assert_eq!(headers.filename_ext, Some(file));
    }

    /// No input panics the multipart reader.
    #[test]
    fn multipart_any_input_does_not_panic(
        ct in proptest::collection::vec(any::<u8>(), 0..40),
        body in proptest::collection::vec(any::<u8>(), 0..200),
        head in "\\PC{0,60}",
    ) {
        let _ = body_label(Some(&ct), &body);
        let _ = body_label(Some(b"multipart/form-data; boundary=x"), &body);
        let _ = disposition_params(&head);
        let _ = part_headers(head.as_bytes());
        let framed = format!("--x\r\nContent-Disposition:{head}\r\n\r\nv\r\n--x--");
        let _ = body_label(Some(b"multipart/form-data; boundary=x"), framed.as_bytes());
    }

    /// A form or a query with its fields reordered (one name's values in their order) and
    /// encoded otherwise is one payload, and decodes to its fields.
    #[test]
    fn forms_respelled_are_equal(
        pairs in pairs(),
        e1 in proptest::collection::vec(any::<bool>(), 1..16),
        e2 in proptest::collection::vec(any::<bool>(), 1..16),
        keys in proptest::collection::vec(any::<u8>(), 6),
    ) {
        let a = urlencode(&pairs, &e1);
        let b = urlencode(&reorder(&pairs, &keys), &e2);
        prop_assert!(a.is_empty() || form_label(&a).starts_with("form:"));
        prop_assert_eq!(form_label(&a), form_label(&b));
        prop_assert_eq!(canonical_query(&a), canonical_query(&b));
        let mut sorted = pairs.clone();
        sorted.sort_by(|x, y| x.0.cmp(&y.0));
        let expected: Vec<Value> = sorted
            .into_iter()
            .map(|(k, v)| Value::Array(vec![Value::String(k), Value::String(v)]))
            .collect();
        prop_assert_eq!(canonical_form(a.as_bytes()), Value::Array(expected));
    }

    /// Another value in a field is another form.
    #[test]
    fn forms_with_another_value_differ(pairs in pairs(), at in any::<prop::sample::Index>(), extra in "[a-z0-9 é&=+%]{1,3}") {
        prop_assume!(!pairs.is_empty());
        let mut changed = pairs.clone();
        changed[at.index(pairs.len())].1.push_str(&extra);
        prop_assert_ne!(form_label(&urlencode(&pairs, &[false])), form_label(&urlencode(&changed, &[false])));
    }

    /// No input panics the form reader; bytes that decode to no UTF-8 stay apart.
    #[test]
    fn forms_any_input_does_not_panic(raw in proptest::collection::vec(any::<u8>(), 0..80), a in any::<u8>(), b in any::<u8>()) {
        let _ = canonical_form(&raw);
        let _ = body_label(Some(b"application/x-www-form-urlencoded"), &raw);
        let _ = canonical_query(&String::from_utf8_lossy(&raw));
        prop_assume!(a != b);
        prop_assert_ne!(canonical_query(&format!("k=%{a:02X}")), canonical_query(&format!("k=%{b:02X}")));
    }

    /// A JSON body with its keys reordered and other whitespace is one payload, and so is
    /// the same value as a binding; two different values are two.
    #[test]
    fn json_respelled_is_equal_and_others_differ(a in json(), b in json()) {
        let mut text = String::new();
        respelled(&a, &mut text);
        let label = json_label(&serde_json::to_string(&a).unwrap());
        prop_assert!(label.starts_with("json:"));
        prop_assert_eq!(&label, &json_label(&text));
        let digest = |v: &Value| { let mut fp = Fingerprint::new(); fp.add("v", v); fp.digest() };
        prop_assert_eq!(digest(&a), digest(&reversed(&a)));
        let other = json_label(&serde_json::to_string(&b).unwrap());
        prop_assert_eq!(a == b, label == other);
        prop_assert_eq!(a == b, digest(&a) == digest(&b));
    }

    /// No text panics the JSON reader.
    #[test]
    fn json_any_input_does_not_panic(raw in proptest::collection::vec(any::<u8>(), 0..80), text in "[-+0-9eE.]{0,12}") {
        let _ = body_label(Some(b"application/json"), &raw);
        let _ = canonical_number(&text);
    }

    /// Floats at any depth: two bindings share a fingerprint exactly when their floats
    /// are equal (`-0.0` is `0.0`), each non-finite one its own, never `None`'s.
    #[test]
    fn nested_floats_are_told_apart(
        first_a in proptest::option::of(float()),
        first_b in proptest::option::of(float()),
        rest_a in proptest::collection::vec(float(), 0..4),
        rest_b in proptest::collection::vec(float(), 0..4),
    ) {
        let class = |first: Option<f64>, rest: &[f64]| {
            (first.map(float_class), rest.iter().copied().map(float_class).collect::<Vec<_>>())
        };
        let same = class(first_a, &rest_a) == class(first_b, &rest_b);
        prop_assert_eq!(same, nested_fp(first_a, &rest_a) == nested_fp(first_b, &rest_b));
        prop_assert_eq!(nested_fp(first_a, &rest_a), nested_fp(first_a, &rest_a));
    }
}
