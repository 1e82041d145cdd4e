//! What a server's error reply means for the connection it came on and for the client:
//! the one decision the shared connection, the direct pool and the connections to a
//! Sentinel's primary take, and the one that says when a capability is missing; and how
//! long one cluster node's handshake may take ([`node_connect_bound`]).
//!
//! | reply | the connection | the client | the caller |
//! |---|---|---|---|
//! | `ERR unknown command`, a syntax error for an option the server lacks, `NOPERM` | kept | the capability off (native commands, `SET NX GET`: scripts instead) until the next connection's look at the server | the call again through the scripts |
//! | `BUSY`, `LOADING`, `MASTERDOWN`, `OOM`, `TRYAGAIN` | kept | capabilities kept | `Backend` (the command did not run) |
//! | `READONLY` (a demoted primary: a failover, or a name that moved to a new primary) | closed, with the idle direct connections | a possible restart counted (`epoch`); the next connection looks the primary up again | `Backend` |
//! | `WRONGTYPE` (a key of another kind) | kept | capabilities kept | a release or renewal: the lock lost; an acquire: `WrongKind` |
//! | a broken connection, a timeout | closed (the multiplexed one is remade, a direct one dropped with the idle ones) | a possible restart counted | `Backend` |
//! | `MOVED`, `ASK` (a cluster) | kept | the slot map read again | followed within the call |

/// How many tokio runtimes' connections one client keeps, of each kind (see
/// `util::MAX_RUNTIMES`, below the notifier's layer).
pub(crate) use crate::util::MAX_RUNTIMES;

use std::time::Duration;

/// How long one cluster node's handshake may take while a cluster connection is made
/// (redis-rs's per-node connection timeout), of the connect timeout `connect`: a quarter
/// of it, as a direct connection waits a quarter of the command timeout. redis-rs makes
/// a cluster connection from the nodes that answered once every node answered or timed
/// out, first the nodes given, then those of the slot map: a node that hangs (SIGSTOP, a
/// stalled host whose kernel still accepts connections) costs a new client twice this,
/// half the connect timeout, where a bound of the whole connect timeout made the attempt
/// outlast itself and no new client connected while the node hung.
pub(crate) fn node_connect_bound(connect: Duration) -> Duration {
    connect / 4
}

/// What becomes of a connection after an error on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterError {
    /// In step, and its server still the one to talk to: kept.
    Keep,
    /// Its server was demoted (`READONLY`): closed with its idle siblings, so the next
    /// connection finds the primary (behind a name that moved, or through the sentinels).
    Demoted,
    /// Broken, or out of step (a timeout, a reply not read): closed.
    Broken,
}

/// What `e` means for the connection it came on (see the module docs).
pub(super) fn after_error(e: &redis::RedisError) -> AfterError {
    // `READONLY` itself, in a pipeline or a transaction (`EXECABORT`), or raised by a
    // script's write (`-READONLY` inside its error, on servers before 7.0).
    let demoted = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || e.to_string().contains("READONLY")
        || e.clone().into_server_errors().is_some_and(|failed| {
            failed
                .iter()
                .any(|(_, s)| s.code() == "READONLY" || s.to_string().contains("READONLY"))
        });
    if demoted {
        return AfterError::Demoted;
    }
    // A reply not understood leaves the stream out of step; one of another type than
    // asked for (read whole) does not.
    if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.kind() == redis::ErrorKind::Parse
    {
        return AfterError::Broken;
    }
    AfterError::Keep
}
