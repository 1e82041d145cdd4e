//! Small helpers every layer uses: the wall clock in milliseconds, mutexes that survive
//! a panic in another holder, and spawning work that must go on after its caller.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, by this machine's clock (0 before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
