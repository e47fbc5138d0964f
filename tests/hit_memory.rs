//! What a request holds through the engine's cache: a hit is kept for the
//! rest of the request (its identical reads share it) — so it is bytes the
//! request holds, and `upstream.max_request_bytes` ("the most bytes of
//! upstream answers one request holds") must bound them as it bounds the
//! answers the request read itself. Hits cost no read, so nothing else
//! bounds how many a request makes.
//!
//! One request (its bound 1 MiB) hits every entry of a 16 MiB cache of
//! 1 MiB answers (fresh for 300 ms); once they expired, other requests fill
//! the cache again, and it hits the new ones too; eight rounds. In a child process under an address-space
//! limit; the resident memory gained is read from the kernel.
//!
//! `cargo test --test hit_memory -- --nocapture` prints the figures.
use bytes::Bytes;
use fanout_budget::read::Transport;
use fanout_budget::{inbound::Caller, Config, Engine, Read, ReadError, UpstreamResponse};
use fanout_testkit::child;
use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use std::sync::Arc;
use std::time::Duration;

const ENTRY: usize = 1 << 20;
const ENTRIES: usize = 14;
const ROUNDS: usize = 8;

/// Answers every read `200` with a body of its own, `ENTRY` bytes.
struct FreshBodies;

impl Transport for FreshBodies {
    fn fetch<'a>(
        &'a self,
        _read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        let body = Bytes::from(vec![b'x'; ENTRY]);
        Box::pin(async move {
            Ok(UpstreamResponse::new(
                host,
                StatusCode::OK,
                HeaderMap::new(),
                body,
            ))
        })
    }
}

fn blob(round: usize, i: usize) -> Read {
    Read::get(format!("http://blobs.local/{round}/{i}").parse().unwrap())
        .fresh_for(Duration::from_millis(300))
}

/// In the child: the resident memory gained while one request hits every
/// round's entries, and how many of its hits it was given.
fn hold() {
    let mut config = Config::default();
    config.upstream.cache_bytes = 16 << 20;
    config.upstream.max_request_bytes = 1 << 20;
    let engine = Engine::builder(config)
        .transport(Arc::new(FreshBodies))
        .build();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let before = child::rss_mib();
        let holder = engine.begin_request(Caller::Public);
        let op = holder.operation();
        let mut given = 0;
        for round in 0..ROUNDS {
            // The last round's entries expire (and leave the cache)...
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while engine.cache_weight() > 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "entries never expired"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // ...and other requests fill it with this round's answers.
            for i in 0..ENTRIES {
                let filler = engine.begin_request(Caller::Internal);
                filler
                    .operation()
                    .upstream()
                    .read(blob(round, i))
                    .await
                    .unwrap();
            }
            for i in 0..ENTRIES {
                if op.upstream().read(blob(round, i)).await.is_ok() {
                    given += 1;
                }
            }
        }
        let hits = op.cache_hits();
        let gained = child::rss_mib() - before;
        child::report(format!("{gained:.1} {hits} {given}"));
        drop(op);
        drop(holder);
    });
}

#[test]
fn hits_a_request_holds_count_against_its_byte_bound() {
    if child::case().is_some() {
        return hold();
    }
    let test = "hits_a_request_holds_count_against_its_byte_bound";
    let run = child::run(test, "hold", 2048, Duration::from_secs(120));
    assert!(
        run.success,
        "the child ended {}:\n{}",
        run.ended, run.output
    );
    let fields: Vec<&str> = run.reports[0].split(' ').collect();
    let gained: f64 = fields[0].parse().unwrap();
    let (hits, given): (u64, u64) = (fields[1].parse().unwrap(), fields[2].parse().unwrap());
    println!("{hits} hits, {given} answers given, {gained:.1} MiB resident for a 16 MiB cache and a request bound of 1 MiB");
    // The cache (16 MiB) and what the request may hold (1 MiB), with room.
    assert!(
        gained < 2.0 * 17.0,
        "one request holds {:.1} MiB through {hits} hits (its bound 1 MiB, the cache 16 MiB)",
        gained
    );
}
