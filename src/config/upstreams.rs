//! `[upstreams."NAME"]`: the upstreams an application reads by name, each
//! with its URL, its credentials and the TLS roots it needs; and the rules
//! on them. The read path answers an upstream's challenges with these
//! (`read/auth.rs`); the gateway also names registries by them.
//!
//! A password never appears in a `Debug` print of the configuration, an
//! error or a log line: it is a [`Secret`].

use super::error::{key_segment, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

section! {
    /// `[upstreams."NAME"]`: one upstream read by name.
    ///
    /// ```
    /// use fanout_budget::Config;
    ///
    /// let config = Config::from_toml(
    ///     "[upstreams.\"registry.example\"]\nurl = \"https://registry.example\"\nusername = \"ci\"\npassword = \"s3cret\"\n",
    /// ).unwrap();
    /// let registry = &config.upstreams["registry.example"];
    /// assert_eq!(registry.username, "ci");
    /// assert!(!format!("{config:?}").contains("s3cret"));
    /// ```
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct UpstreamTable {
        /// Its base URL, `http(s)://host[:port]` (required).
        pub url: String = String::new() => into,
        /// The user its challenges are answered as; empty: anonymous
        /// (a bearer token is still fetched, without credentials).
        pub username: String = String::new() => into,
        /// The password (or a token used as one). Prefer `password_env` or
        /// `password_file`: at most one of the three.
        pub password: Secret = Secret::default() => into,
        /// The environment variable holding the password.
        pub password_env: String = String::new() => into,
        /// The file holding the password (its last newline dropped).
        pub password_file: String = String::new() => into,
        /// Token realms besides the upstream's own origin that may receive
        /// its credentials (a registry whose tokens come from another host
        /// lists that host's token URL here). A challenge naming any other
        /// realm is refused, not followed: `UPSTREAM_UNAUTHORIZED`.
        pub realms: Vec<String> = Vec::new() => list,
        /// A PEM file of CA certificates to trust (a private registry's CA),
        /// besides the system's roots. The engine's HTTP client trusts them
        /// for every host.
        pub ca_file: String = String::new() => into,
        /// The upstream that names without a prefix read (the gateway: a
        /// repository name without a registry prefix, when no `--upstream`
        /// is given). At most one.
        pub primary: bool = false,
        /// What a one-part name is prefixed with on this upstream (the
        /// gateway: `library` makes `alpine` read `library/alpine`, as
        /// Docker names official images); empty: nothing.
        pub short_name_prefix: String = String::new() => into,
        /// How long the gateway may reuse what a tag says on this upstream —
        /// the tag list and a manifest read by tag — across inbound requests
        /// (`Read::fresh_for`): a tag moved or added is seen this much later.
        /// 0 (the default): read every request.
        pub tag_ttl_ms: u64 = 0,
        /// This upstream's share of one inbound request's read budget: at
        /// most this many requests sent to its origin (scheme, host, port)
        /// per inbound request — every operation of a batch together, each
        /// WebSocket event on its own — each also charged to the request's
        /// budget as any read. Past it, only this upstream's reads are
        /// refused (`FANOUT_BUDGET_EXHAUSTED` with `upstream` naming it and
        /// `limit` this share; nothing sent, nothing charged); the other
        /// upstreams' reads go on. 0 (the default): no share of its own.
        pub max_reads: u64 = 0,
        /// Reads sent to this upstream's host carry the request's remaining
        /// budget, deadline and hop count (`Fanout-Budget`), and the reads
        /// its answer reports spent (`Fanout-Spent`) are charged to the
        /// request, as `[hosts."HOST:PORT"] propagate` does (off by default:
        /// never sent to a third party).
        pub propagate: bool = false,
    }
}

/// A password: compared and cloned like a string, never shown.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret itself (to send it where it belongs).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_string())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<redacted>"
        })
    }
}

impl UpstreamTable {
    /// The base URL, parsed (checked by the configuration's validation).
    pub fn base_url(&self) -> Option<reqwest::Url> {
        reqwest::Url::parse(&self.url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
    }

    /// The password from `password`, `password_env` or `password_file`;
    /// `None` when none is set.
    pub fn resolve_password(&self, name: &str) -> Result<Option<Secret>, ConfigError> {
        let key = |field: &str| format!("upstreams.{}.{field}", key_segment(name));
        if !self.password_env.is_empty() {
            return match std::env::var(&self.password_env) {
                Ok(value) => Ok(Some(Secret(value))),
                Err(_) => Err(ConfigError::new(
                    key("password_env"),
                    format!("the environment variable {} is not set", self.password_env),
                )),
            };
        }
        if !self.password_file.is_empty() {
            return match std::fs::read_to_string(&self.password_file) {
                Ok(text) => Ok(Some(Secret(
                    text.strip_suffix('\n')
                        .map(|t| t.strip_suffix('\r').unwrap_or(t))
                        .unwrap_or(&text)
                        .to_string(),
                ))),
                Err(e) => Err(ConfigError::new(
                    key("password_file"),
                    format!("cannot read {}: {e}", self.password_file),
                )),
            };
        }
        Ok((!self.password.is_empty()).then(|| self.password.clone()))
    }

    /// The rules of one table named `name`.
    pub(super) fn check(&self, name: &str) -> Result<(), ConfigError> {
        let key = |field: &str| format!("upstreams.{}.{field}", key_segment(name));
        let Some(url) = self.base_url() else {
            return Err(ConfigError::new(
                key("url"),
                "an upstream's url must be an http(s) URL with a host (e.g. \"https://registry.example\")",
            ));
        };
        // A user or password in the URL would be sent as nothing the
        // upstream asked for and shown wherever the URL is: credentials
        // are the table's keys (the gateway moves them there first).
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ConfigError::new(
                key("url"),
                "an upstream's url carries no user or password: give them as username and password",
            ));
        }
        let set = [
            !self.password.is_empty(),
            !self.password_env.is_empty(),
            !self.password_file.is_empty(),
        ];
        if set.iter().filter(|s| **s).count() > 1 {
            return Err(ConfigError::new(
                key("password"),
                "set at most one of password, password_env and password_file",
            ));
        }
        let password = self.resolve_password(name)?;
        if password.is_some() && self.username.is_empty() {
            return Err(ConfigError::new(
                key("username"),
                "a password needs a username",
            ));
        }
        for realm in &self.realms {
            let ok = reqwest::Url::parse(realm)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
            if !ok {
                return Err(ConfigError::new(
                    key("realms"),
                    format!("{realm:?} is not an http(s) URL"),
                ));
            }
        }
        if !self.ca_file.is_empty() {
            let pem = std::fs::read(&self.ca_file).map_err(|e| {
                ConfigError::new(key("ca_file"), format!("cannot read {}: {e}", self.ca_file))
            })?;
            match reqwest::Certificate::from_pem_bundle(&pem) {
                Ok(certs) if !certs.is_empty() => {}
                _ => {
                    return Err(ConfigError::new(
                        key("ca_file"),
                        format!("{} holds no PEM certificate", self.ca_file),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// One table per origin: the credentials, the remembered challenge and the
/// cached answers of an upstream are its origin's, so a second table on the
/// same origin (scheme, host and port) would share the first one's, chosen
/// by order. Refused, naming both keys.
pub(super) fn check_origins(
    upstreams: &BTreeMap<String, UpstreamTable>,
) -> Result<(), ConfigError> {
    let key = |name: &str| format!("upstreams.{}.url", key_segment(name));
    let mut seen: Vec<(String, &str)> = Vec::with_capacity(upstreams.len());
    for (name, table) in upstreams {
        let Some(url) = table.base_url() else {
            continue;
        };
        let origin = url.origin().ascii_serialization();
        if let Some((_, first)) = seen.iter().find(|(o, _)| *o == origin) {
            return Err(ConfigError::new(
                key(name),
                format!(
                    "{} is also the origin of {}: one upstream table per origin \
                     (two would share one set of credentials and cached answers); \
                     keep one of them",
                    origin,
                    key(first)
                ),
            ));
        }
        seen.push((origin, name));
    }
    check_names(upstreams)
}

/// One table per name as the gateway reads it: a registry prefix is
/// matched without regard to case (as a host name is), so two names equal
/// but for case would leave the second unreachable. Refused, naming both.
fn check_names(upstreams: &BTreeMap<String, UpstreamTable>) -> Result<(), ConfigError> {
    let mut names: Vec<&str> = upstreams.keys().map(String::as_str).collect();
    names.sort_by_key(|name| name.to_ascii_lowercase());
    for pair in names.windows(2) {
        if pair[0].eq_ignore_ascii_case(pair[1]) {
            return Err(ConfigError::new(
                format!("upstreams.{}", key_segment(pair[1])),
                format!(
                    "the same name as upstreams.{} but for case: names are read \
                     without regard to case; keep one of them",
                    key_segment(pair[0])
                ),
            ));
        }
    }
    Ok(())
}
