//! Call routing and timeouts: which connection a call goes on (a direct one, the shared
//! multiplexed one, a kept one to the primary), the `EVALSHA`-then-`EVAL` fallback, and
//! the command timeout that bounds every call.

use super::*;

/// Counts one call in flight while it lives.
pub(super) struct InFlight<'a> {
    pub(super) count: &'a AtomicUsize,
    /// How many were in flight when this one started.
    pub(super) before: usize,
}

impl<'a> InFlight<'a> {
    pub(super) fn enter(count: &'a AtomicUsize) -> Self {
        let before = count.fetch_add(1, Ordering::Relaxed);
        InFlight { count, before }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `EVALSHA <script's hash> <keys>`, sized for the `args` keys and arguments to come and
/// about `data` bytes of them.
pub(super) fn evalsha(script: &Script, keys: usize, args: usize, data: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3 + keys + args, data + 64);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// One call of [`RedisBackend::call`]: a script, a plain command, or an `EVALSHA`.
#[derive(Clone, Copy)]
pub(super) enum Call<'a, 'b> {
    Script(&'a ScriptInvocation<'b>),
    Cmd(&'a redis::Cmd),
    Evalsha(&'a Script, &'a redis::Cmd),
    Pipe(&'a redis::Pipeline),
}

impl Call<'_, '_> {
    /// The key a single command or `EVALSHA` works on (a script's other keys share its
    /// slot), for routing it to the slot's owner; `None` for the rest.
    pub(super) fn single_key(self) -> Option<Vec<u8>> {
        let (cmd, at) = match self {
            Call::Cmd(cmd) => (cmd, 1),
            // `EVALSHA <sha> <numkeys> <key> ...`: with at least one key.
            Call::Evalsha(_, cmd)
                if !matches!(cmd.args_iter().nth(2), Some(redis::Arg::Simple(b"0"))) =>
            {
                (cmd, 3)
            }
            Call::Evalsha(..) | Call::Script(_) | Call::Pipe(_) => return None,
        };
        arg(cmd, at)
    }

    /// The operation's name for metrics and spans (OpenTelemetry's `db.operation.name`):
    /// the command, `EVALSHA` for a script, `PIPELINE` for a pipeline.
    pub(super) fn operation(self) -> &'static str {
        let Call::Cmd(cmd) = self else {
            return match self {
                Call::Pipe(_) => "PIPELINE",
                _ => "EVALSHA",
            };
        };
        match cmd.args_iter().next() {
            Some(redis::Arg::Simple(name)) => match name {
                b"SET" => "SET",
                b"GET" => "GET",
                b"DEL" => "DEL",
                b"DELIFEQ" => "DELIFEQ",
                b"DELEX" => "DELEX",
                b"PEXPIRE" => "PEXPIRE",
                b"PTTL" => "PTTL",
                b"SCAN" => "SCAN",
                b"PING" => "PING",
                b"INCR" => "INCR",
                b"WAIT" => "WAIT",
                b"EVALSHA" => "EVALSHA",
                b"EVAL" => "EVAL",
                _ => "COMMAND",
            },
            _ => "COMMAND",
        }
    }

    /// The key of a pipeline's first command (its first argument), for the probe after
    /// an aborted transaction.
    /// How many of its commands name a key: every command of a pipeline but those that
    /// name none (`WAIT`, `PING`, `MULTI`, `EXEC`, `ASKING`); one for the rest.
    pub(super) fn keyed(self) -> usize {
        let Call::Pipe(pipe) = self else { return 1 };
        pipe.cmd_iter()
            .filter(|cmd| match cmd.args_iter().next() {
                Some(redis::Arg::Simple(name)) => !matches!(
                    name.to_ascii_uppercase().as_slice(),
                    b"WAIT" | b"PING" | b"MULTI" | b"EXEC" | b"ASKING"
                ),
                _ => true,
            })
            .count()
    }

    pub(super) fn first_key(self) -> Option<Vec<u8>> {
        let Call::Pipe(pipe) = self else { return None };
        arg(pipe.cmd_iter().next()?, 1)
    }

    pub(super) async fn run<T: FromRedisValue, C: redis::aio::ConnectionLike + Send>(
        self,
        conn: &mut C,
    ) -> redis::RedisResult<T> {
        // The script calls are boxed: they are not the usual path, and their futures are
        // several times larger than a command's, which every call's future would carry.
        match self {
            Call::Script(inv) => Box::pin(inv.invoke_async::<T>(conn)).await,
            Call::Cmd(cmd) => cmd.query_async::<T>(conn).await,
            Call::Pipe(pipe) => pipe.query_async::<T>(conn).await,
            Call::Evalsha(script, cmd) => match cmd.query_async::<T>(conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    Box::pin(script.prepare_invoke().load_async(conn)).await?;
                    cmd.query_async::<T>(conn).await
                }
                reply => reply,
            },
        }
    }
}

/// Which connection a call goes on where there is a choice (one server, or a cluster's
/// slot owner).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// A direct connection while fewer than [`DIRECT_BELOW`] calls are in flight, else the
    /// multiplexed one: for locks, whose holders wait on each reply (a direct connection
    /// answers without the multiplexed connection's driver task in between).
    Direct,
    /// The multiplexed connection: for idempotency records, one or two calls in an HTTP
    /// request that costs far more than their round trip. Calls of concurrent requests
    /// share its socket reads and writes, which costs redis-server less CPU per command
    /// than a direct connection's one read and one write per call.
    Shared,
}

impl RedisBackend {
    /// Runs one script invocation (EVALSHA, loading the script on NOSCRIPT) within the
    /// timeout, over a direct connection when one is free.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        self.call(Call::Script(invocation), Route::Direct).await
    }

    /// [`eval`](Self::eval) over the connection `route` names.
    pub(crate) async fn eval_via<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        route: Route,
    ) -> Result<T, BackendError> {
        self.call(Call::Script(invocation), route).await
    }

    /// Runs one plain command within the timeout, over a direct connection when one is
    /// free.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, BackendError> {
        self.call(Call::Cmd(cmd), Route::Direct).await
    }

    /// [`query`](Self::query) over the connection `route` names.
    pub(crate) async fn query_via<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        route: Route,
    ) -> Result<T, BackendError> {
        self.call(Call::Cmd(cmd), route).await
    }

    /// Runs a pipeline (a `MULTI` one too) within the timeout, over the connection
    /// `route` names.
    pub(crate) async fn query_pipe<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        route: Route,
    ) -> Result<T, BackendError> {
        self.call(Call::Pipe(pipe), route).await
    }

    /// Runs a pipeline within the timeout on a connection no other call uses meanwhile:
    /// an idle or new direct connection whatever the calls in flight (to the current
    /// primary behind Sentinel, over TLS too, to the slot's owner on a cluster), else
    /// (every direct one busy, or TLS that direct connections cannot speak: no
    /// configuration could be made) a connection of its own, closed after. For pipelines that end in
    /// `WAIT`, which holds its connection while replicas catch up: on a connection other
    /// calls share, one lagging replica would stall every call to its primary.
    pub(crate) async fn query_pipe_alone<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, BackendError> {
        let call = async {
            let runtime = current_runtime()?;
            let client = match &self.target {
                Target::Single(client) => {
                    if let Some(mut direct) = self.take_direct(runtime).await? {
                        let reply = Call::Pipe(pipe).run::<T, _>(&mut direct).await;
                        self.done_with(direct, &reply);
                        return reply.map_err(BackendError::from);
                    }
                    client.clone()
                }
                Target::Sentinel(target) => {
                    let client = target.current(self.timeout).await?;
                    if let Some(reply) = self.pipe_on_primary(runtime, &client, pipe).await {
                        return reply;
                    }
                    client
                }
                // A cluster: a direct connection to the slot's owner (read now if the map
                // is not known); the shared one only where none can be had (every direct
                // one busy, TLS, or a slot moving).
                Target::Cluster(..) => {
                    if self.direct
                        && let Some(key) = pipe_key(pipe)
                    {
                        self.read_owners_now().await;
                        let what = Call::Pipe(pipe);
                        if let Some(reply) =
                            Box::pin(self.direct_to_slot_owner(runtime, &key, what)).await
                        {
                            return reply;
                        }
                        // Every direct connection busy: one of its own to the owner.
                        if let Some(node) = self.owner_of(&key) {
                            let mut own = self.plain_to(&node).await?;
                            match Call::Pipe(pipe).run::<T, _>(&mut own).await {
                                Err(e)
                                    if AtNode::of(&e, false, Call::Pipe(pipe).keyed())
                                        .is_some() =>
                                {
                                    *crate::util::lock(&self.owners) = None;
                                }
                                reply => return reply.map_err(BackendError::from),
                            }
                        }
                    }
                    return self.call_on_shared(Call::Pipe(pipe)).await;
                }
            };
            let mut own = client
                .get_multiplexed_async_connection()
                .await
                .inspect_err(|_| self.broke())?;
            Call::Pipe(pipe)
                .run::<T, _>(&mut own)
                .await
                .map_err(BackendError::from)
        };
        // Boxed: making a connection of its own (behind Sentinel too) is a large future,
        // which the callers' futures would carry whether they wait for replicas or not.
        self.within_timeout(&AtomicU64::new(0), Box::pin(call).as_mut())
            .await
    }

    /// Runs `cmd`, an `EVALSHA` of `script` built by [`evalsha`], loading the script on
    /// NOSCRIPT: the hot paths' scripts, without a `ScriptInvocation` per call.
    pub(super) async fn evalsha_call<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &redis::Cmd,
    ) -> Result<T, BackendError> {
        self.call(Call::Evalsha(script, cmd), Route::Direct).await
    }

    pub(super) async fn call<T: FromRedisValue>(
        &self,
        what: Call<'_, '_>,
        route: Route,
    ) -> Result<T, BackendError> {
        use tracing::Instrument as _;
        let _timed = crate::metrics::Operation::start_with(|| what.operation());
        let span = client_span(|| what.operation(), || self.server_of(what));
        self.call_timed(what, route).instrument(span).await
    }

    /// The server a call goes to, as far as this client knows it before sending: the one
    /// server, the primary last found behind Sentinel, the owner of the key's slot on a
    /// cluster.
    fn server_of(&self, what: Call<'_, '_>) -> Option<(String, u16)> {
        let addr = |info: &redis::ConnectionInfo| match info.addr() {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
            _ => None,
        };
        match &self.target {
            Target::Single(client) => addr(client.get_connection_info()),
            Target::Sentinel(sentinel) => sentinel
                .current_primary()
                .and_then(|c| addr(c.get_connection_info())),
            // A keyless command (`WAIT`, `PUBLISH`, ...) has no slot: the first node.
            Target::Cluster(_, first) => match keyed(what)
                .then(|| what.single_key())
                .flatten()
                .and_then(|k| self.owner_of(&k))
            {
                Some(node) => Some((node.host, node.port)),
                None => addr(first),
            },
        }
    }

    async fn call_timed<T: FromRedisValue>(
        &self,
        what: Call<'_, '_>,
        route: Route,
    ) -> Result<T, BackendError> {
        let used = AtomicU64::new(0);
        let call = async {
            let runtime = current_runtime()?;
            self.check_policy_once().await;
            let _in_flight = InFlight::enter(&self.in_flight);
            let may_go_direct = route == Route::Direct && _in_flight.before < DIRECT_BELOW;
            if may_go_direct && let Some(mut direct) = self.take_direct(runtime).await? {
                let reply = what.run::<T, _>(&mut direct).await;
                self.done_with(direct, &reply);
                return reply.map_err(BackendError::from);
            }
            if may_go_direct
                && self.sharded
                && let Some(reply) = Box::pin(self.direct_to_owner(runtime, what)).await
            {
                return reply;
            }
            let (conn, generation) = self.connection().await?;
            used.store(generation, Ordering::Relaxed);
            let reply = self
                .run_on(conn.clone(), what)
                .await
                .map_err(|e| self.failed(generation, e));
            self.read_owners_if_unknown(conn);
            reply
        };
        tokio::pin!(call);
        self.within_timeout(&used, call).await
    }

    /// Behind Sentinel, `pipe` over a direct connection to the primary `client` names
    /// (kept for the next such call, not opened and closed each time; over TLS with the
    /// client's certificates). `None`: no direct connection can be had (every one busy,
    /// or TLS without a configuration for them), and the caller makes its own.
    /// One that answers `READONLY` (a demoted primary) is closed, with the idle ones
    /// (`policy::after_error`).
    pub(super) async fn pipe_on_primary<T: FromRedisValue>(
        &self,
        runtime: tokio::runtime::Id,
        client: &redis::Client,
        pipe: &redis::Pipeline,
    ) -> Option<Result<T, BackendError>> {
        let info = client.get_connection_info();
        if !Direct::serves(info, &self.tls) {
            return None;
        }
        let mut direct = match self.take_direct_to(runtime, info).await {
            Ok(Some(direct)) => direct,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let reply = Call::Pipe(pipe).run::<T, _>(&mut direct).await;
        self.done_with(direct, &reply);
        Some(reply.map_err(BackendError::from))
    }

    /// `what` on the shared connection (not a direct one), without a timer of its own:
    /// for a caller already within the timeout.
    pub(super) async fn call_on_shared<T: FromRedisValue>(
        &self,
        what: Call<'_, '_>,
    ) -> Result<T, BackendError> {
        let (conn, generation) = self.connection().await?;
        self.run_on(conn, what)
            .await
            .map_err(|e| self.failed(generation, e))
    }

    /// `what` on `conn`; on a cluster, following redirects and waiting out the replies
    /// that say the command did not run (see the module docs).
    pub(super) async fn run_on<T: FromRedisValue>(
        &self,
        conn: Conn,
        what: Call<'_, '_>,
    ) -> redis::RedisResult<T> {
        match conn {
            Conn::Single(mut conn) => what.run::<T, _>(&mut conn).await,
            // Boxed: the redirect loop's state (a connection being made among it) would
            // otherwise make every call's future, on one server too, several times larger.
            Conn::Cluster(conn) => Box::pin(self.run_on_cluster(conn, what)).await,
        }
    }

    /// `call` within the command timeout. On a timeout, its connection is what
    /// [`policy::after_timeout`] says: a direct one went with the call's future; the
    /// multiplexed one it was using (its generation in `used`, 0 for none) is kept (its
    /// late reply is dropped, never read as another call's) and checked. The call is
    /// pinned where its caller made it: a large future is not copied into the timer.
    pub(super) async fn within_timeout<T>(
        &self,
        used: &AtomicU64,
        call: std::pin::Pin<&mut impl Future<Output = Result<T, BackendError>>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => {
                let generation = used.load(Ordering::Relaxed);
                if self.sharded {
                    // A cluster connection matches replies itself and reconnects on its
                    // own: kept (the policy). But the slot's primary may have failed over
                    // meanwhile, without a reply that says so (see `epoch`).
                    debug_assert_eq!(
                        policy::after_timeout(policy::Carrier::Cluster),
                        policy::AfterError::Keep
                    );
                    self.broke();
                } else if generation != 0 {
                    match policy::after_timeout(policy::Carrier::Multiplexed) {
                        policy::AfterError::Keep => {}
                        policy::AfterError::Suspect => self.check_alive(generation),
                        policy::AfterError::Broken | policy::AfterError::Demoted => {
                            self.forget(generation);
                            self.broke();
                        }
                    }
                }
                Err(BackendError::timeout(self.timeout))
            }
        }
    }
}

/// Whether `what` names a key first (a script's first key, or a keyed command's): its
/// slot's owner is the server it goes to on a cluster.
fn keyed(what: Call<'_, '_>) -> bool {
    !matches!(
        what.operation(),
        "WAIT" | "PING" | "SCAN" | "PIPELINE" | "COMMAND"
    )
}

/// A Redis call's span, one per call, as OpenTelemetry names a database client's: its
/// fields (the operation, the server it goes to) are computed only when a subscriber
/// wants the span.
pub(super) fn client_span(
    operation: impl Fn() -> &'static str,
    server: impl FnOnce() -> Option<(String, u16)>,
) -> tracing::Span {
    let span = tracing::debug_span!(
        target: "distlock",
        "redis",
        otel.name = operation(),
        otel.kind = "client",
        db.system.name = "redis",
        db.operation.name = operation(),
        server.address = tracing::field::Empty,
        server.port = tracing::field::Empty,
    );
    if !span.is_disabled()
        && let Some((host, port)) = server()
    {
        span.record("server.address", host.as_str());
        span.record("server.port", port);
    }
    span
}
