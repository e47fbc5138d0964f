//! CORS: which browser apps on other origins may call the endpoint.
//!
//! A browser sends a cross-origin `POST` with `Content-Type:
//! application/json` only after a preflight (`OPTIONS` with
//! `Access-Control-Request-*`) that the server answers with matching
//! `Access-Control-Allow-*` headers; it lets the page read any answer only
//! when it carries `Access-Control-Allow-Origin` for the page's origin.
//! [`cors_layer`] builds tower-http's `CorsLayer` from
//! `[http] cors_allowed_origins`: empty (the default) adds no header, so no
//! other origin can call the endpoint from a browser; a list allows exactly
//! those origins; `["*"]` any origin (never with credentials).
//!
//! Mount it outermost (`Router::layer`), outside the rate limiter: a
//! preflight is answered by the layer itself, costs no budget and is not
//! counted against the caller's rate.
//!
//! CORS guards what a page may *read*. What a page may *send* without a
//! preflight — a `text/plain`, form or multipart `POST` — is refused by the
//! HTTP integration itself (CSRF prevention, `protocol.rs`).

use http::{header, HeaderName, HeaderValue, Method};
use std::time::Duration;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The CORS layer for `[http] cors_allowed_origins`, or `None` when the
/// list is empty (no CORS headers at all).
///
/// ```
/// use fanout_budget::{config::HttpConfig, inbound::cors_layer};
///
/// let http = HttpConfig::default().cors_allowed_origins(["https://app.example"]);
/// let app: axum::Router = axum::Router::new()
///     .route("/graphql", axum::routing::post(|| async { "…" }))
///     .layer(tower::util::option_layer(cors_layer(&http)));
/// # drop(app);
/// ```
pub fn cors_layer(http: &crate::config::HttpConfig) -> Option<CorsLayer> {
    let origins = &http.cors_allowed_origins;
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        // Validated with the configuration; written as browsers send them.
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(&normalise(o)).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::CONTENT_TYPE,
                header::ACCEPT,
                header::AUTHORIZATION,
                HeaderName::from_static("apollo-require-preflight"),
                HeaderName::from_static("x-apollo-operation-name"),
                HeaderName::from_static("apollographql-client-name"),
                HeaderName::from_static("apollographql-client-version"),
            ])
            .expose_headers([
                header::RETRY_AFTER,
                HeaderName::from_static("ratelimit"),
                HeaderName::from_static("ratelimit-policy"),
                // `[http] cost_headers`: a page on a listed origin paces on them.
                HeaderName::from_static("x-cost-estimated"),
                HeaderName::from_static("x-cost-actual"),
                HeaderName::from_static("x-cost-max"),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

/// An origin as a browser sends it: lower case, without the scheme's
/// default port (`https://App.example:443` → `https://app.example`).
fn normalise(origin: &str) -> String {
    let origin = origin.to_ascii_lowercase();
    for (scheme, port) in [("https://", ":443"), ("http://", ":80")] {
        if origin.starts_with(scheme) {
            if let Some(bare) = origin.strip_suffix(port) {
                return bare.to_string();
            }
        }
    }
    origin
}

#[cfg(test)]
mod tests {
    #[test]
    fn origins_are_written_as_browsers_send_them() {
        for (configured, sent) in [
            ("https://App.Example", "https://app.example"),
            ("https://app.example:443", "https://app.example"),
            ("http://localhost:80", "http://localhost"),
            ("http://localhost:3000", "http://localhost:3000"),
            ("https://app.example:8443", "https://app.example:8443"),
        ] {
            assert_eq!(super::normalise(configured), sent);
        }
    }

    #[tokio::test]
    async fn an_allowed_page_may_read_the_limits_and_costs_headers() {
        use tower::{Layer, ServiceExt};
        let http =
            crate::config::HttpConfig::default().cors_allowed_origins(["https://app.example"]);
        let layer = super::cors_layer(&http).expect("an origin is listed");
        let service = layer.layer(tower::service_fn(
            |_: http::Request<axum::body::Body>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
            },
        ));
        let request = http::Request::post("/graphql")
            .header("origin", "https://app.example")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        let exposed = response.headers()["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .to_ascii_lowercase();
        for name in [
            "retry-after",
            "ratelimit",
            "x-cost-estimated",
            "x-cost-actual",
            "x-cost-max",
        ] {
            assert!(exposed.contains(name), "{name} not in {exposed}");
        }
    }
}
