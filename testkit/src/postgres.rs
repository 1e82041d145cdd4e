//! A private Postgres server for the fencing tests: `initdb` into a temp dir, then
//! `postgres` on a free port (trust authentication, no durability: test data only). It
//! stops, and its directory goes, when dropped or, through the reaper, when the test
//! process ends however it ends. Run as root (CI), it runs as the `postgres` user, since
//! `initdb` refuses root.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, tell_reaper};

/// A running Postgres server; stopped on drop.
pub struct PgServer {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl PgServer {
    /// Makes a cluster in a new temp dir and starts it on a free port; waits until it
    /// accepts connections.
    pub fn start() -> PgServer {
        let bin = bin_dir();
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("distlock-test-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        tell_reaper("dir", dir.to_str().expect("temp dir path is UTF-8"));
        let user = run_as();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the temp dir");
        }
        let data = dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .stdout(Stdio::null());
        as_user(&mut initdb, user);
        let out = initdb
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb (install postgresql): {e}"));
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut postgres = Command::new(bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(&dir)
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_user(&mut postgres, user);
        let child = postgres.spawn().expect("start postgres");
        tell_reaper("pid", &child.id().to_string());
        let server = PgServer {
            port,
            child: Some(child),
            dir,
        };
        server.wait_ready(&bin);
        server
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn wait_ready(&self, bin: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let listening = TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            let ready = listening
                && Command::new(bin.join("pg_isready"))
                    .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                    .status()
                    .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A fast shutdown (SIGINT) lets it remove its shared memory; SIGKILL after 5 s.
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            tell_reaper("unpid", &child.id().to_string());
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where `initdb`, `postgres` and `pg_isready` are: beside `initdb` on the `PATH`, else
/// the newest `/usr/lib/postgresql/<version>/bin` (where Debian's package puts them).
fn bin_dir() -> PathBuf {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let initdb = dir.join("initdb");
            if initdb.is_file() {
                let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
                return real.parent().map(Path::to_path_buf).unwrap_or(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .expect("no initdb on the PATH or in /usr/lib/postgresql (install postgresql)")
}

/// The `postgres` user's uid and gid when this process runs as root (`initdb` refuses
/// root); `None` otherwise.
fn run_as() -> Option<(u32, u32)> {
    let me = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("running as root needs the `postgres` user (the postgresql package makes it)");
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields[2].parse().unwrap(), fields[3].parse().unwrap()))
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid).env("HOME", "/tmp");
    }
}
