//! The transport: how a read that passed the acquisition point is sent.
//! The last step of the read path; it knows nothing of budgets or caps.
//!
//! [`HttpTransport`] (the default) sends the GET with a shared, pooled
//! `reqwest::Client` and reads the body up to a byte cap, so an oversized or
//! endless upstream body becomes `UPSTREAM_ERROR` instead of memory. The
//! [`Transport`] trait lets tests and benchmarks measure the engine without a
//! network, and lets an application bring its own client stack. The
//! acquisition point owns the timeout; a transport only sends.

use super::message::{Read, UpstreamResponse};
use crate::error::ReadError;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http::HeaderName;

/// Sends one read.
///
/// ```
/// use fanout_budget::{Read, ReadError, UpstreamResponse, read::Transport};
/// use futures::future::BoxFuture;
///
/// /// Answers every read with `{}`.
/// #[derive(Debug)]
/// struct Canned;
///
/// impl Transport for Canned {
///     fn fetch<'a>(&'a self, _read: Read, host: &'a str) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
///         let response = UpstreamResponse::new(host, http::StatusCode::OK, Default::default(), "{}".into());
///         Box::pin(async move { Ok(response) })
///     }
/// }
/// ```
pub trait Transport: Send + Sync + 'static {
    /// The response to `read`, sent to `host` (`host:port`), whatever its
    /// status. The read is the transport's to consume (its URL moves into
    /// the request, not copied).
    fn fetch<'a>(
        &'a self,
        read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>>;
}

/// The default transport: reqwest, with a cap on the bytes read per response.
///
/// ```
/// use fanout_budget::{Config, Engine, read::HttpTransport};
/// use std::sync::Arc;
///
/// let client = reqwest::Client::builder()
///     // The engine follows redirects itself, charging each hop.
///     .redirect(reqwest::redirect::Policy::none())
///     .build()
///     .unwrap();
/// let transport = Arc::new(HttpTransport::new(client, 1 << 20));
/// let engine = Engine::builder(Config::default()).transport(transport).build();
/// # drop(engine);
/// ```
#[derive(Debug)]
pub struct HttpTransport {
    client: reqwest::Client,
    max_response_bytes: usize,
}

impl HttpTransport {
    /// Sends with `client`; bodies over `max_response_bytes` are refused.
    pub fn new(client: reqwest::Client, max_response_bytes: usize) -> Self {
        Self {
            client,
            max_response_bytes,
        }
    }
}

impl Transport for HttpTransport {
    fn fetch<'a>(
        &'a self,
        read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        Box::pin(fetch(self, read, host))
    }
}

/// The request itself: its headers, then the answer's body up to the byte cap.
async fn fetch(
    transport: &HttpTransport,
    read: Read,
    host: &str,
) -> Result<UpstreamResponse, ReadError> {
    let transport_error = |message: String| ReadError::Upstream {
        host: host.to_string(),
        status: None,
        message,
    };
    let Read {
        method,
        url,
        headers,
        body,
        ..
    } = read;
    // The trace's context, when spans are exported (`telemetry`): the
    // headers alone, no map built for them; written in place of any the
    // read carries, as `telemetry::inject_traceparent` writes them.
    #[cfg(feature = "otel")]
    let context = crate::telemetry::current_context();
    #[cfg(not(feature = "otel"))]
    let context: Option<(http::HeaderValue, Option<http::HeaderValue>)> = None;
    let mut request = transport.client.request(method, url.clone());
    for (name, value) in headers {
        if context.is_some() && (name == "traceparent" || name == "tracestate") {
            continue;
        }
        request = request.header(name, value);
    }
    if let Some((traceparent, tracestate)) = context {
        request = request.header(HeaderName::from_static("traceparent"), traceparent);
        if let Some(tracestate) = tracestate {
            request = request.header(HeaderName::from_static("tracestate"), tracestate);
        }
    }
    if !body.is_empty() {
        request = request.body(body);
    }
    let mut response = request
        .send()
        .await
        .map_err(|e| transport_error(error_chain(&e)))?;
    if *response.url() != url {
        // Hops the engine did not see, so did not charge.
        return Err(transport_error(format!(
            "the HTTP client followed a redirect to {} by itself; build it with \
             redirect::Policy::none() (the engine follows redirects, charging each hop)",
            response.url()
        )));
    }
    let status = response.status();
    let cap = transport.max_response_bytes;
    let too_large = || ReadError::Upstream {
        host: host.to_string(),
        status: Some(status.as_u16()),
        message: format!("response body larger than {cap} bytes"),
    };
    if response
        .content_length()
        .is_some_and(|len| len > cap as u64)
    {
        return Err(too_large());
    }
    // The common answer is one chunk: kept as it is, not copied. Only a
    // body in several chunks is gathered into one buffer.
    let mut first = Bytes::new();
    let mut gathered: Option<BytesMut> = None;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| transport_error(error_chain(&e)))?
    {
        let so_far = gathered.as_ref().map_or(first.len(), BytesMut::len);
        if so_far + chunk.len() > cap {
            return Err(too_large());
        }
        match &mut gathered {
            Some(buffer) => buffer.extend_from_slice(&chunk),
            None if first.is_empty() => first = chunk,
            None => {
                let expected = response.content_length().unwrap_or(0) as usize;
                let needed = so_far + chunk.len();
                let mut buffer = BytesMut::with_capacity(expected.max(needed).min(cap));
                buffer.extend_from_slice(&first);
                buffer.extend_from_slice(&chunk);
                gathered = Some(buffer);
            }
        }
    }
    let body = gathered.map_or(first, BytesMut::freeze);
    Ok(UpstreamResponse::new(
        host,
        status,
        std::mem::take(response.headers_mut()),
        body,
    ))
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
