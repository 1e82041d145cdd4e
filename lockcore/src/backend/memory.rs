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
    fences: HashMap<String, u64>,
    /// Values written under a fence, with the highest fence seen for each.
    fenced: HashMap<String, (Option<String>, u64)>,
    /// Semaphores: each holder's token and when its lease ends.
    permits: HashMap<String, Vec<(String, Instant)>>,
}

impl MemoryBackend {
    /// How this backend's waiters are woken: by its own registry, as Pub/Sub would.
    pub(crate) fn wakeups(&self) -> Wakeups {
        Wakeups::Local(self.waiters.clone())
    }

    fn take(&self, key: &str, token: &str, ttl: Duration) -> Try {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        if let Some((held, until)) = st.held.get_mut(key)
            && *until > now
        {
            if held != token {
                return Try::Busy(Some(*until - now));
            }
            // Handed to this token by a release whose caller gave up (see acquire.lua).
            *until = now + ttl;
            return Try::Taken;
        }
        st.held
            .insert(key.to_owned(), (token.to_owned(), now + ttl));
        Try::Taken
    }

    /// The next fence of `key` while it holds `token` (see `RedisBackend::fence`).
    fn next_fence(&self, key: &str, token: &str) -> Option<u64> {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        match st.held.get(key) {
            Some((held, until)) if held == token && *until > now => {
                let fence = st.fences.entry(key.to_owned()).or_insert(0);
                *fence += 1;
                Some(*fence)
            }
            _ => None,
        }
    }

    /// In process there are no other clients to leave the lock to: a successor always
    /// gets it.
    fn free(&self, call: &ReleaseCall<'_>) -> Released {
        let (key, now) = (call.key, Instant::now());
        let mut st = crate::util::lock(&self.state);
        match st.held.get(key) {
            Some((held, until)) if held == call.token && *until > now => {
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
    fn take_permit(&self, key: &str, token: &str, ttl: Duration, permits: u32) -> Try {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        let holders = st.permits.entry(key.to_owned()).or_default();
        holders.retain(|(_, until)| *until > now);
        if let Some(mine) = holders.iter_mut().find(|(held, _)| held == token) {
            mine.1 = now + ttl;
            return Try::Taken;
        }
        if holders.len() < permits as usize {
            holders.push((token.to_owned(), now + ttl));
            return Try::Taken;
        }
        let first = holders.iter().map(|(_, until)| *until).min();
        Try::Busy(first.map(|until| until - now))
    }

    /// As `permit_release.lua` (`true`) and `permit_extend.lua` (`false`).
    fn permit_held(&self, key: &str, token: &str, release: bool, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        let Some(holders) = st.permits.get_mut(key) else {
            return false;
        };
        let Some(at) = holders.iter().position(|(held, _)| held == token) else {
            return false;
        };
        let live = holders[at].1 > now;
        if release || !live {
            holders.remove(at);
            if holders.is_empty() {
                st.permits.remove(key);
            }
        } else {
            holders[at].1 = now + ttl;
        }
        drop(st);
        if release && live {
            self.waiters.publish(&crate::notify::channel_of(key));
        }
        live
    }

    pub(crate) fn extend(&self, key: &str, token: &str, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut st = crate::util::lock(&self.state);
        match st.held.get_mut(key) {
            Some((held, until)) if held == token && *until > now => {
                *until = now + ttl;
                true
            }
            _ => false,
        }
    }
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
        Ok(self.take(key, token, ttl))
    }

    async fn fence(&self, key: &str, token: &str) -> Result<Option<u64>, BackendError> {
        Ok(self.next_fence(key, token))
    }

    async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        Ok(self.free(call))
    }

    async fn set_fenced(
        &self,
        key: &str,
        value: &str,
        fence: u64,
    ) -> Result<Option<u64>, BackendError> {
        let mut st = crate::util::lock(&self.state);
        let (stored, seen) = st.fenced.entry(key.to_owned()).or_default();
        if fence < *seen {
            return Ok(Some(*seen));
        }
        *seen = fence;
        *stored = Some(value.to_owned());
        Ok(None)
    }

    async fn fenced_value(&self, key: &str) -> Result<(Option<String>, u64), BackendError> {
        let st = crate::util::lock(&self.state);
        Ok(st.fenced.get(key).cloned().unwrap_or_default())
    }

    async fn extend_many(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
        Ok(leases
            .iter()
            .map(|(key, token, ttl)| self.extend(key, token, *ttl))
            .collect())
    }

    async fn try_permit(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        permits: u32,
    ) -> Result<Try, BackendError> {
        Ok(self.take_permit(key, token, ttl, permits))
    }

    async fn release_permit(&self, key: &str, token: &str) -> Result<Released, BackendError> {
        Ok(if self.permit_held(key, token, true, Duration::ZERO) {
            Released::Now
        } else {
            Released::NotOurs
        })
    }

    async fn extend_permits(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
        Ok(leases
            .iter()
            .map(|(key, token, ttl)| self.permit_held(key, token, false, *ttl))
            .collect())
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
