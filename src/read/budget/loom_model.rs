//! A loom model of the budget's charge: under every interleaving of
//! concurrent charges, exactly `min(limit, attempts)` succeed and `used`
//! never passes the limit.
//!
//! Built only with `--cfg loom` (`.ci/run`: `cargo rustc -p fanout-budget
//! --lib --profile test -- --cfg loom`, then the binary with `loom`).

use super::RequestBudget;
use std::sync::Arc;
use std::time::Duration;

fn budget(limit: u64) -> Arc<RequestBudget> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    Arc::new(RequestBudget::new(limit, 8, deadline))
}

fn model(limit: u64, threads: usize, attempts: usize) {
    let mut builder = loom::model::Builder::new();
    // Bounded preemptions keep the state space small enough for CI while
    // still covering every interleaving of the charge's load/CAS steps.
    builder.preemption_bound = Some(3);
    builder.check(move || {
        let b = budget(limit);
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let b = b.clone();
                loom::thread::spawn(move || {
                    let mut granted = 0;
                    for _ in 0..attempts {
                        if b.try_charge().is_ok() {
                            granted += 1;
                            assert!(b.used() <= limit);
                        }
                    }
                    granted
                })
            })
            .collect();
        let granted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let expected = limit.min((threads * attempts) as u64);
        assert_eq!(granted, expected);
        assert_eq!(b.used(), expected);
    });
}

#[test]
fn two_threads_racing_for_the_last_read() {
    model(1, 2, 1);
}

#[test]
fn three_threads_racing_for_two_reads() {
    model(2, 3, 1);
}

#[test]
fn more_attempts_than_budget_never_overshoots() {
    model(2, 2, 2);
}
