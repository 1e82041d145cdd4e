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

fn run_demo(name: &str) {
    let server = RedisServer::start();
    run_demo_at(name, &server.url());
}

fn run_demo_at(name: &str, url: &str) {
    let Some(bin) = example(name) else {
        eprintln!("example `{name}` not built (run with --all-features); skipped");
        return;
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
}

#[test]
fn axum_orders_demo_charges_once_and_never_oversells() {
    run_demo("axum_orders");
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
