//! The OCI Distribution client: every read goes through the engine's
//! acquisition point (`ctx.upstream()`), exactly as any user's resolver would
//! (one function, `read`, sends them all).
//!
//! Each function here is one kind of read from the CONTRACT §5 table. Status
//! handling follows the registry protocol: `NAME_UNKNOWN` on a tag list means
//! "no such repository" (not an error); any other 4xx, a 5xx, a body that is
//! not the expected JSON or a transport failure is `UPSTREAM_ERROR`.

mod tags;

pub use tags::Tags;
use tags::TagsBuilder;

use crate::names::{Digest, Invalid, TagName};
use crate::registries::{Registries, Repo};
use async_graphql::Context;
use fanout_budget::{FanoutContext, Read, ReadError, UpstreamResponse};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::sync::Arc;

/// The `Accept` header for manifests: OCI and Docker, single and multi-platform.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.v2+json, \
application/vnd.docker.distribution.manifest.list.v2+json";

/// [`MANIFEST_ACCEPT`] as a header value, checked once at compile time.
pub static MANIFEST_ACCEPT_HEADER: reqwest::header::HeaderValue =
    reqwest::header::HeaderValue::from_static(MANIFEST_ACCEPT);

/// The upstream registry's base URL (schema data).
#[derive(Clone, Debug)]
pub struct RegistryUrl(pub reqwest::Url);

/// One read: through the engine's acquisition point.
async fn read(ctx: &Context<'_>, read: Read) -> async_graphql::Result<Arc<UpstreamResponse>> {
    Ok(ctx.upstream()?.read(read).await?)
}

/// The default registry's base URL.
pub fn registry<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a reqwest::Url> {
    Ok(&ctx.data::<RegistryUrl>()?.0)
}

/// The repository `name` names (`registries.rs`); the schema's fields and the subscription both resolve names here: on the default registry
/// (`RegistryUrl`) or one of the configured ones (`Registries`, if any).
pub(crate) fn resolve(ctx: &Context<'_>, name: &str) -> async_graphql::Result<Repo> {
    let default = registry(ctx)?;
    let registries = ctx.data_opt::<Registries>();
    let none = Registries::default();
    Ok(registries.unwrap_or(&none).resolve(default, name)?)
}

/// The registry URL with path `segments`, each one percent-encoded as one
/// segment (a `/` or `?` inside one cannot change the path or add a query).
fn endpoint<'s>(
    base: &reqwest::Url,
    segments: impl IntoIterator<Item = &'s str>,
) -> async_graphql::Result<reqwest::Url> {
    let mut url = base.clone();
    url.set_query(None);
    url.set_fragment(None);
    url.path_segments_mut()
        .map_err(|()| format!("registry URL {base} cannot take a path"))?
        .clear()
        .extend(segments);
    Ok(url)
}

/// `/v2/<name>/<a>/<b>` on the repository's registry: the name one segment
/// per component, `a` and `b` one segment each.
fn repo_endpoint(repo: &Repo, [a, b]: [&str; 2]) -> async_graphql::Result<reqwest::Url> {
    endpoint(
        repo.registry(),
        ["v2"]
            .into_iter()
            .chain(repo.name().segments())
            .chain([a, b]),
    )
}

/// A `GET` of `url`, naming the pull scope of `repo` (a registry that wants
/// a token gets the kept one up front: one request, not three).
fn pull(repo: &Repo, url: reqwest::Url) -> Read {
    Read::get(url).scope(repo.pull_scope())
}

/// `read` of what a tag says (a tag list, a manifest by tag), reused across
/// requests for the registry's `tag_ttl_ms` when it sets one.
fn tag_read(repo: &Repo, read: Read) -> Read {
    match repo.tag_ttl() {
        ttl if ttl.is_zero() => read,
        ttl => read.fresh_for(ttl),
    }
}

/// The `rel="next"` target of a `Link` header, resolved against the registry.
fn next_link(response: &UpstreamResponse, base: &reqwest::Url) -> Option<reqwest::Url> {
    let link = response.header("link")?;
    link.split(',')
        .find(|part| part.contains("rel=\"next\""))
        .and_then(|part| {
            let target = part
                .split(';')
                .next()?
                .trim()
                .trim_start_matches('<')
                .trim_end_matches('>');
            base.join(target).ok()
        })
}

/// A registry answer that names something invalid (a catalog entry, a tag,
/// a digest that is not in its grammar): the registry's fault.
pub fn invalid_from_registry(ctx: &Context<'_>, invalid: Invalid) -> ReadError {
    let host = registry(ctx)
        .map(|u| u.authority().to_string())
        .unwrap_or_default();
    ReadError::Upstream {
        host,
        status: None,
        message: format!("the registry answered with {invalid}"),
    }
}

#[derive(Deserialize)]
struct RegistryErrors {
    #[serde(default)]
    errors: Vec<RegistryErrorItem>,
}

#[derive(Deserialize)]
struct RegistryErrorItem {
    code: String,
}

fn is_name_unknown(response: &UpstreamResponse) -> bool {
    response.status == 404 && has_error_code(response, "NAME_UNKNOWN")
}

/// Whether the body is the registry's error JSON naming `code`.
fn has_error_code(response: &UpstreamResponse, code: &str) -> bool {
    serde_json::from_slice::<RegistryErrors>(&response.body)
        .map(|e| e.errors.iter().any(|e| e.code == code))
        .unwrap_or(false)
}

fn expect_success(response: &UpstreamResponse) -> Result<(), ReadError> {
    if response.status.is_success() {
        Ok(())
    } else if response.status == 403 && has_error_code(response, "DENIED") {
        // The credentials do not grant this repository.
        Err(ReadError::Forbidden {
            host: response.host.clone(),
            message: "the registry denied access to this repository".into(),
        })
    } else {
        Err(response.error("unexpected status"))
    }
}

/// A registry API answer (not a blob) must be JSON of some media type.
fn expect_json(response: &UpstreamResponse) -> Result<(), ReadError> {
    expect_success(response)?;
    match response.header("content-type") {
        Some(ct) if !ct.contains("json") => {
            Err(response.error(format!("unexpected content-type {ct}")))
        }
        _ => Ok(()),
    }
}

/// Every tag of `name` (each `Link` page one read); `None` on `NAME_UNKNOWN`.
///
/// Walked, parsed and indexed **once per inbound request**, whoever asks
/// (the first page's [`UpstreamResponse::derived`]): every other field that
/// needs the list gets the same `Arc` instead of parsing the pages again.
///
/// The walk follows `Link: rel="next"` only to a new page of the same list:
/// a link to a page already read in this walk (a self-link, a cycle), to
/// another origin or to another path ends it with `UPSTREAM_ERROR`. Every
/// new page is a charged read, so the budget bounds the pages.
pub async fn tag_list(ctx: &Context<'_>, repo: &Repo) -> async_graphql::Result<Option<Arc<Tags>>> {
    let first = repo_endpoint(repo, ["tags", "list"])?;
    let page = read(ctx, tag_read(repo, pull(repo, first.clone()))).await?;
    let tags = page
        .derived(|| async {
            if is_name_unknown(&page) {
                return Ok(None);
            }
            walk_tags(ctx, repo, first, &page).await.map(Some)
        })
        .await?;
    Ok((*tags).clone())
}

async fn walk_tags(
    ctx: &Context<'_>,
    repo: &Repo,
    first: reqwest::Url,
    page: &UpstreamResponse,
) -> async_graphql::Result<Arc<Tags>> {
    let base = repo.registry();
    let mut seen = vec![first.clone()];
    let mut tags = TagsBuilder::default();
    let mut response = None::<Arc<UpstreamResponse>>;
    loop {
        let page = response.as_deref().unwrap_or(page);
        expect_json(page)?;
        tags.page(&page.body)
            .map_err(|e| page.error(format!("unexpected response body: {e}")))?;
        let next = match next_link(page, base) {
            None => return Ok(Arc::new(tags.build())),
            Some(link) if seen.contains(&link) => {
                return Err(page.error(format!("tag list links back to {link}")).into())
            }
            Some(link) if link.origin() != first.origin() || link.path() != first.path() => {
                return Err(page
                    .error(format!("tag list links out of the list, to {link}"))
                    .into())
            }
            Some(link) => link,
        };
        seen.push(next.clone());
        response = Some(read(ctx, tag_read(repo, pull(repo, next))).await?);
    }
}

/// One catalog page: up to `n` names after `last`, and whether more follow.
///
/// At most `n` names are taken from the answer, whatever it lists: a
/// registry that ignores `n` (16 MB of names) would otherwise make every
/// name a row of the page — and async-graphql sets up every row of a list
/// before the answer's bound counts the first. More names than asked for
/// mean the page has a next one.
pub async fn catalog(
    ctx: &Context<'_>,
    n: usize,
    last: Option<&str>,
) -> async_graphql::Result<(Vec<String>, bool)> {
    let base = registry(ctx)?;
    let mut page = endpoint(base, ["v2", "_catalog"])?;
    page.query_pairs_mut().append_pair("n", &n.to_string());
    if let Some(last) = last {
        page.query_pairs_mut().append_pair("last", last);
    }
    let response = read(ctx, Read::get(page).scope("registry:catalog:*")).await?;
    expect_json(&response)?;
    let (names, beyond) = catalog_names(&response.body, n)
        .map_err(|e| response.error(format!("unexpected response body: {e}")))?;
    let more = beyond || next_link(&response, base).is_some();
    Ok((names, more))
}

/// The first `n` names of a catalog page's `repositories`, and whether it
/// lists more (those are skipped, not kept).
fn catalog_names(body: &[u8], n: usize) -> serde_json::Result<(Vec<String>, bool)> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    struct Page(usize);
    struct Names(usize);

    impl<'de> Visitor<'de> for Page {
        type Value = (Vec<String>, bool);

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a catalog object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut names = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "repositories" && names.is_none() {
                    names = Some(map.next_value_seed(Names(self.0))?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            names.ok_or_else(|| serde::de::Error::missing_field("repositories"))
        }
    }

    impl<'de> DeserializeSeed<'de> for Names {
        type Value = (Vec<String>, bool);

        fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
            de.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Names {
        type Value = (Vec<String>, bool);

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of repository names")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut names = Vec::with_capacity(self.0.min(seq.size_hint().unwrap_or(0)));
            while names.len() < self.0 {
                match seq.next_element::<String>()? {
                    Some(name) => names.push(name),
                    None => return Ok((names, false)),
                }
            }
            let mut beyond = false;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                beyond = true;
            }
            Ok((names, beyond))
        }
    }

    let mut de = serde_json::Deserializer::from_slice(body);
    let page = de.deserialize_map(Page(n))?;
    de.end()?;
    Ok(page)
}

/// The longest string the gateway takes from a manifest or a config for
/// the schema's short fields (media types, digests, platforms, `os`,
/// `created`): real ones are under 130 bytes (a media type is at most
/// 127 + 1 + 127, RFC 6838), and a registry serves whatever was pushed — a
/// 15 MB `os`, aliased in one query, would multiply into the answer. Longer
/// is `UPSTREAM_ERROR`.
pub const MAX_SHORT_FIELD: usize = 256;

/// A short field (see [`MAX_SHORT_FIELD`]).
fn short<'de, D: serde::Deserializer<'de>>(de: D) -> Result<String, D::Error> {
    let s = String::deserialize(de)?;
    if s.len() > MAX_SHORT_FIELD {
        return Err(serde::de::Error::custom(format_args!(
            "a {}-byte value where at most {MAX_SHORT_FIELD} are taken",
            s.len()
        )));
    }
    Ok(s)
}

/// An optional short field (see [`MAX_SHORT_FIELD`]).
fn short_opt<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    struct Short(#[serde(deserialize_with = "short")] String);
    Ok(Option::<Short>::deserialize(de)?.map(|s| s.0))
}

/// A content descriptor.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DescriptorDoc {
    /// Its media type.
    #[serde(default, deserialize_with = "short")]
    pub media_type: String,
    /// `sha256:…`
    #[serde(deserialize_with = "short")]
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its platform (index entries only).
    pub platform: Option<PlatformDoc>,
}

/// A platform of an index entry.
#[derive(Clone, Debug, Deserialize)]
pub struct PlatformDoc {
    /// e.g. `linux`
    #[serde(deserialize_with = "short")]
    pub os: String,
    /// e.g. `amd64`
    #[serde(deserialize_with = "short")]
    pub architecture: String,
    /// e.g. `v8`
    #[serde(default, deserialize_with = "short_opt")]
    pub variant: Option<String>,
}

/// A manifest as read: an image (config + layers) or an index (manifests).
#[derive(Clone, Debug)]
pub struct ManifestDoc {
    /// Its digest (`Docker-Content-Digest`, else the SHA-256 of its bytes).
    pub digest: String,
    /// Its media type (the body's, else the `Content-Type`).
    pub media_type: String,
    /// The image's config descriptor; `None` for an index.
    pub config: Option<DescriptorDoc>,
    /// The image's layers.
    pub layers: Vec<DescriptorDoc>,
    /// The index's entries.
    pub manifests: Vec<DescriptorDoc>,
}

/// The registries seen answering a manifest `HEAD` without
/// `Docker-Content-Digest` (schema data; by origin, so bounded by the
/// registries configured): their manifests are read with a `GET` at once.
#[derive(Debug, Default)]
pub struct DigestlessHeads(std::sync::RwLock<Vec<String>>);

impl DigestlessHeads {
    fn seen(&self, registry: &reqwest::Url) -> bool {
        let origin = registry.origin().ascii_serialization();
        let seen = self.0.read().unwrap_or_else(|e| e.into_inner());
        seen.contains(&origin)
    }

    fn saw(&self, registry: &reqwest::Url) {
        let origin = registry.origin().ascii_serialization();
        let mut seen = self.0.write().unwrap_or_else(|e| e.into_inner());
        if !seen.contains(&origin) {
            seen.push(origin);
        }
    }
}

/// The manifest `repo:tag` (one read).
///
/// With `head`, when the query needs only what the headers say (`digest`,
/// `mediaType`), a `HEAD`: a registry that meters pulls counts a manifest
/// `GET` as one and a `HEAD` as none. A `HEAD` answered without
/// `Docker-Content-Digest` is followed by the `GET` (one read more, past the
/// one read the cost preview priced) — once: the registry is remembered
/// ([`DigestlessHeads`]) and its manifests are read with a `GET` from then
/// on, one read each, so `requested` stays an upper bound.
pub async fn manifest(
    ctx: &Context<'_>,
    repo: &Repo,
    tag: &TagName,
    head: bool,
) -> async_graphql::Result<Arc<ManifestDoc>> {
    let url = repo_endpoint(repo, ["manifests", tag.as_str()])?;
    let digestless = ctx.data_opt::<DigestlessHeads>();
    if head && !digestless.is_some_and(|d| d.seen(repo.registry())) {
        let probe = Read::new(reqwest::Method::HEAD, url.clone())
            .accept(MANIFEST_ACCEPT_HEADER.clone())
            .scope(repo.pull_scope());
        let response = read(ctx, tag_read(repo, probe)).await?;
        if let Some(doc) = manifest_from_headers(&response)? {
            return Ok(Arc::new(doc));
        }
        if let Some(digestless) = digestless {
            digestless.saw(repo.registry());
        }
    }
    let manifest = pull(repo, url).accept(MANIFEST_ACCEPT_HEADER.clone());
    let response = read(ctx, tag_read(repo, manifest)).await?;
    // Parsed (and hashed) once per request, for every tag row sharing it.
    let doc = response
        .derived(|| async { parse_manifest(&response) })
        .await?;
    Ok(doc)
}

/// The digest and media type `repo:tag` points at now, read through
/// `upstream` (a subscription's poll): a `HEAD` (a registry that meters
/// pulls counts none), or — a registry whose `HEAD` names no digest — the
/// `GET` after it. `None`: the tag does not exist (yet).
pub async fn manifest_now(
    upstream: fanout_budget::read::Upstream<'_>,
    repo: &Repo,
    tag: &TagName,
) -> Result<Option<ManifestDoc>, ReadError> {
    let url = repo_endpoint(repo, ["manifests", tag.as_str()])
        .map_err(|e| ReadError::BadUserInput { message: e.message })?;
    let head = Read::new(reqwest::Method::HEAD, url.clone())
        .accept(MANIFEST_ACCEPT_HEADER.clone())
        .scope(repo.pull_scope());
    let response = upstream.read(head).await?;
    if response.status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if let Some(doc) = manifest_from_headers(&response)? {
        return Ok(Some(doc));
    }
    let get = pull(repo, url).accept(MANIFEST_ACCEPT_HEADER.clone());
    let response = upstream.read(get).await?;
    if response.status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    parse_manifest(&response).map(Some)
}

/// What a manifest `HEAD` says: its digest and media type, or `None`
/// when it names no digest.
fn manifest_from_headers(response: &UpstreamResponse) -> Result<Option<ManifestDoc>, ReadError> {
    expect_success(response)?;
    let Some(digest) = response.header("docker-content-digest") else {
        return Ok(None);
    };
    let media_type = response
        .header("content-type")
        .map(|c| c.split(';').next().unwrap_or(c).trim())
        .unwrap_or_default();
    if digest.len() > MAX_SHORT_FIELD || media_type.len() > MAX_SHORT_FIELD {
        return Err(response.error("a digest or media type longer than the gateway takes"));
    }
    Ok(Some(ManifestDoc {
        digest: digest.to_string(),
        media_type: media_type.to_string(),
        config: None,
        layers: Vec::new(),
        manifests: Vec::new(),
    }))
}

/// Descriptors one manifest may list (`layers` or `manifests`); more is
/// `UPSTREAM_ERROR`. Images have tens of layers (Docker refuses past 127),
/// indexes a few dozen platforms: a manifest listing thousands is an
/// upstream trying to multiply the answer. The complexity limit prices a
/// descriptor list at this many rows.
pub const MAX_DESCRIPTORS: usize = 256;

fn parse_manifest(response: &UpstreamResponse) -> Result<ManifestDoc, ReadError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Body {
        #[serde(default, deserialize_with = "short_opt")]
        media_type: Option<String>,
        config: Option<DescriptorDoc>,
        #[serde(default)]
        layers: Vec<DescriptorDoc>,
        manifests: Option<Vec<DescriptorDoc>>,
    }
    expect_json(response)?;
    let body: Body = response.json()?;
    let listed = body
        .layers
        .len()
        .max(body.manifests.as_ref().map_or(0, Vec::len));
    if listed > MAX_DESCRIPTORS {
        return Err(response.error(format!(
            "manifest lists {listed} descriptors; at most {MAX_DESCRIPTORS} are read"
        )));
    }
    let media_type = body
        .media_type
        .or_else(|| {
            response
                .header("content-type")
                .map(|c| c.split(';').next().unwrap_or(c).trim().to_string())
        })
        .unwrap_or_default();
    let is_index = body.manifests.is_some()
        || media_type.contains("index")
        || media_type.contains("manifest.list");
    if !is_index && body.config.is_none() {
        return Err(response.error("manifest has neither config nor manifests"));
    }
    let digest = match response.header("docker-content-digest") {
        Some(d) => d.to_string(),
        None => format!("sha256:{:x}", Sha256::digest(&response.body)),
    };
    Ok(ManifestDoc {
        digest,
        media_type,
        config: if is_index { None } else { body.config },
        layers: if is_index { Vec::new() } else { body.layers },
        manifests: body.manifests.unwrap_or_default(),
    })
}

/// An image config's fields the schema exposes.
#[derive(Clone, Debug, Deserialize)]
pub struct ImageConfigDoc {
    /// e.g. `linux`
    #[serde(default, deserialize_with = "short_opt")]
    pub os: Option<String>,
    /// e.g. `amd64`
    #[serde(default, deserialize_with = "short_opt")]
    pub architecture: Option<String>,
    /// RFC 3339 creation time.
    #[serde(default, deserialize_with = "short_opt")]
    pub created: Option<String>,
}

/// The config blob `digest` of `name` (one read).
pub async fn config_blob(
    ctx: &Context<'_>,
    repo: &Repo,
    digest: &Digest,
) -> async_graphql::Result<Arc<ImageConfigDoc>> {
    let url = repo_endpoint(repo, ["blobs", digest.as_str()])?;
    // Content addressed by its digest never changes: kept in the engine's
    // cache once its bytes are checked against the digest (a registry
    // cannot plant content), then read by no request again.
    let mut blob = pull(repo, url);
    if digest.as_str().starts_with("sha256:") {
        blob = blob.immutable().sha256(digest.as_str());
    }
    let response = read(ctx, blob).await?;
    let doc = response
        .derived(|| async {
            expect_success(&response)?;
            response.json::<ImageConfigDoc>()
        })
        .await?;
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::catalog_names;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_catalog_page_keeps_at_most_the_names_asked_for() {
        let body = br#"{"repositories":["a","b","c"],"x":1}"#;
        assert_eq!(catalog_names(body, 2).unwrap(), (names(&["a", "b"]), true));
        assert_eq!(
            catalog_names(body, 3).unwrap(),
            (names(&["a", "b", "c"]), false)
        );
        assert_eq!(
            catalog_names(body, 100).unwrap(),
            (names(&["a", "b", "c"]), false)
        );
        assert_eq!(
            catalog_names(br#"{"repositories":[]}"#, 5).unwrap(),
            (vec![], false)
        );
    }

    #[test]
    fn a_body_that_is_not_a_catalog_is_an_error() {
        for body in [
            &br#"{"repositories":null}"#[..],
            br#"{"names":["a"]}"#,
            br#"{"repositories":["a",1]}"#,
            br#"["a"]"#,
            br#"{"repositories":["a"]} trailing"#,
        ] {
            assert!(
                catalog_names(body, 2).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
