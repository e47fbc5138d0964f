//! A hit in the engine's cache allocates nothing of its own: the read is
//! looked up by a key borrowed from it, the kept answer handed over by
//! pointer, the request's own response for the entry made on its first
//! hit only.
//! Counted by this binary's global allocator, on the polling thread only.
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

/// Hits counted. moka's own housekeeping, which its `get` runs every few
/// dozen reads, flushes crossbeam-epoch's garbage (one 2 KiB bag, about one
/// allocation per 125 hits here): allowed, amortised; one per hit is not.
const HITS: u64 = 1000;

#[test]
fn a_cache_hit_allocates_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = rt.enter();
    let transport = MemTransport::new().body(&b"{}"[..]).record(false);
    let engine = Engine::builder(Config::default())
        .transport(Arc::new(transport))
        .build();
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let upstream = op.upstream();
    let url: reqwest::Url = "http://registry.local/v2/app/manifests/sha256:abc"
        .parse()
        .unwrap();
    let read = || Read::get(url.clone()).immutable();
    // Kept, then hit once: the request's own response for the entry made.
    for _ in 0..2 {
        rt.block_on(upstream.read(read())).expect("an answer");
    }
    let reads: Vec<Read> = (0..HITS).map(|_| read()).collect();
    let before = allocations();
    for read in reads {
        // A hit answers on its first poll.
        let mut hit = std::pin::pin!(upstream.read(read));
        let polled = hit.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(matches!(polled, Poll::Ready(Ok(_))), "not answered at once");
    }
    let made = allocations() - before;
    assert!(
        made * 16 < HITS,
        "{HITS} cache hits made {made} allocations"
    );
    assert_eq!(op.cache_hits(), HITS + 1, "not all of them were hits");
}
