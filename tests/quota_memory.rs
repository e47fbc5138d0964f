//! A flood of clients, each from an address of its own, against an app with
//! the read quota and the per-IP limit in process: what the process holds
//! for them stays bounded. Run in a child process under an address-space
//! limit (`fanout_testkit::child`), its resident memory read from the
//! kernel: a store that kept every client it ever saw ends its child, or
//! fails the bound, not the suite.
//!
//! Each client sends one request through `FanoutGraphQL` (two reads) on
//! paused time at 10,000 new clients a second: the quota holds a client for
//! the two reads' share of its period (2 s), the per-IP limit for one
//! request's share of a minute (0.2 s), so ~20,000 are live at a time
//! whatever the number of addresses seen. `FANOUT_QUOTA_CLIENTS` sets how
//! many clients: 300,000 by default (~2.5 minutes in a debug build, a
//! request ~450 µs), enough that a store keeping them all grows past the
//! bound (+16.5 MiB measured with the quota's sweep turned off, against
//! +3.8 with it); `FANOUT_QUOTA_CLIENTS=1000000` for a million.

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use fanout_budget::config::QuotaConfig;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::{call, child, graphql_request, MemTransport};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

struct Query;

#[Object]
impl Query {
    /// Two reads.
    async fn two(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        for path in ["a", "b"] {
            let url = format!("http://up.test/{path}").parse()?;
            ctx.upstream()?.read(Read::get(url)).await?;
        }
        Ok(true)
    }
}

/// The resident memory the flood may add past its warm-up, whatever its
/// size, in MiB: at most ~64,000 clients held at the sweeps' peak
/// (3 × live + 4,096) in each of two maps of ~60-byte entries is ~7 MiB;
/// every one of 300,000 clients kept by the quota alone is ~16.5.
const BOUND_MIB: f64 = 10.0;

/// The child: `clients` requests, each from a new address, 100 per 10 ms of
/// paused time; reports the resident memory gained past a warm-up, and the
/// statuses seen.
async fn flood(clients: u32) {
    let mut config = Config::default();
    // 3,600 reads an hour: one read's share of the period is a second.
    config.quota = QuotaConfig::default().reads(3_600).period_secs(3_600);
    config.rate_limit.requests_per_minute = 300;
    config.budget.max_reads = 2;
    let transport = Arc::new(MemTransport::new().record(false));
    let engine = Engine::builder(config).transport(transport).build();
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let router = axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let body = r#"{"query":"{ two }"}"#;
    let warm_up = 20_000.min(clients / 2);
    let (mut before, mut ok) = (0.0, 0u32);
    for n in 0..clients {
        if n == warm_up {
            before = child::rss_mib();
            child::reset_peak();
        }
        // 10.0.0.0 upwards: a million distinct addresses, one per client.
        let peer = SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + n), 40_000));
        let answer = call(&router, graphql_request(body, &[], Some(peer))).await;
        assert_eq!(answer.status, 200, "client {n}: {}", answer.json());
        ok += u32::from(answer.json()["data"]["two"] == true);
        if n % 100 == 99 {
            tokio::time::advance(Duration::from_millis(10)).await;
        }
    }
    child::report(format!("{:.1}", child::peak_mib() - before));
    child::report(ok);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_distinct_clients_holds_bounded_memory() {
    let clients: u32 = std::env::var("FANOUT_QUOTA_CLIENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300_000);
    if let Some(case) = child::case() {
        return flood(case.parse().unwrap()).await;
    }
    let test = "a_flood_of_distinct_clients_holds_bounded_memory";
    let run = child::run(test, &clients.to_string(), 1024, Duration::from_secs(900));
    assert!(
        run.success,
        "the child ended {}:\n{}",
        run.ended, run.output
    );
    let gained: f64 = run.reports[0].parse().unwrap();
    let answered: u32 = run.reports[1].parse().unwrap();
    eprintln!("{clients} clients: peak resident memory +{gained:.1} MiB past the warm-up");
    assert_eq!(answered, clients, "every client's two reads were answered");
    assert!(
        gained < BOUND_MIB,
        "{clients} clients grew the process by {gained:.1} MiB (bound {BOUND_MIB} MiB)"
    );
}
