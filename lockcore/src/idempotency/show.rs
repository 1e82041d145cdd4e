//! Looking at an idempotency record from the outside, and forgetting one: what an
//! on-call engineer needs when a key is stuck in progress or holds a result that must
//! not be replayed.

use std::time::Duration;

use crate::backend::idem::{Records, completed_at};
use crate::client::Locks;
use crate::error::{Error, Result};
use crate::lock::Holder;

/// Where an idempotency record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// A call claimed the key and has not stored its result: it runs, or its lease has
    /// ended (see [`IdemRecord::lease_left`]) and the next call with the same payload
    /// takes it over.
    InProgress,
    /// The result is stored: calls with the same payload replay it until the record
    /// expires.
    Completed,
    /// A value distlock cannot read as a record.
    Unreadable,
}

/// One idempotency record as [`Locks::idem_record`] sees it, read from its plain JSON
/// value (the layout is in the crate docs).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdemRecord {
    /// The full Redis key.
    pub key: String,
    /// Where the record stands.
    pub state: RecordState,
    /// The call that claimed it: its token's UUID, host and pid (`None` once completed,
    /// or for a claim given back after a takeover: ownerless until the next call).
    pub owner: Option<Holder>,
    /// In progress: the claim's lease left, by the server's clock (zero once it ended:
    /// the claim is stuck, or its caller died, and the next call takes it over).
    pub lease_left: Option<Duration>,
    /// The record's ttl: how long until Redis drops it.
    pub expires_in: Option<Duration>,
    /// When the call claimed it (ms since the Unix epoch).
    pub claimed_at_ms: Option<u64>,
    /// When the result was stored (ms since the Unix epoch).
    pub completed_at_ms: Option<u64>,
    /// The request's fingerprint (SHA-256, hex).
    pub fingerprint: Option<String>,
    /// A stored HTTP response's status.
    pub status: Option<u16>,
    /// The stored result as JSON text: a fn's `{"value":..}` or a handler's
    /// `{"response":{"status":..,"headers":..,"body":..}}` (an `"unstorable"` reason
    /// where the value could not be stored).
    pub stored: Option<String>,
    /// The whole value, as Redis holds it.
    pub raw: String,
}

impl IdemRecord {
    /// In progress, claimed, with its lease ended: its caller died or hangs. The next
    /// call with the same payload takes it over; [`Locks::forget_idem`] lets any next
    /// call run. (A claim given back after a takeover has no owner: not stuck.)
    pub fn is_stuck(&self) -> bool {
        self.state == RecordState::InProgress
            && self.owner.is_some()
            && self.lease_left == Some(Duration::ZERO)
    }

    fn read(key: &str, raw: String, expires_in: Option<Duration>, now_ms: u64) -> IdemRecord {
        let mut record = IdemRecord {
            key: key.to_owned(),
            state: RecordState::Unreadable,
            owner: None,
            lease_left: None,
            expires_in,
            claimed_at_ms: None,
            completed_at_ms: None,
            fingerprint: None,
            status: None,
            stored: None,
            raw: String::new(),
        };
        let first = |text: &str| {
            serde_json::Deserializer::from_str(text)
                .into_iter::<serde_json::Value>()
                .next()
                .and_then(|v| v.ok())
        };
        let text =
            |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        let int = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        if let Some(at) = completed_at(&raw) {
            if let Some(done) = first(&raw[at..]) {
                record.state = RecordState::Completed;
                record.fingerprint = text(&done, "fp");
                record.completed_at_ms = int(&done, "completed_at_ms");
                record.claimed_at_ms = first(&raw).and_then(|claim| int(&claim, "claimed_at_ms"));
                let mut stored = done.clone();
                if let Some(object) = stored.as_object_mut() {
                    for meta in ["status", "fp", "completed_at_ms"] {
                        object.remove(meta);
                    }
                }
                record.status = done
                    .get("response")
                    .and_then(|r| r.get("status"))
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|s| u16::try_from(s).ok());
                record.stored = Some(stored.to_string());
            }
        } else if let Some(claim) = first(&raw)
            && claim.get("status").and_then(|s| s.as_str()) == Some("in_progress")
        {
            record.state = RecordState::InProgress;
            record.owner = text(&claim, "owner")
                .as_deref()
                .and_then(Holder::from_token);
            record.fingerprint = text(&claim, "fp");
            record.claimed_at_ms = int(&claim, "claimed_at_ms");
            // The lease is the key's ttl minus the retention the claim was written with:
            // the server's clock, as the claim script judges it (`lease_until_ms` comes
            // from the clock of whichever client wrote it); a record without
            // `retention_ms` (an earlier version's) by `lease_until_ms` and TIME.
            record.lease_left = match (int(&claim, "retention_ms"), expires_in) {
                (Some(retention), Some(ttl)) => {
                    Some(ttl.saturating_sub(Duration::from_millis(retention)))
                }
                _ => {
                    let until = int(&claim, "lease_until_ms").unwrap_or(0);
                    Some(Duration::from_millis(until.saturating_sub(now_ms)))
                }
            };
        }
        record.raw = raw;
        record
    }
}

/// How many bytes of a record [`Locks::stuck_idem_records`] reads: an in-progress
/// claim (a few hundred bytes: an owner token with its host name, a fingerprint, times)
/// and the start of a completed record appended after it fit.
const PEEKED: usize = 4096;

impl Locks {
    /// The idempotency record at `key`, in one read-only look: where it stands, who
    /// claimed it and its lease left, its ttl, its fingerprint and its stored result.
    /// `key` is the record's full Redis key (`lock:idem:app::pay:user-7:K1`) or that key
    /// without the client's prefix. `None`: no record. Not over Redlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// // What `#[idempotent(key = "<k>")] async fn pay(k: &str)` in `app` writes for "K1":
    /// let key = "idem:app::pay:K1";
    /// match locks.idem_record(key).await.unwrap() {
    ///     Some(record) if record.is_stuck() => println!("stuck: claimed by {:?}", record.owner),
    ///     Some(record) => println!("{:?}, expires in {:?}", record.state, record.expires_in),
    ///     None => println!("no record"),
    /// }
    /// assert!(!locks.forget_idem(key).await.unwrap());
    /// # }
    /// ```
    pub async fn idem_record(&self, key: &str) -> Result<Option<IdemRecord>> {
        let key = self.record_key(key)?;
        let looked = self.inner.backend.idem_look(&key).await;
        let looked = looked.map_err(|e| Error::backend(&key, e))?;
        Ok(looked
            .value
            .map(|raw| IdemRecord::read(&key, raw, looked.ttl, looked.now_ms)))
    }

    /// Deletes the idempotency record at `key` (as for [`idem_record`](Self::idem_record))
    /// and wakes the repeats that wait on it: the next call under its key runs the body,
    /// whatever ran before. `true` when there was a record. An operator's tool for a
    /// result that must not be replayed (stored by a bug) or a claim that must not be
    /// waited for. A call still running under a forgotten claim finds out at its next
    /// renewal (within a third of its lease) or when it stores: if no other call has
    /// claimed the key meanwhile, its result is stored (the record comes back); if one
    /// has, it gets [`Error::Lost`], or its own result unstored when the other call
    /// stored the same payload's result first. Not over Redlock.
    pub async fn forget_idem(&self, key: &str) -> Result<bool> {
        let key = self.record_key(key)?;
        let channel = super::done_channel(&key);
        let forgot = self.inner.backend.idem_forget(&key, &channel).await;
        let Some(forgot) = forgot.map_err(|e| Error::backend(&key, e))? else {
            // Not a record: nothing was deleted.
            return Err(Error::WrongKind {
                key,
                held: crate::key::Kind::Unknown,
                asked: crate::key::Kind::IdempotencyRecord,
            });
        };
        if forgot {
            tracing::warn!(target: "distlock", key = %key, "idempotency record forgotten: the next call under its key runs the body");
        }
        Ok(forgot)
    }

    /// Every idempotency record whose key, after `<prefix>idem:`, matches `pattern` (a
    /// glob as `SCAN MATCH` reads it; `*` for all): a stream that walks the keys with
    /// `SCAN` (every primary of a cluster) and reads each record it finds, one at a time.
    /// A record that expires during the walk does not come. An error ends the stream. Not
    /// over Redlock.
    pub fn idem_records(
        &self,
        pattern: &str,
    ) -> impl futures_util::Stream<Item = Result<IdemRecord>> + Send + '_ {
        let look = move |key: String| async move { self.idem_record(&key).await };
        self.record_walk(pattern)
            .looked(self, |found| Some(found.to_owned()), look)
    }

    /// The idempotency records of the key the application wrote: `pay:42` for
    /// `#[idempotent(key = "pay:<id>")]` called with id 42, whose record is
    /// `<prefix>idem:<crate>::<fn>:pay:42`. Every record whose key, after
    /// `<prefix>idem:`, is `app_key` or ends with `:<app_key>` (one per function, or
    /// scope, that used that key): a stream that walks the keys with `SCAN` as
    /// [`idem_records`](Self::idem_records) does, `app_key` taken literally (a `*` in it
    /// is no glob). An error ends the stream. Not over Redlock.
    ///
    /// ```
    /// use futures_util::TryStreamExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let found: Vec<_> = locks.idem_records_for("pay:42").try_collect().await.unwrap();
    /// assert!(found.is_empty());
    /// # }
    /// ```
    pub fn idem_records_for<'a>(
        &'a self,
        app_key: &'a str,
    ) -> impl futures_util::Stream<Item = Result<IdemRecord>> + Send + 'a {
        let mut pattern = String::from("*");
        for ch in app_key.chars() {
            if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(ch);
        }
        let records = format!("{}{}", self.inner.prefix, crate::key::RECORDS);
        let keep = move |found: &str| {
            let rest = found.strip_prefix(records.as_str())?;
            let ends = rest
                .strip_suffix(app_key)
                .is_some_and(|head| head.is_empty() || head.ends_with(':'));
            ends.then(|| found.to_owned())
        };
        let look = move |key: String| async move { self.idem_record(&key).await };
        self.record_walk(&pattern).looked(self, keep, look)
    }

    /// The idempotency records whose key matches `pattern` (as for
    /// [`idem_records`](Self::idem_records)) that are stuck ([`IdemRecord::is_stuck`]):
    /// a stream that walks the keys with `SCAN` and looks at each record's first bytes
    /// only, since a completed record is never stuck and its stored result (which may be
    /// large) need not be read. A claim is read whole, one at a time, so the walk holds a
    /// few records' heads at once whatever the keyspace. An error ends the stream. Not
    /// over Redlock.
    ///
    /// ```
    /// use futures_util::TryStreamExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let stuck: Vec<_> = locks.stuck_idem_records("*").try_collect().await.unwrap();
    /// assert!(stuck.is_empty());
    /// # }
    /// ```
    pub fn stuck_idem_records(
        &self,
        pattern: &str,
    ) -> impl futures_util::Stream<Item = Result<IdemRecord>> + Send + '_ {
        let look = move |key: String| async move { self.stuck_idem_record(&key).await };
        self.record_walk(pattern)
            .looked(self, |found| Some(found.to_owned()), look)
    }

    /// The record at `key` when it is stuck, judged from its first [`PEEKED`] bytes: a
    /// completed record's marker there settles it (never stuck); a value that fits is
    /// read as [`idem_record`](Self::idem_record) would read it; a longer one without
    /// the marker in its head (no record distlock writes) is read whole.
    async fn stuck_idem_record(&self, key: &str) -> Result<Option<IdemRecord>> {
        let key = self.record_key(key)?;
        let peeked = self.inner.backend.idem_peek(&key, PEEKED).await;
        let peeked = peeked.map_err(|e| Error::backend(&key, e))?;
        let Some(head) = peeked.head else {
            return Ok(None);
        };
        let head = String::from_utf8_lossy(&head);
        if completed_at(&head).is_some() {
            return Ok(None);
        }
        let record = if peeked.len <= PEEKED {
            IdemRecord::read(&key, head.into_owned(), peeked.ttl, peeked.now_ms)
        } else {
            match self.idem_record(&key).await? {
                Some(record) => record,
                None => return Ok(None),
            }
        };
        Ok(record.is_stuck().then_some(record))
    }

    /// The walk over the records whose key, after `<prefix>idem:`, matches `pattern`.
    fn record_walk(&self, pattern: &str) -> crate::lock::KeyWalk {
        let prefix = &self.inner.prefix;
        crate::lock::KeyWalk::new(vec![format!("{prefix}{}{pattern}", crate::key::RECORDS)])
    }

    /// A record's full key: `key` as given when it begins with the client's prefix, else
    /// the prefix then `key`; refused unless it names a record (`<prefix>idem:...`): a
    /// lock's key is never read or deleted as a record.
    fn record_key(&self, key: &str) -> Result<String> {
        let prefix = &*self.inner.prefix;
        let full = if !prefix.is_empty() && key.starts_with(prefix) {
            key.to_owned()
        } else {
            format!("{prefix}{key}")
        };
        if !full[prefix.len()..].starts_with(crate::key::RECORDS) {
            return Err(Error::InvalidKey {
                key: full,
                reason: format!(
                    "an idempotency record's key begins with `{prefix}{}` (a lock's does not: \
                     look at a lock with `Locks::inspect`, `distlock inspect`)",
                    crate::key::RECORDS
                ),
            });
        }
        Ok(full)
    }
}
