//! Fences that Postgres checks, in the caller's own transaction (feature `postgres`).
//!
//! [`install`] creates a table of resources and the highest fence seen for each.
//! [`advance`], called inside the transaction that writes a resource, records the
//! writer's fence, or fails with [`Error::StaleFence`] when a larger one was recorded:
//! the caller then rolls back, and its writes with it. The record is an upsert, whose row
//! lock orders concurrent transactions on one resource: a smaller fence never commits
//! after a larger one. An equal fence is accepted (the same holder writing twice).
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool, locks: lockcore::Locks) -> Result<(), Box<dyn std::error::Error>> {
//! use lockcore::fencing::postgres;
//!
//! postgres::install(&pool).await?; // once, at start-up
//!
//! let guard = locks.lock("account:7").acquire().await?;
//! let fence = guard.fence().await?;
//! let mut tx = pool.begin().await?;
//! postgres::advance(&mut tx, "account:7", fence).await?; // StaleFence: dropped, rolled back
//! sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

use sqlx::{PgConnection, PgPool};

use crate::error::{BackendError, BackendErrorKind, Error, Result};

/// The table [`install`] creates and [`advance`] writes.
pub const TABLE: &str = "distlock_fences";

/// Creates the table of resources and their highest fence seen (`distlock_fences`:
/// `resource text primary key`, `fence bigint`), unless it exists. Instances starting
/// together may all call it: a transaction-scoped advisory lock serializes them
/// (`CREATE TABLE IF NOT EXISTS` alone fails in one of two concurrent sessions).
///
/// Errors: [`Error::Backend`] when Postgres fails.
pub async fn install(pool: &PgPool) -> Result<()> {
    let fail = |e: sqlx::Error| failed(TABLE, &e);
    let mut tx = pool.begin().await.map_err(fail)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('distlock_fences'))")
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS distlock_fences \
         (resource text PRIMARY KEY, fence bigint NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(fail)?;
    tx.commit().await.map_err(fail)
}

/// Records `fence` as the highest seen for `resource`, in the transaction (or on the
/// connection) `conn`, when no larger one was recorded; the row stays locked until
/// `conn`'s transaction ends, so a concurrent writer of the same resource waits for it.
///
/// Errors: [`Error::StaleFence`] when a larger fence was recorded (roll the transaction
/// back: the later holder's writes stay); [`Error::Backend`] when Postgres fails or the
/// fence does not fit a `bigint`.
///
/// Under `REPEATABLE READ` or `SERIALIZABLE`, another transaction that advanced the same
/// resource and committed after this transaction's snapshot makes Postgres refuse the
/// record (a serialization failure): that is [`Error::StaleFence`] too, with `seen` equal
/// to `fence`, since the other fence cannot be read in this transaction. Roll back; a
/// holder that still holds its lock may run the transaction again, and its next
/// `advance` tells (under `READ COMMITTED` the second transaction waits for the first
/// and is judged against what it committed).
pub async fn advance(conn: &mut PgConnection, resource: &str, fence: u64) -> Result<()> {
    let Ok(fence_i) = i64::try_from(fence) else {
        return Err(Error::backend(
            resource,
            BackendError::new(
                BackendErrorKind::Config,
                format!("fence {fence} does not fit Postgres's bigint"),
            ),
        ));
    };
    let stored: Option<i64> = sqlx::query_scalar(
        "INSERT INTO distlock_fences AS f (resource, fence) VALUES ($1, $2) \
         ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence \
         WHERE f.fence <= EXCLUDED.fence RETURNING fence",
    )
    .bind(resource)
    .bind(fence_i)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| {
        if serialization_failure(&e) {
            // Another transaction advanced the resource and committed after this one's
            // snapshot (REPEATABLE READ, SERIALIZABLE): its fence cannot be read here.
            Error::StaleFence {
                resource: resource.to_owned(),
                fence,
                seen: fence,
            }
        } else {
            failed(resource, &e)
        }
    })?;
    if stored.is_some() {
        return Ok(());
    }
    // Not updated: the row (locked by the upsert) holds a larger fence.
    let seen: i64 = sqlx::query_scalar("SELECT fence FROM distlock_fences WHERE resource = $1")
        .bind(resource)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| failed(resource, &e))?;
    Err(Error::StaleFence {
        resource: resource.to_owned(),
        fence,
        seen: u64::try_from(seen).unwrap_or(0),
    })
}

/// Whether Postgres refused the statement to keep the transaction serializable
/// (`40001`), or broke a deadlock with it (`40P01`).
fn serialization_failure(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

fn failed(resource: &str, e: &sqlx::Error) -> Error {
    Error::backend(
        resource,
        BackendError::new(BackendErrorKind::Response, format!("postgres: {e}")),
    )
}
