//! The HTTP integration: one inbound HTTP request → one budget → one batch.
//!
//! [`FanoutGraphQL`] is a `tower::Service` (mount it with axum's
//! `route_service`). Per request it checks what the protocol asks of the
//! request's method and headers (`protocol.rs`: GET or POST, `Accept`, CSRF
//! for a POST's body and, under `http.csrf_get`, for a GET), opens the
//! request's scope, reads the body within its bounds (413
//! `PAYLOAD_TOO_LARGE`, 408 `REQUEST_TIMEOUT`, both with `Connection: close`)
//! or the query string of a GET (bounded like a body), parses one operation
//! or a batch (400 `BAD_REQUEST`, 400 `BATCH_TOO_LARGE`: nothing runs,
//! nothing is read), resolves persisted queries (`document/persisted.rs`)
//! and bounds the texts the batch runs like its body (413). Then each
//! operation goes through the per-operation pipeline (`pipeline.rs`: admit,
//! price, refuse, run within bounds, finish), all of them concurrently as
//! async-graphql's `execute_batch` runs them, and the answers are written in
//! the negotiated media type (`protocol.rs`). A batch a memory bound stopped
//! answers as one (`RESPONSE_TOO_LARGE` or 503 `OVERLOADED`).
//!
//! The schema mounts [`FanoutExtension`](crate::FanoutExtension), which
//! counts each answer as it is built (checked once, on the first request:
//! without it every request answers 500, since its answers could not be
//! bounded in memory). A browser's `GET` without a query gets GraphiQL
//! (`graphiql.rs`). With `http.cost_headers`, every answer to a GraphQL
//! request carries its cost (`finish.rs`). Its place in the walk of one
//! read: ARCHITECTURE.md.

use super::finish::{cost_headers, spent_header, CostEnvelope};
use super::pipeline::Op;
use super::protocol;
use super::server_span;
use crate::cost::schema_types::SchemaTypes;
use crate::engine::Engine;
use crate::error::{OperationError, Rejection};
use crate::request::{FanoutRequest, Operation, OperationData};
use async_graphql::{
    BatchRequest, Executor, ObjectType, Request, Response, Schema, SubscriptionType,
};
use axum::body::Body;
use axum::response::{IntoResponse, Response as HttpResponse};
use futures::future::{BoxFuture, FutureExt as _};
use futures::stream::{FuturesOrdered, StreamExt};
use http::{header, Method, StatusCode};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tracing::{Instrument, Span};

/// The GraphQL endpoint as a `tower::Service`.
///
/// ```
/// use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
/// use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
///
/// struct Query;
///
/// #[Object]
/// impl Query {
///     async fn hello(&self) -> &str {
///         "world"
///     }
/// }
///
/// let engine = Engine::new(Config::default());
/// let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
///     .extension(FanoutExtension::new(&engine)) // counts each answer as it is built
///     .finish();
/// let app: axum::Router = axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
/// # drop(app);
/// ```
pub struct FanoutGraphQL<E> {
    /// Everything, behind one pointer: axum clones the service for every
    /// request, and so does `call` (one reference count each, not seven).
    served: Arc<Served<E>>,
}

impl<E> Clone for FanoutGraphQL<E> {
    fn clone(&self) -> Self {
        Self {
            served: self.served.clone(),
        }
    }
}

/// What a [`FanoutGraphQL`] serves with.
#[derive(Clone)]
struct Served<E> {
    executor: E,
    engine: Engine,
    types: Arc<SchemaTypes>,
    data: Option<OperationData>,
    /// Whether the schema mounts the engine's extension, found out once.
    metered: Arc<tokio::sync::OnceCell<bool>>,
    /// What GraphiQL's editor opens on for a first-time visitor.
    example: Option<Arc<str>>,
    /// `http.cost_extension`'s envelope, when it is on.
    envelope: Option<CostEnvelope>,
}

impl<E> std::fmt::Debug for FanoutGraphQL<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutGraphQL")
            .field("engine", &self.served.engine)
            .finish_non_exhaustive()
    }
}

impl<Q, M, S> FanoutGraphQL<Schema<Q, M, S>>
where
    Q: ObjectType + 'static,
    M: ObjectType + 'static,
    S: SubscriptionType + 'static,
{
    /// Serves `schema` under `engine`'s limits. The schema needs no
    /// extension; its types are read once, from its SDL.
    pub fn new(schema: Schema<Q, M, S>, engine: Engine) -> Self {
        let sdl = schema.sdl();
        Self::with_sdl(schema, engine, &sdl)
    }
}

impl<E: Executor> FanoutGraphQL<E> {
    /// Serves any async-graphql `executor` whose schema `sdl` describes (the
    /// cost preview and null propagation walk operations with its types).
    pub fn with_sdl(executor: E, engine: Engine, sdl: &str) -> Self {
        let types = Arc::new(SchemaTypes::from_sdl(sdl));
        let envelope = CostEnvelope::of(engine.config());
        Self {
            served: Arc::new(Served {
                executor,
                engine,
                types,
                data: None,
                metered: Arc::default(),
                example: None,
                envelope,
            }),
        }
    }

    /// The query GraphiQL's editor opens on, for a visitor who has not
    /// written one yet (GraphiQL keeps a visitor's own in the browser):
    /// an example of your schema instead of GraphiQL's welcome text.
    pub fn graphiql_query(mut self, query: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.served).example = Some(Arc::from(query.into()));
        self
    }

    /// Adds `data(operation, data)` to each operation's data before it runs:
    /// per-operation state built with the operation's handle — a
    /// `DataLoader` whose loads read through it (`examples/dataloader.rs`),
    /// or anything taken from the HTTP request's extensions
    /// (`operation.request().extensions()`).
    pub fn operation_data(
        mut self,
        data: impl Fn(&Arc<Operation>, &mut async_graphql::Data) + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.served).data = Some(Arc::new(data));
        self
    }
}

impl<E: Executor> Served<E> {
    /// `handle` and `answer` are `async` blocks, not `async fn`s: an
    /// `async fn` keeps each argument twice in its future (as it came, and
    /// as the body's local) — the HTTP request, 240 bytes, here — and this
    /// future is allocated for every request.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    fn handle(
        self: Arc<Self>,
        mut request: http::Request<Body>,
    ) -> impl Future<Output = HttpResponse> + Send {
        async move {
            let get = request.method() == Method::GET;
            CostEnvelope::mark(self.envelope, request.extensions_mut());
            // A WebSocket: subscriptions (and queries) over one connection, one
            // scope (`socket.rs`).
            if get && super::socket::is_upgrade(&request) {
                if !self.extension_mounted().await {
                    return Rejection::Misconfigured {
                        message: NOT_METERED.into(),
                    }
                    .unread();
                }
                return super::socket::upgrade(self.executor.clone(), self.engine.clone(), request)
                    .await;
            }
            // GraphiQL's assets: their route may be mounted outside the rate
            // limiter, so nothing there is ever a GraphQL request.
            if let Some((_, name)) = request.uri().path().rsplit_once("/graphiql/") {
                if !get {
                    return Rejection::MethodNotAllowed {
                        allow: "GET",
                        message: "GraphiQL's assets are served to a GET only".into(),
                    }
                    .unread();
                }
                return asset(name);
            }
            if get {
                if let Some(page) = graphiql(&request, self.example.as_deref()) {
                    return page;
                }
            }
            let caller =
                super::finish::cost_caller(&self.engine, request.extensions(), request.headers());
            if !get && request.method() != Method::POST {
                let mut refused = Rejection::MethodNotAllowed {
                    allow: "GET, POST",
                    message: "a GraphQL request is a GET (queries) or a POST".into(),
                }
                .unread();
                cost_headers(&mut refused, &self.engine, None, caller);
                return refused;
            }
            let opened = server_span::Opened::now(&request, get);
            let span = server_span::open(&request, get, &opened);
            let mut scope = None;
            let answered = self.answer(request, get, &span, &mut scope);
            let mut answer = server_span::within(&opened, answered.instrument(span.clone())).await;
            cost_headers(&mut answer, &self.engine, scope.as_ref(), caller);
            spent_header(&mut answer, scope.as_ref());
            server_span::spent(&span, scope.as_ref());
            server_span::close(&span, opened, answer.status(), self.engine.metrics());
            answer
        }
    }

    /// A GraphQL request over HTTP, answered (`span`: its own; `scope`: its
    /// scope once opened).
    ///
    /// What is done with before the operations run (the CSRF check, the
    /// request's head, the batch as parsed) is scoped to blocks of its own,
    /// so that the future does not hold it while they run.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    fn answer<'a>(
        &'a self,
        request: http::Request<Body>,
        get: bool,
        span: &'a Span,
        scope: &'a mut Option<FanoutRequest>,
    ) -> impl Future<Output = HttpResponse> + Send + 'a {
        async move {
            let Some(media) = protocol::negotiate(request.headers()) else {
                return Rejection::NotAcceptable.unread();
            };
            if !self.extension_mounted().await {
                return Rejection::Misconfigured {
                    message: NOT_METERED.into(),
                }
                .unread();
            }
            {
                let csrf = if get {
                    let policy = self.engine.config().http.csrf_get_or_default();
                    protocol::check_get(request.headers(), request.uri().query(), policy)
                } else {
                    protocol::check_json_body(request.headers())
                };
                if let Err(refused) = csrf {
                    return refused.unread();
                }
            }
            let http = &self.engine.config().http;
            let (fanout, single, requests) = {
                let (parts, body) = request.into_parts();
                let fanout = &*scope.insert(self.engine.open_request(&parts));
                server_span::caller(span, fanout.caller());
                server_span::received(span, fanout);
                let batch = if get {
                    // The query string carries what a body would: bounded like one.
                    let query = parts.uri.query().unwrap_or("");
                    if query.len() > http.max_body_bytes {
                        return Rejection::PayloadTooLarge {
                            max: http.max_body_bytes,
                        }
                        .into_response();
                    }
                    protocol::parse_query_string(query).map(BatchRequest::Single)
                } else {
                    match fanout.read_body(body, http).await {
                        Ok(bytes) => protocol::parse_body(&bytes, http.max_batch_operations),
                        Err(err) => return err.unread(),
                    }
                };
                match batch {
                    Ok(BatchRequest::Single(request)) => (fanout, true, vec![request]),
                    Ok(BatchRequest::Batch(requests)) => (fanout, false, requests),
                    Err(err) => return err.into_response(),
                }
            };
            span.record("fanout.operations", server_span::int(requests.len()));
            let responses = self.run(fanout, requests).await;
            span.record("fanout.reads", server_span::int(fanout.budget().used()));
            let answer = match responses {
                Ok(responses) => {
                    protocol::respond(&responses, single, media, http.max_response_bytes)
                }
                Err(refused) => refused.into_response(),
            };
            // Until the client has read it, the answer holds its bytes in the
            // process's memory pool.
            fanout.memory().lease_body(answer)
        }
    }

    /// Admits and prices every operation of the request, then runs them
    /// (or refuses them) concurrently, each through the pipeline
    /// (`pipeline.rs`). Over `GET` only queries run: anything else refuses
    /// the request (405).
    async fn run(
        &self,
        fanout: &FanoutRequest,
        requests: Vec<Request>,
    ) -> Result<Vec<Response>, Rejection> {
        fanout.expect_operations(requests.len());
        // The texts the batch runs, persisted ones included, are bounded as
        // the body is, before any is parsed.
        let mut text = 0;
        let requests: Vec<_> = requests
            .into_iter()
            .map(|mut request| {
                let persisted = self.engine.persisted().resolve(&mut request);
                text += request.query.len();
                (request, persisted)
            })
            .collect();
        let max = self.engine.config().http.max_body_bytes;
        if text > max {
            return Err(Rejection::QueryTooLarge { max });
        }
        let mut ops: Vec<(Op, Request)> = requests
            .into_iter()
            .map(|(mut request, persisted)| {
                let op = Op::admit(&self.engine, &self.types, fanout, &mut request, persisted);
                (op, request)
            })
            .collect();
        if ops
            .iter()
            .any(|(op, _)| op.refusal() == Some(&OperationError::NotAQuery))
        {
            return Err(Rejection::MethodNotAllowed {
                allow: "POST",
                message: "only queries run over GET; send a mutation as a POST".into(),
            });
        }
        let responses = if ops.len() == 1 {
            let (op, request) = ops.pop().expect("one operation");
            vec![self.execute(op, request).await]
        } else {
            ops.into_iter()
                .map(|(op, request)| self.execute(op, request))
                .collect::<FuturesOrdered<_>>()
                .collect()
                .await
        };
        // A memory bound stopped the batch: it answers as one.
        match fanout.stopped() {
            Some(rejection) => Err(rejection),
            None => Ok(responses),
        }
    }

    /// Runs one admitted operation on the executor, through the pipeline.
    /// The executor's future is boxed: each wrapper around it (the
    /// pipeline's bounds, the span, the sampling scope) is an `async fn`
    /// that would otherwise hold a copy of it, and the request's future
    /// would weigh tens of kilobytes, moved and allocated per request.
    /// Not an `async fn` itself: its future is the pipeline's, with no
    /// layer holding the operation and the request a second time.
    fn execute(&self, op: Op, mut request: Request) -> impl Future<Output = Response> + '_ {
        op.data(&mut request.data, self.data.as_ref());
        op.run(&self.types, Box::pin(self.executor.execute(request)))
    }

    /// Whether the schema mounts `FanoutExtension::new(&engine)`, which counts each
    /// answer as it is built: found out once, by running `{ __typename }`
    /// with an operation handle the extension marks when it sees it.
    ///
    /// Known after the first request: no future awaited (the probe's, a
    /// whole execution, boxed, would otherwise be held in every request's).
    async fn extension_mounted(&self) -> bool {
        match self.metered.get() {
            Some(metered) => *metered,
            None => Box::pin(self.probe_extension()).await,
        }
    }

    /// [`extension_mounted`](Self::extension_mounted), found out.
    async fn probe_extension(&self) -> bool {
        *self
            .metered
            .get_or_init(|| async {
                let probe = self.engine.begin_request(crate::inbound::Caller::Internal);
                probe.probe();
                let operation = probe.operation();
                let mut request = Request::new("{ __typename }");
                request.data.insert(operation.clone());
                drop(self.executor.execute(request).await);
                let metered = operation.is_metered();
                if !metered {
                    tracing::error!("{NOT_METERED}");
                }
                metered
            })
            .await
    }
}

/// Why `FanoutGraphQL` answers 500 to a schema without the extension.
const NOT_METERED: &str = "the schema served by FanoutGraphQL does not mount the engine's \
extension, so its answers could not be bounded in memory while they are built: build it with \
`Schema::build(..).extension(FanoutExtension::new(&engine))`, registered before the schema's other extensions";

impl<E: Executor> tower::Service<http::Request<Body>> for FanoutGraphQL<E> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<HttpResponse, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The request's own future, boxed once, holding the request once.
        Box::pin(self.served.clone().handle(request).map(Ok))
    }
}

/// The request's path as the client sent it: under `Router::nest` the URI
/// has lost its prefix, which the page's links need.
fn path_of(request: &http::Request<Body>) -> &str {
    match request.extensions().get::<axum::extract::OriginalUri>() {
        Some(original) => original.0.path(),
        None => request.uri().path(),
    }
}

/// One of GraphiQL's assets (`…/graphiql/<name>`).
fn asset(name: &str) -> HttpResponse {
    match crate::graphql::graphiql::asset(name) {
        Some((content_type, bytes)) => (
            [
                (header::CONTENT_TYPE, content_type),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            bytes,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The GraphiQL page for a browser's `GET` without a query; `None`: a
/// GraphQL request.
fn graphiql(request: &http::Request<Body>, example: Option<&str>) -> Option<HttpResponse> {
    let path = path_of(request);
    if !protocol::wants_page(request.headers(), request.uri().query()) {
        return None;
    }
    let page = crate::graphql::graphiql::page(path.trim_end_matches('/'), example);
    let csp = crate::graphql::graphiql::CONTENT_SECURITY_POLICY;
    Some(
        (
            [(header::CONTENT_SECURITY_POLICY, csp)],
            axum::response::Html(page),
        )
            .into_response(),
    )
}
