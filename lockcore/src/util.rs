//! Small helpers every layer uses: the wall clock in milliseconds, mutexes that survive
//! a panic in another holder, and spawning work that must go on after its caller.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, by this machine's clock (0 before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `args` formatted into an `Arc<str>` with one allocation (through a stack buffer when
/// it fits): keys and tokens are made on every lock call.
pub(crate) fn arc_str(args: std::fmt::Arguments<'_>) -> Arc<str> {
    struct Buf {
        bytes: [u8; 192],
        len: usize,
    }
    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.len + s.len();
            let room = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
            room.copy_from_slice(s.as_bytes());
            self.len = end;
            Ok(())
        }
    }
    let mut buf = Buf {
        bytes: [0; 192],
        len: 0,
    };
    if buf.write_fmt(args).is_ok()
        && let Ok(text) = std::str::from_utf8(&buf.bytes[..buf.len])
    {
        return Arc::from(text);
    }
    Arc::from(std::fmt::format(args))
}

/// Locks `m`, also when another holder panicked: every state kept under these mutexes
/// stays consistent between statements (maps, counters, queues).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `fut` in a task of its own on the current tokio runtime, with the caller's
/// `tracing` subscriber: work that must go on after its caller (a release, a store).
/// Outside a runtime `fut` is dropped and `false` returned: the caller says what that
/// leaves behind.
pub(crate) fn spawn_here<F: Future<Output = ()> + Send + 'static>(fut: F) -> bool {
    use tracing::instrument::WithSubscriber as _;
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(fut.with_current_subscriber());
            true
        }
        Err(_) => false,
    }
}
