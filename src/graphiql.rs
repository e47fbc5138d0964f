//! GraphiQL, served by the binary itself (STUB: to be replaced by the
//! vendored, offline page).

/// The page for the endpoint at `endpoint` (a path such as `/graphql`); its
/// assets are at `{endpoint}/graphiql/{name}`.
pub(crate) fn page(endpoint: &str) -> String {
    async_graphql::http::GraphiQLSource::build()
        .endpoint(endpoint)
        .finish()
}

/// The page's `Content-Security-Policy`.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self' 'unsafe-inline' https:";

/// One of the page's assets: its content type and bytes.
pub(crate) fn asset(name: &str) -> Option<(&'static str, &'static [u8])> {
    let _ = name;
    None
}
