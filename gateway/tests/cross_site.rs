//! Pages on other sites against the gateway: a WebSocket upgrade from
//! another site's page is refused under the gateway's defaults (which let
//! plain cross-site `GET`s run), one from an origin in
//! `http.cors_allowed_origins` or from the gateway's own page is served; and
//! a page that rebinds its own name to the gateway's address (its `Origin`
//! and `Host` agree) is refused once `http.allowed_hosts` is set — which the
//! binary does by itself on a loopback address. Requests are written by hand
//! on a socket, so every header is exactly what a browser would send.
mod common;

use fanout_budget::Config;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The gateway (on the fixture registry) for `config`, served on a loopback
/// port until the handle is dropped.
struct Served {
    addr: SocketAddr,
    _registry: common::EmbeddedRegistry,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(config: impl FnOnce(SocketAddr) -> Config) -> Served {
    let registry = common::EmbeddedRegistry::fixture().await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = config(addr);
    let gateway = fanout_gateway::app::build(config.clone(), registry.url().parse().unwrap(), None);
    let serve = fanout_budget::inbound::serve(listener, gateway.router, &config);
    Served {
        addr,
        _registry: registry,
        server: tokio::spawn(serve.into_future()),
    }
}

/// Sends `head` (a request's head, `Host` and the rest, without the
/// request line) and `body` to `addr`; the answer's status and text.
async fn send(addr: SocketAddr, request_line: &str, head: &str, body: &str) -> (u16, String) {
    let exchange = async {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "{request_line}\r\n{head}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        // Up to the end of the head, and what the server wrote with it.
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..n]);
        }
        // A refusal's body follows its head (`Connection: close`).
        if !answer.starts_with(b"HTTP/1.1 101") {
            let _ =
                tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer)).await;
        }
        String::from_utf8_lossy(&answer).into_owned()
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an answer within 10 s");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    (status, answer)
}

/// A browser's WebSocket upgrade of `/graphql` naming `host`, with `Origin:
/// origin` if any.
async fn upgrade(addr: SocketAddr, host: &str, origin: Option<&str>) -> (u16, String) {
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "Host: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: graphql-transport-ws\r\nCookie: session=visitor\r\n{origin}"
    );
    send(addr, "GET /graphql HTTP/1.1", &head, "").await
}

/// A query POSTed naming `host`.
async fn post(addr: SocketAddr, host: &str) -> (u16, String) {
    let head = format!("Host: {host}\r\nContent-Type: application/json\r\nConnection: close\r\n");
    send(
        addr,
        "POST /graphql HTTP/1.1",
        &head,
        r#"{"query":"{ fanoutBudget { limit } }"}"#,
    )
    .await
}

fn refused(answer: &(u16, String), what: &str) {
    assert_eq!(answer.0, 400, "{what}: {}", answer.1);
    assert!(answer.1.contains("BAD_REQUEST"), "{what}: {}", answer.1);
}

#[tokio::test]
async fn a_page_on_another_site_cannot_open_a_socket_under_the_gateways_defaults() {
    let served = serve(|_| Config::default()).await;
    let addr = served.addr;
    let host = addr.to_string();
    // The gateway's default lets a plain cross-site GET run…
    let config = fanout_gateway::app::defaults(Config::default());
    assert_eq!(
        config.http.csrf_get,
        Some(fanout_budget::config::CsrfGet::Allow)
    );
    // …not a socket.
    refused(
        &upgrade(addr, &host, Some("https://evil.example")).await,
        "another site's page",
    );
    let own = format!("http://{host}");
    assert_eq!(
        upgrade(addr, &host, Some(&own)).await.0,
        101,
        "the gateway's own page (GraphiQL)"
    );
    assert_eq!(upgrade(addr, &host, None).await.0, 101, "not a browser");

    // An origin CORS allows is served; others still are not.
    let served = serve(|_| {
        let mut config = Config::default();
        config.http.cors_allowed_origins = vec!["https://app.example".into()];
        config
    })
    .await;
    let (addr, host) = (served.addr, served.addr.to_string());
    let (status, head) = upgrade(addr, &host, Some("https://app.example")).await;
    assert_eq!(status, 101, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-protocol: graphql-transport-ws"),
        "{head}"
    );
    refused(
        &upgrade(addr, &host, Some("https://evil.example")).await,
        "an origin not listed",
    );
}

#[tokio::test]
async fn a_rebound_name_is_refused_once_allowed_hosts_is_set() {
    // Without `allowed_hosts`, a page at http://evil.example:PORT whose name
    // now resolves to the gateway is its own origin: served.
    let open = serve(|_| Config::default()).await;
    let rebound = format!("evil.example:{}", open.addr.port());
    let page = format!("http://{rebound}");
    assert_eq!(upgrade(open.addr, &rebound, Some(&page)).await.0, 101);

    // With it (the gateway's loopback names): refused, a socket or a query.
    let served = serve(|addr| fanout_gateway::app::for_listener(Config::default(), addr)).await;
    let addr = served.addr;
    let rebound = format!("evil.example:{}", addr.port());
    let page = format!("http://{rebound}");
    refused(
        &upgrade(addr, &rebound, Some(&page)).await,
        "a rebound page's socket",
    );
    refused(&post(addr, &rebound).await, "a rebound page's query");
    // Whatever the path: the metrics, the health check, GraphiQL and its
    // assets, a path no route serves, a method none takes.
    let own = addr.to_string();
    for (line, served) in [
        ("GET /metrics HTTP/1.1", 200),
        ("GET /healthz HTTP/1.1", 200),
        ("GET /graphql HTTP/1.1", 200),
        ("GET /graphql/graphiql/init.js HTTP/1.1", 200),
        ("GET /nowhere HTTP/1.1", 404),
        ("DELETE /healthz HTTP/1.1", 405),
    ] {
        let ask = |host: String| async move {
            let head = format!("Host: {host}\r\nAccept: text/html\r\nConnection: close\r\n");
            send(addr, line, &head, "").await
        };
        refused(&ask(rebound.clone()).await, line);
        let (status, answer) = ask(own.clone()).await;
        assert_eq!(status, served, "{line} to {own}: {answer}");
    }
    for host in [
        addr.to_string(),
        format!("localhost:{}", addr.port()),
        format!("LocalHost:{}", addr.port()),
    ] {
        let own = format!("http://{host}");
        assert_eq!(upgrade(addr, &host, Some(&own)).await.0, 101, "{host}");
        let (status, answer) = post(addr, &host).await;
        assert_eq!(status, 200, "{host}: {answer}");
        assert!(answer.contains(r#""limit":100"#), "{host}: {answer}");
    }

    // Listed names only, on a gateway configured with its public name.
    let named = serve(|_| {
        let mut config = Config::default();
        config.http.allowed_hosts = vec!["gateway.example".into()];
        config
    })
    .await;
    let ok = format!("gateway.example:{}", named.addr.port());
    assert_eq!(post(named.addr, &ok).await.0, 200);
    refused(
        &post(named.addr, &named.addr.to_string()).await,
        "an address not listed",
    );
}

/// The binary, listening on loopback with no `allowed_hosts`, answers to
/// the loopback names only, on every path.
#[tokio::test]
async fn the_binary_on_loopback_answers_to_its_loopback_names_only() {
    let gateway = common::loopback::Gateway::start("");
    let addr = gateway.addr;
    let health = |host: String| async move {
        let head = format!("Host: {host}\r\nConnection: close\r\n");
        send(addr, "GET /healthz HTTP/1.1", &head, "").await
    };
    for host in [addr.to_string(), format!("localhost:{}", addr.port())] {
        let (status, answer) = health(host.clone()).await;
        assert_eq!(status, 200, "{host}: {answer}");
    }
    refused(
        &health(format!("evil.example:{}", addr.port())).await,
        "a rebound name, /healthz",
    );
    let rebound = format!("evil.example:{}", addr.port());
    let page = format!("http://{rebound}");
    refused(
        &upgrade(addr, &rebound, Some(&page)).await,
        "a rebound name, a socket",
    );
}
