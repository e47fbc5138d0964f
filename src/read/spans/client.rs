//! The CLIENT span of one upstream request sent (see `spans.rs`), in the
//! HTTP client conventions, and, while telemetry lives,
//! `http.client.request.duration`: opened as the request is about to go,
//! the transport run inside it, finished with its status or its error.

#[cfg(feature = "otel")]
use super::spanned::direct;
use super::spanned::{enabled, Spanned, StatusText};
use crate::error::ReadError;
use crate::metrics::HostMetrics;
use crate::read::message::{Read, UpstreamResponse};
#[cfg(feature = "otel")]
use crate::telemetry::{ClientError, ClientKey};
use futures::future::BoxFuture;
use std::fmt;
use tracing::Instrument;

/// The span of one request about to be sent, and (with the `otel`
/// feature, while telemetry lives) when it started: small, as it is held
/// in the read's future.
pub(crate) struct ClientSpan {
    span: Spanned,
    #[cfg(feature = "otel")]
    metric: Option<Metric>,
}

/// `http.client.request.duration`'s start and method; the instrument and
/// the host's attributes are taken at the end (nothing allocated per
/// request: the attributes' list is on the stack).
#[cfg(feature = "otel")]
struct Metric {
    method: &'static str,
    started: std::time::Instant,
}

#[cfg(feature = "otel")]
impl Metric {
    fn of(read: &Read) -> Option<Metric> {
        crate::telemetry::is_recording().then(|| Metric {
            method: method_name(&read.method),
            started: std::time::Instant::now(),
        })
    }

    fn record(self, host: &HostMetrics, status: Option<u16>, error: Option<ClientError>) {
        let took = self.started.elapsed();
        let key = ClientKey {
            host: host.id,
            method: self.method,
            status,
            error,
        };
        // Nothing when the telemetry ended meanwhile.
        crate::telemetry::instruments(|i| {
            i.client_request(&key, took, || attributes(&key, host));
        });
    }
}

/// `http.client.request.duration`'s attributes for `key` (the host's from
/// its metric handles), on the stack: the method, the host's one or two, a
/// status and an error at most; the unused places are never read.
#[cfg(feature = "otel")]
fn attributes(key: &ClientKey, host: &HostMetrics) -> ([opentelemetry::KeyValue; 5], usize) {
    use opentelemetry::KeyValue;
    let mut attributes: [KeyValue; 5] = std::array::from_fn(|_| KeyValue::new("", false));
    let mut len = 0;
    let mut push = |attribute| {
        attributes[len] = attribute;
        len += 1;
    };
    push(KeyValue::new("http.request.method", key.method));
    host.server.iter().take(2).cloned().for_each(&mut push);
    if let Some(status) = key.status {
        push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
    }
    match key.error {
        Some(ClientError::Status(status)) => {
            push(KeyValue::new("error.type", status.to_string()));
        }
        Some(ClientError::Code(code)) => push(KeyValue::new("error.type", code)),
        None => {}
    }
    (attributes, len)
}

/// The conventions' name of a method: one of HTTP's, else `_OTHER`.
#[cfg(feature = "otel")]
fn method_name(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// The span of one request about to be sent to `read.url`.
pub(crate) fn client_span(read: &Read) -> ClientSpan {
    ClientSpan {
        span: span(read),
        #[cfg(feature = "otel")]
        metric: Metric::of(read),
    }
}

fn span(read: &Read) -> Spanned {
    let url = &read.url;
    #[cfg(feature = "otel")]
    if let Some(span) = direct(|| {
        use opentelemetry::KeyValue;
        // HTTP's own methods by their static names: no copy.
        let method = match method_name(&read.method) {
            "_OTHER" => std::borrow::Cow::Owned(read.method.as_str().to_owned()),
            known => std::borrow::Cow::Borrowed(known),
        };
        let mut attributes = Vec::with_capacity(7);
        attributes.push(KeyValue::new("http.request.method", method.clone()));
        if let Some(host) = url.host_str() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = url.port_or_known_default() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        attributes.push(KeyValue::new("url.full", SafeUrl(url).text()));
        (method, opentelemetry::trace::SpanKind::Client, attributes)
    }) {
        return span;
    }
    Spanned::tracing(enabled(|| {
        tracing::debug_span!(
            "upstream.request",
            otel.name = read.method.as_str(),
            otel.kind = "client",
            http.request.method = read.method.as_str(),
            server.address = url.host_str(),
            server.port = url.port_or_known_default().map(i64::from),
            url.full = %SafeUrl(url),
            http.response.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        )
    }))
}

impl ClientSpan {
    /// `fetch` (the transport's future) run inside the span: the
    /// `traceparent` the transport writes names it. Without a span,
    /// `fetch` as it is: nothing wraps the read's future.
    pub(crate) fn around<'a, T: 'a>(&self, fetch: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        match &self.span {
            Spanned::Off => fetch,
            Spanned::Tracing(span) if span.is_none() => fetch,
            Spanned::Tracing(span) => Box::pin(fetch.instrument(span.clone())),
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => Box::pin(span.around(fetch)),
        }
    }

    /// Records how the request ended (and, while telemetry lives, how long
    /// it took): its status, or its error. `host`: the metric handles of
    /// its host's label (a host without an entry of its own is
    /// `server.address = "other"`, without a port: the series stay bounded
    /// by the configuration, as the Prometheus `host` label does).
    pub(crate) fn finish<T: Answered>(self, outcome: &Result<T, ReadError>, host: &HostMetrics) {
        #[cfg(not(feature = "otel"))]
        let _ = host;
        #[cfg(feature = "otel")]
        if let Some(metric) = self.metric {
            match outcome {
                Ok(answer) => {
                    let status = answer.status();
                    metric.record(
                        host,
                        Some(status),
                        (status >= 400).then_some(ClientError::Status(status)),
                    );
                }
                Err(err) => {
                    let status = match err {
                        ReadError::Upstream { status, .. } => *status,
                        _ => None,
                    };
                    metric.record(host, status, Some(ClientError::Code(err.code())));
                }
            }
        }
        let span = self.span;
        if span.is_none() {
            return;
        }
        match outcome {
            Ok(answer) => {
                let status = answer.status();
                span.record("http.response.status_code", status);
                if status >= 400 {
                    // The conventions' `error.type` of an HTTP error answer.
                    span.record("error.type", StatusText(status));
                    span.fail();
                }
            }
            Err(err) => {
                if let ReadError::Upstream {
                    status: Some(status),
                    ..
                } = err
                {
                    span.record("http.response.status_code", *status);
                }
                span.record("error.type", err.code());
                span.fail();
            }
        }
    }
}

/// An answer with an HTTP status.
pub(crate) trait Answered {
    /// Its status code.
    fn status(&self) -> u16;
}

impl<R: std::ops::Deref<Target = UpstreamResponse>> Answered for R {
    fn status(&self) -> u16 {
        self.status.as_u16()
    }
}

/// A URL without its userinfo, query or fragment.
struct SafeUrl<'a>(&'a reqwest::Url);

impl SafeUrl<'_> {
    /// As a `String`, made at its length at once (`to_string` grows it as
    /// each part is written: three allocations, not one). A URL with no
    /// credentials, query or fragment is already what is shown: copied as
    /// it is, not written again part by part.
    #[cfg(feature = "otel")]
    fn text(&self) -> String {
        use fmt::Write as _;
        let url = self.0;
        if url.username().is_empty()
            && url.password().is_none()
            && url.query().is_none()
            && url.fragment().is_none()
        {
            return url.as_str().to_owned();
        }
        let mut text = String::with_capacity(url.as_str().len());
        write!(text, "{self}").expect("a String takes any text");
        text
    }
}

impl fmt::Display for SafeUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        write!(f, "{}://{}", url.scheme(), url.host_str().unwrap_or(""))?;
        if let Some(port) = url.port() {
            write!(f, ":{port}")?;
        }
        f.write_str(url.path())
    }
}

#[cfg(test)]
mod tests {
    use super::SafeUrl;

    #[test]
    fn url_full_drops_credentials_and_the_query() {
        let url = "https://user:secret@registry.test:5000/v2/x/manifests/1?token=abc#f"
            .parse()
            .unwrap();
        assert_eq!(
            SafeUrl(&url).to_string(),
            "https://registry.test:5000/v2/x/manifests/1"
        );
        #[cfg(feature = "otel")]
        assert_eq!(SafeUrl(&url).text(), SafeUrl(&url).to_string());
    }

    /// The copy taken as it is and the text written part by part agree,
    /// for every URL the copy is taken of and those it is not.
    #[test]
    fn url_full_copied_as_it_is_reads_as_written() {
        for url in [
            "http://127.0.0.1:5000/v2/",
            "https://registry.test/v2/x/manifests/sha256:ab",
            "https://REGISTRY.test:443/v2/%7Ex/tags/list",
            "http://[::1]:8080/v2/x/blobs/1",
            "http://h/a b/ü",
            "http://h/",
            "http://h/p?",
            "http://h/p#",
            "http://user@h/p",
            "http://:pw@h/p",
        ] {
            let url: reqwest::Url = url.parse().unwrap();
            let written = SafeUrl(&url).to_string();
            assert!(!written.contains(['@', '?', '#']), "{written}");
            #[cfg(feature = "otel")]
            assert_eq!(SafeUrl(&url).text(), written, "{url}");
        }
    }
}
