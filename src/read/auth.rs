//! Upstreams that authenticate: answering a `401`'s challenge, as Docker
//! registries and most HTTP APIs ask (RFC 9110 §11, the Docker registry
//! token flow). The hub sends every request this asks for as a read of its
//! own — the challenge, the token fetch and the retry are each charged,
//! capped and timed like any read; this file decides, and `walk.rs` walks a
//! read through its decisions.
//!
//! - **Basic** (`WWW-Authenticate: Basic`): the read is sent again with the
//!   upstream's configured user and password; later reads to that origin
//!   carry them up front.
//! - **Bearer** (`WWW-Authenticate: Bearer realm=…,service=…,scope=…`): a
//!   token is fetched from the realm (`GET realm?service=…&scope=…`, with the
//!   credentials as Basic, or anonymously), then the read is sent again with
//!   `Authorization: Bearer`. Tokens are kept per upstream origin, realm,
//!   service, scope and user until `expires_in` (60 s when absent) from
//!   `issued_at` (or from receipt), less a tenth (at most 10 s); a read that
//!   names its scope ([`Read::scope`]) sends a kept token up front, so at
//!   steady state it costs one request. Reads of any inbound request that
//!   need the same token at the same moment wait for **one** fetch. A kept
//!   token the upstream rejects is dropped and fetched once more — once.
//!
//! **What fails is forgotten.** A token the upstream answered `401` to is
//! dropped, and the request that sent it never uses or keeps it again
//! (`rejected.rs`: its de-duplicated token fetch would give it back). A
//! remembered realm that fails — its token fetch meets a transport error, a
//! timeout, a redirect the engine will not follow, a `404` or `5xx`, an
//! answer that is not a token — or whose token is rejected again, is
//! forgotten: the next read goes without credentials and learns the
//! upstream's challenge afresh. What is not the realm's doing forgets
//! nothing (`fault.rs`): a `401`/`403` from the realm (the credentials, or a
//! scope the user is not granted) is that read's error alone, and a fetch
//! the engine stopped for its request's own bounds (budget, deadline, host
//! slot, the answer bytes it keeps) is that request's error alone — a read of
//! another request that waited on that fetch fetches again itself, at most
//! twice and never past its own deadline, each fetch a charged read of its
//! own. A realm is checked when the challenge is read (`realm.rs`), so one
//! the engine would not ask is never remembered.
//!
//! **Where credentials go** (`[upstreams."NAME"]`, one per origin): to the
//! upstream's own origin, and to a realm on that origin or listed in its
//! `realms`. A challenge naming any other realm, a plain-`http` realm for an
//! `https` upstream, or a realm with a user, a fragment or text the HTTP
//! client would rewrite, is refused without a request
//! (`UPSTREAM_UNAUTHORIZED`); an upstream without a table answers only
//! challenges whose realm is on its own origin, anonymously. A token is sent
//! only to the origin that asked for it. Redirects drop `Authorization` at
//! another origin (`redirect.rs`). Credentials and tokens appear in no
//! error, span or metric.
//!
//! A read that carries its own `Authorization` header is left alone: its
//! `401` is answered as it is.
//!
//! Beside this file: `walk.rs` walks a read through these decisions —
//! credentials up front, a `401` answered, a token fetched once (and again,
//! by the rule of `fault.rs`) — sending each request it asks for through the
//! hub's [`Sender`](walk::Sender); `challenge.rs` reads `WWW-Authenticate`, `realm.rs`
//! the realm rule, `site.rs` the configured upstreams and what each learned,
//! `token.rs` a realm's answer and the kept tokens, `rejected.rs` the tokens
//! one request saw rejected, `fault.rs` whose doing a failed token fetch is.

mod challenge;
mod fault;
mod realm;
mod rejected;
mod site;
mod token;
pub(crate) mod walk;

use challenge::{challenge, Challenge};
use fault::{Fault, FetchError, REFETCHES};
pub(crate) use rejected::Rejected;
use site::{Learned, Origin, Site};
use token::{rejected_again, token, Token, TokenKey};

use super::message::{Read, UpstreamResponse};
use crate::config::UpstreamTable;
use crate::error::ReadError;
use http::{header, HeaderValue};
use moka::future::Cache;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The credentials and what the engine learned of each upstream's
/// challenges, and the tokens kept.
pub(crate) struct Auth {
    /// The configured upstreams, by origin (one table per origin, as the
    /// configuration's validation requires; a few: looked up by a scan that
    /// allocates nothing).
    sites: Vec<(Origin, Site)>,
    /// Kept tokens, by [`TokenKey`].
    tokens: Cache<TokenKey, Token>,
}

/// Where a bearer token is kept and the realm it comes from: what is
/// forgotten when it fails.
#[derive(Clone)]
pub(crate) struct TokenSource {
    pub(crate) key: TokenKey,
    realm: Arc<str>,
}

/// A token to fetch: where it is kept and the read that fetches it.
pub(crate) struct TokenFetch {
    pub(crate) source: TokenSource,
    pub(crate) read: Read,
}

/// The credentials a read was sent with: the `Authorization` value, and
/// for a bearer token where it came from.
#[derive(Clone)]
pub(crate) struct Sent {
    pub(crate) value: HeaderValue,
    pub(crate) source: Option<TokenSource>,
}

/// What to do with a read before it is sent.
pub(crate) enum Before {
    /// Send it as it is.
    Send,
    /// Send it with these credentials (Basic, or a kept token).
    With(Sent),
    /// Fetch this token first, then send it with the token.
    Fetch(TokenFetch),
}

/// How to answer a `401`.
pub(crate) enum Answer {
    /// Send again with this `Authorization` value.
    With(HeaderValue),
    /// Fetch this token, then send again with it.
    Fetch(TokenFetch),
    /// Give up with this error; nothing more is sent.
    Refuse(ReadError),
}

impl Auth {
    /// The sites of the configured `upstreams` (passwords already resolved
    /// by the configuration's validation; one that fails here is anonymous).
    pub(crate) fn new(upstreams: &BTreeMap<String, UpstreamTable>) -> Self {
        Self {
            sites: upstreams
                .iter()
                .filter_map(|(name, table)| Site::of(name, table))
                .collect(),
            tokens: token::kept(),
        }
    }

    /// The configured upstream `url` goes to.
    fn site(&self, url: &reqwest::Url) -> Option<&Site> {
        self.sites
            .iter()
            .find(|(origin, _)| origin.is(url))
            .map(|(_, site)| site)
    }

    /// Whom the credentials the engine sends to `url`'s upstream belong
    /// to (`origin user`), for the cache's keys; `None` for an upstream
    /// without a table (its tokens, if any, are anonymous).
    pub(crate) fn identity(&self, url: &reqwest::Url) -> Option<&str> {
        self.sites
            .iter()
            .find(|(origin, _)| origin.is(url))
            .map(|(_, site)| &*site.identity)
    }

    /// Whether `read` goes to a configured origin whose challenge is
    /// known, so [`before`](Self::before) may give it credentials.
    pub(crate) fn knows(&self, read: &Read) -> bool {
        !self.sites.is_empty()
            && !has_authorization(read)
            && self
                .site(&read.url)
                .is_some_and(|site| site.learned.read().expect("not poisoned").is_some())
    }

    /// What `read` carries before it is sent: the Basic credentials of an
    /// origin that asked for them, or a token kept (or to fetch) for the
    /// read's scope at an origin whose bearer challenge is known — never one
    /// its request saw `rejected`.
    async fn before(&self, read: &Read, rejected: &Rejected) -> Before {
        let Some(site) = self.site(&read.url) else {
            return Before::Send;
        };
        let learned = site.learned.read().expect("not poisoned").clone();
        match learned {
            None => Before::Send,
            Some(Learned::Basic) => match site.basic() {
                Some(value) => Before::With(Sent {
                    value,
                    source: None,
                }),
                None => Before::Send,
            },
            Some(Learned::Bearer { realm, service }) => {
                let Some(scope) = read.scope_named() else {
                    return Before::Send;
                };
                let Ok(fetch) =
                    self.token_fetch(read, site, &realm, service.as_deref(), Some(scope))
                else {
                    return Before::Send;
                };
                match self.tokens.get(&fetch.source.key).await {
                    Some(token) if rejected.has(&token.header) => {
                        self.drop_token(&fetch.source.key, &token.header).await;
                        Before::Fetch(fetch)
                    }
                    Some(token) => Before::With(Sent {
                        value: token.header,
                        source: Some(fetch.source),
                    }),
                    None => Before::Fetch(fetch),
                }
            }
        }
    }

    /// How to answer `response`, a `401` to `read`. `sent` is what the
    /// read carried: a token it carried is rejected here ([`reject`]), so
    /// the answer fetches a new one.
    ///
    /// [`reject`]: Self::reject
    async fn answer(
        &self,
        read: &Read,
        response: &UpstreamResponse,
        sent: Option<&Sent>,
        rejected: &Rejected,
    ) -> Answer {
        let host = response.host.clone();
        let Some(challenge) = challenge(response) else {
            return Answer::Refuse(ReadError::Unauthorized {
                host,
                message: "answered 401 without a challenge this engine answers".into(),
            });
        };
        let site = self.site(&read.url);
        match challenge {
            Challenge::Basic => {
                let basic = site.and_then(Site::basic);
                match basic {
                    Some(value) if sent.map(|s| &s.value) != Some(&value) => {
                        if let Some(site) = site {
                            site.learn(Learned::Basic);
                        }
                        Answer::With(value)
                    }
                    Some(_) => Answer::Refuse(ReadError::Unauthorized {
                        host,
                        message: "the configured user and password were refused".into(),
                    }),
                    None => Answer::Refuse(ReadError::Unauthorized {
                        host,
                        message: "Basic credentials are required and none are configured".into(),
                    }),
                }
            }
            Challenge::Bearer {
                realm,
                service,
                scope,
                insufficient_scope,
            } => {
                let anonymous = Site::anonymous();
                let chosen = site.unwrap_or(&anonymous);
                let fetch = match self.token_fetch(
                    read,
                    chosen,
                    &realm,
                    service.as_deref(),
                    scope.as_deref(),
                ) {
                    Ok(fetch) => fetch,
                    Err(message) => {
                        return Answer::Refuse(ReadError::Unauthorized { host, message })
                    }
                };
                if let Some(site) = site {
                    site.learn(Learned::Bearer {
                        realm: realm.clone(),
                        service: service.clone(),
                    });
                }
                let Some(sent) = sent else {
                    return Answer::Fetch(fetch);
                };
                if insufficient_scope {
                    return Answer::Refuse(self.not_granted(host, chosen));
                }
                // The token sent was rejected: dropped, and fetched once more.
                self.reject(sent, rejected).await;
                Answer::Fetch(fetch)
            }
        }
    }

    /// The error for a `401` to a read already sent with an answer to its
    /// challenge, `sent`: a token rejected again is rejected ([`reject`])
    /// and its realm forgotten.
    ///
    /// [`reject`]: Self::reject
    async fn refused(
        &self,
        read: &Read,
        response: &UpstreamResponse,
        sent: Option<&Sent>,
        rejected: &Rejected,
    ) -> ReadError {
        let host = response.host.clone();
        let site = self.site(&read.url);
        if let Some(Challenge::Bearer {
            insufficient_scope: true,
            ..
        }) = challenge(response)
        {
            let anonymous = Site::anonymous();
            return self.not_granted(host, site.unwrap_or(&anonymous));
        }
        if let Some(sent) = sent {
            self.reject(sent, rejected).await;
            if let Some(source) = &sent.source {
                self.forget(read, source);
            }
        }
        ReadError::Unauthorized {
            host,
            message: "the upstream refused the credentials it asked for".into(),
        }
    }

    /// `sent` was answered `401`: a token is never sent or kept again by
    /// its request, and is dropped from the kept ones (unless another read
    /// replaced it meanwhile).
    async fn reject(&self, sent: &Sent, rejected: &Rejected) {
        if let Some(source) = &sent.source {
            rejected.note(&sent.value);
            self.drop_token(&source.key, &sent.value).await;
        }
    }

    /// The token fetch from `source` for `read` failed with `err`: if the
    /// realm failed ([`Fault::Realm`]: it answered an error or not at all,
    /// or gave a token already rejected), the realm is forgotten — the next
    /// read learns the upstream's challenge afresh. A refusal of the
    /// credentials or the scope, or a read the engine stopped for its
    /// request's own bounds, says nothing against the realm (`fault.rs`).
    fn fetch_failed(&self, read: &Read, source: &TokenSource, err: &FetchError) {
        if err.fault == Fault::Realm {
            self.forget(read, source);
        }
    }

    /// Forgets the realm of `source` as the challenge of `read`'s upstream
    /// (unless another challenge replaced it meanwhile).
    fn forget(&self, read: &Read, source: &TokenSource) {
        if let Some(site) = self.site(&read.url) {
            site.forget(&source.realm);
        }
    }

    fn not_granted(&self, host: String, site: &Site) -> ReadError {
        if site.password.is_some() {
            ReadError::Forbidden {
                host,
                message: format!("the configured user {:?} is not granted this", site.user),
            }
        } else {
            ReadError::Unauthorized {
                host,
                message: "anonymous access is not granted; configure credentials".into(),
            }
        }
    }

    /// Drops the token kept under `key` if it is still `sent`.
    async fn drop_token(&self, key: &TokenKey, sent: &HeaderValue) {
        use moka::ops::compute::Op;
        self.tokens
            .entry(key.clone())
            .and_compute_with(|kept| {
                let op = match kept {
                    Some(kept) if kept.value().header == sent => Op::Remove,
                    _ => Op::Nop,
                };
                std::future::ready(op)
            })
            .await;
    }

    /// The token fetch for `read`'s origin at `realm`, or why the realm
    /// may not be asked.
    fn token_fetch(
        &self,
        read: &Read,
        site: &Site,
        realm: &str,
        service: Option<&str>,
        scope: Option<&str>,
    ) -> Result<TokenFetch, String> {
        let mut url = realm::allowed(realm, &read.url, &site.realms)?;
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = service {
                query.append_pair("service", service);
            }
            if let Some(scope) = scope {
                query.append_pair("scope", scope);
            }
        }
        let key: TokenKey = format!("{} {} {}", origin(&read.url), url, site.user).into();
        let mut fetch = Read::get(url);
        if let Some(basic) = site.basic() {
            fetch = fetch.header(header::AUTHORIZATION, basic);
        }
        let source = TokenSource {
            key,
            realm: realm.into(),
        };
        Ok(TokenFetch {
            source,
            read: fetch,
        })
    }
}

/// Whether the caller set `Authorization` itself: then nothing here
/// applies to the read.
pub(crate) fn has_authorization(read: &Read) -> bool {
    read.headers.iter().any(|(n, _)| n == header::AUTHORIZATION)
}

/// `read` with `Authorization: value` (replacing one this file set).
pub(crate) fn with_authorization(read: &Read, value: HeaderValue) -> Read {
    let mut read = read.clone();
    read.headers.retain(|(n, _)| n != header::AUTHORIZATION);
    read.headers.push((header::AUTHORIZATION, value));
    read
}

/// `scheme://host:port` of `url`.
fn origin(url: &reqwest::Url) -> String {
    url.origin().ascii_serialization()
}

#[cfg(test)]
mod tests;
