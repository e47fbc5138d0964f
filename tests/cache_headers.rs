//! The engine's cache by the upstream's own headers (`[hosts."HOST:PORT"]
//! cache_control = true`, `src/read/cache.rs`), against the testkit's
//! loopback upstream, whose `/headers/{name}` answers with the headers the
//! query string names: what a shared cache may keep is kept while fresh and
//! answered for free; `no-store`, `private`, `no-cache`, `Vary: *` and an
//! answer already stale are not kept; two credentials never share an entry
//! unless the upstream says any may (`public`); a host that did not opt in
//! keeps nothing; identical misses in flight together fill the cache once.
//! The seams: an `Age` past counting is stale; an answer heavier than an
//! eighth of the bound is never kept; `stored` counts what was admitted;
//! what a reader derives stays with its request; an answer a reader found
//! unusable is never served again.
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

/// An `Age` past what a cache can count is 2^31 seconds (RFC 9111 §1.2.2),
/// stale whatever `max-age` says: never read as 0, fresh.
#[tokio::test]
async fn an_age_past_what_a_cache_can_count_is_stale() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    for (name, age) in [
        ("overflow", "99999999999999999999999999"),
        ("past-2-31", "4294967296"),
    ] {
        let read = || {
            get(
                &upstream,
                name,
                &[("cache-control", "max-age=3600"), ("age", age)],
            )
        };
        for n in 1..=2 {
            assert_eq!(one(&engine, read()).await, (format!("{name} #{n}"), 1, 0));
        }
    }
    assert_eq!(stored(&upstream), 0.0);
}

/// An engine whose cache holds `bytes`, `cache_control` on for `upstream`.
fn small_cache(upstream: &Upstream, bytes: u64) -> Engine {
    recorder();
    let mut config = Config::default();
    config.upstream.cache_bytes = bytes;
    let table = HostConfig::default().cache_control(true);
    config.hosts.insert(upstream.host(), table);
    Engine::new(config)
}

/// An answer heavier than an eighth of the bound is never kept (it would
/// hold the whole cache, and past it until moka's next pass).
#[tokio::test]
async fn a_heavy_answer_is_never_kept() {
    let upstream = Upstream::start().await;
    let engine = small_cache(&upstream, 32 << 10);
    // Headers of ~5 KiB: past an eighth of 32 KiB, within the whole.
    let padding = "x".repeat(1000);
    let heavy: Vec<_> = (0..5)
        .map(|i| (format!("x-pad-{i}"), padding.clone()))
        .chain([("cache-control".into(), "max-age=60".into())])
        .collect();
    let heavy: Vec<(&str, &str)> = heavy.iter().map(|(n, v)| (&**n, &**v)).collect();
    for n in 1..=2 {
        let answer = one(&engine, get(&upstream, "heavy", &heavy)).await;
        assert_eq!(answer, (format!("heavy #{n}"), 1, 0), "never kept");
    }
    assert_eq!(stored(&upstream), 0.0);
}

/// 300 light answers offered to a cache that holds about 25: each admitted
/// or refused as it is offered (moka's TinyLFU admission), and only the
/// admitted counted `stored`.
#[tokio::test]
async fn stored_counts_the_answers_the_cache_admitted() {
    let upstream = Upstream::start().await;
    let engine = small_cache(&upstream, 32 << 10);
    let light = [("cache-control", "max-age=60")];
    for i in 0..300 {
        one(&engine, get(&upstream, &format!("light-{i}"), &light)).await;
    }
    let stored = stored(&upstream);
    let kept = engine.cache_weight() / 1024;
    assert!(
        (1.0..=60.0).contains(&stored),
        "{stored} counted stored for a cache of 32 KiB ({kept} KiB weighed)"
    );
    assert!(engine.cache_weight() <= 32 << 10);
}

/// What a reader derives of a cached answer is its request's, never the
/// cache's: the next request that the cache answers derives again (so an
/// entry holds what it weighs), while identical reads of one request share
/// one response and one derivation.
#[tokio::test]
async fn what_a_reader_derives_lives_with_its_request_not_in_the_cache() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    let read = || get(&upstream, "derived", &[("cache-control", "max-age=60")]);
    let derivations = std::sync::atomic::AtomicUsize::new(0);
    let derive = |answer: std::sync::Arc<fanout_budget::UpstreamResponse>| {
        let derivations = &derivations;
        async move {
            let made = answer
                .derived(|| async {
                    derivations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, fanout_budget::ReadError>(vec![0u8; 1 << 20])
                })
                .await
                .unwrap();
            (answer, made)
        }
    };
    for round in 1..=3 {
        let request = engine.begin_request(Caller::Public);
        let (a, b) = (request.operation(), request.operation());
        let (first, one_made) = derive(a.upstream().read(read()).await.unwrap()).await;
        let (second, two_made) = derive(b.upstream().read(read()).await.unwrap()).await;
        assert!(
            std::sync::Arc::ptr_eq(&first, &second),
            "one response per request"
        );
        assert!(std::sync::Arc::ptr_eq(&one_made, &two_made), "derived once");
        assert_eq!(
            derivations.load(std::sync::atomic::Ordering::SeqCst),
            round,
            "each request derives for itself"
        );
    }
    assert_eq!(
        upstream.requests(),
        1,
        "read once, then answered from the cache"
    );
}

/// An answer its reader found unusable (it made the read's error of it) is
/// never served from the cache again: the next request reads it anew.
#[tokio::test]
async fn an_answer_the_reader_could_not_use_is_never_served_again() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    let read = || get(&upstream, "unusable", &[("cache-control", "max-age=60")]);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let answer = op.upstream().read(read()).await.unwrap();
    assert_eq!(answer.body, "unusable #1");
    let err = answer.error("not the page the reader expected");
    assert_eq!(err.code(), "UPSTREAM_ERROR");
    drop((op, request));
    assert_eq!(one(&engine, read()).await, ("unusable #2".into(), 1, 0));
    // The new answer is kept, and served.
    assert_eq!(one(&engine, read()).await, ("unusable #2".into(), 0, 1));
}

/// Identical reads of one request that the cache answers share one
/// response (and one derivation) even when the request's first identical
/// read failed: here it was refused by the request's budget, and the
/// answer was kept meanwhile by another request.
#[tokio::test]
async fn hits_after_a_failed_identical_read_still_share_one_response() {
    let upstream = Upstream::start().await;
    recorder();
    let mut config = Config::default();
    config.budget.max_reads = 1;
    let table = HostConfig::default().cache_control(true);
    config.hosts.insert(upstream.host(), table);
    let engine = Engine::new(config);
    let read = || {
        get(
            &upstream,
            "after-refusal",
            &[("cache-control", "max-age=60")],
        )
    };
    let other = get(&upstream, "spends-the-budget", &[]);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    op.upstream().read(other).await.unwrap();
    let refused = op.upstream().read(read()).await.unwrap_err();
    assert_eq!(refused.code(), "FANOUT_BUDGET_EXHAUSTED");
    // Another request reads it, and the cache keeps it.
    let filler = engine.begin_request(Caller::Internal);
    filler.operation().upstream().read(read()).await.unwrap();
    drop(filler);
    // The first request's identical reads are hits now: one response.
    let derivations = std::sync::atomic::AtomicUsize::new(0);
    let mut answers = Vec::new();
    for _ in 0..3 {
        let op = request.operation();
        let answer = op.upstream().read(read()).await.unwrap();
        assert_eq!(op.cache_hits(), 1);
        answer
            .derived(|| async {
                derivations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, fanout_budget::ReadError>(vec![0u8; 1 << 20])
            })
            .await
            .unwrap();
        answers.push(answer);
    }
    assert!(
        answers
            .windows(2)
            .all(|w| std::sync::Arc::ptr_eq(&w[0], &w[1])),
        "each hit a response of its own"
    );
    assert_eq!(
        derivations.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "derived once per request"
    );
}

/// RFC 9111 §5.1: an `Age` sent as a list is read by its first member; a
/// first member past 2^31 is stale, as it is alone.
#[tokio::test]
async fn an_age_past_counting_is_stale_when_sent_as_a_list_too() {
    let upstream = Upstream::start().await;
    let engine = engine(&upstream, true, false);
    let pairs = [
        ("cache-control", "max-age=3600"),
        ("age", "99999999999999999999999999, 5"),
    ];
    for n in 1..=2 {
        let answer = one(&engine, get(&upstream, "age-list", &pairs)).await;
        assert_eq!(answer, (format!("age-list #{n}"), 1, 0), "kept as fresh");
    }
}
