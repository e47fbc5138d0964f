//! The async-graphql extension: every schema the engine serves mounts it
//! (`Schema::build(..).extension(FanoutExtension::new(&engine))`).
//!
//! **Under either integration** its `resolve` hook counts the answer as it
//! is built: every value a field or list item resolves to, and every resolve
//! while it runs, in the request's memory (`memory.rs`); once the request
//! has tripped (`http.max_answer_bytes`, `http.max_inflight_bytes`) a
//! resolve parks instead of running, and the operation's runner drops the
//! operation. Only a per-field hook can see an answer while it is built, so
//! [`FanoutGraphQL`](crate::FanoutGraphQL) requires the extension too (it
//! checks once). It costs what any async-graphql extension costs: once one
//! is registered, async-graphql builds a `ResolveInfo` and runs the
//! extension chain for every field and list item (BENCHMARKS.md).
//!
//! **Under `FanoutGraphQL`** it sees the operation's handle already attached
//! and does nothing else: the service prices, bounds and finishes the
//! operation. **Anywhere else** — async-graphql-axum's `GraphQL` service
//! under [`FanoutLayer`](crate::FanoutLayer), `schema.execute(..)` in a
//! test, a custom handler — it is the per-operation scope:
//!
//! async-graphql runs each operation of a batch as its own `Request` and
//! creates one extension instance per operation. For each operation this
//! extension runs the per-operation pipeline (`pipeline.rs`), as
//! `FanoutGraphQL` does:
//!
//! 1. in `prepare_request`, after the extensions registered after it (so a
//!    query rewritten there, such as a persisted-query lookup, is the one
//!    that runs), takes the request's scope — the [`FanoutRequest`] the
//!    integrator put into the operation's data (`BatchRequest::data`), else
//!    the one [`FanoutLayer`](crate::FanoutLayer) opened for the HTTP
//!    request this task serves, else a new one for this operation alone —
//!    counts the text against the batch's bound (`http.max_body_bytes`),
//!    and admits and prices the operation ([`Op::admit`]: the document
//!    kept for the text handed to async-graphql, so a text seen before is
//!    not parsed again); a refusal here is the operation's answer;
//! 2. in `execute`, refuses it at the batch's barrier or runs it with its
//!    [`Operation`] handle (`run_with_data`) within the request's deadline
//!    and memory bounds, and finishes the response ([`Op::run`]).
//!
//! An operation that ends before this extension admitted it — refused by
//! an extension registered before this one — still counts at the barrier,
//! at 0, when the extension is dropped.

mod mode;

use super::finish::{cap_errors, report_connection};
use super::pipeline::Op;
use super::socket::FanoutConnection;
use crate::cost::schema_types::SchemaTypes;
use crate::document::memo::{Kept, SchemaClaim, Validation};
use crate::engine::Engine;
use crate::error::{operation_error, OperationError};
use crate::inbound::identity::Caller;
use crate::memory::{weigh, weigh_error, PENDING_WEIGHT, VALUE_WEIGHT};
use crate::request::{operation_data, FanoutRequest, Operation, OperationData};
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextPrepareRequest, NextRequest,
    NextResolve, NextValidation, ResolveInfo,
};
use async_graphql::registry::MetaType;
use async_graphql::{Data, Request, Response, ServerResult, Value};
use async_graphql::{ServerError, ValidationResult};
use mode::{Mode, Unadmitted};
use std::any::TypeId;
use std::sync::{Arc, Mutex, OnceLock};

/// The extension factory; mount it with `Schema::build(..).extension(FanoutExtension::new(&engine))`.
///
/// ```
/// use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
/// use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension};
///
/// struct Query;
///
/// #[Object]
/// impl Query {
///     async fn limit(&self, ctx: &async_graphql::Context<'_>) -> async_graphql::Result<u64> {
///         Ok(ctx.fanout_request()?.budget().limit())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let engine = Engine::new(Config::default());
/// let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
///     .extension(FanoutExtension::new(&engine))
///     .finish();
/// let response = schema.execute("{ limit }").await;
/// assert!(response.errors.is_empty());
/// assert!(response.extensions.contains_key("fanout"));
/// # }
/// ```
#[derive(Clone)]
pub struct FanoutExtension {
    engine: Engine,
    /// The schema's types, read from its registry on first use.
    types: Arc<OnceLock<Arc<SchemaTypes>>>,
    data: Option<OperationData>,
    /// The schema whose validations are kept (`document/memo.rs`).
    schema: Arc<SchemaClaim>,
}

impl FanoutExtension {
    /// The extension for `engine`, to mount with
    /// `Schema::build(..).extension(FanoutExtension::new(&engine))` (the
    /// engine's [`CostTable`](crate::cost::CostTable), if any, prices each operation).
    pub fn new(engine: &Engine) -> Self {
        FanoutExtension {
            engine: engine.clone(),
            types: Arc::default(),
            data: None,
            schema: Arc::new(SchemaClaim::new()),
        }
    }

    /// Adds `data(operation, data)` to each operation's data before it runs
    /// (see [`FanoutGraphQL::operation_data`](crate::FanoutGraphQL::operation_data)).
    pub fn operation_data(
        mut self,
        data: impl Fn(&Arc<Operation>, &mut Data) + Send + Sync + 'static,
    ) -> Self {
        self.data = Some(Arc::new(data));
        self
    }
}

impl std::fmt::Debug for FanoutExtension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutExtension")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl ExtensionFactory for FanoutExtension {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(PerOperation {
            factory: self.clone(),
            mode: OnceLock::new(),
            validation: Mutex::new(None),
        })
    }
}

/// One operation, as this extension sees it.
struct PerOperation {
    factory: FanoutExtension,
    /// What the extension is to this operation, decided once in
    /// `prepare_request`; unset until then (and for good when an extension
    /// registered before this one ended the operation first).
    mode: OnceLock<Mode>,
    /// The validation kept for the operation's document, or how to keep it:
    /// found in `prepare_request`, taken by `validation`, in every mode.
    validation: Mutex<Option<Validation>>,
}

impl PerOperation {
    /// Finds the validation kept for `request` — admitted from `kept`, the
    /// document kept for its text — for this schema, or how to keep it.
    /// Called once the request is what async-graphql will validate (the
    /// extensions registered after this one have prepared it).
    fn remember(&self, ctx: &ExtensionContext<'_>, kept: Option<Arc<Kept>>, request: &Request) {
        let Some(kept) = kept else { return };
        // An extension after this one may have put another text in.
        if *request.query != *kept.text {
            return;
        }
        let Some(schema) = self.factory.schema.id(ctx.schema_env) else {
            return;
        };
        let name = request.operation_name.as_deref();
        *lock(&self.validation) = kept.validation(schema, name, &request.variables);
    }

    fn types(&self, ctx: &ExtensionContext<'_>) -> Arc<SchemaTypes> {
        self.factory
            .types
            .get_or_init(|| Arc::new(SchemaTypes::from_registry(&ctx.schema_env.registry)))
            .clone()
    }

    /// The request's scope for an operation this extension admits: the
    /// connection's, on a WebSocket; else the one the integrator put into
    /// the operation's data, else the one `FanoutLayer` opened for the HTTP
    /// request this task serves, else one of its own.
    fn scope(&self, connection: Option<&FanoutConnection>, request: &Request) -> FanoutRequest {
        connection
            .map(FanoutConnection::open_unreserved)
            .or_else(|| {
                (request.data.get(&TypeId::of::<FanoutRequest>()))
                    .and_then(|data| data.downcast_ref::<FanoutRequest>())
                    .cloned()
            })
            .or_else(FanoutRequest::current)
            .unwrap_or_else(|| {
                // Outside any HTTP request's scope (a bare `schema.execute`,
                // a subscription): a scope of its own, still priced first.
                let scope = self.factory.engine.begin_request(Caller::Public);
                scope.expect_operations(1);
                scope
            })
    }
}

#[async_trait::async_trait]
impl Extension for PerOperation {
    /// The whole operation: errors async-graphql raises outside validation
    /// and execution (an `operationName` that selects nothing) get their
    /// codes here.
    async fn request(&self, ctx: &ExtensionContext<'_>, next: NextRequest<'_>) -> Response {
        let mut response = next.run(ctx).await;
        if !response.errors.is_empty() {
            Mode::code(self.mode.get(), &mut response.errors);
        }
        response
    }

    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        // Under `FanoutGraphQL` (the operation's handle is attached): it
        // prices and bounds the operation; only the answer is counted here.
        let attached = request
            .data
            .get(&TypeId::of::<Arc<Operation>>())
            .and_then(|data| data.downcast_ref::<Arc<Operation>>())
            .cloned();
        if let Some(operation) = attached {
            operation.mark_metered();
            let meter = operation.request().clone();
            let _ = self.mode.set(Mode::Aside { meter });
            let request = next.run(ctx, request).await?;
            self.remember(ctx, operation.take_document(), &request);
            return Ok(request);
        }
        // On a WebSocket (the connection in the session's data): admitted
        // here, each event run in a scope of its own.
        let connection = ctx.data_opt::<FanoutConnection>().cloned();
        let scope = self.scope(connection.as_ref(), &request);
        let unadmitted = Unadmitted {
            mode: &self.mode,
            scope: &scope,
        };
        // After the extensions registered after this one: the query text
        // and the operation name as they will run.
        let mut request = next.run(ctx, request).await?;
        // The text that runs, whatever a persisted-query lookup put there,
        // is bounded as the body is.
        let bounded = scope
            .run_text(request.query.len())
            .map_err(|max| OperationError::QueryTooLarge { max });
        let types = self.types(ctx);
        let op = Op::admit(&self.factory.engine, &types, &scope, &mut request, bounded);
        // One copy of the text for the operation and the codes of errors
        // async-graphql raises (a subscription keeps it for hours).
        let text = op.text();
        op.operation().mark_metered();
        let mode = match op.refusal() {
            Some(refusal) => Err(operation_error(refusal)),
            None => {
                self.remember(ctx, op.operation().take_document(), &request);
                Mode::admitted(op, text.clone(), scope.clone(), connection, &mut request)
            }
        };
        // Admitted (priced there) or refused: counted at the barrier.
        let (mode, answer) = match mode {
            Ok(mode) => (mode, Ok(request)),
            Err(refusal) => (Mode::Refused { text }, Err(refusal)),
        };
        let _ = self.mode.set(mode);
        drop(unadmitted);
        answer
    }

    /// async-graphql's validation, or what it concluded for the same
    /// document, schema, operation name and variables, kept
    /// (`document/memo.rs`). It answers without running the operation (so
    /// without [`execute`](Extension::execute)): its errors get their codes
    /// here.
    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        let to_keep = match lock(&self.validation).take() {
            Some(Validation::Kept(result)) => return Ok(result),
            Some(Validation::ToKeep(to_keep)) => Some(to_keep),
            None => None,
        };
        let validated = next.run(ctx).await;
        if let (Ok(result), Some(to_keep)) = (&validated, to_keep) {
            to_keep.keep(*result);
        }
        validated.map_err(|mut errors| {
            cap_errors(&mut errors);
            Mode::code(self.mode.get(), &mut errors);
            errors
        })
    }

    /// Every field and list item, under either integration: the value it
    /// resolves to is counted in the request's memory as it is produced
    /// (`memory.rs`). Once the request has tripped, nothing more resolves:
    /// the resolve parks, and the operation is dropped by its runner.
    async fn resolve(
        &self,
        ctx: &ExtensionContext<'_>,
        info: ResolveInfo<'_>,
        next: NextResolve<'_>,
    ) -> ServerResult<Option<Value>> {
        let event;
        let scope = match self.mode.get() {
            Some(Mode::Aside { meter } | Mode::Scoped { meter, .. }) => meter,
            Some(Mode::Socket { event: current, .. }) => {
                event = lock(current).clone();
                match &event {
                    Some(event) => event,
                    None => return next.run(ctx, info).await,
                }
            }
            Some(Mode::Refused { .. }) | None => return next.run(ctx, info).await,
        };
        let memory = scope.memory();
        if !memory.answer(PENDING_WEIGHT) {
            return std::future::pending().await;
        }
        let ty = info.return_type;
        let path = info.path_node;
        let resolved = next.run(ctx, info).await;
        let weight = match &resolved {
            Ok(Some(value @ (Value::Object(_) | Value::List(_)))) => {
                weigh(value, Self::built_whole(ctx, ty))
            }
            Ok(Some(value)) => weigh(value, false),
            // A null; a failed field's error was counted where it was
            // added (`OrNull`).
            Ok(None) => 4 * VALUE_WEIGHT,
            Err(err) => {
                let depth = std::iter::successors(Some(path), |node| node.parent).count();
                4 * VALUE_WEIGHT + weigh_error(err, depth)
            }
        };
        if !memory.settle_answer(PENDING_WEIGHT, weight) {
            drop(resolved);
            return std::future::pending().await;
        }
        resolved
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let admitted = match self.mode.get() {
            Some(Mode::Socket {
                connection,
                op,
                event,
                ..
            }) => {
                // Boxed: an event of a socket is rare beside the requests
                // over HTTP, whose hook's future would otherwise be as large
                // as this path's (it is allocated for every operation).
                let event = self.run_event(ctx, operation_name, next, connection, op, event);
                return Box::pin(event).await;
            }
            Some(Mode::Scoped { op, .. }) => lock(op).take(),
            Some(Mode::Aside { .. } | Mode::Refused { .. }) | None => None,
        };
        // Under `FanoutGraphQL`, or not admitted here (an extension before
        // this one ran the operation some other way): nothing to bound.
        let Some(op) = admitted else {
            return next.run(ctx, operation_name).await;
        };
        let mut data = Data::default();
        op.data(&mut data, self.factory.data.as_ref());
        let types = self.types(ctx);
        op.run(&types, next.run_with_data(ctx, operation_name, data))
            .await
    }
}

impl PerOperation {
    /// One event of a subscription on a WebSocket (or a query sent over
    /// one): run in a scope of its own opened on `connection`
    /// (`socket/connection.rs`), its `extensions.fanout` the connection's
    /// budget and the event's own reads; `current` holds it while it runs.
    async fn run_event(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
        connection: &FanoutConnection,
        op: &Op,
        current: &Mutex<Option<FanoutRequest>>,
    ) -> Response {
        let event = connection.open_priced(op.requested());
        let operation = event.operation();
        operation.mark_metered();
        let mut data = Data::default();
        operation_data(&operation, &mut data, self.factory.data.as_ref());
        *lock(current) = Some(event.clone());
        let types = self.types(ctx);
        let execute = next.run_with_data(ctx, operation_name, data);
        let mut response = op.run_event(&event, &operation, &types, execute).await;
        // The event is over: its scope goes now — its memory blocks back to
        // the pool, its reservation settled on the client's read quota —
        // not when the next event comes, hours later perhaps.
        *lock(current) = None;
        drop((event, operation));
        report_connection(&mut response, connection);
        response
    }

    /// Whether a resolved value of GraphQL type `ty` was built without a
    /// resolve per child (a custom scalar's object or list), so that its
    /// children count with it.
    /// A list type's items are resolved (and counted) one by one, whatever
    /// their type — a list of scalars included — so only a value whose own
    /// type is a scalar is.
    fn built_whole(ctx: &ExtensionContext<'_>, ty: &str) -> bool {
        let named = ty.trim_end_matches('!');
        !named.starts_with('[')
            && matches!(
                ctx.schema_env.registry.types.get(named),
                Some(MetaType::Scalar { .. })
            )
    }
}

/// An operation that ended before this extension saw it — refused by an
/// extension registered before this one, say — still counts at the barrier
/// (at 0), so the rest of an announced batch does not wait for it until the
/// deadline. (The operation ends inside the HTTP request's task, where the
/// layer's scope is still current.)
impl Drop for PerOperation {
    fn drop(&mut self) {
        if self.mode.get().is_none() {
            if let Some(scope) = FanoutRequest::current() {
                scope.priced(0);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
