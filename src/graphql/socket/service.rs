//! [`FanoutSubscription`]: the WebSocket endpoint on its own, for an app
//! that serves its queries with a stock service under
//! [`FanoutLayer`](crate::FanoutLayer).

use crate::engine::Engine;
use crate::error::Rejection;
use async_graphql::Executor;
use axum::body::Body;
use axum::response::Response as HttpResponse;
use futures::future::BoxFuture;
use std::convert::Infallible;
use std::task::{Context, Poll};

/// Subscriptions over WebSocket as a `tower::Service`, under the engine's
/// bounds: what [`FanoutGraphQL`](crate::FanoutGraphQL) serves to an upgrade
/// request, for an app whose queries go through a stock service under
/// [`FanoutLayer`](crate::FanoutLayer). Mount it on a path of its own
/// beside the stock service (a client's WebSocket URL):
///
/// ```
/// use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
/// use async_graphql_axum::GraphQL;
/// use fanout_budget::{Config, Engine, FanoutExtension, FanoutLayer};
/// use fanout_budget::graphql::FanoutSubscription;
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
///     .extension(FanoutExtension::new(&engine))
///     .finish();
/// let app: axum::Router = axum::Router::new()
///     .route_service("/graphql", GraphQL::new(schema.clone()))
///     .route_service("/graphql/ws", FanoutSubscription::new(schema, engine.clone()))
///     .layer(FanoutLayer::new(engine));
/// # drop(app);
/// ```
///
/// A request that is not a WebSocket upgrade is answered 400.
#[derive(Clone)]
pub struct FanoutSubscription<E> {
    executor: E,
    engine: Engine,
}

impl<E> std::fmt::Debug for FanoutSubscription<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutSubscription")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl<E: Executor> FanoutSubscription<E> {
    /// Serves `executor`'s subscriptions (its schema mounts
    /// [`FanoutExtension`](crate::FanoutExtension)) under `engine`'s bounds.
    pub fn new(executor: E, engine: Engine) -> Self {
        Self { executor, engine }
    }
}

impl<E: Executor> tower::Service<http::Request<Body>> for FanoutSubscription<E> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<HttpResponse, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (executor, engine) = (self.executor.clone(), self.engine.clone());
        Box::pin(async move {
            if !super::upgrade::is_upgrade(&request) {
                return Ok(Rejection::BadRequest {
                    message: "this endpoint serves GraphQL over WebSocket only".into(),
                }
                .unread());
            }
            Ok(super::upgrade::upgrade(executor, engine, request).await)
        })
    }
}
