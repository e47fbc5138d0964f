//! A loopback GET, plain reqwest and through the engine.

use crate::fixtures::{current_thread, in_task, Dedup};
use crate::path::engine_routine;
use crate::support::{paired, Paired};
use crate::{CHUNK, LOOPBACK, ROUNDS};
use criterion::{black_box, Criterion};
use fanout_budget::config::HostConfig;
use fanout_budget::{Config, Engine};
use std::sync::Arc;
use std::time::Instant;
use tokio::runtime::Runtime;

/// A loopback GET with reqwest, plain and through the engine, against a
/// tiny axum server on the same (single-threaded) runtime.
pub(crate) fn loopback(c: &mut Criterion, run_paired: bool) -> Option<Paired> {
    // One thread for client and server: no cross-thread wake-ups, so the
    // figure is the CPU cost of a GET, and the two benches compare.
    let rt = current_thread();
    let (addr, server) = rt.block_on(async {
        let app = axum::Router::new().route(
            "/v2/{*rest}",
            axum::routing::get(|| async { r#"{"schemaVersion":2}"# }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("an address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (addr, server)
    });
    let host = addr.to_string();
    let pool: Arc<Vec<reqwest::Url>> = Arc::new(
        (0..CHUNK)
            .map(|i| {
                format!("http://{host}/v2/bench/app/manifests/t{i}")
                    .parse()
                    .expect("a URL")
            })
            .collect(),
    );
    let mut g = c.benchmark_group(LOOPBACK);
    let client = reqwest::Client::new();
    let get = |rt: &Runtime, iters: u64| {
        let (client, pool) = (client.clone(), pool.clone());
        in_task(rt, async move {
            let started = Instant::now();
            for i in 0..iters as usize {
                let response = client
                    .get(pool[i % CHUNK].clone())
                    .send()
                    .await
                    .expect("a response");
                black_box(response.bytes().await.expect("a body"));
            }
            started.elapsed()
        })
    };
    g.bench_function("reqwest", |b| b.iter_custom(|iters| get(&rt, iters)));
    let mut config = Config::default();
    config.budget.max_reads = 1_000;
    config.hosts.insert(host.clone(), HostConfig::default());
    let engine = Engine::new(config);
    let mut through_engine = engine_routine(&rt, engine.clone(), pool.clone(), Dedup::Miss);
    g.bench_function("engine", |b| b.iter_custom(&mut through_engine));
    g.finish();
    let paired_get = run_paired.then(|| {
        paired(
            ROUNDS,
            500,
            engine_routine(&rt, engine, pool.clone(), Dedup::Miss),
            |iters| get(&rt, iters),
        )
    });
    server.abort();
    paired_get
}
