//! The realm rule: which token realm a challenge may name, read once, when
//! the challenge is read — a realm refused here is never asked and never
//! remembered.
//!
//! A realm is asked exactly as it is written: an `http(s)` URL whose text is
//! its own serialisation, without a user or a fragment. Anything the HTTP
//! client would rewrite on the way (it moves a URL's user into a header and
//! drops its fragment; `\@` in a quoted challenge is `@`) is refused, so the
//! realm checked is the realm sent, and its answer is not taken for a
//! redirect the engine did not see. Then the realm must be on the upstream's
//! own origin or under one of its configured `realms`, and not plain `http`
//! for an `https` upstream.

use reqwest::Url;

/// `realm` parsed, if the upstream at `upstream` (with the configured
/// `realms`) may ask it for a token; otherwise why not (for an error
/// message: the realm shown by origin and path, never its user or query).
pub(super) fn allowed(realm: &str, upstream: &Url, realms: &[Url]) -> Result<Url, String> {
    let url = Url::parse(realm)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        .ok_or_else(|| "the challenge's realm is not an http(s) URL".to_string())?;
    let rewritten = !url.username().is_empty()
        || url.password().is_some()
        || url.fragment().is_some()
        || url.as_str() != realm;
    if rewritten {
        return Err(format!(
            "the token realm {} is not a plain URL (a user, a fragment, or text the HTTP \
             client would rewrite): not asked",
            shown(&url)
        ));
    }
    if upstream.scheme() == "https" && url.scheme() == "http" {
        return Err(format!(
            "the token realm {} is plain http for an https upstream",
            shown(&url)
        ));
    }
    let own = url.origin() == upstream.origin();
    let listed = realms
        .iter()
        .any(|allowed| allowed.origin() == url.origin() && url.path().starts_with(allowed.path()));
    if !own && !listed {
        return Err(format!(
            "the token realm {} is not this upstream's origin nor one of its configured realms",
            shown(&url)
        ));
    }
    Ok(url)
}

/// A realm URL for a message: origin and path, no user, query or fragment.
pub(super) fn shown(url: &Url) -> String {
    format!("{}{}", url.origin().ascii_serialization(), url.path())
}
