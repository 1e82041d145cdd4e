//! The record: one plain UTF-8 value per key, readable with `redis-cli GET`.
//!
//! While the body runs (written by the claimer; its lease is the key's ttl minus the
//! retention, and `lease_until_ms` the claimer's view of it, renewed by Redis's clock):
//!
//! ```json
//! {"claimed_at_ms":1764485970000,"fp":"<sha-256 hex>","lease_until_ms":1764486000000,"owner":"<uuid>:<host>:<pid>","retention_ms":86400000,"status":"in_progress"}
//! ```
//!
//! Once it has completed, the store appends (written by this module, `status` and `fp`
//! first so that the scripts find and read them without decoding the rest):
//!
//! ```json
//! {"status":"completed","fp":"<hex>","completed_at_ms":1764485971234,"value":{"receipt":"r-1"}}
//! {"status":"completed","fp":"<hex>","completed_at_ms":1764485971234,"response":{"status":201,"headers":[["content-type","application/json"]],"body":"{\"id\":7}"}}
//! ```
//!
//! A response body that is not UTF-8 is stored as `"body_base64"` instead of `"body"`,
//! and a header value that is not UTF-8 as `[name, "<base64>", "base64"]`.
//! A fn's `Ok` value that cannot be stored (it fails to serialize, or does not read back
//! as itself: `f64::NAN` becomes `null`) completes the record all the same, with
//! `"unstorable":"<why>"` instead of `"value"`: the body ran once and never runs again
//! under the key, and repeats get [`Error::Unrepresentable`].
//!
//! The value is then the in-progress record followed by the completed one (the completed
//! one alone if the key had gone). The result is the first completed record: a later
//! store (a claimer taken over while it ran, or a retried store) appends after it, and is
//! ignored. A reader takes the value from its first `{"status":"completed"` and reads
//! one JSON object there.

use serde::{Deserialize, Serialize};

use crate::error::{BackendError, BackendErrorKind, Error};

/// A response captured from a handler, framework-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and raw values, in order; a name may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
}

/// Response headers never stored for replay: `Set-Cookie`, `Date`, the hop-by-hop
/// headers (RFC 9110 §7.6.1) and the framing headers the server recomputes.
pub(crate) const NOT_REPLAYED: &[&str] = &[
    "set-cookie",
    "date",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    REPLAYED_HEADER_LOWER,
];

/// The header every replayed response carries, with value `true`.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";
const REPLAYED_HEADER_LOWER: &str = "idempotent-replayed";

/// Headers the server sets itself: never copied from a captured response.
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
const FRAMING: &[&str] = &["content-length", "transfer-encoding"];

/// The stored headers a replay sends: all but the framing ones, which the server sets.
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
pub(crate) fn replayed_headers(
    headers: Vec<(String, Vec<u8>)>,
) -> impl Iterator<Item = (String, Vec<u8>)> {
    headers
        .into_iter()
        .filter(|(name, _)| !FRAMING.contains(&name.as_str()))
}

/// A header as stored: `[name, value]`, or `[name, "<base64 of the value>", "base64"]`
/// for a value that is not UTF-8 (HTTP allows any byte but control characters).
#[derive(Serialize, Deserialize)]
struct StoredResponse {
    status: u16,
    headers: Vec<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

#[derive(Deserialize)]
struct Completed {
    #[serde(default)]
    response: Option<StoredResponse>,
}

fn completed(fp: &str, field: &str, json: &str) -> String {
    // `status` then `fp` first: the scripts read these two with a pattern.
    format!(
        r#"{{"status":"completed","fp":"{fp}","completed_at_ms":{},"{field}":{json}}}"#,
        crate::util::now_ms()
    )
}

/// The completed record of a plain fn's `Ok` value.
pub(crate) fn completed_value(fp: &str, value: &serde_json::Value) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
    completed(fp, "value", &json)
}

/// The completed record of a plain fn whose `Ok` value could not be stored (`reason`):
/// the call ran, so the key is done, and repeats are told so (see [`stored_value`]).
pub(crate) fn completed_unstorable(fp: &str, reason: &str) -> String {
    let json = serde_json::to_string(reason).unwrap_or_else(|_| "\"\"".into());
    completed(fp, "unstorable", &json)
}

/// The completed record of a handler's response, without the headers never replayed.
/// Header values that are not UTF-8 are stored in base64 (see [`StoredResponse`]).
pub(crate) fn completed_response(fp: &str, cap: &Captured) -> String {
    let headers = cap
        .headers
        .iter()
        .filter(|(name, _)| !NOT_REPLAYED.contains(&name.as_str()))
        .map(|(name, value)| match std::str::from_utf8(value) {
            Ok(text) => vec![name.clone(), text.to_owned()],
            Err(_) => vec![name.clone(), base64_encode(value), "base64".to_owned()],
        })
        .collect();
    let (body, body_base64) = match std::str::from_utf8(&cap.body) {
        Ok(s) => (Some(s.to_owned()), None),
        Err(_) => (None, Some(base64_encode(&cap.body))),
    };
    let stored = StoredResponse {
        status: cap.status,
        headers,
        body,
        body_base64,
    };
    let json = serde_json::to_string(&stored).unwrap_or_else(|_| "null".into());
    completed(fp, "response", &json)
}

fn corrupt(key: &str, what: impl std::fmt::Display) -> Error {
    Error::backend(
        key,
        BackendError::new(
            BackendErrorKind::Response,
            format!("the stored idempotency record cannot be replayed: {what}"),
        ),
    )
}

/// The JSON object at the start of `raw`, whatever follows it (later stores append).
fn first_object<T: serde::de::DeserializeOwned>(raw: &str) -> serde_json::Result<T> {
    T::deserialize(&mut serde_json::Deserializer::from_str(raw))
}

/// The stored `Ok` value of a completed record (`null` included: `()` and `None` are
/// results too).
pub(crate) fn stored_value(key: &str, raw: &str) -> Result<serde_json::Value, Error> {
    let mut rec: serde_json::Map<String, serde_json::Value> =
        first_object(raw).map_err(|e| corrupt(key, e))?;
    if let Some(reason) = rec.remove("unstorable") {
        return Err(Error::Unrepresentable {
            key: key.to_owned(),
            reason: format!(
                "the first call under this key ran and returned Ok, but its result could not \
                 be stored ({}); it is not run again, and cannot be replayed",
                reason.as_str().unwrap_or("unknown")
            ),
        });
    }
    rec.remove("value")
        .ok_or_else(|| corrupt(key, "it holds an HTTP response, not a function result"))
}

/// The stored response of a completed record.
pub(crate) fn stored_response(key: &str, raw: &str) -> Result<Captured, Error> {
    let rec: Completed = first_object(raw).map_err(|e| corrupt(key, e))?;
    let stored = rec
        .response
        .ok_or_else(|| corrupt(key, "it holds a function result, not an HTTP response"))?;
    let body = match (stored.body, stored.body_base64) {
        (Some(s), _) => s.into_bytes(),
        (None, Some(b)) => base64_decode(&b).ok_or_else(|| corrupt(key, "bad base64 body"))?,
        (None, None) => Vec::new(),
    };
    let headers = stored
        .headers
        .into_iter()
        .map(|entry| match <[String; 2]>::try_from(entry) {
            Ok([name, value]) => Ok((name, value.into_bytes())),
            Err(entry) => match <[String; 3]>::try_from(entry) {
                Ok([name, value, encoding]) if encoding == "base64" => {
                    let bytes = base64_decode(&value)
                        .ok_or_else(|| corrupt(key, "bad base64 header value"))?;
                    Ok((name, bytes))
                }
                _ => Err(corrupt(key, "a header is not [name, value]")),
            },
        })
        .collect::<Result<_, _>>()?;
    Ok(Captured {
        status: stored.status,
        headers,
        body,
    })
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub(crate) fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"\xff\x00\x80binary",
        ] {
            let enc = base64_encode(data);
            assert_eq!(base64_decode(&enc).unwrap(), data, "{enc}");
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
    }

    #[test]
    fn responses_round_trip_without_unreplayable_headers() {
        let cap = Captured {
            status: 201,
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("set-cookie".into(), b"s=1".to_vec()),
                ("x-a".into(), b"1".to_vec()),
                ("x-a".into(), b"2".to_vec()),
                ("date".into(), b"today".to_vec()),
            ],
            body: b"{\"id\":7}".to_vec(),
        };
        let raw = completed_response("ab", &cap);
        assert!(
            raw.starts_with(r#"{"status":"completed","fp":"ab","#),
            "{raw}"
        );
        let back = stored_response("k", &raw).unwrap();
        assert_eq!(back.status, 201);
        assert_eq!(back.body, cap.body);
        let names: Vec<_> = back.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-a", "x-a"]);
        // A value that is not UTF-8 (HTTP allows obs-text) is kept, byte for byte; a
        // record written before, with `[name, value]` pairs only, still reads.
        let latin1 = Captured {
            status: 200,
            headers: vec![("x-name".into(), b"caf\xe9".to_vec())],
            body: Vec::new(),
        };
        let raw = completed_response("ab", &latin1);
        assert!(raw.contains(r#"["x-name","Y2Fm6Q==","base64"]"#), "{raw}");
        assert_eq!(stored_response("k", &raw).unwrap().headers, latin1.headers);
        let earlier = r#"{"status":"completed","fp":"ab","completed_at_ms":1,"response":{"status":204,"headers":[["x-a","1"]]}}"#;
        assert_eq!(
            stored_response("k", earlier).unwrap().headers,
            [("x-a".to_owned(), b"1".to_vec())]
        );
        let bin = Captured {
            status: 200,
            headers: vec![],
            body: vec![0xff, 0, 1],
        };
        let raw = completed_response("ab", &bin);
        assert!(raw.contains("body_base64"));
        assert_eq!(stored_response("k", &raw).unwrap().body, bin.body);
        assert!(stored_value("k", &raw).is_err());
        let unit = completed_value("ab", &serde_json::Value::Null);
        assert_eq!(stored_value("k", &unit).unwrap(), serde_json::Value::Null);
        // A later store appended after the first result: the first is read.
        let later = completed_response("ab", &bin);
        let both = format!("{}{later}", completed_response("ab", &cap));
        assert_eq!(stored_response("k", &both).unwrap().body, cap.body);
        let value = serde_json::json!({"status": "completed", "fp": "ab", "n": 1});
        let first = completed_value("ab", &value);
        assert_eq!(
            stored_value("k", &format!("{first}{unit}")).unwrap(),
            value,
            "a value that looks like a record is read whole"
        );
    }
}
