//! The [`Locks`] client and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{
    Backend, memory::MemoryBackend, redis::RedisBackend, redlock::RedlockBackend,
};
use crate::error::{BackendError, BackendErrorKind, Error, Result};
use crate::local::LocalQueues;
use crate::notify::{Notifier, Source as NotifySource, Subscription, channel_of};
use crate::watchdog::Watchdog;

/// Default key prefix: the lock on `order:42` lives at Redis key `lock:order:42`.
pub const DEFAULT_PREFIX: &str = "lock:";
/// Default bound on every Redis call, waiting for a connection included.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// Default of [`LocksBuilder::connect_timeout`] (never shorter than the command timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of [`LocksBuilder::yield_window`].
pub const DEFAULT_YIELD_WINDOW: Duration = Duration::from_millis(10);

/// A handle to the lock store, cheap to clone: every clone shares the same connections
/// (per tokio runtime: one multiplexed connection, re-opened when it breaks, one Pub/Sub
/// connection for waiters, and up to four direct connections that carry the lock
/// scripts while few calls are in flight, so an uncontended acquire or release costs
/// the round trip and not a hop through a connection's driver task).
///
/// ```no_run
/// # async fn demo() -> Result<(), lockcore::Error> {
/// use std::time::Duration;
/// let locks = lockcore::Locks::connect("redis://127.0.0.1:6379/").await?;
/// let guard = locks
///     .lock("order:42")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(3))
///     .acquire()
///     .await?;
/// println!("fence {}", guard.fence().await?);
/// guard.release().await?; // Err(Error::Lost) if the lease ran out meanwhile
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locks {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// Shared with the renewal task, which holds it weakly.
    pub(crate) backend: Arc<Backend>,
    pub(crate) prefix: String,
    pub(crate) holder: String,
    /// Where the locks live, without credentials (for errors and `Debug`).
    pub(crate) target: String,
    /// Pub/Sub wake-ups (Redis only).
    pub(crate) notifier: Option<Notifier>,
    pub(crate) queues: Arc<LocalQueues>,
    pub(crate) watchdog: Watchdog,
    /// `<holder>:<random>`, unique to this client: what a yield marker names (see
    /// `release.lua`).
    pub(crate) client_id: String,
    /// How long it stays (zero: never left).
    pub(crate) yield_window: Duration,
    /// Replicas that must acknowledge a lock, fence or record unless a call says
    /// otherwise (see [`LocksBuilder::replicas`]).
    pub(crate) replicas: u32,
}

impl Inner {
    /// Wake-ups for `key`'s releases; `None` when they cannot be had (then waiters poll).
    pub(crate) async fn subscribe(&self, key: &str) -> Option<Subscription> {
        self.subscribe_channel(channel_of(key)).await
    }

    /// Wake-ups on `channel`; `None` when they cannot be had.
    pub(crate) async fn subscribe_channel(&self, channel: String) -> Option<Subscription> {
        match (&*self.backend, &self.notifier) {
            (Backend::Memory(m), _) => Some(Subscription::local(&m.waiters, channel)),
            (Backend::Redis(_), Some(n)) => n.subscribe(channel).await,
            (Backend::Redis(_), None) | (Backend::Redlock(_), _) => None,
        }
    }
}

impl Locks {
    /// Connects to the Redis at `url` with default settings and checks it answers `PING`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockcore::Error> {
    /// let locks = lockcore::Locks::connect("redis://127.0.0.1:6379/").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Locks> {
        Locks::builder(url).connect().await
    }

    /// Starts configuring a client for the Redis at `url`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:6379/")
    ///     .prefix("myapp:lock:")
    ///     .command_timeout(Duration::from_millis(500))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn builder(url: impl Into<String>) -> LocksBuilder {
        LocksBuilder {
            url: url.into(),
            nodes: None,
            sentinel: None,
            redlock: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: None,
            holder: None,
            notify: true,
            yield_window: DEFAULT_YIELD_WINDOW,
            replicas: 0,
            #[cfg(feature = "tls")]
            tls: TlsMaterial::default(),
        }
    }

    /// Starts configuring a client for the Redis Cluster that these nodes belong to (any
    /// of its nodes will do: the others are found through them). Each lock's keys, and
    /// each idempotency record's, live in one hash slot; waiters are woken with sharded
    /// Pub/Sub (Redis 7.0+) on the node that owns the slot. The URL form
    /// `redis+cluster://host1:7000,host2:7001` given to [`Locks::builder`] (or in
    /// `REDIS_URL`) does the same.
    ///
    /// ```
    /// let locks = lockcore::Locks::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn cluster<S: AsRef<str>>(nodes: impl IntoIterator<Item = S>) -> LocksBuilder {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        let mut builder = Locks::builder(nodes.join(","));
        builder.nodes = Some(nodes);
        builder
    }

    /// Starts configuring a client for the Redis primary that these sentinels call
    /// `master`. The primary is found through the sentinels when a connection is made,
    /// and found again after a connection error, a `READONLY` reply (it was demoted) or a
    /// `+switch-master` message, without rebuilding the client. The primary is reached with
    /// the credentials and database of the first sentinel URL. The URL form
    /// `redis+sentinel://host1:26379,host2:26379/mymaster` given to [`Locks::builder`]
    /// (or in `REDIS_URL`) does the same (its credentials and database, as in
    /// `redis+sentinel://:password@host1:26379/mymaster/0`, are the primary's).
    ///
    /// During a failover calls fail with [`Error::Backend`] within their timeout. A
    /// failover loses the writes the old primary had not replicated: `replicas = 1`
    /// closes that hole for locks and records (see the crate docs).
    ///
    /// ```
    /// let locks = lockcore::Locks::sentinel("mymaster", ["redis://127.0.0.1:26379"])
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn sentinel<S: AsRef<str>>(
        master: impl Into<String>,
        sentinels: impl IntoIterator<Item = S>,
    ) -> LocksBuilder {
        let sentinels: Vec<String> = sentinels
            .into_iter()
            .map(|n| n.as_ref().to_owned())
            .collect();
        let master = master.into();
        let mut builder = Locks::builder(format!("{master} via {}", sentinels.join(",")));
        builder.sentinel = Some((master, sentinels));
        builder
    }

    /// Starts configuring a client that takes each lock on a quorum of independent Redis
    /// masters (Redlock; N/2+1 of N, five usually): `SET NX PX` on every master at once,
    /// each bounded by the command timeout; taken when a quorum set it with validity left
    /// (`ttl - elapsed - drift`, drift `ttl / 100 + 2 ms`); otherwise given back on every
    /// master. Release and renewal need a quorum too: a renewal that a quorum refuses
    /// means the lock is lost. Waiters retry after a random delay.
    ///
    /// `#[idempotent]` works over the same masters: each step of a record runs on every
    /// master and counts like a lock (a claim is the caller's on a quorum, a result is
    /// stored once a quorum stored it, so a later quorum of claims always meets it).
    ///
    /// What it does not give: fencing tokens (`fence()` returns an error: independent
    /// counters cannot give a number that always grows) and `replicas = n` (an error
    /// too). A master that restarts without persistence forgets
    /// its locks; Redlock's safety then rests on its clocks and on the restart waiting at
    /// least a ttl (`appendfsync always`, or a delayed start).
    ///
    /// ```
    /// let locks = lockcore::Locks::redlock([
    ///     "redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379",
    /// ])
    /// .build()
    /// .unwrap();
    /// ```
    pub fn redlock<S: AsRef<str>>(masters: impl IntoIterator<Item = S>) -> LocksBuilder {
        let masters: Vec<String> = masters.into_iter().map(|m| m.as_ref().to_owned()).collect();
        let mut builder = Locks::builder(masters.join(","));
        builder.redlock = Some(masters);
        builder
    }

    /// Locks kept in this process, with the same TTL, token, fencing, `Busy` and `Lost`
    /// rules as Redis: for unit tests of annotated code. Never chosen implicitly.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let g = locks.lock("a").acquire().await.unwrap();
    /// assert!(matches!(locks.lock("a").acquire().await, Err(lockcore::Error::Busy { .. })));
    /// g.release().await.unwrap();
    /// # }
    /// ```
    pub fn in_memory() -> Locks {
        Locks::new(
            Backend::Memory(MemoryBackend::default()),
            None,
            DEFAULT_PREFIX.to_owned(),
            None,
            "in-memory".to_owned(),
            Duration::ZERO,
            0,
        )
    }

    fn new(
        backend: Backend,
        notifier: Option<Notifier>,
        prefix: String,
        holder: Option<String>,
        target: String,
        yield_window: Duration,
        replicas: u32,
    ) -> Locks {
        let holder = sanitize_holder(&holder.unwrap_or_else(default_holder));
        let id = uuid::Uuid::new_v4().simple().to_string();
        let client_id = format!("{holder}:{}", &id[..12]);
        let notifier = notifier.map(|n| n.for_client(&client_id));
        Locks {
            inner: Arc::new(Inner {
                backend: Arc::new(backend),
                prefix,
                client_id,
                holder,
                target,
                notifier,
                queues: Arc::default(),
                watchdog: Watchdog::default(),
                yield_window,
                replicas,
            }),
        }
    }

    /// The key prefix, `lock:` unless configured.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The holder identity written after the UUID in every token (`host:pid` by default).
    pub fn holder_id(&self) -> &str {
        &self.inner.holder
    }

    /// Whether this is the [`in_memory`](Locks::in_memory) backend.
    pub fn is_in_memory(&self) -> bool {
        self.inner.backend.is_memory()
    }

    /// Number of release channels this client is subscribed to on the current tokio
    /// runtime: one per key that has waiters, zero when nobody waits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// assert_eq!(locks.waiting_channels(), 0);
    /// # }
    /// ```
    pub fn waiting_channels(&self) -> usize {
        match (&*self.inner.backend, &self.inner.notifier) {
            (Backend::Memory(m), _) => m.waiters.len(),
            (_, Some(n)) => n.active_channels(),
            _ => 0,
        }
    }

    /// Checks that the backend answers, within the command timeout.
    pub async fn ping(&self) -> Result<()> {
        self.inner
            .backend
            .ping()
            .await
            .map_err(|e| Error::backend(&self.inner.target, e))
    }
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("target", &self.inner.target)
            .field("prefix", &self.inner.prefix)
            .field("holder", &self.inner.holder)
            .finish()
    }
}

/// Configures a [`Locks`] client; see [`Locks::builder`].
#[must_use = "a builder does nothing until `.build()` or `.connect()`"]
#[derive(Debug, Clone)]
pub struct LocksBuilder {
    url: String,
    /// A cluster's nodes (from [`Locks::cluster`]; else read from a `redis+cluster://`
    /// URL at build).
    nodes: Option<Vec<String>>,
    /// The primary's name and the sentinels (from [`Locks::sentinel`]; else read from a
    /// `redis+sentinel://` URL at build).
    sentinel: Option<(String, Vec<String>)>,
    /// Independent masters (from [`Locks::redlock`]).
    redlock: Option<Vec<String>>,
    prefix: String,
    timeout: Duration,
    /// See [`LocksBuilder::connect_timeout`]; `None`: the default.
    connect_timeout: Option<Duration>,
    holder: Option<String>,
    notify: bool,
    yield_window: Duration,
    replicas: u32,
    #[cfg(feature = "tls")]
    tls: TlsMaterial,
}

/// Certificates for a `rediss://` URL, in PEM; never printed.
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
struct TlsMaterial {
    root_cert: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl TlsMaterial {
    /// Each PEM holds what it should: at least one certificate, and a private key.
    fn check(&self) -> std::result::Result<(), String> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = |what: &str, pem: &[u8]| {
            let n = CertificateDer::pem_slice_iter(pem)
                .map(|c| c.map_err(|e| format!("{what}: {e}")))
                .collect::<std::result::Result<Vec<_>, _>>()?
                .len();
            if n == 0 {
                return Err(format!("{what}: no PEM `CERTIFICATE` in it"));
            }
            Ok(())
        };
        if let Some(root) = &self.root_cert {
            certs("the TLS root certificate", root)?;
        }
        if let Some((cert, key)) = &self.client {
            certs("the TLS client certificate", cert)?;
            PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("the TLS client key: no PEM private key in it ({e})"))?;
        }
        Ok(())
    }
}

#[cfg(feature = "tls")]
impl TlsMaterial {
    /// The rustls configuration of a direct connection.
    fn client_config(&self) -> std::result::Result<rustls::ClientConfig, String> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        // As redis-rs does: the system's roots are loaded (and must load) even when a CA
        // is given, which then replaces them; so both paths refuse the same settings.
        let native = rustls_native_certs::load_native_certs();
        if let Some(e) = native.errors.first() {
            return Err(format!("the system's root certificates: {e}"));
        }
        let mut roots = rustls::RootCertStore::empty();
        match &self.root_cert {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    roots
                        .add(cert.map_err(|e| e.to_string())?)
                        .map_err(|e| e.to_string())?;
                }
            }
            None => {
                for cert in native.certs {
                    roots.add(cert).map_err(|e| e.to_string())?;
                }
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        match &self.client {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| e.to_string())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| e.to_string())
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

#[cfg(feature = "tls")]
impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |on: bool| if on { "<set>" } else { "<none>" };
        f.debug_struct("TlsMaterial")
            .field("root_cert", &set(self.root_cert.is_some()))
            .field("client_cert", &set(self.client.is_some()))
            .finish()
    }
}

impl LocksBuilder {
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

    /// The bound on making a connection (see [`connect_timeout`](Self::connect_timeout)).
    fn connect_bound(&self) -> Duration {
        self.connect_timeout
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
            .max(self.timeout)
    }

    /// The holder identity written into tokens after the UUID (default `host:pid`).
    pub fn holder_id(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// The CA certificate (PEM) that a `rediss://` server's certificate must chain to,
    /// instead of the system's roots: for a private CA, or a managed Redis whose CA is not in the
    /// system store. Checked when the client is built (a file with no certificate in it is
    /// an error then, not at every connection). Needs the `tls` feature, which speaks TLS
    /// 1.2 and 1.3 through rustls with the `ring` provider, installed as the process's
    /// default unless one was installed before (install yours before building a client).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = lockcore::Locks::builder("rediss://redis.internal:6380/")
    ///     .tls_root_cert(std::fs::read("/etc/redis/ca.pem")?)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// A client certificate and its private key (both PEM), for servers that
    /// authenticate clients by certificate (`tls-auth-clients yes`). Needs the `tls`
    /// feature.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = lockcore::Locks::builder("rediss://redis.internal:6380/")
    ///     .tls_root_cert(std::fs::read("/etc/redis/ca.pem")?)
    ///     .tls_client_cert(
    ///         std::fs::read("/etc/redis/client.pem")?,
    ///         std::fs::read("/etc/redis/client.key")?,
    ///     )
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Certificates from the environment, as the default client reads them (the
    /// attributes without `client = ...`, see [`crate::install`]): `REDIS_TLS_CA_FILE`
    /// (a PEM file, for [`tls_root_cert`](Self::tls_root_cert)), and `REDIS_TLS_CERT_FILE`
    /// with `REDIS_TLS_KEY_FILE` (for [`tls_client_cert`](Self::tls_client_cert)). Unset
    /// or empty variables change nothing; a file that cannot be read, or only one of the
    /// certificate and the key, is an [`Error::Backend`] of kind `Config`. Needs the `tls`
    /// feature.
    ///
    /// ```
    /// # fn main() -> Result<(), lockcore::Error> {
    /// let locks = lockcore::Locks::builder("rediss://127.0.0.1:6380/")
    ///     .tls_from_env()?
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_from_env(mut self) -> Result<Self> {
        let config_err = |detail: String| {
            Error::backend(
                &redact(&self.url),
                BackendError::new(BackendErrorKind::Config, detail),
            )
        };
        let read = |var: &str| -> Result<Option<Vec<u8>>> {
            match std::env::var_os(var) {
                Some(path) if !path.is_empty() => std::fs::read(&path).map(Some).map_err(|e| {
                    config_err(format!("cannot read {var} `{}`: {e}", path.display()))
                }),
                _ => Ok(None),
            }
        };
        let ca = read("REDIS_TLS_CA_FILE")?;
        let cert = read("REDIS_TLS_CERT_FILE")?;
        let key = read("REDIS_TLS_KEY_FILE")?;
        if let Some(ca) = ca {
            self.tls.root_cert = Some(ca);
        }
        match (cert, key) {
            (Some(cert), Some(key)) => self.tls.client = Some((cert, key)),
            (None, None) => {}
            _ => {
                return Err(config_err(
                    "REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE go together: set both or neither"
                        .into(),
                ));
            }
        }
        Ok(self)
    }

    /// The redis-rs client for the URL (and, with the `tls` feature, the certificates).
    fn redis_client(&self, url: &str) -> std::result::Result<redis::Client, String> {
        let info = self.connection_info(url)?;
        #[cfg(feature = "tls")]
        if let Some(certs) = self.tls_certificates(std::slice::from_ref(&info))? {
            return redis::Client::build_with_tls(info, certs)
                .map_err(|e| format!("invalid TLS settings: {e}"));
        }
        redis::Client::open(info).map_err(|e| format!("invalid redis url: {e}"))
    }

    /// The certificates to give redis-rs for these URLs (`None`: its defaults), once
    /// checked; installs rustls's `ring` provider when a URL is `rediss://`, unless the
    /// process installed one before (install yours before building a client).
    #[cfg(feature = "tls")]
    fn tls_certificates(
        &self,
        infos: &[redis::ConnectionInfo],
    ) -> std::result::Result<Option<redis::TlsCertificates>, String> {
        let tls = infos
            .iter()
            .any(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }));
        if tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        if self.tls.root_cert.is_none() && self.tls.client.is_none() {
            return Ok(None);
        }
        if !tls {
            return Err("TLS certificates are set but the URL is not `rediss://`".into());
        }
        self.tls.check()?;
        Ok(Some(redis::TlsCertificates {
            client_tls: self.tls.client.clone().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.tls.root_cert.clone(),
        }))
    }

    /// The backend of one server, and its redis-rs client.
    fn single(&self, url: &str) -> std::result::Result<(RedisBackend, redis::Client), String> {
        let client = self.redis_client(url)?;
        let tls = self.direct_tls(client.get_connection_info());
        let backend = RedisBackend::new(client.clone(), self.timeout, tls)
            .connect_within(self.connect_bound());
        Ok((backend, client))
    }

    /// One URL, checked: TLS only with the `tls` feature, and never `#insecure`.
    fn connection_info(&self, url: &str) -> std::result::Result<redis::ConnectionInfo, String> {
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
    fn cluster_nodes(&self) -> Option<Vec<String>> {
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
    fn cluster_builder(
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
        let timeout = self.connect_bound();
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

    /// How direct connections speak TLS: a rustls configuration like the one redis-rs
    /// makes for the URL (the given CA, else the system's roots; the client certificate
    /// if any). When it cannot be made, direct connections step aside (the multiplexed
    /// connection then reports what is wrong).
    fn direct_tls(&self, info: &redis::ConnectionInfo) -> crate::backend::direct::DirectTls {
        #[cfg(feature = "tls")]
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            let config = match self.tls.client_config() {
                Ok(config) => Some(Arc::new(config)),
                Err(e) => {
                    tracing::warn!(target: "distlock", error = %e, "direct connections step aside over TLS: their configuration cannot be made");
                    None
                }
            };
            return crate::backend::direct::DirectTls { config };
        }
        let _ = info;
        crate::backend::direct::DirectTls::default()
    }

    /// Checks the settings and returns a client that connects on first use.
    pub fn build(self) -> Result<Locks> {
        let target = redact(&self.url);
        let config_err = |detail: String| {
            Error::backend(&target, BackendError::new(BackendErrorKind::Config, detail))
        };
        if self.prefix.contains(['{', '}']) {
            return Err(config_err(format!(
                "the key prefix `{}` must not contain `{{` or `}}`",
                self.prefix
            )));
        }
        if self.timeout.is_zero() {
            return Err(config_err("the command timeout must not be zero".into()));
        }
        if self.connect_timeout.is_some_and(|t| t.is_zero()) {
            return Err(config_err("the connect timeout must not be zero".into()));
        }
        if let Some(masters) = &self.redlock {
            if masters.is_empty() {
                return Err(config_err("Redlock needs at least one master URL".into()));
            }
            if self.replicas > 0 {
                return Err(config_err(
                    "`replicas` does not apply to Redlock: its masters are independent".into(),
                ));
            }
            let nodes = masters
                .iter()
                .map(|m| self.single(m).map(|(backend, _)| backend))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(config_err)?;
            return Ok(Locks::new(
                Backend::Redlock(RedlockBackend::new(nodes)),
                None,
                self.prefix,
                self.holder,
                target.clone(),
                self.yield_window,
                self.replicas,
            ));
        }
        let sentinel = match &self.sentinel {
            Some((master, sentinels)) => {
                let node = sentinels.first().cloned().unwrap_or_default();
                Some((master.clone(), sentinels.clone(), node))
            }
            None => crate::backend::sentinel::parse_url(&self.url)
                .transpose()
                .map_err(config_err)?,
        };
        if let Some((master, sentinels, node)) = sentinel {
            let infos = sentinels
                .iter()
                .map(|s| self.connection_info(s))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(config_err)?;
            if infos.is_empty() {
                return Err(config_err(
                    "Sentinel needs at least one sentinel URL".into(),
                ));
            }
            #[cfg(feature = "tls")]
            let certs = self.tls_certificates(&infos).map_err(config_err)?;
            #[cfg(not(feature = "tls"))]
            let certs = None;
            let node = self.connection_info(&node).map_err(config_err)?;
            let primary = crate::backend::sentinel::SentinelTarget::new(
                master,
                infos,
                node.redis_settings().clone(),
                certs,
            );
            return Ok(Locks::new(
                Backend::Redis(
                    RedisBackend::sentinel(primary.clone(), self.timeout)
                        .connect_within(self.connect_bound()),
                ),
                self.notify
                    .then(|| Notifier::new(NotifySource::Sentinel(primary), self.timeout)),
                self.prefix,
                self.holder,
                target.clone(),
                self.yield_window,
                self.replicas,
            ));
        }
        let (backend, source) = match self.cluster_nodes() {
            Some(nodes) => {
                let builder = self.cluster_builder(&nodes).map_err(config_err)?;
                // No retries in redis-rs: see `backend::redis`.
                let client = builder()
                    .retries(0)
                    .build()
                    .map_err(|e| config_err(format!("invalid cluster settings: {e}")))?;
                // With the certificates: for a plain connection to a node (see
                // `RedisBackend::plain_to`).
                let base = self
                    .redis_client(&nodes[0])
                    .map_err(config_err)?
                    .get_connection_info()
                    .clone();
                let tls = self.direct_tls(&base);
                (
                    RedisBackend::cluster(client, base, self.timeout, tls)
                        .connect_within(self.connect_bound()),
                    NotifySource::Cluster(builder),
                )
            }
            None => {
                let (backend, client) = self.single(&self.url).map_err(config_err)?;
                (backend, NotifySource::Single(client))
            }
        };
        Ok(Locks::new(
            Backend::Redis(backend),
            self.notify.then(|| Notifier::new(source, self.timeout)),
            self.prefix,
            self.holder,
            target,
            self.yield_window,
            self.replicas,
        ))
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
fn redact(url: &str) -> String {
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

fn default_holder() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}:{}", std::process::id())
}

/// Tokens must not carry hash-tag braces or whitespace.
fn sanitize_holder(holder: &str) -> String {
    holder
        .chars()
        .map(|c| {
            if c == '{' || c == '}' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
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
