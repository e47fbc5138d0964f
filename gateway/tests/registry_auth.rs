//! The gateway on registries that authenticate: Debian's `docker-registry`
//! (CNCF distribution 2.8) started here with `auth: token` (a token server
//! in the test signs the JWTs), with `htpasswd`, and over TLS with a CA made
//! here; and two registries at once by name. The images are pushed while the
//! registry is open, then it is started again on the same storage with auth.
//! Nothing is mocked at the HTTP layer. The configurations are the book's (book/src/registries.md)
//! forms ("Registries that authenticate"), with loopback URLs.
mod common;

use common::push::{push, push_with};
use common::*;
use fanout_budget::config::UpstreamTable;
use fanout_budget::Config;
use fanout_gateway::app::Gateway;
use fanout_gateway::embedded::{Image, Store};
use fanout_testkit::{RegistryAuth, RegistryServer, TokenPolicy};
use serde_json::{json, Value};
use std::time::Duration;

const PUBLIC: &str = "acme/public";
const PRIVATE: &str = "acme/private";
const DENIED: &str = "acme/denied";

fn store() -> Store {
    let mut store = Store::default();
    let image = Image::demo("linux", "amd64", "auth");
    store.put_image(PUBLIC, Some("v1"), &image);
    store.put_image(PUBLIC, Some("v2"), &Image::demo("linux", "arm64", "auth"));
    store.put_image(PRIVATE, Some("v1"), &image);
    store.put_image(DENIED, Some("v1"), &image);
    store
}

fn policy() -> TokenPolicy {
    TokenPolicy {
        user: "ci".into(),
        password: "s3cret-pw".into(),
        public: vec![PUBLIC.into()],
        denied: vec![DENIED.into()],
        expires_in: 300,
    }
}

/// A registry holding [`store`], then serving it with `auth` (and TLS).
async fn registry(auth: RegistryAuth, tls: bool) -> Option<(RegistryServer, Store)> {
    let binary = require_binary("docker-registry", "docker-registry")?;
    let mut registry = RegistryServer::start(&binary, RegistryAuth::None, false).await;
    let store = store();
    push(&registry.url(), &store).await;
    registry.restart_with(auth, tls).await;
    Some((registry, store))
}

/// `[upstreams."NAME"]` for `registry`: its URL, its realm allowed (the
/// token server is another origin, as Docker Hub's is).
fn table(registry: &RegistryServer) -> UpstreamTable {
    let mut table = UpstreamTable::default().url(registry.url());
    if let Some(realm) = registry.realm() {
        table = table.realms([realm]);
    }
    table
}

fn gateway(registry: &RegistryServer, table: UpstreamTable) -> Gateway {
    let config = Config::default().upstream_named("registry", table);
    fanout_gateway::app::build(config, registry.url().parse().unwrap(), None)
}

/// `{ repository(name) { tags { nodes { name manifest { digest config { os } } } } } }`.
fn repo_query(name: &str) -> String {
    format!(
        r#"{{ repository(name: "{name}") {{ tags(first: 10) {{ nodes {{ name manifest {{ digest config {{ os }} }} }} }} }} }}"#
    )
}

async fn query(gateway: &Gateway, query: &str) -> Value {
    let (status, body) = post(&gateway.router, json!({ "query": query }).to_string(), &[]).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn used(answer: &Value) -> u64 {
    answer["extensions"]["fanout"]["used"].as_u64().unwrap()
}

fn code(answer: &Value) -> &str {
    answer["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("")
}

/// The digests the answer lists, by tag, checked against what was pushed.
fn assert_pushed(answer: &Value, store: &Store, name: &str) {
    assert!(answer.get("errors").is_none(), "{answer}");
    let tags = answer["data"]["repository"]["tags"]["nodes"]
        .as_array()
        .unwrap();
    let repo = &store.repos[name];
    assert_eq!(tags.len(), repo.tags.len());
    for tag in tags {
        let tag_name = tag["name"].as_str().unwrap();
        assert_eq!(tag["manifest"]["digest"], json!(repo.tags[tag_name]));
        assert!(tag["manifest"]["config"]["os"].is_string(), "{tag}");
    }
}

#[tokio::test]
async fn the_token_flow_answers_public_and_private_repositories() {
    let Some((registry, store)) = registry(RegistryAuth::Token(policy()), false).await else {
        return;
    };
    let anonymous = gateway(&registry, table(&registry));
    // Cold: the tag list costs the 401, the token and the retry; each
    // manifest and config then carries the kept token up front.
    let cold = query(&anonymous, &repo_query(PUBLIC)).await;
    assert_pushed(&cold, &store, PUBLIC);
    assert_eq!(used(&cold), 3 + 2 + 2, "{cold}");
    assert_eq!(
        registry.token_fetches(&format!("repository:{PUBLIC}:pull")),
        1
    );
    // Steady state: one request per read, as on an open registry; the
    // config blobs, by digest, come from the engine's cache.
    let warm = query(&anonymous, &repo_query(PUBLIC)).await;
    assert_pushed(&warm, &store, PUBLIC);
    assert_eq!(used(&warm), 1 + 2);
    assert_eq!(warm["extensions"]["fanout"]["cacheHits"], 2);
    assert_eq!(registry.token_fetches_total(), 1);
    // Anonymous on a private repository: the registry refuses the token's
    // empty access, the field says so, nothing else is tried.
    let refused = query(&anonymous, &repo_query(PRIVATE)).await;
    assert!(refused["data"]["repository"].is_null());
    assert_eq!(code(&refused), "UPSTREAM_UNAUTHORIZED", "{refused}");
    // With the user's credentials: answered.
    let p = policy();
    let user = gateway(
        &registry,
        table(&registry).username(p.user).password(p.password),
    );
    let private = query(&user, &repo_query(PRIVATE)).await;
    assert_pushed(&private, &store, PRIVATE);
    // A repository the user is not granted: UPSTREAM_FORBIDDEN at its
    // field, the rest of the page answered.
    let both = format!(
        r#"{{ denied: repository(name: "{DENIED}") {{ name }} {} }}"#,
        repo_query(PUBLIC)
            .trim_start_matches('{')
            .trim_end_matches('}')
    );
    let page = query(&user, &both).await;
    assert!(page["data"]["denied"].is_null(), "{page}");
    assert_eq!(page["errors"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(code(&page), "UPSTREAM_FORBIDDEN", "{page}");
    assert_eq!(page["errors"][0]["path"], json!(["denied"]));
    assert_pushed(
        &json!({ "data": { "repository": page["data"]["repository"] } }),
        &store,
        PUBLIC,
    );
    // The credentials went to the realm, as Basic.
    assert!(registry
        .token_requests()
        .iter()
        .any(|r| r.contains("Basic ")));
}

#[tokio::test]
async fn wrong_credentials_are_one_coded_error_and_no_storm() {
    let Some((registry, _)) = registry(RegistryAuth::Token(policy()), false).await else {
        return;
    };
    let wrong = gateway(&registry, table(&registry).username("ci").password("wrong"));
    let answer = query(&wrong, &repo_query(PUBLIC)).await;
    assert!(answer["data"]["repository"].is_null());
    assert_eq!(code(&answer), "UPSTREAM_UNAUTHORIZED", "{answer}");
    assert_eq!(answer["errors"].as_array().unwrap().len(), 1);
    assert_eq!(used(&answer), 2, "the 401 and the refused token fetch");
    assert_eq!(registry.token_refusals(), 1);
}

#[tokio::test]
async fn a_hundred_cold_requests_fetch_one_token_per_scope() {
    let Some((registry, store)) = registry(RegistryAuth::Token(policy()), false).await else {
        return;
    };
    let gateway = gateway(&registry, table(&registry));
    let answers = futures::future::join_all((0..100).map(|i| {
        let name = if i % 2 == 0 { PUBLIC } else { PRIVATE };
        let gateway = &gateway;
        async move { (name, query(gateway, &repo_query(name)).await) }
    }))
    .await;
    for (name, answer) in &answers {
        if *name == PUBLIC {
            assert_pushed(answer, &store, PUBLIC);
        } else {
            assert_eq!(code(answer), "UPSTREAM_UNAUTHORIZED", "{answer}");
        }
    }
    assert_eq!(
        registry.token_fetches(&format!("repository:{PUBLIC}:pull")),
        1
    );
    assert_eq!(
        registry.token_fetches(&format!("repository:{PRIVATE}:pull")),
        1
    );
}

#[tokio::test]
async fn an_expired_token_is_refreshed_once() {
    let Some((registry, store)) = registry(RegistryAuth::Token(policy()), false).await else {
        return;
    };
    registry.set_expires_in(2);
    let gateway = gateway(&registry, table(&registry));
    assert_pushed(&query(&gateway, &repo_query(PUBLIC)).await, &store, PUBLIC);
    assert_eq!(registry.token_fetches_total(), 1);
    // Kept 1.8 s (a tenth less than given); the JWT itself expires at 2 s.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let answers = futures::future::join_all(
        (0..10).map(|_| async { query(&gateway, &repo_query(PUBLIC)).await }),
    )
    .await;
    for answer in &answers {
        assert_pushed(answer, &store, PUBLIC);
    }
    assert_eq!(
        registry.token_fetches_total(),
        2,
        "refreshed once for all ten"
    );
}

#[tokio::test]
async fn basic_credentials_on_an_htpasswd_registry() {
    let auth = RegistryAuth::Htpasswd {
        user: "ci".into(),
        password: "s3cret-pw".into(),
    };
    let Some((registry, store)) = registry(auth, false).await else {
        return;
    };
    let user = gateway(
        &registry,
        table(&registry).username("ci").password("s3cret-pw"),
    );
    let cold = query(&user, &repo_query(PUBLIC)).await;
    assert_pushed(&cold, &store, PUBLIC);
    // The 401 and the retry once; then Basic up front.
    assert_eq!(used(&cold), 2 + 2 + 2);
    assert_eq!(
        used(&query(&user, &repo_query(PUBLIC)).await),
        1 + 2,
        "blobs cached"
    );
    let wrong = gateway(&registry, table(&registry).username("ci").password("nope"));
    assert_eq!(
        code(&query(&wrong, &repo_query(PUBLIC)).await),
        "UPSTREAM_UNAUTHORIZED"
    );
    let none = gateway(&registry, table(&registry));
    assert_eq!(
        code(&query(&none, &repo_query(PUBLIC)).await),
        "UPSTREAM_UNAUTHORIZED"
    );
}

#[tokio::test]
async fn tls_with_the_configured_ca_and_refused_without_it() {
    let Some(binary) = require_binary("docker-registry", "docker-registry") else {
        return;
    };
    let registry = RegistryServer::start(&binary, RegistryAuth::None, true).await;
    let ca = registry.ca_file().expect("a TLS registry has a CA");
    let pem = std::fs::read(&ca).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let store = store();
    push_with(&client, &registry.url(), &store).await;
    let trusted = gateway(
        &registry,
        table(&registry).ca_file(ca.display().to_string()),
    );
    assert_pushed(&query(&trusted, &repo_query(PUBLIC)).await, &store, PUBLIC);
    let untrusted = gateway(&registry, table(&registry));
    let refused = query(&untrusted, &repo_query(PUBLIC)).await;
    assert_eq!(code(&refused), "UPSTREAM_ERROR", "{refused}");
    drop(registry);
}

#[tokio::test]
async fn two_registries_by_name_and_an_unknown_prefix_reads_nothing() {
    let Some((token, store)) = registry(RegistryAuth::Token(policy()), false).await else {
        return;
    };
    let Some((open, _)) = registry(RegistryAuth::None, false).await else {
        return;
    };
    // The open registry is the default; the token one is named by its host.
    let prefix = token.url().trim_start_matches("http://").to_string();
    let config = Config::default().upstream_named(&prefix, table(&token));
    let gateway = fanout_gateway::app::build(config, open.url().parse().unwrap(), None);
    let named = query(&gateway, &repo_query(&format!("{prefix}/{PUBLIC}"))).await;
    assert_pushed(&named, &store, PUBLIC);
    assert_eq!(
        named["data"]["repository"]["tags"]["nodes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(token.token_fetches_total(), 1);
    let default = query(&gateway, &repo_query(PRIVATE)).await;
    assert_pushed(&default, &store, PRIVATE);
    let unknown = query(&gateway, &repo_query("registry.invalid:5000/acme/public")).await;
    assert!(unknown["data"]["repository"].is_null());
    assert_eq!(code(&unknown), "BAD_USER_INPUT");
    assert_eq!(used(&unknown), 0);
}

/// The gateway binary at `RUST_LOG=trace`, with a password in its config,
/// through a cold token flow, a warm one, a refused repository and a
/// registry name it does not know: no line of its output holds the
/// password, the Basic value made of it, or a token.
#[tokio::test]
async fn no_credential_or_token_in_any_log_line() {
    let Some((registry, store)) = registry(RegistryAuth::Token(policy()), false).await else {
        return;
    };
    let p = policy();
    let dir = std::env::temp_dir().join(format!("fanout-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let password_file = dir.join("password");
    std::fs::write(&password_file, format!("{}\n", p.password)).unwrap();
    let config = format!(
        "[upstreams.\"registry\"]\nurl = \"{}\"\nrealms = [\"{}\"]\nusername = \"{}\"\npassword_file = \"{}\"\n",
        registry.url(),
        registry.realm().unwrap(),
        p.user,
        password_file.display()
    );
    std::fs::write(dir.join("gateway.toml"), config).unwrap();
    let log = dir.join("log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &registry.url(),
            "--config",
        ])
        .arg(dir.join("gateway.toml"))
        .env("RUST_LOG", "trace")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let client = reqwest::Client::new();
    let ask = |name: String| {
        let client = client.clone();
        let url = format!("http://{addr}/graphql");
        async move {
            let body = json!({ "query": repo_query(&name) });
            let answer = client.post(url).json(&body).send().await.unwrap();
            answer.json::<Value>().await.unwrap()
        }
    };
    assert_pushed(&ask(PUBLIC.into()).await, &store, PUBLIC);
    assert_pushed(&ask(PRIVATE.into()).await, &store, PRIVATE);
    assert_pushed(&ask(PUBLIC.into()).await, &store, PUBLIC);
    let unknown = ask("nowhere.invalid/acme/x".into()).await;
    assert_eq!(code(&unknown), "BAD_USER_INPUT");
    let _ = child.kill();
    let _ = child.wait();
    let mut text = std::fs::read_to_string(&log).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut rest).unwrap();
    text.push_str(&rest);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(text.lines().count() > 20, "trace logging is on: {text}");
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", p.user, p.password))
    };
    for secret in [p.password.as_str(), basic.as_str(), "eyJ", "Bearer "] {
        let leaked: Vec<&str> = text.lines().filter(|l| l.contains(secret)).collect();
        assert!(leaked.is_empty(), "{secret:?} in the log: {leaked:?}");
    }
}

/// Two `[upstreams]` tables on one origin would share one set of
/// credentials (the first name's) and one cache identity: the gateway
/// refuses to start, naming both keys.
#[test]
fn two_tables_on_one_origin_stop_the_gateway_at_start_up() {
    let dir = std::env::temp_dir().join(format!("fanout-origins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        "[upstreams.\"anon.reg\"]\nurl = \"http://127.0.0.1:5000\"\nprimary = true\n\n\
         [upstreams.\"priv.reg\"]\nurl = \"http://127.0.0.1:5000/\"\nusername = \"ci\"\npassword = \"s3cret-pw\"\n",
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A configuration error ends the process at once; a gateway that
    // started is stopped here and the test fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.unwrap_or_else(|| panic!("the gateway started: {stderr}"));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("upstreams.\"priv.reg\".url"), "{stderr}");
    assert!(stderr.contains("upstreams.\"anon.reg\".url"), "{stderr}");
    assert!(!stderr.contains("s3cret-pw"), "{stderr}");
}
