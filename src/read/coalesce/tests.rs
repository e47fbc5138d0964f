//! The table of shared reads in flight: a read joins one in flight, a
//! flight leaves the table before its outcome is public.

use super::{Coalesce, Role};
use futures::poll;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Leads `key` with a read that answers `value` once `gate` has a permit.
fn lead_gated(
    table: &Arc<Coalesce<&'static str, u32>>,
    key: &'static str,
    gate: &Arc<Semaphore>,
    value: u32,
) -> Result<Role<u32>, ()> {
    let gate = gate.clone();
    table.join_or_lead(key, || {
        Ok(async move {
            let _open = gate.acquire().await;
            value
        })
    })
}

#[tokio::test]
async fn a_flight_is_joined_until_it_ends_and_leaves_the_table_before_its_outcome_is_public() {
    let table = Arc::new(Coalesce::<&str, u32>::new());
    let gate = Arc::new(Semaphore::new(0));
    let Ok(Role::Led(led)) = lead_gated(&table, "k", &gate, 1) else {
        panic!("the first caller leads")
    };
    let Ok(Role::Joined(joined)) = lead_gated(&table, "k", &gate, 2) else {
        panic!("the second joins")
    };
    assert!(table.find(&"k").is_some() && table.find(&"j").is_none());
    assert_eq!(table.len(), 1);
    assert!(poll!(Box::pin(led.clone().outcome())).is_pending());
    gate.add_permits(1);
    assert_eq!(
        (led.outcome().await, joined.outcome().await),
        (Some(1), Some(1))
    );
    assert_eq!(table.len(), 0, "out of the table once it ended");
    assert!(
        matches!(lead_gated(&table, "k", &gate, 3), Ok(Role::Led(_))),
        "a later caller reads afresh"
    );
}

#[tokio::test]
async fn a_refused_lead_registers_nothing() {
    let table = Arc::new(Coalesce::<&str, u32>::new());
    let refused = table.join_or_lead("k", || Err::<std::future::Ready<u32>, _>("no budget"));
    assert!(matches!(refused, Err("no budget")));
    assert_eq!(table.len(), 0);
    let led = table.join_or_lead("k", || Ok::<_, ()>(std::future::ready(4)));
    let Ok(Role::Led(flight)) = led else {
        panic!("the next caller leads")
    };
    assert_eq!(flight.outcome().await, Some(4));
}

#[tokio::test]
async fn a_panicking_flight_answers_none_and_leaves_the_table() {
    let table = Arc::new(Coalesce::<&str, u32>::new());
    let led = table.join_or_lead("k", || {
        Ok::<_, ()>(async { panic!("the shared read panicked (expected by the test)") })
    });
    let Ok(Role::Led(flight)) = led else {
        panic!("leads")
    };
    assert_eq!(flight.outcome().await, None);
    assert_eq!(table.len(), 0);
}

/// A start wakes the callers waiting on its key's shard.
#[tokio::test]
async fn a_start_wakes_the_callers_waiting_for_one() {
    let table = Arc::new(Coalesce::<&str, u32>::new());
    let mut started = Box::pin(table.started(&"k"));
    started.as_mut().enable();
    assert!(poll!(started.as_mut()).is_pending());
    let gate = Arc::new(Semaphore::new(0));
    assert!(lead_gated(&table, "k", &gate, 1).is_ok());
    assert!(poll!(started.as_mut()).is_ready());
}
