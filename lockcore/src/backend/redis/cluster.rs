//! Cluster routing: redirects (`MOVED`, `ASK`) and the replies that say a command did
//! not run (`TRYAGAIN`, `CLUSTERDOWN`) followed within the command timeout, the slot
//! owners read for direct connections, and the connections kept to nodes redis-rs has
//! none to.

use super::*;

/// A range of slots (first, last) and the host and port of its primary.
pub(super) type SlotOwner = (u16, u16, String, u16);

/// The key a pipeline that waits for replicas writes first: `EVAL <script> <numkeys>
/// <key> ...`, or `<command> <key> ...`; its slot is the pipeline's.
pub(super) fn pipe_key(pipe: &redis::Pipeline) -> Option<Vec<u8>> {
    let first = pipe.cmd_iter().next()?;
    let name = arg(first, 0)?;
    let at = if name.eq_ignore_ascii_case(b"EVAL") || name.eq_ignore_ascii_case(b"EVALSHA") {
        3
    } else {
        1
    };
    arg(first, at)
}

/// How many `TRYAGAIN` replies one cluster call takes (about 40 ms of pauses) before it
/// reports one: its keys are split between the two nodes of a migrating slot.
pub(super) const SPLIT_ROUNDS: u32 = 8;

/// How many redirects and not-run replies one cluster call follows before it reports
/// the last one (the command timeout bounds it too).
pub(super) const MAX_REDIRECTS: u32 = 1000;

/// The cluster node a redirect named, and whether it wants `ASKING` first.
pub(super) struct AtNode {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) asking: bool,
}

impl AtNode {
    /// The node of a `MOVED` or `ASK` reply, or of a pipeline's, where every one of its
    /// `keyed` commands that name a key was redirected to that one node (nothing of it ran
    /// here, so running it all there runs nothing twice); `None`: route by slot again, or
    /// (a pipeline some of whose commands ran here) the error is the answer, and the
    /// callers that can run on fewer keys do.
    pub(super) fn of(e: &redis::RedisError, asking: bool, keyed: usize) -> Option<AtNode> {
        let in_pipeline;
        let addr = match e.redirect_node() {
            Some((addr, _slot)) => addr,
            None => {
                let failed = e.clone().into_server_errors()?;
                if failed.len() != keyed {
                    return None;
                }
                // `<slot> <host>:<port>`
                fn node(s: &redis::ServerError) -> Option<&str> {
                    use redis::ServerErrorKind::{Ask, Moved};
                    if !matches!(s.kind(), Some(Ask | Moved)) {
                        return None;
                    }
                    s.details()?.split_ascii_whitespace().nth(1)
                }
                let (_, first) = failed.first()?;
                let at = node(first)?;
                if failed.iter().any(|(_, s)| node(s) != Some(at)) {
                    return None;
                }
                in_pipeline = at.to_owned();
                &in_pipeline
            }
        };
        let (host, port) = addr.rsplit_once(':')?;
        Some(AtNode {
            host: host.to_owned(),
            port: port.parse().ok()?,
            asking,
        })
    }

    pub(super) fn on<'c>(&'c self, conn: &'c mut ClusterConnection) -> Routed<'c> {
        Routed {
            node: self,
            via: Via::Cluster(conn),
        }
    }

    pub(super) fn on_plain<'c>(&'c self, conn: &'c mut MultiplexedConnection) -> Routed<'c> {
        Routed {
            node: self,
            via: Via::Plain(conn),
        }
    }
}

/// Commands that all go to one cluster node (after `ASKING` when it asked for them).
pub(super) struct Routed<'c> {
    pub(super) node: &'c AtNode,
    pub(super) via: Via<'c>,
}

/// How they reach it: through the cluster connection by address, or a connection to it
/// alone.
pub(super) enum Via<'c> {
    Cluster(&'c mut ClusterConnection),
    Plain(&'c mut MultiplexedConnection),
}

impl Routed<'_> {
    pub(super) async fn command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match &mut self.via {
            Via::Cluster(conn) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: self.node.host.clone(),
                    port: self.node.port,
                };
                conn.route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await
            }
            Via::Plain(conn) => redis::aio::ConnectionLike::req_packed_command(*conn, cmd).await,
        }
    }

    pub(super) async fn pipeline(
        &mut self,
        pipe: redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match &mut self.via {
            Via::Cluster(conn) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: self.node.host.clone(),
                    port: self.node.port,
                };
                conn.route_pipeline(pipe, offset, count, route).await
            }
            Via::Plain(conn) => {
                redis::aio::ConnectionLike::req_packed_commands(*conn, &pipe, offset, count).await
            }
        }
    }
}

impl redis::aio::ConnectionLike for Routed<'_> {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            if !self.node.asking {
                return self.command(cmd).await;
            }
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            let mut replies = self.pipeline(pipe, 1, 1).await?;
            replies
                .pop()
                .ok_or_else(|| (redis::ErrorKind::Client, "no reply after ASKING").into())
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            if !self.node.asking {
                return self.pipeline(pipeline.clone(), offset, count).await;
            }
            // A transaction: `ASKING`, then `MULTI` ... `EXEC` (the flag lasts until
            // `EXEC`). Otherwise `ASKING` before each command, its `OK` dropped. On a
            // cluster a pipeline has one key (see `RedisBackend::fence`), so the node
            // that asked for it has it.
            let mut pipe = redis::pipe();
            if pipeline.is_transaction() {
                pipe.cmd("ASKING").cmd("MULTI");
                for cmd in pipeline.cmd_iter() {
                    pipe.add_command(cmd.clone());
                }
                pipe.cmd("EXEC");
                return self.pipeline(pipe, offset + 1, count).await;
            }
            for cmd in pipeline.cmd_iter() {
                pipe.cmd("ASKING").add_command(cmd.clone());
            }
            let replies = self.pipeline(pipe, 2 * offset, 2 * count).await?;
            Ok(replies.into_iter().skip(1).step_by(2).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The primaries of a `CLUSTER SLOTS` reply, by slot range (entries naming no usable
/// host, `""` or `"?"`, left out: their slots go through the cluster connection).
pub(super) fn slot_owners(reply: &redis::Value) -> Vec<SlotOwner> {
    let redis::Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let int = |v: &redis::Value| match v {
        redis::Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let redis::Value::Array(parts) = range else {
                return None;
            };
            let redis::Value::Array(primary) = parts.get(2)? else {
                return None;
            };
            let host = match primary.first()? {
                redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
                _ => return None,
            };
            if host.is_empty() || host == "?" {
                return None;
            }
            Some((
                int(parts.first()?)?,
                int(parts.get(1)?)?,
                host,
                int(primary.get(1)?)?,
            ))
        })
        .collect()
}

/// Argument `at` of `cmd` (0: the command's name), as bytes.
pub(super) fn arg(cmd: &redis::Cmd, at: usize) -> Option<Vec<u8>> {
    match cmd.args_iter().nth(at)? {
        redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
        _ => None,
    }
}

/// The settings of a cluster's first node (`base`: credentials, TLS) for the node at
/// `host:port`.
pub(super) fn node_info(
    base: &redis::ConnectionInfo,
    host: String,
    port: u16,
) -> redis::ConnectionInfo {
    let addr = match base.addr() {
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => redis::ConnectionAddr::Tcp(host, port),
    };
    base.clone().set_addr(addr)
}

impl RedisBackend {
    /// A connection of its own to the cluster node `node` names, with the first node's
    /// settings (credentials, TLS).
    pub(super) async fn plain_to(
        &self,
        node: &AtNode,
    ) -> redis::RedisResult<MultiplexedConnection> {
        self.plain_making(node)?.await
    }

    /// [`plain_to`](Self::plain_to), as a future that borrows nothing.
    pub(super) fn plain_making(
        &self,
        node: &AtNode,
    ) -> redis::RedisResult<
        impl Future<Output = redis::RedisResult<MultiplexedConnection>> + Send + 'static,
    > {
        let Target::Cluster(_, base) = &self.target else {
            return Err((redis::ErrorKind::Client, "not a cluster").into());
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None);
        let client = redis::Client::open(node_info(base, node.host.clone(), node.port))?;
        Ok(async move {
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
        })
    }

    /// A connection to the cluster node `node` names for following a redirect there (a
    /// node redis-rs has no connection to: one that joined after it read the map), kept
    /// for the next redirect to that node: a migration answers `ASK` then `TRYAGAIN`
    /// round after round. Made on the cluster connections' runtime (see
    /// [`cluster_runtime`]), so that it serves every runtime.
    pub(super) async fn plain_kept(
        &self,
        node: &AtNode,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let addr = format!("{}:{}", node.host, node.port);
        if let Some(conn) = crate::util::lock(&self.plain).get(&addr) {
            return Ok(conn.clone());
        }
        tracing::debug!(target: "distlock", host = %node.host, port = node.port, "redirected to a cluster node redis-rs has no connection to; connecting");
        let making = self.plain_making(node)?;
        let conn = match cluster_runtime() {
            Some(rt) => rt.spawn(making).await.map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "connecting to a cluster node",
                    e.to_string(),
                ))
            })??,
            None => making.await?,
        };
        let mut kept = crate::util::lock(&self.plain);
        if kept.len() >= MAX_RUNTIMES {
            kept.clear();
        }
        kept.insert(addr, conn.clone());
        Ok(conn)
    }

    /// A kept connection to a cluster node failed: the next redirect there makes another.
    pub(super) fn forget_plain(&self, node: &AtNode) {
        crate::util::lock(&self.plain).remove(&format!("{}:{}", node.host, node.port));
    }

    /// The primary that owns the slot of `key`, as last read.
    pub(super) fn owner_of(&self, key: &[u8]) -> Option<AtNode> {
        let slot = crate::key::slot(key);
        let owners = crate::util::lock(&self.owners);
        let (_, _, host, port) = owners
            .as_ref()?
            .iter()
            .find(|(start, end, _, _)| *start <= slot && slot <= *end)?;
        Some(AtNode {
            host: host.clone(),
            port: *port,
            asking: false,
        })
    }

    /// On a cluster whose slot owners are not known, reads them now (`CLUSTER SLOTS`, one
    /// node, within the command timeout) for a call that needs a direct connection.
    pub(super) async fn read_owners_now(&self) {
        if crate::util::lock(&self.owners).is_some() {
            return;
        }
        let Ok((Conn::Cluster(mut conn), _)) = self.connection().await else {
            return;
        };
        let read = conn.route_command(
            redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        );
        if let Ok(Ok(ranges)) = tokio::time::timeout(self.timeout, read).await {
            *crate::util::lock(&self.owners) = Some(slot_owners(&ranges));
        }
    }

    /// On a cluster, `what` over a direct connection to the primary that owns its key's
    /// slot, as last read. `None`: no such connection, or the node answered that the
    /// command did not run there (a redirect: the map is read again), and the cluster
    /// connection takes the call.
    pub(super) async fn direct_to_owner<T: FromRedisValue>(
        &self,
        runtime: tokio::runtime::Id,
        what: Call<'_, '_>,
    ) -> Option<Result<T, BackendError>> {
        let key = what.single_key()?;
        self.direct_to_slot_owner(runtime, &key, what).await
    }

    /// [`direct_to_owner`](Self::direct_to_owner) for the slot of `key`.
    pub(super) async fn direct_to_slot_owner<T: FromRedisValue>(
        &self,
        runtime: tokio::runtime::Id,
        key: &[u8],
        what: Call<'_, '_>,
    ) -> Option<Result<T, BackendError>> {
        let Target::Cluster(_, base) = &self.target else {
            return None;
        };
        if !self.direct {
            return None;
        }
        let owner = self.owner_of(key)?;
        let info = node_info(base, owner.host, owner.port);
        // A node that cannot be reached directly: the map is read again (also when an
        // open that outlived the call's wait fails, see `open_direct`), and the cluster
        // connection decides. `take_direct_to` waits at most a quarter of the timeout.
        let mut direct = match self.take_direct_to(runtime, &info).await {
            Ok(Some(direct)) => direct,
            Ok(None) => return None,
            Err(_) => {
                *crate::util::lock(&self.owners) = None;
                return None;
            }
        };
        let reply = what.run::<T, _>(&mut direct).await;
        if let Err(e) = &reply {
            match e.kind() {
                // The slot has another owner: read them again. The old one may have
                // failed over, losing what it had not replicated (see `epoch`).
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => {
                    drop(direct);
                    self.broke();
                    *crate::util::lock(&self.owners) = None;
                    return None;
                }
                // Migrating or settling: the owners stand; the cluster path follows it.
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::Ask
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::ClusterDown,
                ) => {
                    self.give_back(direct);
                    return None;
                }
                _ => {}
            }
        }
        self.done_with(direct, &reply);
        Some(reply.map_err(BackendError::from))
    }

    /// On a cluster whose slot owners are not known (first use, or a redirect), reads
    /// them (`CLUSTER SLOTS`, one node) for the direct connections: in a task of its own,
    /// one at a time, within the command timeout, so no call waits for it.
    pub(super) fn read_owners_if_unknown(&self, conn: Conn) {
        if !self.direct || crate::util::lock(&self.owners).is_some() {
            return;
        }
        let Conn::Cluster(mut conn) = conn else {
            return;
        };
        if self.reading_owners.swap(true, Ordering::AcqRel) {
            return;
        }
        let (owners, reading, timeout) = (
            self.owners.clone(),
            self.reading_owners.clone(),
            self.timeout,
        );
        crate::util::spawn_here(async move {
            let read = conn.route_command(
                redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            );
            if let Ok(Ok(ranges)) = tokio::time::timeout(timeout, read).await {
                *crate::util::lock(&owners) = Some(slot_owners(&ranges));
            }
            reading.store(false, Ordering::Release);
        });
    }

    /// [`run_on`](Self::run_on) on a cluster connection: the call, then each redirect
    /// or try-again followed (at most `MAX_REDIRECTS`), paced once they keep coming.
    pub(super) async fn run_on_cluster<T: FromRedisValue>(
        &self,
        mut conn: ClusterConnection,
        what: Call<'_, '_>,
    ) -> redis::RedisResult<T> {
        let mut at: Option<AtNode> = None;
        let mut round = 0u32;
        loop {
            let e = match self.run_at(&mut conn, at.as_ref(), &what).await {
                Err(e) if round < MAX_REDIRECTS => e,
                reply => return reply,
            };
            round += 1;
            tracing::trace!(target: "distlock", error = %e, round, "redis cluster redirect or try-again");
            if round > 3 {
                // Redirects that keep coming (a slot map being rebuilt): not in a spin.
                let pause = Duration::from_millis(u64::from(round.min(10)) * 2);
                tokio::time::sleep(pause).await;
            }
            at = self.redirected(&mut conn, e, round, &what).await?;
        }
    }

    /// One try of `what`: routed by slot, or at the node a redirect named.
    async fn run_at<T: FromRedisValue>(
        &self,
        conn: &mut ClusterConnection,
        at: Option<&AtNode>,
        what: &Call<'_, '_>,
    ) -> redis::RedisResult<T> {
        let Some(node) = at else {
            return what.run::<T, _>(conn).await;
        };
        match what.run::<T, _>(&mut node.on(conn)).await {
            // A node redis-rs has no connection to (a new one, which owned no slot when
            // it read the map): a plain connection of its own.
            Err(e) if e.kind() == redis::ErrorKind::ClusterConnectionNotFound => {
                match self.plain_kept(node).await {
                    Ok(mut plain) => {
                        let reply = what.run::<T, _>(&mut node.on_plain(&mut plain)).await;
                        if matches!(&reply, Err(e) if !matches!(e.kind(), redis::ErrorKind::Server(_)))
                        {
                            self.forget_plain(node);
                        }
                        reply
                    }
                    // Not reachable yet (a node reconnecting after a failover): wait and
                    // route by slot again.
                    Err(_) => Err(e),
                }
            }
            reply => reply,
        }
    }

    /// Where the next try goes after the error `e` of try number `round`: a node (`MOVED`,
    /// `ASK`), by slot again after a pause (`None`), or the error is the answer.
    async fn redirected(
        &self,
        conn: &mut ClusterConnection,
        e: redis::RedisError,
        round: u32,
        what: &Call<'_, '_>,
    ) -> redis::RedisResult<Option<AtNode>> {
        use redis::ServerErrorKind::{Ask, ClusterDown, ExecAbort, Moved, TryAgain};
        Ok(match e.kind() {
            redis::ErrorKind::Server(Moved) => {
                // The slot has another owner: after a failover, keys the old one had not
                // replicated are gone.
                self.broke();
                match AtNode::of(&e, false, what.keyed()) {
                    // A pipeline part of which ran here: not run again anywhere.
                    None if what.keyed() > 1 => return Err(e),
                    at => at,
                }
            }
            redis::ErrorKind::Server(Ask) => match AtNode::of(&e, true, what.keyed()) {
                None if what.keyed() > 1 => return Err(e),
                at => at,
            },
            // A transaction whose commands were redirected while queued: nothing ran, and
            // the redirect itself was not returned. A probe of its key finds it.
            redis::ErrorKind::Server(ExecAbort) => {
                let Some(key) = what.first_key() else {
                    return Err(e);
                };
                match redis::cmd("TYPE")
                    .arg(key)
                    .query_async::<String>(conn)
                    .await
                {
                    Err(e) if e.kind() == redis::ErrorKind::Server(Moved) => {
                        self.broke();
                        AtNode::of(&e, false, 1)
                    }
                    Err(e) if e.kind() == redis::ErrorKind::Server(Ask) => AtNode::of(&e, true, 1),
                    // Not the topology: the transaction's own fault.
                    _ => return Err(e),
                }
            }
            // Keys split between the two nodes of a slot being migrated: that lasts until
            // the migration moves the rest, which a slow or stuck reshard may not do for
            // long. Tried again briefly (a migration moving one of them now), then
            // returned: the callers that can run on fewer keys do.
            redis::ErrorKind::Server(TryAgain) if round >= SPLIT_ROUNDS => return Err(e),
            redis::ErrorKind::Server(TryAgain | ClusterDown)
            | redis::ErrorKind::ClusterConnectionNotFound => {
                let pause = Duration::from_millis(u64::from(round.min(10)) * 2);
                tokio::time::sleep(pause).await;
                None
            }
            _ => return Err(e),
        })
    }
}
