//! The configuration as a user meets it: built in code or read from TOML,
//! and every bad value an error naming its key.

use super::*;
use std::time::Duration;

#[test]
fn write_timeout_defaults_to_ten_seconds_and_must_be_positive() {
    let config = Config::from_toml("").unwrap();
    assert_eq!(config.http.write_timeout(), Duration::from_secs(10));
    let set = Config::from_toml("[http]\nwrite_timeout_ms = 300\n").unwrap();
    assert_eq!(set.http.write_timeout_ms, 300);
    let err = Config::from_toml("[http]\nwrite_timeout_ms = 0\n").unwrap_err();
    assert_eq!(err.to_string(), "http.write_timeout_ms must be at least 1");
}

#[test]
fn setters_build_what_toml_reads() {
    let built = Config::default()
        .budget(
            BudgetConfig::default()
                .max_reads(7)
                .deadline_ms(900)
                .refuse_over_estimate(true),
        )
        .http(
            HttpConfig::default()
                .max_body_bytes(1024)
                .cors_allowed_origins(["https://app.example"])
                .csrf_get(CsrfGet::Allow),
        )
        .host(
            "registry:5000",
            HostConfig::default()
                .max_concurrent(4)
                .acquire_wait_ms(500)
                .coalesce(true),
        )
        .rate_limit(
            RateLimitConfig::default()
                .requests_per_minute(60)
                .internal_token("secret")
                .trusted_proxies(vec![String::from("10.0.0.0/8")])
                .ipv6_prefix(56),
        )
        .redis(
            RedisConfig::default()
                .url("redis://127.0.0.1:6379")
                .failure_mode(FailureMode::Closed)
                .key_prefix("test"),
        )
        .upstream(UpstreamConfig::default().max_redirects(0));
    let read = Config::from_toml(
        r#"
[budget]
max_reads = 7
deadline_ms = 900
refuse_over_estimate = true
[http]
max_body_bytes = 1024
cors_allowed_origins = ["https://app.example"]
csrf_get = "allow"
[hosts."registry:5000"]
max_concurrent = 4
acquire_wait_ms = 500
coalesce = true
[rate_limit]
requests_per_minute = 60
internal_token = "secret"
trusted_proxies = ["10.0.0.0/8"]
ipv6_prefix = 56
[redis]
url = "redis://127.0.0.1:6379"
failure_mode = "closed"
key_prefix = "test"
[upstream]
max_redirects = 0
"#,
    )
    .unwrap();
    assert_eq!(built, read);
    assert_ne!(built, Config::default());
    assert!(built.validate().is_ok());
    // A setter for an `Option` takes the value or `None`.
    assert_eq!(HttpConfig::default().csrf_get(None).csrf_get, None);
}

/// One bad value of each section, read from TOML: a rule it breaks (no
/// line: found after reading) or a value TOML cannot read as its type (its
/// line and column). Each error's `key()` is the key.
#[test]
fn a_bad_value_of_each_section_names_its_key() {
    let cases = [
        ("[budget]\nmax_reads = 0", "budget.max_reads", None),
        (
            "[budget]\ndeadline_ms = \"soon\"",
            "budget.deadline_ms",
            Some((2, 15)),
        ),
        (
            "[http]\nmax_batch_operations = 0",
            "http.max_batch_operations",
            None,
        ),
        (
            "[http]\ncors_allowed_origins = [\"app\"]",
            "http.cors_allowed_origins",
            None,
        ),
        (
            "[http]\ncsrf_get = \"sideways\"",
            "http.csrf_get",
            Some((2, 12)),
        ),
        (
            "[hosts.registry]\nmax_concurrent = 1",
            "hosts.registry",
            None,
        ),
        (
            "[hosts.\"registry:5000\"]\nmax_concurrent = -1",
            "hosts.\"registry:5000\".max_concurrent",
            Some((2, 18)),
        ),
        (
            "[hosts.\"registry:5000\"]\nacquire_wait = 5",
            "hosts.\"registry:5000\".acquire_wait",
            Some((2, 1)),
        ),
        (
            "[rate_limit]\nrequests_per_minute = 0",
            "rate_limit.requests_per_minute",
            None,
        ),
        (
            "[rate_limit]\ntrusted_proxies = [\"10.0.0.0/33\"]",
            "rate_limit.trusted_proxies",
            None,
        ),
        (
            "[rate_limit]\nipv4_prefix = 33",
            "rate_limit.ipv4_prefix",
            None,
        ),
        (
            "[rate_limit]\nipv6_prefix = 129",
            "rate_limit.ipv6_prefix",
            None,
        ),
        ("[redis]\nbackoff_ms = 0", "redis.backoff_ms", None),
        ("[redis]\nrefresh_ms = 2000", "redis.refresh_ms", None),
        ("[redis]\nurl = \"http://10.0.0.1\"", "redis.url", None),
        (
            "[redis]\nfailure_mode = \"sideways\"",
            "redis.failure_mode",
            Some((2, 16)),
        ),
        (
            "[upstream]\nmax_redirects = -1",
            "upstream.max_redirects",
            Some((2, 17)),
        ),
        (
            "[upstream]\n\nmax_response_bytes = 1.5",
            "upstream.max_response_bytes",
            Some((3, 22)),
        ),
        (
            "budget.max_reads = \"many\"",
            "budget.max_reads",
            Some((1, 20)),
        ),
        ("[budgett]\nmax_reads = 1", "budgett", Some((1, 2))),
    ];
    for (text, key, position) in cases {
        let err = Config::from_toml(text).unwrap_err();
        assert_eq!(err.key(), Some(key), "{text:?}: {err}");
        assert_eq!(err.line().zip(err.column()), position, "{text:?}: {err}");
        let shown = err.to_string();
        assert!(shown.starts_with(key), "{text:?}: {shown}");
        assert!(shown.contains(err.message()), "{text:?}: {shown}");
        match err.line() {
            Some(line) => assert!(shown.ends_with(&format!(" (line {line})")), "{shown}"),
            None => assert!(!shown.contains("(line"), "{shown}"),
        }
    }
}

/// The same rules on a configuration built in code, through `validate`.
#[test]
fn validate_names_the_key_of_a_configuration_built_in_code() {
    let cases = [
        (
            Config::default().budget(BudgetConfig::default().max_concurrent_reads(0)),
            "budget.max_concurrent_reads",
        ),
        (
            Config::default()
                .http(HttpConfig::default().cors_allowed_origins(["*", "https://a.example"])),
            "http.cors_allowed_origins",
        ),
        (
            Config::default().host("registry:http", HostConfig::default()),
            "hosts.\"registry:http\"",
        ),
        (
            Config::default().rate_limit(RateLimitConfig::default().trusted_proxies(["proxy"])),
            "rate_limit.trusted_proxies",
        ),
        (
            Config::default().redis(RedisConfig::default().timeout_ms(4000)),
            "redis.timeout_ms",
        ),
    ];
    for (config, key) in cases {
        let err = config.validate().unwrap_err();
        assert_eq!(err.key(), Some(key), "{err}");
        assert_eq!(err.line(), None, "{err}");
    }
}

#[test]
fn a_syntax_error_has_its_line_and_column() {
    let err = Config::from_toml("[budget]\nmax_reads = = 3\n").unwrap_err();
    assert_eq!(err.key(), Some("budget.max_reads"), "{err}");
    assert_eq!(err.line(), Some(2), "{err}");
    assert!(err.column().is_some(), "{err}");
    let err = Config::from_toml("[budget\nmax_reads = 3\n").unwrap_err();
    assert_eq!(err.line(), Some(1), "{err}");
    assert!(err.to_string().ends_with("(line 1)"), "{err}");
}

#[test]
fn redis_cluster_nodes_are_checked() {
    let two = "cluster_nodes = [\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\"]";
    let config = Config::from_toml(&format!("[redis]\n{two}\n")).unwrap();
    assert_eq!(config.redis.cluster_nodes.len(), 2);
    assert!(config.redis.url.is_empty() && config.redis.is_enabled());
    assert!(!Config::default().redis.is_enabled());
    let mut bad = vec![
        (
            format!("url = \"redis://10.0.0.9:6379\"\n{two}"),
            "redis.cluster_nodes: set redis.url (one server) or redis.cluster_nodes",
        ),
        (
            "cluster_nodes = [\"10.0.0.1:6379\"]".into(),
            "redis.cluster_nodes: \"10.0.0.1:6379\" must start with redis:// or rediss://",
        ),
        (
            "cluster_nodes = \"redis://10.0.0.1:6379\"".into(),
            "redis.cluster_nodes: invalid type",
        ),
    ];
    if cfg!(feature = "redis") {
        bad.push((
            "cluster_nodes = [\"redis://10.0.0.1:6379/2\"]".into(),
            "redis.cluster_nodes: \"redis://10.0.0.1:6379/2\": a cluster has database 0 only",
        ));
        bad.push((
            "cluster_nodes = [\"redis://:one@10.0.0.1:6379\", \"redis://:two@10.0.0.2:6379\"]"
                .into(),
            "redis.cluster_nodes: Cannot use different password",
        ));
    }
    for (table, want) in bad {
        let err = Config::from_toml(&format!("[redis]\n{table}\n")).unwrap_err();
        assert!(err.to_string().starts_with(want), "{table}: {err}");
        assert_eq!(err.key(), Some("redis.cluster_nodes"), "{table}: {err}");
    }
}

/// Two `[upstreams]` tables on one origin would share one set of
/// credentials and one cache identity: refused, naming both keys.
#[test]
fn two_upstream_tables_on_one_origin_are_refused_naming_both() {
    let text = "[upstreams.\"anon.reg\"]\nurl = \"https://reg.example\"\n\n\
                [upstreams.\"priv.reg\"]\nurl = \"https://REG.example:443/v2/\"\n\
                username = \"ci\"\npassword = \"pw\"\n";
    let err = Config::from_toml(text).unwrap_err();
    assert_eq!(err.key(), Some("upstreams.\"priv.reg\".url"), "{err}");
    assert!(
        err.message().contains("upstreams.\"anon.reg\".url"),
        "{err}"
    );
    assert!(!err.to_string().contains("pw"), "{err}");
    // Built in code: the same.
    let table = |url: &str| UpstreamTable::default().url(url);
    let config = Config::default()
        .upstream_named("a", table("http://127.0.0.1:5000"))
        .upstream_named("b", table("http://127.0.0.1:5000/"));
    assert_eq!(
        config.validate().unwrap_err().key(),
        Some("upstreams.b.url")
    );
    // Another port, scheme or host is another origin: accepted.
    let config = Config::default()
        .upstream_named("a", table("http://127.0.0.1:5000"))
        .upstream_named("b", table("http://127.0.0.1:5001"))
        .upstream_named("c", table("https://127.0.0.1:5000"))
        .upstream_named("d", table("http://localhost:5000"));
    config.validate().unwrap();
}

#[test]
fn two_upstream_names_equal_but_for_case_are_refused_naming_both() {
    let table = |url: &str| UpstreamTable::default().url(url);
    let config = Config::default()
        .upstream_named("Reg.io", table("http://127.0.0.1:5000"))
        .upstream_named("reg.io", table("http://127.0.0.1:5001"));
    let err = config.validate().unwrap_err();
    assert!(err.to_string().contains("Reg.io"), "{err}");
    assert!(err.to_string().contains("reg.io"), "{err}");
    assert!(err.message().contains("case"), "{err}");
}

#[test]
fn the_telemetry_section_parses_and_is_checked_with_the_file() {
    let config = Config::from_toml(
        "[telemetry]\notlp_endpoint = \"http://collector:4318\"\nservice_name = \"gw\"\nsample_ratio = 0.25\n",
    )
    .unwrap();
    assert_eq!(
        config.telemetry,
        TelemetryConfig::default()
            .otlp_endpoint("http://collector:4318")
            .service_name("gw")
            .sample_ratio(0.25)
    );
    let error = Config::from_toml("[telemetry]\nsample_ratio = 2.0\n").unwrap_err();
    assert_eq!(error.key(), Some("telemetry.sample_ratio"));
}

#[test]
fn an_upstream_url_with_credentials_is_refused_naming_the_key_never_the_secret() {
    for url in [
        "http://ci:s3cret@registry.example",
        "http://ci@registry.example",
        "https://:s3cret@registry.example",
    ] {
        let config = Config::default().upstream_named("reg", UpstreamTable::default().url(url));
        let err = config.validate().unwrap_err();
        assert_eq!(err.key(), Some("upstreams.reg.url"), "{url}: {err}");
        assert!(err.message().contains("username and password"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
