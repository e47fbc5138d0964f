//! The gateway's memory and `/metrics` do not grow with the hosts its
//! upstream redirects to. The hostile review: 1,120
//! requests through 302s to 58,487 distinct hosts took the gateway from 10 to
//! 327 MB, never given back, and `/metrics` to 76 MB (1.05 M series).
//!
//! Here the embedded registry answers every tag list with a 302 to a
//! loopback address of its own (`127.a.b.c`, a port nobody listens on), with
//! the default configuration (no `[hosts]` table). Each hop is a read of a
//! new host, charged, and fails `UPSTREAM_ERROR` naming that host. The
//! registry (`--upstream`) keeps its own `host` label; every other host is
//! counted under `host="other"`.
//!
//! `FANOUT_HOSTS=50000 cargo test -p fanout-gateway --test host_labels -- --nocapture`
//! prints the figures for 50,000 hosts (default 10,000). This binary installs
//! the process's Prometheus recorder, so nothing else runs in it.
use fanout_budget::Config;
use fanout_gateway::app;
use fanout_gateway::embedded::{EmbeddedRegistry, Fault};
use fanout_testkit::prometheus::{host_labels, value};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::net::Ipv4Addr;

/// Repositories a request reads (each one hop to a new host).
const NAMES: usize = 200;
/// Hosts read before the memory is first measured (warm-up).
const WARM: usize = 1_000;
const TOKEN: &str = "host-labels-internal-token";

#[tokio::test]
async fn redirects_to_distinct_hosts_share_one_label() {
    let hosts: usize = std::env::var("FANOUT_HOSTS")
        .ok()
        .map_or(10_000, |n| n.parse().expect("FANOUT_HOSTS is a number"));
    let hosts = hosts.div_ceil(NAMES) * NAMES;
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let port = fanout_testkit::free_port();
    let names: Vec<String> = (0..NAMES).map(|i| format!("scatter/r{i}")).collect();
    for name in &names {
        registry.set_repo_fault(name, Some(Fault::Scatter(port)));
    }
    let mut config = Config::default();
    config.rate_limit.internal_token = TOKEN.into();
    // A tag list and its hop per repository.
    config.budget.internal_max_reads = 2 * NAMES as u64;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let render = std::sync::Arc::new(move || handle.render());
    let gateway = app::build(config, registry.url().parse().unwrap(), Some(render));
    let fields: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, name)| format!("r{i}: repository(name: {name:?}) {{ name }}"))
        .collect();
    let query = json!({ "query": format!("{{ {} }}", fields.join(" ")) }).to_string();

    // The addresses reached (as numbers: the test's own memory stays small).
    let mut seen = HashSet::with_capacity(hosts);
    let mut before = (0, 0);
    for round in 0..hosts / NAMES {
        if round * NAMES == WARM {
            let page = fanout_testkit::metrics_page(&gateway.router).await;
            before = (
                (fanout_testkit::child::rss_mib() * 1024.0) as u64,
                page.len(),
            );
        }
        let answer = fanout_testkit::post(
            &gateway.router,
            query.clone(),
            &[("x-internal-token", TOKEN)],
        )
        .await;
        let answer: Value = answer.json();
        assert_eq!(
            answer["extensions"]["fanout"]["used"],
            2 * NAMES,
            "{answer}"
        );
        let errors = answer["errors"].as_array().unwrap();
        assert_eq!(errors.len(), NAMES);
        for error in errors {
            assert_eq!(error["extensions"]["code"], "UPSTREAM_ERROR", "{error}");
            // The error names the real host the hop reached.
            let host = error["extensions"]["host"].as_str().unwrap();
            assert!(
                host.starts_with("127.") && host.ends_with(&format!(":{port}")),
                "{error}"
            );
            let address: Ipv4Addr = host.rsplit_once(':').unwrap().0.parse().unwrap();
            seen.insert(u32::from(address));
        }
    }
    assert_eq!(seen.len(), hosts, "every hop reached a host of its own");
    let page = fanout_testkit::metrics_page(&gateway.router).await;
    let grown = ((fanout_testkit::child::rss_mib() * 1024.0) as u64).saturating_sub(before.0);
    let (labels, series) = host_labels(&page);
    let measured = hosts - WARM;
    println!(
        "{measured} distinct redirect targets after a warm-up of {WARM}: RSS +{grown} KiB \
         ({} B per host); /metrics {} → {} bytes, {series} series with a host label, {} host labels",
        grown * 1024 / measured as u64,
        before.1,
        page.len(),
        labels.len(),
    );
    assert_eq!(
        labels,
        BTreeSet::from([registry.host().as_str(), "other"]),
        "a host without a [hosts] table got a label of its own ({series} series)"
    );
    assert!(page.len() < 16 * 1024, "/metrics is {} bytes", page.len());
    assert!(
        grown < 24 * 1024,
        "RSS grew {grown} KiB over {measured} distinct hosts"
    );
    let reads = |host: &str, outcome: &str| {
        value(
            &page,
            "fanout_upstream_reads_total",
            &[
                &format!("host=\"{host}\""),
                &format!("outcome=\"{outcome}\""),
            ],
        )
    };
    // The registry's 302s are its reads; the hops, the other hosts' errors.
    assert_eq!(reads(&registry.host(), "ok"), Some(hosts as f64));
    assert_eq!(reads("other", "error"), Some(hosts as f64));
}
