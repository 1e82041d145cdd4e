//! A fault-injecting TCP proxy between clients and a real redis-server: latency per
//! direction, replies held and delivered late, commands that match a pattern held on their
//! way to the server (so they arrive after commands sent later on other connections),
//! the first command that matches a pattern held (a call that fails once and works when
//! retried), replies dropped, one direction stalled, and every connection reset at once.
//!
//! The proxy runs on its own thread with its own tokio runtime, so it serves clients on any
//! test runtime (and outlives them); dropping the [`FaultProxy`] stops it and closes every
//! connection. Each accepted connection gets its own upstream connection; per direction, a
//! reader stamps each chunk with the instant it was read and a writer forwards the chunks
//! in order, no earlier than that instant plus the direction's latency and only while the
//! direction is neither stalled nor (server to client) held. The controls take effect at
//! once on all connections, current and future.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// A direction of traffic through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Client to redis-server: commands.
    ToServer,
    /// Redis-server to client: replies.
    ToClient,
}

impl Dir {
    fn index(self) -> usize {
        match self {
            Dir::ToServer => 0,
            Dir::ToClient => 1,
        }
    }
}

/// The fault settings, shared with every connection through a `watch` channel.
#[derive(Clone, Debug, Default)]
struct Controls {
    /// Per [`Dir::index`]: added to each chunk's delivery time.
    latency: [Duration; 2],
    /// Per [`Dir::index`]: nothing is written that way while set.
    stalled: [bool; 2],
    /// Replies are read but not written while set; written in order once cleared.
    hold: bool,
    /// Replies read while set are discarded.
    drop: bool,
    /// Bumped by [`FaultProxy::reset_all`]: connections accepted before are reset.
    resets: u64,
    /// Commands read in a chunk that contains these bytes wait in the proxy (and what
    /// follows them on their connection) while set; other connections go on.
    hold_matching: Option<Vec<u8>>,
    /// The first chunk to the server that contains these bytes (the flag: taken) waits
    /// in the proxy, with what follows it on its connection, while set; later ones pass.
    hold_first: Option<(Vec<u8>, Arc<AtomicBool>)>,
    /// Where connections accepted from now on go, once moved ([`FaultProxy::move_to`]).
    moved_to: Option<u16>,
}

impl Controls {
    /// Whether `chunk` going `dir` is the one [`FaultProxy::hold_first_command_containing`]
    /// holds (it is taken by this call).
    fn takes_first(&self, dir: Dir, chunk: &[u8]) -> bool {
        dir == Dir::ToServer
            && self.hold_first.as_ref().is_some_and(|(p, taken)| {
                chunk.windows(p.len()).any(|w| w == p.as_slice())
                    && !taken.swap(true, Ordering::AcqRel)
            })
    }

    /// Whether `chunk` going `dir` must wait.
    fn blocked(&self, dir: Dir, chunk: &[u8]) -> bool {
        self.stalled[dir.index()]
            || (dir == Dir::ToClient && self.hold)
            || (dir == Dir::ToServer
                && self
                    .hold_matching
                    .as_deref()
                    .is_some_and(|p| chunk.windows(p.len()).any(|w| w == p)))
    }
}

/// A TCP proxy in front of `127.0.0.1:<upstream_port>` that injects faults on command.
pub struct FaultProxy {
    port: u16,
    ctl: watch::Sender<Controls>,
    /// Live connections: id -> the `resets` count when it was accepted.
    conns: Arc<Mutex<HashMap<u64, u64>>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to the upstream
    /// port, with no faults until told otherwise.
    pub fn start(upstream_port: u16) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy port");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (ctl, ctl_rx) = watch::channel(Controls::default());
        let conns = Arc::new(Mutex::new(HashMap::new()));
        let (stop, stop_rx) = oneshot::channel();
        let thread_conns = conns.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("proxy listener");
                    tokio::select! {
                        _ = stop_rx => {}
                        _ = accept_loop(listener, upstream_port, ctl_rx, thread_conns) => {}
                    }
                });
                // Dropping the runtime drops every connection task, closing its sockets.
            })
            .expect("spawn proxy thread");
        FaultProxy {
            port,
            ctl,
            conns,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The proxied server's URL, as `testkit::app_url` makes it (the least-privilege user
    /// under `DISTLOCK_TEST_ACL`).
    pub fn url(&self) -> String {
        testkit::app_url(self.port)
    }

    /// Delays every chunk going `dir` by `d` from when the proxy read it (zero: none).
    /// Chunks already read are delivered by the new setting.
    pub fn set_latency(&self, dir: Dir, d: Duration) {
        self.ctl.send_modify(|c| c.latency[dir.index()] = d);
    }

    /// Holds replies from now on: the server runs the commands, the clients get nothing
    /// until [`release_replies`](Self::release_replies).
    pub fn hold_replies(&self) {
        self.ctl.send_modify(|c| c.hold = true);
    }

    /// Delivers the held replies, in order, and stops holding.
    pub fn release_replies(&self) {
        self.ctl.send_modify(|c| c.hold = false);
    }

    /// Holds, on their way to the server, the chunks the proxy reads that contain
    /// `pattern` (and what follows them on their connection, in order), until called with
    /// `None`; other connections go on. A command held so arrives after commands sent
    /// later on other connections, also when its client closed the connection meanwhile
    /// (cleanly, with nothing left to read). A pattern split over two reads is not seen.
    pub fn hold_commands_containing(&self, pattern: Option<&[u8]>) {
        assert!(pattern.is_none_or(|p| !p.is_empty()), "an empty pattern");
        self.ctl
            .send_modify(|c| c.hold_matching = pattern.map(<[u8]>::to_vec));
    }

    /// Holds, on its way to the server, the first chunk the proxy reads from now on that
    /// contains `pattern` (and what follows it on its connection), until
    /// [`release_first_command`](Self::release_first_command); later chunks with it pass:
    /// a call that fails once (its reply never comes in time) and works when retried.
    pub fn hold_first_command_containing(&self, pattern: &[u8]) {
        assert!(!pattern.is_empty(), "an empty pattern");
        self.ctl.send_modify(|c| {
            c.hold_first = Some((pattern.to_vec(), Arc::new(AtomicBool::new(false))));
        });
    }

    /// Whether the chunk [`hold_first_command_containing`](Self::hold_first_command_containing)
    /// waits for has been seen (and is held).
    pub fn first_command_held(&self) -> bool {
        self.ctl
            .borrow()
            .hold_first
            .as_ref()
            .is_some_and(|(_, taken)| taken.load(Ordering::Acquire))
    }

    /// Sends the chunk held by [`hold_first_command_containing`](Self::hold_first_command_containing)
    /// on (to a server that runs it, also when its client has gone), and holds no more.
    pub fn release_first_command(&self) {
        self.ctl.send_modify(|c| c.hold_first = None);
    }

    /// A distlock client through this proxy whose calls time out after `timeout`.
    pub fn locks(&self, timeout: Duration) -> distlock::Locks {
        distlock::Locks::builder(self.url())
            .command_timeout(timeout)
            .build()
            .unwrap()
    }

    /// While on, the replies the proxy reads are discarded: they are never delivered.
    pub fn drop_replies(&self, on: bool) {
        self.ctl.send_modify(|c| c.drop = on);
    }

    /// While on, nothing is forwarded `dir` (bytes wait in the proxy, in order); turned
    /// off, forwarding resumes.
    pub fn stall(&self, dir: Dir, on: bool) {
        self.ctl.send_modify(|c| c.stalled[dir.index()] = on);
    }

    /// Sends the connections accepted from now on to `127.0.0.1:<port>`; those already
    /// open stay with the old server: an endpoint name moved to a new primary after a
    /// failover, the old one keeping its clients.
    pub fn move_to(&self, port: u16) {
        self.ctl.send_modify(|c| c.moved_to = Some(port));
    }

    /// Resets every current connection, client and server side (RST where the OS allows:
    /// `SO_LINGER` zero), and returns once they are all closed. Later connections work.
    pub fn reset_all(&self) {
        let mut epoch = 0;
        self.ctl.send_modify(|c| {
            c.resets += 1;
            epoch = c.resets;
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.conns.lock().unwrap().values().any(|&e| e < epoch) {
            assert!(
                std::time::Instant::now() < deadline,
                "proxy {}: connections not reset within 5 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// How many client connections are open through the proxy now.
    pub fn connections(&self) -> usize {
        self.conns.lock().unwrap().len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream_port: u16,
    ctl: watch::Receiver<Controls>,
    conns: Arc<Mutex<HashMap<u64, u64>>>,
) {
    let next_id = AtomicU64::new(0);
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await; // e.g. out of descriptors
            continue;
        };
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let (ctl, conns) = (ctl.clone(), conns.clone());
        tokio::spawn(async move {
            // Upstream refused (server down): the client sees its connection closed.
            let upstream = ctl.borrow().moved_to.unwrap_or(upstream_port);
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                return;
            };
            let epoch = ctl.borrow().resets;
            conns.lock().unwrap().insert(id, epoch);
            serve(client, server, ctl, epoch).await;
            conns.lock().unwrap().remove(&id);
        });
    }
}

/// Forwards both ways until both sides are done, one fails, or a reset is ordered.
async fn serve(
    mut client: TcpStream,
    mut server: TcpStream,
    mut ctl: watch::Receiver<Controls>,
    epoch: u64,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let reset = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let (to_server, to_client) = (ctl.clone(), ctl.clone());
        let forward = async move {
            tokio::try_join!(
                pump(cr, sw, Dir::ToServer, to_server),
                pump(sr, cw, Dir::ToClient, to_client),
            )
        };
        tokio::select! {
            biased;
            r = ctl.wait_for(|c| c.resets != epoch) => r.is_ok(),
            _ = forward => false,
        }
    };
    if reset {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    // Both sockets close here (RST after a reset).
}

/// One direction: a reader stamps chunks, a writer delivers them in order when due.
async fn pump(
    from: ReadHalf<'_>,
    to: WriteHalf<'_>,
    dir: Dir,
    ctl: watch::Receiver<Controls>,
) -> io::Result<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::try_join!(
        read_chunks(from, dir, ctl.clone(), tx),
        write_chunks(to, dir, ctl, rx)
    )
    .map(|_| ())
}

/// Reads until EOF, queueing each chunk with the instant it was read (dropped replies are
/// not queued). Returning drops `tx`, so the writer finishes the queue and half-closes.
async fn read_chunks(
    mut from: ReadHalf<'_>,
    dir: Dir,
    ctl: watch::Receiver<Controls>,
    tx: mpsc::UnboundedSender<(Instant, Vec<u8>)>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if dir == Dir::ToClient && ctl.borrow().drop {
            continue;
        }
        let _ = tx.send((Instant::now(), buf[..n].to_vec()));
    }
}

/// Writes the queued chunks in order, each once its latency has passed and `dir` is
/// neither stalled nor held; then forwards the EOF.
async fn write_chunks(
    mut to: WriteHalf<'_>,
    dir: Dir,
    mut ctl: watch::Receiver<Controls>,
    mut rx: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
) -> io::Result<()> {
    while let Some((read_at, chunk)) = rx.recv().await {
        let latency = ctl.borrow().latency[dir.index()];
        tokio::time::sleep_until(read_at + latency).await;
        let first = ctl.borrow().takes_first(dir, &chunk);
        if first && ctl.wait_for(|c| c.hold_first.is_none()).await.is_err() {
            return Ok(()); // the proxy is stopping
        }
        if ctl.wait_for(|c| !c.blocked(dir, &chunk)).await.is_err() {
            return Ok(()); // the proxy is stopping
        }
        to.write_all(&chunk).await?;
    }
    to.shutdown().await
}
