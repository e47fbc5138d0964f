//! The budget never charges past its limit, under any interleaving, and its
//! in-flight slots never exceed their bound.

use super::{Exhausted, RequestBudget, TimedOut};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

fn budget(limit: u64) -> Arc<RequestBudget> {
    let deadline = Instant::now() + Duration::from_secs(60);
    Arc::new(RequestBudget::new(limit, 8, deadline))
}

fn charge_concurrently(limit: u64, threads: usize, attempts: usize) -> (u64, u64) {
    let b = budget(limit);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || {
                (0..attempts).filter(|_| b.try_charge().is_ok()).count() as u64
            })
        })
        .collect();
    let granted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    (granted, b.used())
}

#[test]
fn a_thousand_concurrent_charges_against_a_hundred() {
    for _ in 0..50 {
        let (granted, used) = charge_concurrently(100, 8, 125);
        assert_eq!(granted, 100);
        assert_eq!(used, 100);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn charges_granted_equal_min_of_limit_and_attempts(limit in 0u64..300, threads in 1usize..8, attempts in 0usize..100) {
        let (granted, used) = charge_concurrently(limit, threads, attempts);
        let expected = limit.min((threads * attempts) as u64);
        prop_assert_eq!(granted, expected);
        prop_assert_eq!(used, expected);
    }
}

#[test]
fn a_refused_charge_changes_nothing() {
    let b = budget(2);
    assert!(b.try_charge().is_ok());
    assert!(b.try_charge().is_ok());
    assert_eq!(b.try_charge(), Err(Exhausted));
    assert_eq!(b.used(), 2);
    assert_eq!(b.remaining(), 0);
    assert!(b.is_exhausted());
}

// ---------------------------------------------------------------------------
// The request's in-flight slots (`max_concurrent_reads`).

fn slots(max: usize) -> Arc<RequestBudget> {
    Arc::new(RequestBudget::new(
        1000,
        max,
        Instant::now() + Duration::from_secs(60),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_slots_never_exceed_the_bound_and_every_waiter_gets_one() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let budget = slots(3);
    // Counted apart from the slots' own counter: holders between acquiring
    // and releasing.
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (budget, active, peak) = (budget.clone(), active.clone(), peak.clone());
            tokio::spawn(async move {
                for _ in 0..200 {
                    let slot = budget
                        .in_flight_slot()
                        .await
                        .expect("a slot before the deadline");
                    let now = active.fetch_add(1, SeqCst) + 1;
                    assert!(now <= 3, "{now} reads hold a slot, bound 3");
                    peak.fetch_max(now, SeqCst);
                    tokio::task::yield_now().await;
                    active.fetch_sub(1, SeqCst);
                    drop(slot);
                }
            })
        })
        .collect();
    // Every task finishes: no waiter is left asleep with a slot free.
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a waiter was never woken")
            .unwrap();
    }
    assert_eq!(budget.in_flight(), 0);
    assert_eq!(peak.load(SeqCst), 3, "32 readers never filled the 3 slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_waiters_registration_always_wakes_it() {
    // One slot, held; a waiter starts on another thread while the holder
    // releases: whichever comes first, the waiter must get the slot. Every
    // other round, a second waiter is cancelled during the release.
    for round in 0..20_000u32 {
        let budget = slots(1);
        let held = budget.slots.try_acquire().expect("a free slot");
        let b = budget.clone();
        let waiter = tokio::spawn(async move { b.in_flight_slot().await.map(drop) });
        let cancelled = (round % 2 == 1).then(|| {
            let b = budget.clone();
            tokio::spawn(async move { b.in_flight_slot().await.map(drop) })
        });
        if round % 3 == 0 {
            tokio::task::yield_now().await;
        }
        if let Some(cancelled) = &cancelled {
            cancelled.abort();
        }
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter was never woken"))
            .unwrap()
            .expect("a slot");
        if let Some(cancelled) = cancelled {
            let _ = cancelled.await;
        }
        assert_eq!(budget.in_flight(), 0);
    }
}

#[tokio::test]
async fn a_waiter_that_gives_up_passes_its_wake_up_on() {
    use futures::FutureExt;
    let budget = slots(1);
    let held = budget.slots.try_acquire().expect("a free slot");
    assert!(budget.slots.try_acquire().is_none(), "one slot only");
    // Boxed, so that dropping `first` drops the future itself.
    let mut first = Box::pin(budget.in_flight_slot());
    let mut second = Box::pin(budget.in_flight_slot());
    // Both wait (registered in this order).
    assert!(first.as_mut().now_or_never().is_none());
    assert!(second.as_mut().now_or_never().is_none());
    // The release wakes the first waiter, which is then cancelled unpolled
    // (its deadline, its request): the second must get the slot.
    drop(held);
    drop(first);
    let slot = second
        .as_mut()
        .now_or_never()
        .expect("the wake-up was passed on")
        .expect("a slot");
    assert_eq!(budget.in_flight(), 1);
    drop(slot);
    assert_eq!(budget.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn waiting_for_a_slot_ends_at_the_deadline() {
    let budget = Arc::new(RequestBudget::new(
        10,
        1,
        Instant::now() + Duration::from_millis(200),
    ));
    let _held = budget.slots.try_acquire().expect("a free slot");
    let started = Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(10), budget.in_flight_slot())
        .await
        .expect("the deadline ended the wait");
    assert!(matches!(waited, Err(TimedOut)));
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

#[test]
fn grants_of_reads_asking_together_never_pass_what_is_left() {
    let budget = budget(20);
    for _ in 0..4 {
        budget.try_charge().unwrap();
    }
    // 16 left, 4 asking, each taking its share as the others still ask.
    let grants: Vec<u64> = (1..=4)
        .rev()
        .map(|asking| budget.reserve_grant(asking, u64::MAX))
        .collect();
    assert_eq!(grants, [4, 4, 4, 4]);
    assert_eq!((budget.used(), budget.reserve_grant(1, u64::MAX)), (20, 0));
    // Settled: what was spent stays, the rest comes back; more is not believed.
    assert_eq!(budget.settle_grant(4, 1), 1);
    assert_eq!(budget.settle_grant(4, 99), 4);
    assert_eq!(budget.used(), 17);
}

#[test]
fn a_grant_is_cut_to_what_the_other_payer_pays() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let budget = budget(20);
    let payable = Arc::new(AtomicU64::new(3));
    let left = payable.clone();
    budget.paid_by(
        Box::new(
            move || match left.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)) {
                Ok(_) => super::Paid::Yes,
                Err(_) => super::Paid::Refused,
            },
        ),
        3,
    );
    budget.try_charge().unwrap();
    // 19 left for the grant, but the connection pays 2 more reads only.
    assert_eq!(budget.reserve_grant(1, u64::MAX), 2);
    assert_eq!(budget.used(), 3);
    assert_eq!(payable.load(Relaxed), 0);
    // Unspent, the grant goes back to the request's budget.
    assert_eq!(budget.settle_grant(2, 0), 0);
    assert_eq!(budget.used(), 1);
}
