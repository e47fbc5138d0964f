//! The reference schema (CONTRACT §4) and its read accounting (§5).
//!
//! Resolvers read only through [`crate::oci`], which reads only through the
//! engine's acquisition point; nullable fields that read use
//! [`OrNull::or_null`] so a failed read nulls only its own field.
//!
//! Every resolver that reads awaits its read boxed: async-graphql boxes each
//! field's future at the size of its object's largest resolver, so one read
//! held inline (1–2 KiB) would make every sibling field — a `name`, a
//! `digest` — that large, allocated and copied for each row.

use crate::names::{Digest, RepoName, TagName};
use crate::oci::{self, DescriptorDoc, ManifestDoc, Tags};
use crate::registries::{Registries, Repo};
use crate::subscription::Subscription;
use async_graphql::{
    Context, EmptyMutation, InputValueError, InputValueResult, Object, Scalar, ScalarType, Schema,
    SimpleObject, Value,
};
use fanout_budget::{
    cost::directives::{cost, fanout_provides, fanout_shared, list_size},
    cost::CostTable,
    FanoutContext, OrNull, ReadError,
};
use std::sync::Arc;

/// The gateway's schema type.
pub type RegistrySchema = Schema<Query, EmptyMutation, Subscription>;

/// The shared read of a repository: its tag list.
const TAG_LIST: &str = "tag list";

/// The cost preview's table: empty, for what each field may read (CONTRACT
/// §5) is declared on the schema's fields — `@cost(weight:)` the reads,
/// `@listSize` the pages, `@fanoutShared`/`@fanoutProvides` a repository's
/// one tag list, made by `repository(name)` itself, else by the first of
/// `tags` and `tag` that a repository of `repositories` asks for
/// (`schema/registry.graphql` shows them).
pub fn costs() -> CostTable {
    CostTable::new()
}

/// `@listSize`'s slicing arguments and sized fields for a page of `first`
/// rows: the connection's `nodes`.
fn page() -> (Option<Vec<String>>, Option<Vec<String>>) {
    let strings = |s: &str| Some(vec![s.to_string()]);
    (strings("first"), strings("nodes"))
}

/// The schema, without the engine's extension (see [`crate::app`]).
pub fn builder() -> async_graphql::SchemaBuilder<Query, EmptyMutation, Subscription> {
    Schema::build(Query, EmptyMutation, Subscription)
}

/// A page's weight for async-graphql's complexity limit: its rows times
/// what each row selects (`first` clamped to its valid range, 1..=100), so
/// the limit bounds the fields of the *answer*, lists multiplied out — not
/// only the fields of the query.
fn list_complexity(first: i32, child_complexity: usize) -> usize {
    (first.clamp(1, 100) as usize).saturating_mul(child_complexity) + 1
}

/// What a descriptor list (`layers`, `manifests`) weighs in the complexity
/// limit, in rows: the most a manifest may list ([`oci::MAX_DESCRIPTORS`]),
/// so the limit prices the answer at its real worst case.
const DESCRIPTOR_WEIGHT: usize = oci::MAX_DESCRIPTORS;

/// `first` must be 1..=100.
fn page_size(first: i32) -> Result<usize, ReadError> {
    if (1..=100).contains(&first) {
        Ok(first as usize)
    } else {
        Err(ReadError::BadUserInput {
            message: format!("first must be between 1 and 100, got {first}"),
        })
    }
}

/// The root query.
pub struct Query;

#[Object]
impl Query {
    /// One repository. Null, without error, when the registry answers NAME_UNKNOWN.
    #[graphql(
        directive = cost::apply("1".to_string()),
        directive = fanout_provides::apply(TAG_LIST.to_string())
    )]
    async fn repository(&self, ctx: &Context<'_>, name: String) -> Option<Repository> {
        // Its registry found and its name checked against the OCI grammar
        // before any read.
        let repo = oci::resolve(ctx, &name).or_null(ctx)?;
        let tags = Box::pin(oci::tag_list(ctx, &repo)).await.or_null(ctx)??;
        Some(Repository {
            repo,
            tags: Some(tags),
        })
    }

    /// One page of the registry catalog (GET /v2/_catalog).
    #[graphql(
        complexity = "list_complexity(first, child_complexity)",
        directive = cost::apply("1".to_string()),
        directive = list_size::apply(None, page().0, page().1, None)
    )]
    async fn repositories(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: i32,
        after: Option<String>,
    ) -> async_graphql::Result<RepositoryConnection> {
        let n = page_size(first)?;
        let (names, more) = Box::pin(oci::catalog(ctx, n, after.as_deref())).await?;
        let end_cursor = names.last().cloned();
        let registry = oci::registry(ctx)?;
        let ttl = ctx
            .data_opt::<Registries>()
            .map_or(Default::default(), Registries::default_tag_ttl);
        let nodes = names
            .into_iter()
            .map(|shown| {
                let name =
                    RepoName::parse(&shown).map_err(|e| oci::invalid_from_registry(ctx, e))?;
                let repo = Repo::with_tag_ttl(registry.clone(), name, shown, ttl);
                Ok(Repository { repo, tags: None })
            })
            .collect::<Result<_, ReadError>>()?;
        Ok(RepositoryConnection {
            nodes,
            page_info: PageInfo {
                has_next_page: more,
                end_cursor,
            },
        })
    }

    /// This HTTP request's fan-out budget as it stands when the field resolves.
    async fn fanout_budget(&self, ctx: &Context<'_>) -> async_graphql::Result<FanoutBudget> {
        let b = ctx.fanout_request()?.budget().snapshot();
        Ok(FanoutBudget {
            limit: b.limit,
            used: b.used,
            remaining: b.remaining,
            requested: b.requested,
        })
    }

    /// The client's read quota as it stands when the field resolves; null
    /// when the client has none.
    async fn fanout_quota(&self, ctx: &Context<'_>) -> async_graphql::Result<Option<FanoutQuota>> {
        Ok(ctx.fanout_request()?.quota().map(|q| FanoutQuota {
            limit: q.limit,
            remaining: q.remaining,
            reset_at: q.reset_at_rfc3339(),
        }))
    }
}

/// The client's read quota (`[quota]`): upstream reads it may cause over
/// time, as GitHub's `rateLimit` shows its points.
#[derive(SimpleObject)]
pub struct FanoutQuota {
    /// The most reads the quota holds (its burst).
    limit: u64,
    /// Reads left once this request has settled (what it reserved and has
    /// not spent counted as given back).
    remaining: u64,
    /// When the quota is full again (RFC 3339).
    reset_at: String,
}

/// A request's fan-out budget.
#[derive(SimpleObject)]
pub struct FanoutBudget {
    limit: u64,
    used: u64,
    remaining: u64,
    /// The whole request's worst-case reads, from the operations priced so far.
    requested: u64,
}

/// Relay-style page information.
#[derive(SimpleObject)]
pub struct PageInfo {
    has_next_page: bool,
    end_cursor: Option<String>,
}

/// A page of repositories.
#[derive(SimpleObject)]
pub struct RepositoryConnection {
    nodes: Vec<Repository>,
    page_info: PageInfo,
}

/// A repository; its tag list is read once per request, when first needed.
pub struct Repository {
    repo: Repo,
    tags: Option<Arc<Tags>>,
}

impl Repository {
    async fn tag_list(&self, ctx: &Context<'_>) -> async_graphql::Result<Arc<Tags>> {
        match &self.tags {
            Some(tags) => Ok(tags.clone()),
            // Listed in the catalog but gone by now: no tags.
            None => Ok(Box::pin(oci::tag_list(ctx, &self.repo))
                .await?
                .unwrap_or_default()),
        }
    }
}

#[Object]
impl Repository {
    async fn name(&self) -> &str {
        self.repo.shown()
    }

    #[graphql(
        complexity = "list_complexity(first, child_complexity)",
        directive = cost::apply("1".to_string()),
        directive = fanout_shared::apply(TAG_LIST.to_string()),
        directive = list_size::apply(None, page().0, page().1, None)
    )]
    async fn tags(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: i32,
        after: Option<String>,
    ) -> async_graphql::Result<TagConnection> {
        let n = page_size(first)?;
        let tags = self.tag_list(ctx).await?;
        let start = match &after {
            None => 0,
            Some(cursor) => match tags.position(cursor) {
                Some(i) => i + 1,
                None => {
                    // Not echoed whole: a long cursor in many fields would
                    // multiply into a huge answer.
                    let shown: String = cursor.chars().take(64).collect();
                    return Err(ReadError::BadUserInput {
                        message: format!("unknown cursor {shown:?}"),
                    }
                    .into());
                }
            },
        };
        let end = tags.len().min(start.saturating_add(n));
        Ok(TagConnection {
            repository: self.repo.clone(),
            tags,
            rows: start.min(end)..end,
        })
    }

    #[graphql(
        directive = cost::apply("1".to_string()),
        directive = fanout_shared::apply(TAG_LIST.to_string())
    )]
    async fn tag(&self, ctx: &Context<'_>, name: String) -> async_graphql::Result<Option<Tag>> {
        let tags = self.tag_list(ctx).await?;
        Ok(tags.position(&name).map(|index| Tag {
            repository: self.repo.clone(),
            tags,
            index,
        }))
    }
}

// Positions in the request's one tag list: nothing of the list is copied
// until a field resolves (and is counted). A page holding copies of its
// names while a row waits on a read would hold what the answer's bound does
// not see, and a registry's tag names can be long
// (`gateway/tests/memory_attacks.rs`, `fat_tags`).
/// A page of tags.
pub struct TagConnection {
    repository: Repo,
    tags: Arc<Tags>,
    rows: std::ops::Range<usize>,
}

/// A page of tags.
#[Object]
impl TagConnection {
    async fn nodes(&self) -> Vec<Tag> {
        self.rows
            .clone()
            .map(|index| Tag {
                repository: self.repository.clone(),
                tags: self.tags.clone(),
                index,
            })
            .collect()
    }

    async fn page_info(&self) -> PageInfo {
        PageInfo {
            has_next_page: self.rows.end < self.tags.len(),
            end_cursor: (!self.rows.is_empty())
                .then(|| self.tags.get(self.rows.end - 1))
                .flatten()
                .map(str::to_string),
        }
    }

    async fn total_count(&self) -> i32 {
        self.tags.len() as i32
    }
}

/// A tag of a repository: its position in the request's tag list.
pub struct Tag {
    repository: Repo,
    tags: Arc<Tags>,
    index: usize,
}

impl Tag {
    fn tag(&self) -> &str {
        self.tags.get(self.index).unwrap_or_default()
    }
}

#[Object]
impl Tag {
    async fn name(&self) -> &str {
        self.tag()
    }

    #[graphql(directive = cost::apply("1".to_string()))]
    async fn manifest(&self, ctx: &Context<'_>) -> Option<Manifest> {
        // The tag comes from the registry's own tag list.
        let tag = TagName::parse(self.tag())
            .map_err(|e| oci::invalid_from_registry(ctx, e))
            .or_null(ctx)?;
        // Only what the headers say is wanted: a `HEAD` (no pull counted).
        let wanted = ctx.look_ahead();
        let head = !["layers", "manifests", "config"]
            .into_iter()
            .any(|field| wanted.field(field).exists());
        let doc = Box::pin(oci::manifest(ctx, &self.repository, &tag, head))
            .await
            .or_null(ctx)?;
        Some(Manifest {
            repository: self.repository.clone(),
            doc,
        })
    }
}

/// An image manifest or an index.
pub struct Manifest {
    repository: Repo,
    doc: Arc<ManifestDoc>,
}

#[Object]
impl Manifest {
    async fn digest(&self) -> &str {
        &self.doc.digest
    }

    async fn media_type(&self) -> &str {
        &self.doc.media_type
    }

    #[graphql(complexity = "DESCRIPTOR_WEIGHT * child_complexity + 1")]
    async fn layers(&self) -> Vec<Descriptor> {
        self.doc.layers.iter().map(Descriptor::from).collect()
    }

    #[graphql(complexity = "DESCRIPTOR_WEIGHT * child_complexity + 1")]
    async fn manifests(&self) -> Vec<PlatformManifest> {
        self.doc
            .manifests
            .iter()
            .map(PlatformManifest::from)
            .collect()
    }

    #[graphql(directive = cost::apply("1".to_string()))]
    async fn config(&self, ctx: &Context<'_>) -> Option<ImageConfig> {
        let config = self.doc.config.as_ref()?;
        // The digest comes from the manifest the registry served.
        let digest = Digest::parse(&config.digest)
            .map_err(|e| oci::invalid_from_registry(ctx, e))
            .or_null(ctx)?;
        let doc = Box::pin(oci::config_blob(ctx, &self.repository, &digest))
            .await
            .or_null(ctx)?;
        Some(ImageConfig {
            os: doc.os.clone(),
            architecture: doc.architecture.clone(),
            created: doc.created.clone(),
        })
    }
}

/// A content descriptor.
#[derive(SimpleObject)]
pub struct Descriptor {
    digest: String,
    media_type: String,
    size: Bytes,
}

impl From<&DescriptorDoc> for Descriptor {
    fn from(d: &DescriptorDoc) -> Self {
        Self {
            digest: d.digest.clone(),
            media_type: d.media_type.clone(),
            size: Bytes(d.size),
        }
    }
}

/// An entry of an index.
#[derive(SimpleObject)]
pub struct PlatformManifest {
    digest: String,
    media_type: String,
    size: Bytes,
    platform: Option<Platform>,
}

impl From<&DescriptorDoc> for PlatformManifest {
    fn from(d: &DescriptorDoc) -> Self {
        Self {
            digest: d.digest.clone(),
            media_type: d.media_type.clone(),
            size: Bytes(d.size),
            platform: d.platform.as_ref().map(|p| Platform {
                os: p.os.clone(),
                architecture: p.architecture.clone(),
                variant: p.variant.clone(),
            }),
        }
    }
}

/// A platform.
#[derive(SimpleObject)]
pub struct Platform {
    os: String,
    architecture: String,
    variant: Option<String>,
}

/// An image's config.
#[derive(SimpleObject)]
pub struct ImageConfig {
    os: Option<String>,
    architecture: Option<String>,
    created: Option<String>,
}

/// A byte count; 64-bit, so not GraphQL Int.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

#[Scalar(name = "Bytes")]
impl ScalarType for Bytes {
    fn parse(value: Value) -> InputValueResult<Self> {
        match &value {
            Value::Number(n) => n
                .as_u64()
                .map(Bytes)
                .ok_or_else(|| InputValueError::expected_type(value)),
            Value::String(s) => s
                .parse()
                .map(Bytes)
                .map_err(|_| InputValueError::expected_type(value)),
            _ => Err(InputValueError::expected_type(value)),
        }
    }

    fn to_value(&self) -> Value {
        Value::from(self.0)
    }
}
