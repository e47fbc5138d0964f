//! Coalescing (`[hosts."HOST:PORT"] coalesce = true`): identical safe reads
//! in flight at the same moment in different inbound requests share one
//! upstream request; only the request that sent it is charged.
//!
//! The loopback upstream holds its answers (`Seen::hold`) until every
//! request has joined — which the requests' own counters say — so nothing
//! here waits on a clock; the tests that need a deadline or a timeout to
//! pass run on tokio's paused clock with the in-memory transport.
use bytes::Bytes;
use fanout_budget::config::HostConfig;
use fanout_budget::{
    inbound::Caller, read::Transport, request::FanoutRequest, Config, Engine, Read, ReadError,
    UpstreamResponse,
};
use fanout_testkit::scripted::{self, read, HOST};
use fanout_testkit::{MemTransport, Upstream};
use futures::future::BoxFuture;
use http::header::AUTHORIZATION;
use http::{HeaderValue, Method};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The default configuration, with a `[hosts]` table for `host`.
fn config(host: &str, coalesce: bool) -> Config {
    let mut config = Config::default();
    let table = HostConfig::default().coalesce(coalesce);
    config.hosts.insert(host.to_string(), table);
    config
}

/// Yields until `done()`; a wait that does not end within a generous bound
/// fails the test (with `what` it was waiting for) instead of hanging.
async fn until(what: &str, done: impl Fn() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still waiting for {what}"
        );
        tokio::task::yield_now().await;
    }
}

/// A loopback upstream holding its `/item` answers ([`Seen::hold`]), and an
/// engine whose `[hosts]` table for it says `coalesce`, the rest of the
/// configuration as `tune` sets it.
///
/// [`Seen::hold`]: fanout_testkit::Seen::hold
async fn held(coalesce: bool, tune: impl FnOnce(&mut Config)) -> (Upstream, Engine) {
    let upstream = Upstream::start().await;
    upstream.seen.hold();
    let mut config = config(&upstream.host(), coalesce);
    tune(&mut config);
    (upstream, Engine::new(config))
}

/// Until the upstream has received `sent` requests and `requests` have
/// joined `joined` reads between them.
async fn until_sent(upstream: &Upstream, sent: u64, requests: &[FanoutRequest], joined: u64) {
    let what = format!("{sent} reads sent, {joined} joined");
    until(&what, || {
        upstream.requests() == sent && coalesced(requests) == joined
    })
    .await;
}

type Body = Result<Bytes, ReadError>;

/// `read` in an inbound request of its own, on a task of its own.
fn spawn_read(engine: &Engine, read: Read) -> (FanoutRequest, JoinHandle<Body>) {
    let request = engine.begin_request(Caller::Public);
    let operation = request.operation();
    let task = tokio::spawn(async move {
        let response = operation.upstream().read(read).await?;
        Ok(response.body.clone())
    });
    (request, task)
}

/// [`spawn_read`], once its read has joined one in flight.
async fn spawn_joined(engine: &Engine, read: Read) -> (FanoutRequest, JoinHandle<Body>) {
    let (request, task) = spawn_read(engine, read);
    until("the read joined", || {
        request.budget().counts().coalesced == 1
    })
    .await;
    (request, task)
}

fn get(upstream: &Upstream, path: &str) -> Read {
    Read::get(upstream.url(path).parse().unwrap())
}

/// The reads the requests joined, together.
fn coalesced(requests: &[FanoutRequest]) -> u64 {
    requests.iter().map(|r| r.budget().counts().coalesced).sum()
}

/// `n` requests read `/item/1` while the upstream holds its answer: what
/// the upstream saw, and each request with its answer.
async fn n_requests_one_url(coalesce: bool, n: usize) -> (u64, Vec<(FanoutRequest, Body)>) {
    let (upstream, engine) = held(coalesce, |_| {}).await;
    let (requests, tasks): (Vec<_>, Vec<_>) = (0..n)
        .map(|_| spawn_read(&engine, get(&upstream, "/item/1")))
        .unzip();
    if coalesce {
        until_sent(&upstream, 1, &requests, n as u64 - 1).await;
    } else {
        until_sent(&upstream, n as u64, &requests, 0).await;
    }
    upstream.seen.release();
    let mut answers = Vec::new();
    for (request, task) in requests.into_iter().zip(tasks) {
        answers.push((request, task.await.unwrap()));
    }
    assert_eq!(engine.hosts().in_flight(&upstream.host()), 0);
    (upstream.requests(), answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_reads_in_flight_in_different_requests_are_one_upstream_request() {
    let n = 20;
    let (sent, answers) = n_requests_one_url(true, n).await;
    assert_eq!(sent, 1, "one upstream request for {n} inbound requests");
    let mut leaders = 0;
    for (request, body) in &answers {
        let body = body.as_ref().expect("every request gets the answer");
        assert!(String::from_utf8_lossy(body).contains("item-1"));
        let (counts, used) = (request.budget().counts(), request.budget().used());
        assert!(counts.balanced(), "{counts:?}");
        if counts.issued == 1 {
            leaders += 1;
            assert_eq!((used, counts.succeeded, counts.coalesced), (1, 1, 0));
        } else {
            assert_eq!(
                (used, counts.issued, counts.coalesced),
                (0, 0, 1),
                "{counts:?}"
            );
        }
    }
    assert_eq!(leaders, 1, "only the leader is charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_each_request_sends_its_own_read() {
    let n = 20;
    let (sent, answers) = n_requests_one_url(false, n).await;
    assert_eq!(sent, n as u64);
    for (request, body) in &answers {
        assert!(body.is_ok());
        assert_eq!(request.budget().used(), 1);
        assert_eq!(request.budget().counts().coalesced, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_with_other_headers_a_body_or_another_method_are_not_coalesced() {
    let (upstream, engine) = held(true, |_| {}).await;
    let user = |token: &'static str| {
        get(&upstream, "/item/1").header(AUTHORIZATION, HeaderValue::from_static(token))
    };
    let post = || {
        let url = upstream.url("/item/2").parse().unwrap();
        Read::new(Method::POST, url).body("q").dedup_key("q")
    };
    let with_body = || get(&upstream, "/item/3").body("q");
    let reads = [
        user("Bearer a"),
        user("Bearer a"),
        user("Bearer b"),
        post(),
        post(),
        with_body(),
        with_body(),
    ];
    let (requests, tasks): (Vec<_>, Vec<_>) =
        reads.into_iter().map(|r| spawn_read(&engine, r)).unzip();
    // Only the two reads with the same Authorization share one.
    until_sent(&upstream, 6, &requests, 1).await;
    upstream.seen.release();
    for task in tasks {
        task.await.unwrap().expect("answered");
    }
    let seen = &upstream.seen;
    assert_eq!(
        (
            seen.count("/item/1"),
            seen.count("/item/2"),
            seen.count("/item/3")
        ),
        (2, 2, 2)
    );
    assert_eq!(coalesced(&requests), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_cancellation_does_not_cancel_the_read_for_the_others() {
    let (upstream, engine) = held(true, |_| {}).await;
    let (leader, leading) = spawn_read(&engine, get(&upstream, "/item/1"));
    until_sent(&upstream, 1, &[], 0).await;
    let (joiners, joined): (Vec<_>, Vec<_>) = (0..3)
        .map(|_| spawn_read(&engine, get(&upstream, "/item/1")))
        .unzip();
    until_sent(&upstream, 1, &joiners, 3).await;
    // The leader's inbound request goes away mid-read.
    leading.abort();
    assert!(leading.await.unwrap_err().is_cancelled());
    let counts = leader.budget().counts();
    assert_eq!((counts.issued, counts.cancelled), (1, 1), "{counts:?}");
    drop(leader);
    assert_eq!(engine.hosts().in_flight(&upstream.host()), 1, "still sent");
    upstream.seen.release();
    for task in joined {
        let body = task.await.unwrap().expect("the joiners get the answer");
        assert!(String::from_utf8_lossy(&body).contains("item-1"));
    }
    assert_eq!(upstream.requests(), 1);
    assert_eq!(engine.hosts().in_flight(&upstream.host()), 0);
    assert!(joiners.iter().all(|j| j.budget().used() == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_error_is_the_answer_of_everyone_who_joined() {
    // `/item/1`'s body is longer: the transport refuses it (`UPSTREAM_ERROR`).
    let (upstream, engine) = held(true, |c| c.upstream.max_response_bytes = 8).await;
    let (requests, tasks): (Vec<_>, Vec<_>) = (0..3)
        .map(|_| spawn_read(&engine, get(&upstream, "/item/1")))
        .unzip();
    until_sent(&upstream, 1, &requests, 2).await;
    upstream.seen.release();
    for task in tasks {
        let err = task.await.unwrap().unwrap_err();
        assert_eq!(err.code(), "UPSTREAM_ERROR", "{err:?}");
    }
    let failed: u64 = requests.iter().map(|r| r.budget().counts().failed).sum();
    assert_eq!((upstream.requests(), failed), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_reads_in_flight_coalesce_an_answer_is_never_kept_for_later_requests() {
    let upstream = Upstream::start().await;
    let engine = Engine::new(config(&upstream.host(), true));
    let (first, read) = spawn_read(&engine, get(&upstream, "/item/1"));
    read.await.unwrap().unwrap();
    let (second, read) = spawn_read(&engine, get(&upstream, "/item/1"));
    read.await.unwrap().unwrap();
    assert_eq!(upstream.requests(), 2, "the second request read afresh");
    for request in [first, second] {
        let counts = request.budget().counts();
        assert_eq!((counts.issued, counts.coalesced), (1, 0));
    }
}

/// Joining costs no read, but a request whose budget is spent is refused
/// first: whether a read is answered must not hang on whether another
/// client happens to be reading the same URL at that moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_is_refused_before_it_could_join() {
    let (upstream, engine) = held(true, |c| c.budget.max_reads = 1).await;
    let (_leader, leading) = spawn_read(&engine, get(&upstream, "/item/1"));
    until_sent(&upstream, 1, &[], 0).await;

    let spent = engine.begin_request(Caller::Public);
    let op = spent.operation();
    op.upstream().read(get(&upstream, "/ok")).await.unwrap();
    let err = op
        .upstream()
        .read(get(&upstream, "/item/1"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "FANOUT_BUDGET_EXHAUSTED");
    let counts = spent.budget().counts();
    assert_eq!((counts.coalesced, counts.refused_budget), (0, 1));

    // A request with its read left joins, and keeps it.
    let (fresh, joining) = spawn_read(&engine, get(&upstream, "/item/1"));
    until_sent(&upstream, 2, std::slice::from_ref(&fresh), 1).await;
    upstream.seen.release();
    leading.await.unwrap().unwrap();
    joining.await.unwrap().unwrap();
    assert_eq!(fresh.budget().remaining(), 1);
    assert_eq!(upstream.seen.count("/item/1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_identical_read_in_a_joining_request_is_a_request_scoped_hit() {
    let (upstream, engine) = held(true, |_| {}).await;
    let (_leader, leading) = spawn_read(&engine, get(&upstream, "/item/1"));
    until_sent(&upstream, 1, &[], 0).await;
    let joiner = engine.begin_request(Caller::Public);
    let (a, b) = (joiner.operation(), joiner.operation());
    let both = {
        let (one, two) = (get(&upstream, "/item/1"), get(&upstream, "/item/1"));
        tokio::spawn(async move {
            let (a, b) = (a.upstream(), b.upstream());
            let (x, y) = tokio::join!(a.read(one), b.read(two));
            (x.map(|r| r.body.clone()), y.map(|r| r.body.clone()))
        })
    };
    until_sent(&upstream, 1, std::slice::from_ref(&joiner), 1).await;
    upstream.seen.release();
    leading.await.unwrap().unwrap();
    let (x, y) = both.await.unwrap();
    assert_eq!(x.unwrap(), y.unwrap());
    let counts = joiner.budget().counts();
    assert_eq!(
        (counts.coalesced, counts.dedup_hits, counts.issued),
        (1, 1, 0)
    );
    assert_eq!(upstream.requests(), 1);
}

/// A read waiting for its request's slot is not in flight, but it joins an
/// identical read another request starts meanwhile instead of sending one
/// of its own once its slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waiting_for_its_slot_joins_a_read_started_meanwhile() {
    let (upstream, engine) = held(true, |c| c.budget.max_concurrent_reads = 1).await;
    let busy = engine.begin_request(Caller::Public);
    let (a, b) = (busy.operation(), busy.operation());
    let (one, two) = (get(&upstream, "/item/1"), get(&upstream, "/item/2"));
    let first = tokio::spawn(async move { a.upstream().read(one).await.map(|_| ()) });
    until_sent(&upstream, 1, &[], 0).await;
    // Its second read finds nothing in flight and waits for the one slot.
    let mut second = Box::pin(async move { b.upstream().read(two).await.map(|_| ()) });
    assert!(futures::poll!(second.as_mut()).is_pending());
    let (_other, other) = spawn_read(&engine, get(&upstream, "/item/2"));
    until_sent(&upstream, 2, &[], 0).await;
    let second = tokio::spawn(second);
    until_sent(&upstream, 2, std::slice::from_ref(&busy), 1).await;
    upstream.seen.release();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    other.await.unwrap().unwrap();
    assert_eq!(upstream.requests(), 2);
    assert_eq!(busy.budget().used(), 1);
}

/// What a request makes of an answer (`UpstreamResponse::derived`) is its
/// own: a joiner gets its own copy of the answer, not the leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_derives_from_its_own_copy_of_the_answer() {
    let (upstream, engine) = held(true, |_| {}).await;
    let derived = Arc::new(AtomicU64::new(0));
    let (requests, tasks): (Vec<_>, Vec<_>) = (0..2)
        .map(|_| {
            let request = engine.begin_request(Caller::Public);
            let (operation, read) = (request.operation(), get(&upstream, "/item/1"));
            let derived = derived.clone();
            let task = tokio::spawn(async move {
                let response = operation.upstream().read(read).await.unwrap();
                let made =
                    response.derived(|| async { Ok::<_, ReadError>(derived.fetch_add(1, SeqCst)) });
                *made.await.unwrap()
            });
            (request, task)
        })
        .unzip();
    until_sent(&upstream, 1, &requests, 1).await;
    upstream.seen.release();
    let mut made = Vec::new();
    for task in tasks {
        made.push(task.await.unwrap());
    }
    made.sort();
    assert_eq!(made, [0, 1], "each request derived once, from its own copy");
}

/// The scripted in-memory upstream on host `up.test:81` (`HOST`, which
/// coalesces: `…/gated` answers once opened, `…/hang` never), an engine on
/// it with these bounds, and a leader's read of `path`, sent.
async fn paused_leader(
    deadline_ms: u64,
    read_timeout_ms: u64,
    path: &str,
) -> (Engine, Arc<MemTransport>, (FanoutRequest, JoinHandle<Body>)) {
    let mut config = config(HOST, true);
    config.budget.deadline_ms = deadline_ms;
    config.budget.read_timeout_ms = read_timeout_ms;
    let (engine, transport) = scripted::engine(config);
    let leader = spawn_read(&engine, read(path));
    until("the leader's read sent", || transport.sent().len() == 1).await;
    (engine, transport, leader)
}

/// Timeouts and deadlines are each request's own: the leader's and a
/// joiner's deadline cut them, not the read the third request waits for.
#[tokio::test(start_paused = true)]
async fn deadlines_cut_the_leader_and_a_joiner_while_the_others_get_the_answer() {
    let started = tokio::time::Instant::now();
    let (engine, transport, (leader, leading)) = paused_leader(1_000, 5_000, "gated").await;
    let (early, early_read) = spawn_joined(&engine, read("gated")).await;
    // Opened later: its deadline is later too.
    tokio::time::advance(Duration::from_millis(500)).await;
    let (late, late_read) = spawn_joined(&engine, read("gated")).await;

    for cut in [leading, early_read] {
        let err = cut.await.unwrap().unwrap_err();
        assert_eq!(err.code(), "DEADLINE_EXCEEDED", "{err:?}");
    }
    assert_eq!(started.elapsed(), Duration::from_millis(1_000));
    let counts = leader.budget().counts();
    assert_eq!((counts.issued, counts.timed_out), (1, 1), "{counts:?}");
    assert_eq!(engine.hosts().in_flight(HOST), 1, "still sent");
    transport.open();
    late_read
        .await
        .unwrap()
        .expect("the third request gets the answer");
    assert_eq!(transport.sent().len(), 1);
    assert_eq!((early.budget().used(), late.budget().used()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn the_shared_read_is_bounded_by_the_read_timeout_and_leaves_nothing_behind() {
    let started = tokio::time::Instant::now();
    let (engine, transport, (_leader, leading)) = paused_leader(30_000, 2_000, "hang").await;
    // Joined a moment later: its own read timeout would end after the
    // shared read's, so the shared read's timeout is what it meets.
    tokio::time::advance(Duration::from_millis(1)).await;
    let (_joiner, joined) = spawn_joined(&engine, read("hang")).await;
    leading.abort();
    let err = joined.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_TIMEOUT", "{err:?}");
    assert_eq!(started.elapsed(), Duration::from_millis(2_000));
    assert_eq!(engine.hosts().in_flight(HOST), 0);
    // The table let the ended read go: the next one is sent afresh.
    let (_next, next) = spawn_read(&engine, read("hang"));
    until("a fresh read sent", || transport.sent().len() == 2).await;
    next.abort();
}

/// A transport whose reads panic once opened.
#[derive(Default)]
struct Panics {
    fetched: AtomicU64,
    gate: Notify,
}

impl Transport for Panics {
    fn fetch<'a>(
        &'a self,
        _read: Read,
        _host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        self.fetched.fetch_add(1, SeqCst);
        Box::pin(async move {
            self.gate.notified().await;
            panic!("the transport panicked (expected by the test)")
        })
    }
}

#[tokio::test]
async fn a_panicking_shared_read_answers_an_error_and_leaves_nothing_behind() {
    let transport = Arc::new(Panics::default());
    let engine = Engine::builder(config(HOST, true))
        .transport(transport.clone())
        .build();
    let (_leader, leading) = spawn_read(&engine, read("x"));
    until("sent", || transport.fetched.load(SeqCst) == 1).await;
    let (_joiner, joined) = spawn_joined(&engine, read("x")).await;
    transport.gate.notify_waiters();
    for task in [leading, joined] {
        let err = task.await.unwrap().unwrap_err();
        assert_eq!(err.code(), "UPSTREAM_ERROR", "{err:?}");
    }
    assert_eq!(engine.hosts().in_flight(HOST), 0);
    let (_next, next) = spawn_read(&engine, read("x"));
    until("a fresh read sent", || transport.fetched.load(SeqCst) == 2).await;
    next.abort();
}

/// Since 2026-12-03: the host cap is used only by reads being sent.
///
/// Cap 4, all of it taken by slots no read uses; four requests read
/// `/item/1` and queue for a host slot. One slot frees: the first of them
/// leads the read, the three others join it while still queued. Then the
/// three other slots free — and must stay free: three new distinct reads
/// take them at once and the upstream reaches the cap (before the fix, the
/// joiners' queued waits took them and held them, idle, and the new reads
/// were refused `HOST_SATURATED` after `acquire_wait_ms` while the upstream
/// had one read in flight). A fifth new read waits while the cap is all
/// reads on the wire. Nothing here waits on a clock: the queues are reached
/// by one poll each, the rest by counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_joins_gives_up_its_place_in_the_hosts_queue() {
    const CAP: u64 = 4;
    let (upstream, engine) = held(true, |c| {
        c.budget.read_timeout_ms = 60_000;
        c.budget.deadline_ms = 120_000;
        for table in c.hosts.values_mut() {
            (table.max_concurrent, table.acquire_wait_ms) = (CAP as u32, 600);
        }
    })
    .await;
    let (host, hosts) = (upstream.host(), engine.hosts());
    let mut fillers = Vec::new();
    for _ in 0..CAP {
        let slot = hosts.acquire(&host, Duration::from_secs(1)).await;
        fillers.push(slot.expect("a free slot"));
    }
    // Each read, polled once, is queued for a host slot (in that order).
    let (mut requests, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..CAP {
        let request = engine.begin_request(Caller::Public);
        let (operation, read) = (request.operation(), get(&upstream, "/item/1"));
        let mut task = Box::pin(async move {
            let response = operation.upstream().read(read).await?;
            Ok::<_, ReadError>(response.body.clone())
        });
        assert!(futures::poll!(task.as_mut()).is_pending());
        requests.push(request);
        tasks.push(tokio::spawn(task));
    }
    drop(fillers.pop());
    until_sent(&upstream, 1, &requests, CAP - 1).await;
    fillers.clear();
    // The joiners hold no host slot: only the shared read does.
    let held_by_joiners = hosts.in_flight(&host) - 1;

    let fresh: Vec<_> = (2..=CAP)
        .map(|i| spawn_read(&engine, get(&upstream, &format!("/item/{i}"))))
        .collect();
    until("the new reads sent, or ended", || {
        upstream.seen.in_flight() == CAP || fresh.iter().all(|(_, task)| task.is_finished())
    })
    .await;
    let on_the_wire = upstream.seen.in_flight();
    let (mut refused, mut sent) = (0, Vec::new());
    for (request, task) in fresh {
        if !task.is_finished() {
            sent.push((request, task));
        } else if task
            .await
            .unwrap()
            .is_err_and(|e| e.code() == "HOST_SATURATED")
        {
            refused += 1;
        }
    }
    println!(
        "cap {CAP}: {refused} of {} new reads refused HOST_SATURATED while the upstream had {on_the_wire} of {CAP} reads in flight",
        CAP - 1
    );
    assert_eq!(
        (held_by_joiners, refused, on_the_wire),
        (0, 0, CAP),
        "slots held by joiners; every new read sent: the cap is all reads on the wire"
    );

    // At the cap, a further read waits — while every slot is a read sent.
    let request = engine.begin_request(Caller::Public);
    let (operation, read) = (request.operation(), get(&upstream, "/item/9"));
    let mut waiting = Box::pin(async move { operation.upstream().read(read).await.map(|_| ()) });
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    assert_eq!(
        (hosts.in_flight(&host), upstream.seen.in_flight()),
        (CAP, CAP)
    );
    drop(waiting);

    upstream.seen.release();
    for task in tasks {
        let body = task.await.unwrap().expect("every /item/1 read answered");
        assert!(String::from_utf8_lossy(&body).contains("item-1"));
    }
    for (_, task) in sent {
        task.await.unwrap().expect("every new read answered");
    }
    assert_eq!(coalesced(&requests), CAP - 1);
    let used: u64 = requests.iter().map(|r| r.budget().used()).sum();
    assert_eq!((upstream.seen.count("/item/1"), used), (1, 1));
    assert_eq!(hosts.in_flight(&host), 0);
}

/// The same within one request: a read that joins while it waits for one
/// of its request's `max_concurrent_reads` slots gives up its place, so the
/// slot freed next goes to the request's next read waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_joins_gives_up_its_place_in_the_requests_queue() {
    let (upstream, engine) = held(true, |c| {
        c.budget.max_concurrent_reads = 1;
        c.budget.deadline_ms = 5_000;
    })
    .await;
    let host = upstream.host();
    let request = engine.begin_request(Caller::Public);
    let holder = request.operation();
    let permit = holder.upstream().permit(&host).await.expect("the one slot");
    // Two reads of the request wait for its slot, in this order.
    let mut waiting = Vec::new();
    for path in ["/item/1", "/item/3"] {
        let (operation, read) = (request.operation(), get(&upstream, path));
        let mut task = Box::pin(async move {
            let response = operation.upstream().read(read).await?;
            Ok::<_, ReadError>(response.body.clone())
        });
        assert!(futures::poll!(task.as_mut()).is_pending());
        waiting.push(task);
    }
    let (second, third) = {
        let mut tasks = waiting.into_iter().map(tokio::spawn);
        (tasks.next().unwrap(), tasks.next().unwrap())
    };
    // Another request reads `/item/1`: the first of them joins it.
    let (_other, other) = spawn_read(&engine, get(&upstream, "/item/1"));
    until_sent(&upstream, 1, std::slice::from_ref(&request), 1).await;
    drop(permit);
    until("the next read sent, or ended", || {
        upstream.requests() == 2 || third.is_finished()
    })
    .await;
    assert_eq!(
        (upstream.seen.count("/item/3"), request.budget().in_flight()),
        (1, 1),
        "the freed slot went to the read still waiting, and is its only one"
    );
    upstream.seen.release();
    for task in [second, third, other] {
        task.await.unwrap().expect("answered");
    }
    assert_eq!(request.budget().in_flight(), 0);
}

/// What one load run saw: refusals, those while the upstream had fewer
/// reads in flight than the cap, reads answered, and the upstream's mean
/// reads in flight.
struct Load {
    refused: u64,
    refused_below_cap: u64,
    answered: u64,
    mean_in_flight: f64,
}

/// `clients` loops, each reading one of 16 URLs at random in an inbound
/// request of its own, for `run`, against a loopback upstream answering in
/// 20 ms, host cap `cap` with `acquire_wait_ms = 50`.
async fn load(coalesce: bool, cap: u32, clients: usize, run: Duration) -> Load {
    let upstream = Upstream::start().await;
    *upstream.seen.default_delay.lock().unwrap() = Some(Duration::from_millis(20));
    let mut config = config(&upstream.host(), coalesce);
    for table in config.hosts.values_mut() {
        (table.max_concurrent, table.acquire_wait_ms) = (cap, 50);
    }
    let engine = Arc::new(Engine::new(config));
    let upstream = Arc::new(upstream);
    let stop = tokio::time::Instant::now() + run;
    let (refused, below, answered) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (engine, upstream) = (engine.clone(), upstream.clone());
            let (refused, below, answered) = (refused.clone(), below.clone(), answered.clone());
            tokio::spawn(async move {
                // A small xorshift per client: reproducible, no dependency.
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (client as u64 + 1);
                while tokio::time::Instant::now() < stop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let request = engine.begin_request(Caller::Public);
                    let operation = request.operation();
                    let read = get(&upstream, &format!("/item/{}", x % 16));
                    match operation.upstream().read(read).await {
                        Ok(_) => answered.fetch_add(1, SeqCst),
                        Err(ReadError::HostSaturated { .. }) => {
                            if upstream.seen.in_flight() < u64::from(cap) {
                                below.fetch_add(1, SeqCst);
                            }
                            refused.fetch_add(1, SeqCst)
                        }
                        Err(other) => panic!("{other:?}"),
                    };
                }
            })
        })
        .collect();
    let (mut samples, mut sum) = (0u64, 0u64);
    while tokio::time::Instant::now() < stop {
        sum += upstream.seen.in_flight();
        samples += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    Load {
        refused: refused.load(SeqCst),
        refused_below_cap: below.load(SeqCst),
        answered: answered.load(SeqCst),
        mean_in_flight: sum as f64 / samples as f64,
    }
}

/// A figure, not a check (timing on a shared machine): under load, how
/// many `HOST_SATURATED` refusals came while the upstream was below the
/// cap, and how full the cap was kept, with and without coalescing.
///
/// `FANOUT_LOAD_SECS=12 cargo test --test coalesce -- --ignored --nocapture load_figures`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn load_figures() {
    let secs = std::env::var("FANOUT_LOAD_SECS").map_or(3, |s| s.parse().unwrap());
    let (cap, clients) = (8, 48);
    for coalesce in [true, false] {
        let seen = load(coalesce, cap, clients, Duration::from_secs(secs)).await;
        let share = 100.0 * seen.refused_below_cap as f64 / seen.refused.max(1) as f64;
        println!(
            "cap {cap}, {clients} clients, {secs} s, coalesce = {coalesce}: {} answered, {} refused HOST_SATURATED, {share:.0} % of them while the upstream was below the cap; mean in flight {:.1} of {cap}",
            seen.answered, seen.refused, seen.mean_in_flight
        );
    }
}
