//! A read and its answer: what a resolver hands the acquisition point and
//! what it gets back.

use crate::error::FanoutError;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

/// One upstream GET: a URL and, optionally, an `Accept` header.
#[derive(Clone, Debug)]
pub struct Read {
    pub(super) url: reqwest::Url,
    pub(super) accept: Option<HeaderValue>,
}

impl Read {
    /// A GET of `url`.
    pub fn get(url: reqwest::Url) -> Self {
        Self { url, accept: None }
    }

    /// Sends `Accept: accept` (part of the read's identity for de-duplication).
    ///
    /// Build a fixed value once, not per read (checking a long media-type
    /// list costs more than the engine's whole read path):
    ///
    /// ```
    /// use fanout_budget::Read;
    /// use http::HeaderValue;
    ///
    /// static MANIFEST: HeaderValue = HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json");
    /// let url = "http://registry.local:5000/v2/acme/app/manifests/latest".parse().unwrap();
    /// let read = Read::get(url).accept(MANIFEST.clone());
    /// assert_eq!(read.accept_header(), Some(&MANIFEST));
    /// ```
    pub fn accept(mut self, accept: HeaderValue) -> Self {
        self.accept = Some(accept);
        self
    }

    /// The URL.
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// The `Accept` header, if any.
    pub fn accept_header(&self) -> Option<&HeaderValue> {
        self.accept.as_ref()
    }

    /// The URL and the `Accept` header, for a transport sending the read.
    pub fn into_parts(self) -> (reqwest::Url, Option<HeaderValue>) {
        (self.url, self.accept)
    }
}

/// A URL's `host:port`, written out only if it is displayed (a span field).
pub(super) struct HostName<'a>(pub(super) &'a reqwest::Url);

impl std::fmt::Display for HostName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.host_str().unwrap_or(""))?;
        match self.0.port_or_known_default() {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// What the upstream answered (any status): status, headers, and the body.
#[derive(Debug)]
pub struct UpstreamResponse {
    /// `host:port` that answered.
    pub host: String,
    /// The HTTP status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl UpstreamResponse {
    /// An `UPSTREAM_ERROR` for this response, with its status.
    pub fn error(&self, message: impl Into<String>) -> FanoutError {
        FanoutError::Upstream {
            host: self.host.clone(),
            status: Some(self.status.as_u16()),
            message: message.into(),
        }
    }

    /// The body as JSON, or `UPSTREAM_ERROR` if it is not the expected JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, FanoutError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| self.error(format!("unexpected response body: {e}")))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}
