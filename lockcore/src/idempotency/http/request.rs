//! The request model: the idempotency key read from a header (checked before Redis is
//! touched), what of the request is fingerprinted, and where its body was read.

use super::*;

/// Longest idempotency key accepted, in bytes (the limit Stripe and the IETF draft use).
pub const MAX_KEY_LEN: usize = 255;

/// What an idempotent handler sees of its request: the headers, method, matched route
/// and query. The attribute adds it as a hidden first parameter; it is an extractor for
/// axum (`FromRequestParts`, feature `axum`) and actix-web (`FromRequest`, feature
/// `actix`), and never fails to extract.
pub struct IdemRequest {
    /// Lower-case names and raw values.
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) method: String,
    pub(crate) route: String,
    /// The request path as sent.
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) origin: Origin,
    /// Whether tasks that are not `Send` can be spawned here (an actix-web worker runs a
    /// `LocalSet`, or a local runtime).
    pub(crate) spawn_local: bool,
    /// The body's fingerprint label, when this extractor read it (actix-web); axum's is
    /// read by [`BodyFp`].
    pub(crate) body: Option<String>,
    /// What the framework keeps for this request until it is dropped (actix-web: the
    /// `HttpRequest`, on its worker thread).
    pub(crate) _kept: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// The last parameter of an idempotent handler, as the attribute rewrites it: the
/// extractor the handler wrote (`.0`), and what the fingerprint needs of the request
/// body (`.1`). With axum it reads the body (within axum's `DefaultBodyLimit`), records
/// it and hands it on to the extractor; with actix-web the hidden request extractor
/// records the body as the handler's extractors read it, and this one reads whatever
/// they left.
#[doc(hidden)]
pub struct BodyFp<T>(pub T, pub BodySeen);

impl<T: std::fmt::Debug> std::fmt::Debug for BodyFp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The request body's fingerprint label, when [`BodyFp`] read it.
#[doc(hidden)]
#[derive(Debug)]
pub struct BodySeen(pub(crate) Option<String>);

impl BodySeen {
    /// Nothing seen here: the request extractor's reading counts (actix-web), else none.
    pub fn unread() -> Self {
        BodySeen(None)
    }
}

/// The methods whose calls are recorded: the unsafe ones. `GET`, `HEAD`, `OPTIONS` and
/// the rest run the handler without a record (they must not change anything, and a
/// stored `GET` response would hide later changes; `HEAD` is never stored as a `GET`).
pub const RECORDED_METHODS: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

/// Which framework extracted the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Built by hand (tests of the runtime).
    Manual,
    /// axum.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Axum,
    /// actix-web; the request itself is kept on this worker thread under this id
    /// (`HttpRequest` is not `Send`, and axum handlers need `Send` futures).
    #[cfg_attr(not(feature = "actix"), allow(dead_code))]
    Actix(u64),
}

impl IdemRequest {
    /// A request built by hand: `headers` as (name, value) pairs; its path is its
    /// `route`, and it has no body.
    pub fn new(
        method: &str,
        route: &str,
        query: &str,
        headers: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> IdemRequest {
        IdemRequest {
            headers: headers
                .into_iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
                .collect(),
            method: method.to_owned(),
            route: route.to_owned(),
            path: route.to_owned(),
            query: query.to_owned(),
            origin: Origin::Manual,
            spawn_local: false,
            body: None,
            _kept: None,
        }
    }

    /// The fingerprint label of the body: `seen` when [`BodyFp`] read it, else what the
    /// request extractor read (actix-web), else none.
    pub(super) fn body_label(&self, seen: BodySeen) -> String {
        seen.0.or_else(|| self.body.clone()).unwrap_or_default()
    }

    /// The request method.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The route template the framework matched (`/orders/{id}`), empty when unknown.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// Every value of header `name` (case-insensitive).
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

impl std::fmt::Debug for IdemRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdemRequest")
            .field("method", &self.method)
            .field("route", &self.route)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The key from the configured header, checked and escaped; `None` when absent and not
/// required. Nothing here touches Redis.
pub(crate) fn header_key(req: &IdemRequest, spec: &IdemSpec) -> Result<Option<String>, Error> {
    let header = spec.header;
    let values: Vec<&[u8]> = req.header_values(header).collect();
    let raw = match values.as_slice() {
        [] if spec.required => {
            return Err(Error::MissingKey {
                header: header.to_owned(),
            });
        }
        [] => return Ok(None),
        [one] => *one,
        many => {
            return Err(Error::InvalidKey {
                key: shown(many[0]),
                reason: format!(
                    "the request has {} `{header}` headers; send exactly one",
                    many.len()
                ),
            });
        }
    };
    let invalid = |reason: String| Error::InvalidKey {
        key: shown(raw),
        reason,
    };
    if raw.is_empty() {
        return Err(invalid(format!("the `{header}` header is empty")));
    }
    if raw.len() > MAX_KEY_LEN {
        return Err(invalid(format!(
            "the `{header}` header is {} bytes long; at most {MAX_KEY_LEN} are allowed",
            raw.len()
        )));
    }
    if let Some((at, &b)) = raw
        .iter()
        .enumerate()
        .find(|(_, b)| !(0x21..=0x7e).contains(*b))
    {
        let what = match b {
            b'\r' => "a carriage return (CR)".to_owned(),
            b'\n' => "a line feed (LF)".to_owned(),
            b' ' => "a space".to_owned(),
            b'\t' => "a tab".to_owned(),
            0x80.. => format!("a non-ASCII byte (0x{b:02X})"),
            _ => format!("a control character (0x{b:02X})"),
        };
        return Err(invalid(format!(
            "the `{header}` header contains {what} at byte {at}; only visible ASCII characters (`!` to `~`) are allowed"
        )));
    }
    let text = std::str::from_utf8(raw).unwrap_or_default();
    let mut escaped = String::with_capacity(text.len());
    key::escape_into(&mut escaped, text);
    Ok(Some(escaped))
}

/// A header value as it may be shown in an error: escaped, at most 64 characters.
pub(super) fn shown(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    key::escape_into(&mut out, &text);
    if out.chars().count() > 64 {
        out = out.chars().take(64).collect::<String>() + "...";
    }
    out
}
