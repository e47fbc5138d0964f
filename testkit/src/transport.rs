//! One in-memory [`Transport`] for the tests and the benches: the engine's
//! reads answered without a socket.

use crate::YieldOnce;
use bytes::Bytes;
use fanout_budget::{read::Transport, Read, ReadError, UpstreamResponse};
use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use std::collections::HashMap;
use tokio::sync::Notify;

/// An upstream in memory. By default every read is answered 200 with a
/// fixed body (`{}`), at once; the builder methods change that:
///
/// - [`body`](Self::body): another fixed body;
/// - [`pending_once`](Self::pending_once): each read pends once first (what
///   a read on a real socket does at least, and what arms the read's timer);
/// - [`scripted`](Self::scripted): answers by the URL's last segment — `ok`
///   the body, `fail` an `UPSTREAM_ERROR`, `hang` never, anything else the
///   body once [`open`](Self::open) is called (the gate);
/// - [`stored`](Self::stored): answers by the URL's path with a stored
///   response (a path with none is a test failure).
#[derive(Debug)]
pub struct MemTransport {
    body: Bytes,
    pending_once: bool,
    scripted: bool,
    stored: HashMap<String, (StatusCode, HeaderMap, Bytes)>,
    gate: Notify,
    /// Every read fetched, in order (unless `record(false)`).
    sent: std::sync::Mutex<Vec<Read>>,
    record: bool,
}

impl Default for MemTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl MemTransport {
    /// Answers every read 200 `{}`, at once.
    pub fn new() -> Self {
        Self {
            body: Bytes::from_static(b"{}"),
            pending_once: false,
            scripted: false,
            stored: HashMap::new(),
            gate: Notify::new(),
            sent: Default::default(),
            record: true,
        }
    }

    /// Whether the reads fetched are kept for [`sent`](Self::sent) (the
    /// default). The benches turn it off: millions of reads kept would
    /// grow, copy and fault in a vector inside the timed loops.
    pub fn record(mut self, yes: bool) -> Self {
        self.record = yes;
        self
    }

    /// The body of every 200 answer.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Each read pends once before it is answered.
    pub fn pending_once(mut self, yes: bool) -> Self {
        self.pending_once = yes;
        self
    }

    /// Answers by the URL's last segment (see the type's docs).
    pub fn scripted(mut self) -> Self {
        self.scripted = true;
        self
    }

    /// Answers reads of `path` with this response.
    pub fn stored(
        mut self,
        path: impl Into<String>,
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    ) -> Self {
        self.stored.insert(path.into(), (status, headers, body));
        self
    }

    /// Every read fetched so far, in order (method, URL, headers, body).
    pub fn sent(&self) -> Vec<Read> {
        self.sent.lock().unwrap().clone()
    }

    /// Opens the gate: the scripted reads waiting on it are answered.
    pub fn open(&self) {
        self.gate.notify_waiters();
    }

    fn ok(&self, host: &str) -> UpstreamResponse {
        UpstreamResponse::new(host, StatusCode::OK, HeaderMap::new(), self.body.clone())
    }
}

impl Transport for MemTransport {
    fn fetch<'a>(
        &'a self,
        read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        if self.record {
            self.sent.lock().unwrap().push(read.clone());
        }
        Box::pin(async move {
            if self.pending_once {
                YieldOnce::new().await;
            }
            if !self.stored.is_empty() {
                let (status, headers, body) = self
                    .stored
                    .get(read.url().path())
                    .unwrap_or_else(|| panic!("no stored answer for {}", read.url()));
                return Ok(UpstreamResponse::new(
                    host,
                    *status,
                    headers.clone(),
                    body.clone(),
                ));
            }
            if !self.scripted {
                return Ok(self.ok(host));
            }
            match read.url().path().rsplit('/').next() {
                Some("ok") => Ok(self.ok(host)),
                Some("fail") => Err(ReadError::Upstream {
                    host: host.into(),
                    status: None,
                    message: "refused".into(),
                }),
                Some("hang") => std::future::pending().await,
                _ => {
                    self.gate.notified().await;
                    Ok(self.ok(host))
                }
            }
        })
    }
}

/// The engine on a [`scripted`](MemTransport::scripted) in-memory upstream,
/// and its reads: one fixture for the tests of the read path's timing.
pub mod scripted {
    use super::MemTransport;
    use fanout_budget::{Config, Engine, Read};
    use std::sync::Arc;

    /// The host every [`read`] goes to (`[hosts]` tables name it so).
    pub const HOST: &str = "up.test:81";

    /// An engine on `config` whose reads a scripted [`MemTransport`]
    /// answers (by the URL's last segment: `ok`, `fail`, `hang`, anything
    /// else once the gate opens), and that transport.
    pub fn engine(config: Config) -> (Engine, Arc<MemTransport>) {
        let transport = Arc::new(MemTransport::new().scripted());
        let engine = Engine::builder(config).transport(transport.clone()).build();
        (engine, transport)
    }

    /// A GET of `path` on [`HOST`].
    pub fn read(path: &str) -> Read {
        Read::get(format!("http://{HOST}/{path}").parse().unwrap())
    }
}
