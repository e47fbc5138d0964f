//! The gateway's subscription: `tagChanges(repository, tag)` — the digest a
//! tag points at now, then one event each time it changes.
//!
//! Every subscriber of one (registry, repository, tag) on this replica shares
//! one poll ([`fanout_budget::graphql::SharedPoll`]): a manifest `HEAD` (no
//! pull) every `subscriptions.poll_interval_ms`, paid by the subscribers'
//! connections in turn. A subscriber gets an event when what the poll
//! found differs from what it last got: a new digest, the tag gone or back,
//! or a poll that failed (an `errors` entry, the subscription kept).

use crate::names::TagName;
use crate::oci;
use crate::registries::Repo;
use async_graphql::{Context, SimpleObject, Subscription as SubscriptionRoot};
use fanout_budget::graphql::{FanoutConnection, SharedPoll};
use fanout_budget::ReadError;
use futures::stream::{Stream, StreamExt};
use std::sync::Arc;

/// What a tag points at, as one poll found it (`None`: no such tag).
type Found = Result<Option<(String, String)>, ReadError>;

/// The polls of this replica, by registry, repository and tag (schema data).
pub type TagPolls = SharedPoll<(String, String, String), Found>;

/// A tag's state after a change.
#[derive(Clone, Debug, PartialEq, SimpleObject)]
pub struct TagChange {
    /// The repository, as subscribed.
    pub repository: String,
    /// The tag.
    pub tag: String,
    /// The manifest's digest; null when the tag does not exist.
    pub digest: Option<String>,
    /// The manifest's media type; null when the tag does not exist.
    pub media_type: Option<String>,
}

/// The root subscription.
pub struct Subscription;

#[SubscriptionRoot]
impl Subscription {
    /// The digest `repository:tag` points at now, then one event per change.
    /// One shared poll per tag on each replica (`subscriptions.poll_interval_ms`);
    /// each read is charged to one subscriber's connection, in turn.
    async fn tag_changes(
        &self,
        ctx: &Context<'_>,
        repository: String,
        tag: String,
    ) -> async_graphql::Result<impl Stream<Item = async_graphql::Result<TagChange>>> {
        let connection = ctx.data::<FanoutConnection>().map_err(|_| {
            async_graphql::Error::new("tagChanges is served over WebSocket (graphql-transport-ws)")
        })?;
        let repo: Repo = oci::resolve(ctx, &repository)?;
        let name = TagName::parse(&tag).map_err(|e| ReadError::BadUserInput {
            message: e.to_string(),
        })?;
        let polls = ctx.data::<TagPolls>()?;
        let key = (
            repo.registry().origin().ascii_serialization(),
            repo.shown().to_owned(),
            tag.clone(),
        );
        let (polled, polled_tag) = (Arc::new(repo), Arc::new(name));
        let found = polls.subscribe(key, connection, move |operation| {
            let (repo, tag) = (polled.clone(), polled_tag.clone());
            async move {
                let doc = oci::manifest_now(operation.upstream(), &repo, &tag).await?;
                Ok(doc.map(|doc| (doc.digest, doc.media_type)))
            }
        });
        // One event per change, as this subscriber saw them.
        let changes = found
            .scan(None::<Found>, |last, now| {
                let changed = last.as_ref() != Some(&now);
                *last = Some(now.clone());
                futures::future::ready(Some(changed.then_some(now)))
            })
            .filter_map(futures::future::ready)
            .map(move |now| {
                let (digest, media_type) = now?.unzip();
                Ok(TagChange {
                    repository: repository.clone(),
                    tag: tag.clone(),
                    digest,
                    media_type,
                })
            });
        Ok(changes)
    }
}
