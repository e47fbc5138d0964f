//! How resolvers reach the engine from async-graphql's [`Context`]: the
//! operation's handle the integrations put into its data
//! ([`Operation`](crate::request::Operation)), and through it the
//! request's scope and the acquisition point.

use crate::read::Upstream;
use crate::request::{FanoutRequest, Operation};
use async_graphql::Context;
use std::sync::Arc;

/// How resolvers reach the engine from an async-graphql [`Context`].
///
/// ```
/// use async_graphql::{Context, Object};
/// use fanout_budget::FanoutContext;
///
/// struct Query;
///
/// #[Object]
/// impl Query {
///     /// Reads left to this inbound request.
///     async fn reads_left(&self, ctx: &Context<'_>) -> async_graphql::Result<u64> {
///         Ok(ctx.fanout_request()?.budget().remaining())
///     }
/// }
/// ```
pub trait FanoutContext {
    /// The upstream handle for the current request and operation.
    ///
    /// Fails only when the operation runs outside the engine: served neither
    /// by [`FanoutGraphQL`](crate::FanoutGraphQL) nor with the
    /// [`FanoutExtension`](crate::FanoutExtension) mounted.
    fn upstream(&self) -> async_graphql::Result<Upstream<'_>>;

    /// The current inbound HTTP request's fan-out scope.
    fn fanout_request(&self) -> async_graphql::Result<&FanoutRequest>;

    /// The current operation's handle, owned (`Clone + Send + Sync +
    /// 'static`): for work that outlives the resolver's borrow — a
    /// `DataLoader`'s loader, a spawned task. Its reads go through the same
    /// acquisition point and count for the request (`used`) and for this
    /// operation (`operationReads`), in its trace even from a task of their
    /// own (`telemetry`).
    fn fanout_operation(&self) -> async_graphql::Result<Arc<Operation>>;
}

impl FanoutContext for Context<'_> {
    fn upstream(&self) -> async_graphql::Result<Upstream<'_>> {
        Ok(operation(self)?.upstream())
    }

    fn fanout_request(&self) -> async_graphql::Result<&FanoutRequest> {
        Ok(operation(self)?.request())
    }

    fn fanout_operation(&self) -> async_graphql::Result<Arc<Operation>> {
        self.data_opt::<Arc<Operation>>()
            .cloned()
            .ok_or_else(|| NO_SCOPE.into())
    }
}

const NO_SCOPE: &str = "no fanout-budget scope: serve the schema with FanoutGraphQL or mount \
    FanoutExtension::new(&engine); in a subscription's own stream, read through a scope of its \
    connection (ctx.data::<FanoutConnection>()?.open_event()) or a SharedPoll";

fn operation<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a Operation> {
    ctx.data_opt::<Arc<Operation>>()
        .map(|op| &**op)
        .ok_or_else(|| NO_SCOPE.into())
}
