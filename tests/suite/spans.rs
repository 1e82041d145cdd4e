//! The spans an annotated call and each Redis call open, seen by a recording
//! subscriber: OpenTelemetry's fields (`otel.kind`, `db.system.name`,
//! `db.operation.name`, `server.address`), the key's template, the key, the fence once
//! assigned, the outcome and the times; never an argument.
use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use distlock::{Error, Locks, current_lock, distributed_lock, idempotent};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as recorded: its name, fields (as text) and its parent's name.
#[derive(Debug, Clone)]
struct Seen {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<&'static str>,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(u64, Seen)>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name());
        let seen = Seen {
            name: attrs.metadata().name(),
            fields,
            parent,
        };
        self.0.lock().unwrap().push((id.into_u64(), seen));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, seen)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

impl Recorder {
    fn named(&self, name: &str) -> Vec<Seen> {
        let spans = self.0.lock().unwrap();
        spans
            .iter()
            .filter(|(_, s)| s.name == name)
            .map(|(_, s)| s.clone())
            .collect()
    }
}

#[distributed_lock(key = "stock:<sku>", client = locks, ttl = "10s")]
async fn deduct(locks: &Locks, sku: u64, secret: &str) -> Result<u64, Error> {
    let _ = secret;
    current_lock().unwrap().fence().await
}

#[idempotent(key = "pay:<id>", client = locks)]
async fn pay(locks: &Locks, id: u32, card: String) -> Result<u32, Error> {
    let _ = card;
    Ok(id * 2)
}

/// Runs `f` with a recording subscriber as this thread's default (a current-thread
/// runtime polls every task here).
fn recorded<F: std::future::Future<Output = ()>>(f: impl FnOnce(Locks) -> F) -> Recorder {
    recorded_at(f).0
}

/// [`recorded`], and the server's port.
fn recorded_at<F: std::future::Future<Output = ()>>(f: impl FnOnce(Locks) -> F) -> (Recorder, u16) {
    let server = RedisServer::start();
    let url = server.url();
    let host_port = url
        .rsplit('@')
        .next()
        .unwrap()
        .trim_start_matches("redis://");
    let port = host_port
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone()).with(
        tracing_subscriber::filter::Targets::new().with_target("distlock", tracing::Level::DEBUG),
    );
    let _default = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let locks = Locks::connect(&server.url()).await.unwrap();
        f(locks).await;
    });
    (recorder, port)
}

#[test]
fn an_annotated_lock_opens_a_span_with_its_template_key_fence_and_outcome() {
    let recorder = recorded(|locks| async move {
        let fence = deduct(&locks, 7, "hunter2").await.unwrap();
        assert!(fence > 0);
        // Busy: held elsewhere, no wait.
        let held = locks.lock("stock:8").acquire().await.unwrap();
        assert!(matches!(
            deduct(&locks, 8, "hunter2").await,
            Err(Error::Busy { .. })
        ));
        held.release().await.unwrap();
    });
    let spans = recorder.named("distlock.lock");
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let ran = &spans[0].fields;
    assert_eq!(ran["distlock.key.template"], "stock:<sku>");
    assert_eq!(ran["distlock.key"], "lock:stock:7");
    assert_eq!(ran["distlock.outcome"], "released");
    assert_eq!(ran["otel.kind"], "internal");
    assert!(ran["distlock.fence"].parse::<u64>().unwrap() > 0);
    assert!(ran["distlock.waited_ms"].parse::<f64>().is_ok());
    assert!(ran["distlock.held_ms"].parse::<f64>().is_ok());
    let busy = &spans[1].fields;
    assert_eq!(
        (
            busy["distlock.key"].as_str(),
            busy["distlock.outcome"].as_str()
        ),
        ("lock:stock:8", "busy")
    );
    assert!(!busy.contains_key("distlock.held_ms"));
    for span in recorder.0.lock().unwrap().iter() {
        for value in span.1.fields.values() {
            assert!(
                !value.contains("hunter2"),
                "an argument was recorded: {span:?}"
            );
        }
    }
}

#[test]
fn each_redis_call_opens_a_client_span_under_the_call() {
    let (recorder, port) = recorded_at(|locks| async move {
        deduct(&locks, 9, "x").await.unwrap();
    });
    let redis = recorder.named("redis");
    assert!(!redis.is_empty());
    for span in &redis {
        let f = &span.fields;
        assert_eq!(f["otel.kind"], "client");
        assert_eq!(f["db.system.name"], "redis");
        assert_eq!(f["otel.name"], f["db.operation.name"]);
        assert_eq!(f["server.address"], "127.0.0.1");
        assert_eq!(f["server.port"], port.to_string());
    }
    let ops: Vec<&str> = redis
        .iter()
        .map(|s| s.fields["db.operation.name"].as_str())
        .collect();
    assert!(ops.contains(&"SET") || ops.contains(&"EVALSHA"), "{ops:?}");
    assert!(
        redis.iter().any(|s| s.parent == Some("distlock.lock")),
        "the lock's calls are children of the annotated call's span: {redis:#?}"
    );
}

#[test]
fn an_idempotent_call_opens_a_span_with_its_function_key_and_outcome() {
    let recorder = recorded(|locks| async move {
        assert_eq!(pay(&locks, 21, "4111-1111".into()).await.unwrap(), 42);
        assert_eq!(pay(&locks, 21, "4111-1111".into()).await.unwrap(), 42);
        tokio::time::sleep(Duration::from_millis(10)).await;
    });
    let spans = recorder.named("distlock.idempotent");
    assert_eq!(spans.len(), 2, "{spans:#?}");
    for (span, outcome) in spans.iter().zip(["claimed", "replayed"]) {
        let f = &span.fields;
        assert!(f["distlock.function"].ends_with("::pay"), "{f:?}");
        assert!(
            f["distlock.key"].starts_with("lock:idem:") && f["distlock.key"].ends_with(":pay:21")
        );
        assert_eq!(f["distlock.outcome"], outcome);
        assert!(!f.values().any(|v| v.contains("4111")));
    }
}

#[idempotent(header = "Idempotency-Key", scope = "tests", client = locks)]
async fn charge(
    axum::extract::State(locks): axum::extract::State<Locks>,
    axum::Json(card): axum::Json<String>,
) -> String {
    let _ = (&locks, card);
    "charged".to_owned()
}

#[test]
fn an_idempotent_handler_opens_a_span_with_its_function_key_and_outcome() {
    let recorder = recorded(|locks| async move {
        let router = axum::Router::new()
            .route("/charge", axum::routing::post(charge))
            .with_state(locks);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        for _ in 0..2 {
            let resp = crate::http::post(addr, "/charge", Some("K-7"), r#""4111-1111""#).await;
            assert_eq!(resp.status, 200);
        }
    });
    let spans = recorder.named("distlock.idempotent");
    assert_eq!(spans.len(), 2, "{spans:#?}");
    for (span, outcome) in spans.iter().zip(["claimed", "replayed"]) {
        let f = &span.fields;
        assert!(f["distlock.function"].ends_with("::charge"), "{f:?}");
        assert!(f["distlock.key"].ends_with(":tests:K-7"), "{f:?}");
        assert_eq!(f["distlock.outcome"], outcome);
        assert!(!f.values().any(|v| v.contains("4111")));
    }
    assert!(
        recorder
            .named("redis")
            .iter()
            .any(|s| s.parent == Some("distlock.idempotent")),
        "the claim's call is a child of the handler's span"
    );
}
