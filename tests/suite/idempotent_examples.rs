//! Runs `examples/axum_orders.rs` and `examples/actix_orders.rs` in `--demo` mode against
//! a private redis-server (and the axum one against a local Redis Cluster, given by
//! `REDIS_URL` alone): the payment callback is charged once and the flash sale never
//! oversells. The examples need features `axum` / `actix` (`scripts/test.sh` passes
//! `--all-features`); without them cargo does not build them and this test says so.
use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::RedisServer;
use testkit::RedisCluster;

fn example(name: &str) -> Option<PathBuf> {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("examples").join(name);
    path.exists().then_some(path)
}

fn run_demo(name: &str) -> String {
    let server = RedisServer::start();
    run_demo_at(name, &server.url())
}

/// The demo's output (empty when the example is not built).
fn run_demo_at(name: &str, url: &str) -> String {
    let Some(bin) = example(name) else {
        eprintln!("example `{name}` not built (run with --all-features); skipped");
        return String::new();
    };
    let out = Command::new(bin)
        .arg("--demo")
        .env("REDIS_URL", url)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{name} --demo failed: {stdout}");
    assert!(
        stdout.contains(&format!("using Redis at {url}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("charged once: yes (1 charge for 5 deliveries)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("never oversold: yes (5 sold, 0 left of 5)"),
        "{stdout}"
    );
    stdout.into_owned()
}

#[test]
fn axum_orders_demo_charges_once_and_never_oversells() {
    let stdout = run_demo("axum_orders");
    if cfg!(feature = "metrics") && !stdout.is_empty() {
        the_demo_scraped_its_metrics(&stdout);
    }
}

/// The demo's last step scrapes the example's `/metrics` (metrics-exporter-prometheus)
/// after its real requests: 5 callback deliveries with one key, 12 buyers clicking twice
/// for 5 items.
fn the_demo_scraped_its_metrics(stdout: &str) {
    let scraped = stdout
        .split_once("--- /metrics ---\n")
        .and_then(|(_, rest)| rest.split_once("--- end ---"))
        .map(|(metrics, _)| metrics)
        .unwrap_or_else(|| panic!("no /metrics in the demo's output: {stdout}"));
    let value = |series: &str| -> f64 {
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{scraped}"))
    };
    let pay = r#"function="axum_orders::payment_callback""#;
    let buy = r#"function="axum_orders::buy""#;
    let stock = r#"template="stock:<sku>""#;
    assert_eq!(
        value(&format!(
            r#"distlock_idem_calls_total{{{pay},outcome="claimed"}}"#
        )),
        1.0
    );
    assert_eq!(value(&format!("distlock_idem_stored_total{{{pay}}}")), 1.0);
    // Each buyer's first click claims its key; the second replays or finds it in progress.
    assert_eq!(
        value(&format!(
            r#"distlock_idem_calls_total{{{buy},outcome="claimed"}}"#
        )),
        12.0
    );
    assert_eq!(value(&format!("distlock_idem_stored_total{{{buy}}}")), 12.0);
    // Every claimed buy took the sku's lock, once, and released it.
    assert_eq!(
        value(&format!(
            r#"distlock_lock_acquisitions_total{{{stock},outcome="acquired"}}"#
        )),
        12.0
    );
    assert_eq!(
        value(&format!("distlock_lock_held_seconds_count{{{stock}}}")),
        12.0
    );
    assert_eq!(
        value(&format!(
            r#"distlock_lock_wait_seconds_count{{{stock},outcome="acquired"}}"#
        )),
        12.0
    );
    assert_eq!(value(&format!("distlock_lock_waiting{{{stock}}}")), 0.0);
    assert!(
        value(
            r#"db_client_operation_duration_count{db_system_name="redis",db_operation_name="EVALSHA"}"#
        ) > 0.0
    );
    // Labelled by template and function, never by a key.
    assert!(
        !scraped.contains("lock:stock:") && !scraped.contains("pay-notify"),
        "{scraped}"
    );
}

#[test]
fn actix_orders_demo_charges_once_and_never_oversells() {
    run_demo("actix_orders");
}

#[test]
fn axum_orders_demo_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let hosts: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    run_demo_at(
        "axum_orders",
        &format!("redis+cluster://{}", hosts.join(",")),
    );
}
