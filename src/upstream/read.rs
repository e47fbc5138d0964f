//! A read and its answer: what a resolver hands the acquisition point and
//! what it gets back.

use crate::error::FanoutError;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::OnceCell;

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

/// The longest message [`UpstreamResponse::error`] keeps, in bytes.
pub const MAX_MESSAGE: usize = 256;

/// What the upstream answered (any status): status, headers, and the body.
///
/// One response is shared by every caller that de-duplication answers with
/// it, for the rest of the inbound request; [`derived`](Self::derived)
/// lets them share what is made of it too (a parsed body, an index).
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
    /// What `derived` made of this response, once.
    derived: OnceCell<Arc<dyn Any + Send + Sync>>,
}

impl UpstreamResponse {
    /// A response (what a [`Transport`](crate::Transport) returns).
    pub fn new(
        host: impl Into<String>,
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    ) -> Self {
        Self {
            host: host.into(),
            status,
            headers,
            body,
            derived: OnceCell::new(),
        }
    }

    /// What `derive` makes of this response, made **once** for everyone the
    /// response is shared with: the first caller runs `derive`, callers
    /// arriving meanwhile wait for it, later ones get the same `Arc` — the
    /// value or the error. So N fields that read the same URL in one request
    /// cost one read *and* one parse, not N parses of the same body (which,
    /// with nothing to wait on, would also run without yielding to the
    /// request's deadline). If the first caller is cancelled, the next one
    /// derives instead.
    ///
    /// One derived type per response: asking for another type runs `derive`
    /// without keeping its result. `derive` must not read this same response
    /// again (it would wait for itself).
    ///
    /// ```
    /// # use fanout_budget::{FanoutError, UpstreamResponse};
    /// # use http::{HeaderMap, StatusCode};
    /// # tokio_test_block_on(async {
    /// let response = UpstreamResponse::new("registry:5000", StatusCode::OK, HeaderMap::new(), r#"["a","b"]"#.into());
    /// let parse = || async { response.json::<Vec<String>>() };
    /// let first = response.derived(parse).await?;
    /// let again = response
    ///     .derived::<Vec<String>, FanoutError, _, _>(|| async { unreachable!("made once") })
    ///     .await?;
    /// assert!(std::sync::Arc::ptr_eq(&first, &again));
    /// # Ok::<_, FanoutError>(())
    /// # }).unwrap();
    /// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    /// # }
    /// ```
    pub async fn derived<T, E, F, Fut>(&self, derive: F) -> Result<Arc<T>, E>
    where
        T: Send + Sync + 'static,
        E: Clone + Send + Sync + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut derive = Some(derive);
        let kept = self
            .derived
            .get_or_init(|| async {
                let derive = derive.take().expect("derived once");
                let made: Result<Arc<T>, E> = derive().await.map(Arc::new);
                Arc::new(made) as Arc<dyn Any + Send + Sync>
            })
            .await;
        match (kept.downcast_ref::<Result<Arc<T>, E>>(), derive) {
            (Some(made), _) => made.clone(),
            // Another type was derived first: make this one, unkept.
            (None, Some(derive)) => derive().await.map(Arc::new),
            (None, None) => unreachable!("the value just derived has this type"),
        }
    }

    /// An `UPSTREAM_ERROR` for this response, with its status.
    ///
    /// The message is cut to [`MAX_MESSAGE`] bytes: it may quote the
    /// upstream's own data (a parser's error names the value it choked on),
    /// and one error can be copied into every field that shares the read.
    pub fn error(&self, message: impl Into<String>) -> FanoutError {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        FanoutError::Upstream {
            host: self.host.clone(),
            status: Some(self.status.as_u16()),
            message,
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
