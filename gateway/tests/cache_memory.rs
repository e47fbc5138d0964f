//! The engine's cache (`upstream.cache_bytes`) holds what it weighs, at
//! the seam with what the gateway makes of an answer: with `tag_ttl_ms`,
//! every page of a tag list is kept, and the first page is the one the
//! parsed list of *all* the pages is derived on — kept with it, that list
//! made an 8 MiB cache hold many times its bound. A loopback registry of
//! its own here serves 30 repositories of 4 pages (~0.5 MiB of JSON a
//! page, ~4 MiB parsed a repository), made up as they are asked for; the
//! gateway, in a child process under an address-space limit, reads each
//! repository's tag count once, and the resident memory it gains is read
//! from the kernel after each request. It must stay under twice the bound.
//!
//! `cargo test -p fanout-gateway --test cache_memory -- --nocapture` prints
//! the figures.
mod common;

use axum::extract::{Path, RawQuery};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use common::post;
use fanout_budget::config::UpstreamTable;
use fanout_testkit::child;
use std::fmt::Write as _;
use std::time::Duration;

const BOUND_MIB: u64 = 8;
const REPOSITORIES: usize = 30;
const PAGES: usize = 4;
const TAGS_PER_PAGE: usize = 60_000;
/// The registry's address, for the child.
const REGISTRY_VAR: &str = "FANOUT_TEST_REGISTRY";

/// `GET /v2/<name>/tags/list[?page=K]`: page K of `TAGS_PER_PAGE` short
/// tags, with a `Link` to page K+1 until the last.
async fn tag_page(Path(rest): Path<String>, RawQuery(query): RawQuery) -> impl IntoResponse {
    let Some(name) = rest.strip_suffix("/tags/list") else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let page: usize = (query.as_deref())
        .and_then(|q| q.strip_prefix("page="))
        .and_then(|k| k.parse().ok())
        .unwrap_or(0);
    let mut body = format!(r#"{{"name":"{name}","tags":["#);
    for i in 0..TAGS_PER_PAGE {
        let comma = if i == 0 { "" } else { "," };
        write!(body, r#"{comma}"{page}x{i}""#).unwrap();
    }
    body.push_str("]}");
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if page + 1 < PAGES {
        let link = format!("</v2/{name}/tags/list?page={}>; rel=\"next\"", page + 1);
        headers.insert(header::LINK, HeaderValue::from_str(&link).unwrap());
    }
    (headers, body).into_response()
}

/// In the child: the gateway on the registry, each repository's tag count
/// asked once; after each request, the resident memory gained since the
/// cache was empty. Reports the most gained and the weight at the end.
fn read_all() {
    let registry = std::env::var(REGISTRY_VAR).unwrap();
    let table = UpstreamTable::default()
        .url(registry.clone())
        .tag_ttl_ms(600_000);
    let mut config = fanout_budget::Config::default().upstream_named("registry", table);
    config.upstream.cache_bytes = BOUND_MIB << 20;
    config.budget.max_reads = 1000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let gateway = fanout_gateway::app::build(config, registry.parse().unwrap(), None);
        let ask = |repo: usize| {
            let query = format!(
                r#"{{ repository(name: "warm/r{repo}") {{ tags(first: 1) {{ totalCount }} }} }}"#
            );
            let body = serde_json::json!({ "query": query }).to_string();
            let router = gateway.router.clone();
            async move {
                let (status, answer) = post(&router, body, &[]).await;
                assert_eq!(status, 200, "{answer}");
                let count = &answer["data"]["repository"]["tags"]["totalCount"];
                assert_eq!(count, &serde_json::json!(PAGES * TAGS_PER_PAGE), "{answer}");
            }
        };
        // Warm: the engine's own first allocations, outside the figure.
        ask(REPOSITORIES).await;
        let before = child::rss_mib();
        let mut most = 0.0_f64;
        for repo in 0..REPOSITORIES {
            ask(repo).await;
            most = most.max(child::rss_mib() - before);
        }
        let weight = gateway.engine.cache_weight() as f64 / f64::from(1 << 20);
        child::report(format!("{most:.1} {weight:.1}"));
    });
}

#[test]
fn paginated_tag_lists_hold_no_more_than_the_cache_bound() {
    if child::case().is_some() {
        return read_all();
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/v2/{*rest}", axum::routing::get(tag_page));
    let server = runtime.spawn(async move { axum::serve(listener, app).await });
    // Large allocations mapped and unmapped as they come and go, so the
    // resident figure is what is held, not what the allocator kept.
    let env = [
        (REGISTRY_VAR, url.as_str()),
        ("MALLOC_MMAP_THRESHOLD_", "131072"),
    ];
    let test = "paginated_tag_lists_hold_no_more_than_the_cache_bound";
    let run = child::run_with(test, "read", 2048, Duration::from_secs(300), &env);
    server.abort();
    assert!(
        run.success,
        "the child ended {}:\n{}",
        run.ended, run.output
    );
    let (most, weight) = run.reports[0].split_once(' ').unwrap();
    let (most, weight): (f64, f64) = (most.parse().unwrap(), weight.parse().unwrap());
    println!(
        "{REPOSITORIES} repositories × {PAGES} pages: weighed {weight:.1} MiB, \
         resident gained at most {most:.1} MiB, for a {BOUND_MIB} MiB cache"
    );
    let bound = BOUND_MIB as f64;
    assert!(weight <= bound, "weighs {weight} MiB");
    assert!(
        most < 2.0 * bound,
        "the cache held {most:.1} MiB resident for a {bound} MiB bound"
    );
}
