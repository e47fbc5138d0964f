//! The embedded registry: an in-process OCI Distribution read API (axum).
//!
//! `cargo run` serves the gateway on it when `--upstream` is absent; tests and
//! benchmarks use it as an upstream that tells the truth about what it saw.
//! It answers `GET /v2/`, `/v2/_catalog`, `/v2/<name>/tags/list`,
//! `/v2/<name>/manifests/<reference>` and `/v2/<name>/blobs/<digest>` (names
//! may contain `/`), with `Link` pagination and the registry's JSON errors
//! (`NAME_UNKNOWN`, `MANIFEST_UNKNOWN`, `BLOB_UNKNOWN`).
//!
//! It can inject, per tag (on its manifest) or per repository (on its tag
//! list), a delay, a hang, an answer held until the test releases it, an
//! error status or a non-JSON body, plus a fixed latency on every request;
//! and it counts requests (total, per path and per kind) and the peak number
//! in flight.

pub mod store;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
pub use store::{Image, Store};

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer normally after this delay.
    Delay(Duration),
    /// Never answer.
    Hang,
    /// Answer normally once gate `n` (0–63) is opened with
    /// [`EmbeddedRegistry::release`] (at once if it already is); the
    /// request is counted when it arrives.
    Held(u8),
    /// Answer this status with a registry error body.
    Status(u16),
    /// Answer 200 with a body that is not JSON.
    Garbage,
    /// Announce a body, send part of it, then drop the connection.
    ResetMidBody,
    /// Send the body one byte every 100 ms, forever.
    Slowloris,
    /// Send a body of this many bytes (streamed, no `Content-Length`).
    Oversized(usize),
    /// Answer the right JSON with `Content-Type: text/html`.
    WrongContentType,
    /// Redirect to itself, forever.
    RedirectLoop,
    /// Answer 200 `application/json` with bytes that are not UTF-8.
    InvalidUtf8,
    /// Answer the right JSON with a `Link: rel="next"` to this same page.
    SelfLink,
    /// Answer the right JSON with a `Link: rel="next"` to another origin.
    ForeignLink,
    /// Redirect (302) to the same path on a loopback address of its own for
    /// each request this registry has received: `http://127.a.b.c:PORT`,
    /// `a.b.c` the request's number (a host nobody listens on, when `PORT`
    /// is a free port: every hop reaches a new upstream host and fails).
    Scatter(u16),
    /// Answer 200 JSON whose every field is a string of this many bytes
    /// (the wrong shape everywhere: a parser's error quotes it).
    WrongShape(usize),
    /// Answer an image manifest listing this many layers.
    ManyLayers(usize),
    /// Answer the manifest normally, without `Docker-Content-Digest`.
    NoDigestHeader,
}

/// What the registry has seen.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    in_flight: AtomicU64,
    peak: AtomicU64,
    working: AtomicU64,
    working_peak: AtomicU64,
    paths: Mutex<HashMap<String, u64>>,
    pulls: AtomicU64,
    heads: AtomicU64,
}

impl Counters {
    /// Manifest `GET`s served: what a registry that meters pulls (Docker
    /// Hub) counts as pulls.
    pub fn pulls(&self) -> u64 {
        self.pulls.load(SeqCst)
    }
    /// Manifest `HEAD`s served (no pull).
    pub fn heads(&self) -> u64 {
        self.heads.load(SeqCst)
    }
    /// Requests received (any path).
    pub fn requests(&self) -> u64 {
        self.requests.load(SeqCst)
    }
    /// Requests being served right now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(SeqCst)
    }
    /// The most requests ever in flight at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(SeqCst)
    }
    /// Requests for exactly this path (query string excluded).
    pub fn path(&self, path: &str) -> u64 {
        *self.paths.lock().unwrap().get(path).unwrap_or(&0)
    }
    /// Requests whose path contains `part` (e.g. `/manifests/`, `/blobs/`).
    pub fn matching(&self, part: &str) -> u64 {
        self.paths
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p.contains(part))
            .map(|(_, n)| n)
            .sum()
    }
    /// The most requests ever being *worked on* at once: in flight and not
    /// hanging forever on an injected [`Fault::Hang`]. A hung request the
    /// client has abandoned stays "in flight" here until the registry notices
    /// the closed connection; this figure leaves those out.
    pub fn working_peak(&self) -> u64 {
        self.working_peak.load(SeqCst)
    }
    /// Forgets everything seen so far (the peak restarts from what is in flight).
    pub fn reset(&self) {
        self.requests.store(0, SeqCst);
        self.peak.store(self.in_flight(), SeqCst);
        self.working_peak.store(self.working.load(SeqCst), SeqCst);
        self.paths.lock().unwrap().clear();
        self.pulls.store(0, SeqCst);
        self.heads.store(0, SeqCst);
    }
}

#[derive(Default)]
struct Faults {
    tags: HashMap<(String, String), Fault>,
    repos: HashMap<String, Fault>,
    latency: Option<Duration>,
    tag_page_size: Option<usize>,
}

struct Shared {
    store: RwLock<Store>,
    faults: RwLock<Faults>,
    counters: Arc<Counters>,
    /// The gates of [`Fault::Held`] opened so far, one bit each.
    open_gates: tokio::sync::watch::Sender<u64>,
}

/// A running embedded registry; it stops when dropped.
pub struct EmbeddedRegistry {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EmbeddedRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EmbeddedRegistry {
    /// Serves `store` on a free loopback port.
    pub async fn start(store: Store) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            store: RwLock::new(store),
            faults: RwLock::default(),
            counters: Arc::default(),
            open_gates: tokio::sync::watch::Sender::new(0),
        });
        let app = Router::new()
            .route("/v2/", get(|| async { axum::Json(serde_json::json!({})) }))
            .route("/v2/{*rest}", get(serve))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, shared, task })
    }

    /// Serves the demo data.
    pub async fn demo() -> std::io::Result<Self> {
        Self::start(Store::demo()).await
    }

    /// Serves the tests' and benchmarks' known data ([`Store::fixture`]).
    pub async fn fixture() -> std::io::Result<Self> {
        Self::start(Store::fixture()).await
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `127.0.0.1:PORT` (the host key of `[hosts]`).
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// What it has seen.
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Changes the stored data.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        f(&mut self.shared.store.write().unwrap())
    }

    /// Injects `fault` on the manifest of `repo:tag` (`None` clears it).
    pub fn set_tag_fault(&self, repo: &str, tag: &str, fault: Option<Fault>) {
        let key = (repo.to_string(), tag.to_string());
        let mut faults = self.shared.faults.write().unwrap();
        match fault {
            Some(f) => faults.tags.insert(key, f),
            None => faults.tags.remove(&key),
        };
    }

    /// Injects `fault` on the tag list of `repo` (`None` clears it).
    pub fn set_repo_fault(&self, repo: &str, fault: Option<Fault>) {
        let mut faults = self.shared.faults.write().unwrap();
        match fault {
            Some(f) => faults.repos.insert(repo.to_string(), f),
            None => faults.repos.remove(repo),
        };
    }

    /// Opens gate `gate` (0–63): the answers [`Fault::Held`] on it go, and
    /// every later one at once.
    pub fn release(&self, gate: u8) {
        self.shared
            .open_gates
            .send_modify(|open| *open |= 1 << (gate % 64));
    }

    /// Adds a fixed latency to every request.
    pub fn set_latency(&self, latency: Option<Duration>) {
        self.shared.faults.write().unwrap().latency = latency;
    }

    /// Splits tag lists into `Link`-paginated pages of this size even when
    /// the client sends no `n` (as registries may).
    pub fn set_tag_page_size(&self, size: Option<usize>) {
        self.shared.faults.write().unwrap().tag_page_size = size;
    }
}

struct InFlight {
    counters: Arc<Counters>,
    working: bool,
}

impl InFlight {
    fn enter(counters: Arc<Counters>) -> Self {
        let now = counters.in_flight.fetch_add(1, SeqCst) + 1;
        counters.peak.fetch_max(now, SeqCst);
        let working = counters.working.fetch_add(1, SeqCst) + 1;
        counters.working_peak.fetch_max(working, SeqCst);
        Self {
            counters,
            working: true,
        }
    }

    /// This request will hang forever: it is no longer being worked on.
    fn hang(&mut self) {
        if std::mem::take(&mut self.working) {
            self.counters.working.fetch_sub(1, SeqCst);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.hang();
        self.counters.in_flight.fetch_sub(1, SeqCst);
    }
}

#[derive(Deserialize)]
struct Page {
    n: Option<usize>,
    last: Option<String>,
}

enum Route {
    Catalog,
    Tags(String),
    Manifest(String, String),
    Blob(String, String),
}

fn route(rest: &str) -> Option<Route> {
    if rest == "_catalog" {
        return Some(Route::Catalog);
    }
    if let Some(name) = rest.strip_suffix("/tags/list") {
        return Some(Route::Tags(name.into()));
    }
    if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        return Some(Route::Manifest(name.into(), reference.into()));
    }
    if let Some((name, digest)) = rest.rsplit_once("/blobs/") {
        return Some(Route::Blob(name.into(), digest.into()));
    }
    None
}

fn registry_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body =
        serde_json::json!({ "errors": [{ "code": code, "message": message, "detail": null }] });
    (status, axum::Json(body)).into_response()
}

/// The response a fault replaces the real one with (`None`: serve normally,
/// possibly after a delay). `real` is the body that would have been served.
async fn apply(shared: &Shared, fault: Option<Fault>, path: &str, real: &[u8]) -> Option<Response> {
    use futures::StreamExt;
    let json = |body: axum::body::Body| {
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap()
    };
    match fault? {
        Fault::Delay(d) => {
            tokio::time::sleep(d).await;
            None
        }
        Fault::Hang => std::future::pending().await,
        Fault::NoDigestHeader => None,
        Fault::Held(gate) => {
            let mut open = shared.open_gates.subscribe();
            let _ = open.wait_for(|open| open & (1 << (gate % 64)) != 0).await;
            None
        }
        Fault::Status(s) => {
            let status = StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Some(registry_error(status, "UNKNOWN", "injected failure"))
        }
        Fault::Garbage => Some((StatusCode::OK, "<html>this is not json").into_response()),
        Fault::ResetMidBody => {
            let part = bytes::Bytes::from_static(b"{\"tags\": [\"a\", ");
            let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
                vec![Ok(part), Err(std::io::Error::other("reset"))];
            let mut response = json(axum::body::Body::from_stream(futures::stream::iter(chunks)));
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from_static("4096"));
            Some(response)
        }
        Fault::Slowloris => {
            let drip = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b" ")), ()))
            });
            Some(json(axum::body::Body::from_stream(drip.boxed())))
        }
        Fault::Oversized(n) => {
            let chunk = bytes::Bytes::from(vec![b' '; 64 * 1024]);
            let count = n.div_ceil(chunk.len());
            let stream = futures::stream::iter(
                (0..count).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
            );
            Some(json(axum::body::Body::from_stream(stream)))
        }
        Fault::WrongContentType => Some(
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/html")
                .body(axum::body::Body::from(real.to_vec()))
                .unwrap(),
        ),
        Fault::RedirectLoop => Some(
            Response::builder()
                .status(StatusCode::FOUND)
                .header(header::LOCATION, path)
                .body(axum::body::Body::empty())
                .unwrap(),
        ),
        Fault::Scatter(port) => {
            let n = shared.counters.requests.load(SeqCst);
            let [_, a, b, c] = (n as u32).to_be_bytes();
            Some(
                Response::builder()
                    .status(StatusCode::FOUND)
                    .header(
                        header::LOCATION,
                        format!("http://127.{a}.{b}.{c}:{port}{path}"),
                    )
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
        }
        Fault::InvalidUtf8 => Some(json(axum::body::Body::from(vec![0xff, 0xfe, 0xfd, b'{']))),
        Fault::WrongShape(n) => {
            let text = "B".repeat(n);
            let body = serde_json::json!({ "tags": text, "layers": text, "mediaType": 1 });
            Some(json(axum::body::Body::from(body.to_string())))
        }
        Fault::ManyLayers(n) => {
            let layer = serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": format!("sha256:{}", "a".repeat(64)),
                "size": 1,
            });
            let body = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": format!("sha256:{}", "b".repeat(64)),
                    "size": 1,
                },
                "layers": vec![layer; n],
            });
            Some(json(axum::body::Body::from(body.to_string())))
        }
        Fault::SelfLink | Fault::ForeignLink => {
            let target = match fault {
                Some(Fault::SelfLink) => path.to_string(),
                _ => format!("http://127.0.0.1:1{path}"),
            };
            let mut response = json(axum::body::Body::from(real.to_vec()));
            if let Ok(link) = HeaderValue::from_str(&format!("<{target}>; rel=\"next\"")) {
                response.headers_mut().insert(header::LINK, link);
            }
            Some(response)
        }
    }
}

/// `(items after `last`, at most `n`)` and whether more follow.
fn page<'a>(
    all: impl Iterator<Item = &'a String>,
    page: &Page,
    default_n: Option<usize>,
) -> (Vec<String>, bool) {
    let after: Vec<&String> = all
        .filter(|item| page.last.as_ref().is_none_or(|last| *item > last))
        .collect();
    match page.n.or(default_n) {
        Some(n) => (
            after.iter().take(n).map(|s| s.to_string()).collect(),
            after.len() > n,
        ),
        None => (after.into_iter().cloned().collect(), false),
    }
}

fn with_link(
    mut response: Response,
    more: bool,
    path: &str,
    n: usize,
    last: Option<&String>,
) -> Response {
    if let (true, Some(last)) = (more, last) {
        let link = format!("<{path}?n={n}&last={last}>; rel=\"next\"");
        if let Ok(value) = HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    response
}

fn name_unknown() -> Response {
    registry_error(
        StatusCode::NOT_FOUND,
        "NAME_UNKNOWN",
        "repository name not known to registry",
    )
}

async fn serve(
    State(shared): State<Arc<Shared>>,
    method: axum::http::Method,
    Path(rest): Path<String>,
    Query(q): Query<Page>,
) -> Response {
    let counters = shared.counters.clone();
    let path = format!("/v2/{rest}");
    counters.requests.fetch_add(1, SeqCst);
    *counters
        .paths
        .lock()
        .unwrap()
        .entry(path.clone())
        .or_default() += 1;
    let mut guard = InFlight::enter(counters);

    let (latency, page_size) = {
        let f = shared.faults.read().unwrap();
        (f.latency, f.tag_page_size)
    };
    if let Some(latency) = latency {
        tokio::time::sleep(latency).await;
    }
    let Some(route) = route(&rest) else {
        return registry_error(StatusCode::NOT_FOUND, "NAME_INVALID", "unknown path");
    };
    match route {
        Route::Catalog => {
            let store = shared.store.read().unwrap();
            let (names, more) = page(store.repos.keys(), &q, Some(100));
            let n = q.n.unwrap_or(100);
            let last = names.last().cloned();
            drop(store);
            let response = axum::Json(serde_json::json!({ "repositories": names })).into_response();
            with_link(response, more, &path, n, last.as_ref())
        }
        Route::Tags(name) => {
            let fault = shared.faults.read().unwrap().repos.get(&name).copied();
            if fault == Some(Fault::Hang) {
                guard.hang();
            }
            if let Some(response) = apply(&shared, fault, &path, b"{\"tags\": []}").await {
                return response;
            }
            let store = shared.store.read().unwrap();
            let Some(repo) = store.repos.get(&name) else {
                return name_unknown();
            };
            let (tags, more) = page(repo.tags.keys(), &q, page_size);
            let n = q.n.or(page_size).unwrap_or(tags.len());
            let last = tags.last().cloned();
            drop(store);
            let response =
                axum::Json(serde_json::json!({ "name": name, "tags": tags })).into_response();
            with_link(response, more, &path, n, last.as_ref())
        }
        Route::Manifest(name, reference) => {
            let counted = match method {
                axum::http::Method::HEAD => &shared.counters.heads,
                _ => &shared.counters.pulls,
            };
            counted.fetch_add(1, SeqCst);
            let fault = shared
                .faults
                .read()
                .unwrap()
                .tags
                .get(&(name.clone(), reference.clone()))
                .copied();
            if fault.is_some() {
                let real = {
                    let store = shared.store.read().unwrap();
                    let repo = store.repos.get(&name);
                    let digest = repo
                        .and_then(|r| r.tags.get(&reference))
                        .cloned()
                        .unwrap_or_default();
                    repo.and_then(|r| r.manifests.get(&digest))
                        .map(|m| m.body.clone())
                        .unwrap_or_default()
                };
                if fault == Some(Fault::Hang) {
                    guard.hang();
                }
                if let Some(response) = apply(&shared, fault, &path, &real).await {
                    return response;
                }
            }
            let store = shared.store.read().unwrap();
            let Some(repo) = store.repos.get(&name) else {
                return name_unknown();
            };
            let digest = repo.tags.get(&reference).cloned().unwrap_or(reference);
            let Some(manifest) = repo.manifests.get(&digest) else {
                return registry_error(
                    StatusCode::NOT_FOUND,
                    "MANIFEST_UNKNOWN",
                    "manifest unknown",
                );
            };
            let mut headers = HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(&manifest.media_type).unwrap(),
            );
            if fault != Some(Fault::NoDigestHeader) {
                headers.insert(
                    "docker-content-digest",
                    HeaderValue::from_str(&digest).unwrap(),
                );
            }
            (StatusCode::OK, headers, manifest.body.clone()).into_response()
        }
        Route::Blob(name, digest) => {
            let store = shared.store.read().unwrap();
            match store.repos.get(&name).and_then(|r| r.blobs.get(&digest)) {
                Some(blob) => {
                    let mut headers = HeaderMap::new();
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/octet-stream"),
                    );
                    headers.insert(
                        "docker-content-digest",
                        HeaderValue::from_str(&digest).unwrap(),
                    );
                    (StatusCode::OK, headers, blob.clone()).into_response()
                }
                None => registry_error(
                    StatusCode::NOT_FOUND,
                    "BLOB_UNKNOWN",
                    "blob unknown to registry",
                ),
            }
        }
    }
}
