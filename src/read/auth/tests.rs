//! The challenge parser, the realm rule, a token's lifetime and whose doing
//! a failed token fetch is.
use super::fault::Fault;
use super::*;
use http::{HeaderMap, StatusCode};
use std::time::{Duration, SystemTime};

fn unauthorized(values: &[&str]) -> UpstreamResponse {
    let mut headers = HeaderMap::new();
    for v in values {
        headers.append(header::WWW_AUTHENTICATE, HeaderValue::from_str(v).unwrap());
    }
    UpstreamResponse::new("r:5000", StatusCode::UNAUTHORIZED, headers, "".into())
}

#[test]
fn a_docker_challenge_is_read_whole() {
    let r = unauthorized(&[
        r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:library/alpine:pull""#,
    ]);
    assert_eq!(
        challenge(&r),
        Some(Challenge::Bearer {
            realm: "https://auth.example/token".into(),
            service: Some("registry.example".into()),
            scope: Some("repository:library/alpine:pull".into()),
            insufficient_scope: false,
        })
    );
}

#[test]
fn quoted_commas_escapes_and_several_challenges() {
    let r = unauthorized(&[
        r#"Basic realm="a, \"b\"", Bearer realm="https://x/t",scope="repository:a/b:pull,push",error="insufficient_scope""#,
    ]);
    let Some(Challenge::Bearer {
        scope,
        insufficient_scope,
        ..
    }) = challenge(&r)
    else {
        panic!("bearer preferred")
    };
    assert_eq!(scope.as_deref(), Some("repository:a/b:pull,push"));
    assert!(insufficient_scope);
    assert_eq!(
        challenge(&unauthorized(&["Basic realm=\"x\""])),
        Some(Challenge::Basic)
    );
    assert_eq!(challenge(&unauthorized(&["Negotiate"])), None);
    assert_eq!(
        challenge(&unauthorized(&["Bearer scope=x"])),
        None,
        "no realm"
    );
}

#[test]
fn realms_allowed_and_refused() {
    let table = |url: &str| {
        crate::config::UpstreamTable::default()
            .url(url)
            .username("ci")
            .password("pw")
            .realms(["https://auth.example/token"])
    };
    let upstreams = [("r".to_string(), table("https://registry.example"))].into();
    let auth = Auth::new(&upstreams);
    let read = Read::get("https://registry.example/v2/a/tags/list".parse().unwrap());
    let site = auth.site(&read.url).unwrap();
    let fetch = |realm: &str| auth.token_fetch(&read, site, realm, Some("svc"), Some("s"));
    // The upstream's own origin, and a listed realm: allowed, with Basic.
    let own = fetch("https://registry.example/token").unwrap();
    assert_eq!(
        own.read.url.as_str(),
        "https://registry.example/token?service=svc&scope=s"
    );
    assert!(own
        .read
        .headers
        .iter()
        .any(|(n, v)| n == header::AUTHORIZATION && v.is_sensitive()));
    assert!(fetch("https://auth.example/token").is_ok());
    // Anything else is refused without a request.
    for refused in [
        "http://registry.example/token",
        "http://auth.example/token",
        "https://evil.example/token",
        "https://auth.example/other",
        "ftp://registry.example/token",
        "not a url",
    ] {
        assert!(fetch(refused).is_err(), "{refused}");
    }
    // Tokens are kept apart by the origin that asked for them.
    let other = Read::get("https://mirror.example/v2/a/tags/list".parse().unwrap());
    let anonymous = Site::anonymous();
    let mirror = auth.token_fetch(
        &other,
        &anonymous,
        "https://mirror.example/token",
        Some("svc"),
        Some("s"),
    );
    assert_ne!(mirror.unwrap().source.key, own.source.key);
}

#[test]
fn a_token_lives_expires_in_from_issued_at_less_a_tenth() {
    let body = r#"{"token":"abc","expires_in":300}"#;
    let r = UpstreamResponse::new("a:1", StatusCode::OK, HeaderMap::new(), body.into());
    let t = token(&r).unwrap();
    assert_eq!(t.lifetime, Duration::from_secs(290));
    assert!(t.header.is_sensitive());
    let old = humantime::format_rfc3339(SystemTime::now() - Duration::from_secs(100));
    let body = format!(r#"{{"access_token":"abc","expires_in":300,"issued_at":"{old}"}}"#);
    let r = UpstreamResponse::new("a:1", StatusCode::OK, HeaderMap::new(), body.into());
    let lifetime = token(&r).unwrap().lifetime.as_secs();
    assert!((189..=190).contains(&lifetime), "{lifetime}");
    let r = UpstreamResponse::new("a:1", StatusCode::OK, HeaderMap::new(), "{}".into());
    let not_a_token = token(&r).unwrap_err();
    assert_eq!(not_a_token.error.code(), "UPSTREAM_ERROR");
    assert_eq!(not_a_token.fault, Fault::Realm);
    let r = UpstreamResponse::new("a:1", StatusCode::FORBIDDEN, HeaderMap::new(), "".into());
    let refused = token(&r).unwrap_err();
    assert_eq!(refused.error.code(), "UPSTREAM_UNAUTHORIZED");
    assert_eq!(refused.fault, Fault::Refused);
    // A 401: refused credentials, or a realm the upstream moved away from.
    let r = UpstreamResponse::new("a:1", StatusCode::UNAUTHORIZED, HeaderMap::new(), "".into());
    let unknown = token(&r).unwrap_err();
    assert_eq!(unknown.error.code(), "UPSTREAM_UNAUTHORIZED");
    assert_eq!(unknown.fault, Fault::Realm);
    let r = UpstreamResponse::new("a:1", StatusCode::NOT_FOUND, HeaderMap::new(), "".into());
    assert_eq!(token(&r).unwrap_err().fault, Fault::Realm);
}

#[test]
fn a_realm_the_transport_would_rewrite_is_refused() {
    let table = crate::config::UpstreamTable::default()
        .url("http://127.0.0.1:5000")
        .username("ci")
        .password("pw");
    let upstreams = [("r".to_string(), table)].into();
    let auth = Auth::new(&upstreams);
    let read = Read::get("http://127.0.0.1:5000/v2/a/tags/list".parse().unwrap());
    let site = auth.site(&read.url).unwrap();
    let fetch = |realm: &str| auth.token_fetch(&read, site, realm, None, Some("s"));
    assert!(fetch("http://127.0.0.1:5000/token").is_ok());
    // `\@` in a quoted challenge is `@`: the realm carries a user.
    let r = unauthorized(&[r#"Bearer realm="http://x\@127.0.0.1:5000/token""#]);
    let Some(Challenge::Bearer { realm, .. }) = challenge(&r) else {
        panic!("a bearer challenge")
    };
    assert_eq!(realm, "http://x@127.0.0.1:5000/token");
    for refused in [
        realm.as_str(),
        "http://x:y@127.0.0.1:5000/token",
        "http://127.0.0.1:5000/token#frag",
        "http://127.0.0.1:5000/token#",
        // Not as it would be sent: the transport would rewrite it.
        "http://127.0.0.1:5000/a/../token",
        "http://127.0.0.1:5000/to ken",
        "HTTP://127.0.0.1:5000/token",
    ] {
        let err = fetch(refused).err().unwrap_or_else(|| panic!("{refused}"));
        assert!(!err.contains("x@") && !err.contains("x:y"), "{err}");
    }
}

#[tokio::test]
async fn a_refused_realm_is_not_remembered() {
    let upstreams = [(
        "r".to_string(),
        crate::config::UpstreamTable::default().url("http://127.0.0.1:5000"),
    )]
    .into();
    let auth = Auth::new(&upstreams);
    let read = Read::get("http://127.0.0.1:5000/v2/a/tags/list".parse().unwrap());
    for realm in [
        r#"Bearer realm="http://x\@127.0.0.1:5000/token",scope="s""#,
        r#"Bearer realm="http://127.0.0.1:5000/token#frag",scope="s""#,
    ] {
        let rejected = Rejected::default();
        let answer = auth
            .answer(&read, &unauthorized(&[realm]), None, &rejected)
            .await;
        let Answer::Refuse(err) = answer else {
            panic!("{realm}: refused")
        };
        assert_eq!(err.code(), "UPSTREAM_UNAUTHORIZED");
        assert!(!auth.knows(&read), "{realm}: not remembered");
    }
}

#[test]
fn the_request_s_own_bounds_are_the_fetcher_s_and_the_realm_s_failures_its_own() {
    let host = || "realm:443".to_string();
    let fetcher = [
        ReadError::AnswerBound {
            host: host(),
            status: 200,
            message: "bound".into(),
        },
        ReadError::BudgetExhausted { limit: 1 },
        ReadError::DeadlineExceeded,
        ReadError::HostSaturated {
            host: host(),
            max_concurrent: 1,
        },
    ];
    for error in fetcher {
        assert_eq!(
            FetchError::read(error.clone()).fault,
            Fault::Fetcher,
            "{error:?}"
        );
    }
    let realm = [
        ReadError::Upstream {
            host: host(),
            status: Some(502),
            message: "down".into(),
        },
        ReadError::UpstreamTimeout {
            host: host(),
            timeout_ms: 1,
        },
    ];
    for error in realm {
        assert_eq!(
            FetchError::read(error.clone()).fault,
            Fault::Realm,
            "{error:?}"
        );
    }
    let quota = ReadError::QuotaExhausted {
        host: host(),
        retry_after_ms: 1,
    };
    assert_eq!(FetchError::read(quota).fault, Fault::Refused);
}
