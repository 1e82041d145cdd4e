//! The test harness itself: the redis-servers a test process starts stop, and their
//! directories go, when that process ends however it ends: a normal exit with servers kept
//! in a `static` (as `default_client.rs` keeps one), a panic, or SIGKILL. The test binary
//! re-runs itself as a child (`child_entry`) that starts servers and reports them on
//! stdout (`@@server pid=.. port=.. dir=..`); the parent ends the child and watches.
mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::*;

/// Environment variable naming the role a child plays: `block`, `panic` or `exit`.
const ROLE_VAR: &str = "DISTLOCK_HARNESS_ROLE";
/// Bound on waiting for a child to report its servers (other agents may load the box).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on a test process's servers and dirs disappearing after it ended.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// Servers a child keeps past its test, never dropped.
static KEPT: Mutex<Vec<RedisServer>> = Mutex::new(Vec::new());

// ---------------------------------------------------------------------------------------
// Child side.
// ---------------------------------------------------------------------------------------

/// Only does something in a child: starts one server and restarts it (its first pid must
/// not be killed by the reaper later: it was unregistered), starts a second one, keeps both
/// in [`KEPT`], reports them, then per role blocks until stdin closes, panics, or returns.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let mut restarted = RedisServer::start();
    let first_pid = restarted.pid().unwrap();
    restarted.restart();
    println!("@@killed pid={first_pid}");
    let other = RedisServer::start();
    for s in [&restarted, &other] {
        println!(
            "@@server pid={} port={} dir={}",
            s.pid().unwrap(),
            s.port,
            s.dir().display()
        );
    }
    KEPT.lock().unwrap().extend([restarted, other]);
    println!("@@ready");
    match role.as_str() {
        "block" => {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in std::io::stdin().lines() {
                    if line.is_err() {
                        break;
                    }
                }
                let _ = tx.send(());
            });
            // Until the parent closes stdin (or vanishes), bounded.
            let _ = rx.recv_timeout(Duration::from_secs(120));
        }
        "panic" => panic!("the child test panics on purpose"),
        "exit" => {}
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------------------------------
// Parent side.
// ---------------------------------------------------------------------------------------

/// One server a child reported.
#[derive(Debug, Clone)]
struct Reported {
    pid: u32,
    port: u16,
    dir: PathBuf,
}

/// A child test process and what it reported; SIGKILLed on drop.
struct ChildTest {
    child: Child,
    lines: Receiver<String>,
    servers: Vec<Reported>,
    killed_pid: u32,
}

impl ChildTest {
    fn spawn(role: &str, env: &[(&str, &str)]) -> ChildTest {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = child_messages(stdout);
        let mut t = ChildTest {
            child,
            lines,
            servers: Vec::new(),
            killed_pid: 0,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = t
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("child ({role}) did not report its servers: {e}"));
            let fields: HashMap<&str, &str> = line
                .split_whitespace()
                .filter_map(|f| f.split_once('='))
                .collect();
            match line.split_whitespace().next().unwrap() {
                "@@killed" => t.killed_pid = fields["pid"].parse().unwrap(),
                "@@server" => t.servers.push(Reported {
                    pid: fields["pid"].parse().unwrap(),
                    port: fields["port"].parse().unwrap(),
                    dir: PathBuf::from(fields["dir"]),
                }),
                "@@ready" => break,
                other => panic!("unexpected `{other}` from the child"),
            }
        }
        assert_eq!(t.servers.len(), 2);
        t
    }

    /// Waits (bounded) for the child to exit by itself.
    fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "child did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The checks the "gone" assertions negate, made while the child lives: they pass,
    /// so they can fail.
    fn assert_servers_up(&self) {
        assert!(self.killed_pid != 0);
        assert!(!alive(self.killed_pid, &server_comm()), "restart kills");
        for s in &self.servers {
            assert!(alive(s.pid, &server_comm()), "{s:?} not running");
            assert!(ping(s.port), "{s:?} does not answer");
            assert!(s.dir.is_dir(), "{s:?} has no dir");
        }
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `pid` runs and is named `comm` (a zombie does not run; the name guards against
/// a reused pid).
fn alive(pid: u32, comm: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let state = stat[close + 1..].split_whitespace().next();
    &stat[open + 1..close] == comm && !matches!(state, Some("Z" | "X"))
}

/// The pids whose parent is `parent`, with their names.
fn children_of(parent: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 1..].split_whitespace().nth(1);
        if ppid.and_then(|p| p.parse().ok()) == Some(parent) {
            out.push((pid, stat[open + 1..close].to_owned()));
        }
    }
    out
}

/// The `pipe:[inode]` targets of `pid`'s open descriptors.
fn pipes_of(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target.starts_with("pipe:"))
        .collect()
}

/// Waits until `done` holds, up to [`GONE_WITHIN`].
fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + GONE_WITHIN;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {GONE_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_all_gone(servers: &[Reported]) {
    for s in servers {
        eventually(&format!("redis-server {} stopped", s.pid), || {
            !alive(s.pid, &server_comm())
        });
        eventually(&format!("{} removed", s.dir.display()), || !s.dir.exists());
        assert!(!ping(s.port), "{s:?} still answers");
    }
}

#[test]
fn sigkilled_test_process_leaves_no_server() {
    let mut t = ChildTest::spawn("block", &[]);
    t.assert_servers_up();
    // One reaper, the child's `sh`, whose stdin pipe the servers did not inherit (or the
    // pipe would never close while they run).
    let reapers: Vec<u32> = children_of(t.child.id())
        .into_iter()
        .filter(|(_, comm)| comm == "sh")
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(reapers.len(), 1, "{:?}", children_of(t.child.id()));
    let reaper = reapers[0];
    let pipe = std::fs::read_link(format!("/proc/{reaper}/fd/0")).unwrap();
    let pipe = pipe.to_string_lossy().into_owned();
    assert!(pipe.starts_with("pipe:"), "{pipe}");
    assert!(
        pipes_of(t.child.id()).contains(&pipe),
        "the child writes {pipe}"
    );
    for s in &t.servers {
        assert!(
            !pipes_of(s.pid).contains(&pipe),
            "server {} holds {pipe}",
            s.pid
        );
    }

    t.child.kill().unwrap(); // SIGKILL
    t.child.wait().unwrap();
    assert_all_gone(&t.servers);
    // The reaper does not outlive its work.
    eventually("the reaper exited", || !alive(reaper, "sh"));
}

#[test]
fn panicking_test_process_leaves_no_server() {
    let mut t = ChildTest::spawn("panic", &[]);
    t.assert_servers_up();
    let status = t.wait(Duration::from_secs(30));
    assert!(!status.success(), "the child's test must fail: {status:?}");
    assert_all_gone(&t.servers);
}

/// As `default_client.rs` does: a server kept in a `static`, never dropped.
#[test]
fn exiting_test_process_leaves_no_server_kept_in_a_static() {
    let mut t = ChildTest::spawn("exit", &[]);
    let status = t.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    assert_all_gone(&t.servers);
}

/// The control: without the reaper, the servers of a SIGKILLed test process keep running
/// (so `assert_all_gone` above would fail); this test then removes them itself.
#[test]
fn without_the_reaper_servers_outlive_a_sigkilled_test_process() {
    let mut t = ChildTest::spawn("block", &[(NO_REAPER_VAR, "1")]);
    t.assert_servers_up();
    assert!(
        children_of(t.child.id())
            .iter()
            .all(|(_, comm)| comm != "sh"),
        "no reaper expected"
    );
    let leftovers = Leftovers(t.servers.clone());
    t.child.kill().unwrap();
    t.child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    for s in &leftovers.0 {
        assert!(
            alive(s.pid, &server_comm()),
            "{s:?} stopped without a reaper"
        );
        assert!(s.dir.is_dir() && ping(s.port), "{s:?}");
    }
    drop(leftovers);
    assert_all_gone(&t.servers);
}

/// Servers a test must stop itself: SIGKILLed and their dirs removed on drop.
struct Leftovers(Vec<Reported>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for s in &self.0 {
            let _ = Command::new("kill")
                .args(["-9", &s.pid.to_string()])
                .status();
            let _ = std::fs::remove_dir_all(&s.dir);
        }
    }
}

/// The reaper script on its own: at EOF it kills the pids still listed and no other, and
/// removes only `distlock-test-*` dirs; a partial last line is ignored; then it exits.
#[test]
fn reaper_kills_only_what_is_still_listed() {
    let sleeper = || Command::new("sleep").arg("30").spawn().unwrap();
    let (mut listed, mut unlisted, mut partial) = (sleeper(), sleeper(), sleeper());
    let base = std::env::temp_dir();
    let ours = base.join(format!("distlock-test-reaper-{}", std::process::id()));
    let not_ours = base.join(format!("distlock-reaper-keep-{}", std::process::id()));
    for d in [&ours, &not_ours] {
        std::fs::create_dir_all(d.join("sub")).unwrap();
    }
    let mut reaper = spawn_reaper().unwrap();
    let mut stdin = reaper.stdin.take().unwrap();
    let script = format!(
        "pid {}\npid {}\nunpid {}\nunpid 999999999\ndir {}\ndir {}\npid {}",
        listed.id(),
        unlisted.id(),
        unlisted.id(),
        ours.display(),
        not_ours.display(),
        partial.id(), // no newline: as if the writer died mid-line
    );
    stdin.write_all(script.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(reaper.try_wait().unwrap().is_none(), "exits only at EOF");
    assert!(listed.try_wait().unwrap().is_none(), "kills only at EOF");
    drop(stdin);

    let deadline = Instant::now() + GONE_WITHIN;
    let status = loop {
        if let Some(status) = reaper.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the reaper did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(listed.wait().unwrap().signal(), Some(9));
    let survivors = [unlisted.try_wait().unwrap(), partial.try_wait().unwrap()];
    for s in [&mut unlisted, &mut partial] {
        let _ = s.kill();
        let _ = s.wait();
    }
    assert_eq!(survivors, [None, None], "killed a pid not (fully) listed");
    assert!(!ours.exists());
    let kept = not_ours.is_dir();
    let _ = std::fs::remove_dir_all(&not_ours);
    assert!(kept, "removed a dir that is not a test server's");
}
