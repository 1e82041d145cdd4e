//! The per-runtime multiplexed connection cache: one connection per client and tokio
//! runtime (a connection's driver task dies with its runtime), made in a task of its own
//! so a cancelled call never leaves a half-made connection, reconnected when it breaks;
//! and the connection epoch that tells a release retry whether the server may have lost
//! keys since its first try.

use super::*;

/// How many runtimes' connections one client keeps (see `policy::MAX_RUNTIMES`). The
/// connection of a runtime that shut down is found closed and dropped before this
/// matters, where distlock made its socket.
pub(super) use super::policy::MAX_RUNTIMES;

/// How long an idle direct connection of another runtime must have been unused before a
/// runtime that needs one closes it to make room: such a connection most likely belongs
/// to a runtime that shut down; one a live runtime uses now and then stays.
pub(super) const RECLAIM_IDLE: Duration = Duration::from_secs(2);

/// A connection being made for one runtime, in a task of its own (see
/// [`RedisBackend::connect`]).
pub(super) struct Pending {
    pub(super) runtime: tokio::runtime::Id,
    /// Behind Sentinel: the count of new primaries announced when it began.
    pub(super) switched: u64,
    pub(super) id: u64,
    pub(super) outcome: Outcome,
    /// Set by the task when the attempt failed (it counted the failure in `epoch`
    /// itself): such an attempt is not handed to a later call.
    pub(super) failed: Arc<AtomicBool>,
    pub(super) abort: tokio::task::AbortHandle,
}

/// What a connection attempt gave: the connection, what the server said of itself, and
/// the flag its socket sets when it closes (where distlock made the socket).
pub(super) type Made = Result<
    (
        Conn,
        Option<(Native, Option<String>)>,
        Option<Arc<AtomicBool>>,
    ),
    BackendError,
>;

/// An attempt's result for every call awaiting it; `None`: the attempt was aborted (a
/// newer one replaced it, or its runtime shut down).
pub(super) type Outcome =
    futures_util::future::Shared<futures_util::future::BoxFuture<'static, Option<Made>>>;

/// A runtime's connection, or the attempt to make it.
pub(super) enum Attempting {
    Made((Conn, u64)),
    Under(u64, Outcome),
}

/// Numbers connection attempts.
pub(super) static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

pub(super) struct Slot {
    pub(super) runtime: tokio::runtime::Id,
    pub(super) conn: Conn,
    pub(super) generation: u64,
    /// Behind Sentinel: the count of new primaries announced when it was made.
    pub(super) switched: u64,
    /// Set when its socket closed (see `direct::Watched`); `None` where redis-rs made the
    /// socket (a cluster, or TLS that direct connections cannot speak).
    pub(super) closed: Option<Arc<AtomicBool>>,
    /// The check made after a call on it timed out, if one was (see
    /// [`RedisBackend::check_alive`]): failed, it is dead as a closed one; under way,
    /// calls wait for its verdict before they use it.
    pub(super) check: Option<Checking>,
}

/// A check under way on a multiplexed connection, to wait for.
pub(super) type Checking = tokio::sync::watch::Receiver<Check>;

/// Where the check of a multiplexed connection stands (see
/// [`RedisBackend::check_alive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    Under,
    /// In step, and its server answers.
    Passed,
    /// No answer in time, or another reply than the check's own (out of step): dead.
    Failed,
}

/// Whether Redis may evict this client's keys under `policy` (`maxmemory-policy`): every
/// policy but `noeviction` may, under memory pressure. `volatile-*` evicts lock keys and
/// records and fence counters (they have a ttl); `allkeys-*` any key.
pub(crate) fn may_evict_locks(policy: &str) -> bool {
    !policy.is_empty() && policy != "noeviction"
}

/// Reads `maxmemory-policy` and warns when Redis may evict keys: an evicted lock key lets
/// a second holder in (an evicted fence counter starts again above every earlier fence,
/// from the server's clock). Servers that refuse
/// `CONFIG GET` (managed Redis, ACLs) are skipped.
pub(super) async fn warn_if_evicting(mut conn: MultiplexedConnection, timeout: Duration) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let read = cmd.query_async::<Vec<String>>(&mut conn);
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(reply)) => {
            let policy = reply.get(1).map_or("", String::as_str);
            if may_evict_locks(policy) {
                tracing::warn!(
                    target: "distlock",
                    policy,
                    "redis maxmemory-policy {policy} may evict keys under memory pressure: an \
                     evicted lock key lets a second holder in; use `noeviction`"
                );
            } else {
                tracing::debug!(target: "distlock", policy, "redis evicts no keys");
            }
        }
        // Refused (an ACL without @dangerous, managed Redis): said once per client, since
        // nothing else would tell that the policy is unchecked.
        Ok(Err(e)) => tracing::warn!(
            target: "distlock",
            error = %e,
            "cannot read redis maxmemory-policy: make sure it is `noeviction` (an evicted \
             lock key lets a second holder in)"
        ),
        Err(_) => tracing::debug!(target: "distlock", "reading redis maxmemory-policy timed out"),
    }
}

/// Sets its flag when dropped.
pub(super) struct SetOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Makes a connection to `target` (the task of [`RedisBackend::attempt`]): every step
/// (the sentinels' answer, the TCP and TLS handshakes) within `timeout` in all, then the
/// command that reads what the server has within `command`.
/// Every call on it is bounded by `within_timeout`, which also drops the connection on a
/// timeout: a response timeout of its own would be a second timer per command.
pub(super) async fn make(
    target: Target,
    tls: DirectTls,
    timeout: Duration,
    command: Duration,
) -> Made {
    let until = tokio::time::Instant::now() + timeout;
    let client = match target {
        Target::Single(client) => client,
        Target::Sentinel(target) => target.primary(timeout).await?,
        // The nodes may run different versions: scripts only, no native commands.
        Target::Cluster(client, _) => {
            return match tokio::time::timeout_at(until, client.get_async_connection()).await {
                Ok(Ok(conn)) => Ok((Conn::Cluster(conn), None, None)),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(BackendError::timeout(timeout)),
            };
        }
    };
    // Bounded by `until` below, whichever way it is made.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    let info = client.get_connection_info();
    let connect = async {
        if !Direct::serves(info, &tls) {
            let conn = client.get_multiplexed_async_connection_with_config(&config);
            return Ok((conn.await?, None));
        }
        // The socket made here, watched: a close is seen before the next call.
        let stream = super::super::direct::Stream::connect(info, &tls, false).await?;
        let closed = Arc::new(AtomicBool::new(false));
        let watched = super::super::direct::Watched {
            stream,
            closed: closed.clone(),
        };
        let (conn, driver) =
            MultiplexedConnection::new_with_config(info.redis_settings(), watched, config.clone())
                .await?;
        // Set when the driver ends, or is dropped unpolled (its runtime shutting down).
        let ended = SetOnDrop(closed.clone());
        tokio::spawn(async move {
            let _ended = ended;
            driver.await;
        });
        Ok::<_, redis::RedisError>((conn, Some(closed)))
    };
    let (conn, closed) = match tokio::time::timeout_at(until, connect).await {
        Ok(made) => made?,
        Err(_) => return Err(BackendError::timeout(timeout)),
    };
    let server = detect_native(conn.clone(), command).await;
    Ok((Conn::Single(conn), server, closed))
}

/// Reads `INFO server` on a new connection to learn which conditional commands the
/// server has and its `run_id`; `None` when neither `INFO` nor `HELLO` answered in time
/// (a slow or loading server): what was known stays, as a look that failed says
/// nothing of the server's commands.
pub(super) async fn detect_native(
    mut conn: MultiplexedConnection,
    timeout: Duration,
) -> Option<(Native, Option<String>)> {
    // `HELLO` (no arguments) in the same round trip: where an ACL refuses `INFO` (the
    // least-privilege `-@dangerous`) or it is renamed, it still names the server and its
    // version, though not its `run_id`.
    let mut pipe = redis::pipe();
    pipe.cmd("INFO").arg("server").cmd("HELLO").ignore_errors();
    let asked = pipe.query_async::<Vec<redis::RedisResult<redis::Value>>>(&mut conn);
    let Ok(Ok(replies)) = tokio::time::timeout(timeout, asked).await else {
        return None;
    };
    let mut replies = replies.into_iter();
    let info = match replies.next() {
        Some(Ok(redis::Value::BulkString(b))) => String::from_utf8(b).ok(),
        Some(Ok(redis::Value::VerbatimString { text, .. })) => Some(text),
        _ => None,
    };
    match info {
        Some(info) => Some((
            Native::from_info(&info),
            super::super::native::run_id(&info).map(str::to_owned),
        )),
        None => match replies.next() {
            Some(Ok(hello)) => Some((Native::from_hello(&hello), None)),
            _ => None,
        },
    }
}

/// The runtime that drives every cluster connection of the process, on a thread of its
/// own: a cluster connection made once then serves every runtime of its client (the
/// renewal task's, a new actix-web worker's) and outlives each of them. Making one talks
/// to every node of the cluster, and a node that hangs (SIGSTOP, a stalled host) holds it
/// up: a runtime that needed a connection of its own could not get one meanwhile, and
/// the renewal task lost healthy locks at their first renewal. `None` when its thread
/// cannot start (each caller's runtime then drives its own, as on one server).
pub(super) fn cluster_runtime() -> Option<&'static Handle> {
    static RUNTIME: std::sync::OnceLock<Option<Handle>> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let started = std::thread::Builder::new()
                .name("distlock-cluster".into())
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => {
                            let _ = tx.send(Some(rt.handle().clone()));
                            rt.block_on(std::future::pending::<()>());
                        }
                        Err(e) => {
                            tracing::error!(target: "distlock", error = %e, "the cluster connections' runtime cannot start");
                            let _ = tx.send(None);
                        }
                    }
                });
            match started {
                Ok(_) => rx.recv().ok().flatten(),
                Err(e) => {
                    tracing::error!(target: "distlock", error = %e, "the cluster connections' thread cannot start");
                    None
                }
            }
        })
        .as_ref()
}

pub(super) fn current_runtime() -> Result<tokio::runtime::Id, BackendError> {
    Handle::try_current()
        .map(|h| h.id())
        .map_err(|_| BackendError::new(BackendErrorKind::Config, "called outside a tokio runtime"))
}

/// A multiplexed connection to one server, or a cluster connection.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisBackend {
    /// A connection broke or could not be made: the server may have restarted.
    pub(super) fn broke(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// A new connection reached the server with `run_id`: another one than before means
    /// a restart or a failover.
    ///
    /// A new connection to a server whose `run_id` cannot be read (an ACL without `INFO`,
    /// the usual least-privilege user; `INFO` renamed) may reach a server that restarted
    /// unseen: it counts as such a sign, so a release retry never trusts its lease across
    /// it (see `lock/guard.rs`, `release_raw`).
    pub(super) fn observe(&self, run_id: Option<&str>) {
        let Some(id) = run_id else {
            self.unknown_server();
            return;
        };
        let mut known = crate::util::lock(&self.run_id);
        if known.as_deref() != Some(id) {
            if known.is_some() {
                tracing::debug!(target: "distlock", run_id = id, "redis answers with another run_id: restarted or failed over");
                self.broke();
            }
            *known = Some(id.to_owned());
        }
    }

    /// A new connection reached a server whose `run_id` it could not read: counted as a
    /// possible restart (see [`Self::observe`]), with a warning once per client.
    pub(super) fn unknown_server(&self) {
        self.broke();
        if !self.run_id_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "distlock",
                "redis refused `INFO server` (an ACL without @dangerous?): a restart cannot be \
                 told from the run_id, so every new connection counts as one; a release whose \
                 reply was lost then reports an unknown outcome (`Backend`) rather than trust \
                 that its first try released the lock"
            );
        }
    }

    /// The connection of `runtime`, and the check under way on it if any (see
    /// [`Self::check_alive`]).
    pub(super) fn cached(
        &self,
        runtime: tokio::runtime::Id,
    ) -> Option<((Conn, u64), Option<Checking>)> {
        if let Target::Sentinel(target) = &self.target {
            // Its listener ends with the runtime it ran on: another one takes over.
            target.listen();
        }
        let switched = self.switched();
        let mut slots = crate::util::lock(&self.slots);
        let closed = |s: &Slot| {
            s.check
                .as_ref()
                .is_some_and(|c| *c.borrow() == Check::Failed)
                || s.closed.as_ref().is_some_and(|c| c.load(Ordering::Acquire))
        };
        if slots.iter().any(|s| s.switched != switched || closed(s)) {
            // The sentinels announced a new primary, or a connection's socket closed
            // (the server or the network closed it), or it answered no `PING` after a
            // call's timeout: connect again.
            slots.retain(|s| s.switched == switched && !closed(s));
            self.broke();
        }
        slots.iter().find(|s| s.runtime == runtime).map(|s| {
            let under = s.check.as_ref().filter(|c| *c.borrow() == Check::Under);
            ((s.conn.clone(), s.generation), under.cloned())
        })
    }

    /// Behind Sentinel, the count of new primaries announced; else 0.
    pub(super) fn switched(&self) -> u64 {
        match &self.target {
            Target::Sentinel(target) => target.switched(),
            _ => 0,
        }
    }

    pub(super) async fn connection(&self) -> Result<(Conn, u64), BackendError> {
        current_runtime()?;
        let runtime = self.connection_runtime()?.id();
        if let Some((found, check)) = self.cached(runtime) {
            let Some(mut check) = check else {
                return Ok(found);
            };
            // A call on it timed out, and it is being checked: its verdict first (within
            // the caller's timeout), so no call is sent on a connection out of step.
            let verdict = check.wait_for(|c| *c != Check::Under).await.map(|c| *c);
            if matches!(verdict, Ok(Check::Passed)) {
                return Ok(found);
            }
            self.forget(found.1);
            self.broke();
        }
        self.connect(runtime).await
    }

    /// The runtime whose tasks drive the connection that calls from this one use: the
    /// caller's own, or on a cluster the runtime of the client library's own thread (see
    /// [`cluster_runtime`]).
    pub(super) fn connection_runtime(&self) -> Result<Handle, BackendError> {
        if self.sharded
            && let Some(shared) = cluster_runtime()
        {
            return Ok(shared.clone());
        }
        Handle::try_current().map_err(|_| {
            BackendError::new(BackendErrorKind::Config, "called outside a tokio runtime")
        })
    }

    /// A new connection for `runtime`, unless another call made one.
    ///
    /// It is made in a task of its own, one per runtime at a time, that every call
    /// needing it awaits: a call that gives up (its timeout, or its caller cancelled it)
    /// leaves the attempt running for the next one. So a connection that takes longer
    /// than one command timeout to make (a TLS handshake, then the sentinels' answer and
    /// another handshake, on a loaded machine) is still made, instead of being started
    /// again and given up at every call. The attempt is bounded by its own steps'
    /// timeouts.
    pub(super) async fn connect(
        &self,
        runtime: tokio::runtime::Id,
    ) -> Result<(Conn, u64), BackendError> {
        // A few turns at most: each waits for an attempt, except where one ended at once
        // (its runtime shutting down cancels every task it spawns), which must not spin.
        for _ in 0..4 {
            let (id, outcome) = match self.attempt(runtime)? {
                Attempting::Made(found) => return Ok(found),
                Attempting::Under(id, outcome) => (id, outcome),
            };
            let made = outcome.await;
            // The first call back takes the result: installs the connection. Under
            // `pending`'s lock, so that no call starts another attempt in between.
            let mut pending = crate::util::lock(&self.pending);
            let Some(at) = pending.iter().position(|p| p.id == id) else {
                match made {
                    // Aborted because a newer attempt (for the primary the sentinels
                    // name now) replaced it, or installed by another call: on to that.
                    None | Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e),
                }
            };
            let attempt = pending.remove(at);
            return match made {
                Some(Ok((conn, server, closed))) => {
                    Ok(self.install(runtime, attempt.switched, conn, server, closed))
                }
                // Counted in `epoch` by the attempt itself.
                Some(Err(e)) => Err(e),
                // Its task ended without a result (its runtime shutting down), and
                // nothing replaced it.
                None => Err(BackendError::new(
                    BackendErrorKind::Connection,
                    "the connection attempt ended without a result (its runtime shutting down?)",
                )),
            };
        }
        Err(BackendError::new(
            BackendErrorKind::Connection,
            "no connection: every attempt ended early",
        ))
    }

    /// The connection of `runtime` if there is one now, else the attempt under way for
    /// it, else a new one. Attempts that failed (their callers gone, or they would have
    /// been removed), that began before the sentinels announced a new primary, or that
    /// belong to runtimes beyond the newest [`MAX_RUNTIMES`], are dropped.
    pub(super) fn attempt(&self, runtime: tokio::runtime::Id) -> Result<Attempting, BackendError> {
        use futures_util::FutureExt;
        use tracing::instrument::WithSubscriber as _;
        let handle = self.connection_runtime()?;
        let mut pending = crate::util::lock(&self.pending);
        if let Some((found, _)) = self.cached(runtime) {
            return Ok(Attempting::Made(found));
        }
        let switched = self.switched();
        pending.retain(|p| {
            let keep = p.switched == switched && !p.failed.load(Ordering::Acquire);
            if !keep {
                p.abort.abort();
            }
            keep
        });
        if let Some(p) = pending.iter().find(|p| p.runtime == runtime) {
            return Ok(Attempting::Under(p.id, p.outcome.clone()));
        }
        if pending.len() >= MAX_RUNTIMES {
            // The oldest, most likely of a runtime that has shut down.
            pending.remove(0).abort.abort();
        }
        let failed = Arc::new(AtomicBool::new(false));
        let task = {
            let (failed, epoch) = (failed.clone(), self.epoch.clone());
            let making = make(
                self.target.clone(),
                self.tls.clone(),
                self.connect_timeout,
                self.timeout,
            );
            handle.spawn(
                async move {
                    let made = making.await;
                    if made.is_err() {
                        // A failed connect: the server may have restarted (see `epoch`).
                        epoch.fetch_add(1, Ordering::AcqRel);
                        failed.store(true, Ordering::Release);
                    }
                    made
                }
                .with_current_subscriber(),
            )
        };
        let abort = task.abort_handle();
        let outcome = async move { task.await.ok() }.boxed().shared();
        let id = ATTEMPTS.fetch_add(1, Ordering::Relaxed);
        pending.push(Pending {
            runtime,
            switched,
            id,
            outcome: outcome.clone(),
            failed,
            abort,
        });
        Ok(Attempting::Under(id, outcome))
    }

    /// Makes `conn` the connection of `runtime`, with what its server said of itself.
    pub(super) fn install(
        &self,
        runtime: tokio::runtime::Id,
        switched: u64,
        conn: Conn,
        server: Option<(Native, Option<String>)>,
        closed: Option<Arc<AtomicBool>>,
    ) -> (Conn, u64) {
        match server {
            Some((native, run_id)) => {
                self.observe(run_id.as_deref());
                *crate::util::lock(&self.native) = native;
            }
            // The look timed out (or was refused whole): what the server has natively
            // stays as known, but whether it restarted cannot be told.
            None => self.observe(None),
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let native = self.native();
        let mut slots = crate::util::lock(&self.slots);
        slots.retain(|s| s.runtime != runtime);
        if slots.len() >= MAX_RUNTIMES {
            slots.remove(0);
        }
        slots.push(Slot {
            runtime,
            conn: conn.clone(),
            generation,
            switched,
            closed,
            check: None,
        });
        tracing::debug!(target: "distlock", generation, ?native, "connected to redis");
        (conn, generation)
    }

    /// On this client's first call only: reads the eviction policy over the multiplexed
    /// connection (opened now), in a task of its own.
    pub(super) async fn check_policy_once(&self) {
        if self.policy_checked.load(Ordering::Relaxed)
            || self.policy_checked.swap(true, Ordering::Relaxed)
        {
            return;
        }
        if let Ok((Conn::Single(conn), _)) = self.connection().await {
            tokio::spawn(warn_if_evicting(conn, self.timeout));
        }
    }

    /// What the server last connected to has natively.
    pub(in crate::backend) fn native(&self) -> Native {
        *crate::util::lock(&self.native)
    }

    /// The server said it has no such native command (see
    /// `BackendError::is_capability_missing`): scripts only until the next connection's
    /// detection.
    pub(super) fn refuse_native(&self, e: &dyn std::fmt::Display) {
        tracing::debug!(target: "distlock", error = %e, "redis refused a native conditional command; using scripts");
        *crate::util::lock(&self.native) = Native::default();
    }

    /// A call on the multiplexed connection of `generation` failed with `e`: a connection
    /// that broke, or whose server was demoted, is dropped (the next call reconnects) and
    /// counts as a sign of lost keys (see `epoch`); another error reply leaves it in use
    /// (`policy::after_error`).
    pub(super) fn failed(&self, generation: u64, e: redis::RedisError) -> BackendError {
        if policy::after_error(&e) != policy::AfterError::Keep {
            self.forget(generation);
            self.broke();
        }
        BackendError::from(e)
    }

    /// A call on the multiplexed connection of `generation` timed out
    /// ([`policy::after_timeout`]): kept, and checked in a task of its own, one check at a
    /// time, while the calls that need it wait for the verdict. A `PING` with a word of
    /// its own is answered after every reply before it: its own word back within half
    /// the command timeout (so a call that waited for the verdict still has half its own
    /// for itself) says the connection is in step and its server answers (a stall that
    /// ends by then, or one slow call, costs no connection); no answer, or another
    /// reply (a reply lost on the way), marks it dead: the next call connects again, and
    /// the break is counted (see `epoch`).
    pub(super) fn check_alive(&self, generation: u64) {
        let (tx, rx) = tokio::sync::watch::channel(Check::Under);
        let conn = {
            let mut slots = crate::util::lock(&self.slots);
            let Some(slot) = slots.iter_mut().find(|s| s.generation == generation) else {
                return;
            };
            if slot
                .check
                .as_ref()
                .is_some_and(|c| *c.borrow() == Check::Under)
            {
                return;
            }
            slot.check = Some(rx);
            slot.conn.clone()
        };
        let timeout = self.timeout / 2;
        let checked = crate::util::spawn_here(async move {
            let mut conn = conn;
            let word = format!("distlock-check-{:016x}", fastrand::u64(..));
            let mut ping = redis::cmd("PING");
            ping.arg(&word);
            let answer = tokio::time::timeout(timeout, ping.query_async::<String>(&mut conn)).await;
            let verdict = match answer {
                Ok(Ok(said)) if said == word => Check::Passed,
                answer => {
                    tracing::debug!(target: "distlock", ?answer, "the shared redis connection did not answer its check after a call's timeout: connecting again");
                    Check::Failed
                }
            };
            let _ = tx.send(verdict);
        });
        if !checked {
            self.forget(generation);
            self.broke();
        }
    }

    /// Drops the connection of `generation` so the next call reconnects.
    pub(super) fn forget(&self, generation: u64) {
        let mut slots = crate::util::lock(&self.slots);
        slots.retain(|s| s.generation != generation);
    }
}
