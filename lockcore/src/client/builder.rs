//! [`LocksBuilder`]: the settings of a client, checked at [`build`](LocksBuilder::build),
//! then one backend made per topology (one server, a cluster, Sentinel, Redlock).

use super::*;

/// What [`LocksBuilder::build`] makes for one topology: the backend, and where waiters
/// hear of releases (`None`: they poll).
type Made = std::result::Result<(Backend, Option<NotifySource>), String>;

/// The topologies a client can be built for.
enum Topology {
    /// Independent masters, locked by majority.
    Redlock(Vec<String>),
    /// A primary named by sentinels (the first sentinel's URL gives the settings of its
    /// nodes).
    Sentinel {
        master: String,
        sentinels: Vec<String>,
        node: String,
    },
    /// A Redis Cluster's nodes.
    Cluster(Vec<String>),
    /// One server.
    Single,
}

/// Configures a [`Locks`] client; see [`Locks::builder`].
#[must_use = "a builder does nothing until `.build()` or `.connect()`"]
#[derive(Debug, Clone)]
pub struct LocksBuilder {
    pub(super) url: String,
    /// A cluster's nodes (from [`Locks::cluster`]; else read from a `redis+cluster://`
    /// URL at build).
    pub(super) nodes: Option<Vec<String>>,
    /// The primary's name and the sentinels (from [`Locks::sentinel`]; else read from a
    /// `redis+sentinel://` URL at build).
    pub(super) sentinel: Option<(String, Vec<String>)>,
    /// Independent masters (from [`Locks::redlock`]).
    pub(super) redlock: Option<Vec<String>>,
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    /// See [`LocksBuilder::connect_timeout`]; `None`: the default.
    pub(super) connect_timeout: Option<Duration>,
    pub(super) holder: Option<String>,
    pub(super) notify: bool,
    pub(super) events: Events,
    pub(super) yield_window: Duration,
    pub(super) replicas: u32,
    pub(super) fence_idle: Duration,
    #[cfg(feature = "tls")]
    pub(super) tls: TlsMaterial,
}

impl LocksBuilder {
    /// The defaults for `url` (see [`Locks::builder`]).
    pub(super) fn new(url: String) -> Self {
        LocksBuilder {
            url,
            nodes: None,
            sentinel: None,
            redlock: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: None,
            holder: None,
            notify: true,
            events: Events::default(),
            yield_window: DEFAULT_YIELD_WINDOW,
            replicas: 0,
            fence_idle: DEFAULT_FENCE_IDLE_WINDOW,
            #[cfg(feature = "tls")]
            tls: TlsMaterial::default(),
        }
    }

    /// Fairness across clients (default 10 ms; zero turns it off). When this client
    /// releases a lock while another client (another process, or another `Locks` in this
    /// one) waits for it, the release leaves the key holding a yield marker for this
    /// long instead of deleting it: `yield: <holder>:<id> ... ` naming this client and the
    /// clients that had the latest turns (one fewer than the clients waiting). Any client
    /// it does not name takes the lock as free; the named ones cannot. So a process that
    /// releases cannot take the lock straight back ahead of the processes that were
    /// waiting, its own tasks get at most one turn each before the others get theirs, and
    /// turns rotate through the waiting processes. If nobody takes it, it is free for all
    /// again after the window: the cost of a waiter that vanished is one window. The
    /// rotation is remembered at `{key}:turns` (expires 60 s after the last yield).
    ///
    /// Waiters are seen through Pub/Sub: the waiters of a client built with
    /// `notify_waiters(false)` are not waited for.
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:6379/")
    ///     .yield_window(Duration::from_millis(20))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn yield_window(mut self, window: Duration) -> Self {
        self.yield_window = window;
        self
    }

    /// Whether waiters are woken by the release message on one shared Pub/Sub connection
    /// (default `true`). Off, they only retry on their fallback timer (at most 100 ms
    /// apart, and when the holder's lease ends): for servers where `SUBSCRIBE` is not
    /// allowed.
    pub fn notify_waiters(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// Gives every lock and idempotency step of this client to `observer` as an
    /// [`Event`], after its `tracing` line: the seam for metrics or an audit trail. It
    /// runs on the caller's task (or the renewal thread), so it must be quick; a panic
    /// in it is caught and logged.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use lockcore::Event;
    ///
    /// let busy = Arc::new(AtomicU64::new(0));
    /// let count = busy.clone();
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:6379/")
    ///     .observer(move |event| {
    ///         if let Event::Busy { .. } = event {
    ///             count.fetch_add(1, Ordering::Relaxed);
    ///         }
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn observer(mut self, observer: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Self {
        self.events = Events::new(Some(Arc::new(observer)));
        self
    }

    /// Replicas that must acknowledge every lock taken, fence given and idempotency
    /// record claimed or completed (default 0: none waited for), unless the call says
    /// otherwise ([`LockRequest::replicas`](crate::LockRequest::replicas), `replicas = n`
    /// on the attributes). After the write, Redis `WAIT n` for up to half the command
    /// timeout, on a connection no other call uses meanwhile; fewer acknowledgements give
    /// the lock or claim back and return [`Error::NotReplicated`], and a lease renewal
    /// counts only once acknowledged. This closes the failover hole of asynchronous
    /// replication (a lock written to a primary that dies before a replica has it, a
    /// promoted replica without it, two holders) as far as `WAIT` can: it is not
    /// consensus, and a replica that acknowledged can still lose the write (a restart
    /// without persistence, or a failover to another replica). Fencing, checked by the
    /// storage, stays the final guard.
    ///
    /// ```
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:6379/")
    ///     .replicas(1)
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.replicas = replicas;
        self
    }

    /// How long a lock's fence counter (`{<key>}:fence`) outlives the last fence given
    /// for its name (default [a day](DEFAULT_FENCE_IDLE_WINDOW)): each fence sets the
    /// counter's ttl to this window again, so a name fenced at least once a window keeps
    /// its counter, and one left idle longer leaves nothing behind (a lock per order id
    /// does not leave a key per order for ever). A window shorter than a lock's ttl is
    /// raised to that ttl for that lock's fences (clamped, not refused: the window is the
    /// client's, the ttl each lock's); zero is refused at [`build`](Self::build). Clients
    /// of one Redis may differ: a name's last fence sets its client's window.
    ///
    /// Fences never go backwards for it: every fence is max(counter + 1, the server's
    /// clock in microseconds), so fences follow the clock, and a counter made afresh
    /// after one expired starts from the clock, above every fence the expired one gave.
    /// That holds while a name is given fewer than one fence a microsecond on average (its
    /// fences then never run ahead of the clock by as much as the window) and the server's
    /// clock does not step back by as much as the window: the longer the window, the
    /// larger the clock step it tolerates. A day is far beyond any clock correction NTP
    /// makes and any sane lock ttl, and bounds the counters kept to the names fenced in
    /// the last day (about 130 bytes of Redis memory each, `benches/README.md`).
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:6379/")
    ///     .fence_idle_window(Duration::from_secs(6 * 60 * 60))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn fence_idle_window(mut self, window: Duration) -> Self {
        self.fence_idle = window;
        self
    }

    /// Prefix of every lock key (default `lock:`). It must not contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bound on every Redis call (default 1 s), waiting for a connection included. A
    /// Redis outage surfaces as [`Error::Backend`] within it.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long making a connection may take (default 5 s, and never less than the
    /// command timeout): asking the sentinels, the TCP and TLS handshakes, a cluster's
    /// first read of its nodes.
    ///
    /// A connection is made in the background: a call waits for it within its own
    /// command timeout, and when the call gives up the connection goes on being made
    /// for the next one. So a TLS handshake slower than a command timeout (a server far
    /// away, a loaded machine) delays the first calls instead of failing every call.
    /// [`connect`](Self::connect) waits for the first connection within this bound.
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::builder("rediss://redis.example.com:6380/")
    ///     .command_timeout(Duration::from_millis(300))
    ///     .connect_timeout(Duration::from_secs(3));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The holder identity written into tokens after the UUID (default `host:pid`).
    pub fn holder_id(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// The bound on making a connection (see [`connect_timeout`](Self::connect_timeout)).
    pub(super) fn connect_bound(&self) -> Duration {
        self.connect_timeout
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
            .max(self.timeout)
    }

    /// One URL, checked: TLS only with the `tls` feature, and never `#insecure`.
    pub(super) fn connection_info(
        &self,
        url: &str,
    ) -> std::result::Result<redis::ConnectionInfo, String> {
        use redis::IntoConnectionInfo as _;
        let scheme = url.trim_start().to_ascii_lowercase();
        let tls_url = ["rediss://", "valkeys://"]
            .iter()
            .any(|s| scheme.starts_with(s));
        if !cfg!(feature = "tls") && tls_url {
            return Err(
                "a `rediss://` URL (TLS) needs the `tls` feature: `distlock = { features = [\"tls\"] }`"
                    .into(),
            );
        }
        let info = url
            .into_connection_info()
            .map_err(|e| format!("invalid redis url: {e}"))?;
        #[cfg(feature = "tls")]
        if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            return Err(
                "`#insecure` (TLS without checking the server's certificate) is not supported: give the CA with `tls_root_cert`"
                    .into(),
            );
        }
        Ok(info)
    }

    /// A cluster's nodes: from [`Locks::cluster`], or a `redis+cluster://` URL
    /// (`rediss+cluster://` for TLS) read as one URL per host; `None`: one server.
    pub(super) fn cluster_nodes(&self) -> Option<Vec<String>> {
        if let Some(nodes) = &self.nodes {
            return Some(nodes.clone());
        }
        let url = self.url.trim();
        let (scheme, rest) = url.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        let plain = scheme.strip_suffix("+cluster")?;
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (format!("{auth}@"), rest),
            None => (String::new(), rest),
        };
        let (hosts, query) = match rest.split_once(['/', '?']) {
            Some((hosts, _)) if rest.contains('?') => (hosts, rest.find('?').map(|q| &rest[q..])),
            Some((hosts, _)) => (hosts, None),
            None => (rest, None),
        };
        Some(
            hosts
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("{plain}://{auth}{h}/{}", query.unwrap_or("")))
                .collect(),
        )
    }

    /// The builder of a redis-rs cluster client for `nodes`, with this client's timeout
    /// and certificates.
    pub(super) fn cluster_builder(
        &self,
        nodes: &[String],
    ) -> std::result::Result<
        Arc<dyn Fn() -> redis::cluster::ClusterClientBuilder + Send + Sync>,
        String,
    > {
        if nodes.is_empty() {
            return Err("a cluster needs at least one node URL".into());
        }
        let infos = nodes
            .iter()
            .map(|n| self.connection_info(n))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        #[cfg(feature = "tls")]
        let certs = self.tls_certificates(&infos)?;
        // Each node's handshake within a part of the connect bound: a node that hangs
        // must not hold up a connection the others can serve (see the policy).
        let timeout = crate::backend::redis::policy::node_connect_bound(self.connect_bound());
        redis::cluster::ClusterClientBuilder::new(infos.clone())
            .build()
            .map_err(|e| format!("invalid cluster settings: {e}"))?;
        Ok(Arc::new(move || {
            // Calls are bounded by the command timeout above redis-rs: a response
            // timeout of its own would also reset the node's connection under every
            // other call in flight on it.
            let builder = redis::cluster::ClusterClientBuilder::new(infos.clone())
                .connection_timeout(timeout);
            #[cfg(feature = "tls")]
            let builder = match &certs {
                Some(certs) => builder.certs(certs.clone()),
                None => builder,
            };
            builder
        }))
    }

    /// The backend of one server, and its redis-rs client.
    pub(super) fn single(
        &self,
        url: &str,
    ) -> std::result::Result<(RedisBackend, redis::Client), String> {
        let client = self.redis_client(url)?;
        let tls = self.direct_tls(client.get_connection_info());
        let backend = RedisBackend::new(client.clone(), self.timeout, tls)
            .connect_within(self.connect_bound());
        Ok((backend, client))
    }

    /// Checks the settings and returns a client that connects on first use.
    pub fn build(self) -> Result<Locks> {
        let target = redact(&self.url);
        let config_err = |detail: String| {
            Error::backend(&target, BackendError::new(BackendErrorKind::Config, detail))
        };
        self.validate().map_err(config_err)?;
        let (backend, source) = match self.topology().map_err(config_err)? {
            Topology::Redlock(masters) => self.redlock(&masters),
            Topology::Sentinel {
                master,
                sentinels,
                node,
            } => self.sentinel(master, &sentinels, &node),
            Topology::Cluster(nodes) => self.cluster(&nodes),
            Topology::Single => self
                .single(&self.url)
                .map(|(backend, client)| (backend.into(), Some(NotifySource::Single(client)))),
        }
        .map_err(config_err)?;
        let wakeups = match source.filter(|_| self.notify) {
            Some(source) => Wakeups::Messages(Notifier::new(source, self.timeout)),
            None => Wakeups::Polling,
        };
        Ok(Locks::new(
            wakeups,
            backend,
            target,
            Settings {
                prefix: self.prefix,
                holder: self.holder,
                yield_window: self.yield_window,
                replicas: self.replicas,
                fence_idle: self.fence_idle,
                events: self.events,
            },
        ))
    }

    /// A client of the [in-memory backend](Locks::in_memory) with this builder's prefix,
    /// holder id, observer and fence idle window (the URL, timeouts, replicas and
    /// topology are not used): for tests of settings that the in-memory backend honours.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::builder("memory")
    ///     .fence_idle_window(Duration::from_secs(60))
    ///     .build_in_memory()
    ///     .unwrap();
    /// let guard = locks.lock("a").acquire().await.unwrap();
    /// assert!(guard.fence().await.unwrap() > 0);
    /// # }
    /// ```
    pub fn build_in_memory(self) -> Result<Locks> {
        self.validate().map_err(|detail| {
            Error::backend(
                "in-memory",
                BackendError::new(BackendErrorKind::Config, detail),
            )
        })?;
        Ok(Locks::in_memory_with(Settings {
            prefix: self.prefix,
            holder: self.holder,
            yield_window: Duration::ZERO,
            replicas: 0,
            fence_idle: self.fence_idle,
            events: self.events,
        }))
    }

    /// The settings that no topology accepts.
    fn validate(&self) -> std::result::Result<(), String> {
        if self.prefix.contains(['{', '}']) {
            return Err(format!(
                "the key prefix `{}` must not contain `{{` or `}}`",
                self.prefix
            ));
        }
        if self.timeout.is_zero() {
            return Err("the command timeout must not be zero".into());
        }
        if self.connect_timeout.is_some_and(|t| t.is_zero()) {
            return Err("the connect timeout must not be zero".into());
        }
        if self.fence_idle.is_zero() {
            return Err("the fence idle window must not be zero".into());
        }
        if self.redlock.is_some() && self.replicas > 0 {
            return Err("`replicas` does not apply to Redlock: its masters are independent".into());
        }
        Ok(())
    }

    /// Which topology the settings name: Redlock's masters, then Sentinel (given or a
    /// `redis+sentinel://` URL), then a cluster (given or a `redis+cluster://` URL), else
    /// one server.
    fn topology(&self) -> std::result::Result<Topology, String> {
        if let Some(masters) = &self.redlock {
            return Ok(Topology::Redlock(masters.clone()));
        }
        let sentinel = match &self.sentinel {
            Some((master, sentinels)) => {
                let node = sentinels.first().cloned().unwrap_or_default();
                Some((master.clone(), sentinels.clone(), node))
            }
            None => crate::backend::sentinel::parse_url(&self.url).transpose()?,
        };
        if let Some((master, sentinels, node)) = sentinel {
            return Ok(Topology::Sentinel {
                master,
                sentinels,
                node,
            });
        }
        Ok(match self.cluster_nodes() {
            Some(nodes) => Topology::Cluster(nodes),
            None => Topology::Single,
        })
    }

    /// Redlock over independent masters (waiters poll: no notifier).
    fn redlock(&self, masters: &[String]) -> Made {
        if masters.is_empty() {
            return Err("Redlock needs at least one master URL".into());
        }
        let nodes = masters
            .iter()
            .map(|m| self.single(m).map(|(backend, _)| backend))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok((RedlockBackend::new(nodes).into(), None))
    }

    /// The primary that the sentinels name.
    fn sentinel(&self, master: String, sentinels: &[String], node: &str) -> Made {
        let infos = sentinels
            .iter()
            .map(|s| self.connection_info(s))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if infos.is_empty() {
            return Err("Sentinel needs at least one sentinel URL".into());
        }
        #[cfg(feature = "tls")]
        let certs = self.tls_certificates(&infos)?;
        #[cfg(not(feature = "tls"))]
        let certs = None;
        let node = self.connection_info(node)?;
        // Over TLS (`rediss://` sentinels: the primary speaks TLS too), direct connections
        // to the primary speak it with the client's certificates, as on one server.
        // Any `rediss://` sentinel makes the primary TLS (see `SentinelTarget::new`).
        let tls_info = infos
            .iter()
            .find(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }))
            .unwrap_or(&infos[0]);
        let tls = self.direct_tls(tls_info);
        let primary = crate::backend::sentinel::SentinelTarget::new(
            master,
            infos,
            node.redis_settings().clone(),
            certs,
        );
        let backend = RedisBackend::sentinel(primary.clone(), self.timeout, tls)
            .connect_within(self.connect_bound());
        Ok((backend.into(), Some(NotifySource::Sentinel(primary))))
    }

    /// A Redis Cluster.
    fn cluster(&self, nodes: &[String]) -> Made {
        let builder = self.cluster_builder(nodes)?;
        // No retries in redis-rs: see `backend::redis`.
        let client = builder()
            .retries(0)
            .build()
            .map_err(|e| format!("invalid cluster settings: {e}"))?;
        // With the certificates: for a plain connection to a node (see
        // `RedisBackend::plain_to`).
        let base = self.redis_client(&nodes[0])?.get_connection_info().clone();
        let tls = self.direct_tls(&base);
        let backend = RedisBackend::cluster(client, base, self.timeout, tls)
            .connect_within(self.connect_bound());
        Ok((backend.into(), Some(NotifySource::Cluster(builder))))
    }

    /// [`build`](Self::build), then checks that Redis answers `PING`: the first
    /// connection within the [connect timeout](Self::connect_timeout), then the `PING`
    /// within the command timeout.
    pub async fn connect(self) -> Result<Locks> {
        let until = tokio::time::Instant::now() + self.connect_bound();
        let locks = self.build()?;
        loop {
            match locks.ping().await {
                // The connection is still being made (see `connect_timeout`).
                Err(Error::Backend { source, .. })
                    if source.kind() == BackendErrorKind::Timeout
                        && tokio::time::Instant::now() < until => {}
                done => return done.map(|()| locks),
            }
        }
    }
}

/// `redis://user:secret@host/` shown as `redis://user:***@host/`.
pub(super) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &creds[..colon],
                    &url[at..]
                ),
                None => format!("{}***{}", &url[..scheme + 3], &url[at..]),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rediss://` URL builds with the `tls` feature, and says which feature it needs
    /// without it.
    #[test]
    fn rediss_needs_the_tls_feature() {
        let built = Locks::builder("rediss://127.0.0.1:1/").build();
        if cfg!(feature = "tls") {
            assert!(built.is_ok(), "{built:?}");
        } else {
            let e = built.unwrap_err().to_string();
            assert!(e.contains("`tls` feature"), "{e}");
        }
    }

    /// A zero fence idle window is refused at build, in memory too; a short one builds.
    #[test]
    fn a_zero_fence_idle_window_is_refused() {
        let zero = || Locks::builder("redis://127.0.0.1:6379/").fence_idle_window(Duration::ZERO);
        let e = zero().build().unwrap_err().to_string();
        assert!(e.contains("fence idle window"), "{e}");
        let e = zero().build_in_memory().unwrap_err().to_string();
        assert!(e.contains("fence idle window"), "{e}");
        let short =
            Locks::builder("redis://127.0.0.1:6379/").fence_idle_window(Duration::from_millis(1));
        assert!(short.clone().build().is_ok());
        assert!(short.build_in_memory().is_ok());
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://u:pw@h:1/"), "redis://u:***@h:1/");
        assert_eq!(redact("redis://pw@h/"), "redis://***@h/");
        assert_eq!(redact("redis://h/"), "redis://h/");
        assert_eq!(sanitize_holder("a {b}"), "a__b_");
    }

    /// The URL forms per topology, and what cannot work refused at build.
    #[test]
    fn topology_urls() {
        let cluster = Locks::builder("redis+cluster://:pw@h1:7000,h2:7001/");
        assert_eq!(
            cluster.cluster_nodes().unwrap(),
            ["redis://:pw@h1:7000/", "redis://:pw@h2:7001/"]
        );
        assert!(cluster.build().is_ok());
        assert!(Locks::builder("redis://h:6379/").cluster_nodes().is_none());
        assert!(
            Locks::cluster(["redis://h1:7000", "redis://h2:7001"])
                .build()
                .is_ok()
        );
        assert!(Locks::cluster(Vec::<String>::new()).build().is_err());
        assert!(
            Locks::builder("redis+sentinel://s1:26379,s2:26379/mymaster/0")
                .build()
                .is_ok()
        );
        assert!(
            Locks::builder("redis+sentinel://s1:26379").build().is_err(),
            "no name"
        );
        assert!(Locks::sentinel("m", ["redis://s1:26379"]).build().is_ok());
        assert_eq!(
            Locks::sentinel("m", ["rediss://s1:26379"]).build().is_ok(),
            cfg!(feature = "tls")
        );
        assert!(
            Locks::redlock(["redis://a:1", "redis://b:1", "redis://c:1"])
                .build()
                .is_ok()
        );
        assert!(Locks::redlock(Vec::<String>::new()).build().is_err());
        let e = Locks::redlock(["redis://a:1"])
            .replicas(1)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("Redlock"), "{e}");
    }
}
