//! Small helpers every layer uses: the wall clock in milliseconds, mutexes that survive
//! a panic in another holder, spawning work that must go on after its caller, and the
//! one-allocation string helpers of the hot paths (keys, tokens, JSON strings).

use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, by this machine's clock (0 before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `args` formatted into an `Arc<str>` with one allocation (through a stack buffer when
/// it fits): keys and tokens are made on every lock call.
pub(crate) fn arc_str(args: std::fmt::Arguments<'_>) -> Arc<str> {
    struct Buf {
        bytes: [u8; 192],
        len: usize,
    }
    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.len + s.len();
            let room = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
            room.copy_from_slice(s.as_bytes());
            self.len = end;
            Ok(())
        }
    }
    let mut buf = Buf {
        bytes: [0; 192],
        len: 0,
    };
    if buf.write_fmt(args).is_ok()
        && let Ok(text) = std::str::from_utf8(&buf.bytes[..buf.len])
    {
        return Arc::from(text);
    }
    Arc::from(std::fmt::format(args))
}

/// Locks `m`, also when another holder panicked: every state kept under these mutexes
/// stays consistent between statements (maps, counters, queues).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `fut` in a task of its own on the current tokio runtime, with the caller's
/// `tracing` subscriber: work that must go on after its caller (a release, a store).
/// Outside a runtime `fut` is dropped and `false` returned: the caller says what that
/// leaves behind.
pub(crate) fn spawn_here<F: Future<Output = ()> + Send + 'static>(fut: F) -> bool {
    use tracing::instrument::WithSubscriber as _;
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(fut.with_current_subscriber());
            true
        }
        Err(_) => false,
    }
}

/// `s` as a JSON string, escaped as `serde_json` does (quote, backslash, and control
/// characters; `\b \f \n \r \t` by name, the others as `\u00XX`).
pub(crate) fn push_json_str(s: &str, out: &mut String) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 15)]));
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// `fut` boxed as a trait object: the callers' futures (up to the users' functions)
/// then carry neither its layout nor its auto traits to check, which for the deep types
/// of a connect or a Redlock fan-out would pass the compiler's recursion limit.
pub(crate) fn erased<'a, T>(
    fut: impl Future<Output = T> + Send + 'a,
) -> std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>> {
    Box::pin(fut)
}

/// Whether `key` matches the glob `pattern` as Redis's `SCAN MATCH` and `KEYS` read it:
/// `*` any run of bytes, `?` one byte, `[abc]`, `[^abc]` and `[a-z]` one byte of a set,
/// `\` the next byte as itself. An empty key matches only an empty pattern and `*` (Redis's
/// matcher needs a byte for any `*` but a lone one, which `SCAN` and `KEYS` take as
/// "every key" without matching).
pub(crate) fn glob_match(pattern: &[u8], key: &[u8]) -> bool {
    if key.is_empty() {
        return pattern.is_empty() || pattern == b"*";
    }
    let (mut p, mut k) = (0, 0);
    // Where to resume after the last `*`: the pattern past it, and the key's position.
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, k));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => one_of(pattern, p + 1, key[k]),
            Some(b'\\') if p + 1 < pattern.len() => (pattern[p + 1] == key[k]).then_some(p + 2),
            Some(&c) => (c == key[k]).then_some(p + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => {
                p = next;
                k += 1;
            }
            (None, Some((after, from))) => {
                p = after;
                k = from + 1;
                star = Some((after, from + 1));
            }
            (None, None) => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// A `[...]` set that starts at `at` (past the `[`): the pattern's position past its `]`
/// when `byte` is in it.
fn one_of(pattern: &[u8], mut at: usize, byte: u8) -> Option<usize> {
    let negate = matches!(pattern.get(at), Some(b'^'));
    if negate {
        at += 1;
    }
    let mut found = false;
    while let Some(&c) = pattern.get(at) {
        match c {
            b']' => return (found != negate).then_some(at + 1),
            b'\\' if at + 1 < pattern.len() => {
                found |= pattern[at + 1] == byte;
                at += 2;
            }
            // As Redis reads it: `a-]` is the range from `a` to `]`, and the set goes on.
            _ if pattern.get(at + 1) == Some(&b'-') && at + 2 < pattern.len() => {
                let (lo, hi) = (c.min(pattern[at + 2]), c.max(pattern[at + 2]));
                found |= (lo..=hi).contains(&byte);
                at += 3;
            }
            _ => {
                found |= c == byte;
                at += 1;
            }
        }
    }
    // No closing `]`: Redis reads the set to the pattern's end.
    (found != negate).then_some(at)
}

/// How many tokio runtimes' connections one client keeps, of each kind (the multiplexed
/// command connection, the cluster connection, the Pub/Sub hub that wakes waiters): more
/// than a service runs (actix-web runs one per worker, and the default client is shared
/// by all). Past it, a new runtime's command connection replaces the oldest runtime's
/// (most likely one that shut down: a live runtime's is found closed and dropped
/// first), and its waiters poll instead of subscribing: a hub is never pushed out for
/// another, which made a connection for every subscription in turn.
pub(crate) const MAX_RUNTIMES: usize = 64;

#[cfg(test)]
mod glob_tests {
    use super::glob_match;

    #[test]
    fn globs_read_as_redis_reads_them() {
        let m = |p: &str, k: &str| glob_match(p.as_bytes(), k.as_bytes());
        assert!(m("*", "") && m("*", "lock:a"));
        assert!(m("lock:*", "lock:order:42") && !m("lock:*", "idem:x"));
        assert!(m("lock:order:?2", "lock:order:42") && !m("lock:order:?", "lock:order:42"));
        assert!(m("*:42", "lock:order:42") && m("l*r*2", "lock:order:42"));
        assert!(m("a[bc]d", "acd") && !m("a[bc]d", "aed") && m("a[^bc]d", "aed"));
        assert!(m("a[0-9]", "a7") && !m("a[0-9]", "ax"));
        assert!(m(r"a\*", "a*") && !m(r"a\*", "ab"));
        assert!(m("{lock:*}:readers", "{lock:doc}:readers"));
        assert!(!m("a*b", "a") && m("a**", "a"));
        // `a-]` is the range `]`..`a` (swapped, as Redis does), then `]` closes the set.
        assert!(m("[a-]]", "_") && !m("[a-]]", "b") && !m("[a-]]", "-"));
    }
}

/// Property tests of [`glob_match`] against a port of Redis's `stringmatchlen`
/// (`util.c`), the matcher behind `SCAN MATCH` and `KEYS`. A fixed number of cases per
/// run.
#[cfg(test)]
mod glob_props {
    use proptest::prelude::*;

    use super::glob_match;

    /// `stringmatchlen` as Redis writes it (case-sensitive), step for step: `*` tries the
    /// rest of the pattern at every position, a `[` set with no `]` runs to the pattern's
    /// end, `\` escapes the next byte (a trailing one is itself). Range bounds compare as
    /// unsigned bytes, as where C's `char` is unsigned (ARM); where it is signed (x86) a
    /// range with one bound at or above 0x80 and one below reads otherwise, in Redis
    /// itself.
    fn stringmatchlen(pat: &[u8], s: &[u8]) -> bool {
        let (mut p, mut s) = (0, s);
        while p < pat.len() && !s.is_empty() {
            match pat[p] {
                b'*' => {
                    while p + 1 < pat.len() && pat[p + 1] == b'*' {
                        p += 1;
                    }
                    if p + 1 == pat.len() {
                        return true;
                    }
                    while !s.is_empty() {
                        if stringmatchlen(&pat[p + 1..], s) {
                            return true;
                        }
                        s = &s[1..];
                    }
                    return false;
                }
                b'?' => s = &s[1..],
                b'[' => {
                    p += 1;
                    let not = pat.get(p) == Some(&b'^');
                    if not {
                        p += 1;
                    }
                    let mut matched = false;
                    loop {
                        let left = pat.len() - p;
                        if left >= 2 && pat[p] == b'\\' {
                            p += 1;
                            matched |= pat[p] == s[0];
                        } else if left > 0 && pat[p] == b']' {
                            break;
                        } else if left == 0 {
                            // C steps back here, and forward after the switch.
                            p -= 1;
                            break;
                        } else if left >= 3 && pat[p + 1] == b'-' {
                            let (lo, hi) = (pat[p].min(pat[p + 2]), pat[p].max(pat[p + 2]));
                            matched |= (lo..=hi).contains(&s[0]);
                            p += 2;
                        } else {
                            matched |= pat[p] == s[0];
                        }
                        p += 1;
                    }
                    if matched == not {
                        return false;
                    }
                    s = &s[1..];
                }
                c => {
                    let c = if c == b'\\' && pat.len() - p >= 2 {
                        p += 1;
                        pat[p]
                    } else {
                        c
                    };
                    if c != s[0] {
                        return false;
                    }
                    s = &s[1..];
                }
            }
            p += 1;
            if s.is_empty() {
                while pat.get(p) == Some(&b'*') {
                    p += 1;
                }
                break;
            }
        }
        p >= pat.len() && s.is_empty()
    }

    /// What `SCAN MATCH` returns: a pattern of one `*` takes every key without matching.
    fn scan_match(pat: &[u8], key: &[u8]) -> bool {
        pat == b"*" || stringmatchlen(pat, key)
    }

    /// Bytes that mean something in a glob, a few plain ones and one above 0x7f.
    fn glob_byte() -> impl Strategy<Value = u8> {
        prop::sample::select(b"ab-^[]*?\\\xe9".to_vec())
    }

    #[test]
    fn the_reference_reads_as_redis() {
        let m = |p: &[u8], k: &[u8]| stringmatchlen(p, k);
        assert!(m(b"a*", b"abc") && m(b"a[bc]", b"ab") && !m(b"a[^bc]", b"ab"));
        assert!(m(b"[a-]]", b"_") && m(b"a\\", b"a\\") && m(b"[^", b"x"));
        // `**` does not match an empty key in Redis (`KEYS **`); `*` alone does, by
        // `SCAN`'s and `KEYS`'s shortcut.
        assert!(!m(b"**", b"") && scan_match(b"*", b""));
    }

    /// An empty key matches an empty pattern, and `*` alone; nothing else, not even `**`.
    #[test]
    fn an_empty_key_matches_as_in_redis() {
        for pat in [&b""[..], b"*"] {
            assert!(glob_match(pat, b""), "{pat:?}");
        }
        for pat in [&b"**"[..], b"***", b"?", b"[^a]", b"\\"] {
            assert!(!glob_match(pat, b""), "{pat:?}");
        }
    }

    proptest! {
        // No regression files written beside the crate: a failure prints its input.
        #![proptest_config(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::with_cases(256)
        })]

        /// Patterns and keys of the bytes that matter read as Redis reads them.
        #[test]
        fn matches_as_redis_on_glob_bytes(
            pat in prop::collection::vec(glob_byte(), 0..10),
            key in prop::collection::vec(glob_byte(), 0..10),
        ) {
            prop_assert_eq!(glob_match(&pat, &key), scan_match(&pat, &key));
        }

        /// A key made to match: its pattern written from it with `*`, `?`, sets and
        /// escapes in place of some of its bytes.
        #[test]
        fn a_pattern_written_from_a_key_matches_it(
            key in prop::collection::vec(any::<u8>(), 1..12),
            how in prop::collection::vec(0u8..6, 12),
        ) {
            let mut pat = Vec::new();
            for (&b, &h) in key.iter().zip(&how) {
                match h {
                    0 => pat.push(b'?'),
                    1 => pat.extend_from_slice(&[b'\\', b]),
                    2 => pat.extend_from_slice(&[b'[', b'\\', b, b']']),
                    3 => pat.extend_from_slice(&[b'[', 0, b'-', b, b']']),
                    4 => pat.extend_from_slice(&[b'*', b'\\', b]),
                    _ => pat.extend_from_slice(&[b'[', b'^', b'\\', b.wrapping_add(1), b']']),
                }
            }
            prop_assert!(stringmatchlen(&pat, &key), "{:?}", pat);
            prop_assert!(glob_match(&pat, &key), "{:?}", pat);
        }

        /// Any bytes: no panic, and the same answer as the reference.
        #[test]
        fn any_bytes_read_as_redis(
            pat in prop::collection::vec(any::<u8>(), 0..16),
            key in prop::collection::vec(any::<u8>(), 0..16),
        ) {
            prop_assert_eq!(glob_match(&pat, &key), scan_match(&pat, &key));
        }
    }
}
