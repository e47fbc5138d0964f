//! The async-graphql extension: the per-operation scope for schemas served
//! without [`FanoutGraphQL`](crate::FanoutGraphQL).
//!
//! **When to use it.** [`FanoutGraphQL`](crate::FanoutGraphQL) attaches each
//! operation's scope itself and needs no extension; prefer it. Mount this
//! extension (`Schema::build(..).extension(engine.extension())`) when the
//! schema is executed some other way — async-graphql-axum's `GraphQL`
//! service, `schema.execute(..)` in a test, a custom handler. It costs what
//! any async-graphql extension costs: once one is registered, async-graphql
//! builds a `ResolveInfo` and runs the extension chain for every field and
//! list item (≈ 7.5 µs per request of the reference query, BENCHMARKS.md).
//! Mounted together with `FanoutGraphQL`, it sees the operation already
//! attached and stands aside, so nothing is counted twice.
//!
//! async-graphql runs each operation of a batch as its own `Request` and
//! creates one extension instance per operation. For each operation this
//! extension:
//!
//! 1. in `prepare_request`, after the extensions registered after it (so a
//!    query rewritten there is the one that runs), hands async-graphql the
//!    parsed document kept for the operation's text ([`crate::documents`],
//!    the engine's; the text is parsed and kept otherwise), so a text seen
//!    before is not parsed again;
//! 2. in `parse_query`, prices the operation with the engine's
//!    [`CostTable`](crate::CostTable) (if one is set) and adds it to the
//!    request's `requested`;
//! 3. in `execute`, takes the request's scope — the [`FanoutRequest`] the
//!    integrator put into the batch's data (`BatchRequest::data`), else a new
//!    one for this operation alone — and, when `refuse_over_estimate` is on
//!    and the integrator announced the batch
//!    ([`FanoutRequest::expect_operations`]), waits until every operation is
//!    priced and refuses all of them if the sum exceeds the budget;
//! 4. hands the resolvers an [`Operation`] through `run_with_data`;
//! 5. after execution, finishes the response exactly as `FanoutGraphQL`
//!    does: contract codes, null propagation, `extensions.fanout`.

use crate::engine::Engine;
use crate::error::{operation_error, refused};
use crate::finish::{code_errors, finish};
use crate::identity::Caller;
use crate::request::{operation_data, FanoutRequest, Operation, OperationData, OverGet};
use crate::shape::{self, Shape};
use crate::types::SchemaTypes;
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextPrepareRequest,
    NextValidation,
};
use async_graphql::parser::types::{ExecutableDocument, OperationType};
use async_graphql::{Data, Request, Response, ServerResult, Variables};
use async_graphql::{ServerError, ValidationResult};
use std::any::TypeId;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use tracing::Instrument;

/// The extension factory; mount it with `Schema::build(..).extension(engine.extension())`.
///
/// ```
/// use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
/// use fanout_budget::{Config, Engine, FanoutContext};
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
///     .extension(engine.extension())
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
}

impl FanoutExtension {
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

impl Engine {
    /// The async-graphql extension to mount with `Schema::build(..).extension(..)`
    /// (the engine's [`CostTable`](crate::CostTable), if any, prices each operation).
    pub fn extension(&self) -> FanoutExtension {
        FanoutExtension {
            engine: self.clone(),
            types: Arc::default(),
            data: None,
        }
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
            aside: AtomicBool::new(false),
            operation_name: Mutex::new(None),
            query: Mutex::new(String::new()),
            shape: Mutex::new(None),
            scope: Mutex::new(None),
            requested: AtomicU64::new(0),
            priced: AtomicBool::new(false),
        })
    }
}

struct PerOperation {
    factory: FanoutExtension,
    /// `FanoutGraphQL` already attached this operation's scope.
    aside: AtomicBool,
    operation_name: Mutex<Option<String>>,
    query: Mutex<String>,
    /// The checked document's shape, from `prepare_request`.
    shape: Mutex<Option<Shape>>,
    /// The request's scope, found in `prepare_request`.
    scope: Mutex<Option<FanoutRequest>>,
    /// This operation counted at the scope's pricing barrier.
    priced: AtomicBool,
    requested: AtomicU64,
}

impl PerOperation {
    /// Counts this operation at `scope`'s pricing barrier, once.
    fn price(&self, scope: &FanoutRequest, requested: u64) {
        if !self.priced.swap(true, Relaxed) {
            scope.priced(requested);
        }
    }

    fn types(&self, ctx: &ExtensionContext<'_>) -> Arc<SchemaTypes> {
        self.factory
            .types
            .get_or_init(|| Arc::new(SchemaTypes::from_registry(&ctx.schema_env.registry)))
            .clone()
    }
}

#[async_trait::async_trait]
impl Extension for PerOperation {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        // After the extensions registered after this one: the query text
        // and the operation name as they will run (an extension may rewrite
        // them, e.g. a persisted-query lookup).
        // An operation refused here never reaches `parse_query`, where it
        // would be priced: it counts as priced at 0, so the rest of an
        // announced batch does not wait for it until the deadline.
        // The request's scope: the one the integrator put into the
        // operation's data, else the one `FanoutLayer` opened for the HTTP
        // request this task serves.
        let scope = request
            .data
            .get(&TypeId::of::<FanoutRequest>())
            .and_then(|data| data.downcast_ref::<FanoutRequest>())
            .cloned()
            .or_else(FanoutRequest::current);
        lock(&self.scope).clone_from(&scope);
        let refused = |err| {
            if let Some(scope) = &scope {
                self.price(scope, 0);
            }
            err
        };
        let mut request = next.run(ctx, request).await.map_err(refused)?;
        if request.data.contains_key(&TypeId::of::<Arc<Operation>>()) {
            self.aside.store(true, Relaxed);
            return Ok(request);
        }
        *lock(&self.operation_name) = request.operation_name.clone();
        // Parsed here (or the kept document copied) and checked before
        // async-graphql's own steps walk it: its recursion-depth check and
        // its complexity visitors expand fragments without a memo.
        let engine = &self.factory.engine;
        let max = engine.config().http.max_selections;
        let (doc, shape) = shape::admit(engine.documents(), &request.query, max)
            .map_err(|err| refused(operation_error(&err)))?;
        // Over GET only queries run, whatever text a persisted-query lookup
        // put in (FanoutGraphQL answers 405; here the operation is refused).
        let over_get = scope
            .as_ref()
            .is_some_and(|scope| scope.extensions().get::<OverGet>().is_some());
        if over_get
            && shape::operation(&doc, request.operation_name.as_deref())
                .is_some_and(|op| op.ty != OperationType::Query)
        {
            let mut error =
                ServerError::new("only queries run over GET; send a mutation as a POST", None);
            let mut ext = async_graphql::ErrorExtensionValues::default();
            ext.set("code", "BAD_REQUEST");
            error.extensions = Some(ext);
            return Err(refused(error));
        }
        request.set_parsed_query(doc);
        // Kept for pricing in `parse_query`, which gets this document.
        *lock(&self.shape) = Some(shape);
        Ok(request)
    }

    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        if self.aside.load(Relaxed) {
            return next.run(ctx, query, variables).await;
        }
        query.clone_into(&mut lock(&self.query));
        let parsed = next.run(ctx, query, variables).await;
        let shape = lock(&self.shape).take();
        let requested = match (&parsed, shape, self.factory.engine.costs()) {
            (Ok(doc), Some(shape), Some(costs)) => {
                let name = lock(&self.operation_name).clone();
                let types = self.types(ctx);
                crate::cost::estimate(costs, &types, doc, &shape, variables, name.as_deref())
            }
            _ => 0,
        };
        self.requested.store(requested, Relaxed);
        if let Some(scope) = &*lock(&self.scope) {
            self.price(scope, requested);
        }
        parsed
    }

    /// async-graphql's validation answers without running the operation
    /// (so without [`execute`](Extension::execute)): its errors get their
    /// codes here.
    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        next.run(ctx).await.map_err(|mut errors| {
            code_errors(&mut errors, &lock(&self.query));
            errors
        })
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        if self.aside.load(Relaxed) {
            return next.run(ctx, operation_name).await;
        }
        let requested = self.requested.load(Relaxed);
        let scope = lock(&self.scope).take();
        let request = match scope {
            Some(request) => request,
            None => {
                // Outside any HTTP request's scope (a bare `schema.execute`,
                // a subscription): a scope of its own, still priced first.
                let request = self.factory.engine.begin_request(Caller::Public);
                request.expect_operations(1);
                request.priced(requested);
                request
            }
        };
        let operation = request.operation();
        let mut response = match request.refusal().await {
            Some(refusal) => refused(&refusal),
            None => {
                let mut data = Data::default();
                operation_data(&operation, &mut data, self.factory.data.as_ref());
                let span =
                    tracing::debug_span!("graphql.operation", name = operation_name, requested);
                let run = next
                    .run_with_data(ctx, operation_name, data)
                    .instrument(span);
                request.within_deadline(run).await
            }
        };
        let query = std::mem::take(&mut *lock(&self.query));
        let types = self.types(ctx);
        let priced = self.factory.engine.costs().map(|_| requested);
        finish(
            &mut response,
            &operation,
            priced,
            &types,
            &query,
            operation_name,
        );
        response
    }
}

/// An operation that ended before this extension priced it — refused by an
/// extension registered before this one, say — still counts at the barrier
/// (at 0), so the rest of an announced batch does not wait for it until the
/// deadline. (The operation ends inside the HTTP request's task, where the
/// layer's scope is still current.)
impl Drop for PerOperation {
    fn drop(&mut self) {
        if self.priced.load(Relaxed) || self.aside.load(Relaxed) {
            return;
        }
        let scope = lock(&self.scope).take().or_else(FanoutRequest::current);
        if let Some(scope) = scope {
            self.price(&scope, 0);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
