//! Looking at a lock from the outside, and releasing a stuck one: what an on-call
//! engineer needs to see who holds a key, for how long, and who waits.

use std::time::Duration;

use super::*;

/// Who holds a lock, as its token tells: `<uuid>:<host>:<pid>` (the holder id is
/// `host:pid` unless the client set another with `LocksBuilder::holder_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The whole token, as stored.
    pub token: String,
    /// The acquisition's UUID.
    pub uuid: String,
    /// The holder id after the UUID (`host:pid` by default).
    pub id: String,
    /// The host, when the id is `host:pid`.
    pub host: Option<String>,
    /// The process id, when the id is `host:pid`.
    pub pid: Option<u32>,
}

impl Holder {
    /// Reads a token; `None` for a value that is not one (not a UUID, then `:` and a
    /// holder id, without whitespace): application data under the prefix is not a lock.
    pub fn from_token(token: &str) -> Option<Holder> {
        let (uuid, id) = token.split_once(':')?;
        if uuid::Uuid::try_parse(uuid).is_err()
            || id.is_empty()
            || token.contains(char::is_whitespace)
        {
            return None;
        }
        let (host, pid) = match id.rsplit_once(':') {
            Some((host, pid)) => match pid.parse::<u32>() {
                Ok(pid) => (Some(host.to_owned()), Some(pid)),
                Err(_) => (None, None),
            },
            None => (None, None),
        };
        Some(Holder {
            token: token.to_owned(),
            uuid: uuid.to_owned(),
            id: id.to_owned(),
            host,
            pid,
        })
    }
}

/// One holder of a semaphore's permit or a read lock's share, and its lease left.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Share {
    /// Who holds it.
    pub holder: Holder,
    /// Its lease left, by the server's clock.
    pub lease_left: Duration,
}

/// What holds a lock, a semaphore or a read/write lock, seen in one atomic look
/// ([`Locks::inspect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The full Redis key.
    pub key: String,
    /// What holds it: [`Kind::Lock`](crate::key::Kind::Lock),
    /// [`WriteLock`](crate::key::Kind::WriteLock) (told by its holder's token, see
    /// "What each primitive writes" in the crate docs),
    /// [`ReadLock`](crate::key::Kind::ReadLock) or
    /// [`Semaphore`](crate::key::Kind::Semaphore); `Lock` when nothing holds it.
    pub kind: crate::key::Kind,
    /// The holder of a lock, or the writer of a read/write lock.
    pub holder: Option<Holder>,
    /// The clients a release left the lock to for a yield window (their ids), while
    /// that window lasts.
    pub yielded_to: Vec<String>,
    /// The key's lease left (the lock's; for a semaphore, its last permit's; for a read
    /// lock, its longest reader's).
    pub lease_left: Option<Duration>,
    /// The last fence given for the key (0 before any, and once its counter expired after
    /// the fence idle window).
    pub last_fence: u64,
    /// A waiter marked the holder's value: its release will wake the waiters.
    pub marked_waiting: bool,
    /// Clients listening on the key's wake-up channel (in memory: waiting tasks).
    pub listening: u64,
    /// A semaphore's holders.
    pub permits: Vec<Share>,
    /// A semaphore's limit (how many permits it gives): the count of the latest acquire
    /// that took a permit (clients that count differently overwrite each other's).
    pub permit_limit: Option<u32>,
    /// A read/write lock's readers.
    pub readers: Vec<Share>,
    /// A writer waiting for the readers to leave (new readers queue behind it).
    pub writer_waiting: Option<Holder>,
}

impl LockState {
    /// Whether anything holds the key: a holder, a permit or a reader.
    pub fn is_held(&self) -> bool {
        self.holder.is_some() || !self.permits.is_empty() || !self.readers.is_empty()
    }
}

/// A walk over the keys that match some globs, on every node a `SCAN` must visit (every
/// primary of a cluster), one `SCAN` step at a time.
pub(crate) struct KeyWalk {
    globs: Vec<String>,
    /// The nodes (read at the first step), the one being walked, which glob, its cursor.
    nodes: Option<Vec<crate::backend::ScanNode>>,
    node: usize,
    glob: usize,
    cursor: u64,
}

impl KeyWalk {
    pub(crate) fn new(globs: Vec<String>) -> KeyWalk {
        KeyWalk {
            globs,
            nodes: None,
            node: 0,
            glob: 0,
            cursor: 0,
        }
    }

    /// The keys of the next step (a key may come twice in one walk); `None` once every
    /// node was walked with every glob.
    async fn step(&mut self, backend: &crate::backend::Backend) -> Option<Result<Vec<String>>> {
        let failed = |e| Error::backend(&self.globs.join(" "), e);
        if self.nodes.is_none() {
            match backend.scan_nodes().await {
                Ok(nodes) => self.nodes = Some(nodes),
                Err(e) => return Some(Err(failed(e))),
            }
        }
        let node = self.nodes.as_deref()?.get(self.node)?;
        let step = backend
            .scan(node, self.cursor, &self.globs[self.glob])
            .await;
        let (cursor, keys) = match step {
            Ok(step) => step,
            Err(e) => return Some(Err(failed(e))),
        };
        self.cursor = cursor;
        if cursor == 0 {
            self.glob += 1;
            if self.glob == self.globs.len() {
                self.glob = 0;
                self.node += 1;
            }
        }
        Some(Ok(keys))
    }

    /// The walk as a stream: each key found that `keep` maps to one of its own, looked at
    /// by `look`, which may skip it (`Ok(None)`); none comes twice. An error ends it. Only
    /// the keys that came are remembered (a key `SCAN` gives again is looked at again
    /// unless it came), so that a walk over many keys that mostly do not come (`distlock
    /// leaks` over completed records) holds no set of every key.
    pub(crate) fn looked<'a, T, K, L, F>(
        self,
        locks: &'a Locks,
        keep: K,
        look: L,
    ) -> impl futures_util::Stream<Item = Result<T>> + Send + 'a
    where
        T: Send + 'a,
        K: Fn(&str) -> Option<String> + Send + 'a,
        L: Fn(String) -> F + Send + 'a,
        F: Future<Output = Result<Option<T>>> + Send + 'a,
    {
        struct State<K, L> {
            walk: KeyWalk,
            keep: K,
            look: L,
            pending: std::collections::VecDeque<String>,
            seen: std::collections::HashSet<String>,
            done: bool,
        }
        let state = State {
            walk: self,
            keep,
            look,
            pending: Default::default(),
            seen: Default::default(),
            done: false,
        };
        futures_util::stream::unfold(state, move |mut st| async move {
            if st.done {
                return None;
            }
            loop {
                while let Some(key) = st.pending.pop_front() {
                    if st.seen.contains(&key) {
                        continue;
                    }
                    match (st.look)(key.clone()).await {
                        Ok(Some(found)) => {
                            st.seen.insert(key);
                            return Some((Ok(found), st));
                        }
                        Ok(None) => {}
                        Err(e) => {
                            st.done = true;
                            return Some((Err(e), st));
                        }
                    }
                }
                match st.walk.step(&locks.inner.backend).await? {
                    Ok(keys) => {
                        // One step's keys, each once (a lock and its companions map to
                        // one key).
                        let mut step = std::collections::HashSet::new();
                        for found in keys {
                            if let Some(key) = (st.keep)(&found)
                                && !st.seen.contains(&key)
                                && step.insert(key.clone())
                            {
                                st.pending.push_back(key);
                            }
                        }
                    }
                    Err(e) => {
                        st.done = true;
                        return Some((Err(e), st));
                    }
                }
            }
        })
    }
}

impl Locks {
    /// Every lock whose name matches `pattern` (a glob as `SCAN MATCH` reads it: `*`,
    /// `?`, `[abc]`; `*` for all) that something holds, as [`inspect`](Self::inspect)
    /// sees each: a stream that walks the keys with `SCAN` (every primary of a cluster)
    /// and looks at each lock it finds, one at a time, so that a walk over millions of
    /// keys holds a few of them at once. Locks, semaphores and read/write locks (a lock
    /// held by readers alone too); not idempotency records (`<prefix>idem:`), nor fences
    /// and marks left by locks nobody holds. A lock taken or released during the walk
    /// may or may not come; none comes twice. An error ends the stream. A hash-tagged
    /// name that itself ends as a lock's companion key does (`{job}:done`) is read as
    /// that companion. Not over Redlock.
    ///
    /// ```
    /// use futures_util::TryStreamExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let a = locks.lock("order:1").acquire().await.unwrap();
    /// let b = locks.semaphore("gpu:pool", 4).acquire().await.unwrap();
    /// let held: Vec<_> = locks.list("order:*").try_collect().await.unwrap();
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].holder.as_ref().unwrap().token, a.token());
    /// assert_eq!(locks.list("*").try_collect::<Vec<_>>().await.unwrap().len(), 2);
    /// # a.release().await.unwrap(); b.release().await.unwrap();
    /// # }
    /// ```
    pub fn list(
        &self,
        pattern: &str,
    ) -> impl futures_util::Stream<Item = Result<LockState>> + Send + '_ {
        let full = format!("{}{pattern}", self.inner.prefix);
        // The keys, the readers' sets of untagged keys (`{<key>}:readers`), and those of
        // hash-tagged keys (`<key>{:readers}`), for a lock held by readers alone.
        let [untagged, tagged] = crate::key::companion_globs(&full, ":readers");
        let globs = vec![full.clone(), untagged, tagged];
        let records = format!("{}{}", self.inner.prefix, crate::key::RECORDS);
        let keep = move |found: &str| {
            let key = crate::key::companion_of(found);
            let ours = key.starts_with(&*self.inner.prefix)
                && !key.starts_with(&records)
                && crate::util::glob_match(full.as_bytes(), key.as_bytes());
            ours.then(|| key.to_owned())
        };
        let look = move |key: String| async move {
            match self.inspect(&key[self.inner.prefix.len()..]).await {
                Ok(state) if state.is_held() || state.writer_waiting.is_some() => Ok(Some(state)),
                // Not held, or a stray key under the prefix that no lock could have.
                Ok(_) | Err(Error::InvalidKey { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        };
        KeyWalk::new(globs).looked(self, keep, look)
    }

    /// The fence counters of the locks whose name matches `pattern` (as [`list`]
    /// (Self::list) reads it) that have no ttl: left by a version of distlock whose
    /// counters lived for ever (they expire after the fence idle window now, see
    /// [`LocksBuilder::fence_idle_window`](crate::LocksBuilder::fence_idle_window)); a
    /// name's next fence gives its counter a ttl. Their full keys, as a stream that walks
    /// the keys with `SCAN` and looks at each counter it finds, one at a time, and
    /// remembers none (there may be one per name ever fenced): a counter `SCAN` gives
    /// twice (the keyspace rehashed during the walk) may come twice. An error ends the
    /// stream. Not over Redlock.
    ///
    /// ```
    /// use futures_util::TryStreamExt;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let g = locks.lock("order:1").acquire().await.unwrap();
    /// g.fence().await.unwrap();
    /// // A counter written now expires once its name has been idle for the window.
    /// let lasting: Vec<String> = locks.lasting_fence_counters("*").try_collect().await.unwrap();
    /// assert!(lasting.is_empty());
    /// # g.release().await.unwrap();
    /// # }
    /// ```
    pub fn lasting_fence_counters(
        &self,
        pattern: &str,
    ) -> impl futures_util::Stream<Item = Result<String>> + Send + '_ {
        let full = format!("{}{pattern}", self.inner.prefix);
        let globs = crate::key::companion_globs(&full, ":fence").to_vec();
        let records = format!("{}{}", self.inner.prefix, crate::key::RECORDS);
        let keep = move |found: &str| {
            let key = crate::key::companion_of(found);
            let counter = key != found
                && crate::key::companion(key, ":fence") == found
                && key.starts_with(&*self.inner.prefix)
                && !key.starts_with(&records)
                && crate::util::glob_match(full.as_bytes(), key.as_bytes());
            counter.then(|| found.to_owned())
        };
        let look = move |counter: String| async move {
            use crate::backend::idem::Records as _;
            match self.inner.backend.idem_peek(&counter, 0).await {
                Ok(peeked) => {
                    Ok((peeked.head.is_some() && peeked.ttl.is_none()).then_some(counter))
                }
                // Not a string: no counter distlock wrote.
                Err(e) if e.is_wrong_type() => Ok(None),
                Err(e) => Err(Error::backend(&counter, e)),
            }
        };
        // The walk, the keys of its last step not yet looked at, whether it ended (an
        // error), and the two steps.
        let state = (
            KeyWalk::new(globs),
            std::collections::VecDeque::<String>::new(),
            false,
            keep,
            look,
        );
        futures_util::stream::unfold(
            state,
            move |(mut walk, mut found, ended, keep, look)| async move {
                if ended {
                    return None;
                }
                loop {
                    while let Some(key) = found.pop_front() {
                        let Some(counter) = keep(&key) else { continue };
                        match look(counter).await {
                            Ok(Some(counter)) => {
                                return Some((Ok(counter), (walk, found, false, keep, look)));
                            }
                            Ok(None) => {}
                            Err(e) => return Some((Err(e), (walk, found, true, keep, look))),
                        }
                    }
                    match walk.step(&self.inner.backend).await {
                        None => return None,
                        Some(Ok(keys)) => found.extend(keys),
                        Some(Err(e)) => return Some((Err(e), (walk, found, true, keep, look))),
                    }
                }
            },
        )
    }

    /// What holds the lock named `name` (a lock, a semaphore or a read/write lock), in
    /// one atomic, read-only look: its holder (the token's UUID, host and pid), the
    /// lease left, the last fence, whether waiters listen, a yield marker, a semaphore's
    /// permits and a read/write lock's readers with their leases, a waiting writer.
    /// One round trip (a script, on the key's node of a cluster); not over Redlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let guard = locks.lock("order:42").acquire().await.unwrap();
    /// let state = locks.inspect("order:42").await.unwrap();
    /// assert_eq!(state.kind, lockcore::key::Kind::Lock);
    /// assert_eq!(state.holder.unwrap().token, guard.token());
    /// assert!(state.lease_left.unwrap() > std::time::Duration::from_secs(29));
    /// # guard.release().await.unwrap();
    /// let permit = locks.semaphore("gpu:pool", 4).acquire().await.unwrap();
    /// let state = locks.inspect("gpu:pool").await.unwrap();
    /// assert_eq!((state.kind, state.permits.len(), state.permit_limit), (lockcore::key::Kind::Semaphore, 1, Some(4)));
    /// # permit.release().await.unwrap();
    /// let writer = locks.write_lock("doc:7").acquire().await.unwrap();
    /// assert_eq!(locks.inspect("doc:7").await.unwrap().kind, lockcore::key::Kind::WriteLock);
    /// # writer.release().await.unwrap();
    /// # }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<LockState> {
        let key = self.lock(name).full_key()?;
        let seen = self
            .inner
            .backend
            .inspect(&key)
            .await
            .map_err(|e| Error::backend(&key, e))?;
        let value = seen.value.unwrap_or_default();
        let (yielded_to, holder, marked) = match value.strip_prefix("yield: ") {
            Some(ids) => (
                ids.split_whitespace().map(str::to_owned).collect(),
                None,
                false,
            ),
            None => {
                let (token, marked) = match value.strip_suffix(" waiting") {
                    Some(token) => (token, true),
                    None => (value.as_str(), false),
                };
                // Kept for `min_hold` after its holder's release (keep.lua).
                let token = token.strip_suffix(" kept").unwrap_or(token);
                (Vec::new(), Holder::from_token(token), marked)
            }
        };
        let shares = |all: Vec<(String, Duration)>| {
            all.into_iter()
                .filter_map(|(token, lease_left)| {
                    Some(Share {
                        holder: Holder::from_token(&token)?,
                        lease_left,
                    })
                })
                .collect()
        };
        let permits: Vec<Share> = shares(seen.permits);
        let readers: Vec<Share> = shares(seen.readers);
        let kind = if !permits.is_empty() {
            crate::key::Kind::Semaphore
        } else if !readers.is_empty() || value == crate::key::READERS_MARK {
            crate::key::Kind::ReadLock
        } else if holder
            .as_ref()
            .is_some_and(|h| crate::key::is_write_token(&h.token))
        {
            crate::key::Kind::WriteLock
        } else {
            crate::key::Kind::Lock
        };
        Ok(LockState {
            key: key.to_string(),
            kind,
            holder,
            yielded_to,
            // A read lock's `readers` at the key ends with the longest share; where it is
            // missing (in memory, a reader of an older version), that share's lease.
            lease_left: seen
                .left
                .or_else(|| readers.iter().map(|s| s.lease_left).max()),
            last_fence: seen.fence.unwrap_or(0),
            marked_waiting: marked,
            listening: seen.listening,
            permits,
            permit_limit: seen.limit,
            readers,
            writer_waiting: seen.writer_waiting.as_deref().and_then(Holder::from_token),
        })
    }

    /// Releases whatever holds the lock named `name` (a lock's holder, a semaphore's
    /// permits, a read/write lock's readers and writer marks) and wakes its waiters:
    /// `true` when something held it. The holders are not told at once: each finds its
    /// lock gone at its release or next renewal and gets [`Error::Lost`], as for any
    /// lock lost while held. Other clients' waiters are woken at once; the stuck
    /// holder's own client's waiters queue behind it until its lease ends (by that
    /// client's clock) or a renewal finds it lost. An operator's last resort for a
    /// holder that is stuck (its process hung with a long ttl, or renewing without end);
    /// not over Redlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let stuck = locks.lock("report").acquire().await.unwrap();
    /// assert!(locks.force_release("report").await.unwrap());
    /// assert!(!locks.inspect("report").await.unwrap().is_held());
    /// // Other instances can take it now; the stuck holder is told when it releases.
    /// assert!(matches!(stuck.release().await, Err(lockcore::Error::Lost { .. })));
    /// # }
    /// ```
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let key = self.lock(name).full_key()?;
        let released = self.inner.backend.force_release(&key).await;
        let released = released.map_err(|e| Error::backend(&key, e))?;
        if released {
            tracing::warn!(target: "distlock", key = &*key, "lock released by force: its holders will find it lost");
        }
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use super::Holder;

    #[test]
    fn tokens_name_their_holder() {
        const UUID: &str = "0b5c6a8e-3f4d-4c2a-9d61-7e1f2a3b4c5d";
        let h = Holder::from_token(&format!("{UUID}:web-1:4242")).unwrap();
        assert_eq!((h.uuid.as_str(), h.id.as_str()), (UUID, "web-1:4242"));
        assert_eq!((h.host.as_deref(), h.pid), (Some("web-1"), Some(4242)));
        let custom = Holder::from_token(&format!("{UUID}:billing")).unwrap();
        assert_eq!((custom.host, custom.pid), (None, None));
        assert!(Holder::from_token("no-colon").is_none());
        assert!(Holder::from_token(":x").is_none());
        assert!(
            Holder::from_token("web-1:4242 web-2:77").is_none(),
            "a turns list"
        );
        // Application data under the prefix is no holder.
        assert!(Holder::from_token("eu:west-1").is_none());
        assert!(Holder::from_token("6f1c:web-1:4242").is_none());
        assert!(Holder::from_token("readers").is_none());
    }
}
