//! The async-graphql extension: attaches the request's fan-out scope to each
//! operation and reports it in `extensions.fanout`.
//!
//! async-graphql runs each operation of a batch as its own `Request`, and
//! creates one extension instance per operation. The HTTP integration has
//! already put one [`FanoutRequest`] — one budget, one de-duplication cache —
//! into every operation's data (`BatchRequest::data` clones the `Arc`). For
//! each operation this extension:
//!
//! 1. in `parse_query`, computes the operation's worst-case reads from the
//!    engine's [`CostTable`](crate::CostTable) (if one is set) and adds them
//!    to the request's `requested`;
//! 2. in `execute`, when `refuse_over_estimate` is on, waits until every
//!    operation of the batch has been priced and refuses all of them with
//!    `FANOUT_ESTIMATE_EXCEEDS_BUDGET` if the sum exceeds the budget — before
//!    any of them reads;
//! 3. in `execute`, hands the resolvers an [`Operation`] — the request's
//!    scope plus this operation's own read counter — through
//!    `NextExecute::run_with_data`;
//! 4. after execution, gives every error its contract code, repairs null
//!    propagation where async-graphql dropped a failed field's key
//!    ([`crate::nulls`]), and writes
//!    `extensions.fanout = {limit, used, remaining, operationReads, requested}`.
//!
//! A schema executed without the HTTP integration (`schema.execute(..)` in a
//! test) still works: the extension opens a scope per operation.

use crate::engine::Engine;
use crate::identity::Caller;
use crate::upstream::{FanoutRequest, Operation};
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextPrepareRequest,
};
use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{Data, Pos, Request, Response, ServerResult, Value, Variables};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tracing::Instrument;

/// The extension factory; mount it with `Schema::build(..).extension(engine.extension())`.
#[derive(Clone)]
pub struct FanoutExtension {
    engine: Engine,
}

impl FanoutExtension {
    /// The extension for `engine` (whose [`CostTable`](crate::CostTable), if
    /// any, prices each operation).
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

impl ExtensionFactory for FanoutExtension {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(PerOperation {
            engine: self.engine.clone(),
            operation_name: Mutex::new(None),
            query: Mutex::new(String::new()),
            requested: AtomicU64::new(0),
        })
    }
}

struct PerOperation {
    engine: Engine,
    operation_name: Mutex<Option<String>>,
    query: Mutex<String>,
    requested: AtomicU64,
}

#[async_trait::async_trait]
impl Extension for PerOperation {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        *lock(&self.operation_name) = request.operation_name.clone();
        next.run(ctx, request).await
    }

    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        query.clone_into(&mut lock(&self.query));
        let parsed = next.run(ctx, query, variables).await;
        let requested = match (&parsed, self.engine.costs()) {
            (Ok(doc), Some(costs)) => {
                let name = lock(&self.operation_name).clone();
                costs.estimate(&ctx.schema_env.registry, doc, variables, name.as_deref())
            }
            _ => 0,
        };
        self.requested.store(requested, Relaxed);
        if let Some(request) = ctx.data_opt::<FanoutRequest>() {
            request.budget().add_requested(requested);
            request.estimate_arrived();
        }
        parsed
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let request = match ctx.data_opt::<FanoutRequest>() {
            Some(request) => request.clone(),
            None => {
                let request = self.engine.begin_request(Caller::Public);
                request.budget().add_requested(self.requested.load(Relaxed));
                request
            }
        };
        let requested = self.requested.load(Relaxed);
        let operation = request.operation();
        let mut response = match request.refusal().await {
            Some(refusal) => {
                let mut response = Response::from_errors(vec![refusal
                    .to_graphql_error()
                    .into_server_error(Pos::default())]);
                response.data = Value::Null;
                response
            }
            None => {
                let mut data = Data::default();
                data.insert(operation.clone());
                let span =
                    tracing::debug_span!("graphql.operation", name = operation_name, requested);
                next.run_with_data(ctx, operation_name, data)
                    .instrument(span)
                    .await
            }
        };
        crate::error::attach_codes(&mut response);
        if !response.errors.is_empty() {
            let query = lock(&self.query);
            crate::nulls::propagate(
                &mut response,
                &ctx.schema_env.registry,
                &query,
                operation_name,
            );
        }
        response
            .extensions
            .insert("fanout".to_string(), report(&operation, requested));
        response
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn report(operation: &Operation, requested: u64) -> Value {
    let budget = operation.request().budget().snapshot();
    let mut map = async_graphql::indexmap::IndexMap::new();
    for (key, value) in [
        ("limit", budget.limit),
        ("used", budget.used),
        ("remaining", budget.remaining),
        ("operationReads", operation.reads()),
        ("requested", requested),
    ] {
        map.insert(async_graphql::Name::new(key), Value::from(value));
    }
    Value::Object(map)
}
