//! The one error type of distlock.

use std::fmt;
use std::time::Duration;

/// Result type whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while taking, holding or releasing a lock.
///
/// Map it into your own error type with `From`; that is what the attributes require of
/// the annotated function's error type.
///
/// ```
/// #[derive(Debug)]
/// enum AppError {
///     Lock(lockcore::Error),
/// }
///
/// impl From<lockcore::Error> for AppError {
///     fn from(e: lockcore::Error) -> Self {
///         AppError::Lock(e)
///     }
/// }
///
/// let e: AppError = lockcore::Error::Lost { key: "lock:order:42".into() }.into();
/// assert!(matches!(e, AppError::Lock(lockcore::Error::Lost { .. })));
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by someone else and could not be taken within `wait`.
    /// The body did not run.
    #[error("lock `{key}` is busy (waited {waited:?})")]
    Busy {
        /// The full Redis key.
        key: String,
        /// How long the call tried before giving up.
        waited: Duration,
    },
    /// Fewer replicas than asked (`replicas = n`) acknowledged the write within half the
    /// command timeout (Redis `WAIT`): a failover now could lose it. A lock or claim just
    /// taken was given back and the body did not run; a fence was not given; a stored
    /// idempotent result stays on the primary, and the call is told. Retry later.
    #[error("`{key}`: {acked} of {wanted} replicas acknowledged the write in time")]
    NotReplicated {
        /// The full Redis key.
        key: String,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },
    /// The lock expired or was taken by another holder while the body ran: another
    /// holder may have run the same critical section at the same time.
    #[error("lock `{key}` was lost while it was held (it expired or another holder took it)")]
    Lost {
        /// The full Redis key.
        key: String,
    },
    /// A write under a fence smaller than one the storage has already seen for the same
    /// resource: a holder that lost its lock (paused past its lease, say) wrote after
    /// the next holder. Nothing was written; the later holder's value stays.
    #[error("stale fence {fence} for `{resource}`: fence {seen} was already seen")]
    StaleFence {
        /// What was written to: a key, a row, a file.
        resource: String,
        /// The writer's fence.
        fence: u64,
        /// The highest fence the storage had seen, which refused the write.
        seen: u64,
    },
    /// Redis could not be reached or answered with an error, within the command timeout.
    #[error("lock backend failed for `{key}`: {source}")]
    Backend {
        /// The full Redis key, or the client's address when no key was involved.
        key: String,
        /// What failed.
        #[source]
        source: BackendError,
    },
    /// The key cannot be used: an empty lock key or one that would change its hash slot,
    /// or an idempotency key header that is empty, too long or not visible ASCII.
    /// Nothing was sent to Redis.
    #[error("invalid key `{key}`: {reason}")]
    InvalidKey {
        /// The key as given (for a header: escaped and shortened for display).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The request cannot be made as asked: a semaphore with no permits, a fence of a
    /// semaphore's permit (its holders run side by side: a fence orders a lock's), or
    /// `min_hold` on a semaphore. Nothing was sent to Redis.
    #[error("`{key}`: {reason}")]
    Unsupported {
        /// The full Redis key.
        key: String,
        /// What cannot be done, and what to do instead.
        reason: String,
    },
    /// The name is held as another kind (a lock's key holding a semaphore, say): a name
    /// is one kind at a time, and the kinds that cannot exclude each other refuse each
    /// other alike on every backend (see "What each primitive writes" in the crate
    /// docs). Nothing was taken.
    #[error("`{key}` is held as {held}, so it cannot be taken as {asked}")]
    WrongKind {
        /// The full key.
        key: String,
        /// What holds it.
        held: crate::key::Kind,
        /// What was asked for.
        asked: crate::key::Kind,
    },
    /// `#[idempotent]`: another call with the same key is still running (its claim's
    /// lease has not ended). The body did not run; retry after `retry_after`.
    #[error(
        "idempotency key `{key}` is in use by a call still in progress (retry after {retry_after:?})"
    )]
    InProgress {
        /// The full Redis key of the record.
        key: String,
        /// How long to wait before retrying: about how long a body of this fn took
        /// lately in this process (1 s before one has completed), never more than the
        /// running call's lease left.
        retry_after: Duration,
    },
    /// `#[idempotent]`: the key was used before with a different payload. The body did
    /// not run.
    #[error("idempotency key `{key}` was already used with a different payload")]
    PayloadMismatch {
        /// The full Redis key of the record.
        key: String,
    },
    /// `#[idempotent]`: a value the record must hold cannot be written: an argument of
    /// the payload that fails to serialize (a `u128` above `u64::MAX`, a map with
    /// non-string keys, a `Serialize` impl that errors: the call is refused before
    /// anything is claimed, so no payload is ever fingerprinted without it), or a first
    /// call's `Ok` value that does not serialize or does not read back as itself (it ran
    /// once; its caller got the value, every repeat gets this error for the record's
    /// retention, and the body never runs again under that key).
    #[error("idempotency key `{key}`: {reason}")]
    Unrepresentable {
        /// The full Redis key of the record.
        key: String,
        /// What could not be written, and why.
        reason: String,
    },
    /// `#[idempotent(header = ...)]`: the request has no such header. Nothing was sent to
    /// Redis and the body did not run.
    #[error("the request has no `{header}` header, which this endpoint requires")]
    MissingKey {
        /// The header's name.
        header: String,
    },
}

impl Error {
    /// The full Redis key the error is about (for [`Error::MissingKey`], the header's
    /// name; for [`Error::StaleFence`], the resource).
    ///
    /// ```
    /// let e = lockcore::Error::Lost { key: "lock:a".into() };
    /// assert_eq!(e.key(), "lock:a");
    /// ```
    pub fn key(&self) -> &str {
        match self {
            Error::Busy { key, .. }
            | Error::Lost { key }
            | Error::Backend { key, .. }
            | Error::InvalidKey { key, .. }
            | Error::Unsupported { key, .. }
            | Error::InProgress { key, .. }
            | Error::NotReplicated { key, .. }
            | Error::PayloadMismatch { key }
            | Error::Unrepresentable { key, .. }
            | Error::WrongKind { key, .. } => key,
            Error::StaleFence { resource, .. } => resource,
            Error::MissingKey { header } => header,
        }
    }

    /// Whether retrying the same call later may succeed (`Busy`, `Backend`,
    /// `NotReplicated` and `InProgress`).
    ///
    /// ```
    /// let e = lockcore::Error::Busy { key: "lock:a".into(), waited: Default::default() };
    /// assert!(e.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Busy { .. }
                | Error::Backend { .. }
                | Error::NotReplicated { .. }
                | Error::InProgress { .. }
        )
    }

    pub(crate) fn backend(key: &str, source: BackendError) -> Self {
        Error::Backend {
            key: key.to_owned(),
            source,
        }
    }
}

/// Why the backend failed: a timeout, a connection problem or an error reply.
#[derive(Debug, Clone)]
pub struct BackendError {
    kind: BackendErrorKind,
    detail: String,
    /// A cluster node answered `TRYAGAIN`: a call's keys are split between the two nodes
    /// of a slot being migrated.
    split: bool,
    /// Redis answered `WRONGTYPE`: the key holds another kind of value.
    wrong_type: bool,
    /// Redis said it has no such command or form, or the user may not run it (see
    /// [`capability_missing`]).
    missing: bool,
    /// A release whose native compare-and-delete answered 0 (the lock lost, or marked
    /// by a waiter) failed before `release.lua` answered: a retry that finds the key not
    /// this holder's cannot tell a release that happened from a lock lost.
    undecided: bool,
}

/// The broad class of a [`BackendError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// No answer within the command timeout.
    Timeout,
    /// The connection could not be made or broke.
    Connection,
    /// Redis answered with an error, or the reply had an unexpected shape.
    Response,
    /// The client is misconfigured (a bad URL, no tokio runtime).
    Config,
}

impl BackendError {
    pub(crate) fn new(kind: BackendErrorKind, detail: impl Into<String>) -> Self {
        BackendError {
            kind,
            detail: detail.into(),
            split: false,
            wrong_type: false,
            missing: false,
            undecided: false,
        }
    }

    /// A `WRONGTYPE` answer, as the in-memory backend gives it where Redis would.
    pub(crate) fn wrong_type(detail: impl Into<String>) -> Self {
        let mut error = Self::new(BackendErrorKind::Response, detail);
        error.wrong_type = true;
        error
    }

    /// Whether Redis said it has no such command (or form of it), or that this user may
    /// not run it: the one answer that turns a capability (native commands, `SET NX
    /// GET`) off. `BUSY`, `LOADING`, `MASTERDOWN`, `OOM`, `READONLY` and timeouts say
    /// nothing of the server's commands: the call fails, the capability stays.
    pub(crate) fn is_capability_missing(&self) -> bool {
        self.missing
    }

    /// Whether Redis answered `WRONGTYPE` (by its error code, not the text).
    pub(crate) fn is_wrong_type(&self) -> bool {
        self.wrong_type
    }

    /// Whether this is the failure of a release after its native compare-and-delete
    /// answered 0 (see the field).
    pub(crate) fn is_undecided(&self) -> bool {
        self.undecided
    }

    /// This error, marked as the failure of a release after its native compare-and-delete
    /// answered 0.
    pub(crate) fn undecided(mut self) -> Self {
        self.undecided = true;
        self
    }

    /// Whether a cluster node answered that the call's keys are split between the two
    /// nodes of a slot being migrated (`TRYAGAIN`): a call on fewer keys may run.
    pub(crate) fn is_split(&self) -> bool {
        self.split
    }

    pub(crate) fn timeout(limit: Duration) -> Self {
        Self::new(
            BackendErrorKind::Timeout,
            format!("no reply within {limit:?}"),
        )
    }

    /// Whether the request may have been lost in flight (a timeout or a broken
    /// connection): it may or may not have run, and trying again is reasonable.
    ///
    /// ```
    /// # async fn demo() {
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:1/").build().unwrap();
    /// if let Err(lockcore::Error::Backend { source, .. }) = locks.lock("a").acquire().await {
    ///     assert!(source.is_transient());
    /// }
    /// # }
    /// ```
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            BackendErrorKind::Timeout | BackendErrorKind::Connection
        )
    }

    /// The broad class of the failure.
    ///
    /// ```
    /// # async fn demo() {
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:1/").build().unwrap();
    /// if let Err(lockcore::Error::Backend { source, .. }) = locks.lock("a").acquire().await {
    ///     assert_eq!(source.kind(), lockcore::BackendErrorKind::Connection);
    /// }
    /// # }
    /// ```
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::Connection => "connection",
            BackendErrorKind::Response => "response",
            BackendErrorKind::Config => "configuration",
        };
        write!(f, "{kind}: {}", self.detail)
    }
}

impl std::error::Error for BackendError {}

impl From<redis::RedisError> for BackendError {
    fn from(e: redis::RedisError) -> Self {
        let kind = if e.is_timeout() {
            BackendErrorKind::Timeout
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            BackendErrorKind::Connection
        } else {
            BackendErrorKind::Response
        };
        let mut error = BackendError::new(kind, e.to_string());
        error.split = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain);
        error.wrong_type = is_wrong_type(&e);
        error.missing = capability_missing(&e);
        error
    }
}

/// Whether Redis answered `WRONGTYPE` (a key of another kind), by the error code: the
/// reply of one command, or every failed command of a pipeline.
pub(crate) fn is_wrong_type(e: &redis::RedisError) -> bool {
    e.code() == Some("WRONGTYPE")
        || e.clone().into_server_errors().is_some_and(|failed| {
            !failed.is_empty() && failed.iter().all(|(_, s)| s.code() == "WRONGTYPE")
        })
}

/// Whether Redis answered that it has no such command or form of one (`ERR unknown
/// command`, `ERR syntax error` for an option it lacks, `ERR unknown subcommand`), or
/// that the user may not run it (`NOPERM`): for one command, or any failed command of a
/// pipeline. The one decision of when a capability is missing (see
/// [`BackendError::is_capability_missing`]).
pub(crate) fn capability_missing(e: &redis::RedisError) -> bool {
    // `NOPERM` for the command itself (`No permissions to run the ... command`), not for
    // a key outside the user's patterns, which says nothing of the server's commands.
    let says = |code: Option<&str>, text: &str| {
        let text = text.to_ascii_lowercase();
        (code == Some("NOPERM") && text.contains("permissions to run"))
            || text.contains("unknown command")
            || text.contains("unknown subcommand")
            || text.contains("syntax error")
    };
    match e.clone().into_server_errors() {
        Some(failed) => failed
            .iter()
            .any(|(_, s)| says(Some(s.code()), &s.to_string())),
        None => says(e.code(), &e.to_string()),
    }
}
