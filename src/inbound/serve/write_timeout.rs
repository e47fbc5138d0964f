//! A write timeout for one connection (`http.write_timeout_ms`).
//!
//! hyper has none: a client that sends a request and then never reads the
//! response keeps the connection, and the response hyper holds for it, for
//! as long as it keeps the socket open. [`WriteTimeout`] wraps the
//! connection's stream. When a write (`poll_write`, `poll_write_vectored`,
//! `poll_flush`, `poll_shutdown`) returns `Pending`, a timer is armed for
//! `timeout` from then, unless it is armed already; a write that returns
//! `Ready` (it made progress, or failed) disarms it. When the timer fires
//! first, that write returns `io::ErrorKind::TimedOut` (and so does every
//! later one): hyper's connection ends with the error and the connection
//! task drops the stream, the response and the connection's slot. The
//! timer's waker is the connection task's: hyper polls a pending write again
//! whenever the task wakes. Reads pass through untouched (the header and
//! body timeouts bound them).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `io` whose writes fail with `TimedOut` after `timeout` without progress.
pub(crate) struct WriteTimeout<T> {
    io: T,
    timeout: Duration,
    /// Allocated at the first write that waits, reused after.
    timer: Option<Pin<Box<Sleep>>>,
    /// A write is waiting and `timer` is its deadline.
    armed: bool,
}

impl<T> WriteTimeout<T> {
    pub(crate) fn new(io: T, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            timer: None,
            armed: false,
        }
    }

    /// What the caller sees of `result`, the wrapped stream's answer to a
    /// write: `Ready` passes through and disarms the timer; `Pending` arms
    /// it (if it is not armed) and is `TimedOut` once it has fired.
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if result.is_ready() {
            self.armed = false;
            return result;
        }
        let deadline = Instant::now() + self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            timer.as_mut().reset(deadline);
            self.armed = true;
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no write progress for {:?} (http.write_timeout_ms)",
                    self.timeout
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_millis(300);

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_reads_fails_at_the_timeout() {
        let (near, _far) = tokio::io::duplex(4096);
        let mut io = WriteTimeout::new(near, TIMEOUT);
        let started = Instant::now();
        let err = io.write_all(&[7; 64 << 10]).await.unwrap_err();
        let waited = started.elapsed();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("http.write_timeout_ms"), "{err}");
        assert!(
            waited >= TIMEOUT && waited < TIMEOUT + Duration::from_millis(50),
            "{waited:?}"
        );
        // Stays failed: the connection is done.
        let again = io.write_all(&[7; 64 << 10]).await.unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_never_cut() {
        let (near, mut far) = tokio::io::duplex(4096);
        let mut io = WriteTimeout::new(near, TIMEOUT);
        // 1 KiB per 200 ms: every wait is shorter than the timeout, the
        // whole write (64 KiB) about 40 times longer.
        let reader = tokio::spawn(async move {
            let mut total = 0;
            let mut chunk = [0u8; 1024];
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                match far.read(&mut chunk).await.unwrap() {
                    0 => return total,
                    n => total += n,
                }
            }
        });
        let started = Instant::now();
        io.write_all(&[7; 64 << 10]).await.unwrap();
        io.shutdown().await.unwrap();
        let took = started.elapsed();
        assert!(took >= TIMEOUT * 30, "{took:?}");
        drop(io);
        assert_eq!(reader.await.unwrap(), 64 << 10);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_are_not_timed() {
        let (near, _far) = tokio::io::duplex(4096);
        let mut io = WriteTimeout::new(near, TIMEOUT);
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(TIMEOUT * 100, io.read(&mut byte)).await;
        assert!(read.is_err(), "a read ended: {read:?}");
    }
}
