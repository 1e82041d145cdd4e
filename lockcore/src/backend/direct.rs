//! Direct connections: a plain RESP2 connection used by one call at a time, whose
//! caller writes the command and reads the reply itself.
//!
//! The multiplexed connection passes every command through a driver task (caller to
//! driver, driver to socket, socket to driver, driver to caller: two task wake-ups per
//! command). A lock taken and released by one task at a time is latency-bound, so the
//! hot scripts go over a small pool of direct connections instead, and fall back to the
//! multiplexed connection when every direct one is busy. A direct connection is owned by
//! the call using it: a call that times out or is cancelled drops it (the socket
//! closes), so a half-read reply can never be read by the next call.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use redis::aio::ConnectionLike;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisFuture, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The name a direct connection gives itself (`CLIENT SETNAME`).
pub(crate) const CLIENT_NAME: &str = "distlock-direct";

/// A place among a client's direct connections, taken before connecting and given
/// back when the connection (or the attempt) is dropped.
pub(crate) struct Place(Arc<AtomicUsize>);

impl Place {
    /// Takes a place while fewer than `max` are taken.
    pub(crate) fn take(live: &Arc<AtomicUsize>, max: usize) -> Option<Place> {
        live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| Place(Arc::clone(live)))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One direct connection, holding its place in the client's pool.
pub(crate) struct Direct {
    stream: Stream,
    /// Bytes read and not yet parsed.
    read: Vec<u8>,
    /// The packed command being written.
    write: Vec<u8>,
    db: i64,
    runtime: tokio::runtime::Id,
    /// What the connection learnt of the server's identity when opened, until its first
    /// user takes it: `Some(None)` when the `run_id` could not be read (`INFO` refused).
    run_id: Option<Option<String>>,
    /// The address it was opened to (`host:port`, or a socket path).
    addr: String,
    /// When it last went idle (back into the pool).
    idle_since: std::time::Instant,
    _place: Place,
}

pub(crate) enum Stream {
    Tcp(tokio::net::TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

/// What every kind of [`Stream`] is.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

impl Stream {
    /// The socket, whichever kind it is.
    fn io(&mut self) -> &mut dyn Io {
        match self {
            Stream::Tcp(s) => s,
            #[cfg(unix)]
            Stream::Unix(s) => s,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.as_mut(),
        }
    }

    /// A TCP (TLS with `tls`'s configuration) or Unix socket connection to the server
    /// `info` names. Only for addresses direct connections [serve](Direct::serves).
    /// `nodelay`: TCP without Nagle's delay (a direct connection writes one whole request
    /// and waits for its reply; the multiplexed one keeps redis-rs's default, off, which
    /// lets many small writes under load share packets).
    pub(crate) async fn connect(
        info: &ConnectionInfo,
        tls: &DirectTls,
        nodelay: bool,
    ) -> io::Result<Stream> {
        let _ = tls;
        Ok(match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let tcp = tcp_connect(host, *port).await?;
                tuned(&tcp, nodelay)?;
                Stream::Tcp(tcp)
            }
            #[cfg(feature = "tls")]
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                ..
            } => {
                let Some(config) = &tls.config else {
                    return Err(io::Error::from(io::ErrorKind::Unsupported));
                };
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let tcp = tcp_connect(host, *port).await?;
                tuned(&tcp, nodelay)?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await?;
                Stream::Tls(Box::new(tls))
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                Stream::Unix(tokio::net::UnixStream::connect(path).await?)
            }
            _ => return Err(io::Error::from(io::ErrorKind::Unsupported)),
        })
    }
}

/// A TCP connection to `host`: to each of its addresses at once, the first to answer
/// kept (as redis-rs connects), so an address that does not answer (a broken IPv6 route)
/// costs nothing while another does.
async fn tcp_connect(host: &str, port: u16) -> io::Result<tokio::net::TcpStream> {
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    match addrs.as_slice() {
        [] => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host} has no address"),
        )),
        [one] => tokio::net::TcpStream::connect(one).await,
        many => {
            let tries = many
                .iter()
                .map(|a| Box::pin(tokio::net::TcpStream::connect(*a)));
            futures_util::future::select_ok(tries)
                .await
                .map(|(tcp, _)| tcp)
        }
    }
}

/// `TCP_NODELAY` as asked, and TCP keepalive probes after 30 s idle, every 10 s: they keep
/// firewalls, NATs and load balancers from cutting an idle connection silently, and find
/// a peer that went away without a word (then the socket reports an error, and the
/// connection is not used again) instead of a call waiting out its timeout on it.
fn tuned(tcp: &tokio::net::TcpStream, nodelay: bool) -> io::Result<()> {
    use redis::io::tcp::socket2::{SockRef, TcpKeepalive};
    tcp.set_nodelay(nodelay)?;
    let keepalive = TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(30))
        .with_interval(std::time::Duration::from_secs(10));
    SockRef::from(tcp).set_tcp_keepalive(&keepalive)
}

/// A multiplexed connection's socket that says when it closed: its end of stream or an
/// error, read or written, sets `closed`. The client then stops handing calls to a
/// connection the server (its idle `timeout`, `CLIENT KILL`, a restart) or the network
/// closed while it was idle, and connects again instead of failing them.
pub(crate) struct Watched {
    pub(crate) stream: Stream,
    pub(crate) closed: Arc<AtomicBool>,
}

impl Watched {
    fn saw<T>(&self, polled: &std::task::Poll<io::Result<T>>) {
        if matches!(polled, std::task::Poll::Ready(Err(_))) {
            self.closed.store(true, Ordering::Release);
        }
    }
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(this.stream.io()).poll_read(cx, buf);
        this.saw(&polled);
        let ended = matches!(polled, std::task::Poll::Ready(Ok(())))
            && buf.filled().len() == before
            && buf.remaining() > 0;
        if ended {
            this.closed.store(true, Ordering::Release);
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(this.stream.io()).poll_write(cx, data);
        this.saw(&polled);
        polled
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(this.stream.io()).poll_flush(cx);
        this.saw(&polled);
        polled
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        this.closed.store(true, Ordering::Release);
        std::pin::Pin::new(this.stream.io()).poll_shutdown(cx)
    }
}

/// How direct connections speak TLS (`rediss://`): the rustls configuration made from
/// the client's certificates, as redis-rs makes its own (the given CA, else the
/// system's roots; the client certificate if any). None: they step aside over TLS.
#[derive(Clone, Default)]
pub(crate) struct DirectTls {
    #[cfg(feature = "tls")]
    pub(crate) config: Option<Arc<rustls::ClientConfig>>,
}

impl Direct {
    /// Whether direct connections can serve `info`'s address (plain TCP, a unix socket,
    /// or TLS with `tls`'s configuration; never `#insecure`).
    pub(crate) fn serves(info: &ConnectionInfo, tls: &DirectTls) -> bool {
        let _ = tls;
        match info.addr() {
            ConnectionAddr::Tcp(..) => true,
            #[cfg(unix)]
            ConnectionAddr::Unix(_) => true,
            #[cfg(feature = "tls")]
            ConnectionAddr::TcpTls {
                insecure: false, ..
            } => tls.config.is_some(),
            _ => false,
        }
    }

    /// Opens a direct connection on the current runtime, authenticated and on the
    /// configured database. Only for addresses it [`serves`](Self::serves).
    pub(crate) async fn open(
        info: &ConnectionInfo,
        tls: &DirectTls,
        runtime: tokio::runtime::Id,
        place: Place,
    ) -> Result<Direct, RedisError> {
        let stream = Stream::connect(info, tls, true).await?;
        let settings = info.redis_settings();
        let mut conn = Direct {
            stream,
            read: Vec::with_capacity(256),
            write: Vec::with_capacity(256),
            db: settings.db(),
            runtime,
            run_id: None,
            addr: info.addr().to_string(),
            idle_since: std::time::Instant::now(),
            _place: place,
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password).exec_async(&mut conn).await?;
        }
        if settings.db() != 0 {
            redis::cmd("SELECT")
                .arg(settings.db())
                .exec_async(&mut conn)
                .await?;
        }
        // Named for operators (`CLIENT LIST`); an ACL that forbids it is no reason to fail.
        match redis::cmd("CLIENT")
            .arg(&["SETNAME", CLIENT_NAME])
            .exec_async(&mut conn)
            .await
        {
            Err(e) if !matches!(e.kind(), redis::ErrorKind::Server(_)) => return Err(e),
            _ => {}
        }
        let info: Option<String> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok();
        conn.run_id = Some(
            info.as_deref()
                .and_then(super::native::run_id)
                .map(str::to_owned),
        );
        Ok(conn)
    }

    /// For the first call that uses the connection only (it was opened in the
    /// background): `Some` with the `run_id` of the server at the other end, `None`
    /// inside when it could not be read.
    pub(crate) fn take_run_id(&mut self) -> Option<Option<String>> {
        self.run_id.take()
    }

    /// The address it was opened to.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// Marks it idle from now (it goes back into the pool).
    pub(crate) fn went_idle(&mut self) {
        self.idle_since = std::time::Instant::now();
    }

    /// How long it has been idle, if it is.
    pub(crate) fn idle_for(&self) -> std::time::Duration {
        self.idle_since.elapsed()
    }

    /// The runtime whose reactor drives this connection's socket.
    pub(crate) fn runtime(&self) -> tokio::runtime::Id {
        self.runtime
    }

    /// Whether the connection, idle in the pool, was closed (by Redis's idle `timeout`,
    /// a restart, or the network) or has bytes nobody asked for: unusable either way.
    /// Costs no system call unless the reactor has seen the socket become readable.
    pub(crate) fn is_broken(&self) -> bool {
        let mut byte = [0u8; 1];
        let read = match &self.stream {
            Stream::Tcp(s) => s.try_read(&mut byte),
            #[cfg(unix)]
            Stream::Unix(s) => s.try_read(&mut byte),
            // Bytes may not be read from under TLS: whether the socket became readable
            // (a close, or anything else Redis sent unasked) says it as well, and so does
            // rustls holding something already read (plaintext, or a close_notify).
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                let (tcp, session) = s.get_ref();
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                return !session.wants_read() || tcp.poll_read_ready(&mut cx).is_ready();
            }
        };
        !matches!(read, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Writes `self.write`, then reads `skip + count` replies and returns the last `count`.
    async fn exchange(&mut self, skip: usize, count: usize) -> Result<Vec<Value>, RedisError> {
        let io = self.stream.io();
        io.write_all(&self.write).await?;
        // TLS holds written bytes until flushed (a socket's flush does nothing).
        io.flush().await?;
        let mut replies = Vec::with_capacity(count);
        for i in 0..skip + count {
            let value = self.reply().await?;
            if i >= skip {
                replies.push(value);
            }
        }
        if !self.read.is_empty() {
            return Err(protocol_error("more replies than commands"));
        }
        Ok(replies)
    }

    /// Reads one complete reply.
    async fn reply(&mut self) -> Result<Value, RedisError> {
        loop {
            if let Some(end) = reply_end(&self.read, 0)? {
                let value = redis::parse_redis_value(&self.read[..end]);
                self.read.drain(..end);
                return value;
            }
            let n = self.stream.io().read_buf(&mut self.read).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "redis closed the connection",
                )
                .into());
            }
        }
    }
}

impl ConnectionLike for Direct {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.write.clear();
            cmd.write_packed_command(&mut self.write);
            let mut replies = self.exchange(0, 1).await?;
            Ok(replies.pop().unwrap_or(Value::Nil))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.write = pipeline.get_packed_pipeline();
            self.exchange(offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

fn protocol_error(what: &'static str) -> RedisError {
    io::Error::new(io::ErrorKind::InvalidData, what).into()
}

/// Where the RESP2 reply starting at `at` ends: `Ok(None)` while incomplete. An array's
/// header only adds its length to the replies still to read, so nesting needs no call
/// stack.
fn reply_end(buf: &[u8], mut at: usize) -> Result<Option<usize>, RedisError> {
    // Replies still to read: the one asked for, then each array's elements.
    let mut left: u64 = 1;
    while left > 0 {
        let Some(kind) = buf.get(at) else {
            return Ok(None);
        };
        let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line_end = at + eol + 2;
        let number = || -> Result<i64, RedisError> {
            std::str::from_utf8(&buf[at + 1..at + eol])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol_error("bad length in a reply"))
        };
        left -= 1;
        at = match kind {
            b'+' | b'-' | b':' => line_end,
            b'$' => match usize::try_from(number()?) {
                // `$-1`: no value.
                Err(_) => line_end,
                Ok(len) => match line_end.checked_add(len).and_then(|e| e.checked_add(2)) {
                    Some(end) if end <= buf.len() => end,
                    _ => return Ok(None),
                },
            },
            b'*' => {
                // `*-1`: no array.
                left = left.saturating_add(u64::try_from(number()?).unwrap_or(0));
                line_end
            }
            _ => return Err(protocol_error("unexpected reply type")),
        };
    }
    Ok(Some(at))
}

#[cfg(test)]
mod tests {
    use super::{reply_end, tcp_connect};

    /// `localhost` may name `::1` and `127.0.0.1`; the server listens on one of them
    /// only: the connection is made to the one that answers.
    #[tokio::test]
    async fn connects_to_the_address_that_answers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tcp = tcp_connect("localhost", port).await.unwrap();
        assert_eq!(tcp.peer_addr().unwrap().port(), port);
        assert!(tcp_connect("127.0.0.1", port).await.is_ok());
        drop(listener);
        assert!(tcp_connect("127.0.0.1", port).await.is_err());
    }

    #[test]
    fn finds_the_end_of_each_reply_kind() {
        let cases: [(&[u8], Option<usize>); 9] = [
            (b":12\r\n", Some(5)),
            (b"-NOSCRIPT x\r\n", Some(13)),
            (b"$3\r\nabc\r\n", Some(9)),
            (b"$3\r\nab", None),
            (b"$-1\r\n", Some(5)),
            (b"*2\r\n:1\r\n:42\r\n", Some(13)),
            (b"*2\r\n:1\r\n", None),
            (b"*1\r\n*1\r\n$1\r\nx\r\n", Some(15)),
            (b"", None),
        ];
        for (buf, end) in cases {
            assert_eq!(reply_end(buf, 0).unwrap(), end, "{buf:?}");
        }
        assert!(reply_end(b"?what\r\n", 0).is_err());
    }
}

/// Property tests of [`reply_end`]: a well-formed RESP2 reply ends exactly where its
/// encoding does, whatever follows it; every shorter prefix is incomplete; no bytes make
/// it panic. A fixed number of cases per run.
#[cfg(test)]
mod framing_props {
    use proptest::prelude::*;

    use super::reply_end;

    /// A RESP2 reply's encoding.
    fn reply() -> impl Strategy<Value = Vec<u8>> {
        let line = "[^\r\n]{0,12}";
        let leaf = prop_oneof![
            line.prop_map(|s| format!("+{s}\r\n").into_bytes()),
            line.prop_map(|s| format!("-{s}\r\n").into_bytes()),
            any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
            // Any bytes, `\r\n` and reply type bytes included: the length frames them.
            prop::collection::vec(any::<u8>(), 0..24).prop_map(|data| {
                let mut out = format!("${}\r\n", data.len()).into_bytes();
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
                out
            }),
            Just(b"$-1\r\n".to_vec()),
            Just(b"*-1\r\n".to_vec()),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop::collection::vec(inner, 0..5).prop_map(|items| {
                let mut out = format!("*{}\r\n", items.len()).into_bytes();
                for item in items {
                    out.extend_from_slice(&item);
                }
                out
            })
        })
    }

    proptest! {
        // No regression files written beside the crate: a failure prints its input.
        #![proptest_config(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::with_cases(256)
        })]

        #[test]
        fn a_reply_ends_where_its_encoding_does(
            reply in reply(),
            after in prop::collection::vec(any::<u8>(), 0..8),
        ) {
            let mut buf = reply.clone();
            buf.extend_from_slice(&after);
            prop_assert_eq!(reply_end(&buf, 0).unwrap(), Some(reply.len()));
            for cut in 0..reply.len() {
                prop_assert_eq!(reply_end(&reply[..cut], 0).unwrap(), None, "cut at {}", cut);
            }
        }

        /// Replies one after another: each ends where the next begins.
        #[test]
        fn pipelined_replies_end_one_after_another(replies in prop::collection::vec(reply(), 1..4)) {
            let buf: Vec<u8> = replies.concat();
            let mut at = 0;
            for reply in &replies {
                let end = reply_end(&buf, at).unwrap();
                prop_assert_eq!(end, Some(at + reply.len()));
                at += reply.len();
            }
        }

        #[test]
        fn no_bytes_make_it_panic(
            buf in prop::collection::vec(
                prop_oneof![
                    4 => any::<u8>(),
                    1 => prop::sample::select(b"*$:+-\r\n0123456789".to_vec()),
                ],
                0..64,
            ),
            at in 0usize..70,
        ) {
            let _ = reply_end(&buf, at);
        }
    }

    /// Arrays nested far deeper than any reply Redis sends are framed without a deep
    /// call stack.
    #[test]
    fn deeply_nested_arrays_are_framed() {
        let depth = 200_000;
        let mut buf = b"*1\r\n".repeat(depth);
        buf.extend_from_slice(b":1\r\n");
        assert_eq!(reply_end(&buf, 0).unwrap(), Some(buf.len()));
        assert_eq!(reply_end(&buf[..buf.len() - 1], 0).unwrap(), None);
    }
}
