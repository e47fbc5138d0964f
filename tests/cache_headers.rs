//! The engine's cache by the upstream's own headers (`[hosts."HOST:PORT"]
//! cache_control = true`, `src/read/cache.rs`), against the testkit's
//! loopback upstream, whose `/headers/{name}` answers with the headers the
//! query string names: what a shared cache may keep is kept while fresh and
//! answered for free; `no-store`, `private`, `no-cache`, `Vary: *` and an
//! answer already stale are not kept; two credentials never share an entry
//! unless the upstream says any may (`public`); a host that did not opt in
//! keeps nothing; identical misses in flight together fill the cache once.
//!
//! This binary installs the process's Prometheus recorder (the `stored`
//! count is read from it), so nothing else runs in it.
use fanout_budget::config::HostConfig;
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use fanout_testkit::prometheus::value;
use fanout_testkit::Upstream;
use http::{header, HeaderValue};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The process's Prometheus recorder (installed once).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// An engine whose `[hosts]` table for `upstream` says `cache_control` (and
/// `coalesce`).
fn engine(upstream: &Upstream, cache_control: bool, coalesce: bool) -> Engine {
    recorder();
    let mut config = Config::default();
    let table = (HostConfig::default())
        .cache_control(cache_control)
        .coalesce(coalesce);
    config.hosts.insert(upstream.host(), table);
    Engine::new(config)
}

/// `GET /headers/{name}` answered with the response headers `pairs`.
fn get(upstream: &Upstream, name: &str, pairs: &[(&str, &str)]) -> Read {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    let url = upstream.url(&format!("/headers/{name}?{query}"));
    Read::get(url.parse().unwrap())
}

/// `read` as the only read of an inbound request of its own: its body, the
/// reads charged, the cache hits.
async fn one(engine: &Engine, read: Read) -> (String, u64, u64) {
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let answer = op.upstream().read(read).await.unwrap();
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    (body, request.budget().used(), op.cache_hits())
}

/// The answers the cache kept for `upstream`'s host.
fn stored(upstream: &Upstream) -> f64 {
    let host = format!("host=\"{}\"", upstream.host());
    let page = recorder().render();
    value(&page, "fanout_cache_total", &[&host, "outcome=\"stored\""]).unwrap_or(0.0)
}

#[tokio::test]
async fn a_fresh_answer_is_kept_while_fresh_and_a_hit_is_free() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    for (name, cache_control) in [
        ("max-age", "max-age=60"),
        ("s-maxage", "s-maxage=60"),
        ("immutable", "immutable"),
        ("public", "public, max-age=60"),
    ] {
        let read = || get(&upstream, name, &[("cache-control", cache_control)]);
        let first = one(&engine, read()).await;
        assert_eq!(first, (format!("{name} #1"), 1, 0), "{cache_control}");
        for _ in 0..3 {
            let again = one(&engine, read()).await;
            assert_eq!(again, (format!("{name} #1"), 0, 1), "{cache_control}");
        }
    }
    assert_eq!(upstream.requests(), 4);
    assert_eq!(stored(&upstream), 4.0);
}

#[tokio::test]
async fn what_a_shared_cache_may_not_keep_is_read_every_time() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    let stale_at = httpdate::fmt_http_date(std::time::SystemTime::now() - Duration::from_secs(5));
    let cases: [(&str, &[(&str, &str)]); 7] = [
        ("none", &[]),
        ("no-store", &[("cache-control", "no-store, max-age=60")]),
        ("private", &[("cache-control", "private, max-age=60")]),
        ("no-cache", &[("cache-control", "no-cache, max-age=60")]),
        (
            "vary-all",
            &[("cache-control", "max-age=60"), ("vary", "*")],
        ),
        ("aged", &[("cache-control", "max-age=60"), ("age", "60")]),
        ("expired", &[("expires", &stale_at)]),
    ];
    for (name, pairs) in cases {
        for n in 1..=2 {
            let answer = one(&engine, get(&upstream, name, pairs)).await;
            assert_eq!(answer, (format!("{name} #{n}"), 1, 0), "{name}");
        }
    }
    assert_eq!(stored(&upstream), 0.0);
}

#[tokio::test]
async fn a_host_that_did_not_opt_in_keeps_nothing() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, false, false);
    let read = || get(&upstream, "a", &[("cache-control", "public, max-age=60")]);
    assert_eq!(one(&engine, read()).await, ("a #1".into(), 1, 0));
    assert_eq!(one(&engine, read()).await, ("a #2".into(), 1, 0));
    // A read declared immutable is still kept there.
    let immutable = || read().immutable();
    assert_eq!(one(&engine, immutable()).await, ("a #3".into(), 1, 0));
    assert_eq!(one(&engine, immutable()).await, ("a #3".into(), 0, 1));
}

#[tokio::test]
async fn credentials_keep_entries_apart_unless_the_upstream_says_public() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    let as_user = |name: &str, cache_control: &str, token: &'static str| {
        get(&upstream, name, &[("cache-control", cache_control)])
            .header(header::AUTHORIZATION, HeaderValue::from_static(token))
    };
    // Kept for alice only.
    let mine = "max-age=60";
    assert_eq!(
        one(&engine, as_user("mine", mine, "Bearer alice")).await.1,
        1
    );
    assert_eq!(one(&engine, as_user("mine", mine, "Bearer bob")).await.1, 1);
    let anonymous = one(&engine, get(&upstream, "mine", &[("cache-control", mine)])).await;
    assert_eq!(anonymous.1, 1, "anonymous: its own read");
    let alice = one(&engine, as_user("mine", mine, "Bearer alice")).await;
    assert_eq!(alice, ("mine #1".into(), 0, 1), "alice's own entry");
    // Kept for everyone.
    let all = "public, max-age=60";
    assert_eq!(one(&engine, as_user("all", all, "Bearer alice")).await.1, 1);
    let bob = one(&engine, as_user("all", all, "Bearer bob")).await;
    assert_eq!(bob, ("all #1".into(), 0, 1), "public: shared");
    let anonymous = one(&engine, get(&upstream, "all", &[("cache-control", all)])).await;
    assert_eq!(anonymous, ("all #1".into(), 0, 1));
    // Public, but varying on the credentials: each reader's own.
    let per_user = |token: &'static str| {
        let pairs = [("cache-control", all), ("vary", "Authorization")];
        get(&upstream, "varies", &pairs)
            .header(header::AUTHORIZATION, HeaderValue::from_static(token))
    };
    assert_eq!(one(&engine, per_user("Bearer alice")).await.1, 1);
    let bob = one(&engine, per_user("Bearer bob")).await;
    assert_eq!(bob, ("varies #2".into(), 1, 0), "bob's own read");
    assert_eq!(one(&engine, per_user("Bearer alice")).await.2, 1);
    assert_eq!(upstream.requests(), 6);
}

#[tokio::test]
async fn an_entry_ends_when_its_answer_goes_stale() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    let read = || get(&upstream, "short", &[("cache-control", "max-age=1")]);
    let kept_at = Instant::now();
    assert_eq!(one(&engine, read()).await.1, 1);
    // Bounded: the entry must end within a few seconds of its second.
    let mut sent_again = None;
    while kept_at.elapsed() < Duration::from_secs(10) {
        let (body, used, hits) = one(&engine, read()).await;
        if used == 1 {
            assert_eq!(body, "short #2");
            sent_again = Some(kept_at.elapsed());
            break;
        }
        assert_eq!((body.as_str(), hits), ("short #1", 1));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = sent_again.expect("the entry ended");
    assert!(after >= Duration::from_millis(900), "ended after {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_misses_in_flight_together_fill_the_cache_once() {
    let upstream = Upstream::start().await;
    upstream.seen.hold();
    let engine = engine(&upstream, false, true);
    let n = 8;
    let read = || Read::get(upstream.url("/item/5").parse().unwrap()).immutable();
    let requests: Vec<_> = (0..n)
        .map(|_| engine.begin_request(Caller::Public))
        .collect();
    let tasks: Vec<_> = (requests.iter())
        .map(|request| {
            let operation = request.operation();
            let read = read();
            tokio::spawn(async move { operation.upstream().read(read).await.map(|_| ()) })
        })
        .collect();
    let joined = || -> u64 { requests.iter().map(|r| r.budget().counts().coalesced).sum() };
    let started = Instant::now();
    while upstream.requests() != 1 || joined() != n - 1 {
        assert!(started.elapsed() < Duration::from_secs(30), "still waiting");
        tokio::task::yield_now().await;
    }
    upstream.seen.release();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(upstream.requests(), 1, "one upstream request");
    assert_eq!(stored(&upstream), 1.0, "the cache filled once");
    let (_, used, hits) = one(&engine, read()).await;
    assert_eq!((used, hits), (0, 1));
}
