//! Several locks taken together: every key or none, deadlock-free whatever order the
//! caller names them in.
//!
//! Two ways, chosen per call. Where every key is on one server (one Redis, Sentinel's
//! primary, the in-memory backend, or one slot of a cluster), the first try is one
//! script (`multi_acquire.lua`) that takes all of them if all are free, and none
//! otherwise: one round trip, no partial hold. Where they are not (a cluster's keys in
//! several slots, Redlock), or when that try finds one held, the keys are taken one by
//! one in a canonical order (sorted by the full key), each waiting as a lock does, all
//! within the one `wait`: two callers never hold one key each while waiting for the
//! other's, since both take the smaller first. A key that cannot be had by the deadline
//! gives back the ones taken. A task that holds some of the keys already (not all) is
//! refused: it would wait for the others while holding those.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::*;

impl Locks {
    /// Starts a request for the locks named `names`, all taken together (Redisson's
    /// `RedissonMultiLock`): every one or none, whatever the order they are named in.
    /// The same settings as [`lock`](Self::lock) apply to each; the guard renews,
    /// reports loss and releases them all. A name given twice is taken once.
    ///
    /// Where the keys live on one server (or one slot of a cluster: give them a common
    /// hash tag, `{acct}:7`), the first try is one script that takes all of them or
    /// none; otherwise, and once a key is found held, they are taken one by one in the
    /// order of their full keys, each waiting as a lock does, all within one `wait`, and
    /// a key that cannot be had gives back those taken. Works over Redlock too (the
    /// ordered way, each key on a quorum).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let both = locks.multi_lock(["account:7", "account:3"]).acquire().await.unwrap();
    /// assert_eq!(both.keys(), ["lock:account:3", "lock:account:7"]); // sorted
    /// let one = locks.lock("account:3").acquire().await;
    /// assert!(matches!(one, Err(lockcore::Error::Busy { .. })));
    /// both.release().await.unwrap();
    /// # }
    /// ```
    pub fn multi_lock<I, S>(&self, names: I) -> MultiLockRequest<'_>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MultiLockRequest {
            template: LockRequest::new(self, String::new()),
            names: names.into_iter().map(Into::into).collect(),
        }
    }
}

/// A request for several locks at once, made by [`Locks::multi_lock`].
#[must_use = "a lock request does nothing until `.acquire().await`"]
#[derive(Debug)]
pub struct MultiLockRequest<'a> {
    /// The settings every key's request gets.
    template: LockRequest<'a>,
    names: Vec<String>,
}

impl<'a> MultiLockRequest<'a> {
    /// A multi-lock of `names` with `template`'s settings (its name is not used).
    pub(crate) fn like(template: LockRequest<'a>, names: Vec<String>) -> Self {
        MultiLockRequest { template, names }
    }

    /// The lease of each lock (default 30 s); see [`LockRequest::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.template.ttl = ttl;
        self
    }

    /// How long to keep trying, for all the keys together (default zero); see
    /// [`LockRequest::wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.template.wait = wait;
        self
    }

    /// Keep every lease while held; see [`LockRequest::renew`].
    pub fn renew(mut self, renew: bool) -> Self {
        self.template.renew = renew;
        self
    }

    /// With `renew`: stop renewing this long after acquisition; see
    /// [`LockRequest::max_hold`].
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.template.max_hold = Some(max_hold);
        self
    }

    /// Keep every lock at least this long; see [`LockRequest::min_hold`].
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.template.min_hold = Some(min_hold);
        self
    }

    /// Replicas that must acknowledge each lock; see [`LockRequest::replicas`].
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.template.replicas = Some(replicas);
        self
    }

    /// The request for one key, with these settings and `wait` until `deadline`.
    fn one(&self, name: &str, deadline: Instant) -> LockRequest<'a> {
        let t = &self.template;
        LockRequest {
            locks: t.locks,
            name: name.to_owned(),
            ttl: t.ttl,
            wait: deadline.saturating_duration_since(Instant::now()),
            renew: t.renew,
            max_hold: t.max_hold,
            min_hold: t.min_hold,
            replicas: t.replicas,
            shape: Shape::Exclusive,
            template: t.template,
        }
    }

    /// Takes every lock, or none: [`Error::Busy`] when one is still held at the
    /// deadline (those taken are given back), [`Error::Backend`] when Redis fails,
    /// [`Error::InvalidKey`] for a bad name (nothing sent), [`Error::Unsupported`] for
    /// no name at all.
    pub async fn acquire(self) -> Result<MultiLockGuard> {
        let started = Instant::now();
        let deadline = started + self.template.wait;
        // Sorted by the full key (the prefix is common), duplicates once.
        let mut names = self.names.clone();
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(Error::Unsupported {
                key: self.template.locks.inner.prefix.clone(),
                reason: "a multi-lock needs at least one name".to_owned(),
            });
        }
        let mut keys = Vec::with_capacity(names.len());
        for name in &names {
            keys.push(self.one(name, deadline).full_key()?);
        }
        // A task holding some of the keys (not all: those re-enter) would wait for the
        // others while holding them, which the order cannot make safe.
        let inner = &self.template.locks.inner;
        let client = Arc::as_ptr(inner) as usize;
        let held = keys
            .iter()
            .filter(|k| held_in_task(k, client).is_some())
            .count();
        if held > 0 && held < keys.len() {
            return Err(Error::Unsupported {
                key: keys.join(", "),
                reason: "this task holds some of these locks: taking the others while \
                         holding them could deadlock; take them all together, or release \
                         those first"
                    .to_owned(),
            });
        }
        // Held already (all of them), they are re-entered one by one.
        if held == 0
            && let Some(guards) = self.all_at_once(&names, &keys, deadline).await?
        {
            return Ok(MultiLockGuard {
                guards,
                at_once: true,
            });
        }
        let mut guards: Vec<LockGuard> = Vec::with_capacity(names.len());
        for name in &names {
            match self.one(name, deadline).acquire().await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    // Given back, all of them at once; what their releases find changes
                    // nothing for the caller.
                    join_all(guards.into_iter().map(LockGuard::release)).await;
                    return Err(match e {
                        Error::Busy { key, .. } => Error::Busy {
                            key,
                            waited: started.elapsed(),
                        },
                        e => e,
                    });
                }
            }
        }
        Ok(MultiLockGuard {
            guards,
            at_once: false,
        })
    }

    /// The one-script try, for keys none of which this task holds, where the backend
    /// can run it over them: the guards when it took them all, `None` when one was held
    /// (or it cannot run): the ordered way follows.
    async fn all_at_once(
        &self,
        names: &[String],
        keys: &[Arc<str>],
        deadline: Instant,
    ) -> Result<Option<Vec<LockGuard>>> {
        let locks = self.template.locks;
        let inner = &locks.inner;
        let keys_str: Vec<&str> = keys.iter().map(|k| &**k).collect();
        if keys.len() < 2 || !inner.backend.one_call(&keys_str) {
            return Ok(None);
        }
        let tokens: Vec<Arc<str>> = names.iter().map(|_| self.template.new_token()).collect();
        let tokens_str: Vec<&str> = tokens.iter().map(|t| &**t).collect();
        let (ttl, sent, epoch) = (self.template.ttl, Instant::now(), inner.backend.epoch());
        let cleanup = || {
            for (key, token) in keys.iter().zip(&tokens) {
                let held = (key.clone(), token.clone(), Shape::Exclusive);
                spawn_cleanup(locks.clone(), held);
            }
        };
        let tried = in_flight(inner.backend.try_all(&keys_str, &tokens_str, ttl), cleanup).await;
        match tried {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            // A cluster slot migrating with the keys split between its nodes: the
            // ordered way sends each key where it is.
            Err(source) if source.is_split() => return Ok(None),
            Err(source) => {
                if source.is_transient() {
                    cleanup();
                }
                return Err(Error::backend(&keys[0], source));
            }
        }
        let replicas = self.template.replicas.unwrap_or(inner.replicas);
        let mut guards = Vec::with_capacity(keys.len());
        for ((name, key), token) in names.iter().zip(keys).zip(tokens) {
            let taking = Taking::Sent {
                epoch,
                waited: false,
            };
            let request = self.one(name, deadline);
            let guard = request.taken(key.clone(), token, sent, 0, None, sent, taking);
            guards.push(guard);
        }
        if replicas > 0 {
            let mut confirmed = Vec::with_capacity(guards.len());
            for guard in guards {
                match guard.confirm_replicated(ttl, replicas).await {
                    Ok(guard) => confirmed.push(guard),
                    Err(e) => {
                        join_all(confirmed.into_iter().map(LockGuard::release)).await;
                        return Err(e);
                    }
                }
            }
            guards = confirmed;
        }
        Ok(Some(guards))
    }
}

/// Several locks held together; release them with
/// [`release`](MultiLockGuard::release) (dropping it releases each at once).
#[must_use = "dropping the guard releases the locks at once"]
#[derive(Debug)]
pub struct MultiLockGuard {
    /// In the order of their keys.
    guards: Vec<LockGuard>,
    at_once: bool,
}

impl MultiLockGuard {
    /// The full keys, sorted.
    pub fn keys(&self) -> Vec<&str> {
        self.guards.iter().map(LockGuard::key).collect()
    }

    /// Each lock's guard, in the order of their keys (for a key's fence:
    /// `guard.guards()[0].fence()`).
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether the one script took every key (`false`: one by one, in order).
    pub fn taken_at_once(&self) -> bool {
        self.at_once
    }

    /// Whether every lock is still believed held (see [`LockInfo::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(|g| g.info().is_held())
    }

    /// Resolves when any of the locks is known to be lost: the set is lost then.
    pub async fn lost(&self) {
        let lost = self.guards.iter().map(|g| Box::pin(g.lost()));
        futures_util::future::select_all(lost).await;
    }

    /// Runs `fut` with every lock visible through [`current_lock`] (the last key's) and
    /// re-entrant for acquisitions of any of the keys in this task.
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        let mut held: Vec<LockInfo> = CURRENT.try_with(|held| held.to_vec()).unwrap_or_default();
        held.extend(self.guards.iter().map(|g| g.info().clone()));
        CURRENT.scope(held.into(), fut).await
    }

    /// Releases every lock, all at once. The set was held to the end only if every key
    /// was: the first key found lost makes it [`Error::Lost`] (every other key is
    /// released all the same); else the first other error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let both = locks.multi_lock(["a", "b"]).acquire().await.unwrap();
    /// both.release().await.unwrap();
    /// # }
    /// ```
    pub async fn release(self) -> Result<()> {
        let outcomes = join_all(self.guards.into_iter().map(LockGuard::release)).await;
        let lost = outcomes
            .iter()
            .find(|o| matches!(o, Err(Error::Lost { .. })));
        match lost {
            Some(lost) => lost.clone(),
            None => outcomes.into_iter().find(Result::is_err).unwrap_or(Ok(())),
        }
    }
}
