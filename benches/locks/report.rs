//! The printed report: figures side by side, ratios, and targets met or not.
#![allow(clippy::wildcard_imports)]
use std::sync::Arc;

use crate::*;

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

pub(crate) struct Table {
    pub(crate) rows: Vec<[String; 5]>,
}

impl Table {
    pub(crate) fn new() -> Table {
        Table {
            rows: vec![[
                "workload".into(),
                "figure".into(),
                "distlock".into(),
                "raw redis-rs".into(),
                "ratio".into(),
            ]],
        }
    }

    /// A row whose ratio is distlock / raw.
    pub(crate) fn num(&mut self, w: &str, figure: &str, d: f64, r: f64, decimals: usize) {
        let ratio = if r != 0.0 {
            format!("{:.2}x", d / r)
        } else {
            "-".into()
        };
        self.rows.push([
            w.into(),
            figure.into(),
            format!("{d:.decimals$}"),
            format!("{r:.decimals$}"),
            ratio,
        ]);
    }

    pub(crate) fn text(&mut self, w: &str, figure: &str, d: String, r: String, ratio: String) {
        self.rows.push([w.into(), figure.into(), d, r, ratio]);
    }

    pub(crate) fn print(&self) {
        let mut width = [0usize; 5];
        for row in &self.rows {
            for (i, c) in row.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        for (n, row) in self.rows.iter().enumerate() {
            let line: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i < 2 {
                        format!("{c:<w$}", w = width[i])
                    } else {
                        format!("{c:>w$}", w = width[i])
                    }
                })
                .collect();
            println!("  {}", line.join("  "));
            if n == 0 {
                println!("  {}", "-".repeat(width.iter().sum::<usize>() + 8));
            }
        }
    }
}

pub(crate) fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

/// The pairs/s row of one uncontended workload: raw, raw+lua, distlock.
pub(crate) fn print_rate_row(name: &str, d: &Uncontended, r: &Uncontended, l: &Uncontended) {
    println!(
        "  {name:<4} {:>30} {:>10.0} {:>10.0} {:>10.0}",
        "pairs/s",
        r.rate(),
        l.rate(),
        d.rate()
    );
}

/// The CPU rows of one uncontended workload: redis-server's and this process's, per pair.
pub(crate) fn print_cpu_rows(name: &str, d: &Uncontended, r: &Uncontended, l: &Uncontended) {
    println!(
        "  {name:<4} {:>30} {:>10.1} {:>10.1} {:>10.1}",
        "redis-server CPU us per pair",
        r.server_us(),
        l.server_us(),
        d.server_us()
    );
    println!(
        "  {name:<4} {:>30} {:>10.1} {:>10.1} {:>10.1}",
        "client (bench process) CPU us",
        r.client_us(),
        l.client_us(),
        d.client_us()
    );
}

/// W2F: the fenced cycle (acquire, fence, release) of each implementation.
fn print_w2f(w2f: &[Uncontended; 3]) {
    let [d, r, l] = w2f;
    println!("\nW2F: fenced cycles (acquire, fence, release), 64 tasks on their own keys:");
    println!(
        "  {:<36} {:>10} {:>10} {:>10}",
        "", "raw", "raw+lua", "distlock"
    );
    println!(
        "  {:<36} {:>10.0} {:>10.0} {:>10.0}",
        "cycles/s",
        r.rate(),
        l.rate(),
        d.rate()
    );
    println!(
        "  {:<36} {:>10.1} {:>10.1} {:>10.1}",
        "redis-server CPU us per cycle",
        r.server_us(),
        l.server_us(),
        d.server_us()
    );
    let (mid, lo, hi) = round_ratios(d, r);
    println!("  distlock / raw per round: median {mid:.2}x, range {lo:.2}x-{hi:.2}x");
    for (name, u) in [("distlock", d), ("raw", r), ("raw+lua", l)] {
        if u.errors > 0 {
            println!("  W2F errors: {name} {}", u.errors);
        }
    }
}

/// The uncontended targets: RT, W1, W2 (rate and redis-server CPU), W2F.
fn print_uncontended_targets(
    wire: &[WireCount],
    w1: &[Uncontended; 3],
    w2: &[Uncontended; 3],
    w2f: &[Uncontended; 3],
) {
    let r1x = w1[0].rate() / w1[1].rate();
    let r2x = w2[0].rate() / w2[1].rate();
    let cpu2x = w2[0].server_us() / w2[1].server_us();
    // "A fenced cycle at most 1.1x": its time per cycle against the baseline's.
    let fx = w2f[1].rate() / w2f[0].rate();
    println!(
        "  RT  2 round trips per acquire+release:   distlock {:.2} {}   (raw {:.2})",
        wire[0].per_pair,
        verdict(wire[0].per_pair == 2.0),
        wire[1].per_pair
    );
    println!(
        "  W1  pairs/s >= 1.0x raw:                  {r1x:.2}x {}",
        verdict(r1x >= 1.0)
    );
    println!(
        "  W2  pairs/s >= 0.95x raw:                 {r2x:.2}x {}",
        verdict(r2x >= 0.95)
    );
    println!(
        "  W2  redis-server CPU per pair <= 1.15x:   {cpu2x:.2}x {}   ({:.1} us vs {:.1} us)",
        verdict(cpu2x <= 1.15),
        w2[0].server_us(),
        w2[1].server_us()
    );
    println!(
        "  W2F time per fenced cycle <= 1.1x raw:    {fx:.2}x {}   (SET NX PX + INCR + compare-and-delete)",
        verdict(fx <= 1.1)
    );
}

/// `DISTLOCK_BENCH_ONLY=uncontended`: RT, W1, W2 and W2F only.
fn print_uncontended(
    wire: &[WireCount],
    w1: &[Uncontended; 3],
    w2: &[Uncontended; 3],
    w2f: &[Uncontended; 3],
) {
    println!(
        "\n  {:<4} {:>30} {:>10} {:>10} {:>10}",
        "", "", "raw", "raw+lua", "distlock"
    );
    for (name, [d, r, l]) in [("W1", w1), ("W2", w2)] {
        print_rate_row(name, d, r, l);
        print_cpu_rows(name, d, r, l);
        let (mid, lo, hi) = round_ratios(d, r);
        println!("  {name} distlock / raw per round: median {mid:.2}x, range {lo:.2}x-{hi:.2}x");
    }
    print_w2f(w2f);
    println!("\nTargets (informational; a bench never fails):");
    print_uncontended_targets(wire, w1, w2, w2f);
}

/// `DISTLOCK_BENCH_ONLY=tls` (built with `--features tls`): W1 on the plain port and W1
/// over TLS on a server of its own, distlock's direct connections speaking TLS there,
/// each against raw redis-rs on the same kind of connection, in one run.
#[cfg(feature = "tls")]
async fn run_w1_tls(cfg: &Config, url: &str) {
    let plain = [
        Arc::new(Client::connect(Kind::Distlock, url).await),
        Arc::new(Client::connect(Kind::Raw, url).await),
        Arc::new(Client::connect(Kind::RawLua, url).await),
    ];
    let w1 = run_w1(cfg, &[url.to_owned()], &plain).await;
    drop(plain);
    let (server, files) = testkit::RedisServer::start_tls(false);
    let tls = [
        Arc::new(Client::connect_tls(Kind::Distlock, &files).await),
        Arc::new(Client::connect_tls(Kind::Raw, &files).await),
        Arc::new(Client::connect_tls(Kind::RawLua, &files).await),
    ];
    let w1t = run_w1(cfg, &[server.url()], &tls).await;
    drop(tls);
    println!(
        "
  {:<4} {:>30} {:>10} {:>10} {:>10}",
        "", "", "raw", "raw+lua", "distlock"
    );
    for (name, [d, r, l]) in [("W1", &w1), ("W1T", &w1t)] {
        print_rate_row(name, d, r, l);
        print_cpu_rows(name, d, r, l);
        let (mid, lo, hi) = round_ratios(d, r);
        println!("  {name} distlock / raw per round: median {mid:.2}x, range {lo:.2}x-{hi:.2}x");
    }
    println!(
        "  W1 plain: {:.2}x raw; W1T over TLS: {:.2}x raw (direct connections on both)",
        w1[0].rate() / w1[1].rate(),
        w1t[0].rate() / w1t[1].rate()
    );
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

pub(crate) async fn run(cfg: &Config, server: &testkit::RedisServer) {
    let url = server.url();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "distlock bench: redis-server {} on 127.0.0.1:{} (private, save \"\", appendonly no), {cores} CPUs, {} mode",
        testkit::redis_server_version(),
        server.port,
        if cfg.quick {
            "QUICK (counts / 10)"
        } else {
            "full"
        }
    );
    println!(
        "  baseline = raw redis-rs: SET NX PX + EVALSHA compare-and-delete on one multiplexed connection, 50 ms polling"
    );
    println!("  TTL 30 s everywhere; ratio = distlock / raw\n");
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("w5")) {
        print_w5(&run_w5(&url, cfg.w5_rounds, cfg.w5_keys).await);
        return;
    }

    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("redlock")) {
        run_redlock(cfg).await;
        return;
    }
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("w6")) {
        run_w6(cfg, &url).await;
        return;
    }
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("w7")) {
        run_w7(cfg, &url).await;
        return;
    }
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("scaling")) {
        run_scaling(cfg).await;
        return;
    }
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("keys")) {
        run_many_keys(cfg, &url).await;
        return;
    }
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("family")) {
        run_family(cfg, &url).await;
        return;
    }
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("cluster")) {
        run_cluster(cfg).await;
        return;
    }

    #[cfg(feature = "tls")]
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("tls")) {
        run_w1_tls(cfg, &url).await;
        return;
    }

    let mut wire = Vec::new();
    for kind in [Kind::Distlock, Kind::Raw] {
        let count = count_round_trips(kind, &url, server.port, cfg.rt_pairs).await;
        println!(
            "  RT {:<8} {:.2} commands per acquire+release on the wire {:?}, plus {:.1} run inside Lua",
            kind.name(),
            count.per_pair,
            count.commands,
            count.lua as f64 / cfg.rt_pairs as f64
        );
        wire.push(count);
    }

    let clients = [
        Arc::new(Client::connect(Kind::Distlock, &url).await),
        Arc::new(Client::connect(Kind::Raw, &url).await),
        Arc::new(Client::connect(Kind::RawLua, &url).await),
    ];
    let w1 = run_w1(cfg, std::slice::from_ref(&url), &clients).await;
    println!("  W1 done");
    let w2 = run_w2(cfg, std::slice::from_ref(&url), &clients, false).await;
    println!("  W2 done");
    let w2f = run_w2(cfg, std::slice::from_ref(&url), &clients, true).await;
    println!("  W2F done");
    drop(clients);
    if std::env::var("DISTLOCK_BENCH_ONLY").is_ok_and(|w| w.eq_ignore_ascii_case("uncontended")) {
        print_uncontended(&wire, &w1, &w2, &w2f);
        return;
    }

    let pings = ping_rtts(&url, cfg.ping_samples).await;
    let ping_us = |q: f64| pct(&pings, q).unwrap_or(0) as f64 / 1e3;
    let rtt = ping_us(0.5) * 1e3;
    let ping_line = format!(
        "one round trip (PING through a multiplexed connection, {} samples): p50 {:.1} us, p90 {:.1} us, p99 {:.1} us",
        pings.len(),
        ping_us(0.5),
        ping_us(0.9),
        ping_us(0.99)
    );
    let w3d = analyze(
        run_w3(cfg, &url, Kind::Distlock).await,
        cfg.w3_tasks,
        cfg.w3_tasks,
        rtt,
    );
    let w3r = analyze(
        run_w3(cfg, &url, Kind::Raw).await,
        cfg.w3_tasks,
        cfg.w3_tasks,
        rtt,
    );
    let w3f = analyze(
        run_w3(cfg, &url, Kind::Floor).await,
        cfg.w3_tasks,
        cfg.w3_tasks,
        rtt,
    );
    println!("  W3 done");
    let w4_tasks = cfg.w4_procs * cfg.w4_tasks;
    let w4d = analyze(
        run_w4(cfg, &url, Kind::Distlock).await,
        w4_tasks,
        cfg.w4_tasks,
        rtt,
    );
    let w4r = analyze(
        run_w4(cfg, &url, Kind::Raw).await,
        w4_tasks,
        cfg.w4_tasks,
        rtt,
    );
    println!("  W4 done\n");

    println!("  {ping_line}\n");
    let mut t = Table::new();
    t.num(
        "RT",
        "commands per acquire+release",
        wire[0].per_pair,
        wire[1].per_pair,
        2,
    );
    let [d1, r1, l1] = &w1;
    t.num("W1", "pairs/s", d1.rate(), r1.rate(), 0);
    let p = |u: &Uncontended, q: f64| pct(&u.lat, q).unwrap_or(0) as f64 / 1e3;
    t.num("W1", "p50 us", p(d1, 0.5), p(r1, 0.5), 1);
    t.num("W1", "p99 us", p(d1, 0.99), p(r1, 0.99), 1);
    let [d2, r2, l2] = &w2;
    t.num("W2", "pairs/s", d2.rate(), r2.rate(), 0);
    t.num("W2F", "fenced cycles/s", w2f[0].rate(), w2f[1].rate(), 0);
    for (w, d, r) in [("W3", &w3d, &w3r), ("W4", &w4d, &w4r)] {
        t.num(w, "acquisitions/s", d.rate, r.rate, 0);
        t.num(w, "ideal 1/(hold + 1 RTT)/s", d.ideal, r.ideal, 0);
        t.num(
            w,
            "acquisitions/s / ideal",
            d.rate / d.ideal,
            r.rate / r.ideal,
            2,
        );
        t.num(
            w,
            "measured hold us (mean)",
            d.hold_mean_us,
            r.hold_mean_us,
            0,
        );
        t.num(
            w,
            "release call us (mean)",
            d.release_mean_us,
            r.release_mean_us,
            0,
        );
        t.text(
            w,
            "same-task share",
            format!("{:.1}%", d.same_share * 100.0),
            format!("{:.1}%", r.same_share * 100.0),
            "".into(),
        );
        if w == "W4" {
            t.text(
                w,
                "same-process share",
                format!("{:.1}%", d.same_proc_share * 100.0),
                format!("{:.1}%", r.same_proc_share * 100.0),
                "".into(),
            );
            let list = |c: &Contended| {
                c.per_proc
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            };
            t.text(w, "acquisitions per process", list(d), list(r), "".into());
            t.text(
                w,
                "handoffs to another process",
                d.xproc_handoffs.to_string(),
                r.xproc_handoffs.to_string(),
                "".into(),
            );
            t.text(
                w,
                "  their gap p50/p99 us",
                format!("{}/{}", opt(d.xproc_gap_p50_us), opt(d.xproc_gap_p99_us)),
                format!("{}/{}", opt(r.xproc_gap_p50_us), opt(r.xproc_gap_p99_us)),
                "".into(),
            );
        }
        t.text(
            w,
            "cross-task handoffs",
            d.handoffs.to_string(),
            r.handoffs.to_string(),
            "".into(),
        );
        for (name, dv, rv) in [
            ("handoff gap p50 us", d.gap_p50_us, r.gap_p50_us),
            ("handoff gap p99 us", d.gap_p99_us, r.gap_p99_us),
            ("handoff gap max us", d.gap_max_us, r.gap_max_us),
        ] {
            let ratio = match (dv, rv) {
                (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
                _ => "-".into(),
            };
            t.text(w, name, opt(dv), opt(rv), ratio);
        }
        t.text(
            w,
            &format!("min/max per task (fair {:.0})", d.fair),
            format!("{}/{}", d.min_task, d.max_task),
            format!("{}/{}", r.min_task, r.max_task),
            "".into(),
        );
        t.text(
            w,
            "acquisitions (timeouts, errors)",
            format!("{} ({}, {})", d.n, d.timeouts, d.errors),
            format!("{} ({}, {})", r.n, r.timeouts, r.errors),
            "".into(),
        );
    }
    t.print();
    println!(
        "\nW3 floor on this machine: a FIFO tokio::sync::Mutex plus one PING to acquire and one to"
    );
    println!(
        "release (distlock's wake-ups and round trips, no lock logic): acquisitions/s / ideal {:.2},",
        w3f.rate / w3f.ideal
    );
    println!(
        "release call {:.0} us, handoff gap p50 {} us, p99 {} us, max {} us (distlock: {:.2}, {:.0} us, {} / {} / {} us)",
        w3f.release_mean_us,
        opt(w3f.gap_p50_us),
        opt(w3f.gap_p99_us),
        opt(w3f.gap_max_us),
        w3d.rate / w3d.ideal,
        w3d.release_mean_us,
        opt(w3d.gap_p50_us),
        opt(w3d.gap_p99_us),
        opt(w3d.gap_max_us)
    );
    println!(
        "\nServer commands per acquisition in W3/W4 (INFO commandstats, Lua's inner calls included;"
    );
    println!(
        "W4 also counts the ticket INCR; for distlock a PTTL is one try that found the lock held):"
    );
    for (name, c) in [
        ("W3 distlock", &w3d),
        ("W3 raw", &w3r),
        ("W4 distlock", &w4d),
        ("W4 raw", &w4r),
    ] {
        let list: Vec<String> = c
            .commands
            .iter()
            .filter(|(_, per)| *per >= 0.005)
            .map(|(cmd, per)| format!("{cmd} {per:.2}"))
            .collect();
        println!("  {name:<12} {}", list.join(", "));
    }
    for (name, d, r, l) in [("W1", d1, r1, l1), ("W2", d2, r2, l2)] {
        if d.errors + r.errors + l.errors > 0 {
            println!(
                "  {name} errors: distlock {}, raw {}, raw+lua {}",
                d.errors, r.errors, l.errors
            );
        }
    }
    for (name, c) in [
        ("W3 distlock", &w3d),
        ("W3 raw", &w3r),
        ("W4 distlock", &w4d),
        ("W4 raw", &w4r),
    ] {
        if c.overlaps > 0 {
            println!(
                "  {name}: {} acquisitions overlapped the previous holder!",
                c.overlaps
            );
        }
    }

    println!("\nUncontended, per round ({ROUNDS} rounds, blocks alternating):");
    for (name, d, r) in [("W1", d1, r1), ("W2", d2, r2)] {
        let (mid, lo, hi) = round_ratios(d, r);
        println!("  {name} distlock / raw per round: median {mid:.2}x, range {lo:.2}x-{hi:.2}x");
    }
    println!(
        "\nWhere the uncontended gap comes from. raw+lua = raw redis-rs sending distlock's own Lua"
    );
    println!(
        "scripts (same keys, arguments and round trips, none of distlock's client-side code):"
    );
    println!(
        "  {:<4} {:>30} {:>10} {:>10} {:>10}",
        "", "", "raw", "raw+lua", "distlock"
    );
    for (name, d, r, l) in [("W1", d1, r1, l1), ("W2", d2, r2, l2)] {
        print_rate_row(name, d, r, l);
        println!(
            "  {name:<4} {:>30} {:>10.2} {:>10.2} {:>10.2}",
            "x raw",
            1.0,
            l.rate() / r.rate(),
            d.rate() / r.rate()
        );
        print_cpu_rows(name, d, r, l);
    }
    println!(
        "  W1   {:>30} {:>10.1} {:>10.1} {:>10.1}",
        "p50 us",
        p(r1, 0.5),
        p(l1, 0.5),
        p(d1, 0.5)
    );
    print_w2f(&w2f);
    println!("\nTargets (informational; a bench never fails):");
    print_uncontended_targets(&wire, &w1, &w2, &w2f);
    for (w, d, r) in [("W3", &w3d, &w3r), ("W4", &w4d, &w4r)] {
        println!(
            "  {w}  handoff p99 < 1 ms:                   distlock {} us {}   (raw {} us {})",
            opt(d.gap_p99_us),
            verdict(d.handoff_ok()),
            opt(r.gap_p99_us),
            verdict(r.handoff_ok())
        );
        println!(
            "  {w}  acquisitions/s >= 0.9x ideal:        distlock {:.2}x {}   (raw {:.2}x {})",
            d.rate / d.ideal,
            verdict(d.rate_ok()),
            r.rate / r.ideal,
            verdict(r.rate_ok())
        );
        println!(
            "  {w}  every task in 0.5x-2x of fair share: distlock {:.2}x-{:.2}x {}   (raw {:.2}x-{:.2}x {})",
            d.min_task as f64 / d.fair,
            d.max_task as f64 / d.fair,
            verdict(d.fair_ok()),
            r.min_task as f64 / r.fair,
            r.max_task as f64 / r.fair,
            verdict(r.fair_ok())
        );
    }

    let w5 = run_w5(&url, cfg.w5_rounds, cfg.w5_keys).await;
    print_w5(&w5);
}

fn print_w5(w5: &Http) {
    println!(
        "\nW5: idempotency over HTTP (axum, 16 clients, {} keys; baseline: SET NX PX placeholder, then SET of the response)",
        w5.distlock[0].requests
    );
    println!(
        "  {:<8} {:>12} {:>12} {:>16} {:>14} {:>14} {:>14} {:>11} {:>11}",
        "",
        "requests/s",
        "x baseline",
        "server us/req",
        "in commands",
        "process us/req",
        "commands/req",
        "reads/req",
        "unexpected"
    );
    for (i, name) in [(0usize, "first"), (1, "replay")] {
        for (who, p, b) in [
            ("distlock", &w5.distlock[i], &w5.baseline[i]),
            ("baseline", &w5.baseline[i], &w5.baseline[i]),
            ("guarded", &w5.guarded[i], &w5.baseline[i]),
        ] {
            println!(
                "  {name:<6} {who:<9} {:>10.0} {:>12.2} {:>16.1} {:>14.1} {:>14.1} {:>14.2} {:>11.2} {:>11}",
                p.rate(),
                p.rate() / b.rate().max(1e-9),
                p.cpu_us(),
                p.command_us(),
                p.process_us(),
                p.commands_per(),
                p.reads_per(),
                p.unexpected
            );
        }
    }
    let ratio = |a: f64, b: f64| a / b.max(1e-9);
    let (d, b, g) = (&w5.distlock, &w5.baseline, &w5.guarded);
    let first_floor = ratio(d[0].rate(), g[0].rate());
    let first = ratio(d[0].rate(), b[0].rate());
    let replay = ratio(d[1].rate(), b[1].rate());
    let cpu_floor = ratio(d[0].cpu_us(), g[0].cpu_us());
    let cpu = ratio(d[0].cpu_us(), b[0].cpu_us());
    // Issue 24's targets: the first two rows on Redis 7.0 and 8.2, where the store needs
    // a transaction or a script; the last two where `SET ... IFEQ` stores in one command.
    println!(
        "  W5  first calls >= 0.95x the floor's:     {first_floor:.2}x {}",
        verdict(first_floor >= 0.95)
    );
    println!(
        "  W5  server CPU per first call <= 1.1x the floor's: {cpu_floor:.2}x {}",
        verdict(cpu_floor <= 1.1)
    );
    println!(
        "  W5  replays >= 1.0x baseline:            {replay:.2}x {}",
        verdict(replay >= 1.0)
    );
    println!(
        "  W5  first calls >= 0.8x baseline (8.2), >= 0.9x (with SET IFEQ): {first:.2}x {}",
        verdict(first >= 0.9)
    );
    println!(
        "  W5  server CPU per first call <= 1.2x baseline (with SET IFEQ): {cpu:.2}x {}",
        verdict(cpu <= 1.2)
    );
    println!(
        "  W5  the hand-written floor with distlock's guarantees (guarded): first calls {:.2}x, replays {:.2}x, server CPU {:.2}x",
        w5.guarded[0].rate() / w5.baseline[0].rate().max(1e-9),
        w5.guarded[1].rate() / w5.baseline[1].rate().max(1e-9),
        w5.guarded[0].cpu_us() / w5.baseline[0].cpu_us().max(1e-9)
    );
    println!(
        "  W5  connections redis-server accepted during the phases: distlock {} / {}, baseline {} / {}, guarded {} / {}",
        d[0].connections,
        d[1].connections,
        b[0].connections,
        b[1].connections,
        g[0].connections,
        g[1].connections
    );
    println!(
        "  W5  commands per first call / replay:    {:.2} / {:.2} (baseline {:.2} / {:.2})",
        w5.distlock[0].commands_per(),
        w5.distlock[1].commands_per(),
        w5.baseline[0].commands_per(),
        w5.baseline[1].commands_per()
    );
}
