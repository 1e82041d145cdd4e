//! The three implementations behind one interface: distlock, the raw redis-rs baseline,
//! and raw redis-rs sending distlock's own scripts.
#![allow(clippy::wildcard_imports)]
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::*;

// ---------------------------------------------------------------------------------------
// The implementations behind one interface
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Distlock,
    Raw,
    /// Diagnostic, W1/W2 only: raw redis-rs sending distlock's own Lua scripts (same
    /// keys and arguments), so the gap to `Raw` is the server's and the gap to
    /// `Distlock` is distlock's client-side cost.
    RawLua,
    /// Diagnostic, W3 only: the floor of distlock's design on this machine. A fair (FIFO)
    /// `tokio::sync::Mutex` stands for the local queue, one PING for the acquire and one
    /// for the release: the same wake-ups and round trips, no lock logic at all.
    Floor,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Distlock => "distlock",
            Kind::Raw => "raw",
            Kind::RawLua => "raw+lua",
            Kind::Floor => "floor",
        }
    }

    pub(crate) fn parse(s: &str) -> Kind {
        match s {
            "distlock" => Kind::Distlock,
            "raw" => Kind::Raw,
            other => panic!("unknown implementation `{other}`"),
        }
    }
}

pub(crate) enum Client {
    Distlock(distlock::Locks),
    Raw {
        conn: RawConn,
        release: redis::Script,
    },
    RawLua {
        conn: RawConn,
        release: redis::Script,
    },
    Floor {
        conn: MultiplexedConnection,
        queue: Arc<tokio::sync::Mutex<()>>,
    },
}

pub(crate) enum Held {
    Distlock(distlock::LockGuard),
    Raw { key: String, token: String },
    Floor(tokio::sync::OwnedMutexGuard<()>),
}

/// distlock's uncontended scripts, sent by hand (its free-key acquire is a plain
/// `SET NX PX GET`).
pub(crate) const LUA_UNLOCK: &str = distlock::__private::scripts::UNLOCK;

#[derive(Debug)]
pub(crate) enum AcqError {
    /// Still held by someone else when the wait ran out.
    Busy,
    Failed(String),
}

impl Client {
    pub(crate) async fn connect(kind: Kind, url: &str) -> Client {
        match kind {
            Kind::Distlock => Client::Distlock(
                distlock::Locks::connect(url)
                    .await
                    .expect("distlock connects"),
            ),
            Kind::Raw | Kind::RawLua => {
                Client::raw(kind, RawConn::Single(raw_connection(url).await)).await
            }
            Kind::Floor => Client::Floor {
                conn: raw_connection(url).await,
                queue: Arc::default(),
            },
        }
    }

    /// [`connect`](Self::connect) to a Redis Cluster (W1, W2 and W3 only): distlock with
    /// [`distlock::Locks::cluster`], the baselines over a redis-rs cluster connection.
    pub(crate) async fn connect_cluster(kind: Kind, urls: &[String]) -> Client {
        match kind {
            Kind::Distlock => Client::Distlock(
                distlock::Locks::cluster(urls)
                    .connect()
                    .await
                    .expect("distlock connects to the cluster"),
            ),
            Kind::Raw | Kind::RawLua => {
                let conn = redis::cluster::ClusterClient::new(urls.to_vec())
                    .expect("cluster urls")
                    .get_async_connection()
                    .await
                    .expect("the cluster connects");
                Client::raw(kind, RawConn::Cluster(conn)).await
            }
            Kind::Floor => unreachable!("the floor runs on one server"),
        }
    }

    /// A baseline over `conn`, its release script loaded.
    async fn raw(kind: Kind, mut conn: RawConn) -> Client {
        let release = redis::Script::new(if kind == Kind::Raw {
            RAW_RELEASE
        } else {
            LUA_UNLOCK
        });
        release
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .expect("SCRIPT LOAD");
        if kind == Kind::Raw {
            Client::Raw { conn, release }
        } else {
            Client::RawLua { conn, release }
        }
    }

    /// [`connect`](Self::connect) over TLS (`rediss://`, trusting `files`' CA).
    #[cfg(feature = "tls")]
    pub(crate) async fn connect_tls(kind: Kind, files: &testkit::TlsFiles) -> Client {
        let raw = || async {
            redis::Client::build_with_tls(
                files.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(files.ca.clone()),
                },
            )
            .expect("TLS client")
            .get_multiplexed_async_connection()
            .await
            .expect("redis connects over TLS")
        };
        match kind {
            Kind::Distlock => Client::Distlock(
                distlock::Locks::builder(files.url())
                    .tls_root_cert(files.ca.clone())
                    .connect()
                    .await
                    .expect("distlock connects over TLS"),
            ),
            Kind::Raw | Kind::RawLua => Client::raw(kind, RawConn::Single(raw().await)).await,
            Kind::Floor => unreachable!("W1 over TLS runs distlock, raw and raw+lua"),
        }
    }

    pub(crate) async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, AcqError> {
        match self {
            Client::Distlock(locks) => match locks.lock(key).ttl(TTL).wait(wait).acquire().await {
                Ok(guard) => Ok(Held::Distlock(guard)),
                Err(distlock::Error::Busy { .. }) => Err(AcqError::Busy),
                Err(e) => Err(AcqError::Failed(e.to_string())),
            },
            Client::Raw { conn, .. } => {
                let mut conn = conn.clone();
                let token = raw_token();
                let deadline = Instant::now() + wait;
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| AcqError::Failed(e.to_string()))?;
                    if set.is_some() {
                        return Ok(Held::Raw {
                            key: key.to_owned(),
                            token,
                        });
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(AcqError::Busy);
                    }
                    tokio::time::sleep_until((now + POLL).min(deadline)).await;
                }
            }
            Client::RawLua { conn, .. } => {
                let mut conn = conn.clone();
                let key = format!("lua:{key}");
                let token = raw_token();
                let found: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .arg("GET")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| AcqError::Failed(e.to_string()))?;
                match found {
                    None => Ok(Held::Raw { key, token }),
                    Some(_) => Err(AcqError::Busy), // uncontended workloads only: no waiting
                }
            }
            Client::Floor { conn, queue } => {
                let turn = queue.clone().lock_owned().await;
                ping_once(conn).await.map_err(AcqError::Failed)?;
                Ok(Held::Floor(turn))
            }
        }
    }

    pub(crate) async fn release(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Client::Distlock(_), Held::Distlock(guard)) => {
                guard.release().await.map_err(|e| e.to_string())
            }
            // The baseline's compare-and-delete, or raw+lua's `unlock.lua` (what distlock
            // sends for an uncontended release): one key, one token, 1 when deleted.
            (
                Client::Raw { conn, release } | Client::RawLua { conn, release },
                Held::Raw { key, token },
            ) => {
                let released: i64 = release
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                if released == 1 {
                    Ok(())
                } else {
                    Err(format!("{key}: lost"))
                }
            }
            (Client::Floor { conn, .. }, Held::Floor(turn)) => {
                let pinged = ping_once(conn).await;
                drop(turn);
                pinged
            }
            _ => unreachable!("a guard released through the other implementation"),
        }
    }

    /// The fencing token of a held lock: distlock's `fence()`, the baseline's `INCR` of
    /// `{key}:fence`, raw+lua's `fence.lua` as distlock sends it.
    pub(crate) async fn fence(&self, held: &Held) -> Result<u64, String> {
        match (self, held) {
            (Client::Distlock(_), Held::Distlock(guard)) => {
                guard.fence().await.map_err(|e| e.to_string())
            }
            (Client::Raw { conn, .. }, Held::Raw { key, .. }) => redis::cmd("INCR")
                .arg(format!("{{{key}}}:fence"))
                .query_async(&mut conn.clone())
                .await
                .map_err(|e| e.to_string()),
            (Client::RawLua { conn, .. }, Held::Raw { key, token }) => {
                static FENCE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
                    redis::Script::new(distlock::__private::scripts::FENCE)
                });
                let fence: Option<u64> = FENCE
                    .key(key)
                    .key(format!("{{{key}}}:fence"))
                    .arg(token)
                    .arg(distlock::DEFAULT_FENCE_IDLE_WINDOW.as_millis() as u64)
                    .invoke_async(&mut conn.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                fence.ok_or_else(|| format!("{key}: lost"))
            }
            _ => Err("no fence here".into()),
        }
    }

    /// Gets connections and scripts ready before timing: a few pairs, then one wait
    /// behind a second client holding `key` (for distlock, the wait opens the client's
    /// shared Pub/Sub connection, which it keeps).
    pub(crate) async fn warm_up(self: &Arc<Self>, kind: Kind, url: &str, key: &str) {
        for _ in 0..3 {
            let h = self.acquire(key, WAIT).await.expect("warm-up acquire");
            self.release(h).await.expect("warm-up release");
        }
        let other = Client::connect(kind, url).await;
        let held = other.acquire(key, WAIT).await.expect("warm-up acquire");
        let (me, k) = (self.clone(), key.to_owned());
        let waiter = tokio::spawn(async move {
            let h = me
                .acquire(&k, Duration::from_secs(2))
                .await
                .expect("warm-up wait");
            me.release(h).await.expect("warm-up release");
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        other.release(held).await.expect("warm-up release");
        waiter.await.expect("warm-up waiter");
    }
}

pub(crate) async fn ping_once(conn: &MultiplexedConnection) -> Result<(), String> {
    redis::cmd("PING")
        .query_async::<String>(&mut conn.clone())
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A token unique to this acquisition: a per-process random seed hashing a counter.
pub(crate) fn raw_token() -> String {
    static SEED: std::sync::LazyLock<RandomState> = std::sync::LazyLock::new(RandomState::new);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:016x}{:016x}:{}",
        SEED.hash_one((n, 0u8)),
        SEED.hash_one((n, 1u8)),
        std::process::id()
    )
}

/// The baselines' connection: to one server, or to a cluster.
#[derive(Clone)]
pub(crate) enum RawConn {
    Single(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for RawConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            RawConn::Single(c) => c.req_packed_command(cmd),
            RawConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            RawConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RawConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

pub(crate) async fn raw_connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connects")
}
