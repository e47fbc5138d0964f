//! One fault-injecting loopback upstream for the tests: an axum server on a
//! free port that counts what it saw and answers each route as told.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How the upstream answers one `/item/{id}`.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// `{"id": id, "value": "item-<id>"}` (after the default delay, if set).
    Ok,
    /// The same after this delay.
    Delay(Duration),
    /// Never.
    Hang,
    /// This status, body `boom`.
    Status(u16),
    /// 200 with a body that is not JSON.
    Garbage,
}

/// What the upstream saw (and how it is told to answer).
#[derive(Debug, Default)]
pub struct Seen {
    /// Requests received, every route.
    pub requests: AtomicU64,
    /// Requests whose handler is running.
    pub in_flight: AtomicU64,
    /// The most in flight at once.
    pub peak: AtomicU64,
    /// Requests per path.
    pub paths: Mutex<HashMap<String, u64>>,
    /// Per item id, how `/item/{id}` answers (`Ok` when absent).
    pub behaviour: Mutex<HashMap<u64, Behaviour>>,
    /// A delay before every `Ok` item.
    pub default_delay: Mutex<Option<Duration>>,
    /// Bytes of the never-ending `/endless` bodies sent so far.
    pub streamed: AtomicU64,
    /// While set, every `/item/{id}` waits before it answers ([`Seen::hold`]).
    held: AtomicBool,
    released: Notify,
}

impl Seen {
    /// Requests received.
    pub fn requests(&self) -> u64 {
        self.requests.load(SeqCst)
    }
    /// The most in flight at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(SeqCst)
    }
    /// Requests whose handler is running.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(SeqCst)
    }
    /// Requests of `path`.
    pub fn count(&self, path: &str) -> u64 {
        *self.paths.lock().unwrap().get(path).unwrap_or(&0)
    }
    /// How `/item/{id}` answers from now on.
    pub fn set(&self, id: u64, b: Behaviour) {
        self.behaviour.lock().unwrap().insert(id, b);
    }
    /// Holds every `/item/{id}` answer (whatever its behaviour) from now
    /// on, until [`release`](Self::release): the request is received (and
    /// counted), the answer waits.
    pub fn hold(&self) {
        self.held.store(true, SeqCst);
    }
    /// Lets the held answers go, and every later one.
    pub fn release(&self) {
        self.held.store(false, SeqCst);
        self.released.notify_waiters();
    }
    async fn released(&self) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.held.load(SeqCst) {
                return;
            }
            released.await;
        }
    }
}

struct InFlight(Arc<Seen>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

fn enter(seen: &Arc<Seen>, path: String) -> InFlight {
    seen.requests.fetch_add(1, SeqCst);
    *seen.paths.lock().unwrap().entry(path).or_default() += 1;
    let now = seen.in_flight.fetch_add(1, SeqCst) + 1;
    seen.peak.fetch_max(now, SeqCst);
    InFlight(seen.clone())
}

/// A running loopback upstream; stops when dropped. Its routes:
///
/// - `/list`: `{"ids": [0, …, 999]}`; `/item/{id}` (`GET` or `POST`): as
///   [`Seen::set`] says, once [`Seen::release`]d when [`Seen::hold`] holds it;
/// - `/ok`: `fine`; `/numbers`: a JSON list of 100,000 numbers (≈ 590 KB);
/// - `/one`: one chunk; `/many`: four chunks of 50,000 bytes (chunk `i` all
///   `b'a' + i`), streamed without a `Content-Length`;
/// - `/loop/a` ↔ `/loop/b`; `/chain/N` → `/chain/N+1` for ever;
///   `/to/PORT` → `http://127.0.0.1:PORT/ok`; `/file` → `file:///etc/passwd`;
/// - `/endless`: a body that never ends (counted in [`Seen::streamed`]);
///   `/trickle`: one that never ends, 16 bytes every 10 ms;
/// - `/headers/{name}?H=V&…`: `200`, each query pair a response header
///   (`/headers/a?cache-control=max-age%3D60`), the body `{name} #{n}` for
///   the `n`th request of that path.
#[derive(Debug)]
pub struct Upstream {
    /// Its loopback address.
    pub addr: SocketAddr,
    /// What it saw.
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// Starts one on a free loopback port.
    pub async fn start() -> Self {
        let seen = Arc::new(Seen::default());
        let mut app = Router::new()
            .route("/list", get(list))
            .route("/item/{id}", get(item).post(item))
            .route("/loop/{side}", get(redirect_loop))
            .route("/chain/{n}", get(chain))
            .route("/to/{port}", get(to_port))
            .route("/endless", get(endless))
            .route("/trickle", get(trickle))
            .route("/headers/{name}", get(with_headers));
        for path in FIXED {
            app = app.route(path, get(fixed));
        }
        let app = app.with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, seen, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests received, every route.
    pub fn requests(&self) -> u64 {
        self.seen.requests()
    }
}

fn found(location: String) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, location)]).into_response()
}

async fn list(State(seen): State<Arc<Seen>>) -> impl IntoResponse {
    let _g = enter(&seen, "/list".into());
    axum::Json(json!({ "ids": (0..1000).collect::<Vec<u64>>() }))
}

async fn item(State(seen): State<Arc<Seen>>, Path(id): Path<u64>) -> Response {
    let _g = enter(&seen, format!("/item/{id}"));
    seen.released().await;
    let behaviour = seen.behaviour.lock().unwrap().get(&id).copied();
    let default_delay = *seen.default_delay.lock().unwrap();
    match behaviour.unwrap_or(Behaviour::Ok) {
        Behaviour::Hang => std::future::pending::<()>().await,
        Behaviour::Delay(d) => tokio::time::sleep(d).await,
        Behaviour::Status(s) => return (StatusCode::from_u16(s).unwrap(), "boom").into_response(),
        Behaviour::Garbage => return "<html>not json".into_response(),
        Behaviour::Ok => {
            if let Some(d) = default_delay {
                tokio::time::sleep(d).await
            }
        }
    }
    axum::Json(json!({ "id": id, "value": format!("item-{id}") })).into_response()
}

/// The routes with one fixed answer each (see [`fixed`]).
const FIXED: [&str; 5] = ["/ok", "/numbers", "/one", "/many", "/file"];

/// The routes with one fixed answer each.
async fn fixed(State(s): State<Arc<Seen>>, uri: Uri) -> Response {
    let _g = enter(&s, uri.path().to_string());
    match uri.path() {
        "/ok" => "fine".into_response(),
        "/numbers" => serde_json::to_string(&(0..100_000u64).collect::<Vec<_>>())
            .unwrap()
            .into_response(),
        "/one" => "just one chunk".into_response(),
        "/many" => {
            let chunks = (0..4u8).map(|i| Ok::<_, std::io::Error>(vec![b'a' + i; 50_000]));
            Body::from_stream(futures::stream::iter(chunks)).into_response()
        }
        "/file" => found("file:///etc/passwd".into()),
        other => unreachable!("no fixed answer for {other}"),
    }
}

async fn with_headers(
    State(s): State<Arc<Seen>>,
    Path(name): Path<String>,
    axum::extract::Query(pairs): axum::extract::Query<Vec<(String, String)>>,
) -> Response {
    let path = format!("/headers/{name}");
    let _g = enter(&s, path.clone());
    let n = s.count(&path);
    let mut response = format!("{name} #{n}").into_response();
    for (name, value) in pairs {
        let name = header::HeaderName::try_from(name).expect("a header name");
        let value = header::HeaderValue::try_from(value).expect("a header value");
        response.headers_mut().append(name, value);
    }
    response
}

async fn redirect_loop(State(s): State<Arc<Seen>>, Path(side): Path<String>) -> Response {
    let _g = enter(&s, format!("/loop/{side}"));
    found(if side == "a" { "/loop/b" } else { "/loop/a" }.into())
}

async fn chain(State(s): State<Arc<Seen>>, Path(n): Path<u64>) -> Response {
    let _g = enter(&s, format!("/chain/{n}"));
    found(format!("/chain/{}", n + 1))
}

async fn to_port(State(s): State<Arc<Seen>>, Path(port): Path<u16>) -> Response {
    let _g = enter(&s, format!("/to/{port}"));
    found(format!("http://127.0.0.1:{port}/ok"))
}

async fn endless(State(s): State<Arc<Seen>>) -> Body {
    let _g = enter(&s, "/endless".into());
    let chunks = futures::stream::unfold(s.clone(), |s| async move {
        s.streamed.fetch_add(1024, SeqCst);
        tokio::task::yield_now().await;
        Some((Ok::<_, std::io::Error>(vec![b'x'; 1024]), s))
    });
    Body::from_stream(chunks)
}

async fn trickle(State(s): State<Arc<Seen>>) -> Body {
    let _g = enter(&s, "/trickle".into());
    let chunks = futures::stream::unfold((), |()| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Some((Ok::<_, std::io::Error>(vec![b'x'; 16]), ()))
    });
    Body::from_stream(chunks)
}
