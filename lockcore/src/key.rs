//! Key building: escaping interpolated values and keeping companion keys in one hash slot.
//!
//! # Escaping
//!
//! A value interpolated into a key template (`<id>` in `"order:<id>"`) is written with
//! its `Display` impl, then every byte that could change the key's shape is
//! percent-encoded as `%XX` (upper-case hex of each UTF-8 byte):
//!
//! | byte | why |
//! |---|---|
//! | `%` | the escape character itself, so escaping is reversible |
//! | `:` | the separator: `"a:b"` as a value must not look like two segments |
//! | `{` `}` | Redis Cluster hash-tag delimiters: user data never chooses the slot |
//! | whitespace, ASCII control characters | invisible in logs and `redis-cli` |
//!
//! Everything else, including non-ASCII letters, is kept as it is, so keys stay
//! readable. Literal text in the template is never escaped: a `{...}` written there
//! is a hash tag on purpose.
//!
//! ```
//! use lockcore::key::escape_into;
//! let mut key = String::from("order:");
//! escape_into(&mut key, "a:b {c}\n");
//! assert_eq!(key, "order:a%3Ab%20%7Bc%7D%0A");
//! ```

use std::fmt::{self, Write as _};

/// What a name is held as (see "What each primitive writes" in the crate docs): the
/// kinds named by [`Error::WrongKind`](crate::Error::WrongKind).
///
/// ```
/// assert_eq!(lockcore::key::Kind::Semaphore.to_string(), "a semaphore");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// A lock, or as what holds a key, a lock or a write lock: one holder's token at the
    /// key (the two exclude each other by design, as two locks do).
    Lock,
    /// A write lock: a token at the key as a lock's, told from one by its UUID's version
    /// (8, a lock's 4: see [`LockState::kind`](crate::LockState::kind)).
    WriteLock,
    /// A read lock's shares: the readers in `{key}:readers`, and `readers` at the key
    /// while any reader holds (so a lock, a write lock and a multi-lock wait for them).
    ReadLock,
    /// A semaphore's permits: a sorted set at the key (with its limit, see
    /// [`semaphore_limit`]).
    Semaphore,
    /// An idempotency record (`<prefix>idem:...`).
    IdempotencyRecord,
    /// A value distlock did not write (an application's data under the prefix).
    Unknown,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Lock => "a lock",
            Kind::WriteLock => "a write lock",
            Kind::ReadLock => "a read lock",
            Kind::Semaphore => "a semaphore",
            Kind::IdempotencyRecord => "an idempotency record",
            Kind::Unknown => "a value distlock did not write",
        })
    }
}

/// The value at a read lock's key while readers hold it (see [`Kind::ReadLock`]): never a
/// token (tokens are `<uuid>:<holder>`).
pub(crate) const READERS_MARK: &str = "readers";

/// The member of a semaphore's sorted set that stores its limit (the permit count of the
/// latest acquire that took a permit): `limit:<n>`, scored `+inf`, so that no lease's
/// end (a finite score) is ever it, expired leases' removal (`ZREMRANGEBYSCORE -inf
/// <now>`) keeps it, and it is no token (a token begins with a UUID). The permits held
/// are the members scored below `+inf`; the key goes with its last permit (released, or
/// its lease ended with the key's ttl), the limit with it.
pub(crate) fn limit_member(permits: u32) -> String {
    format!("{LIMIT_MEMBER}{permits}")
}

const LIMIT_MEMBER: &str = "limit:";

/// The limit a member of a semaphore's sorted set stores, if it is the limit: the
/// member `limit:<n>`, scored `+inf` (see "What each primitive writes" in the crate
/// docs).
///
/// ```
/// assert_eq!(lockcore::key::semaphore_limit("limit:4"), Some(4));
/// assert_eq!(lockcore::key::semaphore_limit("0b5c6a8e-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-1:7"), None);
/// ```
pub fn semaphore_limit(member: &str) -> Option<u32> {
    member.strip_prefix(LIMIT_MEMBER)?.parse().ok()
}

/// A fresh token's UUID for a holder of `kind`: random (version 4), except a write
/// lock's, whose random bits carry version 8 (custom) instead, so that `inspect` tells a
/// held write lock from a lock by its token alone (both hold the key the same way, and
/// exclude each other as two locks do). The token stays `<uuid>:<holder>`.
pub(crate) fn token_uuid(kind: Kind) -> uuid::Uuid {
    let random = uuid::Uuid::new_v4();
    match kind {
        Kind::WriteLock => uuid::Builder::from_custom_bytes(random.into_bytes()).into_uuid(),
        _ => random,
    }
}

/// Whether `token` (`<uuid>:<holder>`) is a write lock's (see [`token_uuid`]).
pub(crate) fn is_write_token(token: &str) -> bool {
    token
        .split_once(':')
        .and_then(|(uuid, _)| uuid::Uuid::try_parse(uuid).ok())
        .is_some_and(|uuid| uuid.get_version_num() == 8)
}

/// Appends `value` to `out`, percent-encoding the bytes listed in the [module docs](self).
pub fn escape_into(out: &mut String, value: &str) {
    for ch in value.chars() {
        if needs_escape(ch) {
            let mut buf = [0u8; 4];
            for b in ch.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(ch);
        }
    }
}

fn needs_escape(ch: char) -> bool {
    matches!(ch, '%' | ':' | '{' | '}') || ch.is_whitespace() || ch.is_control()
}

/// Builds a key from literal pieces and escaped `Display` values; used by generated code.
///
/// ```
/// let mut k = lockcore::key::KeyBuf::new();
/// k.push_lit("stock:");
/// k.push_arg(&"sku 7");
/// assert_eq!(k.finish(), "stock:sku%207");
/// ```
#[derive(Debug, Default)]
pub struct KeyBuf {
    out: String,
    scratch: String,
}

impl KeyBuf {
    /// An empty key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends template text as it is.
    pub fn push_lit(&mut self, lit: &str) {
        self.out.push_str(lit);
    }

    /// Appends a value through `Display`, escaped.
    pub fn push_arg<T: KeyArg + ?Sized>(&mut self, value: &T) {
        self.scratch.clear();
        let _ = value.write_key(&mut self.scratch);
        escape_into(&mut self.out, &self.scratch);
    }

    /// The finished key.
    pub fn finish(self) -> String {
        self.out
    }
}

/// A value that can stand in a key placeholder: anything that implements `Display`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in a key placeholder because it does not implement `std::fmt::Display`",
    label = "this key placeholder needs `{Self}: std::fmt::Display`",
    note = "placeholders are formatted with `Display`; use a field that implements it, e.g. `<order.id>`"
)]
pub trait KeyArg {
    /// Writes the value, unescaped.
    fn write_key(&self, out: &mut String) -> fmt::Result;
}

impl<T: fmt::Display + ?Sized> KeyArg for T {
    fn write_key(&self, out: &mut String) -> fmt::Result {
        write!(out, "{self}")
    }
}

/// The content of `key`'s Redis Cluster hash tag, if it has one (the text between the
/// first `{` and the first `}` after it, when not empty).
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole
/// key when it has none, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = std::str::from_utf8(key)
        .ok()
        .and_then(hash_tag)
        .map_or(key, str::as_bytes);
    let mut crc = 0u16;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Checks that `key` (a name, or a full key with its prefix) can be a lock's key: not
/// empty, at most one hash tag (`{...}`) and no other brace, so that its companions
/// share its hash slot and no key can ever be another key's companion (see
/// [`companion`]).
pub(crate) fn check_key(key: &str) -> Result<(), &'static str> {
    if key.is_empty() {
        return Err("the key is empty");
    }
    let Some(tag) = hash_tag(key) else {
        if key.contains('}') {
            return Err(
                "a `}` without a valid `{...}` hash tag before it would split the key's companions across hash slots",
            );
        }
        if key.starts_with('{') {
            return Err("a key without a hash tag must not start with `{`: distlock's own keys do");
        }
        return Ok(());
    };
    // The first `{` opens the tag; after its `}`, no brace: a second group is how
    // distlock writes a tagged key's companions.
    let open = key.find('{').unwrap_or(0);
    let after = open + 1 + tag.len() + 1;
    if key[after..].contains(['{', '}']) {
        return Err(
            "a key holds at most one `{...}` hash tag and no other brace: `<key>{:suffix}` is how distlock names a tagged key's companions",
        );
    }
    if is_companion(key) {
        return Err("the key is another key's companion (`{<key>}:fence`, say): distlock's own");
    }
    Ok(())
}

/// The names a lock, a semaphore or a read/write lock may not take: those of the
/// idempotency records, which live under the same prefix (`<prefix>idem:...`).
pub(crate) fn check_lock_name(name: &str) -> Result<(), &'static str> {
    if name.starts_with(RECORDS) {
        return Err(
            "names under `idem:` are idempotency records' keys, not locks': look at one with \
             `Locks::idem_record` (`distlock idem show`), delete one with `Locks::forget_idem` \
             (`distlock idem forget`)",
        );
    }
    Ok(())
}

/// Where the idempotency records live, under the client's prefix: a record's key is
/// `<prefix>idem:<module::fn>[:<scope>]:<key the application wrote>`.
///
/// ```
/// let record = format!("{}{}app::pay:pay:42", lockcore::DEFAULT_PREFIX, lockcore::key::RECORDS);
/// assert_eq!(record, "lock:idem:app::pay:pay:42");
/// ```
pub const RECORDS: &str = "idem:";

/// [`check_key`] as the caller's error: [`Error::InvalidKey`](crate::Error::InvalidKey)
/// naming `key`.
pub(crate) fn checked(key: &str) -> crate::error::Result<()> {
    check_key(key).map_err(|reason| crate::error::Error::InvalidKey {
        key: key.to_owned(),
        reason: reason.to_owned(),
    })
}

/// A key that hashes to the same slot as `key` (which passed [`check_key`]) and that no
/// name can produce: `{key}` + `suffix` when `key` has no hash tag (no lock key starts
/// with `{`), else `key` + `{` + `suffix` + `}` (no lock key has a brace after its tag).
///
/// ```text
/// lock:order:1      -> {lock:order:1}:fence
/// lock:{acct}:7     -> lock:{acct}:7{:fence}
/// ```
pub(crate) fn companion(key: &str, suffix: &'static str) -> String {
    Companion(key, suffix).to_string()
}

/// Every suffix a key's companions carry (see [`companion`]); a test checks that each
/// one the sources name is here.
pub(crate) const COMPANIONS: &[&str] = &[
    ":readers-waiting",
    ":readers",
    ":writer",
    ":fence-seen",
    ":fence",
    ":waiting",
    ":released",
    ":turns",
    // Written by earlier versions' acknowledgements; kept out of names still.
    ":acked",
    ":done",
];

/// The key a companion belongs to, the inverse of [`companion`]: `{<key>}<suffix>` and a
/// hash-tagged `<key>{<suffix>}` stand for `<key>`; any other key for itself.
pub(crate) fn companion_of(found: &str) -> &str {
    for suffix in COMPANIONS {
        if let Some(inner) = found
            .strip_suffix(suffix)
            .and_then(|b| b.strip_prefix('{'))
            .and_then(|b| b.strip_suffix('}'))
        {
            return inner;
        }
        if let Some(base) = found
            .strip_suffix('}')
            .and_then(|b| b.strip_suffix(suffix))
            .and_then(|b| b.strip_suffix('{'))
            && hash_tag(base).is_some()
        {
            return base;
        }
    }
    found
}

/// The lock key whose readers' set `set` is (`{key}:readers`), if it is one.
pub(crate) fn readers_of(set: &str) -> Option<&str> {
    let base = companion_of(set);
    (base.len() != set.len() && Companion(base, ":readers").to_string() == set).then_some(base)
}

/// Whether `found` is a companion key (see [`companion`]), not a key of its own.
pub(crate) fn is_companion(found: &str) -> bool {
    companion_of(found).len() != found.len()
}

/// [`companion`] as a command argument, written in place (no `String` per call).
pub(crate) struct Companion<'a>(pub(crate) &'a str, pub(crate) &'static str);

impl std::fmt::Display for Companion<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Companion(key, suffix) = *self;
        write_companion(f, key, suffix, hash_tag(key).is_some())
    }
}

/// The one spelling of a companion: `<key>{<suffix>}` for a tagged key, else
/// `{<key>}<suffix>`.
fn write_companion(
    out: &mut impl fmt::Write,
    key: &str,
    suffix: &str,
    tagged: bool,
) -> fmt::Result {
    if tagged {
        write!(out, "{key}{{{suffix}}}")
    } else {
        write!(out, "{{{key}}}{suffix}")
    }
}

/// The `SCAN MATCH` globs of the `suffix` companions of every key `pattern` (a glob)
/// matches, in both spellings (see [`companion`]): the untagged keys' and the tagged ones'.
pub(crate) fn companion_globs(pattern: &str, suffix: &str) -> [String; 2] {
    [false, true].map(|tagged| {
        let mut glob = String::new();
        let _ = write_companion(&mut glob, pattern, suffix, tagged);
        glob
    })
}

impl redis::ToRedisArgs for Companion<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companions_stand_for_their_lock() {
        use super::companion_of as lock_of;
        assert_eq!(lock_of("lock:doc"), "lock:doc");
        assert_eq!(lock_of("{lock:doc}:readers"), "lock:doc");
        assert_eq!(lock_of("{lock:doc}:fence"), "lock:doc");
        assert_eq!(lock_of("lock:{t}:doc{:readers-waiting}"), "lock:{t}:doc");
        assert_eq!(lock_of("lock:{t}:doc{:turns}"), "lock:{t}:doc");
        // A tagged name that ends as a companion once did is a lock of its own.
        assert_eq!(lock_of("lock:{t}:doc:turns"), "lock:{t}:doc:turns");
        assert_eq!(lock_of("{lock:doc}:turns"), "lock:doc");
        // Untagged: a name that ends as a companion does is a lock of its own.
        assert_eq!(lock_of("lock:job:fence"), "lock:job:fence");
    }

    #[test]
    fn every_companion_the_sources_name_is_listed() {
        // Each suffix named in a call of `companion` or `Companion` in lockcore's
        // sources: a walk must map every such key back to its lock.
        fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut paths = Vec::new();
        files(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut paths,
        );
        let mut named = std::collections::BTreeSet::new();
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("ompanion(") {
                let call = &text[at..];
                let end = call.find(')').unwrap_or(call.len());
                if let Some(open) = call[..end].find("\":") {
                    let lit = &call[open + 1..end];
                    let lit = &lit[..lit.find('"').unwrap_or(lit.len())];
                    named.insert(lit.to_owned());
                }
            }
        }
        assert!(named.len() >= 9, "{named:?}");
        for suffix in &named {
            assert!(
                super::COMPANIONS.contains(&suffix.as_str()),
                "{suffix} is not in COMPANIONS"
            );
        }
    }

    #[test]
    fn slots_as_redis_computes_them() {
        // `CLUSTER KEYSLOT` on Redis 7.0.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{lock:a}:fence"), slot(b"lock:a"));
    }

    #[test]
    fn tags() {
        assert_eq!(hash_tag("lock:{user:1}:x"), Some("user:1"));
        assert_eq!(hash_tag("lock:{}:x"), None);
        assert_eq!(hash_tag("lock:order:1"), None);
        assert_eq!(companion("lock:order:1", ":fence"), "{lock:order:1}:fence");
        assert_eq!(companion("lock:{u}:1", ":fence"), "lock:{u}:1{:fence}");
        assert_eq!(
            companion_globs("lock:*", ":readers"),
            ["{lock:*}:readers", "lock:*{:readers}"]
        );
        // Written into a command in place, it is the same argument.
        for key in ["lock:order:1", "lock:{u}:1"] {
            let mut cmd = redis::Cmd::new();
            cmd.arg(Companion(key, ":waiting"));
            let written: Vec<_> = cmd
                .args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => b.to_vec(),
                    _ => Vec::new(),
                })
                .collect();
            assert_eq!(written, [companion(key, ":waiting").into_bytes()]);
        }
        assert!(check_key("a}b").is_err());
        assert!(check_key("").is_err());
        assert!(check_key("{a}}").is_err());
        assert!(check_key("{a}:b{c}").is_err());
        assert!(check_key("{lock:a}:fence").is_err(), "a companion");
        assert!(
            check_key("lock:{acct}:7:fence").is_ok(),
            "a name of its own"
        );
        assert!(check_key("lock:{acct}:7{:fence}").is_err(), "a companion");
        assert!(check_key("{a").is_err());
        assert!(check_key("lock:a{b").is_ok());
    }

    #[test]
    fn write_tokens_are_told_from_locks() {
        for kind in [Kind::Lock, Kind::ReadLock, Kind::Semaphore] {
            let token = format!("{}:web-1:7", token_uuid(kind));
            assert!(!is_write_token(&token), "{kind}");
        }
        let write = token_uuid(Kind::WriteLock);
        assert_ne!(write, token_uuid(Kind::WriteLock), "random");
        assert!(is_write_token(&format!("{write}:web-1:7")));
        assert!(!is_write_token("readers"));
        assert_eq!(semaphore_limit(&limit_member(4)), Some(4));
        assert_eq!(semaphore_limit("limit:x"), None);
    }

    #[test]
    fn escaping_keeps_unicode() {
        let mut s = String::new();
        escape_into(&mut s, "zürich%\t");
        assert_eq!(s, "zürich%25%09");
    }
}
