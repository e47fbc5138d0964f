//! GraphiQL, served by the binary itself.
//!
//! [`page`] is a short HTML document: a stylesheet and four scripts at
//! `{endpoint}/graphiql/{name}`, and a `<div>` that carries the endpoint in
//! `data-endpoint` (and the query the editor opens on in `data-query`). [`asset`] answers those names from bytes compiled in from
//! `assets/graphiql/`: GraphiQL 3.9.0 and React 18.3.1 as published on npm
//! (that folder's README says where each file came from and how to update
//! them), and `init.js`, which mounts GraphiQL with
//! `GraphiQL.createFetcher({ url, subscriptionUrl })`: queries over HTTP,
//! subscriptions over a WebSocket to the same endpoint (`ws:`/`wss:`), by the
//! graphql-ws client GraphiQL's bundle already holds. No inline script, so
//! the page runs under [`CONTENT_SECURITY_POLICY`] (`script-src 'self'`;
//! `connect-src 'self'` covers the page's own origin's WebSocket).
//!
//! Why offline: the stock async-graphql page loads React and GraphiQL from a
//! CDN, so it is blank on a machine without internet access or under a CSP
//! that allows only the origin, and it runs a third party's script on the
//! gateway's origin. Here the page fetches its assets and the endpoint, and
//! nothing else. Without the cargo feature `graphiql` (on by default)
//! nothing is embedded and the page says so.

/// The page for the endpoint at `endpoint` (a path such as `/graphql`); its
/// assets are at `{endpoint}/graphiql/{name}` (`/graphiql/{name}` for `/`).
/// `example`: the query the editor opens on (`data-query`), when given.
pub(crate) fn page(endpoint: &str, example: Option<&str>) -> String {
    if ASSETS.is_empty() {
        return NOT_COMPILED_IN.to_string();
    }
    // One leading slash: `//host/…` would name another host.
    let endpoint = format!("/{}", endpoint.trim_matches(['/', '\\']));
    let base = escape(endpoint.trim_end_matches('/'));
    let query = example.map_or(String::new(), |q| format!(" data-query=\"{}\"", escape(q)));
    let scripts: String = SCRIPTS
        .iter()
        .map(|name| format!("<script src=\"{base}/graphiql/{name}\"></script>\n"))
        .collect();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>GraphiQL</title>\n<link rel=\"icon\" href=\"data:,\">\n\
         <link rel=\"stylesheet\" href=\"{base}/graphiql/{STYLESHEET}\">\n</head>\n<body>\n\
         <div id=\"graphiql\" data-endpoint=\"{}\"{query}>Loading GraphiQL…</div>\n{scripts}</body>\n</html>\n",
        escape(&endpoint),
    )
}

/// The page's `Content-Security-Policy`: its own origin and nothing else,
/// with what GraphiQL 3 was seen to need in Chromium: `data:` fonts (its
/// stylesheet inlines them) and inline `<style>` elements (its dialogs lock
/// scrolling with one); `data:` images for the page's empty icon (no
/// `/favicon.ico` request) and the stylesheet's lint icons. Inline scripts
/// and style attributes stay refused.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; style-src-elem 'self' 'unsafe-inline'; connect-src 'self'; \
     img-src 'self' data:; font-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// One of the page's assets: its content type and bytes.
pub(crate) fn asset(name: &str) -> Option<(&'static str, &'static [u8])> {
    ASSETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|&(_, content_type, bytes)| (content_type, bytes))
}

#[cfg(feature = "graphiql")]
const JS: &str = "text/javascript; charset=utf-8";
#[cfg(feature = "graphiql")]
const CSS: &str = "text/css; charset=utf-8";
/// In the order they run: React, ReactDOM, GraphiQL, the mount.
const SCRIPTS: [&str; 4] = [
    "react-18.3.1.production.min.js",
    "react-dom-18.3.1.production.min.js",
    "graphiql-3.9.0.min.js",
    "init.js",
];
const STYLESHEET: &str = "graphiql-3.9.0.min.css";

/// Name, content type, bytes.
#[cfg(feature = "graphiql")]
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        SCRIPTS[0],
        JS,
        include_bytes!("../../assets/graphiql/react-18.3.1.production.min.js"),
    ),
    (
        SCRIPTS[1],
        JS,
        include_bytes!("../../assets/graphiql/react-dom-18.3.1.production.min.js"),
    ),
    (
        SCRIPTS[2],
        JS,
        include_bytes!("../../assets/graphiql/graphiql-3.9.0.min.js"),
    ),
    (
        SCRIPTS[3],
        JS,
        include_bytes!("../../assets/graphiql/init.js"),
    ),
    (
        STYLESHEET,
        CSS,
        include_bytes!("../../assets/graphiql/graphiql-3.9.0.min.css"),
    ),
];
#[cfg(not(feature = "graphiql"))]
const ASSETS: &[(&str, &str, &[u8])] = &[];

const NOT_COMPILED_IN: &str = "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">\
    <title>GraphiQL</title></head>\n<body><p>GraphiQL is not compiled into this build \
    (cargo feature <code>graphiql</code>). POST GraphQL requests to this URL.</p></body>\n</html>\n";

/// `text` for an HTML text or quoted attribute value.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(all(test, feature = "graphiql"))]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_its_assets_under_the_endpoint_and_escapes_it() {
        let html = page("/graphql", None);
        for name in SCRIPTS {
            assert!(html.contains(&format!(
                "<script src=\"/graphql/graphiql/{name}\"></script>"
            )));
            assert!(asset(name).is_some_and(|(t, b)| t == JS && !b.is_empty()));
        }
        assert!(html.contains("data-endpoint=\"/graphql\""));
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert!(
            page("", None).contains("src=\"/graphiql/init.js\"")
                && page("", None).contains("data-endpoint=\"/\"")
        );
        assert!(page("//evil.example/x", None).contains("src=\"/evil.example/x/graphiql/"));
        let hostile = page("/a\"><script>alert(1)</script>", None);
        assert!(hostile.contains("/a&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert_eq!(hostile.matches("<script").count(), SCRIPTS.len());
        assert_eq!(asset("nope.js"), None);
        assert_eq!(asset(STYLESHEET).map(|(t, _)| t), Some(CSS));
        assert!(!html.contains("data-query"));
    }

    #[test]
    fn the_example_query_is_an_escaped_attribute() {
        let html = page("/graphql", Some("{ a(x: \"<b>\") }\n# 'c' & d"));
        assert!(
            html.contains("data-query=\"{ a(x: &quot;&lt;b&gt;&quot;) }\n# &#39;c&#39; &amp; d\"")
        );
        assert_eq!(html.matches("<script").count(), SCRIPTS.len());
    }
}
