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

/// The `[upstreams]` name under which the `--upstream` URL's credentials
/// are kept when no table has its origin: never a registry prefix (no `.`,
/// no `:`), so it names nothing a client can ask for.
pub const COMMAND_LINE_UPSTREAM: &str = "--upstream";

/// Credentials written into upstream URLs (`http://user:password@host`,
/// percent-encoded as URLs write them) made what the `[upstreams]` table's
/// `username` and `password` keys are — the user and password the read path
/// answers the registry's challenges with (Basic, or the token flow) — and
/// taken out of the URLs, which are read, logged and shown without them.
///
/// A table's `url` gives its own table the credentials; the `--upstream`
/// URL (`upstream`, returned without them) gives them to the table with its
/// origin, or to a table of its own ([`COMMAND_LINE_UPSTREAM`]). A URL with
/// a user and no password (or a password and no user), or credentials given
/// both in a URL and by the table's keys, is an error naming the key, the
/// password never in it.
pub fn credentials_from_urls(
    config: &mut Config,
    upstream: Option<reqwest::Url>,
) -> Result<Option<reqwest::Url>, String> {
    for (name, table) in &mut config.upstreams {
        let Ok(mut url) = reqwest::Url::parse(&table.url) else {
            continue;
        };
        let key = format!("upstreams.{}.url", key_segment(name));
        let Some((user, password)) = take_userinfo(&mut url).map_err(|e| format!("{key}: {e}"))?
        else {
            continue;
        };
        if has_credentials(table) {
            return Err(format!(
                "{key}: {url} is given with a user and password, and the table sets \
                 username or a password too; keep one of them"
            ));
        }
        table.url = url.to_string();
        table.username = user;
        table.password = password.into();
    }
    let Some(mut upstream) = upstream else {
        return Ok(None);
    };
    let Some((user, password)) =
        take_userinfo(&mut upstream).map_err(|e| format!("--upstream: {e}"))?
    else {
        return Ok(Some(upstream));
    };
    let same_origin = config.upstreams.iter_mut().find(|(_, t)| {
        t.base_url()
            .is_some_and(|u| u.origin() == upstream.origin())
    });
    match same_origin {
        Some((name, table)) if has_credentials(table) => {
            return Err(format!(
                "--upstream: {upstream} is given with a user and password, and \
                 upstreams.{} (the same origin) sets its credentials too; keep one of them",
                key_segment(name)
            ));
        }
        Some((_, table)) => {
            table.username = user;
            table.password = password.into();
        }
        None => {
            let table = fanout_budget::config::UpstreamTable::default()
                .url(upstream.as_str())
                .username(user)
                .password(password);
            config
                .upstreams
                .insert(COMMAND_LINE_UPSTREAM.to_string(), table);
        }
    }
    Ok(Some(upstream))
}

/// The user and password `url` carries, percent-decoded, taken out of it;
/// `None` when it carries neither.
fn take_userinfo(url: &mut reqwest::Url) -> Result<Option<(String, String)>, String> {
    if url.username().is_empty() && url.password().is_none() {
        return Ok(None);
    }
    let user = percent_decode(url.username());
    let password = url.password().map(percent_decode);
    // Shown in messages from here on without its user and password.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let shown = url.as_str().to_string();
    match (user, password) {
        (Some(user), Some(Some(password))) if !user.is_empty() && !password.is_empty() => {
            Ok(Some((user, password)))
        }
        (None, _) | (_, Some(None)) => Err(format!(
            "{shown}: the user and password in the URL are not UTF-8 once percent-decoded"
        )),
        _ => Err(format!(
            "{shown}: a URL's credentials are a user and a password (http://user:password@host), \
             both non-empty"
        )),
    }
}

/// `text` with its `%XX` escapes decoded; `None` if the result is not UTF-8
/// or an escape is malformed.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether a table sets a user or a password by its keys.
fn has_credentials(table: &fanout_budget::config::UpstreamTable) -> bool {
    !table.username.is_empty()
        || !table.password.is_empty()
        || !table.password_env.is_empty()
        || !table.password_file.is_empty()
}

/// One segment of a dotted key as TOML writes it (as configuration errors
/// name keys): bare if it can be, otherwise quoted.
fn key_segment(segment: &str) -> String {
    let bare = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !segment.is_empty() && segment.chars().all(bare) {
        segment.to_string()
    } else {
        format!("{segment:?}")
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

    #[test]
    fn credentials_in_urls_become_the_tables_user_and_password() {
        let mut config = Config::default().upstream_named(
            "priv.reg",
            UpstreamTable::default().url("https://ci:p%40ss%3Aw%2Fd@priv.example:5000"),
        );
        let upstream = "http://bot:t0k3n@hub.example".parse().unwrap();
        let upstream = credentials_from_urls(&mut config, Some(upstream)).unwrap();
        assert_eq!(upstream.unwrap().as_str(), "http://hub.example/");
        let table = &config.upstreams["priv.reg"];
        assert_eq!(table.url, "https://priv.example:5000/");
        assert_eq!(table.username, "ci");
        assert_eq!(table.password.expose(), "p@ss:w/d");
        let own = &config.upstreams[COMMAND_LINE_UPSTREAM];
        assert_eq!(own.url, "http://hub.example/");
        assert_eq!(own.username, "bot");
        assert_eq!(own.password.expose(), "t0k3n");
        assert!(!is_registry(COMMAND_LINE_UPSTREAM));
        config.validate().unwrap();

        // `--upstream` on a table's origin: that table's credentials.
        let mut config = Config::default()
            .upstream_named("hub", UpstreamTable::default().url("http://hub.example"));
        let upstream = "http://bot:t0k3n@hub.example".parse().unwrap();
        credentials_from_urls(&mut config, Some(upstream)).unwrap();
        assert_eq!(config.upstreams.len(), 1);
        assert_eq!(config.upstreams["hub"].password.expose(), "t0k3n");

        // Without credentials, nothing changes.
        let mut config = Config::default();
        let upstream = "http://hub.example:5000".parse().unwrap();
        let same = credentials_from_urls(&mut config, Some(upstream)).unwrap();
        assert_eq!(same.unwrap().as_str(), "http://hub.example:5000/");
        assert!(config.upstreams.is_empty());
    }

    #[test]
    fn half_or_twice_given_credentials_name_the_key_not_the_password() {
        let table = |url: &str| UpstreamTable::default().url(url);
        let cases = [
            (
                Config::default().upstream_named("priv.reg", table("http://ci@priv.example")),
                None,
                "upstreams.\"priv.reg\".url",
            ),
            (
                Config::default().upstream_named("r", table("http://:s3cret-pw@priv.example")),
                None,
                "upstreams.r.url",
            ),
            (
                Config::default().upstream_named(
                    "r",
                    table("http://ci:s3cret-pw@priv.example").username("ci"),
                ),
                None,
                "upstreams.r.url",
            ),
            (
                Config::default().upstream_named(
                    "r",
                    table("http://priv.example")
                        .username("ci")
                        .password("other"),
                ),
                Some("http://ci:s3cret-pw@priv.example"),
                "--upstream",
            ),
            (
                Config::default(),
                Some("http://ci:%FF@priv.example"),
                "--upstream",
            ),
        ];
        for (mut config, upstream, key) in cases {
            let upstream = upstream.map(|u| u.parse().unwrap());
            let err = credentials_from_urls(&mut config, upstream).unwrap_err();
            assert!(err.starts_with(key), "{key}: {err}");
            assert!(!err.contains("s3cret-pw") && !err.contains("%FF"), "{err}");
        }
    }
}
