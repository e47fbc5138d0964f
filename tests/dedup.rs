//! Request-scoped single-flight de-duplication across operations.
mod common;

/// Two operations of one request share a read; the operation running it is
/// cancelled; the other still gets its answer (it reads itself).
#[tokio::test]
async fn a_cancelled_operation_does_not_poison_the_batch() {
    let upstream = common::Upstream::start().await;
    upstream.seen.set(
        1,
        common::Behaviour::Delay(std::time::Duration::from_millis(300)),
    );
    let engine = fanout_budget::Engine::new(fanout_budget::Config::default());
    let request = engine.begin_request(fanout_budget::inbound::Caller::Public);
    let url: reqwest::Url = format!("{}/item/1", upstream.base()).parse().unwrap();

    let (a, b) = (request.operation(), request.operation());
    let first = {
        let url = url.clone();
        tokio::spawn(async move {
            a.upstream()
                .read(fanout_budget::Read::get(url))
                .await
                .map(|r| r.status)
        })
    };
    while upstream.seen.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn(async move {
        b.upstream()
            .read(fanout_budget::Read::get(url))
            .await
            .map(|r| r.body.clone())
    });
    tokio::task::yield_now().await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let body = second
        .await
        .unwrap()
        .expect("the surviving operation gets an answer");
    assert!(String::from_utf8_lossy(&body).contains("item-1"));
}

/// A read waiting on an identical one holds a small future: the send's
/// state (slots, timer, the transport's future) is boxed by the read that
/// sends. A batch of thousands of rows waiting on a few shared reads holds
/// one such future per row (`src/memory.rs`, `PENDING_WEIGHT`). Within
/// 1 KiB: boxed by a resolver's caller, it stays within what glibc's
/// per-thread cache serves (1,032 bytes) — 784 bytes in 0.2.
#[test]
fn a_read_waiting_on_another_holds_a_small_future() {
    let engine = fanout_budget::Engine::new(fanout_budget::Config::default());
    let request = engine.begin_request(fanout_budget::inbound::Caller::Public);
    let op = request.operation();
    let upstream = op.upstream();
    let read = upstream.read(fanout_budget::Read::get(
        "http://127.0.0.1:9/item/1".parse().unwrap(),
    ));
    let size = std::mem::size_of_val(&read);
    assert!(size <= 1024, "a read's future holds {size} bytes");
}
