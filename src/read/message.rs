//! The read's vocabulary: a [`Read`] (what is sent) and an
//! [`UpstreamResponse`] (what came back), and what makes two reads the same
//! read (`ReadKey`). Data only: every step of the read path names these,
//! and this file names no step.

mod key;

pub(crate) use key::{KeyHash, KeyView, ReadKey};

use crate::error::ReadError;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use std::any::Any;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::OnceCell;

/// One upstream request: a method, a URL, headers and a body.
///
/// A read's identity for de-duplication is its method, URL and headers: a
/// `GET` or `HEAD` is de-duplicated with every identical one of the inbound
/// request (headers that change the answer — `Accept`, `Authorization` —
/// tell reads apart). Any other method is sent every time, unless the
/// caller names the answer with [`dedup_key`](Self::dedup_key).
///
/// ```
/// use fanout_budget::Read;
/// use http::{header, HeaderValue, Method};
///
/// // A GraphQL subgraph answering a query: POST, de-duplicated by its text.
/// let url: fanout_budget::reqwest::Url = "http://books.local/graphql".parse().unwrap();
/// let query = r#"{"query":"{ book(id: 1) { title } }"}"#;
/// let read = Read::new(Method::POST, url)
///     .header(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))
///     .header(header::AUTHORIZATION, HeaderValue::from_static("Bearer s3cret"))
///     .body(query)
///     .dedup_key(query);
/// assert_eq!(read.method(), Method::POST);
/// assert_eq!(read.body_bytes(), query.as_bytes());
/// ```
#[derive(Clone, Debug)]
pub struct Read {
    pub(crate) method: http::Method,
    pub(crate) url: reqwest::Url,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
    pub(crate) key: Option<Box<str>>,
    /// Whether and how long the engine's cache may keep its answer: held
    /// in the read (16 bytes), so that a read the cache answers allocates
    /// nothing beyond its URL.
    pub(crate) keep: Keep,
    /// What few reads carry, boxed: a read is moved at every level of the
    /// read path, and most carry none of it.
    pub(crate) extras: Option<Box<Extras>>,
}

/// Whether the engine's cache may keep a read's answer (`read/cache.rs`),
/// and whether it was looked at for the read already.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Not declared: kept only as its host's headers allow.
    #[default]
    Undeclared,
    /// Its answer never changes ([`Read::immutable`]).
    Forever,
    /// Its answer may be reused this long ([`Read::fresh_for`]; zero: not
    /// kept).
    For(std::time::Duration),
    /// The cache was looked at for it already: not again.
    Done,
}

/// What a read may also say of itself.
#[derive(Clone, Debug, Default)]
pub(crate) struct Extras {
    /// The authorization scope the read needs (`read/auth.rs`).
    pub(crate) scope: Option<Box<str>>,
    /// The SHA-256 (lowercase hex) its body must have (`read/cache.rs`).
    pub(crate) sha256: Option<Box<str>>,
}

impl Read {
    /// A GET of `url`.
    pub fn get(url: reqwest::Url) -> Self {
        Self::new(http::Method::GET, url)
    }

    /// A `method` request to `url`, with no headers and no body yet.
    pub fn new(method: http::Method, url: reqwest::Url) -> Self {
        Self {
            method,
            url,
            headers: Vec::new(),
            body: Bytes::new(),
            key: None,
            keep: Keep::Undeclared,
            extras: None,
        }
    }

    fn extras(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// The token scope it names ([`scope`](Self::scope)).
    pub(crate) fn scope_named(&self) -> Option<&str> {
        self.extras.as_ref()?.scope.as_deref()
    }

    /// The SHA-256 it names (lowercase hex), if any.
    pub(crate) fn sha256_named(&self) -> Option<&str> {
        self.extras.as_ref()?.sha256.as_deref()
    }

    /// Whether it is declared immutable or names its SHA-256.
    pub(crate) fn is_checked(&self) -> bool {
        matches!(self.keep, Keep::Forever | Keep::For(_)) || self.sha256_named().is_some()
    }

    /// How long its answer may be kept for others: `Some(None)` for ever
    /// (immutable), `Some(Some(ttl))` that long, `None` not at all.
    pub(crate) fn keep_for(&self) -> Option<Option<std::time::Duration>> {
        match self.keep {
            Keep::Forever => Some(None),
            Keep::For(ttl) if !ttl.is_zero() => Some(Some(ttl)),
            _ => None,
        }
    }

    /// Its identity, owned: the key its request's identical reads share
    /// (`dedup.rs`), or `None` — it is never shared.
    pub(crate) fn identity(&self) -> Option<ReadKey> {
        (self.is_safe() || self.key.is_some()).then(|| self.key_view(None).to_owned())
    }

    /// Its identity, borrowed, with whom the credentials the engine sends
    /// to its upstream belong to (the engine cache's key, `cache.rs`).
    pub(crate) fn key_view<'a>(&'a self, credential: Option<&'a str>) -> KeyView<'a> {
        let (headers, body) = (&self.headers[..], &self.body);
        KeyView::new(
            &self.method,
            self.url.as_str(),
            (headers, body),
            self.key.as_deref(),
            credential,
        )
    }

    /// Whether the engine's cache was looked at for it already.
    pub(crate) fn cache_done(&self) -> bool {
        self.keep == Keep::Done
    }

    /// Takes its check (immutable, SHA-256) off, and marks the cache as
    /// looked at: the SHA-256 it named.
    pub(crate) fn take_check(&mut self) -> Option<Box<str>> {
        self.keep = Keep::Done;
        self.extras.as_mut()?.sha256.take()
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
    pub fn accept(self, accept: HeaderValue) -> Self {
        self.header(http::header::ACCEPT, accept)
    }

    /// Sends header `name: value` too (part of the read's identity).
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Sends `body`.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// De-duplicates this read with every other read of the inbound request
    /// given the same `key` (and the same method and URL), whatever its
    /// method: say that `key` names the answer (a query's text, a search).
    pub fn dedup_key(mut self, key: impl Into<Box<str>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Names the token scope this read needs from an upstream that uses
    /// bearer tokens (`repository:acme/app:pull` for a registry), so a token
    /// kept for that scope is sent with the read at once: the read costs one
    /// request, not a challenge, a token fetch and a retry. Without it, a
    /// token is sent up front only where the upstream's challenge names no
    /// scope. Not part of the read's identity (the token sent is).
    pub fn scope(mut self, scope: impl Into<Box<str>>) -> Self {
        self.extras().scope = Some(scope.into());
        self
    }

    /// Declares the answer immutable (content addressed by a digest, a
    /// versioned asset): a `2xx` answer to this `GET` is kept in the
    /// engine's cache (`upstream.cache_bytes`) and answers every identical
    /// read of any inbound request — same URL, headers and credentials —
    /// without a send, costing no read (reported as `cacheHits`).
    pub fn immutable(mut self) -> Self {
        // A read the cache was looked at for stays one.
        if self.keep != Keep::Done {
            self.keep = Keep::Forever;
        }
        self
    }

    /// Lets its answer be reused by any identical read of any inbound
    /// request for `ttl` after it was read (a staleness the caller accepts:
    /// a tag's digest, a listing): kept in the engine's cache as an
    /// [`immutable`](Self::immutable) answer is, for `ttl` only. Zero: not
    /// kept.
    pub fn fresh_for(mut self, ttl: std::time::Duration) -> Self {
        // Immutable stays immutable, as it always did; a read the cache was
        // looked at for stays one.
        if !matches!(self.keep, Keep::Forever | Keep::Done) {
            self.keep = Keep::For(ttl);
        }
        self
    }

    /// The SHA-256 the body must have (`sha256:` prefix optional; hex): a
    /// body that does not match is this read's `UPSTREAM_ERROR`, and is
    /// never kept. For content addressed by its digest, with
    /// [`immutable`](Self::immutable).
    pub fn sha256(mut self, digest: &str) -> Self {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.extras().sha256 = Some(hex.to_ascii_lowercase().into());
        self
    }

    /// The method.
    pub fn method(&self) -> http::Method {
        self.method.clone()
    }

    /// The URL.
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// The headers, in the order they were added.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The `Accept` header, if any.
    pub fn accept_header(&self) -> Option<&HeaderValue> {
        self.headers
            .iter()
            .find_map(|(name, value)| (name == http::header::ACCEPT).then_some(value))
    }

    /// The body (empty for none).
    pub fn body_bytes(&self) -> &Bytes {
        &self.body
    }

    /// Whether reads are de-duplicated without a key: `GET` and `HEAD`
    /// answer the same to the same request.
    pub(crate) fn is_safe(&self) -> bool {
        matches!(self.method, http::Method::GET | http::Method::HEAD)
    }
}

/// What the upstream answered (any status): status, headers, and the body.
///
/// One response is shared by every caller that de-duplication answers with
/// it, for the rest of the inbound request; [`derived`](Self::derived)
/// lets them share what is made of it too (a parsed body, an index).
///
/// The engine's cache ([`Read::immutable`], [`Read::fresh_for`]) keeps the
/// response's parts, never what was derived of it: each inbound request
/// that the cache answers gets a response of its own (sharing the body's
/// bytes), and derives on it for itself — so an entry holds what the cache
/// weighed, however much a reader makes of it. A reader that finds an
/// answer unusable says so by making its error with
/// [`error`](Self::error) (as [`json`](Self::json) does for a body that is
/// not the expected JSON): the cache never answers with it again.
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
    /// Set when a reader found it unusable ([`error`](Self::error)); shared
    /// with every copy the cache makes of it, made when first asked for.
    unusable: OnceLock<Arc<AtomicBool>>,
}

impl UpstreamResponse {
    /// The longest message [`error`](Self::error) keeps, in bytes.
    pub const MAX_MESSAGE: usize = 256;

    /// A response (what a [`Transport`](crate::read::Transport) returns).
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
            unusable: OnceLock::new(),
        }
    }

    /// The same answer as a response of its own: the same parts (the
    /// body's bytes shared), nothing derived yet, and unusable whenever
    /// this one is found unusable, or the copy is.
    pub(crate) fn copy(&self) -> Self {
        Self {
            host: self.host.clone(),
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
            derived: OnceCell::new(),
            unusable: OnceLock::from(self.unusable_flag().clone()),
        }
    }

    /// A [`copy`](Self::copy) whose body and header values have allocations
    /// of their own, exactly their length: what the engine's cache keeps (a
    /// body or a header value taken from the transport may be a slice of
    /// its read buffer, which it would keep whole).
    pub(crate) fn compact(&self) -> Self {
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            let mut own =
                HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
            own.set_sensitive(value.is_sensitive());
            headers.append(name.clone(), own);
        }
        Self {
            body: Bytes::copy_from_slice(&self.body),
            headers,
            ..self.copy()
        }
    }

    fn unusable_flag(&self) -> &Arc<AtomicBool> {
        self.unusable.get_or_init(Arc::default)
    }

    /// Whether a reader found this answer (or a copy of it) unusable.
    pub(crate) fn is_unusable(&self) -> bool {
        self.unusable
            .get()
            .is_some_and(|flag| flag.load(Ordering::Acquire))
    }

    /// What `derive` makes of this response, made **once** for everyone the
    /// response is shared with: the first caller runs `derive`, callers
    /// arriving meanwhile wait for it, later ones get the same `Arc`. So N
    /// fields that read the same URL in one request cost one read *and* one
    /// parse, not N parses of the same body (which, with nothing to wait on,
    /// would also run without yielding to the request's deadline). If the
    /// first caller is cancelled, the next one derives instead.
    ///
    /// An error is returned to the caller that made it and **not kept**: the
    /// next caller derives again. An error may be its caller's own — its
    /// budget or deadline spent by reads the derivation makes.
    ///
    /// What is derived lives as long as the response does in the inbound
    /// request: the engine's cache keeps an answer's parts, never what was
    /// derived of it, and each request it answers gets a response of its
    /// own to derive on.
    ///
    /// One derived type per response: asking for another type runs `derive`
    /// without keeping its result. `derive` must not read this same response
    /// again (it would wait for itself).
    ///
    /// ```
    /// # use fanout_budget::{ReadError, UpstreamResponse};
    /// # use http::{HeaderMap, StatusCode};
    /// # tokio_test_block_on(async {
    /// let response = UpstreamResponse::new("registry:5000", StatusCode::OK, HeaderMap::new(), r#"["a","b"]"#.into());
    /// let parse = || async { response.json::<Vec<String>>() };
    /// let first = response.derived(parse).await?;
    /// let again = response
    ///     .derived::<Vec<String>, ReadError, _, _>(|| async { unreachable!("made once") })
    ///     .await?;
    /// assert!(std::sync::Arc::ptr_eq(&first, &again));
    /// # Ok::<_, ReadError>(())
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
            .get_or_try_init(|| async {
                let derive = derive.take().expect("derived once");
                derive()
                    .await
                    .map(|made| Arc::new(made) as Arc<dyn Any + Send + Sync>)
            })
            .await?;
        match (kept.clone().downcast::<T>(), derive) {
            (Ok(made), _) => Ok(made),
            // Another type was derived first: make this one, unkept.
            (Err(_), Some(derive)) => derive().await.map(Arc::new),
            (Err(_), None) => unreachable!("the value just derived has this type"),
        }
    }

    /// An `UPSTREAM_ERROR` for this response, with its status — and the
    /// reader's word that the answer is unusable: the engine's cache never
    /// answers another read with it (or with any copy of it) again.
    ///
    /// The message is cut to [`MAX_MESSAGE`](Self::MAX_MESSAGE) bytes: it may quote the
    /// upstream's own data (a parser's error names the value it choked on),
    /// and one error can be copied into every field that shares the read.
    pub fn error(&self, message: impl Into<String>) -> ReadError {
        self.unusable_flag().store(true, Ordering::Release);
        self.mismatch(message)
    }

    /// An `UPSTREAM_ERROR` for this response that is one read's judgement,
    /// not the answer's (the digest that read names): other reads of the
    /// same answer may still use it.
    pub(crate) fn mismatch(&self, message: impl Into<String>) -> ReadError {
        ReadError::Upstream {
            host: self.host.clone(),
            status: Some(self.status.as_u16()),
            message: Self::cut(message.into()),
        }
    }

    /// An `UPSTREAM_ERROR` for this response that says nothing of the
    /// answer itself: the request's own bound stopped it
    /// ([`ReadError::AnswerBound`]).
    pub(crate) fn bound(&self, message: impl Into<String>) -> ReadError {
        ReadError::AnswerBound {
            host: self.host.clone(),
            status: self.status.as_u16(),
            message: Self::cut(message.into()),
        }
    }

    /// `message` cut to [`MAX_MESSAGE`](Self::MAX_MESSAGE) bytes.
    fn cut(mut message: String) -> String {
        if message.len() > Self::MAX_MESSAGE {
            let mut end = Self::MAX_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        message
    }

    /// This response if its status is a success (2xx), else an
    /// `UPSTREAM_ERROR` with the status: a read answers whatever the upstream
    /// said (a 404 may be an answer), and this is the one call that makes
    /// any other status an error.
    ///
    /// ```
    /// use fanout_budget::UpstreamResponse;
    /// use http::{HeaderMap, StatusCode};
    ///
    /// let page = UpstreamResponse::new("api:80", StatusCode::BAD_GATEWAY, HeaderMap::new(), "<html>".into());
    /// let err = page.error_for_status().unwrap_err();
    /// assert_eq!(err.code(), "UPSTREAM_ERROR");
    /// assert_eq!(err.extensions().get("status"), Some(&async_graphql::Value::from(502)));
    /// ```
    pub fn error_for_status(&self) -> Result<&Self, ReadError> {
        if self.status.is_success() {
            Ok(self)
        } else {
            Err(self.error(format!("unexpected status {}", self.status)))
        }
    }

    /// The body as JSON, or `UPSTREAM_ERROR` if it is not the expected JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, ReadError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| self.error(format!("unexpected response body: {e}")))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}
