//! The in-process backend: the same TTL, token, fencing, loss and wake-up rules as Redis.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{Attempt, Locking, ReleaseCall, Released, Try};
use crate::error::BackendError;
use crate::notify::{Registry, Wakeups};

#[derive(Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
    /// Waiters, woken on release as Pub/Sub would.
    pub(super) waiters: Arc<Registry>,
    /// Idempotency records: JSON text and when the key expires (see `super::idem`).
    pub(crate) records: Mutex<HashMap<String, (String, Instant)>>,
}

#[derive(Default)]
struct State {
    held: HashMap<String, (String, Instant)>,
    /// Fence counters: the last fence given, and when the counter expires (the idle
    /// window after it).
    fences: HashMap<String, (u64, Instant)>,
    /// How many counters there may be before the expired ones are swept out.
    fences_sweep_at: usize,
    /// The highest fence this backend gave, for any name: a counter made afresh starts
    /// above it, so that its fences stay above its name's earlier ones even when the
    /// window passed faster than the clock (a test's paused tokio clock, or an expiry
    /// within the microsecond of the last fence).
    fences_highest: u64,
    /// Values written under a fence, with the highest fence seen for each and when both
    /// expire (`None`: never).
    fenced: HashMap<String, Fenced>,
    /// Semaphores and read locks' readers: each holder's token and when its lease ends.
    permits: HashMap<String, Vec<(String, Instant)>>,
    /// Semaphores' limits (in Redis a member of the set, `key::limit_member`): the count
    /// of the latest acquire that took a permit, kept while the set is.
    limits: HashMap<String, u32>,
    /// Read/write locks: the token of a writer that waits, until when; until when
    /// readers wait behind a writer that holds.
    writer_waits: HashMap<String, (String, Instant)>,
    readers_wait: HashMap<String, Vec<(String, Instant)>>,
}

/// A value written under a fence (see `set_fenced.lua`): the value, the highest fence
/// seen, and when both expire.
type Fenced = (Option<String>, u64, Option<Instant>);

impl State {
    /// The counter of `key` at `now`, unless it expired.
    fn fence_of(&self, key: &str, now: Instant) -> Option<u64> {
        self.fences
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(fence, _)| *fence)
    }

    /// A lock's try at `now` (see acquire.lua): busy while readers hold the name, and
    /// refused (`WRONGTYPE`, as Redis) while a semaphore does.
    fn take(
        &mut self,
        key: &str,
        token: &str,
        ttl: Duration,
        now: Instant,
    ) -> Result<Try, BackendError> {
        if self.live(key, now).is_some() {
            return Err(wrong_type());
        }
        if let Some(until) = self.live(&crate::key::companion(key, ":readers"), now) {
            return Ok(Try::Readers(Some(until - now)));
        }
        if let Some((held, until)) = self.held.get_mut(key)
            && *until > now
        {
            if held != token {
                return Ok(Try::Busy(Some(*until - now)));
            }
            // Handed to this token by a release whose caller gave up (see acquire.lua).
            *until = now + ttl;
            return Ok(Try::Taken);
        }
        self.held
            .insert(key.to_owned(), (token.to_owned(), now + ttl));
        Ok(Try::Taken)
    }

    /// When the last live lease of the sorted set `set` (a semaphore, a read lock's
    /// readers) ends, if one runs at `now`.
    fn live(&self, set: &str, now: Instant) -> Option<Instant> {
        self.permits
            .get(set)?
            .iter()
            .map(|(_, until)| *until)
            .filter(|until| *until > now)
            .max()
    }

    /// Whether a lock or a write lock holds `key` at `now`.
    fn locked(&self, key: &str, now: Instant) -> bool {
        self.held.get(key).is_some_and(|(_, until)| *until > now)
    }
}

/// What Redis answers a command on a key of another type (a lock's try on a semaphore,
/// say): the in-memory backend refuses where Redis does.
fn wrong_type() -> BackendError {
    BackendError::wrong_type("WRONGTYPE Operation against a key holding the wrong kind of value")
}

impl MemoryBackend {
    /// How this backend's waiters are woken: by its own registry, as Pub/Sub would.
    pub(crate) fn wakeups(&self) -> Wakeups {
        Wakeups::Local(self.waiters.clone())
    }

    fn take(&self, key: &str, token: &str, ttl: Duration) -> Result<Try, BackendError> {
        let mut st = crate::util::lock(&self.state);
        st.take(key, token, ttl, Instant::now())
    }

    /// The next fence of `key` while it holds `token`, as `fence.lua` gives it:
    /// max(counter + 1, the clock in microseconds), the counter expiring after `idle`
    /// without a fence.
    fn next_fence(&self, key: &str, token: &str, idle: Duration) -> Option<u64> {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        match st.held.get(key) {
            Some((held, until)) if held == token && *until > now => {
                let last = st.fence_of(key, now).unwrap_or(st.fences_highest);
                let fence = last.saturating_add(1).max(clock_micros());
                st.fences_highest = st.fences_highest.max(fence);
                st.fences.insert(key.to_owned(), (fence, now + idle));
                // Expired counters go, as Redis expires them: swept when the map has
                // doubled since the last sweep.
                if st.fences.len() > st.fences_sweep_at {
                    st.fences.retain(|_, (_, until)| *until > now);
                    st.fences_sweep_at = (2 * st.fences.len()).max(1024);
                }
                Some(fence)
            }
            _ => None,
        }
    }

    /// In process there are no other clients to leave the lock to: a successor always
    /// gets it.
    fn free(&self, call: &ReleaseCall<'_>) -> Released {
        let (key, now) = (call.key, Instant::now());
        let mut st = crate::util::lock(&self.state);
        // Kept for `min_hold` (see `keep`): still the holder's.
        let own = |held: &str| held.strip_suffix(" kept").unwrap_or(held) == call.token;
        match st.held.get(key) {
            Some((held, until)) if own(held) && *until > now => {
                if let Some(next) = call.successor {
                    st.held
                        .insert(key.to_owned(), (next.token.to_owned(), now + next.ttl));
                    return Released::Handed;
                }
                st.held.remove(key);
                drop(st);
                self.waiters.publish(&crate::notify::channel_of(key));
                Released::Now
            }
            Some((held, until))
                if *until > now && call.successor.is_some_and(|s| s.token == held) =>
            {
                Released::Handed
            }
            _ => Released::NotOurs,
        }
    }

    /// As `permit_acquire.lua`.
    fn take_permit(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        permits: u32,
    ) -> Result<Try, BackendError> {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        // A lock, a write lock or readers (`readers` at the key, in Redis) hold the name.
        let readers = crate::key::companion(key, ":readers");
        if st.locked(key, now) || st.live(&readers, now).is_some() {
            return Err(wrong_type());
        }
        let holders = st.permits.entry(key.to_owned()).or_default();
        holders.retain(|(_, until)| *until > now);
        if let Some(mine) = holders.iter_mut().find(|(held, _)| held == token) {
            mine.1 = now + ttl;
            st.limits.insert(key.to_owned(), permits);
            return Ok(Try::Taken);
        }
        if holders.len() < permits as usize {
            holders.push((token.to_owned(), now + ttl));
            st.limits.insert(key.to_owned(), permits);
            return Ok(Try::Taken);
        }
        let first = holders.iter().map(|(_, until)| *until).min();
        Ok(Try::Busy(first.map(|until| until - now)))
    }

    /// As `read_acquire.lua`.
    fn take_read(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        if st.live(key, now).is_some() {
            return Err(wrong_type());
        }
        let set = crate::key::companion(key, ":readers");
        let readers = st.permits.entry(set).or_default();
        readers.retain(|(_, until)| *until > now);
        if let Some(mine) = readers.iter_mut().find(|(held, _)| held == token) {
            mine.1 = now + ttl;
            return Ok(Try::Taken);
        }
        let waited = st.readers_wait.entry(key.to_owned()).or_default();
        waited.retain(|(_, until)| *until > now);
        let my_turn = waited.iter().any(|(t, _)| t == token);
        if waited.is_empty() {
            st.readers_wait.remove(key);
        }
        if let Some((_, until)) = st.held.get(key).filter(|(_, until)| *until > now) {
            let left = *until - now;
            if !waiting.is_zero() {
                let waited = st.readers_wait.entry(key.to_owned()).or_default();
                waited.retain(|(t, _)| t != token);
                waited.push((token.to_owned(), now + waiting));
            }
            return Ok(Try::Busy(Some(left)));
        }
        if let Some((_, until)) = st.writer_waits.get(key).filter(|(_, until)| *until > now)
            && !my_turn
        {
            return Ok(Try::Busy(Some(*until - now)));
        }
        if let Some(waited) = st.readers_wait.get_mut(key) {
            waited.retain(|(t, _)| t != token);
            if waited.is_empty() {
                st.readers_wait.remove(key);
            }
        }
        let set = crate::key::companion(key, ":readers");
        st.permits
            .entry(set)
            .or_default()
            .push((token.to_owned(), now + ttl));
        Ok(Try::Taken)
    }

    /// As `write_acquire.lua`.
    fn take_write(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        let now = Instant::now();
        // One critical section, as one script: a reader cannot come in between the
        // look at the readers and the take.
        let mut st = crate::util::lock(&self.state);
        if st.live(key, now).is_some() {
            return Err(wrong_type());
        }
        let set = crate::key::companion(key, ":readers");
        let readers = st.permits.entry(set).or_default();
        readers.retain(|(_, until)| *until > now);
        let first_reader = readers.iter().map(|(_, until)| *until).min();
        let mine = st.held.get(key).is_some_and(|(held, _)| held == token);
        let readers_turn = st
            .readers_wait
            .get(key)
            .and_then(|w| w.iter().map(|(_, until)| *until).filter(|u| *u > now).min())
            .filter(|_| !mine);
        let tried = match (first_reader, readers_turn) {
            (Some(until), _) => Try::Busy(Some(until - now)),
            (None, Some(until)) => return Ok(Try::Busy(Some(until - now))),
            (None, None) => st.take(key, token, ttl, now)?,
        };
        match tried {
            Try::Busy(_) if !waiting.is_zero() => {
                let mark = (token.to_owned(), now + waiting);
                st.writer_waits.insert(key.to_owned(), mark);
            }
            Try::Taken if st.writer_waits.get(key).is_some_and(|(t, _)| t == token) => {
                st.writer_waits.remove(key);
            }
            _ => {}
        }
        Ok(tried)
    }

    /// As `permit_release.lua` (`Some(wake)`) and `permit_extend.lua` (`None`).
    fn permit_held(
        &self,
        key: &str,
        token: &str,
        release: Option<(&str, bool)>,
        ttl: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        let Some(holders) = st.permits.get_mut(key) else {
            return false;
        };
        let Some(at) = holders.iter().position(|(held, _)| held == token) else {
            return false;
        };
        let live = holders[at].1 > now;
        if release.is_some() || !live {
            holders.remove(at);
        } else if !ttl.is_zero() {
            holders[at].1 = now + ttl;
        }
        // Leases that ended count as gone: the last live holder wakes the waiter.
        let empty = holders.iter().all(|(_, until)| *until <= now);
        if holders.is_empty() {
            st.permits.remove(key);
            st.limits.remove(key);
        }
        drop(st);
        if let Some((of, last)) = release
            && live
            && (empty || !last)
        {
            self.waiters.publish(&crate::notify::channel_of(of));
        }
        live
    }

    pub(crate) fn extend(&self, key: &str, token: &str, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        match st.held.get_mut(key) {
            Some((held, until)) if held == token && *until > now => {
                // Zero keeps the lease (a confirmation, see `extend.lua`).
                if !ttl.is_zero() {
                    *until = now + ttl;
                }
                true
            }
            _ => false,
        }
    }
}

/// Microseconds since the epoch: the floor of every fence (see `fence.lua`).
pub(crate) fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The value fenced at `key` and its highest fence seen, unless they expired.
fn fenced_at(
    fenced: &HashMap<String, Fenced>,
    key: &str,
    now: Instant,
) -> Option<(Option<String>, u64)> {
    fenced
        .get(key)
        .filter(|(_, _, until)| until.is_none_or(|until| until > now))
        .map(|(value, seen, _)| (value.clone(), *seen))
}

/// Every call answers at once: nothing here waits or fails.
impl Locking for MemoryBackend {
    async fn try_acquire(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        _client: &str,
        _attempt: Attempt,
    ) -> Result<Try, BackendError> {
        self.take(key, token, ttl)
    }

    async fn fence(
        &self,
        key: &str,
        token: &str,
        idle: Duration,
    ) -> Result<Option<u64>, BackendError> {
        Ok(self.next_fence(key, token, idle))
    }

    async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        Ok(self.free(call))
    }

    /// As `keep.lua`: the value becomes `<token> kept`, which no renewal finds.
    async fn keep(&self, key: &str, token: &str, left: Duration) -> Result<bool, BackendError> {
        let now = Instant::now();
        let kept = format!("{token} kept");
        let mut st = crate::util::lock(&self.state);
        Ok(match st.held.get_mut(key) {
            Some((held, until)) if *until > now && (held == token || *held == kept) => {
                *held = kept;
                *until = now + left;
                true
            }
            _ => false,
        })
    }

    async fn set_fenced(
        &self,
        key: &str,
        value: &str,
        fence: u64,
        ttl: Option<Duration>,
    ) -> Result<Option<u64>, BackendError> {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        let seen = fenced_at(&st.fenced, key, now).map_or(0, |(_, seen)| seen);
        if fence < seen {
            return Ok(Some(seen));
        }
        let until = ttl.map(|ttl| now + ttl);
        st.fenced
            .insert(key.to_owned(), (Some(value.to_owned()), fence, until));
        Ok(None)
    }

    async fn fenced_value(&self, key: &str) -> Result<(Option<String>, u64), BackendError> {
        let st = crate::util::lock(&self.state);
        Ok(fenced_at(&st.fenced, key, Instant::now()).unwrap_or_default())
    }

    async fn extend_many(&self, leases: &[(&str, &str, Duration)]) -> super::Extended {
        leases
            .iter()
            .map(|(key, token, ttl)| Ok(self.extend(key, token, *ttl)))
            .collect()
    }

    async fn try_permit(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        permits: u32,
    ) -> Result<Try, BackendError> {
        self.take_permit(key, token, ttl, permits)
    }

    async fn release_permit(
        &self,
        set: &str,
        token: &str,
        wake: (&str, bool),
    ) -> Result<Released, BackendError> {
        Ok(
            if self.permit_held(set, token, Some(wake), Duration::ZERO) {
                Released::Now
            } else {
                Released::NotOurs
            },
        )
    }

    async fn try_read(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        _mark: bool,
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        self.take_read(key, token, ttl, waiting)
    }

    async fn try_write(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        _who: (&str, bool),
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        self.take_write(key, token, ttl, waiting)
    }

    async fn extend_permits(&self, leases: &[(&str, &str, Duration)]) -> super::Extended {
        leases
            .iter()
            .map(|(key, token, ttl)| Ok(self.permit_held(key, token, None, *ttl)))
            .collect()
    }

    fn one_call(&self, _keys: &[&str]) -> bool {
        true
    }

    async fn inspect(&self, key: &str) -> Result<super::Seen, BackendError> {
        let now = Instant::now();
        let st = crate::util::lock(&self.state);
        let live = |set: &str| -> Vec<(String, Duration)> {
            st.permits.get(set).map_or_else(Vec::new, |holders| {
                holders
                    .iter()
                    .filter(|(_, until)| *until > now)
                    .map(|(token, until)| (token.clone(), *until - now))
                    .collect()
            })
        };
        let held = st.held.get(key).filter(|(_, until)| *until > now);
        let permits = live(key);
        let limit = st.limits.get(key).copied().filter(|_| !permits.is_empty());
        let left = held
            .map(|(_, until)| *until - now)
            .or_else(|| permits.iter().map(|(_, left)| *left).max());
        Ok(super::Seen {
            value: held.map(|(token, _)| token.clone()),
            left,
            fence: st.fence_of(key, now),
            readers: live(&crate::key::companion(key, ":readers")),
            permits,
            limit,
            writer_waiting: st
                .writer_waits
                .get(key)
                .filter(|(_, until)| *until > now)
                .map(|(token, _)| token.clone()),
            listening: self.waiters.waiters(&crate::notify::channel_of(key)) as u64,
        })
    }

    async fn force_release(&self, key: &str) -> Result<bool, BackendError> {
        let mut st = crate::util::lock(&self.state);
        let readers = crate::key::companion(key, ":readers");
        let mut found = st.held.remove(key).is_some();
        found |= st.permits.remove(key).is_some();
        st.limits.remove(key);
        found |= st.permits.remove(&readers).is_some();
        found |= st.writer_waits.remove(key).is_some();
        found |= st.readers_wait.remove(key).is_some();
        drop(st);
        if found {
            self.waiters.publish(&crate::notify::channel_of(key));
        }
        Ok(found)
    }

    async fn scan_nodes(&self) -> Result<Vec<super::ScanNode>, BackendError> {
        Ok(vec![super::ScanNode(None)])
    }

    /// Every live key at once (cursor 0): the locks, semaphores and readers' sets, the
    /// waiting writers' marks, the fences and the idempotency records, as Redis keeps
    /// them.
    async fn scan(
        &self,
        _node: &super::ScanNode,
        _cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), BackendError> {
        let now = Instant::now();
        let st = crate::util::lock(&self.state);
        let mut keys: Vec<String> = st
            .held
            .iter()
            .filter(|(_, (_, until))| *until > now)
            .map(|(key, _)| key.clone())
            .chain(
                st.permits
                    .iter()
                    .filter(|(_, holders)| holders.iter().any(|(_, until)| *until > now))
                    .map(|(key, _)| key.clone()),
            )
            .chain(
                st.writer_waits
                    .iter()
                    .filter(|(_, (_, until))| *until > now)
                    .map(|(key, _)| crate::key::companion(key, ":writer")),
            )
            .chain(
                st.fences
                    .iter()
                    .filter(|(_, (_, until))| *until > now)
                    .map(|(key, _)| crate::key::companion(key, ":fence")),
            )
            .collect();
        drop(st);
        keys.extend(self.records().keys().cloned());
        keys.retain(|key| crate::util::glob_match(pattern.as_bytes(), key.as_bytes()));
        Ok((0, keys))
    }

    async fn try_all(
        &self,
        keys: &[&str],
        tokens: &[&str],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        // Held, by a lock, readers (`readers` at the key, in Redis) or a semaphore: each
        // is tried alone (and a semaphore refuses there, as in Redis).
        if keys.iter().any(|k| {
            st.locked(k, now)
                || st.live(k, now).is_some()
                || st
                    .live(&crate::key::companion(k, ":readers"), now)
                    .is_some()
        }) {
            return Ok(false);
        }
        for (key, token) in keys.iter().zip(tokens) {
            st.held
                .insert((*key).to_owned(), ((*token).to_owned(), now + ttl));
        }
        Ok(true)
    }

    async fn ping(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn command_timeout(&self) -> Duration {
        Duration::ZERO
    }

    fn in_process(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters that expire between any two fences (a window shorter than the time
    /// between them, as a paused tokio clock makes it) still give growing fences, even
    /// two within one microsecond of the clock. Control: a name fenced with a day's window
    /// keeps its counter, which steps from its own last fence.
    #[test]
    fn fences_grow_when_every_counter_expires_before_the_next_fence() {
        let memory = MemoryBackend::default();
        let ttl = Duration::from_secs(60);
        assert!(matches!(memory.take("k", "t", ttl), Ok(Try::Taken)));
        let mut last = 0;
        for _ in 0..10_000 {
            let fence = memory.next_fence("k", "t", Duration::ZERO).unwrap();
            assert!(fence > last, "{fence} after {last}");
            last = fence;
        }
        assert!(matches!(memory.take("day", "t", ttl), Ok(Try::Taken)));
        let day = Duration::from_secs(86_400);
        let first = memory.next_fence("day", "t", day).unwrap();
        let st = crate::util::lock(&memory.state);
        assert_eq!(st.fence_of("day", Instant::now()), Some(first));
        assert_eq!(st.fence_of("k", Instant::now()), None, "expired");
    }
}
