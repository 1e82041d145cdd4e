//! Fences that the storage checks: the other half of fencing tokens.
//!
//! A fence ([`LockGuard::fence`](crate::LockGuard::fence)) only protects data if the
//! storage refuses a write under a smaller fence than one it has already seen. Then a
//! holder paused past its lease (a GC pause, a stalled VM) that writes after the next
//! holder is refused, however late it wakes. [`Locks::set_fenced`] is that check for a
//! value kept in Redis itself; [`postgres`] (feature `postgres`) is the same check for
//! rows in Postgres, inside the caller's own transaction.

#[cfg(feature = "postgres")]
pub mod postgres;

use crate::backend::Locking;
use crate::client::Locks;
use crate::error::{Error, Result};

impl Locks {
    /// Stores `value` at the Redis key `key` (as given, without the lock prefix) only
    /// when `fence` is at least as large as the highest fence seen for that key, and
    /// records `fence` as the highest. An equal fence is accepted (the same holder
    /// writing twice). One script: the comparison and the write are atomic, and the
    /// highest fence is kept beside the value (`{key}:fence-seen`, in its hash slot).
    /// The value stays plain UTF-8 that any client reads with `GET`. Written this way
    /// the value has no ttl, and neither has its record of the highest fence; for a
    /// value that should expire, see [`set_fenced_with_ttl`](Self::set_fenced_with_ttl).
    ///
    /// Errors: [`Error::StaleFence`] when a larger fence was seen (nothing is written),
    /// [`Error::InvalidKey`] (also for a key under the locks' prefix, or one of
    /// distlock's companion keys: a fenced value never shares a name with a lock),
    /// [`Error::Backend`]; over Redlock a `Backend` error says it
    /// is not available there, as fences are not.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let guard = locks.lock("stock:7").acquire().await.unwrap();
    /// let fence = guard.fence().await.unwrap();
    /// locks.set_fenced("stock:7:count", "41", fence).await.unwrap();
    /// // A holder that lost the lock long ago comes back with its old fence:
    /// let late = locks.set_fenced("stock:7:count", "42", fence - 1).await;
    /// assert!(matches!(late, Err(lockcore::Error::StaleFence { .. })));
    /// assert_eq!(locks.fenced_value("stock:7:count").await.unwrap(), (Some("41".into()), fence));
    /// # guard.release().await.unwrap();
    /// # }
    /// ```
    pub async fn set_fenced(&self, key: &str, value: &str, fence: u64) -> Result<()> {
        self.fenced_write(key, value, fence, None).await
    }

    /// [`set_fenced`](Self::set_fenced) for a value that expires `ttl` after it is
    /// written. The record of the highest fence seen (`{key}:fence-seen`) gets the same
    /// ttl, so it lives as long as the value it guards and goes with it: once both
    /// expired, the next write is the first of a new value, whatever its fence. A later
    /// write sets the lifetime of both again (a plain [`set_fenced`](Self::set_fenced):
    /// none). A value deleted by another client (`DEL`) leaves its record, which refuses
    /// only smaller fences: delete `{key}:fence-seen` with it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::in_memory();
    /// let guard = locks.lock("quote:7").acquire().await.unwrap();
    /// let fence = guard.fence().await.unwrap();
    /// locks
    ///     .set_fenced_with_ttl("quote:7:price", "12.50", fence, Duration::from_secs(300))
    ///     .await
    ///     .unwrap();
    /// # guard.release().await.unwrap();
    /// # }
    /// ```
    pub async fn set_fenced_with_ttl(
        &self,
        key: &str,
        value: &str,
        fence: u64,
        ttl: std::time::Duration,
    ) -> Result<()> {
        self.fenced_write(key, value, fence, Some(ttl)).await
    }

    async fn fenced_write(
        &self,
        key: &str,
        value: &str,
        fence: u64,
        ttl: Option<std::time::Duration>,
    ) -> Result<()> {
        self.check_fenced(key)?;
        match self.inner.backend.set_fenced(key, value, fence, ttl).await {
            Ok(None) => Ok(()),
            Ok(Some(seen)) => Err(Error::StaleFence {
                resource: key.to_owned(),
                fence,
                seen,
            }),
            Err(e) => Err(Error::backend(key, e)),
        }
    }

    /// The value [`set_fenced`](Self::set_fenced) stored at `key`, and the highest fence
    /// seen for it (0 when none).
    pub async fn fenced_value(&self, key: &str) -> Result<(Option<String>, u64)> {
        self.check_fenced(key)?;
        self.inner
            .backend
            .fenced_value(key)
            .await
            .map_err(|e| Error::backend(key, e))
    }

    /// A fenced value's key: a valid key outside the locks' prefix (a fenced value
    /// written over a lock's key would take it from its holder).
    fn check_fenced(&self, key: &str) -> Result<()> {
        crate::key::checked(key)?;
        let prefix = &self.inner.prefix;
        if !prefix.is_empty() && key.starts_with(prefix.as_str()) {
            return Err(Error::InvalidKey {
                key: key.to_owned(),
                reason: format!(
                    "a fenced value's key must not start with the locks' prefix `{prefix}`: \
                     it would share a name with a lock"
                ),
            });
        }
        Ok(())
    }
}
