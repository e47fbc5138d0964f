//! Per-row degradation: a failed read nulls its own field, and only that.
//!
//! GraphQL says a nullable field whose resolver fails is `null`, with the
//! error at the field's path. async-graphql 7.2 instead drops the key from
//! the parent object when a resolver returns `Err` — the row loses the field
//! entirely. [`OrNull::or_null`] does it the spec's way: it reports the error
//! at the current field's path (list indices as integers) through the
//! context, and returns `None`, so the field is present and `null`.
//!
//! ```ignore
//! async fn manifest(&self, ctx: &Context<'_>) -> Option<Manifest> {
//!     self.read_manifest(ctx).await.or_null(ctx)
//! }
//! ```

use async_graphql::Context;

/// Turns a resolver's `Result` into a nullable field value plus a located error.
pub trait OrNull<T> {
    /// `Some(value)` on success; on error, the error is added at this
    /// field's path and the field resolves to `null`.
    fn or_null(self, ctx: &Context<'_>) -> Option<T>;
}

impl<T, E: Into<async_graphql::Error>> OrNull<T> for Result<T, E> {
    fn or_null(self, ctx: &Context<'_>) -> Option<T> {
        match self {
            Ok(value) => Some(value),
            Err(err) => {
                let err = err.into().into_server_error(ctx.item.pos);
                ctx.add_error(ctx.set_error_path(err));
                None
            }
        }
    }
}
