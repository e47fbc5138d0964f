//! GraphQL over HTTP: what a request asks, and how its answer is written.
//!
//! The [GraphQL over HTTP] spec, as [`FanoutGraphQL`](crate::FanoutGraphQL)
//! speaks it:
//!
//! - **Requests.** `POST` with `Content-Type: application/json` — one
//!   request object or a JSON array of them (a batch) — or `GET` with
//!   `query`, `operationName`, `variables` and `extensions` in the query
//!   string (`variables` and `extensions` as JSON), for query operations
//!   only: a mutation over `GET` is 405. Each parameter has its type (`query`
//!   and `operationName` strings, `variables` and `extensions` objects, any
//!   of them `null`), else 400 `BAD_REQUEST`; `query` may be absent only
//!   when `extensions.persistedQuery` names a kept text (`persisted.rs`).
//! - **CSRF.** A browser sends a `text/plain`, form or multipart `POST`
//!   cross-site without asking first (no CORS preflight), so such a request
//!   — or one with no `Content-Type` — is refused with 400 `BAD_REQUEST`
//!   before it runs, as Apollo Router does, unless it carries a header a
//!   page cannot add without a preflight (`Apollo-Require-Preflight`,
//!   `X-Apollo-Operation-Name`). Any other type but JSON is 415. A `GET`
//!   runs queries only, whose answers CORS keeps from other origins; but a
//!   page can still make a visitor's browser send one with the visitor's
//!   cookies (an image tag), so by default (`http.csrf_get =
//!   "require_preflight"`) a `GET` that carries a GraphQL request is refused
//!   the same way unless it carries one of those headers or a `Content-Type`
//!   that forces a preflight; `"allow"` runs it (an endpoint with no ambient
//!   credentials, as the gateway). See [`CsrfGet`](crate::config::CsrfGet).
//! - **Answers.** `Accept` picks the media type: `application/graphql-response+json`
//!   when the client names it (at the highest quality it gives), else
//!   `application/json` — also for `*/*` and for no `Accept` at all; 406
//!   when neither is acceptable. With `application/graphql-response+json`
//!   an operation refused before it ran (parse, validation, variable
//!   coercion, persisted query) has no `data` key, and a single such
//!   operation answers 400; with `application/json` it is 200 and
//!   `data: null`, as clients before the spec expect.
//!
//! [GraphQL over HTTP]: https://graphql.github.io/graphql-over-http/draft/

use crate::config::CsrfGet;
use crate::error::Rejection;
use async_graphql::{BatchRequest, Request, Response, ServerError, Value, Variables};
use axum::response::{IntoResponse, Response as HttpResponse};
use http::{header, HeaderMap, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

/// The media type an answer is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Media {
    /// `application/graphql-response+json`: the spec's status codes.
    GraphQLResponse,
    /// `application/json`: 200 for every GraphQL answer.
    Json,
}

impl Media {
    fn content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Self::GraphQLResponse => "application/graphql-response+json; charset=utf-8",
            Self::Json => "application/json",
        })
    }
}

/// The media type to answer in, from `Accept` (see the module docs);
/// `None`: nothing offered is acceptable (406).
pub(crate) fn negotiate(headers: &HeaderMap) -> Option<Media> {
    if headers.get(header::ACCEPT).is_none() {
        return Some(Media::Json);
    }
    // (quality, named exactly, media) of the best offer so far.
    let mut best: Option<(u16, bool, Media)> = None;
    for (essence, quality, utf8) in accepted(headers) {
        let (exact, media) = match essence.as_str() {
            "application/graphql-response+json" => (true, Media::GraphQLResponse),
            "application/json" => (true, Media::Json),
            "application/*" | "*/*" => (false, Media::Json),
            _ => continue,
        };
        if quality > 0 && utf8 && best.is_none_or(|(q, e, _)| (quality, exact) > (q, e)) {
            best = Some((quality, exact, media));
        }
    }
    best.map(|(_, _, media)| media)
}

/// `Accept`'s media ranges: the lower-cased essence, the quality in
/// thousandths (unreadable counts as 1), and whether its charset (if any)
/// is UTF-8.
fn accepted(headers: &HeaderMap) -> impl Iterator<Item = (String, u16, bool)> + '_ {
    let ranges = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    ranges.map(|range| {
        let mut params = range.split(';').map(str::trim);
        let essence = params.next().unwrap_or("").to_ascii_lowercase();
        let (mut quality, mut utf8) = (1000, true);
        for param in params {
            let (name, value) = param.split_once('=').unwrap_or((param, ""));
            let value = value.trim().trim_matches('"');
            match name.trim().to_ascii_lowercase().as_str() {
                "q" => {
                    quality = value
                        .parse::<f32>()
                        .map_or(1000, |q| (q.clamp(0.0, 1.0) * 1000.0).round() as u16)
                }
                "charset" => utf8 = is_utf8(value),
                _ => {}
            }
        }
        (essence, quality, utf8)
    })
}

fn is_utf8(charset: &str) -> bool {
    charset.eq_ignore_ascii_case("utf-8") || charset.eq_ignore_ascii_case("utf8")
}

/// Whether a `GET` wants the GraphiQL page: a browser's navigation (it
/// accepts `text/html`) without a `query` or `extensions` parameter.
pub(crate) fn wants_page(headers: &HeaderMap, query_string: Option<&str>) -> bool {
    !carries_a_request(query_string)
        && accepted(headers).any(|(essence, quality, _)| essence == "text/html" && quality > 0)
}

/// Headers a page cannot send cross-site without a preflight, which mark a
/// request as sent by a GraphQL client (Apollo Router's defaults).
const PREFLIGHT_HEADERS: [&str; 2] = ["apollo-require-preflight", "x-apollo-operation-name"];

/// Refuses a body a browser could send cross-site without a CORS preflight
/// (see the module docs): no `Content-Type`, or `text/plain`, a form or
/// multipart, without one of [`PREFLIGHT_HEADERS`].
pub(crate) fn check_preflighted(headers: &HeaderMap) -> Result<(), Rejection> {
    let announced = PREFLIGHT_HEADERS
        .iter()
        .any(|name| headers.get(*name).is_some_and(|v| !v.is_empty()));
    let simple = match essence(headers) {
        None => true,
        Some(essence) => matches!(
            essence.as_str(),
            "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
        ),
    };
    if simple && !announced {
        return Err(Rejection::BadRequest {
            message: "this request has been blocked as a possible cross-site request forgery: \
                      send it with Content-Type: application/json, or add a non-empty \
                      Apollo-Require-Preflight header"
                .into(),
        });
    }
    Ok(())
}

/// Refuses a `GET` that carries a GraphQL request (a `query` or
/// `extensions` parameter) and that a page could have sent cross-site
/// without a preflight (the rule of [`check_preflighted`]), unless `policy`
/// allows it (see the module docs).
pub(crate) fn check_get(
    headers: &HeaderMap,
    query_string: Option<&str>,
    policy: CsrfGet,
) -> Result<(), Rejection> {
    if policy == CsrfGet::Allow || !carries_a_request(query_string) {
        return Ok(());
    }
    check_preflighted(headers).map_err(|_| Rejection::BadRequest {
        message: "this GET has been blocked as a possible cross-site request forgery: \
                  send it with a non-empty Apollo-Require-Preflight header, or as a POST \
                  with Content-Type: application/json"
            .into(),
    })
}

/// Whether a query string carries a GraphQL request: a `query` or an
/// `extensions` (a persisted query) parameter.
fn carries_a_request(query_string: Option<&str>) -> bool {
    query_string.is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "query" || k == "extensions")
    })
}

/// Refuses a `POST` body that is not JSON: [`check_preflighted`], then 415
/// for any type but `application/json` (UTF-8).
pub(crate) fn check_json_body(headers: &HeaderMap) -> Result<(), Rejection> {
    check_preflighted(headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let utf8 = content_type.split(';').skip(1).all(|param| {
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        !name.trim().eq_ignore_ascii_case("charset") || is_utf8(value.trim().trim_matches('"'))
    });
    if essence(headers).as_deref() == Some("application/json") && utf8 {
        return Ok(());
    }
    Err(Rejection::UnsupportedMediaType {
        content_type: content_type.to_string(),
    })
}

/// The lower-cased `type/subtype` of `Content-Type`.
fn essence(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    (!essence.is_empty()).then_some(essence)
}

/// One GraphQL request as it travels, each parameter with its type.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    operation_name: Option<String>,
    #[serde(default)]
    variables: Variables,
    #[serde(default)]
    extensions: async_graphql::Extensions,
}

impl Wire {
    fn into_request(self) -> Result<Request, Rejection> {
        let persisted = self.extensions.contains_key("persistedQuery");
        let query = self.query.unwrap_or_default();
        if query.trim().is_empty() && !persisted {
            return Err(Rejection::BadRequest {
                message: "not a GraphQL request: \"query\" is missing or empty".into(),
            });
        }
        let mut request = Request::new(query).variables(self.variables);
        request.operation_name = self.operation_name;
        request.extensions = self.extensions;
        Ok(request)
    }
}

/// A `POST` body: one operation or a non-empty batch of at most `max`.
pub(crate) fn parse_body(body: &[u8], max: usize) -> Result<BatchRequest, Rejection> {
    let bad = |message: String| Rejection::BadRequest { message };
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => {
            let batch: Vec<Wire> = serde_json::from_slice(body)
                .map_err(|e| bad(format!("not a batch of GraphQL requests: {e}")))?;
            match batch.len() {
                0 => Err(bad("an empty batch has nothing to run".into())),
                n if n > max => Err(Rejection::BatchTooLarge { max }),
                _ => Ok(BatchRequest::Batch(
                    batch
                        .into_iter()
                        .map(Wire::into_request)
                        .collect::<Result<_, _>>()?,
                )),
            }
        }
        Some(b'{') => serde_json::from_slice::<Wire>(body)
            .map_err(|e| bad(format!("not a GraphQL request: {e}")))?
            .into_request()
            .map(BatchRequest::Single),
        _ => Err(bad(
            "the body must be a GraphQL request object or a JSON array of them".into(),
        )),
    }
}

/// A `GET`'s query string: one operation (`variables` and `extensions` are
/// JSON; a parameter given twice is refused).
pub(crate) fn parse_query_string(query_string: &str) -> Result<Request, Rejection> {
    let bad = |message: String| Rejection::BadRequest { message };
    let mut wire = serde_json::Map::new();
    for (key, value) in form_urlencoded::parse(query_string.as_bytes()) {
        let value = match &*key {
            "query" | "operationName" => serde_json::Value::String(value.into_owned()),
            "variables" | "extensions" => serde_json::from_str(&value)
                .map_err(|e| bad(format!("the {key} parameter is not JSON: {e}")))?,
            _ => continue,
        };
        if wire.insert(key.clone().into_owned(), value).is_some() {
            return Err(bad(format!("the {key} parameter is given twice")));
        }
    }
    serde_json::from_value::<Wire>(serde_json::Value::Object(wire))
        .map_err(|e| bad(format!("not a GraphQL request: {e}")))?
        .into_request()
}

/// Codes of errors that refuse an operation before it runs: with
/// `application/graphql-response+json` its answer has no `data`.
const REQUEST_ERRORS: [&str; 7] = [
    "GRAPHQL_PARSE_FAILED",
    "GRAPHQL_VALIDATION_FAILED",
    "BAD_USER_INPUT",
    "OPERATION_RESOLUTION_FAILURE",
    "PERSISTED_QUERY_NOT_FOUND",
    "PERSISTED_QUERY_HASH_MISMATCH",
    "PERSISTED_QUERY_NOT_SUPPORTED",
];

/// Whether `response` is a request error: nothing ran (`data` is null),
/// and every error, none at a path, is one of [`REQUEST_ERRORS`].
fn is_request_error(response: &Response) -> bool {
    response.data == Value::Null
        && !response.errors.is_empty()
        && response.errors.iter().all(|e| {
            e.path.is_empty()
                && e.extensions
                    .as_ref()
                    .and_then(|ext| ext.get("code"))
                    .is_some_and(|code| {
                        matches!(code, Value::String(c) if REQUEST_ERRORS.contains(&c.as_str()))
                    })
        })
}

/// One answer as written: in full, or without `data` (a request error
/// under `application/graphql-response+json`).
#[derive(Serialize)]
#[serde(untagged)]
enum Written<'a> {
    Full(&'a Response),
    NoData {
        errors: &'a [ServerError],
        #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        extensions: &'a std::collections::BTreeMap<String, Value>,
    },
}

impl<'a> Written<'a> {
    fn of(response: &'a Response, media: Media) -> Self {
        if media == Media::GraphQLResponse && is_request_error(response) {
            Self::NoData {
                errors: &response.errors,
                extensions: &response.extensions,
            }
        } else {
            Self::Full(response)
        }
    }
}

/// The answers as JSON in `media`, written into a buffer that refuses to
/// grow past `max` bytes: a small query can ask for an answer far larger
/// than itself (aliases × lists), and past the bound the answer is replaced
/// by `RESPONSE_TOO_LARGE` before it is ever whole in memory. A single
/// request error under `application/graphql-response+json` is 400.
pub(crate) fn respond(
    responses: &[Response],
    single: bool,
    media: Media,
    max: usize,
) -> HttpResponse {
    let mut headers = HeaderMap::new();
    for response in responses {
        for (name, value) in response.http_headers.iter() {
            headers.append(name, value.clone());
        }
    }
    let mut body = Capped {
        bytes: Vec::new(),
        max,
    };
    let written: Vec<Written<'_>> = responses.iter().map(|r| Written::of(r, media)).collect();
    let fits = if single {
        serde_json::to_writer(&mut body, &written[0])
    } else {
        serde_json::to_writer(&mut body, &written)
    };
    if fits.is_err() {
        return Rejection::ResponseTooLarge { max }.into_response();
    }
    let status = match &written[..] {
        [Written::NoData { .. }] if single => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    };
    let mut response = (
        status,
        [(header::CONTENT_TYPE, media.content_type())],
        body.bytes,
    )
        .into_response();
    response.headers_mut().extend(headers);
    response
}

/// A `Vec<u8>` writer that fails once it would pass `max` bytes.
struct Capped {
    bytes: Vec<u8>,
    max: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.max {
            return Err(std::io::Error::other("answer too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
