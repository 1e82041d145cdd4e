//! Redis behind Sentinel: the primary's address is asked of the sentinels whenever a
//! connection is made, and asked again after a connection error, a `READONLY` reply (the
//! server was demoted), or a `+switch-master` message for this primary (a listener task
//! per client, subscribed on one of the sentinels). Each of these drops the connections
//! made before (see [`SentinelTarget::switched`]), so the next call connects to the
//! primary the sentinels name now.
//!
//! A resolution asks every sentinel at once (`SENTINEL get-master-addr-by-name`, on
//! connections of its own: a client of ours is used from many runtimes) and takes the
//! first address whose server says it is a primary (`ROLE`). `ROLE` is `@dangerous`: a
//! least-privilege user (`+@all -@dangerous`) is refused it, and then the sentinels are
//! trusted; a server they name that was demoted since answers writes with `READONLY`,
//! which drops the connection and looks the primary up again (see `redis::policy`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a `+switch-master` outweighs a sentinel that names another primary: long
/// enough for the sentinels to agree, short enough that a later switch the listener
/// missed is not refused for good.
const ANNOUNCED_FOR: Duration = Duration::from_secs(5);

use futures_util::StreamExt;
use redis::IntoConnectionInfo as _;

/// Certificates for TLS sentinels and primaries (with the `tls` feature; without it no
/// TLS address gets this far).
#[cfg(feature = "tls")]
pub(crate) type Certificates = redis::TlsCertificates;
#[cfg(not(feature = "tls"))]
pub(crate) type Certificates = ();

use crate::error::BackendError;

/// The sentinels, the primary's name, and what is known of the primary now.
pub(crate) struct SentinelTarget {
    master: String,
    sentinels: Vec<redis::ConnectionInfo>,
    /// Credentials and database for the primary.
    node: redis::RedisConnectionInfo,
    /// Whether the sentinels (and so the primary) speak TLS (`rediss://` sentinels).
    tls: bool,
    /// The certificates for both, where given (`None`: the system's roots).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    certs: Option<Certificates>,
    /// Bumped on every `+switch-master` for this primary.
    switched: AtomicU64,
    /// Whether a listener task runs.
    listening: AtomicBool,
    /// The primary last found.
    current: Mutex<Option<redis::Client>>,
    /// The address of the last `+switch-master` for this primary, and when it came: for
    /// [`ANNOUNCED_FOR`] after it, a sentinel that has not caught up yet and names another
    /// is not believed.
    announced: Mutex<Option<(String, u16, Instant)>>,
}

impl SentinelTarget {
    pub(crate) fn new(
        master: String,
        sentinels: Vec<redis::ConnectionInfo>,
        node: redis::RedisConnectionInfo,
        certs: Option<Certificates>,
    ) -> Arc<SentinelTarget> {
        let tls = sentinels
            .iter()
            .any(|s| !matches!(s.addr(), redis::ConnectionAddr::Tcp(..)));
        Arc::new(SentinelTarget {
            master,
            sentinels,
            node,
            tls,
            certs,
            switched: AtomicU64::new(0),
            listening: AtomicBool::new(false),
            current: Mutex::new(None),
            announced: Mutex::new(None),
        })
    }

    /// The primary last found, if any.
    pub(crate) fn current_primary(&self) -> Option<redis::Client> {
        crate::util::lock(&self.current).clone()
    }

    /// How many times the sentinels announced a new primary since this client began.
    pub(crate) fn switched(&self) -> u64 {
        self.switched.load(Ordering::Acquire)
    }

    /// The primary the sentinels name now (which also answered `ROLE` as a primary, where
    /// the user may ask), within `timeout`.
    pub(crate) async fn primary(&self, timeout: Duration) -> Result<redis::Client, BackendError> {
        let client = match tokio::time::timeout(timeout, self.find_primary()).await {
            Ok(found) => found?,
            Err(_) => return Err(BackendError::timeout(timeout)),
        };
        let announced = crate::util::lock(&self.announced).clone();
        if let Some((host, port, _)) = announced.filter(|(_, _, at)| at.elapsed() < ANNOUNCED_FOR) {
            let named = address(&client);
            if named
                .as_ref()
                .is_some_and(|(h, p)| *h != host || *p != port)
            {
                return Err(BackendError::new(
                    crate::error::BackendErrorKind::Connection,
                    format!(
                        "a sentinel names {named:?} as the primary, the last switch announced {host}:{port}: not caught up yet"
                    ),
                ));
            }
        }
        *crate::util::lock(&self.current) = Some(client.clone());
        Ok(client)
    }

    /// Every sentinel asked at once; the first address named whose server does not deny
    /// being the primary, else the most telling failure (a server named that is not a
    /// primary, then a sentinel's error).
    async fn find_primary(&self) -> Result<redis::Client, BackendError> {
        let mut asks: futures_util::stream::FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|info| self.ask(info.clone()))
            .collect();
        let mut failed: Option<BackendError> = None;
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(client) => return Ok(client),
                Err((e, named)) => {
                    if named || failed.is_none() {
                        failed = Some(e);
                    }
                }
            }
        }
        Err(failed.unwrap_or_else(|| {
            BackendError::new(
                crate::error::BackendErrorKind::Connection,
                "no sentinel to ask for the primary",
            )
        }))
    }

    /// One sentinel's primary, checked with `ROLE`; an error says whether the sentinel
    /// named one (`true`: its server is not a primary, or could not be reached).
    async fn ask(
        &self,
        info: redis::ConnectionInfo,
    ) -> Result<redis::Client, (BackendError, bool)> {
        let unnamed = |e: BackendError| (e, false);
        let sentinel = self.sentinel_client(info).map_err(|e| unnamed(e.into()))?;
        let mut conn = sentinel
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| unnamed(e.into()))?;
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async(&mut conn)
            .await
            .map_err(|e| unnamed(e.into()))?;
        let Some((host, port)) = named else {
            return Err(unnamed(BackendError::new(
                crate::error::BackendErrorKind::Connection,
                format!("a sentinel knows no primary named {:?}", self.master),
            )));
        };
        let client = self.node_client(host, port).map_err(|e| (e, true))?;
        match is_primary(&client).await {
            Ok(true) => Ok(client),
            Ok(false) => Err((
                BackendError::new(
                    crate::error::BackendErrorKind::Connection,
                    format!(
                        "{:?}, which a sentinel names as the primary, is not one (a failover under way)",
                        address(&client)
                    ),
                ),
                true,
            )),
            Err(e) => Err((e, true)),
        }
    }

    /// A client for the server at `host:port` with the primary's credentials and database,
    /// over TLS when the sentinels speak it (with the certificates where given).
    fn node_client(&self, host: String, port: u16) -> Result<redis::Client, BackendError> {
        let addr = match self.tls {
            true => redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            },
            false => redis::ConnectionAddr::Tcp(host, port),
        };
        let info = addr
            .into_connection_info()?
            .set_redis_settings(self.node.clone());
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return Ok(redis::Client::build_with_tls(info, certs.clone())?);
        }
        Ok(redis::Client::open(info)?)
    }

    /// A client for one sentinel, for the listener.
    fn sentinel_client(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return redis::Client::build_with_tls(info, certs.clone());
        }
        redis::Client::open(info)
    }

    /// The primary last found, else found now.
    pub(crate) async fn current(&self, timeout: Duration) -> Result<redis::Client, BackendError> {
        let known = crate::util::lock(&self.current).clone();
        match known {
            Some(client) => Ok(client),
            None => self.primary(timeout).await,
        }
    }

    /// Starts the `+switch-master` listener on this runtime unless one runs.
    pub(crate) fn listen(self: &Arc<Self>) {
        if self.listening.load(Ordering::Acquire) || self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        // Made before the task: a task dropped before it first runs (its runtime shutting
        // down) clears `listening` too.
        let guard = Listening(weak.clone());
        if !crate::util::spawn_here(async move {
            let _listening = guard;
            listen(weak).await;
        }) {
            self.listening.store(false, Ordering::Release);
        }
    }
}

/// Clears `listening` when the listener ends (its runtime shut down, or the client was
/// dropped), so that the next connection starts another.
struct Listening(Weak<SentinelTarget>);

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some(target) = self.0.upgrade() {
            target.listening.store(false, Ordering::Release);
        }
    }
}

/// Subscribes to `+switch-master` on the first sentinel that answers and counts the
/// messages naming this primary; on to the next sentinel when the connection ends. Ends
/// once the client is gone.
async fn listen(weak: Weak<SentinelTarget>) {
    let mut check = tokio::time::interval(Duration::from_secs(1));
    let mut subscribed_before = false;
    loop {
        let Some(target) = weak.upgrade() else { return };
        let clients: Vec<redis::Client> = target
            .sentinels
            .iter()
            .filter_map(|info| target.sentinel_client(info.clone()).ok())
            .collect();
        let master = target.master.clone();
        drop(target);
        for client in clients {
            let connect = tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub());
            let Ok(Ok(mut pubsub)) = connect.await else {
                continue;
            };
            if pubsub.subscribe("+switch-master").await.is_err() {
                continue;
            }
            if std::mem::replace(&mut subscribed_before, true) {
                // A switch announced while no sentinel was listened to would be missed:
                // connect again, unless the sentinels still name the primary connected to.
                let Some(target) = weak.upgrade() else { return };
                let known = crate::util::lock(&target.current)
                    .as_ref()
                    .and_then(address);
                let named = target
                    .primary(Duration::from_secs(2))
                    .await
                    .ok()
                    .as_ref()
                    .and_then(address);
                if known.is_none() || named != known {
                    target.switched.fetch_add(1, Ordering::AcqRel);
                }
            }
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    msg = messages.next() => match msg {
                        Some(msg) => {
                            let payload: String = msg.get_payload().unwrap_or_default();
                            let fields: Vec<&str> = payload.split(' ').collect();
                            if fields.first() == Some(&master.as_str()) {
                                let Some(target) = weak.upgrade() else { return };
                                if let (Some(host), Some(Ok(port))) =
                                    (fields.get(3), fields.get(4).map(|p| p.parse::<u16>()))
                                {
                                    *crate::util::lock(&target.announced) =
                                        Some(((*host).to_owned(), port, Instant::now()));
                                }
                                target.switched.fetch_add(1, Ordering::AcqRel);
                                tracing::debug!(target: "distlock", %payload, "sentinel announced a new primary");
                            }
                        }
                        None => break,
                    },
                    _ = check.tick() => if weak.strong_count() == 0 {
                        return;
                    },
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether the server `client` reaches says it is a primary (`ROLE`). A user not allowed
/// `ROLE` (`-@dangerous`), or a server without it, gets `true`: the sentinels are
/// trusted, and a demoted server is left at its first `READONLY`.
async fn is_primary(client: &redis::Client) -> Result<bool, BackendError> {
    let mut conn = client.get_multiplexed_async_connection().await?;
    let role: redis::RedisResult<Vec<redis::Value>> =
        redis::cmd("ROLE").query_async(&mut conn).await;
    match role {
        Ok(fields) => Ok(fields
            .first()
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            .is_some_and(|r| r == "master")),
        Err(e) if crate::error::capability_missing(&e) => {
            tracing::debug!(target: "distlock", error = %e, "ROLE refused: the sentinels' answer is trusted");
            Ok(true)
        }
        Err(e) => Err(e.into()),
    }
}

/// The host and port a client connects to (TCP or TLS).
fn address(client: &redis::Client) -> Option<(String, u16)> {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port)),
        #[cfg(feature = "tls")]
        redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// The primary's name, the sentinels' URLs, and a URL with the primary's credentials.
pub(crate) type SentinelUrl = (String, Vec<String>, String);

/// The primary's name and the sentinels of a `redis+sentinel://s1:26379,s2:26379/<name>[/<db>]`
/// URL (`rediss+sentinel://` for TLS); the URL's credentials and database are the
/// primary's.
pub(crate) fn parse_url(url: &str) -> Option<Result<SentinelUrl, String>> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let plain = scheme.strip_suffix("+sentinel")?;
    if plain != "redis" && plain != "rediss" {
        return Some(Err(format!("`{scheme}://` is not a Sentinel URL form")));
    }
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (format!("{auth}@"), rest),
        None => (String::new(), rest),
    };
    let mut parts = rest.splitn(3, '/');
    let hosts = parts.next().unwrap_or("");
    let Some(master) = parts.next().filter(|m| !m.is_empty()) else {
        return Some(Err(
            "a `redis+sentinel://` URL names the primary: redis+sentinel://host:26379/<name>"
                .into(),
        ));
    };
    let db = parts.next().unwrap_or("");
    let sentinels = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{plain}://{h}/"))
        .collect();
    Some(Ok((
        master.to_owned(),
        sentinels,
        format!("{plain}://{auth}primary/{db}"),
    )))
}

impl crate::notify::Primary for SentinelTarget {
    fn switched(&self) -> u64 {
        SentinelTarget::switched(self)
    }

    fn find(
        &self,
        timeout: Duration,
    ) -> futures_util::future::BoxFuture<'_, Option<redis::Client>> {
        Box::pin(async move { self.primary(timeout).await.ok() })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn sentinel_urls() {
        let (master, sentinels, node) =
            parse_url("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/2")
                .unwrap()
                .unwrap();
        assert_eq!(master, "mymaster");
        assert_eq!(sentinels, ["redis://s1:26379/", "redis://s2:26380/"]);
        assert_eq!(node, "redis://:pw@primary/2");
        assert!(parse_url("redis+sentinel://s1:26379").unwrap().is_err());
        let (_, sentinels, node) = parse_url("rediss+sentinel://s1:26379/m").unwrap().unwrap();
        assert_eq!(sentinels, ["rediss://s1:26379/"]);
        assert_eq!(node, "rediss://primary/");
        assert!(parse_url("valkey+sentinel://s1:26379/m").unwrap().is_err());
        assert!(parse_url("redis://s1:6379/").is_none());
    }
}
