//! Private `redis-server` processes on free ports, for distlock's tests and benchmarks:
//! started with no persistence, stopped on drop, and stopped by a per-process reaper when
//! the process ends without dropping them (a panic, a `static`, SIGKILL).
//!
//! Two environment variables change what the servers are, for whole suites at a time:
//! `REDIS_SERVER_BIN` names the server binary (`valkey-server` runs the suites on Valkey),
//! and [`ACL_VAR`] gives every server a least-privilege ACL user that the URLs the tests
//! hand to distlock name (see [`app_url`]); the tests' own inspections and faults go
//! through the unrestricted default user ([`RedisServer::admin_url`]).

mod postgres;
pub use postgres::PgServer;

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A `redis-server` this test started; killed on drop, and by this process's reaper (see
/// [`REAPER_SCRIPT`]) if the test process ends without dropping it (a server kept in a
/// `static` or otherwise never dropped, SIGKILL of the test process).
pub struct RedisServer {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_configured(|_| extra.iter().map(|a| a.to_string()).collect())
    }

    /// Starts a server whose extra arguments are made in its (new, empty) directory.
    fn start_configured(extra: impl FnOnce(&Path) -> Vec<String>) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("distlock-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        tell_reaper("dir", dir.to_str().expect("temp dir path is UTF-8"));
        let extra = extra(&dir);
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            extra,
        };
        // A port found free can be taken before the server binds it (an outgoing
        // connection's ephemeral port, another test's server): then it exits at once,
        // and it is started again on another port.
        for _ in 0..4 {
            if s.spawn() {
                return s;
            }
            s.port = free_port();
        }
        assert!(s.spawn(), "redis-server did not start on 5 free ports");
        s
    }

    /// Starts a server that also listens with TLS on another free port, with
    /// certificates made for it (see [`TlsFiles`]); `auth_clients`: it requires a client
    /// certificate signed by its CA. The plain port stays open for inspection.
    pub fn start_tls(auth_clients: bool) -> (RedisServer, TlsFiles) {
        Self::start_tls_with(auth_clients, &[])
    }

    /// [`start_tls`](Self::start_tls) with extra `redis-server` arguments (for example
    /// `--tls-protocols TLSv1.2`).
    pub fn start_tls_with(auth_clients: bool, extra: &[&str]) -> (RedisServer, TlsFiles) {
        let tls_port = free_port();
        let mut files = None;
        let server = Self::start_configured(|dir| {
            files = Some(TlsFiles::make(dir, tls_port));
            tls_args_with(tls_port, dir, auth_clients)
                .into_iter()
                .chain(extra.iter().map(|a| a.to_string()))
                .collect()
        });
        (server, files.expect("certificates made"))
    }

    /// Starts the server on `self.port`; `false` when it exited before answering (its
    /// port was taken meanwhile).
    fn spawn(&mut self) -> bool {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(&bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(acl_args())
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{bin}` (install redis-server): {e}"));
        tell_reaper("pid", &child.id().to_string());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.exited() {
                return false;
            }
            if ping(self.port) {
                // Another server on a port taken meanwhile answers too: this one then
                // exits within milliseconds of starting, having failed to bind.
                std::thread::sleep(Duration::from_millis(20));
                return !self.exited();
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The URL distlock is given: `redis://127.0.0.1:<port>/`, or under [`ACL_VAR`] the
    /// same with the least-privilege user (see [`app_url`]).
    pub fn url(&self) -> String {
        app_url(self.port)
    }

    /// `redis://127.0.0.1:<port>/` as the default user, which may run anything: for the
    /// tests' inspections and faults (`CLIENT KILL`, `DEBUG SLEEP`, `CONFIG SET`, `INFO`).
    pub fn admin_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server process's id (`None` after [`kill`](Self::kill)).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` (`STOP`, `CONT`, ...) to the server; panics when it is not running (a
    /// test that means to pause it must not pass without pausing it).
    pub fn signal(&self, sig: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("no server running on {}", self.port));
        signal(pid, sig);
    }

    /// The server's working directory, removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// SIGKILL, like a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            // Unregistered before `wait`: until this process reaps it, the pid cannot be
            // taken by another process, so the reaper never holds a pid that may name one
            // (short of this process being killed between these two lines).
            tell_reaper("unpid", &c.id().to_string());
            let _ = c.wait();
        }
    }

    /// Whether the server process has exited (then it is reaped and forgotten).
    fn exited(&mut self) -> bool {
        let Some(child) = &mut self.child else {
            return true;
        };
        if let Ok(Some(_)) = child.try_wait() {
            tell_reaper("unpid", &child.id().to_string());
            self.child = None;
            return true;
        }
        false
    }

    /// Starts again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "redis-server did not start again on {}",
            self.port
        );
    }

    /// A plain redis-rs connection for inspecting state, as the default user.
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.admin_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

/// Certificates for a TLS server, made with the `openssl` command: a CA, a server
/// certificate it signed (for `127.0.0.1` and `localhost`), a client certificate it
/// signed, and another CA that signed nothing here. All PEM.
pub struct TlsFiles {
    /// The TLS port.
    pub port: u16,
    /// The CA that signed the server's and the client's certificates.
    pub ca: Vec<u8>,
    /// A CA that did not sign the server's certificate.
    pub other_ca: Vec<u8>,
    /// A client certificate the CA signed.
    pub client_cert: Vec<u8>,
    /// Its private key.
    pub client_key: Vec<u8>,
}

impl TlsFiles {
    fn make(dir: &Path, port: u16) -> TlsFiles {
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .unwrap_or_else(|e| panic!("cannot run `openssl` (install it): {e}"));
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ca = |name: &str| {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ])
        };
        ca("ca");
        ca("other-ca");
        // Version 3 certificates (what rustls accepts): each with an extension.
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for name in ["server", "client"] {
            openssl(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            let mut args = vec![
                "x509",
                "-req",
                "-days",
                "2",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
            ];
            let (csr, crt, ext) = (
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            args.extend(["-in", &csr, "-out", &crt, "-extfile", &ext]);
            openssl(&args);
        }
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        TlsFiles {
            port,
            ca: read("ca.crt"),
            other_ca: read("other-ca.crt"),
            client_cert: read("client.crt"),
            client_key: read("client.key"),
        }
    }

    /// `rediss://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The reaper: one `sh` per test process that started a server, reading lines from a pipe
/// whose write end only the test process holds (std opens it close-on-exec, so neither the
/// servers nor other children inherit it). `pid N` / `unpid N` add and remove a process to
/// SIGKILL, `dir PATH` a directory to remove (only `*/distlock-test-*` ones; removing one
/// the test already removed is a no-op). When the test process ends, however it ends (also
/// SIGKILL), the pipe reaches EOF and the reaper kills the listed pids, removes the dirs
/// and exits. A partial last line (the test killed mid-write) fails `read` and is ignored.
/// It runs in its own process group and ignores INT, HUP and TERM, so a Ctrl-C or a
/// group-wide kill of the tests does not take it down before its work.
pub const REAPER_SCRIPT: &str = r#"
trap '' INT HUP TERM
pids=' '
dirs=''
while read -r op arg; do
  case "$op" in
    pid) pids="$pids$arg " ;;
    unpid)
      case "$pids" in
        *" $arg "*) pids="${pids%% $arg *} ${pids#* $arg }" ;;
      esac ;;
    dir)
      case "$arg" in
        */distlock-test-*) dirs="$dirs$arg
" ;;
      esac ;;
  esac
done
for p in $pids; do kill -9 "$p" 2>/dev/null; done
printf '%s' "$dirs" | while IFS= read -r d; do
  rm -rf -- "$d" 2>/dev/null || { sleep 0.2; rm -rf -- "$d"; }
done
"#;

/// Environment variable that, set, starts no reaper: for the control that shows servers
/// outlive a SIGKILLed test process without it.
pub const NO_REAPER_VAR: &str = "DISTLOCK_TEST_NO_REAPER";

/// Starts a reaper running [`REAPER_SCRIPT`] with its stdin piped from this process.
pub fn spawn_reaper() -> std::io::Result<Child> {
    Command::new("sh")
        .args(["-c", REAPER_SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

/// Sends `op arg` to this process's reaper, starting it first if need be. The line goes out
/// in one `write` (shorter than `PIPE_BUF`: atomic), so lines from threads never mix.
fn tell_reaper(op: &str, arg: &str) {
    static REAPER: OnceLock<Option<Mutex<ChildStdin>>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        if std::env::var_os(NO_REAPER_VAR).is_some() {
            return None;
        }
        match spawn_reaper() {
            // The `Child` is dropped, not waited for: the reaper outlives this process.
            Ok(mut child) => child.stdin.take().map(Mutex::new),
            Err(e) => {
                eprintln!("no reaper for redis-servers (`sh`: {e}); they die with their Drop only");
                None
            }
        }
    });
    if let Some(stdin) = reaper {
        let line = format!("{op} {arg}\n");
        let mut stdin = stdin.lock().unwrap_or_else(|e| e.into_inner());
        let _ = stdin.write_all(line.as_bytes());
    }
}

/// Environment variable that, set, gives every server this process starts a
/// least-privilege ACL user, [`APP_USER`], with `+@all -@dangerous` (no `INFO`, `CONFIG`,
/// `CLIENT KILL`, `DEBUG`, ...), and makes [`app_url`] (so [`RedisServer::url`] and
/// [`RedisCluster::urls`]) name it: the suites then run as such a user would.
pub const ACL_VAR: &str = "DISTLOCK_TEST_ACL";

/// The least-privilege user's name under [`ACL_VAR`]; its password is the same.
pub const APP_USER: &str = "distlock-app";

/// Whether the servers run with the least-privilege user (see [`ACL_VAR`]).
pub fn least_privilege() -> bool {
    std::env::var_os(ACL_VAR).is_some()
}

/// The URL distlock is given for a server (or a proxy in front of one) on `port`: as
/// [`APP_USER`] under [`ACL_VAR`], else as the default user.
pub fn app_url(port: u16) -> String {
    if least_privilege() {
        format!("redis://{APP_USER}:{APP_USER}@127.0.0.1:{port}/")
    } else {
        format!("redis://127.0.0.1:{port}/")
    }
}

/// The sentinels' configuration line that adds [`APP_USER`] under [`ACL_VAR`]: the URLs
/// distlock is given name it, and a sentinel client uses one URL's credentials for the
/// sentinels and the primary alike. The least privilege is the primary's (no `ROLE`,
/// `INFO`, `CONFIG`, `CLIENT`); a sentinel's commands are its own.
fn sentinel_acl() -> String {
    if !least_privilege() {
        return String::new();
    }
    format!("user {APP_USER} on >{APP_USER} ~* &* +@all\n")
}

/// The `redis-server` arguments that add the least-privilege user, under [`ACL_VAR`].
fn acl_args() -> Vec<String> {
    if !least_privilege() {
        return Vec::new();
    }
    let rules = [
        APP_USER,
        "on",
        &format!(">{APP_USER}"),
        "~*",
        "&*",
        "+@all",
        "-@dangerous",
    ];
    std::iter::once("--user".to_owned())
        .chain(rules.iter().map(|r| r.to_string()))
        .collect()
}

/// The name of the server's program as the kernel shows it (`comm`): `redis-server`, or
/// `valkey-server` when `REDIS_SERVER_BIN` names Valkey's.
pub fn server_comm() -> String {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    let name = Path::new(&bin)
        .file_name()
        .map_or("redis-server".into(), |n| n.to_string_lossy().into_owned());
    // The kernel keeps 15 bytes of a program's name.
    name.chars().take(15).collect()
}

/// Sends `sig` by name (`STOP`, `CONT`, `KILL`, ...) to `pid` with the `kill` utility.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Connections the server on `port` has accepted so far (`INFO stats`, as the default
/// user).
pub fn connections_received(port: u16) -> u64 {
    RedisCluster::cli(port, &["INFO", "stats"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("total_connections_received:"))
        .and_then(|n| n.parse().ok())
        .expect("total_connections_received")
}

/// Whether a server on `port` answers `PING`.
pub fn ping(port: u16) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A free TCP port on 127.0.0.1 (free when asked).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The installed `redis-server`'s version (`7.0.15`), or `unknown`.
pub fn redis_server_version() -> String {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            out.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_owned))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A local Redis Cluster of servers this test started (see [`RedisServer`]): every node
/// on a free port with its bus on another free port, slots spread evenly over the
/// primaries by `redis-cli --cluster create`.
pub struct RedisCluster {
    /// The nodes, primaries first as created (a failover or a reshard changes roles).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas` replicas each (one primary without
    /// replicas takes every slot itself) and waits until every node sees every slot served
    /// (`cluster_state:ok`) and every replica has synced.
    pub fn start(primaries: usize, replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| Self::node())
            .collect();
        Self::create(nodes, replicas)
    }

    /// [`start`](Self::start) with TLS: every node also listens on a TLS port (certificates
    /// from one [`TlsFiles`], made for `127.0.0.1`), and the cluster bus and replication
    /// speak TLS (`tls-cluster yes`, so the cluster announces the TLS ports). Returns the
    /// TLS ports, node by node, and the certificates.
    pub fn start_tls(primaries: usize, replicas: usize) -> (RedisCluster, Vec<u16>, TlsFiles) {
        let (dir, files) = shared_tls();
        let mut tls_ports = Vec::new();
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| {
                let tls = free_port();
                tls_ports.push(tls);
                let mut args = tls_args(tls, &dir);
                args.extend(["--tls-cluster".into(), "yes".into()]);
                Self::node_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .collect();
        let cluster = Self::create(nodes, replicas);
        (cluster, tls_ports, files)
    }

    /// Joins `nodes` into a cluster and waits until it is ok.
    fn create(nodes: Vec<RedisServer>, replicas: usize) -> RedisCluster {
        if nodes.len() == 1 {
            // `redis-cli --cluster create` wants 3 primaries; one takes every slot itself.
            let reply = Self::cli(nodes[0].port, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
            assert_eq!(reply, "OK", "CLUSTER ADDSLOTSRANGE");
        } else {
            Self::create_with_cli(&nodes, replicas);
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    /// `redis-cli --cluster create` over `nodes`.
    fn create_with_cli(nodes: &[RedisServer], replicas: usize) {
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts one more node and joins it to the cluster as a primary with no slots
    /// (`redis-cli --cluster add-node`); returns its port once every node knows it.
    pub fn add_node(&mut self) -> u16 {
        let node = Self::node();
        let port = node.port;
        let first = format!("127.0.0.1:{}", self.live_port());
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "add-node",
                &format!("127.0.0.1:{port}"),
                &first,
            ])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster add-node failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        self.nodes.push(node);
        let deadline = Instant::now() + Duration::from_secs(30);
        let everyone = self.nodes.iter().filter(|n| n.pid().is_some()).count();
        while !self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
            Self::cli(n.port, &["CLUSTER", "NODES"])
                .lines()
                .filter(|l| !l.contains("handshake"))
                .count()
                == everyone
        }) {
            assert!(Instant::now() < deadline, "the new node joined");
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_ok(Duration::from_secs(30));
        port
    }

    /// One cluster-enabled server, its bus on a free port.
    fn node() -> RedisServer {
        Self::node_with(&[])
    }

    /// [`node`](Self::node) with extra `redis-server` arguments.
    fn node_with(extra: &[&str]) -> RedisServer {
        let bus = free_port().to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            "--cluster-port",
            &bus,
        ];
        args.extend_from_slice(extra);
        RedisServer::start_with(&args)
    }

    /// The URL of every node, as [`RedisServer::url`] makes it.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Runs `redis-cli -p <port> <args>` and returns its output (trimmed).
    pub fn cli(port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits until every live node reports `cluster_state:ok` with all 16384 slots, and
    /// every replica reports its link to its primary up.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                let info = Self::cli(n.port, &["CLUSTER", "INFO"]);
                let repl = Self::cli(n.port, &["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot(&self, key: &str) -> u16 {
        let port = self.nodes[0].port;
        Self::cli(port, &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot number")
    }

    /// The port of the primary that serves `slot` now, as the first live node sees it.
    pub fn primary_of(&self, slot: u16) -> u16 {
        let port = self.live_port();
        Self::primary_of_via(port, slot)
            .unwrap_or_else(|| panic!("no primary serves slot {slot} (asked {port})"))
    }

    /// [`primary_of`](Self::primary_of), `None` while the first live node names none (a
    /// failover under way: its map lacks the slot for a moment).
    pub fn try_primary_of(&self, slot: u16) -> Option<u16> {
        Self::primary_of_via(self.live_port(), slot)
    }

    /// The port of the primary that serves `slot` as the node on `port` sees it (`None`
    /// when it does not answer, or names none).
    pub fn primary_of_via(port: u16, slot: u16) -> Option<u16> {
        let shards = Self::cli(port, &["CLUSTER", "SLOTS"]);
        // `redis-cli` prints each reply element on its own line: start, end, then the
        // primary's ip, port, id, ...
        let lines: Vec<&str> = shards.lines().map(str::trim).collect();
        let mut i = 0;
        while i + 3 < lines.len() {
            if let (Ok(start), Ok(end)) = (lines[i].parse::<u16>(), lines[i + 1].parse::<u16>())
                && lines[i + 2] == "127.0.0.1"
                && start <= slot
                && slot <= end
                && let Ok(port) = lines[i + 3].parse::<u16>()
            {
                return Some(port);
            }
            i += 1;
        }
        None
    }

    /// The node id of the server on `port` (`CLUSTER MYID`).
    pub fn node_id(port: u16) -> String {
        Self::cli(port, &["CLUSTER", "MYID"])
    }

    /// The ports of the replicas of the primary on `port`.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        let id = Self::node_id(port);
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .filter(|n| {
                Self::cli(n.port, &["CLUSTER", "NODES"])
                    .lines()
                    .any(|l| l.contains("myself") && l.contains("slave") && l.contains(&id))
            })
            .map(|n| n.port)
            .collect()
    }

    /// Starts moving `slot` from the primary on `from` to the one on `to`, as a reshard
    /// does before it moves any key: `IMPORTING` on the target, then `MIGRATING` on the
    /// source (each answered `OK`). Calls on the slot's keys meet `ASK` from then on.
    pub fn start_migration(slot: &str, from: u16, to: u16) {
        let (from_id, to_id) = (Self::node_id(from), Self::node_id(to));
        assert_eq!(
            Self::cli(to, &["CLUSTER", "SETSLOT", slot, "IMPORTING", &from_id]),
            "OK"
        );
        assert_eq!(
            Self::cli(from, &["CLUSTER", "SETSLOT", slot, "MIGRATING", &to_id]),
            "OK"
        );
    }

    /// Moves `slot` from the primary serving it to the primary on `to`, key by key with
    /// `MIGRATE`, the way `redis-cli --cluster reshard` does: `IMPORTING` on the target,
    /// `MIGRATING` on the source, keys moved in batches of `batch` with `pause` between
    /// batches (so calls meet `ASK` redirects), then `NODE` on every primary.
    pub fn migrate_slot(&self, slot: u16, to: u16, batch: usize, pause: Duration) {
        let from = self.primary_of(slot);
        assert_ne!(from, to, "slot {slot} already on {to}");
        let s = slot.to_string();
        Self::start_migration(&s, from, to);
        let to_id = Self::node_id(to);
        loop {
            let keys = Self::cli(from, &["CLUSTER", "GETKEYSINSLOT", &s, &batch.to_string()]);
            let keys: Vec<&str> = keys
                .lines()
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1"];
            let port = to.to_string();
            args.push(&port);
            args.extend(["", "0", "5000", "KEYS"]);
            args.extend(keys.iter().copied());
            let out = Self::cli(from, &args);
            assert!(out == "OK" || out == "NOKEY", "MIGRATE: {out}");
            std::thread::sleep(pause);
        }
        for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
            let _ = Self::cli(node.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
    }

    /// The primaries' ports now, in slot order.
    pub fn primaries(&self) -> Vec<u16> {
        let mut found = Vec::new();
        for slot in (0..16384u16).step_by(1000) {
            let p = self.primary_of(slot);
            if !found.contains(&p) {
                found.push(p);
            }
        }
        found
    }

    /// A key named `<tag>-<i>` whose slot, once prefixed with `prefix`, the primary on
    /// `primary` serves (returned without the prefix).
    pub fn key_on(&self, primary: u16, prefix: &str, tag: &str) -> String {
        (0..)
            .map(|i| format!("{tag}-{i}"))
            .find(|k| self.primary_of(self.slot(&format!("{prefix}{k}"))) == primary)
            .expect("a key on every primary")
    }

    /// Sends `sig` (`STOP`, `CONT`, ...) to the node on `port`.
    pub fn signal(&self, port: u16, sig: &str) {
        let pid = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(RedisServer::pid)
            .unwrap_or_else(|| panic!("no live node on {port}"));
        signal(pid, sig);
    }

    fn live_port(&self) -> u16 {
        self.nodes
            .iter()
            .find(|n| n.pid().is_some())
            .expect("a live node")
            .port
    }
}

/// A `redis-sentinel` this test started, watching one primary as `mymaster` (quorum 2,
/// down after 1 s, failover timeout 5 s); killed on drop and by the reaper.
pub struct RedisSentinel {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    tls_port: Option<u16>,
    child: Option<Child>,
    dir: PathBuf,
}

impl RedisSentinel {
    /// The name the sentinels give the primary.
    pub const MASTER: &'static str = "mymaster";

    /// Starts a sentinel watching the primary on `primary_port`, and waits until it
    /// answers.
    pub fn start(primary_port: u16) -> RedisSentinel {
        Self::start_conf(primary_port, String::new(), None)
    }

    /// [`start`](Self::start) over TLS: it also listens on a TLS port ([`tls_port`]
    /// (Self::tls_port)) and speaks TLS to the primary and replicas
    /// (`tls-replication yes`), with the certificates in `certs` (see [`shared_tls`]);
    /// `primary_tls_port` is the primary's TLS port.
    pub fn start_tls(primary_tls_port: u16, certs: &Path) -> RedisSentinel {
        let tls_port = free_port();
        let path = |name: &str| certs.join(name).display().to_string();
        let conf = format!(
            "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-replication yes\ntls-auth-clients no\n",
            path("server.crt"),
            path("server.key"),
            path("ca.crt"),
        );
        Self::start_conf(primary_tls_port, conf, Some(tls_port))
    }

    /// The TLS port of a sentinel started with [`start_tls`](Self::start_tls).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    fn start_conf(primary_port: u16, extra: String, tls_port: Option<u16>) -> RedisSentinel {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("distlock-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        tell_reaper("dir", dir.to_str().expect("temp dir path is UTF-8"));
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor {m} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {m} 1000\n\
                 sentinel failover-timeout {m} 5000\n\
                 sentinel parallel-syncs {m} 1\n{acl}{extra}",
                dir.display(),
                m = Self::MASTER,
                acl = sentinel_acl(),
            ),
        )
        .unwrap();
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `redis-sentinel` (install redis-sentinel): {e}")
            });
        tell_reaper("pid", &child.id().to_string());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(port) {
            assert!(
                Instant::now() < deadline,
                "redis-sentinel on {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisSentinel {
            port,
            tls_port,
            child: Some(child),
            dir,
        }
    }

    /// The URL distlock is given: `redis://127.0.0.1:<port>/`, or under [`ACL_VAR`] the
    /// same with the least-privilege user (see [`app_url`]).
    pub fn url(&self) -> String {
        app_url(self.port)
    }

    /// `redis://127.0.0.1:<port>/` as the default user, which may run anything: for the
    /// tests' inspections and faults (`CLIENT KILL`, `DEBUG SLEEP`, `CONFIG SET`, `INFO`).
    pub fn admin_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port of the primary this sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        let out = RedisCluster::cli(
            self.port,
            &["SENTINEL", "get-master-addr-by-name", Self::MASTER],
        );
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until this sentinel knows `sentinels - 1` other sentinels and `replicas`
    /// replicas of the primary.
    pub fn wait_ready(&self, sentinels: usize, replicas: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let info = RedisCluster::cli(self.port, &["SENTINEL", "master", Self::MASTER]);
            let field = |name: &str| -> usize {
                let lines: Vec<&str> = info.lines().map(str::trim).collect();
                lines
                    .iter()
                    .position(|l| *l == name)
                    .and_then(|i| lines.get(i + 1))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if field("num-other-sentinels") + 1 >= sentinels && field("num-slaves") >= replicas {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see each other: {info}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            tell_reaper("unpid", &c.id().to_string());
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Certificates made once (see [`TlsFiles`]) in a directory of their own, for servers
/// that must trust one another (a primary, its replica, their sentinels): the directory
/// (`ca.crt`, `server.crt`, `server.key`, removed by the reaper) and the files.
pub fn shared_tls() -> (PathBuf, TlsFiles) {
    let dir = std::env::temp_dir().join(format!(
        "distlock-test-{}-certs-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    tell_reaper("dir", dir.to_str().expect("temp dir path is UTF-8"));
    let files = TlsFiles::make(&dir, 0);
    (dir, files)
}

/// The `redis-server` arguments of a TLS port with the certificates in `certs` (see
/// [`shared_tls`]), replication over TLS, clients not asked for certificates.
pub fn tls_args(tls_port: u16, certs: &Path) -> Vec<String> {
    tls_args_with(tls_port, certs, false)
}

/// [`tls_args`], clients asked for a certificate signed by the CA where `auth_clients`.
fn tls_args_with(tls_port: u16, certs: &Path, auth_clients: bool) -> Vec<String> {
    let path = |name: &str| certs.join(name).display().to_string();
    vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path("server.crt"),
        "--tls-key-file".into(),
        path("server.key"),
        "--tls-ca-cert-file".into(),
        path("ca.crt"),
        "--tls-replication".into(),
        "yes".into(),
        "--tls-auth-clients".into(),
        if auth_clients { "yes" } else { "no" }.into(),
    ]
}
