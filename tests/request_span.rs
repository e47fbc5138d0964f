//! Which spans a request's operations run in, as a layer of the
//! application's subscriber sees them: each operation in its own span, a
//! child of the request's, a resolver's log line in both; an operation no
//! layer gives a span (a layer at `INFO`: the operation's is `DEBUG`) in
//! the request's, so that layer still sees its log lines under the
//! request; and the request's span left last, after its operations end,
//! answered or dropped with its client gone — a span's last exit is the
//! end a trace shows. What a change that enters fewer spans per poll (they
//! cost at every poll: `BENCHMARKS.md` § 10) must keep.
//!
//! Each test installs its subscriber for its own thread (a current-thread
//! runtime), so the tests of this binary do not see each other's spans.

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tower::ServiceExt as _;
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Polls a resolver takes: each one enters the spans its future runs in.
const POLLS: usize = 20;

/// What the layer saw, in order.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    /// A span opened: its name, its parent's.
    Opened(&'static str, Option<&'static str>),
    Entered(&'static str),
    Left(&'static str),
    Closed(&'static str),
    /// An event: its message's field count aside, the spans it is in, the
    /// innermost first.
    Event(Vec<&'static str>),
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    fn push(&self, seen: Seen) {
        self.0.lock().unwrap().push(seen);
    }
}

fn name_of<S>(id: &Id, cx: &LayerContext<'_, S>) -> &'static str
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    cx.span(id).map_or("?", |span| span.name())
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _: &Attributes<'_>, id: &Id, cx: LayerContext<'_, S>) {
        let span = cx.span(id).expect("opened");
        self.push(Seen::Opened(
            span.name(),
            span.parent().map(|parent| parent.name()),
        ));
    }

    fn on_enter(&self, id: &Id, cx: LayerContext<'_, S>) {
        self.push(Seen::Entered(name_of(id, &cx)));
    }

    fn on_exit(&self, id: &Id, cx: LayerContext<'_, S>) {
        self.push(Seen::Left(name_of(id, &cx)));
    }

    fn on_close(&self, id: Id, cx: LayerContext<'_, S>) {
        self.push(Seen::Closed(name_of(&id, &cx)));
    }

    fn on_event(&self, event: &tracing::Event<'_>, cx: LayerContext<'_, S>) {
        let scope = cx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name()).collect())
            .unwrap_or_default();
        self.push(Seen::Event(scope));
    }
}

/// Told when the hanging resolver has started.
struct Started(Arc<Notify>);

struct Query;

#[Object]
impl Query {
    /// Answers after `POLLS` polls, logging once inside.
    async fn slow(&self) -> u32 {
        for _ in 0..POLLS {
            tokio::task::yield_now().await;
        }
        tracing::info!("inside the resolver");
        1
    }

    /// Never answers, once it said it started.
    async fn hang(&self, ctx: &Context<'_>) -> u32 {
        ctx.data_unchecked::<Started>().0.notify_one();
        std::future::pending().await
    }
}

fn app(started: Arc<Notify>) -> Router {
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Started(started))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

fn count(seen: &[Seen], what: &Seen) -> usize {
    seen.iter().filter(|s| *s == what).count()
}

fn last(seen: &[Seen], what: &Seen) -> usize {
    seen.iter()
        .rposition(|s| s == what)
        .unwrap_or_else(|| panic!("{what:?} never seen"))
}

const REQUEST: &str = "graphql.request";
const OPERATION: &str = "graphql.operation";

#[tokio::test(flavor = "current_thread")]
async fn each_operation_runs_in_its_own_span_under_the_request_s() {
    let recorder = Recorder::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let app = app(Arc::new(Notify::new()));

    for (body, operations) in [
        (r#"{"query":"{ slow }"}"#, 1),
        (r#"[{"query":"{ slow }"},{"query":"{ a: slow }"}]"#, 2),
    ] {
        recorder.0.lock().unwrap().clear();
        let answer = fanout_testkit::post(&app, body, &[]).await;
        assert_eq!(answer.status, 200, "{:?}", answer.json());
        let seen = recorder.seen();

        assert_eq!(count(&seen, &Seen::Opened(REQUEST, None)), 1, "{seen:?}");
        assert_eq!(
            count(&seen, &Seen::Opened(OPERATION, Some(REQUEST))),
            operations,
            "each operation's span is the request's child: {seen:?}"
        );
        // A log line inside a resolver is in both spans.
        assert_eq!(
            count(&seen, &Seen::Event(vec![OPERATION, REQUEST])),
            operations,
            "{seen:?}"
        );
        // Each poll of an operation enters its span.
        let entered = count(&seen, &Seen::Entered(OPERATION));
        assert!(entered >= POLLS * operations, "{entered} enters");
        // The request's span is left last, after its operations ended.
        assert!(
            last(&seen, &Seen::Left(REQUEST)) > last(&seen, &Seen::Closed(OPERATION)),
            "{seen:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_operation_no_layer_gives_a_span_runs_in_the_request_s() {
    let recorder = Recorder::default();
    // The operation's span is at DEBUG: this layer takes INFO and above.
    let layer = recorder
        .clone()
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    let app = app(Arc::new(Notify::new()));

    let answer = fanout_testkit::post(&app, r#"{"query":"{ slow }"}"#, &[]).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    let seen = recorder.seen();
    assert_eq!(count(&seen, &Seen::Opened(OPERATION, Some(REQUEST))), 0);
    assert_eq!(
        count(&seen, &Seen::Event(vec![REQUEST])),
        1,
        "the resolver's log line is in the request's span: {seen:?}"
    );
    assert!(count(&seen, &Seen::Entered(REQUEST)) >= POLLS);
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_dropped_while_its_operation_runs_still_ends_after_it() {
    let recorder = Recorder::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let started = Arc::new(Notify::new());
    let app = app(started.clone());

    let request = fanout_testkit::graphql_request(
        r#"{"query":"{ hang }"}"#,
        &[],
        Some(fanout_testkit::PEER.parse().unwrap()),
    );
    let answer = app.oneshot(request);
    tokio::select! {
        _ = answer => panic!("a resolver that never answers answered"),
        () = started.notified() => {}
    }
    // The request's future was dropped, its client gone, with its operation
    // running.
    let seen = recorder.seen();
    let closed = last(&seen, &Seen::Closed(OPERATION));
    assert!(
        last(&seen, &Seen::Left(REQUEST)) > closed,
        "the request's span was last left before its operation ended: {seen:?}"
    );
    assert!(last(&seen, &Seen::Closed(REQUEST)) > closed, "{seen:?}");
}
