//! Registries by name, as Docker names them.
//!
//! `repository(name: "ghcr.io/owner/app")` reads `owner/app` on the
//! registry configured as `[upstreams."ghcr.io"]`; a name without a
//! registry prefix (`acme/app`, `alpine`) reads the default registry — the
//! `--upstream` URL, else the upstream marked `primary = true`. As in Docker,
//! the first component of a name is a registry prefix when it holds a `.`
//! or a `:`, or is `localhost`. A one-part name on a registry with
//! `short_name_prefix = "library"` reads `library/<name>` (Docker's rule for
//! official images).
//!
//! A prefix that names no configured registry is `BAD_USER_INPUT` before any
//! read: a client cannot make the gateway read a host the operator did not
//! configure. A prefix equal to the default registry's own `host:port` reads
//! the default registry.

use crate::names::RepoName;
use fanout_budget::{Config, ReadError};
use std::sync::Arc;
use std::time::Duration;

/// The configured registries (schema data).
#[derive(Clone, Debug, Default)]
pub struct Registries {
    /// By prefix (the `[upstreams]` table's name, lowercased).
    named: Vec<(String, Registry)>,
    /// What a one-part name on the default registry is prefixed with.
    default_short_prefix: Option<String>,
    /// How long what a tag says is reused on the default registry.
    default_tag_ttl: Duration,
}

#[derive(Clone, Debug)]
struct Registry {
    url: reqwest::Url,
    short_prefix: Option<String>,
    tag_ttl: Duration,
}

/// A repository on one registry: where to read it, and its name there.
#[derive(Clone, Debug)]
pub struct Repo(Arc<RepoInner>);

#[derive(Debug)]
struct RepoInner {
    registry: reqwest::Url,
    name: RepoName,
    shown: String,
    tag_ttl: Duration,
}

impl Repo {
    /// `name` on the registry at `registry`, shown as `shown`; what its
    /// tags say read every request.
    pub fn new(registry: reqwest::Url, name: RepoName, shown: String) -> Self {
        Self::with_tag_ttl(registry, name, shown, Duration::ZERO)
    }

    /// [`new`](Self::new), what its tags say reused for `tag_ttl`.
    pub fn with_tag_ttl(
        registry: reqwest::Url,
        name: RepoName,
        shown: String,
        tag_ttl: Duration,
    ) -> Self {
        Self(Arc::new(RepoInner {
            registry,
            name,
            shown,
            tag_ttl,
        }))
    }

    /// How long what its tags say may be reused (`tag_ttl_ms`; zero: not).
    pub fn tag_ttl(&self) -> Duration {
        self.0.tag_ttl
    }

    /// The registry's base URL.
    pub fn registry(&self) -> &reqwest::Url {
        &self.0.registry
    }

    /// The name on its registry (`library/alpine`).
    pub fn name(&self) -> &RepoName {
        &self.0.name
    }

    /// The name as the client gave it (`ghcr.io/owner/app`, `alpine`).
    pub fn shown(&self) -> &str {
        &self.0.shown
    }

    /// The token scope for pulling it (`repository:<name>:pull`).
    pub fn pull_scope(&self) -> String {
        format!("repository:{}:pull", self.0.name.as_str())
    }
}

impl Registries {
    /// The registries of `config`'s `[upstreams]`, beside `default` (the
    /// `--upstream` URL, which takes the `short_name_prefix` of an
    /// upstream with the same origin).
    pub fn from_config(config: &Config, default: &reqwest::Url) -> Self {
        let mut named = Vec::new();
        let mut default_short_prefix = None;
        let mut default_tag_ttl = Duration::ZERO;
        for (name, table) in &config.upstreams {
            let Some(url) = table.base_url() else {
                continue;
            };
            let short_prefix =
                (!table.short_name_prefix.is_empty()).then(|| table.short_name_prefix.clone());
            let tag_ttl = Duration::from_millis(table.tag_ttl_ms);
            if url.origin() == default.origin() {
                default_short_prefix = short_prefix.clone();
                default_tag_ttl = tag_ttl;
            }
            let registry = Registry {
                url,
                short_prefix,
                tag_ttl,
            };
            named.push((name.to_ascii_lowercase(), registry));
        }
        Self {
            named,
            default_short_prefix,
            default_tag_ttl,
        }
    }

    /// How long what a tag says is reused on the default registry.
    pub fn default_tag_ttl(&self) -> Duration {
        self.default_tag_ttl
    }

    /// The default registry `config` names (`primary = true`), if any.
    pub fn primary(config: &Config) -> Option<reqwest::Url> {
        config
            .upstreams
            .values()
            .find(|t| t.primary)
            .and_then(|t| t.base_url())
    }

    /// The repository `name` names, `default` being the default registry;
    /// `BAD_USER_INPUT` for a name out of the grammar or a prefix that
    /// names no configured registry.
    pub fn resolve(&self, default: &reqwest::Url, name: &str) -> Result<Repo, ReadError> {
        let bad = |message: String| ReadError::BadUserInput { message };
        let (registry, path) = match name.split_once('/') {
            Some((first, rest)) if is_registry(first) => {
                let prefix = first.to_ascii_lowercase();
                let own = default.authority().eq_ignore_ascii_case(&prefix);
                match self.named.iter().find(|(n, _)| *n == prefix) {
                    Some((_, registry)) => (registry.clone(), rest),
                    None if own => (self.default_registry(default), rest),
                    None => {
                        let shown: String = first.chars().take(80).collect();
                        return Err(bad(format!(
                            "{shown:?} names no configured registry (see [upstreams] in the book's configuration chapter)"
                        )));
                    }
                }
            }
            _ => (self.default_registry(default), name),
        };
        let path = match &registry.short_prefix {
            Some(prefix) if !path.contains('/') => format!("{prefix}/{path}"),
            _ => path.to_string(),
        };
        let parsed = RepoName::parse(&path).map_err(|e| bad(e.to_string()))?;
        Ok(Repo::with_tag_ttl(
            registry.url,
            parsed,
            name.to_string(),
            registry.tag_ttl,
        ))
    }

    fn default_registry(&self, default: &reqwest::Url) -> Registry {
        Registry {
            url: default.clone(),
            short_prefix: self.default_short_prefix.clone(),
            tag_ttl: self.default_tag_ttl,
        }
    }
}

/// Docker's rule: a first component with a `.` or a `:`, or `localhost`.
fn is_registry(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost"
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_budget::config::UpstreamTable;

    fn registries() -> (Registries, reqwest::Url) {
        let config = Config::default()
            .upstream_named(
                "ghcr.io",
                UpstreamTable::default().url("https://ghcr.example"),
            )
            .upstream_named(
                "hub",
                UpstreamTable::default()
                    .url("https://hub.example")
                    .short_name_prefix("library"),
            );
        let default: reqwest::Url = "https://hub.example".parse().unwrap();
        (Registries::from_config(&config, &default), default)
    }

    #[test]
    fn names_as_docker_reads_them() {
        let (r, default) = registries();
        let repo = r.resolve(&default, "ghcr.io/owner/app").unwrap();
        assert_eq!(repo.registry().as_str(), "https://ghcr.example/");
        assert_eq!(repo.name().as_str(), "owner/app");
        assert_eq!(repo.shown(), "ghcr.io/owner/app");
        let official = r.resolve(&default, "alpine").unwrap();
        assert_eq!(official.name().as_str(), "library/alpine");
        assert_eq!(official.registry(), &default);
        assert_eq!(
            r.resolve(&default, "acme/app").unwrap().name().as_str(),
            "acme/app"
        );
        // The default registry's own host as a prefix.
        let own = r.resolve(&default, "hub.example/acme/app").unwrap();
        assert_eq!(own.registry(), &default);
        assert_eq!(own.pull_scope(), "repository:acme/app:pull");
    }

    #[test]
    fn an_unknown_prefix_or_a_bad_name_is_bad_user_input() {
        let (r, default) = registries();
        for name in [
            "evil.example/x/y",
            "localhost/x",
            "127.0.0.1:9/x",
            "ghcr.io/Bad",
            "a//b",
        ] {
            let err = r.resolve(&default, name).unwrap_err();
            assert_eq!(err.code(), "BAD_USER_INPUT", "{name}");
        }
    }
}
