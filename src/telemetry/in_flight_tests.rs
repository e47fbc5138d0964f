//! The queue's bound: one word of spans and bytes, admitted and given back.

use super::*;

#[test]
fn a_span_is_refused_past_the_spans_or_the_bytes() {
    let queue = InFlight::new(3, 1000);
    assert_eq!(queue.admit(400), Ok(()));
    assert_eq!(queue.admit(400), Ok(()));
    assert_eq!(queue.admit(400), Err("queue_bytes"));
    assert_eq!(queue.held(), (2, 800), "a refusal takes nothing");
    assert_eq!(queue.admit(200), Ok(()));
    assert_eq!(queue.admit(0), Err("queue_full"));
    assert_eq!(queue.held(), (3, 1000));
    queue.release(2, 800);
    assert_eq!(queue.held(), (1, 200));
    // One span heavier than the whole queue is never admitted.
    assert_eq!(queue.admit(1001), Err("queue_bytes"));
    assert_eq!(queue.admit(800), Ok(()));
    queue.release(2, 1000);
    assert_eq!(queue.held(), (0, 0));
}

/// Were a release ever to give back more than was taken (a span weighed
/// again after its lists changed), each part of the word stops at zero —
/// no wrap, no borrow from the spans' part — and the queue admits to its
/// bounds after.
#[test]
fn a_release_of_more_than_was_admitted_stops_at_zero() {
    let queue = InFlight::new(3, 1000);
    assert_eq!(queue.admit(100), Ok(()));
    queue.release(0, 500);
    assert_eq!(
        queue.held(),
        (1, 0),
        "the bytes stop at zero, the span stays"
    );
    queue.release(4, 0);
    assert_eq!(queue.held(), (0, 0), "the spans stop at zero");
    queue.release(usize::MAX, u64::MAX);
    assert_eq!(queue.held(), (0, 0), "however much is given back");
    for _ in 0..3 {
        assert_eq!(queue.admit(300), Ok(()));
    }
    assert_eq!(queue.admit(0), Err("queue_full"));
    assert_eq!(queue.admit(101), Err("queue_full"));
    assert_eq!(queue.held(), (3, 900), "a refusal gives back what it took");
    queue.release(1, 300);
    assert_eq!(queue.admit(401), Err("queue_bytes"));
    assert_eq!(queue.admit(400), Ok(()));
    assert_eq!(queue.held(), (3, 1000));
}

#[test]
fn the_bounds_are_clamped_to_what_the_word_holds() {
    let queue = InFlight::new(usize::MAX, u64::MAX);
    assert_eq!(queue.max_spans, MAX_SPANS as u64);
    assert_eq!(queue.max_bytes, MAX_BYTES);
    assert_eq!(queue.admit(MAX_BYTES), Ok(()));
    assert_eq!(queue.admit(1), Err("queue_bytes"));
    assert_eq!(queue.held(), (1, MAX_BYTES));
    assert_eq!(InFlight::new(0, 10).max_spans, 1);
}
