//! What a server's error reply means for the connection it came on and for the client:
//! the one decision the shared connection, the direct pool and the connections to a
//! Sentinel's primary take, and the one that says when a capability is missing; what a
//! call that timed out means for its connection ([`after_timeout`]); and how long one
//! cluster node's handshake may take ([`node_connect_bound`]).
//!
//! | reply | the connection | the client | the caller |
//! |---|---|---|---|
//! | `ERR unknown command`, a syntax error for an option the server lacks, `NOPERM` | kept | the capability off (native commands, `SET NX GET`: scripts instead) until the next connection's look at the server | the call again through the scripts |
//! | `BUSY`, `LOADING`, `MASTERDOWN`, `OOM`, `TRYAGAIN` | kept | capabilities kept | `Backend` (the command did not run) |
//! | `READONLY` (a demoted primary: a failover, or a name that moved to a new primary) | closed, with the idle direct connections | a possible restart counted (`epoch`); the next connection looks the primary up again | `Backend` |
//! | `WRONGTYPE` (a key of another kind) | kept | capabilities kept | a release or renewal: the lock lost; an acquire: `WrongKind` |
//! | a broken connection | closed (the multiplexed one is remade, a direct one dropped with the idle ones) | a possible restart counted | `Backend` |
//! | no reply within the command timeout | a direct one closed (out of step); the multiplexed one kept and checked (the calls that need it wait for the verdict): closed as broken if a `PING` on it gets no answer, or another reply than its own, within half the command timeout; a cluster's kept | a possible restart counted where closed, and on a cluster | `Backend` (`Timeout`) |
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
/// stalled host whose kernel still accepts connections) costs a new client this, twice
/// at most (half the connect timeout), where a bound of the whole connect timeout made
/// the attempt outlast itself and no new client connected while the node hung.
///
/// Never less than a second, or the whole connect timeout where it is shorter: a quarter
/// of a short timeout would refuse a slow but healthy node (TLS across regions, a busy
/// server), every node alike, and no client would connect.
pub(crate) fn node_connect_bound(connect: Duration) -> Duration {
    (connect / 4).max(connect.min(Duration::from_secs(1)))
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
    /// In step but perhaps dead (a call on it timed out): kept, and checked with a `PING`
    /// within half the command timeout; closed as [`Broken`](Self::Broken) if none
    /// answers, or another reply comes (out of step: a reply lost on the way).
    Suspect,
}

/// Which kind of shared connection a call was on. (A direct connection serves one call
/// at a time and reads replies in order: one whose call timed out is out of step, and
/// goes with the call's future, which owns it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carrier {
    /// The multiplexed connection of a runtime (one server, Sentinel's primary).
    Multiplexed,
    /// A cluster connection (redis-rs's, one per node within).
    Cluster,
}

/// What a call that timed out means for the connection it was on (see the module docs).
/// Only a connection that is itself dead is closed: the multiplexed one every call of a
/// runtime shares stays for the others (lock calls and renewals would pay its reconnect,
/// and where the server's `run_id` cannot be read, count a possible restart) unless a
/// `PING` on it goes unanswered too.
pub(super) fn after_timeout(on: Carrier) -> AfterError {
    match on {
        // Each reply is matched to its call and a late one dropped (redis-rs's
        // multiplexed connection): late is not broken. But a server gone without closing
        // the socket (a host that died, a cut link) times out every call until the
        // connection is closed: checked.
        Carrier::Multiplexed => AfterError::Suspect,
        // redis-rs matches the replies and checks and remakes its nodes' connections.
        Carrier::Cluster => AfterError::Keep,
    }
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
