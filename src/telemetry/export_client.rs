//! The HTTP client the OTLP exporter sends with: reqwest 0.12 (the engine's
//! HTTP stack, not the exporter's own reqwest 0.13), on the application's
//! tokio runtime, each export bounded by a timeout.
//!
//! The span queue's export thread (`batches.rs`) and the SDK's metric
//! reader each drive an export on a thread of their own with a
//! `block_on`: no tokio reactor there. So the
//! request runs as a task spawned on the runtime the telemetry was built on,
//! and the export thread awaits only its `JoinHandle`. A runtime that is gone
//! (the task cancelled) fails the export; it never panics.
//!
//! It is a client of its own, not the engine's read path: exports are not
//! charged, capped or traced (a trace of its own export would feed itself).
//!
//! A batch's body is handed to the connection in copied chunks, and taken
//! back when the export ends ([`Revocable`]): a collector that accepts and
//! never reads leaves the connection of an export that timed out writing
//! (hyper did not always close it), and that connection would otherwise
//! keep the whole body — one batch, up to the queue's bytes — for as long
//! as the collector holds the socket.
//!
//! Connections are bounded too: one per export under way (the spans' and
//! the metrics', one each at a time), [`MAX_IDLE`] kept idle for at most
//! [`IDLE_TIMEOUT`]. An export that times out waiting for its answer has
//! its connection closed by hyper; one that times out writing would keep
//! it — hyper flushes what it buffered (up to ~400 KiB) before it closes,
//! and a collector that never reads never lets that flush end — so on
//! Linux each socket has `TCP_USER_TIMEOUT` set to the export timeout: the
//! kernel aborts a connection whose data waited that long
//! (`tests/telemetry_connections.rs`).

use bytes::Buf as _;
use http_body::{Frame, SizeHint};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::runtime::Handle;

/// The most bytes of a body handed to the connection at once (copied).
const CHUNK_BYTES: usize = 64 * 1024;

/// Idle connections kept to the collector: the spans' and the metrics'
/// exports each use one at a time.
const MAX_IDLE: usize = 1;

/// How long an idle connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The most bytes of a collector's answer read (it is a status and,
/// at most, a partial-success message).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Sends OTLP requests with reqwest on a tokio runtime, each within
/// `timeout` (connection, request and the answer's body).
#[derive(Debug, Clone)]
pub(crate) struct ExportClient {
    client: reqwest::Client,
    runtime: Handle,
    timeout: Duration,
}

impl ExportClient {
    /// A client of its own (no redirects followed) on `runtime`.
    pub(crate) fn new(runtime: Handle, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout)
            .timeout(timeout)
            .pool_max_idle_per_host(MAX_IDLE)
            .pool_idle_timeout(IDLE_TIMEOUT);
        // An export given up while its body was being written leaves hyper
        // flushing it before it closes: against a collector that never
        // reads, for ever. The kernel aborts such a connection once its
        // data has waited `timeout` unacknowledged (zero-window probes
        // included), and hyper, failing to write, lets it go.
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        let client = client.tcp_user_timeout(timeout);
        let client = client.build()?;
        Ok(Self {
            client,
            runtime,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let (parts, body) = request.into_parts();
        let body = Revocable::new(body);
        let kept = body.clone();
        let mut request = reqwest::Request::try_from(Request::from_parts(parts, Bytes::new()))?;
        *request.body_mut() = Some(reqwest::Body::wrap(body));
        let sent = self.runtime.spawn(async move {
            let answer = tokio::time::timeout(timeout, exchange(client, request))
                .await
                .map_err(|_| -> HttpError { format!("no answer within {timeout:?}").into() });
            // Whatever the connection still holds, the body is let go.
            kept.revoke();
            answer?
        });
        sent.await.map_err(|e| -> HttpError { Box::new(e) })?
    }
}

/// A request body the export takes back when it ends: chunks of at most
/// [`CHUNK_BYTES`] copied out of it while it lasts, an error once revoked.
#[derive(Clone)]
struct Revocable {
    rest: Arc<Mutex<Option<Bytes>>>,
}

impl Revocable {
    fn new(body: Bytes) -> Self {
        Revocable {
            rest: Arc::new(Mutex::new(Some(body))),
        }
    }

    fn rest(&self) -> std::sync::MutexGuard<'_, Option<Bytes>> {
        self.rest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops what was not yet handed to the connection.
    fn revoke(&self) {
        let rest = self.rest().take();
        drop(rest);
    }
}

impl http_body::Body for Revocable {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(match self.rest().as_mut() {
            None => Some(Err(std::io::Error::other("the export ended"))),
            Some(rest) if rest.is_empty() => None,
            Some(rest) => {
                let chunk = Bytes::copy_from_slice(&rest[..rest.len().min(CHUNK_BYTES)]);
                rest.advance(chunk.len());
                Some(Ok(Frame::data(chunk)))
            }
        })
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest().as_ref().map_or(0, |rest| rest.len() as u64))
    }
}

/// One request and its answer, the body read up to [`MAX_ANSWER_BYTES`].
async fn exchange(
    client: reqwest::Client,
    request: reqwest::Request,
) -> Result<Response<Bytes>, HttpError> {
    let mut response = client.execute(request).await?;
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err("the collector's answer is larger than 64 KiB".into());
        }
        body.extend_from_slice(&chunk);
    }
    let mut answer = Response::new(body.freeze());
    *answer.status_mut() = response.status();
    *answer.headers_mut() = std::mem::take(response.headers_mut());
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt as _;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A body's bytes that say when they are freed.
    struct Owned(Vec<u8>, Arc<AtomicBool>);

    impl AsRef<[u8]> for Owned {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for Owned {
        fn drop(&mut self) {
            self.1.store(true, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn a_body_is_sent_in_copied_chunks_and_let_go_when_revoked() {
        let freed = Arc::new(AtomicBool::new(false));
        let bytes = Bytes::from_owner(Owned(vec![7; 3 * CHUNK_BYTES / 2], freed.clone()));
        let mut body = Revocable::new(bytes);
        let kept = body.clone();
        assert_eq!(body.size_hint().exact(), Some(3 * CHUNK_BYTES as u64 / 2));
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), CHUNK_BYTES);
        assert_eq!(body.size_hint().exact(), Some(CHUNK_BYTES as u64 / 2));
        // What the connection holds is a copy: revoked, the body is freed
        // while the chunk lives.
        kept.revoke();
        assert!(freed.load(Ordering::Relaxed), "the body is let go");
        assert!(first.iter().all(|b| *b == 7));
        assert!(body.frame().await.unwrap().is_err(), "a revoked body fails");

        // Sent whole, it ends.
        let mut body = Revocable::new(Bytes::from(vec![1; 10]));
        assert_eq!(
            body.frame()
                .await
                .unwrap()
                .unwrap()
                .into_data()
                .unwrap()
                .len(),
            10
        );
        assert!(body.frame().await.is_none());
    }
}
