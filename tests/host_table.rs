//! The per-host state is bounded. A hostile review sent
//! 1,120 requests through 302s to 58,487 distinct upstream hosts: the
//! process grew from 10 to 327 MB and kept it, and `/metrics` grew to 76 MB
//! (1.05 M series). `permit(name)` grew the same table.
//!
//! Here one engine, on an in-memory upstream, reads through redirects to
//! 25,000 distinct hosts and takes permits for 25,000 distinct names. A host
//! with a `[hosts]` table keeps its own `host` label; every other host
//! shares `host="other"`; the process does not grow with the hosts; and an
//! error still names the real host. This binary installs the process's
//! Prometheus recorder, so nothing else runs in it.
use bytes::Bytes;
use fanout_budget::config::HostConfig;
use fanout_budget::{
    inbound::Caller, read::Transport, Config, Engine, Read, ReadError, UpstreamResponse,
};
use fanout_testkit::prometheus::{host_labels, value};
use futures::future::BoxFuture;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::collections::BTreeSet;
use std::sync::OnceLock;

/// The configured upstream: its `/h/{i}` answers 302 to `http://h{i}.scatter.test/blob`,
/// its `/hang/{i}` 302 to `http://hang{i}.scatter.test/blob`, which never answers.
const REGISTRY: &str = "registry.test:80";
/// Distinct hosts of each kind (redirect targets, permit names).
const HOSTS: u64 = 25_000;
/// Of those, read before the memory is first measured (maps, pools and
/// the exporter warmed up).
const WARM: u64 = 1_000;
/// Hosts per inbound request.
const PER_REQUEST: u64 = 500;

/// The upstream, in memory: each hop redirects to a host of its own.
struct Scatter;

impl Transport for Scatter {
    fn fetch<'a>(
        &'a self,
        read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        let url = read.url().clone();
        let port = url.port_or_known_default().unwrap();
        assert_eq!(
            host,
            format!("{}:{port}", url.host_str().unwrap()),
            "the transport is told the real host"
        );
        Box::pin(async move {
            if host == REGISTRY {
                let (kind, i) = url.path()[1..].split_once('/').unwrap();
                let to = format!("http://{kind}{i}.scatter.test/blob");
                let mut headers = HeaderMap::new();
                headers.insert(header::LOCATION, HeaderValue::from_str(&to).unwrap());
                return Ok(UpstreamResponse::new(
                    host,
                    StatusCode::FOUND,
                    headers,
                    Bytes::new(),
                ));
            }
            if host.starts_with("hang") {
                std::future::pending::<()>().await;
            }
            Ok(UpstreamResponse::new(
                host,
                StatusCode::OK,
                HeaderMap::new(),
                Bytes::from_static(b"{}"),
            ))
        })
    }
}

/// The process's Prometheus recorder (installed once).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// The tests of this binary one at a time: they read through the same
/// recorder, under the same labels.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The engine: `REGISTRY` has a `[hosts]` table, nothing else does.
fn engine(read_timeout_ms: u64) -> Engine {
    let mut config = Config::default();
    // Each host costs at most three reads: a hop and its target, a permit.
    config.budget.max_reads = 3 * PER_REQUEST;
    config.budget.read_timeout_ms = read_timeout_ms;
    config.hosts.insert(REGISTRY.into(), HostConfig::default());
    Engine::builder(config)
        .transport(std::sync::Arc::new(Scatter))
        .build()
}

/// Hosts `from..to`, `PER_REQUEST` per inbound request: a read of
/// `/h/{i}` (redirected to host `h{i}`) and a permit for `db-{i}:5432`.
async fn scatter(engine: &Engine, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let request = engine.begin_request(Caller::Public);
        let operation = request.operation();
        let upstream = operation.upstream();
        for i in i..(i + PER_REQUEST).min(to) {
            let url = format!("http://{REGISTRY}/h/{i}").parse().unwrap();
            let answer = upstream.read(Read::get(url)).await.unwrap();
            assert_eq!(answer.host, format!("h{i}.scatter.test:80"));
            let permit = upstream.permit(&format!("db-{i}:5432")).await.unwrap();
            permit.timeout(async {}).await.unwrap();
        }
        i += PER_REQUEST;
    }
}

#[tokio::test]
async fn distinct_hosts_share_one_entry_and_one_label() {
    let _serial = SERIAL.lock().await;
    let metrics = recorder();
    let engine = engine(5_000);
    let page = metrics.render();
    let ok = |page: &str, host: &str| {
        let labels = [&format!("host=\"{host}\""), "outcome=\"ok\""];
        value(page, "fanout_upstream_reads_total", &labels).unwrap_or(0.0)
    };
    let ok_before = (ok(&page, REGISTRY), ok(&page, "other"));

    scatter(&engine, 0, WARM).await;
    let page = metrics.render();
    let before = (fanout_testkit::child::rss_mib() * 1024.0) as u64;
    scatter(&engine, WARM, HOSTS).await;
    let page_after = metrics.render();
    let grown = ((fanout_testkit::child::rss_mib() * 1024.0) as u64).saturating_sub(before);
    let (hosts, series) = host_labels(&page_after);
    println!(
        "{} distinct hosts after a warm-up of {}: RSS +{} KiB ({} B per host); \
         /metrics {} → {} bytes, {} series with a host label, {} host labels",
        2 * (HOSTS - WARM),
        2 * WARM,
        grown,
        grown * 1024 / (2 * (HOSTS - WARM)),
        page.len(),
        page_after.len(),
        series,
        hosts.len(),
    );

    assert_eq!(
        hosts,
        BTreeSet::from([REGISTRY, "other"]),
        "a host without a [hosts] table got a label of its own ({series} series)"
    );
    assert!(
        page_after.len() < 16 * 1024,
        "/metrics is {} bytes",
        page_after.len()
    );
    assert!(
        grown < 24 * 1024,
        "RSS grew {grown} KiB over {} distinct hosts",
        2 * (HOSTS - WARM)
    );
    // Counted all the same: the configured host on its own, the rest together.
    assert_eq!(ok(&page_after, REGISTRY) - ok_before.0, HOSTS as f64);
    assert_eq!(ok(&page_after, "other") - ok_before.1, 2.0 * HOSTS as f64);
}

/// Bounded state, but the real names: an error names the host it met, and
/// a host without a table is counted in flight by its own name while a read
/// to it lives (and forgotten after).
#[tokio::test(start_paused = true)]
async fn errors_and_slots_still_name_the_real_host() {
    let _serial = SERIAL.lock().await;
    let engine = engine(100);
    let request = engine.begin_request(Caller::Public);
    let operation = request.operation();
    let upstream = operation.upstream();

    let url = format!("http://{REGISTRY}/hang/7").parse().unwrap();
    match upstream.read(Read::get(url)).await {
        Err(ReadError::UpstreamTimeout { host, timeout_ms }) => {
            assert_eq!((host.as_str(), timeout_ms), ("hang7.scatter.test:80", 100));
        }
        other => panic!("{other:?}"),
    }

    let permit = upstream.permit("DB-9:5432").await.unwrap();
    assert_eq!(engine.hosts().in_flight("db-9:5432"), 1);
    assert_eq!(engine.hosts().in_flight("db-8:5432"), 0);
    match permit.timeout(std::future::pending::<()>()).await {
        Err(ReadError::UpstreamTimeout { host, .. }) => assert_eq!(host, "db-9:5432"),
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.hosts().in_flight("db-9:5432"), 0);
}
