//! Invariants under concurrency, over random batches, budgets, caps and
//! upstream behaviours (some requests cancelled mid-flight):
//! reads issued ≤ budget; in flight per host ≤ cap; afterwards nothing is in
//! flight and every request's counters balance.
mod common;

use common::*;
use fanout_budget::config::{Config, HostConfig};
use fanout_budget::{inbound::Caller, Engine, Read};
use proptest::prelude::*;

use std::time::Duration;

#[derive(Clone, Debug)]
struct Case {
    budget: u64,
    cap: u32,
    per_request: usize,
    requests: Vec<Vec<(u64, u8)>>, // per request: (item id, behaviour)
    cancel: Vec<bool>,
}

fn behaviour(code: u8) -> Behaviour {
    match code % 5 {
        0 | 1 => Behaviour::Ok,
        2 => Behaviour::Delay(Duration::from_millis(20)),
        3 => Behaviour::Status(500),
        _ => Behaviour::Hang, // cut by the 60 ms read timeout
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        1u64..12,
        1u32..5,
        1usize..5,
        prop::collection::vec(prop::collection::vec((0u64..16, any::<u8>()), 1..10), 1..6),
    )
        .prop_flat_map(|(budget, cap, per_request, requests)| {
            let n = requests.len();
            (
                Just(budget),
                Just(cap),
                Just(per_request),
                Just(requests),
                prop::collection::vec(any::<bool>(), n),
            )
        })
        .prop_map(|(budget, cap, per_request, requests, cancel)| Case {
            budget,
            cap,
            per_request,
            requests,
            cancel,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn budgets_caps_and_counters_hold(case in case()) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async move {
            let upstream = Upstream::start().await;
            let mut config = Config::default();
            config.budget.max_reads = case.budget;
            config.budget.read_timeout_ms = 60;
            config.budget.max_concurrent_reads = case.per_request;
            config.hosts.insert(upstream.host(), HostConfig::default().max_concurrent(case.cap).acquire_wait_ms(500));
            let engine = Engine::new(config);
            let mut requests = Vec::new();
            let mut tasks = Vec::new();
            for (reads, cancel) in case.requests.iter().zip(&case.cancel) {
                let request = engine.begin_request(Caller::Public);
                requests.push(request.clone());
                for (id, code) in reads {
                    // Behaviours are per item id; the last writer wins, which is fine.
                    upstream.seen.set(*id, behaviour(*code));
                }
                let reads: Vec<_> = reads.iter().map(|(id, _)| format!("{}/item/{id}", upstream.base())).collect();
                let task = tokio::spawn(async move {
                    let op = request.operation();
                    let all = reads.into_iter().map(|url| {
                        let op = op.clone();
                        async move { op.upstream().read(Read::get(url.parse().unwrap())).await.is_ok() }
                    });
                    futures::future::join_all(all).await
                });
                tasks.push((task, *cancel));
            }
            for (task, cancel) in &tasks {
                if *cancel {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    task.abort();
                }
            }
            for (task, _) in tasks {
                let _ = task.await;
            }
            let host = upstream.host();
            assert_eq!(engine.hosts().in_flight(&host), 0, "a slot outlived its request");
            assert!(upstream.seen.peak() <= case.cap as u64 + hung_overlap(&case), "upstream peak {} > cap {}", upstream.seen.peak(), case.cap);
            let mut issued_total = 0;
            for request in &requests {
                let stats = request.budget().counts();
                let issued = stats.issued;
                assert!(issued <= case.budget, "issued {issued} > budget {}", case.budget);
                assert_eq!(issued, request.budget().used());
                assert!(stats.balanced(), "counters do not balance: {stats:?}");
                issued_total += issued;
            }
            // A read cancelled right after its charge may never reach the upstream.
            let seen = upstream.seen.requests();
            assert!(seen <= issued_total, "the upstream saw {seen} reads, {issued_total} were issued");
            if !case.cancel.iter().any(|c| *c) {
                assert_eq!(seen, issued_total, "the upstream saw exactly the issued reads");
            }
        });
    }
}

/// Reads the engine let go of while the upstream still serves them: hung
/// reads abandoned at their timeout, and the reads in flight when their
/// request was cancelled (at most `per_request` each). They stay in flight
/// at the upstream until it notices the closed connection, while their
/// host slots already serve the next reads; the engine's own count never
/// passes the cap, the upstream's may, by those (book/src/host-caps.md).
fn hung_overlap(case: &Case) -> u64 {
    let hung = case
        .requests
        .iter()
        .flatten()
        .filter(|(_, code)| code % 5 == 4)
        .count() as u64;
    let cancelled: u64 = case
        .requests
        .iter()
        .zip(&case.cancel)
        .filter(|(_, cancel)| **cancel)
        .map(|(reads, _)| reads.len().min(case.per_request) as u64)
        .sum();
    hung + cancelled
}
