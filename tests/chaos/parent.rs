//! The parent of the chaos run: starts the lock server and the children, injects faults,
//! samples the lock keys, checks the end state and hands everything to the analysis.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::analysis;
use crate::cfg;
use crate::child::{derive, env};
use crate::common::RedisServer;
use crate::events::{self, EventLog, now_ms, now_us};
use testkit::{RedisCluster, signal};

/// One injected fault: `[begin, end]` in wall-clock micros; `child` for a paused child.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) kind: &'static str,
    pub(crate) begin: u64,
    pub(crate) end: u64,
    pub(crate) child: Option<usize>,
}

/// An uninterrupted stretch of monitor samples showing one token at one key.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) key: usize,
    pub(crate) token: String,
    /// Reply instant of the first sample that showed it, send instant of the last.
    pub(crate) first_recv: u64,
    pub(crate) last_send: u64,
}

/// What the monitor saw.
#[derive(Debug, Default)]
pub(crate) struct Monitor {
    pub(crate) seen: Vec<Seen>,
    /// Per token: the latest expiry any sample proved (send instant + PTTL).
    pub(crate) expiry: HashMap<String, u64>,
    pub(crate) samples: u64,
    pub(crate) errors: u64,
    /// Lock keys found without an expiry, or with one longer than any ttl requested.
    pub(crate) bad: Vec<String>,
}

/// Analyses a kept run again (`DISTLOCK_CHAOS_REPLAY=<events log>`, with the monitor
/// file written next to it by `DISTLOCK_CHAOS_KEEP=1`); end-state problems are not kept.
pub(crate) fn replay(path: &std::path::Path) {
    let events = events::read(path);
    let faults: Vec<Fault> = events
        .iter()
        .filter(|e| e.kind == "fault")
        .map(|e| Fault {
            kind: match e.str("kind") {
                "debug_sleep" => "debug_sleep",
                "sigstop_redis" => "sigstop_redis",
                "kill_normal" => "kill_normal",
                "kill_pubsub" => "kill_pubsub",
                "restart" => "restart",
                "failover" => "failover",
                "sigstop_replica" => "sigstop_replica",
                _ => "pause_child",
            },
            begin: e.num("begin").unwrap_or(0),
            end: e.num("end").unwrap_or(0),
            child: e.num("child").map(|c| c as usize),
        })
        .collect();
    let mut monitor = Monitor::default();
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .replace("events-", "monitor-");
    let seen = std::fs::read_to_string(path.with_file_name(name)).unwrap_or_default();
    for line in seen.lines() {
        let w: Vec<&str> = line.split(' ').collect();
        if let [key, token, first, last, expiry] = w[..] {
            let token = if token.starts_with("yield:") {
                token.replace('_', " ")
            } else {
                token.to_owned()
            };
            let expiry: u64 = expiry.parse().unwrap_or(0);
            if expiry > 0 {
                monitor.expiry.insert(token.clone(), expiry);
            }
            monitor.seen.push(Seen {
                key: key.parse().unwrap_or(0),
                token,
                first_recv: first.parse().unwrap_or(0),
                last_send: last.parse().unwrap_or(0),
            });
        }
    }
    let report = analysis::analyse(&events, &monitor, &faults, &[]);
    for line in &report.stats {
        println!("  {line}");
    }
    if report.findings.is_empty() {
        println!("replay of {}: no violations", path.display());
    } else {
        println!("{}", report.render(&events));
        panic!(
            "replay of {}: {} violation(s)",
            path.display(),
            report.findings.len()
        );
    }
}

/// Margin around `MAX_TTL` for the PTTL a lock key may show.
const PTTL_SLACK_MS: i64 = 100;

/// Where a run's locks live.
enum Servers {
    One(RedisServer),
    /// Three primaries with a replica each; the lock keys' slot.
    Cluster(RedisCluster, u16),
}

impl Servers {
    /// The URL the children connect with.
    fn url(&self) -> String {
        match self {
            Servers::One(server) => server.url(),
            Servers::Cluster(cluster, _) => {
                let hosts: Vec<String> = cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port))
                    .collect();
                let auth = if testkit::least_privilege() {
                    format!("{0}:{0}@", testkit::APP_USER)
                } else {
                    String::new()
                };
                format!("redis+cluster://{auth}{}/", hosts.join(","))
            }
        }
    }

    /// Where the monitor samples the lock keys.
    fn sampled(&self) -> Sampled {
        match self {
            Servers::One(server) => Sampled::One(server.port),
            Servers::Cluster(cluster, slot) => Sampled::Cluster {
                nodes: cluster.nodes.iter().map(|n| n.port).collect(),
                owner: cluster.primary_of(*slot),
            },
        }
    }

    /// The primaries' ports now (one server: its port).
    fn primaries(&self) -> Vec<u16> {
        match self {
            Servers::One(server) => vec![server.port],
            Servers::Cluster(cluster, _) => cluster.primaries(),
        }
    }
}

/// Where the monitor reads the lock keys: one server, or a cluster's node that owns
/// their slot (followed through `MOVED`, and found again by trying every node).
#[derive(Clone)]
enum Sampled {
    One(u16),
    Cluster { nodes: Vec<u16>, owner: u16 },
}

pub(crate) fn run(seed: u64, secs: u64) {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    run_on(Servers::One(server), seed, secs, None);
}

/// The run on a cluster with a replica per primary, locks and records acknowledged by 1.
pub(crate) fn run_cluster(seed: u64, secs: u64) {
    let cluster = RedisCluster::start(3, 1);
    let slot = cluster.slot(&format!("{}{}", cfg::PREFIX, cfg::LOCK_KEYS[0]));
    run_on(Servers::Cluster(cluster, slot), seed, secs, None);
}

/// [`run_cluster`] with `plant` planted in every child (see `child::plant`): the checks
/// of the violations the analysis found, instead of a panic.
pub(crate) fn run_cluster_planted(seed: u64, secs: u64, plant: &str) -> Vec<&'static str> {
    let cluster = RedisCluster::start(3, 1);
    let slot = cluster.slot(&format!("{}{}", cfg::PREFIX, cfg::LOCK_KEYS[0]));
    run_on(Servers::Cluster(cluster, slot), seed, secs, Some(plant))
}

fn run_on(mut servers: Servers, seed: u64, secs: u64, plant: Option<&str>) -> Vec<&'static str> {
    if let Some(plant) = plant.or(crate::child::plant()) {
        println!("chaos seed = {seed}: bug planted in the children: {plant} (violations expected)");
    }
    let test_started = Instant::now();
    let sampled = servers.sampled();
    let dir = std::env::temp_dir().join(format!("distlock-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("events-{seed}.log"));
    let _ = std::fs::remove_file(&path);
    let log = EventLog::open(&path);
    let chaos_ms = secs.saturating_sub(10).max(5) * 1000;
    let start_ms = now_ms();
    let stop_ms = start_ms + 300 + chaos_ms;
    log.emit(
        "run",
        format_args!("seed={seed} secs={secs} chaos_ms={chaos_ms} stop_ms={stop_ms}"),
    );
    let replicas = matches!(servers, Servers::Cluster(..)).then(|| "1".to_owned());
    let mut children: Vec<ChildProc> = (0..cfg::CHILDREN)
        .map(|i| {
            let mut vars = vec![
                (env::URL, servers.url()),
                (env::EVENTS, path.display().to_string()),
                (env::CHILD, i.to_string()),
                (env::SEED, derive(seed, i as u64 + 1).to_string()),
                (env::STRICT, u8::from(i != 0).to_string()),
                (env::START_MS, start_ms.to_string()),
                (env::STOP_MS, stop_ms.to_string()),
            ];
            if let Some(n) = &replicas {
                vars.push((env::REPLICAS, n.clone()));
            }
            if let Some(plant) = plant {
                vars.push((env::PLANT, plant.to_owned()));
            }
            ChildProc::spawn(i, &vars)
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(|c| c.child.id()).collect();
    let mut problems: Vec<String> = Vec::new();
    let stop_monitor = AtomicBool::new(false);
    let (faults, monitor) = std::thread::scope(|s| {
        let watcher = s.spawn(|| monitor(sampled, &stop_monitor));
        // A panic below (a fault that could not be injected) must stop the monitor too:
        // the scope waits for it, and the run would hang instead of failing.
        let _stop = StopOnDrop(&stop_monitor);
        let faults = match &mut servers {
            Servers::One(server) => inject(server, &pids, seed, stop_ms, &log),
            Servers::Cluster(cluster, slot) => {
                inject_cluster(cluster, *slot, &pids, seed, stop_ms, &log)
            }
        };
        // Drain: every child finishes its calls.
        let drained =
            Duration::from_millis(stop_ms.saturating_sub(now_ms())) + Duration::from_secs(60);
        for c in &mut children {
            match c.expect("idle", drained) {
                Ok(rest) => {
                    if field(&rest, "panics") != "0" {
                        problems.push(format!("child {}: worker tasks panicked ({rest})", c.idx));
                    }
                    if field(&rest, "waiting_channels")
                        .split(',')
                        .any(|n| n != "0")
                    {
                        problems.push(format!(
                            "child {}: Pub/Sub channels still subscribed after all its calls returned \
                             (Locks::waiting_channels per runtime: {})",
                            c.idx,
                            field(&rest, "waiting_channels")
                        ));
                    }
                }
                Err(e) => problems.push(e),
            }
        }
        log.emit("drained", format_args!(""));
        // Settle: every lease taken during the run ends.
        std::thread::sleep(cfg::MAX_TTL + Duration::from_millis(700));
        stop_monitor.store(true, Ordering::SeqCst);
        (faults, watcher.join().expect("monitor thread"))
    });
    log.emit("settled", format_args!(""));
    for port in servers.primaries() {
        problems.extend(end_state(port));
    }
    for c in &mut children {
        if c.exited.is_some() {
            continue;
        }
        c.send("final");
        match c.expect("final", Duration::from_secs(30)) {
            Ok(rest) => {
                if field(&rest, "busy") != "-" {
                    problems.push(format!(
                        "child {}: after the settle period a lock could not be taken at once \
                         (stale local queue, or a key still held): {rest}",
                        c.idx
                    ));
                }
                if field(&rest, "waiting_channels") != "0" {
                    problems.push(format!("child {}: subscribed at the end: {rest}", c.idx));
                }
            }
            Err(e) => problems.push(e),
        }
    }
    for c in &mut children {
        match c.wait_exit(Duration::from_secs(30)) {
            Ok(status) if status.success() => {}
            Ok(status) => problems.push(format!("child {} exited with {status}", c.idx)),
            Err(e) => problems.push(e),
        }
    }
    drop(servers);

    if std::env::var_os("DISTLOCK_CHAOS_KEEP").is_some() {
        let seen: String = monitor
            .seen
            .iter()
            .map(|s| {
                format!(
                    "{} {} {} {} {}\n",
                    s.key,
                    s.token.replace(' ', "_"),
                    s.first_recv,
                    s.last_send,
                    monitor.expiry.get(&s.token).copied().unwrap_or(0)
                )
            })
            .collect();
        let _ = std::fs::write(dir.join(format!("monitor-{seed}.log")), seen);
    }
    let events = events::read(&path);
    let report = analysis::analyse(&events, &monitor, &faults, &problems);
    let took = test_started.elapsed();
    println!(
        "chaos seed = {seed}: {} s requested, ran {:.1} s",
        secs,
        took.as_secs_f64()
    );
    for line in &report.stats {
        println!("  {line}");
    }
    if report.findings.is_empty() {
        println!("chaos seed = {seed}: no violations");
        if std::env::var_os("DISTLOCK_CHAOS_KEEP").is_some() {
            println!("event log kept at {}", path.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Vec::new();
    }
    let text = report.render(&events);
    println!("{text}");
    eprintln!("{text}");
    if plant.is_some() {
        println!("event log kept at {}", path.display());
        return report.findings.iter().map(|f| f.check).collect();
    }
    panic!(
        "chaos seed = {seed}: {} violation(s) (rerun: DISTLOCK_CHAOS_SEED={seed}); event log kept at {}",
        report.findings.len(),
        path.display()
    );
}

/// The value of `name=` in a `k=v k=v` line (empty when absent).
/// Sets its flag when dropped, whether the scope ended or unwound.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn field<'a>(rest: &'a str, name: &str) -> &'a str {
    rest.split_whitespace()
        .find_map(|w| w.strip_prefix(name).and_then(|w| w.strip_prefix('=')))
        .unwrap_or("")
}

// ---------------------------------------------------------------------------------------
// Children.
// ---------------------------------------------------------------------------------------

/// A child process; SIGKILLed and reaped on drop (also on panic).
struct ChildProc {
    idx: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    exited: Option<String>,
}

impl ChildProc {
    fn spawn(idx: usize, vars: &[(&str, String)]) -> ChildProc {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args(["chaos_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(crate::ROLE_VAR, "child")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn a chaos child");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let rx = crate::common::child_messages(stdout);
        ChildProc {
            idx,
            child,
            stdin,
            lines: rx,
            exited: None,
        }
    }

    /// The rest of the next `@@<event>` line, within `timeout`.
    fn expect(&mut self, event: &str, timeout: Duration) -> Result<String, String> {
        let want = format!("@@{event}");
        match self.lines.recv_timeout(timeout) {
            Ok(line) => match line.strip_prefix(&want) {
                Some(rest) => Ok(rest.trim().to_owned()),
                None => Err(format!(
                    "child {}: expected `{want}`, got `{line}`",
                    self.idx
                )),
            },
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "child {}: no `{want}` within {timeout:?} (calls that never return?)",
                self.idx
            )),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                let e = format!(
                    "child {} ended before `{want}` (exit: {status:?}; see its stderr above)",
                    self.idx
                );
                self.exited = Some(e.clone());
                Err(e)
            }
        }
    }

    fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        self.stdin = None;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "child {} did not exit within {timeout:?}",
                    self.idx
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.stdin = None;
        // Never leave a child stopped.
        signal(self.child.id(), "CONT");
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// SIGCONTs a process when dropped (so a panic never leaves it stopped).
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

// ---------------------------------------------------------------------------------------
// Faults.
// ---------------------------------------------------------------------------------------

fn connect(port: u16, read_timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let con = client.get_connection_with_timeout(Duration::from_millis(300))?;
    con.set_read_timeout(Some(read_timeout))?;
    con.set_write_timeout(Some(Duration::from_millis(300)))?;
    Ok(con)
}

/// `CLIENT KILL TYPE kind` on the server on `port`.
fn kill_clients(port: u16, kind: &str) {
    let killed = connect(port, Duration::from_millis(500)).and_then(|mut c| {
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg(kind)
            .query::<i64>(&mut c)
    });
    if let Err(e) = killed {
        eprintln!("chaos: CLIENT KILL failed: {e}");
    }
}

/// SIGSTOPs a random child for 200 to 1000 ms.
fn pause_child(rng: &mut fastrand::Rng, pids: &[u32]) -> (&'static str, Option<usize>) {
    let c = rng.usize(..pids.len());
    let pause = rng.u64(200..=1000);
    let resume = Resume(pids[c]);
    signal(pids[c], "STOP");
    std::thread::sleep(Duration::from_millis(pause));
    drop(resume);
    ("pause_child", Some(c))
}

/// Logs a fault that began at `begin` and ends now.
fn record(log: &EventLog, id: u32, kind: &'static str, begin: u64, child: Option<usize>) -> Fault {
    let end = now_us();
    log.emit(
        "fault",
        format_args!(
            "id={id} kind={kind} begin={begin} end={end} child={}",
            child.map_or_else(|| "-".to_owned(), |c| c.to_string())
        ),
    );
    Fault {
        kind,
        begin,
        end,
        child,
    }
}

/// A stall long enough to time commands out, sometimes past leases and ttls.
fn stall_ms(rng: &mut fastrand::Rng) -> u64 {
    let ct = cfg::COMMAND_TIMEOUT.as_millis() as u64;
    if rng.u8(..100) < 60 {
        rng.u64(ct + 20..=2 * ct + 200)
    } else {
        rng.u64(500..=1000)
    }
}

/// Injects faults at random points until shortly before `stop_ms`; returns them.
fn inject(
    server: &mut RedisServer,
    pids: &[u32],
    seed: u64,
    stop_ms: u64,
    log: &EventLog,
) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(derive(seed, 1000));
    let port = server.port;
    let mut faults = Vec::new();
    for id in 1.. {
        let gap = rng.u64(400..=2200);
        // Stop early enough that no fault outlives the stop time.
        if now_ms() + gap + 1300 > stop_ms {
            break;
        }
        std::thread::sleep(Duration::from_millis(gap));
        let pick = rng.u8(..100);
        let stall = stall_ms(&mut rng);
        let begin = now_us();
        let (kind, child) = match pick {
            0..22 => {
                // DEBUG SLEEP from a connection of its own: the server stops answering.
                let secs = format!("{:.3}", stall as f64 / 1000.0);
                let slept = connect(port, Duration::from_millis(stall + 2000)).and_then(|mut c| {
                    redis::cmd("DEBUG")
                        .arg("SLEEP")
                        .arg(&secs)
                        .query::<()>(&mut c)
                });
                if let Err(e) = slept {
                    eprintln!("chaos: DEBUG SLEEP failed: {e}");
                }
                ("debug_sleep", None)
            }
            22..35 => {
                // SIGSTOP the redis-server itself.
                let pid = connect(port, Duration::from_millis(500))
                    .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c));
                let pid = pid.ok().and_then(|info| {
                    info.lines()
                        .find_map(|l| l.strip_prefix("process_id:"))
                        .and_then(|p| p.trim().parse::<u32>().ok())
                });
                match pid {
                    Some(pid) => {
                        let resume = Resume(pid);
                        signal(pid, "STOP");
                        std::thread::sleep(Duration::from_millis(stall));
                        drop(resume);
                    }
                    None => eprintln!("chaos: no redis-server pid for SIGSTOP"),
                }
                ("sigstop_redis", None)
            }
            35..63 => {
                kill_clients(port, if pick < 53 { "normal" } else { "pubsub" });
                (
                    if pick < 53 {
                        "kill_normal"
                    } else {
                        "kill_pubsub"
                    },
                    None,
                )
            }
            63..72 => {
                // Crash and restart: every lock and record is gone.
                log.emit("restart_begin", format_args!("id={id}"));
                server.restart();
                log.emit("restart_end", format_args!("id={id}"));
                ("restart", None)
            }
            _ => pause_child(&mut rng, pids),
        };
        faults.push(record(log, id, kind, begin, child));
    }
    faults
}

/// The cluster run's faults at random points until shortly before `stop_ms`: a failover
/// of the lock keys' primary (`CLUSTER FAILOVER` on its replica: the replica catches up
/// first, so no acknowledged write is lost), that replica paused past the command timeout,
/// the primary's connections killed, a child paused.
fn inject_cluster(
    cluster: &RedisCluster,
    slot: u16,
    pids: &[u32],
    seed: u64,
    stop_ms: u64,
    log: &EventLog,
) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(derive(seed, 1000));
    let mut faults = Vec::new();
    for id in 1.. {
        let gap = rng.u64(600..=2400);
        // A failover takes a few seconds at most: none outlives the stop time.
        if now_ms() + gap + 6000 > stop_ms {
            break;
        }
        std::thread::sleep(Duration::from_millis(gap));
        let pick = rng.u8(..100);
        // Settled after the last fault (a failover's map may lack the slot a moment).
        let owner = (0..250)
            .find_map(|_| {
                let found = cluster.try_primary_of(slot);
                if found.is_none() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                found
            })
            .unwrap_or_else(|| cluster.primary_of(slot));
        let begin = now_us();
        let (kind, child) = match pick {
            0..35 => {
                let replica = cluster.replicas_of(owner)[0];
                let answer = RedisCluster::cli(replica, &["CLUSTER", "FAILOVER"]);
                if answer != "OK" {
                    eprintln!("chaos: CLUSTER FAILOVER: {answer}");
                }
                // Done once the old replica serves the slot and the cluster is whole.
                let deadline = Instant::now() + Duration::from_secs(5);
                // The map may lack the slot for a moment while the failover goes on.
                while cluster.try_primary_of(slot) != Some(replica) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                cluster.wait_ok(Duration::from_secs(10));
                ("failover", None)
            }
            35..55 => {
                let replica = cluster.replicas_of(owner)[0];
                let pid = cluster
                    .nodes
                    .iter()
                    .find(|n| n.port == replica)
                    .and_then(RedisServer::pid);
                if let Some(pid) = pid {
                    let resume = Resume(pid);
                    signal(pid, "STOP");
                    std::thread::sleep(Duration::from_millis(stall_ms(&mut rng).min(900)));
                    drop(resume);
                }
                ("sigstop_replica", None)
            }
            55..80 => {
                kill_clients(owner, "normal");
                ("kill_normal", None)
            }
            _ => pause_child(&mut rng, pids),
        };
        faults.push(record(log, id, kind, begin, child));
    }
    faults
}

// ---------------------------------------------------------------------------------------
// Monitor.
// ---------------------------------------------------------------------------------------

/// Samples every lock key (token and PTTL, in one atomic Lua call) every few ms.
fn monitor(sampled: Sampled, stop: &AtomicBool) -> Monitor {
    let (mut port, nodes) = match sampled {
        Sampled::One(port) => (port, vec![port]),
        Sampled::Cluster { nodes, owner } => (owner, nodes),
    };
    let mut next_node = 0;
    let script = redis::Script::new(
        "local r = {} \
         for _, k in ipairs(KEYS) do \
           r[#r + 1] = redis.call('GET', k) or '' \
           r[#r + 1] = tostring(redis.call('PTTL', k)) \
         end \
         return r",
    );
    let keys: Vec<String> = cfg::LOCK_KEYS
        .iter()
        .map(|n| format!("{}{n}", cfg::PREFIX))
        .collect();
    let mut out = Monitor::default();
    let mut open: Vec<Option<Seen>> = vec![None; keys.len()];
    let mut con: Option<redis::Connection> = None;
    let max_pttl = cfg::MAX_TTL.as_millis() as i64 + PTTL_SLACK_MS;
    while !stop.load(Ordering::SeqCst) {
        if con.is_none() {
            con = connect(port, Duration::from_millis(300)).ok();
            if con.is_none() {
                // On a cluster, the next node: one answers, or redirects to the owner.
                port = nodes[next_node % nodes.len()];
                next_node += 1;
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        }
        let mut call = script.prepare_invoke();
        for k in &keys {
            call.key(k);
        }
        let send = now_us();
        let reply = call.invoke::<Vec<String>>(con.as_mut().expect("connected"));
        let recv = now_us();
        let values = match reply {
            Ok(v) if v.len() == 2 * keys.len() => v,
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => {
                // The slot moved (a failover): to the node the redirect names.
                if let Some(to) = e
                    .redirect_node()
                    .and_then(|(addr, _)| addr.rsplit(':').next()?.parse().ok())
                {
                    port = to;
                }
                con = None;
                continue;
            }
            _ => {
                out.errors += 1;
                con = None;
                port = nodes[next_node % nodes.len()];
                next_node += 1;
                continue;
            }
        };
        out.samples += 1;
        for (i, key) in keys.iter().enumerate() {
            let token = &values[2 * i];
            let pttl: i64 = values[2 * i + 1].parse().unwrap_or(-3);
            if token.is_empty() {
                if let Some(done) = open[i].take() {
                    out.seen.push(done);
                }
                continue;
            }
            match &mut open[i] {
                Some(run) if run.token == *token => run.last_send = send,
                slot => {
                    if let Some(done) = slot.take() {
                        out.seen.push(done);
                    }
                    *slot = Some(Seen {
                        key: i,
                        token: token.clone(),
                        first_recv: recv,
                        last_send: send,
                    });
                }
            }
            if token.starts_with("yield: ") {
                continue;
            }
            if pttl == -1 || pttl > max_pttl {
                out.bad.push(format!(
                    "{key} held by {token} with PTTL {pttl} ms at {send} (no ttl requested is over {} ms)",
                    cfg::MAX_TTL.as_millis()
                ));
            }
            if pttl > 0 {
                let until = send + pttl as u64 * 1000;
                let e = out.expiry.entry(token.clone()).or_insert(0);
                *e = (*e).max(until);
            }
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    out.seen.extend(open.into_iter().flatten());
    out
}

// ---------------------------------------------------------------------------------------
// End state.
// ---------------------------------------------------------------------------------------

/// After the settle period: no lock key left, every key with a bounded ttl, nobody
/// subscribed.
fn end_state(port: u16) -> Vec<String> {
    let mut problems = Vec::new();
    let mut con = match connect(port, Duration::from_secs(2)) {
        Ok(c) => c,
        Err(e) => return vec![format!("end state: cannot connect to the lock server: {e}")],
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut con)
        .unwrap_or_default();
    let idem_max = 3_600_000 + cfg::IDEM_LEASE_MS as i64 + 1000;
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap_or(-3);
        let value: Option<String> = redis::cmd("GET").arg(&key).query(&mut con).unwrap_or(None);
        // Companions: `{<key>}:fence`, or `<key>{:fence}` for a hash-tagged key.
        let fence = key.ends_with(":fence") || key.ends_with("{:fence}");
        let turns = key.ends_with(":turns") || key.ends_with("{:turns}");
        let idem = key.starts_with(&format!("{}idem:", cfg::PREFIX));
        let ok = if fence {
            // Expires a fence idle window (a day by default) after the name's last fence.
            (1..=86_400_000).contains(&pttl)
        } else if turns {
            (1..=60_000).contains(&pttl)
        } else if idem {
            (1..=idem_max).contains(&pttl)
        } else {
            false
        };
        if !ok {
            problems.push(format!(
                "end state: key `{key}` = {value:?} with PTTL {pttl} ms after every lease ended \
                 (settle: max ttl + 700 ms)"
            ));
        }
    }
    // Unsubscribing is asynchronous: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query(&mut con)
            .unwrap_or_default();
        if channels.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            problems.push(format!(
                "end state: Pub/Sub channels still subscribed after every call returned: {channels:?}"
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    problems
}
