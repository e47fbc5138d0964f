//! `cargo run --release -- [--listen ADDR] [--upstream URL] [--config FILE]`
#![forbid(unsafe_code)]

use clap::Parser;
use fanout_budget::Config;
use fanout_gateway::{app, embedded::EmbeddedRegistry};
use std::net::SocketAddr;
use std::process::ExitCode;

/// The process's allocator: mimalloc (`alloc-mimalloc`, a default feature:
/// +21 % throughput and −20 % CPU per request under load against glibc's,
/// whose arena locks took a seventh of the process), jemalloc with
/// `alloc-jemalloc` (it wins if both; no faster here, and slower to build),
/// the system's with neither. The load bench runs under the same one
/// (BENCHMARKS.md § 4).
#[cfg(feature = "alloc-jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
#[cfg(all(feature = "alloc-mimalloc", not(feature = "alloc-jemalloc")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The registry gateway: GraphQL over an OCI registry, with fan-out budgets.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Base URL of the default OCI Distribution registry; absent: the
    /// `[upstreams]` table marked `primary = true`, else the embedded registry.
    /// A user and password in it (`http://user:password@host`) are the
    /// registry's credentials, as the `[upstreams]` table's keys give them.
    #[arg(long)]
    upstream: Option<String>,
    /// TOML configuration file; absent: all defaults.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

/// The configuration, and the `--upstream` URL without the credentials it
/// may carry: those, and a `[upstreams]` table's `url`'s, become the table's
/// `username` and `password` ([`credentials_from_urls`]), so no URL the
/// gateway reads, logs or shows holds a password.
///
/// [`credentials_from_urls`]: fanout_gateway::registries::credentials_from_urls
fn load_config(
    path: Option<&std::path::Path>,
    upstream: Option<&str>,
) -> Result<(Config, Option<reqwest::Url>), String> {
    // Not echoed: a URL that does not parse may still hold a password.
    let upstream = upstream
        .map(|u| reqwest::Url::parse(u).map_err(|e| format!("--upstream: not a URL ({e})")))
        .transpose()?;
    let config = match path {
        None => Config::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            // Validated below, once credentials are out of the URLs.
            Config::from_toml_unchecked(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
    }
    .with_env();
    let mut config = config;
    let upstream = fanout_gateway::registries::credentials_from_urls(&mut config, upstream)?;
    config.validate().map_err(|e| match path {
        Some(path) => format!("{}: {e}", path.display()),
        None => e.to_string(),
    })?;
    // OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME and
    // OTEL_TRACES_SAMPLER_ARG override `[telemetry]`.
    config.telemetry = config.telemetry.with_env().map_err(|e| e.to_string())?;
    Ok((config, upstream))
}

/// The log (`RUST_LOG`, default `info`; on stderr, stdout carrying only the
/// address the gateway listens on) and, when an OTLP endpoint is set,
/// the trace export, whose guard sends the queued spans when dropped.
#[cfg(feature = "otel")]
fn install_subscriber(
    config: &Config,
) -> Result<Option<fanout_budget::telemetry::Telemetry>, String> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let telemetry = fanout_budget::telemetry::Telemetry::builder(config.telemetry.clone())
        .service_name("fanout-gateway")
        // No target of the gateway's own: it opens no span and logs nothing
        // inside a request, so each operation's span is built as the
        // engine builds a read's (the book's Telemetry chapter).
        .build()
        .map_err(|e| e.to_string())?;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(log_filter()),
        )
        .with(telemetry.as_ref().map(|t| t.layer()))
        .init();
    Ok(telemetry)
}

#[cfg(not(feature = "otel"))]
fn install_subscriber(_config: &Config) -> Result<Option<()>, String> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(log_filter())
        .init();
    Ok(None)
}

fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let (config, upstream) = match load_config(args.config.as_deref(), args.upstream.as_deref()) {
        Ok(loaded) => loaded,
        Err(message) => {
            eprintln!("fanout-gateway: {message}");
            return ExitCode::from(2);
        }
    };
    // Kept to the end: dropped, it sends the spans still queued.
    let _telemetry = match install_subscriber(&config) {
        Ok(telemetry) => telemetry,
        Err(message) => {
            eprintln!("fanout-gateway: {message}");
            return ExitCode::FAILURE;
        }
    };
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder();
    let render: Option<app::MetricsRender> = match recorder {
        Ok(handle) => Some(std::sync::Arc::new(move || handle.render())),
        Err(e) => {
            eprintln!("fanout-gateway: metrics disabled: {e}");
            None
        }
    };
    // The default registry: `--upstream`, else the upstream marked
    // `primary = true`, else the embedded one.
    let default = upstream.or_else(|| fanout_gateway::registries::Registries::primary(&config));
    let (upstream, _embedded) = match default {
        Some(url) => (url, None),
        None => match EmbeddedRegistry::demo().await {
            Ok(registry) => (
                registry.url().parse().expect("a loopback URL parses"),
                Some(registry),
            ),
            Err(e) => {
                eprintln!("fanout-gateway: cannot start the embedded registry: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    // On a loopback address, answering to the loopback names only.
    let config = app::for_listener(config, args.listen);
    let gateway = app::build(config, upstream.clone(), render);
    let listener = match listen(args.listen) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("fanout-gateway: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let source = if _embedded.is_some() {
        "embedded registry"
    } else {
        "registry"
    };
    println!("fanout-gateway listening on http://{addr}/graphql ({source} at {upstream})");
    // On SIGTERM/SIGINT: stop accepting, let in-flight requests finish — but
    // no longer than a request may run (its deadline) plus a grace second.
    let drain = gateway.engine.config().budget.deadline() + std::time::Duration::from_secs(1);
    let stopping = std::sync::Arc::new(tokio::sync::Notify::new());
    let signal = {
        let stopping = stopping.clone();
        async move {
            shutdown().await;
            println!(
                "fanout-gateway stopping: refusing new connections, finishing in-flight requests"
            );
            stopping.notify_one();
        }
    };
    // At most http.max_connections connections (http.max_connections_per_client
    // from one client), each closed when its
    // headers take longer than http.header_read_timeout_ms (idle keep-alive
    // included) or when writing its answer stalls for http.write_timeout_ms;
    // the peer's address reaches the rate limiter.
    let config = gateway.engine.config().clone();
    let serve = fanout_budget::inbound::serve(listener, gateway.router, &config)
        .with_graceful_shutdown(signal);
    tokio::select! {
        served = serve => {
            if let Err(e) = served {
                eprintln!("fanout-gateway: {e}");
                return ExitCode::FAILURE;
            }
        }
        _ = async { stopping.notified().await; tokio::time::sleep(drain).await } => {
            eprintln!("fanout-gateway: requests still in flight after {drain:?}; stopping anyway");
        }
    }
    println!("fanout-gateway stopped");
    ExitCode::SUCCESS
}

/// The listener, with a backlog of 1,024 connections waiting for their
/// accept: `TcpListener::bind`'s 128 overflows under a flood of connections
/// past their client's share (each accepted and reset at once), and a fresh
/// client whose handshake finds the queue full waits a second for its SYN to
/// be sent again (`gateway/tests/connection_churn.rs`).
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As `TcpListener::bind`: a restart rebinds at once.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
