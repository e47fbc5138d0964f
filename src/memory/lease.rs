//! An answer being written keeps its share of the pool until its body is
//! dropped: sent whole, or its connection closed. A request's scope ends
//! when its handler returns, but a client that does not read keeps the
//! body (up to `http.max_response_bytes`) in memory until the write timeout;
//! without a lease, forty unread answers of 11 MB held +511 MiB with the
//! pool at zero.

use super::{MemoryPool, RequestMemory};
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Bytes of the pool held for a body being written.
#[derive(Debug)]
struct Lease {
    pool: Arc<MemoryPool>,
    bytes: usize,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.give_back(self.bytes);
    }
}

impl RequestMemory {
    /// Moves `bytes` of what the request took from the pool to the body of
    /// its answer, taking from the pool what the request had not taken;
    /// `None` when the pool cannot hold it.
    fn lease(&self, bytes: usize) -> Option<Lease> {
        let moved = bytes.min(self.reserved.load(Relaxed));
        let extra = bytes - moved;
        if extra > 0 && !self.pool.take(extra) {
            return None;
        }
        self.reserved.fetch_sub(moved, Relaxed);
        Some(Lease {
            pool: self.pool.clone(),
            bytes,
        })
    }

    /// `response` with a body that holds its bytes in the pool until it is
    /// dropped; 503 `OVERLOADED` when the pool cannot hold them. A body
    /// whose size is not known in advance (a stream an app's own service
    /// returns under `FanoutLayer`) goes out unleased.
    pub(crate) fn lease_body(&self, response: Response) -> Response {
        let Some(bytes) = http_body::Body::size_hint(response.body()).exact() else {
            return response;
        };
        match self.lease(bytes as usize) {
            Some(lease) => response.map(|body| Body::new(Leased { body, lease })),
            None => {
                use axum::response::IntoResponse;
                crate::error::Rejection::Overloaded {
                    max: self.pool.max(),
                }
                .into_response()
            }
        }
    }
}

/// A body and its lease.
struct Leased {
    body: Body,
    #[allow(dead_code)] // held for its `Drop`
    lease: Lease,
}

impl http_body::Body for Leased {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_holds_its_bytes_until_dropped() {
        let pool = Arc::new(MemoryPool::new(1 << 20));
        let memory = RequestMemory::new(pool.clone(), usize::MAX);
        assert!(memory.answer(1000));
        let answer = memory.lease_body(Response::new(Body::from(vec![b'x'; 300_000])));
        assert_eq!(answer.status(), 200);
        drop(memory);
        assert_eq!(
            pool.used(),
            300_000,
            "the block moved to the body, the rest given back"
        );
        let second = RequestMemory::new(pool.clone(), usize::MAX);
        let refused = second.lease_body(Response::new(Body::from(vec![b'x'; 800_000])));
        assert_eq!(refused.status(), 503);
        let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(bytes.len(), 300_000);
        assert_eq!(pool.used(), 0, "sent: given back");
    }
}
