//! The walk of a read whose upstream authenticates, as `auth.rs` tells it:
//! credentials up front, a `401` answered at most twice, a bearer token kept
//! or fetched — once for every read of any request that needs it
//! meanwhile, and fetched again by a read whose shared fetch another
//! request's own bounds stopped (`fault.rs`). Every request the walk asks
//! for is sent by the read path ([`Sender`], the hub) as a read of its own:
//! de-duplicated, charged, capped and timed like any read.

use super::{has_authorization, rejected_again, token, with_authorization, REFETCHES};
use super::{Answer, Auth, Before, Fault, FetchError, Rejected, Sent, Token, TokenFetch};
use crate::error::ReadError;
use crate::read::message::{Read, UpstreamResponse};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use tokio::time::Instant;

/// A read's answer, or its error.
type ReadResult = Result<Arc<UpstreamResponse>, ReadError>;

/// The read path, as the walk uses it: the hub implements it for the read
/// being answered (generic: nothing boxed or dispatched per read).
pub(crate) trait Sender: Sync {
    /// Sends `read` as a read of its own, its redirects followed; `read`
    /// becomes the last request sent (the one the answer is to).
    fn follow(&self, read: &mut Read) -> impl Future<Output = ReadResult> + Send;

    /// Sends `ask`, a token fetch, as [`follow`](Self::follow) does, inside
    /// the span of a token fetch.
    fn fetch_token(&self, ask: &mut Read) -> impl Future<Output = ReadResult> + Send;

    /// The tokens the read's request saw rejected.
    fn rejected(&self) -> &Rejected;

    /// The read's request's deadline.
    fn deadline(&self) -> Instant;

    /// The name the read path gives `url`'s host in errors (`HOST:PORT`).
    fn host_name(&self, url: &reqwest::Url) -> String;
}

/// Whether `response`, the answer to `read`, is a `401` the walk answers:
/// not when the caller set `Authorization` itself.
pub(crate) fn challenges(read: &Read, response: &UpstreamResponse) -> bool {
    response.status == http::StatusCode::UNAUTHORIZED && !has_authorization(read)
}

impl Auth {
    /// A read to an origin whose challenge is known ([`knows`](Self::knows)):
    /// its credentials up front (a kept token, fetched first if need be, or
    /// Basic), then any `401` answered.
    pub(crate) async fn with_credentials<S: Sender>(&self, send: &S, read: Read) -> ReadResult {
        let sent = match self.before(&read, send.rejected()).await {
            Before::Send => None,
            Before::With(sent) => Some(sent),
            Before::Fetch(fetch) => Some(self.token(send, &read, fetch).await?),
        };
        let mut carried = match &sent {
            Some(sent) => with_authorization(&read, sent.value.clone()),
            None => read,
        };
        let response = send.follow(&mut carried).await?;
        if response.status != http::StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        self.challenged(send, carried, response, sent).await
    }

    /// The answers to a `401` to `read`: at most two rounds — a token the
    /// upstream rejects is dropped and fetched once more, once; rejected
    /// again, its realm is forgotten.
    pub(crate) async fn challenged<S: Sender>(
        &self,
        send: &S,
        read: Read,
        mut response: Arc<UpstreamResponse>,
        mut sent: Option<Sent>,
    ) -> ReadResult {
        let rejected = send.rejected();
        for _round in 0..2 {
            let next = match self.answer(&read, &response, sent.as_ref(), rejected).await {
                Answer::With(value) => Sent {
                    value,
                    source: None,
                },
                Answer::Fetch(fetch) => self.token(send, &read, fetch).await?,
                Answer::Refuse(err) => return Err(err),
            };
            let mut retry = with_authorization(&read, next.value.clone());
            response = send.follow(&mut retry).await?;
            if response.status != http::StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            sent = Some(next);
        }
        Err(self
            .refused(&read, &response, sent.as_ref(), rejected)
            .await)
    }

    /// A bearer token for `read`: kept, or fetched as a read of this
    /// request — once for every read of any request that needs it
    /// meanwhile; a read waiting for another's fetch waits no longer than
    /// its deadline, and fetches again itself (at most [`REFETCHES`] times)
    /// when that fetch was stopped by its own request's bounds. A token
    /// this request saw rejected is an error, and is not kept; a realm that
    /// fails is forgotten (`fault.rs`).
    async fn token<S: Sender>(
        &self,
        send: &S,
        read: &Read,
        fetch: TokenFetch,
    ) -> Result<Sent, ReadError> {
        let TokenFetch { source, read: ask } = fetch;
        let (rejected, deadline) = (send.rejected(), send.deadline());
        let mut refetches = 0;
        let outcome = loop {
            // Set if this read's own fetch runs (not another's it waits on).
            let ran = AtomicBool::new(false);
            let fetched =
                (self.tokens).try_get_with(source.key.clone(), fetch_token(send, &ask, &ran));
            match tokio::time::timeout_at(deadline, fetched).await {
                // Kept by another request that did not see it rejected: dropped.
                Ok(Ok(token)) if rejected.has(&token.header) => {
                    self.drop_token(&source.key, &token.header).await;
                    let host = send.host_name(&ask.url);
                    break Err(FetchError::realm(rejected_again(host)));
                }
                Ok(Ok(token)) => break Ok(token.header),
                // Another request's fetch, stopped by that request's own
                // bounds: nothing to do with this one, which fetches again.
                Ok(Err(shared))
                    if shared.fault == Fault::Fetcher
                        && !ran.load(Relaxed)
                        && refetches < REFETCHES =>
                {
                    refetches += 1;
                }
                Ok(Err(shared)) => break Err((*shared).clone()),
                Err(_elapsed) => return Err(ReadError::DeadlineExceeded),
            }
        };
        match outcome {
            Ok(value) => Ok(Sent {
                value,
                source: Some(source),
            }),
            Err(err) => {
                self.fetch_failed(read, &source, &err);
                Err(err.error)
            }
        }
    }
}

/// A token fetched by `ask`, a read of this request (`ran` set as it
/// starts), and whose doing its failure is (`fault.rs`).
async fn fetch_token<S: Sender>(
    send: &S,
    ask: &Read,
    ran: &AtomicBool,
) -> Result<Token, FetchError> {
    ran.store(true, Relaxed);
    let mut ask = ask.clone();
    let response = send.fetch_token(&mut ask).await;
    let response = response.map_err(FetchError::read)?;
    let token = token(&response)?;
    if send.rejected().has(&token.header) {
        // The request's de-duplicated answer: the token rejected.
        let host = response.host.clone();
        return Err(FetchError::realm(rejected_again(host)));
    }
    Ok(token)
}
