//! Repository names, tags and digests, checked against the OCI distribution
//! grammars before they go anywhere near a URL.
//!
//! A string from a client (or from the registry's own answers: catalog
//! names, tag lists, manifest digests) becomes one of these types only
//! through its `parse`, and the client builds URLs only from these types,
//! one path segment per name component ([`crate::oci`]). So
//! `repository(name: "../../admin/secret?x=")` never reads `/admin/secret`,
//! and `"app/tags/list?n=1&last=v1#"` cannot force one-tag paging: both are
//! `BAD_USER_INPUT` before any read.
//!
//! The grammars (OCI distribution spec, "pulling manifests"):
//!
//! ```text
//! name       = component ("/" component)*          at most 255 bytes
//! component  = [a-z0-9]+ (separator [a-z0-9]+)*
//! separator  = "." | "_" | "__" | "-"+
//! tag        = [a-zA-Z0-9_] [a-zA-Z0-9._-]{0,127}
//! digest     = algorithm ":" encoded
//! algorithm  = [a-z0-9]+ ([+._-] [a-z0-9]+)*
//! encoded    = [a-zA-Z0-9=_-]+                     (sha256: 64 lowercase hex)
//! ```

use std::fmt;

/// Why a string is not a name, tag or digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(String);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn invalid(what: &str, value: &str) -> Invalid {
    let shown: String = value.chars().take(80).collect();
    Invalid(format!(
        "{shown:?} is not a valid {what} (OCI distribution grammar)"
    ))
}

fn alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]+ (separator [a-z0-9]+)*`, separator `.`, `_`, `__` or `-`+.
fn is_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !alnum_lower(b[0]) || !alnum_lower(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum_lower(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum_lower(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|s| s == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// A repository name (`acme/app`, `org/team/deep`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RepoName(String);

impl RepoName {
    /// `name` if it is a repository name.
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        if name.len() <= 255 && name.split('/').all(is_component) {
            Ok(Self(name.to_string()))
        } else {
            Err(invalid("repository name", name))
        }
    }

    /// The name's path segments, one per component.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A tag (`latest`, `v1.2.3`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TagName(String);

impl TagName {
    /// `tag` if it is a tag.
    pub fn parse(tag: &str) -> Result<Self, Invalid> {
        let b = tag.as_bytes();
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        let ok = !b.is_empty()
            && b.len() <= 128
            && word(b[0])
            && b[1..].iter().all(|&c| word(c) || c == b'.' || c == b'-');
        if ok {
            Ok(Self(tag.to_string()))
        } else {
            Err(invalid("tag", tag))
        }
    }

    /// The tag.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A content digest (`sha256:…`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Digest(String);

impl Digest {
    /// `digest` if it is a digest.
    pub fn parse(digest: &str) -> Result<Self, Invalid> {
        let ok = digest.split_once(':').is_some_and(|(algorithm, encoded)| {
            let algorithm_ok = algorithm
                .split(['+', '.', '_', '-'])
                .all(|part| !part.is_empty() && part.bytes().all(alnum_lower));
            let encoded_ok = !encoded.is_empty()
                && encoded
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'=' | b'_' | b'-'));
            let sha256_ok = algorithm != "sha256"
                || (encoded.len() == 64
                    && encoded
                        .bytes()
                        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
            algorithm_ok && encoded_ok && sha256_ok
        });
        if ok {
            Ok(Self(digest.to_string()))
        } else {
            Err(invalid("digest", digest))
        }
    }

    /// The digest.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "a",
            "acme/app",
            "org/team/deep",
            "a.b",
            "a_b",
            "a__b",
            "a--b",
            "a-b-c/d0",
        ] {
            assert!(RepoName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/",
            "a/",
            "/a",
            "a//b",
            "A",
            "a..b",
            "a___b",
            "a.-b",
            "-a",
            "a-",
            "..",
            "../../admin/secret?x=",
            "app/tags/list?n=1&last=v1#",
            "a b",
            "a%2fb",
            "a\u{e9}",
        ] {
            assert!(RepoName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(RepoName::parse(&"a".repeat(256)).is_err());
        assert!(RepoName::parse(&"a".repeat(255)).is_ok());
    }

    #[test]
    fn tags() {
        for ok in ["latest", "v1.2.3", "_x", "A-b_c.d", &"t".repeat(128)] {
            assert!(TagName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".x",
            "-x",
            "a/b",
            "a:b",
            "../x",
            "a?b",
            "a#",
            &"t".repeat(129),
        ] {
            assert!(TagName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn digests() {
        let hex = "a".repeat(64);
        for ok in [
            format!("sha256:{hex}"),
            "sha512+b64:abc=".to_string(),
            "x.y:Z-_=".to_string(),
        ] {
            assert!(Digest::parse(&ok).is_ok(), "{ok}");
        }
        for bad in [
            "sha256:abc".to_string(),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha256:{hex}/../x"),
            "sha256".to_string(),
            ":abc".to_string(),
            "Sha256:abc".to_string(),
            "sha256:".to_string(),
        ] {
            assert!(Digest::parse(&bad).is_err(), "{bad:?}");
        }
    }
}
