//! The HTTP client the OTLP exporter sends with: reqwest 0.12 (the engine's
//! HTTP stack, not the exporter's own reqwest 0.13), on the application's
//! tokio runtime, each export bounded by a timeout.
//!
//! The SDK's batch processor runs on a thread of its own and drives an
//! export with `futures_executor::block_on`: no tokio reactor there. So the
//! request runs as a task spawned on the runtime the telemetry was built on,
//! and the export thread awaits only its `JoinHandle`. A runtime that is gone
//! (the task cancelled) fails the export; it never panics.
//!
//! It is a client of its own, not the engine's read path: exports are not
//! charged, capped or traced (a trace of its own export would feed itself).

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use std::time::Duration;
use tokio::runtime::Handle;

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
            .build()?;
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
        let request = reqwest::Request::try_from(request)?;
        let sent = self.runtime.spawn(async move {
            tokio::time::timeout(timeout, exchange(client, request))
                .await
                .map_err(|_| -> HttpError { format!("no answer within {timeout:?}").into() })?
        });
        sent.await.map_err(|e| -> HttpError { Box::new(e) })?
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
