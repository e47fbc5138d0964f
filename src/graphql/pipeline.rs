//! The per-operation pipeline, the one sequence every integration runs for
//! each operation of a request:
//!
//! 1. **admit** ([`Op::admit`]): the text is guarded — its kept parsed
//!    document and the guard's verdict kept with it (`document/memo.rs`),
//!    or parsed and checked (`document/guard.rs`: fragment cycles, the
//!    expanded size) — the operation it names found (over a
//!    `GET`, only a query: `NOT_A_QUERY`), its required variables present
//!    (`BAD_USER_INPUT`); a text that fails here never reaches
//!    async-graphql's own parser and validation;
//! 2. **price**: with a [`CostTable`](crate::cost::CostTable), the
//!    operation's worst case in reads (`cost/`), added to the request's
//!    `requested`; every operation counts at the batch's pricing barrier,
//!    a refused one at 0, so the rest never wait for it;
//! 3. **refuse, then reserve** ([`Op::run`]): once every operation of the
//!    batch is priced, all are refused together if their worst case exceeds
//!    the budget (`refuse_over_estimate`); then the batch reserves its reads
//!    on its client's read quota, once (`inbound/quota.rs`: a refusal stops
//!    the whole request, 429 `QUOTA_EXHAUSTED`);
//! 4. **run within the request's bounds**: the deadline (plus a short grace
//!    to answer the rest of the page) and the memory trip;
//! 5. **finish** (`finish.rs`): contract codes, `null`s put back, and
//!    `extensions.fanout`.
//!
//! [`FanoutGraphQL`](crate::FanoutGraphQL) admits each operation of the
//! batch it parsed, then runs them concurrently; the extension admits in
//! async-graphql's `prepare_request` hook and runs in its `execute` hook.

use super::finish::finish;
use super::operation_span::{Described, OperationSpan, Sent};
use crate::cost;
use crate::cost::schema_types::SchemaTypes;
use crate::document::cache::admit;
use crate::document::{guard, root_field};
use crate::engine::Engine;
use crate::error::{refused, stopped, OperationError};
use crate::request::{operation_data, FanoutRequest, Operation, OperationData};
use async_graphql::parser::types::{DocumentOperations, ExecutableDocument, OperationType};
use async_graphql::{Data, Name, Request, Response};
use std::future::Future;
use std::sync::Arc;

/// One operation of a request, admitted (or refused) and priced, with
/// what its answer needs once it ran.
pub(crate) struct Op {
    operation: Arc<Operation>,
    /// Why it is refused before it runs, if it is.
    refused: Option<OperationError>,
    /// The estimate, when a cost table priced the operation.
    requested: Option<u64>,
    /// The text that runs, kept once (shared with the extension's copy).
    query: Arc<str>,
    /// The `operationName` sent.
    name: Option<String>,
    /// The name of the operation that runs, as its document gives it:
    /// its span's `graphql.operation.name` ([`operation_name`]).
    span_name: Option<Name>,
    /// `query`, `mutation` or `subscription`, when the document names the
    /// operation to run.
    kind: Option<&'static str>,
    /// Whether its span carries its document (`telemetry.record_document`).
    record_document: bool,
}

/// An operation's handle is made, and kept its request's trace, as it is
/// admitted: it is let go when the operation is, whether it ran, was
/// refused, or its request was dropped before or while it ran (an
/// application may keep the handle: `operation_data`).
impl Drop for Op {
    fn drop(&mut self) {
        self.operation.trace_ended();
    }
}

impl Op {
    /// Steps 1 and 2 for `request`, an operation of `scope` (`prior`: a
    /// refusal found before, such as an unknown persisted query). On
    /// success the request carries the document async-graphql will run (a
    /// kept document is copied for it then, and only then), and the
    /// operation's handle the kept entry, whose validations the extension
    /// answers from.
    pub(crate) fn admit(
        engine: &Engine,
        types: &SchemaTypes,
        scope: &FanoutRequest,
        request: &mut Request,
        prior: Result<(), OperationError>,
    ) -> Op {
        let costs = engine.costs();
        let mut requested = costs.map(|_| 0);
        let max = engine.config().http.max_selections;
        let name = request.operation_name.as_deref();
        let mut kind = None;
        let mut span_name = None;
        let admitted = prior
            .and_then(|()| admit(engine.documents(), &request.query, max))
            .and_then(|(parsed, shape)| {
                let doc = parsed.doc();
                // A subscription selects one root field: one stream.
                if let Some(refusal) = root_field::check(doc) {
                    return Err(refusal);
                }
                let op = guard::operation(doc, name);
                span_name = operation_name(doc, name);
                kind = op.map(|op| match op.ty {
                    OperationType::Query => "query",
                    OperationType::Mutation => "mutation",
                    OperationType::Subscription => "subscription",
                });
                // A page on another site can make a browser send a GET
                // without asking first: only a query runs over one.
                if scope.queries_only() && op.is_some_and(|op| op.ty != OperationType::Query) {
                    return Err(OperationError::NotAQuery);
                }
                if let Some(message) =
                    op.and_then(|op| guard::missing_variable(op, &request.variables))
                {
                    return Err(OperationError::BadUserInput { message });
                }
                // `@listSize(requireOneSlicingArgument)`: a validation error.
                // A kept document is checked and priced from what it keeps.
                let variables = &request.variables;
                match parsed.kept() {
                    Some(kept) => {
                        cost::require_one_kept(kept, costs, types, &shape, variables, name)?;
                        requested = costs.map(|costs| {
                            cost::estimate_kept(kept, costs, types, &shape, variables, name)
                        });
                    }
                    None => {
                        cost::require_one_slicing_argument(costs, types, doc, variables, name)?;
                        requested = costs.map(|costs| {
                            cost::estimate(costs, types, doc, &shape, variables, name)
                        });
                    }
                }
                Ok(parsed)
            });
        scope.priced(requested.unwrap_or(0));
        let operation = scope.operation();
        let mut query = None;
        let refused = match admitted {
            Ok(parsed) => {
                if let Some(kept) = parsed.kept() {
                    // The kept text, shared: not copied per operation.
                    query = Some(kept.text.clone());
                    operation.set_document(kept.clone());
                }
                // async-graphql takes the document: the one copy.
                request.set_parsed_query(parsed.into_owned());
                None
            }
            Err(refusal) => Some(refusal),
        };
        Op {
            operation,
            refused,
            requested,
            query: query.unwrap_or_else(|| request.query.as_str().into()),
            name: request.operation_name.clone(),
            span_name,
            kind,
            record_document: engine.config().telemetry.record_document,
        }
    }

    /// Why the operation is refused before it runs, if it is.
    pub(crate) fn refusal(&self) -> Option<&OperationError> {
        self.refused.as_ref()
    }

    /// The text that runs.
    pub(crate) fn text(&self) -> Arc<str> {
        self.query.clone()
    }

    /// The operation's worst case in reads, when a cost table priced it.
    pub(crate) fn requested(&self) -> Option<u64> {
        self.requested
    }

    /// The operation's handle.
    pub(crate) fn operation(&self) -> &Arc<Operation> {
        &self.operation
    }

    /// Puts the operation's handle, then what the app adds, into `data`
    /// (the data the operation runs with).
    pub(crate) fn data(&self, data: &mut Data, app: Option<&OperationData>) {
        operation_data(&self.operation, data, app);
    }

    /// Steps 3 to 5 for one event of a subscription (or a query sent over a
    /// WebSocket) admitted as `self`: `event` is the event's own scope,
    /// opened on the connection, and `operation` its handle; `execute` runs
    /// the event with `operation` in its data. The event reserves on its
    /// client's read quota (when it has one), runs within its scope's
    /// bounds, and is finished like an operation.
    ///
    /// An `async` block, not an `async fn`: an `async fn` keeps each argument
    /// twice in its future (as it came, and as the body's local), `execute`
    /// among them.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub(crate) fn run_event<'a>(
        &'a self,
        event: &'a FanoutRequest,
        operation: &'a Operation,
        types: &'a SchemaTypes,
        execute: impl Future<Output = Response> + 'a,
    ) -> impl Future<Output = Response> + 'a {
        async move {
            // The event's reads are its request's until its future ends, even
            // refused or cancelled while it waits.
            let _ends = operation.trace_ends();
            let mut response = match event.reserve().await {
                Some(rejection) => stopped(&rejection),
                None => {
                    super::server_span::event(async {
                        let span = OperationSpan::event(&self.described());
                        span.trace(operation);
                        let response = event.within_bounds(span.around(execute)).await;
                        self.record(operation, &span);
                        response
                    })
                    .await
                }
            };
            let name = self.name.as_deref();
            finish(
                &mut response,
                operation,
                self.requested,
                types,
                &self.query,
                name,
            );
            response
        }
    }

    /// What the operation's span says of it as it opens
    /// (`operation_span.rs`).
    fn described(&self) -> Described<'_> {
        Described {
            kind: self.kind,
            name: self.span_name.as_deref(),
            requested: self.requested,
            document: self.record_document.then_some(&*self.query),
        }
    }

    /// What `operation` (this one's handle, or an event's) sent, in the metrics (`fanout_operation_reads`,
    /// `fanout_operation_delta`) and on its span: `fanout.reads`,
    /// `fanout.cache_hits`, and `fanout.delta` (requested − reads) when it
    /// was priced.
    fn record(&self, operation: &Operation, span: &OperationSpan) {
        let reads = operation.reads();
        if let Some(kind) = self.kind {
            let delta = self
                .requested
                .map(|requested| requested as f64 - reads as f64);
            (operation.request().metrics()).operation(kind, reads, delta);
            #[cfg(feature = "otel")]
            crate::telemetry::instruments(|i| i.operation(kind, reads, delta));
        }
        let int = super::server_span::int;
        span.record(&Sent {
            reads,
            cache_hits: operation.cache_hits(),
            would_refuse: operation.request().budget().would_refuse(),
            delta: self
                .requested
                .map(|requested| int(requested).saturating_sub(int(reads))),
        });
    }

    /// Steps 3 to 5: refused at the batch's barrier (or before, at step 1),
    /// else `execute` — the operation running with [`data`](Self::data) —
    /// within the request's bounds; then finished.
    ///
    /// An `async` block, not an `async fn`: an `async fn` keeps each argument
    /// twice in its future (as it came, and as the body's local) — the
    /// operation (160 bytes) and `execute` here.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub(crate) fn run<'a>(
        mut self,
        types: &'a SchemaTypes,
        execute: impl Future<Output = Response> + 'a,
    ) -> impl Future<Output = Response> + 'a {
        async move {
            let scope = self.operation.request();
            let refusal = scope.refusal().await.or(self.refused.take());
            let mut response = match refusal {
                Some(refusal) => refused(&refusal),
                None => match scope.reserve().await {
                    Some(rejection) => stopped(&rejection),
                    None => {
                        let span = OperationSpan::open(&self.described());
                        span.trace(&self.operation);
                        let response = scope.within_bounds(span.around(execute)).await;
                        self.record(&self.operation, &span);
                        response
                    }
                },
            };
            let name = self.name.as_deref();
            finish(
                &mut response,
                &self.operation,
                self.requested,
                types,
                &self.query,
                name,
            );
            response
        }
    }
}

/// The name of the operation of `doc` that `requested` (the `operationName`
/// sent) selects, as the document spells it: the operation's own name
/// whether or not the client sent it (a document of one named operation),
/// and none when it names no operation of the document or the operation is
/// anonymous. A span carries this, never what a client wrote in
/// `operationName`.
fn operation_name(doc: &ExecutableDocument, requested: Option<&str>) -> Option<Name> {
    let DocumentOperations::Multiple(ops) = &doc.operations else {
        return None;
    };
    match requested {
        Some(requested) => ops.get_key_value(requested).map(|(name, _)| name.clone()),
        None if ops.len() == 1 => ops.keys().next().cloned(),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::operation_name;

    fn name(query: &str, requested: Option<&str>) -> Option<String> {
        let doc = async_graphql::parser::parse_query(query).unwrap();
        operation_name(&doc, requested).map(|name| name.to_string())
    }

    #[test]
    fn the_span_names_the_operation_the_document_runs() {
        assert_eq!(name("query Q { a }", None).as_deref(), Some("Q"));
        assert_eq!(name("query Q { a }", Some("Q")).as_deref(), Some("Q"));
        assert_eq!(
            name("query Q { a } query R { b }", Some("R")).as_deref(),
            Some("R")
        );
        // No operation of the document, or which one is not said.
        assert_eq!(name("query Q { a }", Some("Other")), None);
        assert_eq!(name("query Q { a } query R { b }", None), None);
        // An anonymous operation has no name, whatever was sent.
        assert_eq!(name("{ a }", None), None);
        assert_eq!(name("{ a }", Some("Q")), None);
    }
}
