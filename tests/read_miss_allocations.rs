//! A read the request has not made yet (a de-duplication miss, sent) makes
//! four allocations of its own beside the transport's: its key in the
//! request's table, the table's cell, the send's future (boxed: the rest of
//! the read's future stays small), the answer kept for the request.
//! Counted by this binary's global allocator, on the polling thread only:
//! the engine's reads against the same transport called alone.
use fanout_budget::config::HostConfig;
use fanout_budget::read::Transport;
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use fanout_testkit::MemTransport;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

#[path = "common/counting.rs"]
mod counting;

use counting::{allocations, Counting};

#[global_allocator]
static COUNTING: Counting = Counting;

const HOST: &str = "registry.local:5000";
/// Requests, and distinct reads in each (the table grows as a request's
/// reads do: counted, as the read path pays it).
const REQUESTS: usize = 50;
const READS: usize = 64;

/// `f` polled once, answered at once (the transport is ready).
fn at_once<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("not answered at once"),
    }
}

#[test]
fn a_missed_read_allocates_four_times_beside_the_transport() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = rt.enter();
    let transport = Arc::new(MemTransport::new().body(&b"{}"[..]).record(false));
    let mut config = Config::default();
    config.budget.max_reads = 1_000;
    config.hosts.insert(HOST.into(), HostConfig::default());
    let engine = Engine::builder(config).transport(transport.clone()).build();
    let urls: Vec<reqwest::Url> = (0..READS)
        .map(|i| {
            format!("http://{HOST}/v2/app/manifests/t{i}")
                .parse()
                .unwrap()
        })
        .collect();
    let reads = || -> Vec<Read> { urls.iter().cloned().map(Read::get).collect() };

    let mut engine_made = 0;
    for _ in 0..REQUESTS {
        let request = engine.begin_request(Caller::Public);
        let op = request.operation();
        let upstream = op.upstream();
        let reads = reads();
        let before = allocations();
        for read in reads {
            at_once(upstream.read(read)).expect("an answer");
        }
        engine_made += allocations() - before;
        assert_eq!(op.reads(), READS as u64, "not all of them were sent");
    }
    // The transport alone, each read copied as the engine's walk copies it
    // (the caller keeps its read: a redirect, a challenge answered).
    let mut transport_made = 0;
    for _ in 0..REQUESTS {
        let reads = reads();
        let before = allocations();
        for read in &reads {
            at_once(transport.fetch(read.clone(), HOST)).expect("an answer");
        }
        transport_made += allocations() - before;
    }
    let per_read = |n: u64| n as f64 / (REQUESTS * READS) as f64;
    let own = per_read(engine_made) - per_read(transport_made);
    println!(
        "per read: engine {:.2}, transport alone {:.2}, the engine's own {own:.2}",
        per_read(engine_made),
        per_read(transport_made)
    );
    assert!(
        own <= ENGINE_OWN,
        "a missed read made {own:.2} allocations of its own"
    );
}

/// The engine's own allocations a missed read may make, the table's growth
/// amortised over a request's reads (4.09 at 64 reads a request).
const ENGINE_OWN: f64 = 4.2;
