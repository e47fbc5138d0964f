//! What a `401` asks for: the `WWW-Authenticate` challenges (RFC 9110
//! §11.2), read without allocating more than their parameters.

use crate::read::message::UpstreamResponse;
use http::header;

/// What a `401` asked for.
#[derive(Debug, PartialEq)]
pub(crate) enum Challenge {
    /// Basic: a user and a password.
    Basic,
    /// A bearer token from `realm`.
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
        /// `error="insufficient_scope"`: a token was sent and lacks access.
        insufficient_scope: bool,
    },
}

/// The challenge of a `401`: Bearer preferred to Basic when both are offered.
pub(crate) fn challenge(response: &UpstreamResponse) -> Option<Challenge> {
    let mut basic = false;
    for value in response.headers.get_all(header::WWW_AUTHENTICATE) {
        let Ok(text) = value.to_str() else { continue };
        for (scheme, params) in challenges(text) {
            if scheme.eq_ignore_ascii_case("bearer") {
                let get = |name: &str| {
                    params
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.clone())
                };
                if let Some(realm) = get("realm") {
                    return Some(Challenge::Bearer {
                        realm,
                        service: get("service"),
                        scope: get("scope"),
                        insufficient_scope: get("error").as_deref() == Some("insufficient_scope"),
                    });
                }
            } else if scheme.eq_ignore_ascii_case("basic") {
                basic = true;
            }
        }
    }
    basic.then_some(Challenge::Basic)
}

/// The challenges of one `WWW-Authenticate` value: each scheme with its
/// `name=value` parameters (values quoted or tokens; RFC 9110 §11.2).
fn challenges(text: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out: Vec<(String, Vec<(String, String)>)> = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        // A token: a scheme (followed by space or end) or a parameter name (followed by `=`).
        let end = rest
            .find(|c: char| c == '=' || c == ',' || c.is_ascii_whitespace())
            .unwrap_or(rest.len());
        let word = &rest[..end];
        rest = rest[end..].trim_start();
        if let Some(after) = rest.strip_prefix('=') {
            let after = after.trim_start();
            let (value, remaining) = match after.strip_prefix('"') {
                Some(quoted) => unquote(quoted),
                None => {
                    let end = after.find(',').unwrap_or(after.len());
                    (after[..end].trim().to_string(), &after[end..])
                }
            };
            if let Some((_, params)) = out.last_mut() {
                params.push((word.to_string(), value));
            }
            rest = remaining.trim_start();
        } else if !word.is_empty() {
            out.push((word.to_string(), Vec::new()));
        }
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_ascii_whitespace());
    }
    out
}

/// A quoted string's value (escapes resolved) and what follows its quote.
fn unquote(text: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (value, &text[i + 1..]),
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    value.push(escaped);
                }
            }
            c => value.push(c),
        }
    }
    (value, "")
}
