//! Idempotency records on both backends: claim, complete, release and renew, each one
//! atomic step (plain commands or a Lua script on Redis, one mutex section in memory,
//! with the same rules).
//!
//! A completed record is appended to the claim's in-progress record: the value is then
//! the in-progress record followed by the completed one (or the completed one alone when
//! the key had gone). The first completed record in the value is the stored result, so a
//! store never overwrites another call's: an `APPEND` needs no compare, and a store is
//! plain commands whoever holds a claim of the same payload (a result that lands in front
//! of another payload's claim is taken out again by `idem_settle.lua`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use tokio::time::Instant;

use super::memory::MemoryBackend;
use super::redis::{RedisBackend, Route};
use super::{Backend, each, millis};
use crate::error::{BackendError, BackendErrorKind};
use crate::util::now_ms;

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::IDEM_CLAIM));
static SETTLE: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::IDEM_SETTLE));
static RELEASE: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::IDEM_RELEASE));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::IDEM_RENEW));
static LOOK: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::IDEM_LOOK));
static PEEK: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::IDEM_PEEK));
static FORGET: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::IDEM_FORGET));

/// How every completed record begins (see [`crate::idempotency::record`]); it cannot occur
/// inside an in-progress record, whose strings escape their quotes.
const COMPLETED: &str = r#"{"status":"completed","fp":""#;

/// Where the stored result begins in a record's value: the first completed record.
pub(crate) fn completed_at(raw: &str) -> Option<usize> {
    raw.find(COMPLETED)
}

/// Where an in-progress record spells its owner token: from `"owner":"` to the quote
/// that ends the token.
fn owner_range(record: &str) -> Option<std::ops::Range<usize>> {
    const OWNER: &str = r#""owner":""#;
    let start = record.find(OWNER)?;
    let token = start + OWNER.len();
    // The token is a JSON string: it ends at the first quote not escaped.
    let bytes = record.as_bytes();
    let mut i = token;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(start..i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The fingerprint of the completed record `done` begins (hex: no escapes in it).
fn completed_fp(done: &str) -> &str {
    done[COMPLETED.len()..].split('"').next().unwrap_or("")
}

/// A completed record at `raw[at..]`: a replay of it when its fingerprint is `fp`.
fn completed_claim(raw: &str, at: usize, fp: &str) -> Claimed {
    if completed_fp(&raw[at..]) == fp {
        Claimed::Completed(raw[at..].to_owned())
    } else {
        Claimed::Mismatch { completed: true }
    }
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// No record (or this owner's own): claimed; with the exact in-progress record
    /// written, when this call wrote it with a plain command (see `idem_complete`).
    New(Option<String>),
    /// An in-progress record past its lease, now claimed by us; it was `previous`'s.
    TookOver { previous: String },
    /// Completed with the same fingerprint: the completed record, to replay, and
    /// whatever was appended after it (see [`crate::idempotency::record`]).
    Completed(String),
    /// In progress under a live lease with this much left.
    InProgress(Duration),
    /// The record's fingerprint differs: a completed record's, or else a claim's (in
    /// progress, or its lease ended).
    Mismatch { completed: bool },
}

/// Where the claim's settings go.
pub(crate) struct ClaimArgs<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) fp: &'a str,
    pub(crate) lease: Duration,
    /// Lifetime of the in-progress key: lease plus retention.
    pub(crate) lifetime: Duration,
    /// The caller waits for a call in progress (its complete must publish).
    pub(crate) will_wait: bool,
}

/// The idempotency operations of a topology (see the module docs and `idem_*.lua`).
pub(crate) trait Records: Send + Sync {
    async fn idem_claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed, BackendError>;

    /// `true` when `record` is the stored result (appended now or by an earlier try of
    /// the same store); `false` when another call's result was stored first, or the key
    /// is gone. `written`: the exact in-progress record this owner wrote, if it still
    /// knows it (no renewal since): when the `APPEND` finds just that, the store is done;
    /// otherwise `idem_settle.lua` tells whose result is first and wakes waiters.
    async fn idem_complete(
        &self,
        key: &str,
        record: &str,
        retention: Duration,
        channel: &str,
        written: Option<&str>,
    ) -> Result<bool, BackendError>;

    /// `retention`: how long a record kept by the release (one that took over) stays.
    async fn idem_release(
        &self,
        key: &str,
        owner: &str,
        channel: &str,
        retention: Duration,
    ) -> Result<bool, BackendError>;

    async fn idem_renew(
        &self,
        key: &str,
        owner: &Owner<'_>,
        lease: Duration,
        lifetime: Duration,
    ) -> Result<Renewal, BackendError>;

    /// One read-only look at `key` (`idem_look.lua`): its value, its ttl, and the
    /// server's time in ms.
    async fn idem_look(&self, key: &str) -> Result<Looked, BackendError>;

    /// One read-only look at the first `head` bytes of `key` (`idem_peek.lua`), its
    /// whole length, its ttl and the server's time in ms: a large stored result is not
    /// sent.
    async fn idem_peek(&self, key: &str, head: usize) -> Result<Peeked, BackendError>;

    /// Deletes `key` and wakes the repeats waiting on `channel` (`idem_forget.lua`):
    /// `Some(true)` when there was a record, `Some(false)` when there was nothing, `None`
    /// when the key holds something that is not an idempotency record (left as it is).
    async fn idem_forget(&self, key: &str, channel: &str) -> Result<Option<bool>, BackendError>;
}

/// A claim as its renewal names it: the owner token and the payload's fingerprint (to
/// write the record again when it is gone, see `idem_renew.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    pub(crate) token: &'a str,
    pub(crate) fp: &'a str,
}

/// What a renewal of a claim found (`idem_renew.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The claim was this owner's: its lease starts again.
    Renewed,
    /// The record was gone (a restart that kept nothing, a failover that lost it,
    /// eviction, `forget_idem`) and nobody had claimed the key since: written again as
    /// this owner's claim, taken over (a release leaves it in progress), so that the body
    /// finishes and its result is stored.
    Recreated,
    /// Another call owns the key now, or stored its result: the claim is lost.
    Lost,
}

/// `idem_renew.lua`'s answer.
pub(crate) fn renewal(reply: i64) -> Renewal {
    match reply {
        1 => Renewal::Renewed,
        2 => Renewal::Recreated,
        _ => Renewal::Lost,
    }
}

/// What [`Records::idem_look`] saw: the raw value, its ttl (`None`: no key or no ttl)
/// and the server's time in ms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Looked {
    pub(crate) value: Option<String>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) now_ms: u64,
}

/// What [`Records::idem_peek`] saw: the value's first bytes (cut anywhere, even inside
/// a UTF-8 character), the whole value's length in bytes, its ttl (`None`: no key or no
/// ttl) and the server's time in ms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Peeked {
    pub(crate) head: Option<Vec<u8>>,
    pub(crate) len: usize,
    pub(crate) ttl: Option<Duration>,
    pub(crate) now_ms: u64,
}

impl Records for Backend {
    async fn idem_claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed, BackendError> {
        each!(self, b => b.idem_claim(a))
    }

    async fn idem_complete(
        &self,
        key: &str,
        record: &str,
        retention: Duration,
        channel: &str,
        written: Option<&str>,
    ) -> Result<bool, BackendError> {
        each!(self, b => b.idem_complete(key, record, retention, channel, written))
    }

    async fn idem_release(
        &self,
        key: &str,
        owner: &str,
        channel: &str,
        retention: Duration,
    ) -> Result<bool, BackendError> {
        each!(self, b => b.idem_release(key, owner, channel, retention))
    }

    async fn idem_renew(
        &self,
        key: &str,
        owner: &Owner<'_>,
        lease: Duration,
        lifetime: Duration,
    ) -> Result<Renewal, BackendError> {
        each!(self, b => b.idem_renew(key, owner, lease, lifetime))
    }

    async fn idem_look(&self, key: &str) -> Result<Looked, BackendError> {
        each!(self, b => b.idem_look(key))
    }

    async fn idem_peek(&self, key: &str, head: usize) -> Result<Peeked, BackendError> {
        each!(self, b => b.idem_peek(key, head))
    }

    async fn idem_forget(&self, key: &str, channel: &str) -> Result<Option<bool>, BackendError> {
        each!(self, b => b.idem_forget(key, channel))
    }
}

fn bad_reply(detail: String) -> BackendError {
    BackendError::new(BackendErrorKind::Response, detail)
}

impl RedisBackend {}

impl Records for RedisBackend {
    /// One plain `SET key record NX GET PX lifetime`: claimed when the key was free, and
    /// a completed record decided here (a replay is this one command); the contended
    /// cases (a claim in progress, live or not) go on in `idem_claim.lua`.
    async fn idem_claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed, BackendError> {
        let retention = a.lifetime.saturating_sub(a.lease);
        let record = in_progress(a.owner, a.fp, now_ms(), a.lease, retention, false);
        let mut set = redis::cmd("SET");
        set.arg(a.key)
            .arg(&record)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(millis(a.lifetime));
        use std::sync::atomic::Ordering;
        if self.set_nx_get.load(Ordering::Relaxed) {
            match self.query_via::<Option<String>>(&set, Route::Shared).await {
                Ok(None) => return Ok(Claimed::New(Some(record))),
                Ok(Some(raw)) => {
                    if let Some(at) = completed_at(&raw) {
                        return Ok(completed_claim(&raw, at, a.fp));
                    }
                }
                // Redis before 7.0 refuses NX with GET: the script does it all.
                Err(e) if self.refuses_nx_get(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let mut inv = CLAIM.prepare_invoke();
        inv.key(a.key)
            .arg(a.owner)
            .arg(a.fp)
            .arg(millis(a.lease))
            .arg(millis(a.lifetime))
            .arg(if a.will_wait { "1" } else { "0" });
        let (code, detail): (i64, String) = Box::pin(self.eval_via(&inv, Route::Shared)).await?;
        Ok(match code {
            1 => Claimed::New(None),
            2 => Claimed::TookOver { previous: detail },
            3 => match completed_at(&detail) {
                Some(at) => completed_claim(&detail, at, a.fp),
                None => return Err(bad_reply("claim replay without a completed record".into())),
            },
            4 => Claimed::InProgress(Duration::from_millis(detail.parse().unwrap_or(0))),
            5 => Claimed::Mismatch {
                completed: detail == "completed",
            },
            other => return Err(bad_reply(format!("unexpected claim reply {other}"))),
        })
    }

    /// One `MULTI`: `SET key record NX PX retention` (writes a key gone meanwhile whole,
    /// with a ttl; the `APPEND` then repeats the record after itself, and the first copy
    /// is the result), `APPEND key record`, and, when `written` is known, `GETRANGE` of
    /// its bytes that spell this claim's owner token. While the claim's key lives (the usual case) the
    /// `SET` does nothing, the `APPEND` adds the result, and the key keeps its ttl: the
    /// lease plus the retention, from the claim or its last renewal.
    ///
    /// When the `APPEND` returns the length of `written` plus the record and the range
    /// holds the owner token where `written` has it, the value before it was `written`
    /// itself (a token is unique to its claim; a mark by a waiting repeat makes the
    /// record longer and moves the token; a renewal clears `written`), so the record is
    /// the first result and nobody waits. Otherwise `idem_settle.lua` decides.
    ///
    /// Where the server has `SET ... IFEQ`, one `SET key <written><record> IFEQ <written>
    /// KEEPTTL` comes first: the same store as one command when the claim's record is
    /// there as written; the steps above run only when it is not.
    async fn idem_complete(
        &self,
        key: &str,
        record: &str,
        retention: Duration,
        channel: &str,
        written: Option<&str>,
    ) -> Result<bool, BackendError> {
        if let Some(cmd) = written.and_then(|w| self.native().store(key, w, record))
            && let Some(Some(_)) = self
                .query_native::<Option<String>>(&cmd, Route::Shared)
                .await?
        {
            return Ok(true);
        }
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("SET")
            .arg(key)
            .arg(record)
            .arg("NX")
            .arg("PX")
            .arg(millis(retention))
            .ignore()
            .cmd("APPEND")
            .arg(key)
            .arg(record);
        // Without the claim's record as written there is nothing to compare: the script
        // decides.
        if let Some((w, range)) = written.and_then(|w| Some((w, owner_range(w)?))) {
            pipe.cmd("GETRANGE")
                .arg(key)
                .arg(range.start)
                .arg(range.end - 1);
            let (len, at): (usize, Vec<u8>) = self.query_pipe(&pipe, Route::Shared).await?;
            if w.len() + record.len() == len && w.as_bytes()[range] == at[..] {
                return Ok(true);
            }
        } else {
            let _: (usize,) = self.query_pipe(&pipe, Route::Shared).await?;
        }
        let mut inv = self.script(&SETTLE).prepare_invoke();
        inv.key(key).arg(record).arg(channel);
        // Boxed, here and for the claim's script: not the usual path, and every caller's
        // future would otherwise carry its state.
        Ok(Box::pin(self.eval_via::<i64>(&inv, Route::Shared)).await? == 1)
    }

    async fn idem_release(
        &self,
        key: &str,
        owner: &str,
        channel: &str,
        retention: Duration,
    ) -> Result<bool, BackendError> {
        let mut inv = self.script(&RELEASE).prepare_invoke();
        inv.key(key).arg(owner).arg(channel).arg(millis(retention));
        Ok(self.eval_via::<i64>(&inv, Route::Shared).await? == 1)
    }

    async fn idem_renew(
        &self,
        key: &str,
        owner: &Owner<'_>,
        lease: Duration,
        lifetime: Duration,
    ) -> Result<Renewal, BackendError> {
        let mut inv = RENEW.prepare_invoke();
        inv.key(key)
            .arg(owner.token)
            .arg(millis(lease))
            .arg(millis(lifetime))
            .arg(owner.fp);
        Ok(renewal(self.eval_via::<i64>(&inv, Route::Shared).await?))
    }

    async fn idem_look(&self, key: &str) -> Result<Looked, BackendError> {
        let mut inv = LOOK.prepare_invoke();
        inv.key(key);
        let (value, pttl, now_ms): (Option<String>, i64, u64) =
            self.eval_via(&inv, Route::Shared).await?;
        Ok(Looked {
            value,
            ttl: (pttl > 0).then(|| Duration::from_millis(pttl.unsigned_abs())),
            now_ms,
        })
    }

    async fn idem_peek(&self, key: &str, head: usize) -> Result<Peeked, BackendError> {
        let mut inv = PEEK.prepare_invoke();
        inv.key(key).arg(head.max(1));
        let (head, len, pttl, now_ms): (Option<Vec<u8>>, u64, i64, u64) =
            self.eval_via(&inv, Route::Shared).await?;
        Ok(Peeked {
            head,
            len: usize::try_from(len).unwrap_or(usize::MAX),
            ttl: (pttl > 0).then(|| Duration::from_millis(pttl.unsigned_abs())),
            now_ms,
        })
    }

    async fn idem_forget(&self, key: &str, channel: &str) -> Result<Option<bool>, BackendError> {
        let mut inv = self.script(&FORGET).prepare_invoke();
        inv.key(key).arg(channel);
        Ok(match self.eval_via::<i64>(&inv, Route::Shared).await? {
            1 => Some(true),
            0 => Some(false),
            _ => None,
        })
    }
}

/// The parts of a record the state machine reads.
struct Seen {
    status: String,
    owner: String,
    fp: String,
    lease_until_ms: u64,
    /// Claimed by taking over an earlier claim (see `idem_release.lua`).
    took_over: bool,
}

fn seen(raw: &str) -> Option<Seen> {
    let v: serde_json::Value = serde_json::from_str(raw).ok()?;
    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_owned();
    Some(Seen {
        status: text("status"),
        owner: text("owner"),
        fp: text("fp"),
        lease_until_ms: v
            .get("lease_until_ms")
            .and_then(|x| x.as_f64())
            .map_or(0, |f| f as u64),
        took_over: v.get("took_over").and_then(|x| x.as_bool()) == Some(true),
    })
}

/// An in-progress record; `retention` (what the key's lifetime adds to the lease) is
/// written so that any reader can tell the lease from the key's ttl.
fn in_progress(
    owner: &str,
    fp: &str,
    now: u64,
    lease: Duration,
    retention: Duration,
    took_over: bool,
) -> String {
    use std::fmt::Write as _;
    // Keys in sorted order, as `serde_json` writes its (sorted) maps; written in place.
    let mut rec = String::with_capacity(160 + owner.len() + fp.len());
    let _ = write!(rec, r#"{{"claimed_at_ms":{now},"fp":"#);
    crate::util::push_json_str(fp, &mut rec);
    let _ = write!(rec, r#","lease_until_ms":{},"owner":"#, now + millis(lease));
    crate::util::push_json_str(owner, &mut rec);
    let _ = write!(
        rec,
        r#","retention_ms":{},"status":"in_progress""#,
        millis(retention)
    );
    if took_over {
        rec.push_str(r#","took_over":true"#);
    }
    rec.push('}');
    rec
}

impl MemoryBackend {
    pub(super) fn records(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (String, Instant)>> {
        let mut map = crate::util::lock(&self.records);
        let now = Instant::now();
        map.retain(|_, (_, until)| *until > now);
        map
    }

    fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed, BackendError> {
        let now = now_ms();
        let mut map = self.records();
        let fresh = |took_over| {
            (
                in_progress(
                    a.owner,
                    a.fp,
                    now,
                    a.lease,
                    a.lifetime.saturating_sub(a.lease),
                    took_over,
                ),
                Instant::now() + a.lifetime,
            )
        };
        let Some((raw, _)) = map.get(a.key) else {
            map.insert(a.key.to_owned(), fresh(false));
            return Ok(Claimed::New(None));
        };
        if let Some(at) = completed_at(raw) {
            return Ok(completed_claim(raw, at, a.fp));
        }
        let rec = seen(raw).ok_or_else(|| bad_reply("record is not JSON".into()))?;
        match rec.status.as_str() {
            "in_progress" if rec.owner == a.owner => {
                map.insert(a.key.to_owned(), fresh(rec.took_over));
                Ok(Claimed::New(None))
            }
            // Also past the lease: the claimer that stopped may have acted on its payload.
            "in_progress" if rec.fp != a.fp => Ok(Claimed::Mismatch { completed: false }),
            "in_progress" if rec.lease_until_ms > now => Ok(Claimed::InProgress(
                Duration::from_millis(rec.lease_until_ms - now),
            )),
            "in_progress" => {
                map.insert(a.key.to_owned(), fresh(true));
                Ok(Claimed::TookOver {
                    previous: rec.owner,
                })
            }
            other => Err(bad_reply(format!("record has unknown status `{other}`"))),
        }
    }

    fn owned_in_progress(raw: &str, owner: &str) -> bool {
        completed_at(raw).is_none()
            && seen(raw).is_some_and(|r| r.status == "in_progress" && r.owner == owner)
    }

    /// As the Redis store: the record appended (alone when the key had gone), `true`
    /// when it is the first completed one.
    fn store(&self, key: &str, record: &str, retention: Duration, channel: &str) -> bool {
        let mut map = self.records();
        let until = Instant::now() + retention;
        let (raw, _) = map
            .entry(key.to_owned())
            // The key keeps its lifetime, as on Redis.
            .and_modify(|(raw, _)| raw.push_str(record))
            .or_insert_with(|| (record.to_owned(), until));
        let Some(at) = completed_at(raw) else {
            return false;
        };
        if !raw[at..].starts_with(record) {
            return false;
        }
        // As `idem_settle.lua`: a claim of another payload in front keeps its record.
        let fp = completed_fp(record);
        if at > 0 && !raw[..at].contains(&format!(r#""fp":"{fp}""#)) {
            let kept = format!("{}{}", &raw[..at], &raw[at + record.len()..]);
            *raw = kept;
            return false;
        }
        drop(map);
        // In process, a publish costs nothing: waiters are not marked here.
        self.waiters.publish(channel);
        true
    }

    /// As `idem_release.lua`: a claim that took over is kept, ownerless, its lease ended.
    fn give_back(&self, key: &str, owner: &str, channel: &str) -> bool {
        let mut map = self.records();
        let Some((raw, _)) = map.get_mut(key) else {
            return false;
        };
        if completed_at(raw).is_some() {
            return false;
        }
        match seen(raw) {
            Some(r) if r.status == "in_progress" && r.owner == owner => {
                if r.took_over {
                    *raw = in_progress("", &r.fp, 0, Duration::ZERO, Duration::ZERO, true);
                } else {
                    map.remove(key);
                }
                drop(map);
                self.waiters.publish(channel);
                true
            }
            _ => false,
        }
    }

    /// As `idem_renew.lua`.
    fn renew(&self, key: &str, owner: &Owner<'_>, lease: Duration, lifetime: Duration) -> Renewal {
        let mut map = self.records();
        let now = Instant::now();
        match map.get_mut(key) {
            Some((raw, until)) if *until > now && Self::owned_in_progress(raw, owner.token) => {
                let mut v: serde_json::Value =
                    serde_json::from_str(raw).unwrap_or(serde_json::Value::Null);
                v["lease_until_ms"] = serde_json::Value::from(now_ms() + millis(lease));
                *raw = v.to_string();
                *until = now + lifetime;
                Renewal::Renewed
            }
            Some((_, until)) if *until > now => Renewal::Lost,
            _ => {
                let retention = lifetime.saturating_sub(lease);
                let record = in_progress(owner.token, owner.fp, now_ms(), lease, retention, true);
                map.insert(key.to_owned(), (record, now + lifetime));
                Renewal::Recreated
            }
        }
    }
}

impl Records for MemoryBackend {
    async fn idem_claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed, BackendError> {
        self.claim(a)
    }

    async fn idem_complete(
        &self,
        key: &str,
        record: &str,
        retention: Duration,
        channel: &str,
        _written: Option<&str>,
    ) -> Result<bool, BackendError> {
        Ok(self.store(key, record, retention, channel))
    }

    async fn idem_release(
        &self,
        key: &str,
        owner: &str,
        channel: &str,
        _retention: Duration,
    ) -> Result<bool, BackendError> {
        Ok(self.give_back(key, owner, channel))
    }

    async fn idem_renew(
        &self,
        key: &str,
        owner: &Owner<'_>,
        lease: Duration,
        lifetime: Duration,
    ) -> Result<Renewal, BackendError> {
        Ok(self.renew(key, owner, lease, lifetime))
    }

    async fn idem_peek(&self, key: &str, head: usize) -> Result<Peeked, BackendError> {
        let now = Instant::now();
        Ok(match self.records().get(key) {
            Some((raw, until)) => Peeked {
                head: Some(raw.as_bytes()[..head.min(raw.len())].to_vec()),
                len: raw.len(),
                ttl: Some(*until - now),
                now_ms: now_ms(),
            },
            None => Peeked {
                now_ms: now_ms(),
                ..Peeked::default()
            },
        })
    }

    async fn idem_look(&self, key: &str) -> Result<Looked, BackendError> {
        let now = Instant::now();
        Ok(match self.records().get(key) {
            Some((raw, until)) => Looked {
                value: Some(raw.clone()),
                ttl: Some(*until - now),
                now_ms: now_ms(),
            },
            None => Looked {
                now_ms: now_ms(),
                ..Looked::default()
            },
        })
    }

    async fn idem_forget(&self, key: &str, channel: &str) -> Result<Option<bool>, BackendError> {
        // Only records live here: locks are kept apart.
        let found = self.records().remove(key).is_some();
        if found {
            self.waiters.publish(channel);
        }
        Ok(Some(found))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner token's bytes in a record, escaped quotes included.
    #[test]
    fn finds_the_owner_token() {
        let lease = Duration::from_millis(1500);
        for owner in ["a:b:1", "we\"ird/\\owner"] {
            let rec = in_progress(owner, "abc", 1000, lease, lease, false);
            let range = owner_range(&rec).unwrap();
            let spelled: serde_json::Value =
                serde_json::from_str(&format!("{{{}}}", &rec[range])).unwrap();
            assert_eq!(spelled["owner"], owner);
        }
        assert_eq!(owner_range(r#"{"fp":"x"}"#), None);
    }

    /// The record written in place is the one `serde_json` writes.
    #[test]
    fn an_in_progress_record_is_serde_json_s() {
        let (lease, retention) = (Duration::from_millis(1500), Duration::from_secs(60));
        for (owner, took_over) in [("a:b:1", false), ("we\"ird/\\owner", true)] {
            let mut rec = serde_json::json!({
                "status": "in_progress",
                "owner": owner,
                "fp": "abc",
                "lease_until_ms": 1000 + 1500,
                "claimed_at_ms": 1000,
                "retention_ms": 60_000,
            });
            if took_over {
                rec["took_over"] = true.into();
            }
            assert_eq!(
                in_progress(owner, "abc", 1000, lease, retention, took_over),
                rec.to_string()
            );
        }
    }
}
