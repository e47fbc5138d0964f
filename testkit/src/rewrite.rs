//! An extension that swaps one query text for another before it is parsed,
//! as a persisted-query lookup does: what the engine sees is the text that
//! runs, not the text the client sent.

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest,
};
use async_graphql::{Request, ServerResult};
use std::sync::Arc;

/// Replaces the query text `from` with `to` (register it after
/// `FanoutExtension::new(&engine)`, as a persisted-query extension would be).
#[derive(Clone, Debug)]
pub struct Rewrite {
    /// The text sent.
    pub from: &'static str,
    /// The text that runs instead.
    pub to: String,
}

impl ExtensionFactory for Rewrite {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(self.clone())
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for Rewrite {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        mut request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        if request.query == self.from {
            request.query = self.to.clone();
        }
        next.run(ctx, request).await
    }
}
