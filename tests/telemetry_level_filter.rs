//! An application whose subscriber keeps the engine's spans out — a global
//! level filter stricter than the engine's request span (`WARN`) — still
//! passes its callers' traces on: no layer saw the request, so no telemetry
//! sampled it, and a caller's `traceparent` goes on upstream as it came
//! (this service records nothing of the trace: the caller's span stays the
//! parent). Nothing is decided for such a request: a trace that would start
//! here sends no `traceparent` (the upstream starts its own), and a span of
//! the application's own that a layer does see later in the request (a
//! per-target filter) is sampled as ever, its reads in its trace. Whatever
//! the filter, a caller's `tracestate` goes on with every upstream request
//! in the caller's trace.
//!
//! A binary of its own: which spans a global level filter lets through is
//! the process's (`LevelFilter::current()`, over every subscriber alive),
//! and other tests' subscribers would raise it.
#![cfg(feature = "otel")]

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::routing::get;
use axum::Router;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::otlp::{hex, Collector, SpanKind};
use std::sync::{Arc, Mutex};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;

/// The `traceparent` of every request the upstream heard, in order.
type Heard = Arc<Mutex<Vec<Option<String>>>>;
/// The `tracestate` of every request the upstream heard, in order (one
/// test at a time uses it: `SERIAL`).
static STATES: Mutex<Vec<Option<String>>> = Mutex::new(Vec::new());

/// An upstream answering any item, hearing each request's `traceparent`.
async fn start_upstream() -> (String, tokio::task::JoinHandle<()>, Heard) {
    let heard = Heard::default();
    let hearing = heard.clone();
    let app = Router::new()
        .route("/item/{id}", get(|| async { "v" }))
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                // Every line of each, joined (one is expected).
                let lines = |name: &str| {
                    let lines: Vec<_> = request.headers().get_all(name).iter().collect();
                    let lines: Vec<_> = lines.iter().map(|v| v.to_str().unwrap()).collect();
                    (!lines.is_empty()).then(|| lines.join(" | "))
                };
                hearing.lock().unwrap().push(lines("traceparent"));
                STATES.lock().unwrap().push(lines("tracestate"));
                next.run(request)
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, task, heard)
}

struct Base(String);

/// How long a lent handle is waited for, and its use.
const LENT_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// An operation's handle lent by one request to another.
#[derive(Default)]
struct Lent {
    handle: Mutex<Option<Arc<fanout_budget::request::Operation>>>,
    given: tokio::sync::Notify,
    done: tokio::sync::Notify,
}

struct Query;

#[Object]
impl Query {
    /// One read of `/item/{id}`: its status.
    async fn item(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        Ok(ctx.upstream()?.read(Read::get(url)).await?.status.as_u16())
    }

    /// [`item`](Self::item), the read carrying a trace context of its own
    /// (which the engine's replaces while a telemetry exports).
    async fn carrying(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        use axum::http::{HeaderName, HeaderValue};
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let own = "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01";
        let read = Read::get(url)
            .header(
                HeaderName::from_static("traceparent"),
                HeaderValue::from_static(own),
            )
            .header(
                HeaderName::from_static("tracestate"),
                HeaderValue::from_static("own=1"),
            );
        Ok(ctx.upstream()?.read(read).await?.status.as_u16())
    }

    /// [`item`](Self::item), read through the operation's handle from a
    /// task of its own (as a `DataLoader`'s spawned load does).
    async fn spawned(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let operation = ctx.fanout_operation()?;
        let read = async move { operation.upstream().read(Read::get(url)).await };
        Ok(tokio::spawn(read).await??.status.as_u16())
    }

    /// [`spawned`](Self::spawned), the task's read inside a span the
    /// application opens there (`worker`, INFO: a trace of its own, as a
    /// span opened in a task of its own is).
    async fn worker(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        use tracing::Instrument as _;
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let operation = ctx.fanout_operation()?;
        let read = async move { operation.upstream().read(Read::get(url)).await };
        let read =
            tokio::spawn(async move { read.instrument(tracing::info_span!("worker")).await });
        Ok(read.await??.status.as_u16())
    }

    /// Hands the operation's handle to [`borrow`](Self::borrow) (another
    /// request's resolver) and waits until it has read through it.
    async fn hold(&self, ctx: &Context<'_>) -> async_graphql::Result<u16> {
        let lent = ctx.data::<Lent>()?;
        let done = lent.done.notified();
        *lent.handle.lock().unwrap() = Some(ctx.fanout_operation()?);
        lent.given.notify_one();
        tokio::time::timeout(LENT_FOR, done)
            .await
            .map_err(|_| "the handle was never read through")?;
        Ok(1)
    }

    /// Leaves the operation's handle for [`borrow`](Self::borrow), and
    /// ends.
    async fn lend(&self, ctx: &Context<'_>) -> async_graphql::Result<u16> {
        let lent = ctx.data::<Lent>()?;
        *lent.handle.lock().unwrap() = Some(ctx.fanout_operation()?);
        lent.given.notify_one();
        Ok(1)
    }

    /// `/item/{id}`, read in this request's task through the handle
    /// [`hold`](Self::hold) lent — inside a span of the application's own
    /// (`borrowing`, INFO) when `in_span`.
    async fn borrow(
        &self,
        ctx: &Context<'_>,
        id: u32,
        #[graphql(default)] in_span: bool,
        #[graphql(default)] spawned: bool,
    ) -> async_graphql::Result<u16> {
        use tracing::Instrument as _;
        let lent = ctx.data::<Lent>()?;
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let handle = tokio::time::timeout(LENT_FOR, async {
            loop {
                let given = lent.given.notified();
                if let Some(handle) = lent.handle.lock().unwrap().take() {
                    break handle;
                }
                given.await;
            }
        })
        .await
        .map_err(|_| "no handle lent")?;
        let read = async move { handle.upstream().read(Read::get(url)).await };
        // Spawned in the spans current here (`in_current_span`), as a
        // loader shared between requests spawns its load.
        let read = async move {
            if spawned {
                // A span of the load's own, opened in the spawned task under
                // the borrowing request's.
                let read = async move { read.instrument(tracing::info_span!("loading")).await };
                tokio::spawn(read.in_current_span())
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("{e:?}"))
            } else {
                read.await.map_err(|e| format!("{e:?}"))
            }
        };
        let read = if in_span {
            read.instrument(tracing::info_span!("borrowing")).await
        } else {
            read.await
        };
        // Told whatever the read did: the lender waits for it.
        lent.done.notify_one();
        Ok(read?.status.as_u16())
    }

    /// `/item/{id}`, read through the operation's handle from a task of its
    /// own that runs in the spans of the resolver's (`in_current_span`, as
    /// a `DataLoader`'s spawned load does), inside a span of the
    /// application's own (`app`, INFO).
    async fn propagated(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        use tracing::Instrument as _;
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let operation = ctx.fanout_operation()?;
        let spawned = async move {
            let read = async move { operation.upstream().read(Read::get(url)).await };
            tokio::spawn(read.in_current_span()).await
        };
        let read = spawned.instrument(tracing::info_span!("app")).await;
        Ok(read??.status.as_u16())
    }

    /// `/item/{id}`, read through the operation's handle from a task of its
    /// own that runs in the spans current in the resolver
    /// (`in_current_span`), with no span of its own.
    async fn loaded(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        use tracing::Instrument as _;
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let operation = ctx.fanout_operation()?;
        let read = async move { operation.upstream().read(Read::get(url)).await };
        Ok(tokio::spawn(read.in_current_span()).await??.status.as_u16())
    }

    /// [`propagated`](Self::propagated), the spawned task's read inside a
    /// span of the application's (`load`, INFO) opened in that task — or,
    /// with `log_only`, spawned while a span only a log would take
    /// (`field`, WARN, a target no telemetry exports) is current inside
    /// `app`.
    async fn loaded_in(
        &self,
        ctx: &Context<'_>,
        id: u32,
        #[graphql(default)] log_only: bool,
    ) -> async_graphql::Result<u16> {
        use tracing::Instrument as _;
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let operation = ctx.fanout_operation()?;
        let read = async move { operation.upstream().read(Read::get(url)).await };
        let spawned = async move {
            if log_only {
                let field = tracing::warn_span!(target: "log_only", "field");
                let spawn = async move { tokio::spawn(read.in_current_span()).await };
                spawn.instrument(field).await
            } else {
                let load = async move { read.instrument(tracing::info_span!("load")).await };
                tokio::spawn(load.in_current_span()).await
            }
        };
        let read = spawned.instrument(tracing::info_span!("app")).await;
        Ok(read??.status.as_u16())
    }

    /// `/item/1`, then `/item/2` inside a span of the application's own
    /// (`mine`, INFO), then `/item/3`: their statuses added.
    async fn mine(&self, ctx: &Context<'_>) -> async_graphql::Result<u16> {
        use tracing::Instrument as _;
        let base = &ctx.data::<Base>()?.0;
        let upstream = ctx.upstream()?;
        let first = upstream.read(Read::get(format!("{base}/item/1").parse()?));
        let first = first.await?.status.as_u16();
        let url = format!("{base}/item/2").parse()?;
        // Made and run inside the span, as a resolver's body runs in the
        // field's span of async-graphql's `Tracing` extension.
        let second = async { upstream.read(Read::get(url)).await };
        let second = second.instrument(tracing::info_span!("mine")).await?;
        let third = upstream.read(Read::get(format!("{base}/item/3").parse()?));
        let third = third.await?.status.as_u16();
        Ok(first + second.status.as_u16() + third)
    }
}

/// Three reads in one request, one of them carrying a trace context of its
/// own, one away from the request's task.
const READS: &str = r#"{"query":"{ a: carrying(id: 1) b: item(id: 2) c: spawned(id: 3) }"}"#;

/// Headers sent, the case's name, and the most `tracestate` members
/// expected upstream (`None`: no `tracestate`, nor the caller's parent).
type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, Option<usize>);

/// `(trace id, parent id, flags)` of a `traceparent`.
fn parts(traceparent: &str) -> (String, String, String) {
    let parts: Vec<_> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00", "{traceparent}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

/// The upstream heard one request since it was last asked, its
/// `traceparent` in trace `trace` with `flags` (`case` says why).
fn one_sent_in(heard: &Heard, (trace, expected): (&str, &str), case: &str) {
    let sent = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(sent.len(), 1, "{case}: {sent:?}");
    let traceparent = sent[0].as_deref().expect("a traceparent");
    let (sent_in, _, flags) = parts(traceparent);
    assert_eq!(sent_in, trace, "{case}: {traceparent}");
    assert_eq!(flags, expected, "{case}: {traceparent}");
}

/// A request traced by `lender` lending its handle (`hold`) while another,
/// of a sampled trace of its own, runs `borrow` (`borrow(…)`, its field as
/// written) through it; both answered.
async fn lend_and_borrow(app: &Router, lender: &str, borrow: &str) {
    let borrower = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (lending, borrowing) = ([("traceparent", lender)], [("traceparent", borrower)]);
    let query = format!(r#"{{"query":"{{ {borrow} }}"}}"#);
    let (held, borrowed) = tokio::join!(
        fanout_testkit::post(app, r#"{"query":"{ hold }"}"#.to_owned(), &lending),
        fanout_testkit::post(app, query, &borrowing),
    );
    assert_eq!(held.json()["data"]["hold"], 1, "{:?}", held.json());
    let borrowed = borrowed.json();
    assert_eq!(borrowed["data"]["borrow"], 200, "{borrowed:?}");
}

/// The tests of this binary, one at a time: each sets its own level
/// filter, and the process's highest level is every subscriber's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The service, on an upstream that hears each request's `traceparent`.
async fn service() -> (Router, tokio::task::JoinHandle<()>, Heard) {
    service_with(|_, _| {}).await
}

/// [`service`], its configuration as `configure` leaves it (given the
/// upstream's base URL).
async fn service_with(
    configure: impl FnOnce(&mut Config, &str),
) -> (Router, tokio::task::JoinHandle<()>, Heard) {
    let (upstream, task, heard) = start_upstream().await;
    let mut config = Config::default();
    configure(&mut config, &upstream);
    let engine = Engine::new(config);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream))
        .data(Lent::default())
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    (app, task, heard)
}

/// A telemetry exporting every trace (the application's own spans, this
/// test's target, too) to `collector`.
fn telemetry(collector: &Collector) -> Telemetry {
    let config = TelemetryConfig::default()
        .otlp_endpoint(collector.base.clone())
        .sample_ratio(1.0);
    let builder = Telemetry::builder(config).target(module_path!());
    builder.build().unwrap().unwrap()
}

/// A telemetry exporting every trace to a collector of its own
/// ([`telemetry`]), the default subscriber (under `filter`) while held.
struct Exporting {
    collector: Collector,
    telemetry: Telemetry,
    default: tracing::subscriber::DefaultGuard,
}

/// Which spans reach the telemetry's layer.
#[derive(Clone, Copy, Debug)]
enum Filter {
    /// Those at this level or above (`None`: every one).
    Level(Option<LevelFilter>),
    /// The application's own (this test's target) at `INFO`, none of the
    /// engine's.
    AppOnly,
    /// The application's own at `INFO` and the engine's read path's, none
    /// of the engine's request and operation spans.
    ReadsOnly,
    /// Every span opened (another layer, a log's, takes them all), the
    /// application's not exported (the telemetry is not told its target).
    Unexported,
    /// [`Unexported`](Filter::Unexported) under a global `INFO` level (as
    /// `EnvFilter`'s default): the engine's DEBUG spans all out.
    InfoUnexported,
    /// Every span, the telemetry told no target: it exports the engine's
    /// alone, and a sampled request's operations' spans are built direct
    /// (`graphql/operation_span.rs`).
    EngineOnly,
}

/// A layer that does nothing with the spans and events it takes (under a
/// filter of its own that takes them all, as a log's at `TRACE` would).
struct Everything;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Everything {}

async fn exporting(filter: Filter) -> Exporting {
    let collector = Collector::start().await;
    let telemetry = match filter {
        Filter::Unexported | Filter::InfoUnexported | Filter::EngineOnly => {
            let config = TelemetryConfig::default()
                .otlp_endpoint(collector.base.clone())
                .sample_ratio(1.0);
            Telemetry::builder(config).build().unwrap().unwrap()
        }
        _ => telemetry(&collector),
    };
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let default = match filter {
        Filter::Level(level) => tracing::subscriber::set_default(subscriber.with(level)),
        Filter::EngineOnly => tracing::subscriber::set_default(subscriber),
        Filter::AppOnly => {
            let targets = Targets::new()
                .with_target(module_path!(), LevelFilter::INFO)
                .with_default(LevelFilter::WARN);
            tracing::subscriber::set_default(subscriber.with(targets))
        }
        Filter::Unexported => {
            use tracing_subscriber::Layer as _;
            let everything = Everything.with_filter(LevelFilter::TRACE);
            tracing::subscriber::set_default(subscriber.with(everything))
        }
        Filter::InfoUnexported => {
            use tracing_subscriber::Layer as _;
            let everything = Everything.with_filter(LevelFilter::TRACE);
            let subscriber = subscriber.with(everything).with(LevelFilter::INFO);
            tracing::subscriber::set_default(subscriber)
        }
        Filter::ReadsOnly => {
            let targets = Targets::new()
                .with_target(module_path!(), LevelFilter::INFO)
                .with_target("fanout_budget", LevelFilter::DEBUG)
                .with_target("fanout_budget::graphql", LevelFilter::OFF)
                .with_default(LevelFilter::WARN);
            tracing::subscriber::set_default(subscriber.with(targets))
        }
    };
    Exporting {
        collector,
        telemetry,
        default,
    }
}

impl Exporting {
    /// The one request the upstream heard is in the trace of the caller
    /// `0af7…-b7ad…` (sampled), and names an exported CLIENT span under an
    /// exported `upstream.read` under the caller's span (`case` says why);
    /// flushed.
    async fn client_span_under_callers(self, heard: &Heard, case: &str) {
        let sent = heard.lock().unwrap().first().cloned().flatten();
        let (_, named, _) = parts(&sent.unwrap_or_default());
        one_sent_in(heard, ("0af7651916cd43dd8448eb211c80319c", "01"), case);
        let collector = self.flushed().await;
        let spans = collector
            .wait_for(
                std::time::Duration::from_secs(10),
                "the span named upstream",
                |spans| spans.iter().any(|r| hex(&r.span.span_id) == named),
            )
            .await;
        let by_id = |id: &[u8]| spans.iter().find(|r| r.span.span_id == id);
        let client = spans
            .iter()
            .find(|r| hex(&r.span.span_id) == named)
            .unwrap();
        assert_eq!(
            client.span.kind,
            SpanKind::Client as i32,
            "{case}: {client:?}"
        );
        let read = by_id(&client.span.parent_span_id).expect("the CLIENT span's parent exported");
        assert_eq!(read.span.name, "upstream.read", "{case}: {read:?}");
        assert_eq!(
            hex(&read.span.parent_span_id),
            "b7ad6b7169203331",
            "{case}: {read:?}"
        );
        assert_eq!(hex(&read.span.trace_id), "0af7651916cd43dd8448eb211c80319c");
    }

    /// [`flushed`](Self::flushed), once a span named `name` reached the
    /// collector (10 s at most): every span received.
    async fn flushed_with(self, name: &str) -> Vec<fanout_testkit::otlp::Received> {
        let collector = self.flushed().await;
        let what = format!("the span `{name}`");
        collector
            .wait_for(std::time::Duration::from_secs(10), &what, |spans| {
                spans.iter().any(|r| r.span.name == name)
            })
            .await
    }

    /// No longer the default; its telemetry flushed and dropped: the
    /// collector, with what reached it.
    async fn flushed(self) -> Collector {
        drop(self.default);
        flushed(self.telemetry).await;
        self.collector
    }
}

/// `telemetry` flushed, then dropped.
async fn flushed(telemetry: Telemetry) {
    tokio::task::spawn_blocking(move || {
        let _ = telemetry.flush();
        drop(telemetry);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_callers_trace_goes_on_under_a_level_filter_that_keeps_every_span_out() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::Level(Some(LevelFilter::WARN))).await;
    let heard_now = || std::mem::take(&mut *heard.lock().unwrap());
    let answered = |answer: fanout_testkit::Answer| {
        let json = answer.json();
        assert_eq!(json["data"]["a"], 200, "{json:?}");
        assert_eq!(json["data"]["b"], 200, "{json:?}");
        assert_eq!(json["data"]["c"], 200, "{json:?}");
    };

    // A caller's trace, sampled or not: passed on as it came, by every
    // read, the one away from the request's task too, its `tracestate`
    // with it (the W3C's rule for a `traceparent` left unchanged).
    for inbound in [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    ] {
        let tracestate = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
        let headers = [("traceparent", inbound), ("tracestate", tracestate)];
        STATES.lock().unwrap().clear();
        answered(fanout_testkit::post(&app, READS.to_owned(), &headers).await);
        let heard = heard_now();
        assert_eq!(heard.len(), 3, "{heard:?}");
        for traceparent in &heard {
            let traceparent = traceparent.as_deref().expect("a traceparent upstream");
            assert_eq!(traceparent, inbound, "the caller's, as it came");
        }
        let states = std::mem::take(&mut *STATES.lock().unwrap());
        assert_eq!(
            states,
            vec![Some(tracestate.to_owned()); 3],
            "its tracestate as it came"
        );
    }

    // A trace that would start here: none is sent (nothing of it is
    // recorded; the upstream starts its own), and the read that carries a
    // context of its own sends it as the application set it.
    STATES.lock().unwrap().clear();
    answered(fanout_testkit::post(&app, READS.to_owned(), &[]).await);
    answered(fanout_testkit::post(&app, READS.to_owned(), &[("tracestate", "a=b")]).await);
    let heard = heard_now();
    let states = std::mem::take(&mut *STATES.lock().unwrap());
    let own = "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01";
    let count = |of: &[Option<String>], value: Option<&str>| {
        of.iter().filter(|t| t.as_deref() == value).count()
    };
    assert_eq!(
        count(&heard, None),
        4,
        "no trace started upstream: {heard:?}"
    );
    assert_eq!(count(&heard, Some(own)), 2, "the read's own: {heard:?}");
    assert_eq!(
        count(&states, None),
        4,
        "no caller's tracestate: {states:?}"
    );
    assert_eq!(
        count(&states, Some("own=1")),
        2,
        "the read's own: {states:?}"
    );

    // Passed on as it came only when written as the engine would write it:
    // OpenTelemetry's parse takes ids of any length and a second line, and
    // such a caller's trace goes on with a span id of the engine's own and
    // without its `tracestate`. A `tracestate` goes on as parsed: no
    // empty header, 32 members at most.
    let caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let forty: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
    let forty = forty.join(",");
    let cases: [Case; 4] = [
        (
            &[("traceparent", "00-1-2-00"), ("tracestate", "a=b")],
            "not as it came",
            None,
        ),
        (
            &[
                ("traceparent", caller),
                ("traceparent", caller),
                ("tracestate", "a=b"),
            ],
            "two lines",
            None,
        ),
        (
            &[("traceparent", caller), ("tracestate", "")],
            "an empty tracestate",
            None,
        ),
        (
            &[("traceparent", caller), ("tracestate", &forty)],
            "40 members",
            Some(32),
        ),
    ];
    for (headers, case, members) in cases {
        STATES.lock().unwrap().clear();
        answered(fanout_testkit::post(&app, READS.to_owned(), headers).await);
        let heard = heard_now();
        let states = std::mem::take(&mut *STATES.lock().unwrap());
        assert_eq!(heard.len(), 3, "{case}: {heard:?}");
        for (traceparent, state) in heard.iter().zip(&states) {
            let traceparent = traceparent.as_deref().expect("the caller's trace goes on");
            let (_, parent, flags) = parts(traceparent);
            assert_eq!(flags, "00", "{case}: {traceparent}");
            match members {
                None => {
                    assert_eq!(*state, None, "{case}: no tracestate");
                    if case != "an empty tracestate" {
                        assert_ne!(parent, "b7ad6b7169203331", "{case}: {traceparent}");
                        assert_ne!(parent, "0000000000000002", "{case}: {traceparent}");
                    }
                }
                Some(at_most) => {
                    let state = state.as_deref().expect("a tracestate");
                    let count = state.split(',').count();
                    assert!(count <= at_most, "{case}: {count} members");
                }
            }
        }
    }

    let collector = exporting.flushed().await;
    assert!(
        collector.spans().is_empty(),
        "nothing exported: {:?}",
        collector.spans()
    );
}

/// Under a per-target filter that keeps the engine's spans out and lets
/// the application's in, the request is decided by the first span the
/// telemetry's layer sees — the application's — not by the reads made
/// before it: that span is exported, and the reads inside it are in its
/// trace, sampled.
#[tokio::test(flavor = "current_thread")]
async fn an_applications_span_later_in_the_request_is_sampled_as_ever() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::AppOnly).await;

    let answer = fanout_testkit::post(&app, r#"{"query":"{ mine }"}"#.to_owned(), &[]).await;
    assert_eq!(answer.json()["data"]["mine"], 600, "{:?}", answer.json());
    let spans = exporting.flushed_with("mine").await;
    let mine = spans.iter().find(|r| r.span.name == "mine").unwrap();
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(heard.len(), 3, "{heard:?}");
    assert_eq!(heard[0], None, "before any span a layer saw: {heard:?}");
    // Sampled now, but no span names the read: nothing is said (the
    // decision's trace id is no exported span's).
    assert_eq!(heard[2], None, "after the span: {heard:?}");
    let inside = heard[1].as_deref().expect("a traceparent inside `mine`");
    let (trace, _, flags) = parts(inside);
    assert_eq!(
        trace,
        fanout_testkit::otlp::hex(&mine.span.trace_id),
        "{inside}"
    );
    assert_eq!(flags, "01", "sampled: {inside}");
}

/// A sampled caller's trace, with no level filter: each upstream request
/// names the engine's own span, in the caller's trace, and takes the
/// caller's `tracestate` with it (the W3C asks every participant to pass
/// it on); a trace that starts here sends none.
#[tokio::test(flavor = "current_thread")]
async fn a_callers_tracestate_goes_on_with_the_engines_traceparent() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::Level(None)).await;
    let inbound = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let headers = [
        ("traceparent", inbound),
        ("tracestate", "congo=t61rcWkgMzE"),
    ];
    let query = r#"{"query":"{ b: item(id: 2) c: spawned(id: 3) }"}"#;
    STATES.lock().unwrap().clear();
    let answer = fanout_testkit::post(&app, query.to_owned(), &headers).await;
    assert_eq!(answer.json()["data"]["c"], 200, "{:?}", answer.json());
    let sent = std::mem::take(&mut *heard.lock().unwrap());
    let states = std::mem::take(&mut *STATES.lock().unwrap());
    assert_eq!(sent.len(), 2, "{sent:?}");
    for traceparent in &sent {
        let traceparent = traceparent.as_deref().expect("a traceparent");
        let (trace, parent, flags) = parts(traceparent);
        assert_eq!(
            trace, "0af7651916cd43dd8448eb211c80319c",
            "the caller's trace"
        );
        assert_ne!(
            parent, "b7ad6b7169203331",
            "the engine's span: {traceparent}"
        );
        assert_eq!(flags, "01");
    }
    assert_eq!(states, vec![Some("congo=t61rcWkgMzE".to_owned()); 2]);

    // Its own trace: no tracestate to pass on.
    let answer = fanout_testkit::post(&app, query.to_owned(), &[]).await;
    assert_eq!(answer.json()["data"]["c"], 200, "{:?}", answer.json());
    let states = std::mem::take(&mut *STATES.lock().unwrap());
    assert_eq!(states, vec![None; 2], "{states:?}");
    heard.lock().unwrap().clear();
    exporting.flushed().await;
}

/// A read made through the operation's handle in a task of its own, inside
/// a span the application opened there (a trace of its own), to a host
/// that coalesces, under an `INFO` filter (no span of the read's own): the
/// request sent names the request's trace, as the same read to a host that
/// does not coalesce does — not the application's span's.
#[tokio::test(flavor = "current_thread")]
async fn a_coalesced_read_away_from_its_task_names_the_requests_trace() {
    let _serial = SERIAL.lock().await;
    let exporting = exporting(Filter::Level(Some(LevelFilter::INFO))).await;
    let inbound = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let query = r#"{"query":"{ worker(id: 4) }"}"#;
    for coalesce in [false, true] {
        let (app, _task, heard) = service_with(|config, upstream| {
            coalescing(config, upstream, coalesce);
        })
        .await;
        let answer =
            fanout_testkit::post(&app, query.to_owned(), &[("traceparent", inbound)]).await;
        assert_eq!(answer.json()["data"]["worker"], 200, "{:?}", answer.json());
        let case = format!("the request's trace (coalesce: {coalesce})");
        one_sent_in(&heard, ("0af7651916cd43dd8448eb211c80319c", "01"), &case);
    }
    exporting.flushed().await;
}

/// A read made through one request's handle in another request's task (a
/// handle lent, a loader shared between requests) is the handle's
/// request's: charged to its budget, and in its trace — the upstream
/// request names that trace, not the task's request's.
#[tokio::test(flavor = "current_thread")]
async fn a_read_through_another_requests_handle_names_that_requests_trace() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    // The borrower's operation's span a `tracing` one, and one built direct
    // (entered around the read as it is polled in the borrower's task).
    for filter in [Filter::Level(None), Filter::EngineOnly] {
        let exporting = exporting(filter).await;
        let mut named = None;
        // The lender sampled, then sampled out by its caller: its trace, its
        // flag, whichever the borrower's.
        for (lender, flags) in [
            (
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "01",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
                "00",
            ),
        ] {
            lend_and_borrow(&app, lender, "borrow(id: 5)").await;
            let lending = "0af7651916cd43dd8448eb211c80319c";
            if flags == "01" {
                let sent = heard.lock().unwrap().first().cloned().flatten();
                named = sent.map(|traceparent| parts(&traceparent).1);
            }
            let case = format!("the lending request's trace ({filter:?})");
            one_sent_in(&heard, (lending, flags), &case);
        }
        // The sampled lender's read named its CLIENT span, exported, under
        // the lending request's spans (up to its caller's).
        let named = named.expect("the sampled lender's traceparent");
        let collector = exporting.flushed().await;
        let spans = collector
            .wait_for(
                std::time::Duration::from_secs(10),
                "the span the upstream request named",
                |spans| spans.iter().any(|r| hex(&r.span.span_id) == named),
            )
            .await;
        let by_id = |id: &str| spans.iter().find(|r| hex(&r.span.span_id) == id);
        let client = by_id(&named).unwrap();
        assert_eq!(client.span.kind, SpanKind::Client as i32, "{client:?}");
        let mut at = client;
        for _ in 0..spans.len() {
            assert_eq!(
                hex(&at.span.trace_id),
                "0af7651916cd43dd8448eb211c80319c",
                "{filter:?}"
            );
            match by_id(&hex(&at.span.parent_span_id)) {
                Some(parent) => at = parent,
                None => break,
            }
        }
        assert_eq!(
            hex(&at.span.parent_span_id),
            "b7ad6b7169203331",
            "{filter:?}: the lender's caller's span at the root: {at:?}"
        );
    }
}

/// The same read through a lent handle, inside a span the borrowing
/// request's application opened, under a per-target filter that keeps the
/// engine's spans out (no span of the lending request's is kept): the
/// lending request's trace all the same — its caller's, passed on as it
/// came — never the borrowing span's.
#[tokio::test(flavor = "current_thread")]
async fn a_read_through_a_lent_handle_with_no_span_kept_is_not_the_borrowers() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::AppOnly).await;
    let lender = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    lend_and_borrow(&app, lender, "borrow(id: 6, inSpan: true)").await;
    let sent = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(
        sent,
        vec![Some(lender.to_owned())],
        "the lender's caller's, as it came"
    );
    exporting.flushed().await;
}

/// Under a per-target filter that keeps the engine's spans out (no span of
/// the request's kept), a read from a task of its own that runs in the
/// spans of the request's task (a `DataLoader`'s load) names the span it
/// runs in, of the request's trace — as a read in the request's own task
/// does.
#[tokio::test(flavor = "current_thread")]
async fn a_spawned_read_in_the_requests_spans_names_them_with_no_span_kept() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::AppOnly).await;
    let query = r#"{"query":"{ propagated(id: 7) }"}"#;
    let answer = fanout_testkit::post(&app, query.to_owned(), &[]).await;
    assert_eq!(
        answer.json()["data"]["propagated"],
        200,
        "{:?}",
        answer.json()
    );
    let spans = exporting.flushed_with("app").await;
    let app_span = spans.iter().find(|r| r.span.name == "app").unwrap();
    let trace = fanout_testkit::otlp::hex(&app_span.span.trace_id);
    one_sent_in(&heard, (&trace, "01"), "the span the read runs in");
}

/// Under a per-target filter that keeps the engine's spans out (no span of
/// the lending request's kept), or only its request and operation spans
/// (the read path's own spans still exported), a load through a lent
/// handle (a loader shared between requests) spawned in the spans of the
/// borrowing request's task is the lending request's: its caller's trace,
/// passed on as it came — not the borrowing request's span it was spawned
/// in; to a host that coalesces (its send handed to a task of its own) as
/// to one that does not.
#[tokio::test(flavor = "current_thread")]
async fn a_shared_loads_in_another_requests_spans_is_not_that_requests() {
    for filter in [Filter::AppOnly, Filter::ReadsOnly] {
        shared_load_under(filter).await;
    }
}

/// [`a_shared_loads_in_another_requests_spans_is_not_that_requests`]
/// under `filter`.
async fn shared_load_under(filter: Filter) {
    let _serial = SERIAL.lock().await;
    let exporting = exporting(filter).await;
    let lender = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for coalesce in [false, true] {
        let (app, _task, heard) = service_with(|config, upstream| {
            coalescing(config, upstream, coalesce);
        })
        .await;
        lend_and_borrow(&app, lender, "borrow(id: 8, inSpan: true, spawned: true)").await;
        let case = format!("coalesce: {coalesce}, {filter:?}");
        if let Filter::ReadsOnly = filter {
            // The read's own spans, under the lender's caller's.
            let sent = heard.lock().unwrap().first().cloned().flatten();
            let (_, parent, _) = parts(&sent.unwrap_or_default());
            assert_ne!(parent, "b7ad6b7169203331", "a span of the read's: {case}");
            one_sent_in(&heard, ("0af7651916cd43dd8448eb211c80319c", "01"), &case);
            continue;
        }
        let sent = std::mem::take(&mut *heard.lock().unwrap());
        assert_eq!(
            sent,
            vec![Some(lender.to_owned())],
            "the lender's caller's, as it came ({case})"
        );
    }
    exporting.flushed().await;
}

/// `config` with the upstream's host coalescing reads when `coalesce`.
fn coalescing(config: &mut Config, upstream: &str, coalesce: bool) {
    if coalesce {
        let host = upstream.trim_start_matches("http://").to_owned();
        let table = fanout_budget::config::HostConfig::default().coalesce(true);
        config.hosts.insert(host, table);
    }
}

/// Under a per-target filter that keeps the engine's spans out, a read
/// through the handle in a task of its own, inside a span opened there (a
/// trace of that task's own), is the request's: its caller's trace, passed
/// on as it came.
#[tokio::test(flavor = "current_thread")]
async fn a_read_under_a_span_of_its_own_task_with_no_span_kept_is_the_requests() {
    let _serial = SERIAL.lock().await;
    let exporting = exporting(Filter::AppOnly).await;
    let inbound = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let query = r#"{"query":"{ worker(id: 9) }"}"#;
    for coalesce in [false, true] {
        let (app, _task, heard) = service_with(|config, upstream| {
            coalescing(config, upstream, coalesce);
        })
        .await;
        let headers = [("traceparent", inbound)];
        let answer = fanout_testkit::post(&app, query.to_owned(), &headers).await;
        assert_eq!(answer.json()["data"]["worker"], 200, "{:?}", answer.json());
        let sent = std::mem::take(&mut *heard.lock().unwrap());
        let case = format!("the caller's, as it came (coalesce: {coalesce})");
        assert_eq!(sent, vec![Some(inbound.to_owned())], "{case}");
    }
    exporting.flushed().await;
}

/// Under a per-target filter that keeps the engine's spans out, a read
/// spawned in the spans of the request's task names the span the
/// application opened around the request before the engine saw it (as a
/// `tower-http` trace layer does; opened before the request's sampling, it
/// is no span "opened in the request's task") — as a read in the request's
/// own task does.
#[tokio::test(flavor = "current_thread")]
async fn a_spawned_read_in_a_span_around_the_request_names_it_with_no_span_kept() {
    use tracing::Instrument as _;
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let app = app.layer(axum::middleware::from_fn(
        |request: axum::extract::Request, next: axum::middleware::Next| {
            next.run(request).instrument(tracing::info_span!("around"))
        },
    ));
    let exporting = exporting(Filter::AppOnly).await;
    for query in [
        r#"{"query":"{ item(id: 10) }"}"#,
        r#"{"query":"{ loaded(id: 11) }"}"#,
    ] {
        let answer = fanout_testkit::post(&app, query.to_owned(), &[]).await;
        assert_eq!(answer.status, 200, "{:?}", answer.json());
        assert!(answer.json()["errors"].is_null(), "{:?}", answer.json());
    }
    let collector = exporting.flushed().await;
    let spans = collector
        .wait_for(
            std::time::Duration::from_secs(10),
            "two spans `around`",
            |spans| spans.iter().filter(|r| r.span.name == "around").count() == 2,
        )
        .await;
    let mut traces: Vec<_> = spans
        .iter()
        .filter(|r| r.span.name == "around")
        .map(|r| fanout_testkit::otlp::hex(&r.span.trace_id))
        .collect();
    let sent = std::mem::take(&mut *heard.lock().unwrap());
    let mut sent_in: Vec<_> = sent
        .iter()
        .map(|traceparent| {
            let (trace, _, flags) = parts(traceparent.as_deref().expect("a traceparent"));
            assert_eq!(flags, "01", "{traceparent:?}");
            trace
        })
        .collect();
    traces.sort();
    sent_in.sort();
    assert_eq!(sent_in, traces, "each read in its request's span `around`");
}

/// A handle kept after its request ended, read through in another
/// request's task: the read keeps nothing of the ended request's trace —
/// it is in the trace of the request whose task makes it.
#[tokio::test(flavor = "current_thread")]
async fn a_read_through_an_ended_requests_handle_is_not_in_its_trace() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::Level(None)).await;
    let lender = [(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )];
    let lent = fanout_testkit::post(&app, r#"{"query":"{ lend }"}"#.to_owned(), &lender).await;
    assert_eq!(lent.json()["data"]["lend"], 1, "{:?}", lent.json());
    let borrower = [(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )];
    let query = r#"{"query":"{ borrow(id: 12) }"}"#;
    let borrowed = fanout_testkit::post(&app, query.to_owned(), &borrower).await;
    let sent = std::mem::take(&mut *heard.lock().unwrap());
    let borrowed = borrowed.json();
    assert_eq!(borrowed["data"]["borrow"], 200, "{borrowed:?}");
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (trace, _, flags) = parts(sent[0].as_deref().expect("a traceparent"));
    assert_eq!(
        trace, "4bf92f3577b34da6a3ce929d0e0e4736",
        "the borrower's trace"
    );
    assert_eq!(flags, "01");
    exporting.flushed().await;
}

/// Under a per-target filter that keeps the engine's request and operation
/// spans out but its read path's in, a read's span has no span of the
/// request's above it: it joins the caller's trace under the caller's span
/// (as the request's span would), its CLIENT span under it and named
/// upstream — not a trace of its own.
#[tokio::test(flavor = "current_thread")]
async fn a_reads_span_with_no_request_span_joins_the_callers_trace() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::ReadsOnly).await;
    let inbound = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let query = r#"{"query":"{ item(id: 13) }"}"#;
    let answer = fanout_testkit::post(&app, query.to_owned(), &[("traceparent", inbound)]).await;
    assert_eq!(answer.json()["data"]["item"], 200, "{:?}", answer.json());
    exporting
        .client_span_under_callers(&heard, "the caller's trace")
        .await;
}

/// A read inside a span the telemetry does not export (opened for another
/// layer: a log's, async-graphql's field spans) is under the request's
/// spans all the same: its upstream request names a span of the request's
/// trace, the read's span a child of the request's — not a trace of its
/// own.
#[tokio::test(flavor = "current_thread")]
async fn a_read_in_a_span_not_exported_stays_in_the_requests_trace() {
    for filter in [Filter::InfoUnexported, Filter::Unexported] {
        read_in_a_span_not_exported(filter).await;
    }
}

/// [`a_read_in_a_span_not_exported_stays_in_the_requests_trace`] under
/// `filter`: with the read path's spans (`Unexported`) or none
/// (`InfoUnexported`: the upstream request names the request's span, the
/// nearest exported above the application's).
async fn read_in_a_span_not_exported(filter: Filter) {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(filter).await;
    if let Filter::InfoUnexported = filter {
        // No read path's span is opened (the case is the request's span
        // named past the application's), whatever subscriber lived before.
        assert_eq!(LevelFilter::current(), LevelFilter::INFO);
    }
    let answer = fanout_testkit::post(&app, r#"{"query":"{ mine }"}"#.to_owned(), &[]).await;
    assert_eq!(answer.json()["data"]["mine"], 600, "{:?}", answer.json());
    let sent = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(sent.len(), 3, "{sent:?}");
    let collector = exporting.flushed().await;
    let spans = collector
        .wait_for(
            std::time::Duration::from_secs(10),
            "the request's span",
            |spans| spans.iter().any(|r| r.span.kind == SpanKind::Server as i32),
        )
        .await;
    let server = spans
        .iter()
        .find(|r| r.span.kind == SpanKind::Server as i32)
        .unwrap();
    let trace = hex(&server.span.trace_id);
    for traceparent in &sent {
        let traceparent = traceparent.as_deref().expect("a traceparent");
        let (sent_in, named, flags) = parts(traceparent);
        assert_eq!(
            sent_in, trace,
            "the request's trace ({filter:?}): {traceparent}"
        );
        assert_eq!(flags, "01");
        if let Filter::InfoUnexported = filter {
            assert_eq!(named, hex(&server.span.span_id), "the request's span");
        }
    }
    let reads: Vec<_> = spans
        .iter()
        .filter(|r| r.span.name == "upstream.read")
        .collect();
    match filter {
        Filter::InfoUnexported => assert!(reads.is_empty(), "{reads:?}"),
        _ => assert_eq!(reads.len(), 3, "{reads:?}"),
    }
    for read in reads {
        assert_eq!(hex(&read.span.trace_id), trace, "{read:?}");
    }
}

/// Under a filter that exports the engine's read path's spans and not its
/// request's, a read through a lent handle in the borrowing request's own
/// task has its spans as in the lending request's own: the read's under
/// the lender's caller's span, its CLIENT span under it, and named
/// upstream.
#[tokio::test(flavor = "current_thread")]
async fn a_lent_read_with_no_span_kept_keeps_its_spans_together() {
    let _serial = SERIAL.lock().await;
    let (app, _task, heard) = service().await;
    let exporting = exporting(Filter::ReadsOnly).await;
    let lender = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    lend_and_borrow(&app, lender, "borrow(id: 14, inSpan: true)").await;
    exporting
        .client_span_under_callers(&heard, "the lender's")
        .await;
}

/// A load spawned in the request's spans is the request's past what lies
/// between, with the engine's request and operation spans filtered out: a
/// span of the application's opened in the spawned task under the
/// request's (`load`, taken before for a task's own), or one only a log
/// takes current as it is spawned (`field`, under the application's
/// exported `app`: a guard, the read's spans being direct there) — its
/// upstream request in `app`'s trace, sampled.
#[tokio::test(flavor = "current_thread")]
async fn a_load_in_the_requests_spans_is_the_requests_past_what_lies_between() {
    for (filter, field, parent) in [
        (Filter::AppOnly, "loadedIn(id: 15)", "load"),
        (
            Filter::ReadsOnly,
            "loadedIn(id: 16, logOnly: true)",
            "upstream.read",
        ),
    ] {
        let _serial = SERIAL.lock().await;
        let (app, _task, heard) = service().await;
        let exporting = exporting(filter).await;
        let query = format!(r#"{{"query":"{{ {field} }}"}}"#);
        let answer = fanout_testkit::post(&app, query, &[]).await;
        assert!(answer.json()["errors"].is_null(), "{:?}", answer.json());
        let sent = heard.lock().unwrap().first().cloned().flatten();
        let case = format!("{filter:?}: {sent:?}");
        let (sent_in, named, flags) = parts(sent.as_deref().expect("a traceparent"));
        assert_eq!(flags, "01", "{case}");
        let spans = exporting.flushed_with("app").await;
        let app_span = spans.iter().find(|r| r.span.name == "app").unwrap();
        assert_eq!(
            sent_in,
            hex(&app_span.span.trace_id),
            "`app`'s trace: {case}"
        );
        let named = spans.iter().find(|r| hex(&r.span.span_id) == named);
        let named = named.unwrap_or_else(|| panic!("an exported span named: {case}"));
        // The span named (`load`), or the one it is under (a CLIENT span's
        // `upstream.read`).
        let under = spans
            .iter()
            .find(|r| r.span.span_id == named.span.parent_span_id);
        let names = [Some(&named.span.name), under.map(|r| &r.span.name)];
        assert!(
            names.contains(&Some(&parent.to_owned())),
            "`{parent}` named or the parent: {case} {named:?}"
        );
    }
}
