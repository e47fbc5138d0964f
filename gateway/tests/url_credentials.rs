//! Credentials written in an upstream's URL (`--upstream
//! http://user:password@host`, or a `[upstreams.NAME]` table's `url`): the
//! gateway binary reads a registry that requires Basic auth with them, and
//! no line of its output — the start-up line included — holds the password,
//! in clear, percent-encoded or as the Basic value made of it. The registry
//! is the embedded one behind a loopback front that answers 401 `Basic`
//! to any request without the right `Authorization`.
mod common;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::EmbeddedRegistry;
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

const USER: &str = "ci";
/// Characters a URL must escape: its percent-encoded form differs.
const PASSWORD: &str = "s3cret:p@ss/w0rd";
const ENCODED: &str = "s3cret%3Ap%40ss%2Fw0rd";

/// The front: Basic auth, then the embedded registry.
struct Front {
    registry: EmbeddedRegistry,
    client: reqwest::Client,
    refused: AtomicU64,
    served: AtomicU64,
}

fn basic() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
}

async fn serve_front(State(front): State<Arc<Front>>, request: Request) -> Response {
    let expected = format!("Basic {}", basic());
    let authorized = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == expected.as_bytes());
    if !authorized {
        front.refused.fetch_add(1, SeqCst);
        return Response::builder()
            .status(401)
            .header("www-authenticate", "Basic realm=\"registry\"")
            .body(Body::from(
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
            ))
            .unwrap();
    }
    front.served.fetch_add(1, SeqCst);
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut upstream = front.client.request(
        request.method().clone(),
        format!("{}{path}", front.registry.url()),
    );
    for name in [http::header::ACCEPT, http::header::RANGE] {
        if let Some(value) = request.headers().get(&name) {
            upstream = upstream.header(name, value);
        }
    }
    let answer = upstream.send().await.unwrap();
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if name != http::header::TRANSFER_ENCODING && name != http::header::CONNECTION {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from(answer.bytes().await.unwrap()))
        .unwrap()
}

/// The front on a loopback port; its `host:port`.
async fn start_front() -> (Arc<Front>, String, tokio::task::JoinHandle<()>) {
    let front = Arc::new(Front {
        registry: EmbeddedRegistry::fixture().await.unwrap(),
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        refused: AtomicU64::new(0),
        served: AtomicU64::new(0),
    });
    let router = axum::Router::new()
        .fallback(serve_front)
        .with_state(front.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        axum::serve(listener, router).into_future().await.unwrap();
    });
    (front, addr, server)
}

/// A temporary directory for one run, removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("fanout-url-creds-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Kills the child on drop (a failed assertion leaves no process behind).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the binary with `args` at `RUST_LOG=trace`, asks it for a tag's
/// manifest, stops it; its answer and everything it printed.
async fn run(args: &[String], dir: &Dir) -> (Value, String) {
    let log = dir.0.join("stderr");
    let child = Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut printed = String::new();
    stdout.read_line(&mut printed).unwrap();
    let addr = printed
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {printed:?}"))
        .to_string();
    let query = r#"{ repository(name: "acme/app") { tags(first: 3) { nodes { name } } tag(name: "t01") { manifest { digest } } } }"#;
    let answer: Value = reqwest::Client::new()
        .post(format!("http://{addr}/graphql"))
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let _ = child.0.kill();
    let _ = child.0.wait();
    stdout.read_to_string(&mut printed).unwrap();
    printed.push_str(&std::fs::read_to_string(&log).unwrap());
    (answer, printed)
}

/// The answer is the registry's, and nothing printed holds the password.
fn check(front: &Front, registry: &str, answer: &Value, printed: &str, what: &str) {
    // The start-up line names the registry by its URL without credentials.
    let first = printed.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!("(registry at http://{registry}/)")),
        "{what}: {first}"
    );
    assert!(answer["errors"].is_null(), "{what}: {answer}");
    let digest = front
        .registry
        .with_store(|s| s.repos["acme/app"].tags["t01"].clone());
    assert_eq!(
        answer["data"]["repository"]["tag"]["manifest"]["digest"], digest,
        "{what}: {answer}"
    );
    assert_eq!(
        answer["data"]["repository"]["tags"]["nodes"]
            .as_array()
            .map(Vec::len),
        Some(3),
        "{what}: {answer}"
    );
    assert!(
        front.served.load(SeqCst) >= 2,
        "{what}: the reads passed the registry's auth"
    );
    assert!(printed.lines().count() > 20, "{what}: trace logging is on");
    let basic = basic();
    for secret in [PASSWORD, ENCODED, basic.as_str()] {
        let leaked: Vec<&str> = printed.lines().filter(|l| l.contains(secret)).collect();
        assert!(leaked.is_empty(), "{what}: {secret:?} printed: {leaked:?}");
    }
}

#[tokio::test]
async fn upstream_url_credentials_are_basic_auth_and_never_printed() {
    let (front, addr, server) = start_front().await;
    let dir = Dir::new("flag");
    let (answer, printed) = run(
        &[
            "--upstream".into(),
            format!("http://{USER}:{ENCODED}@{addr}"),
        ],
        &dir,
    )
    .await;
    check(&front, &addr, &answer, &printed, "--upstream");
    server.abort();
}

#[tokio::test]
async fn a_tables_url_credentials_are_basic_auth_and_never_printed() {
    let (front, addr, server) = start_front().await;
    let dir = Dir::new("table");
    let config = dir.0.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[upstreams.\"reg.example\"]\nurl = \"http://{USER}:{ENCODED}@{addr}\"\nprimary = true\n"
        ),
    )
    .unwrap();
    let (answer, printed) = run(&["--config".into(), config.display().to_string()], &dir).await;
    check(&front, &addr, &answer, &printed, "[upstreams] url");
    server.abort();
}

/// Credentials both in the URL and in the table's keys: the gateway does
/// not start, the message names the key and not the password.
#[test]
fn credentials_given_twice_stop_the_start_naming_the_key() {
    let dir = Dir::new("twice");
    let config = dir.0.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[upstreams.\"reg.example\"]\nurl = \"http://{USER}:{ENCODED}@127.0.0.1:9\"\n\
             username = \"{USER}\"\npassword = \"other\"\n"
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    // A configuration error ends the process at once; one that started is
    // killed at the deadline and the test fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    let _ = child.0.kill();
    let _ = child.0.wait();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = status.unwrap_or_else(|| panic!("the gateway started: {stderr}"));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("upstreams.\"reg.example\".url"), "{stderr}");
    assert!(
        !stderr.contains(PASSWORD) && !stderr.contains(ENCODED),
        "{stderr}"
    );
}
