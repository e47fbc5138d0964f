//! A stand-in service on the engine, for chains of services
//! (`tests/chain.rs`, `tests/chain_attacks.rs`): a loopback HTTP server
//! that records each request's `Fanout-Budget` and answers with the
//! `Fanout-Spent` it is told to report. Also the Prometheus recorder those
//! tests read counters from (process-wide: each of them is its own binary).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use fanout_testkit::prometheus::value;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::Notify;

/// The process's Prometheus recorder, installed on first use.
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// A counter's value now (`0` when it was never written).
pub fn counted(name: &str, labels: &[&str]) -> f64 {
    let page = recorder().render();
    if labels.is_empty() {
        // A series without labels: `name value`.
        let line = page.lines().find(|l| l.starts_with(&format!("{name} ")));
        return line.map_or(0.0, |l| l.rsplit_once(' ').unwrap().1.parse().unwrap());
    }
    value(&page, name, labels).unwrap_or(0.0)
}

/// What the stand-in reports spent for one request.
#[derive(Clone, Debug)]
pub enum Report {
    /// No `Fanout-Spent`.
    Nothing,
    /// `reads=n`.
    Reads(u64),
    /// All it was granted.
    Granted,
    /// This exact header value.
    Raw(&'static str),
}

/// One request the stand-in saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Its `Fanout-Budget`, `None` without one.
    pub budget: Option<String>,
    /// Its body read as a number (`0` when it is not one).
    pub row: usize,
}

/// What the stand-in saw, and how it answers.
///
/// Paths: `/redirect` answers 302 to `elsewhere`, `/auth` 401 with a Basic
/// challenge, `/cached` an answer fresh for 600 s, any other `row N`.
#[derive(Default)]
pub struct Service {
    pub seen: Mutex<Vec<Seen>>,
    /// How row `i` is reported; `report` past the end.
    pub rows: Mutex<Vec<Report>>,
    /// How every other row is reported (`Granted` when unset).
    pub report: Mutex<Option<Report>>,
    /// Answers wait while set.
    pub held: AtomicBool,
    pub released: Notify,
    /// Answers never come.
    pub hang: AtomicBool,
    /// Where `/redirect` sends a request.
    pub elsewhere: Mutex<String>,
}

impl Service {
    /// Each request's `Fanout-Budget`, in the order they came.
    pub fn budgets(&self) -> Vec<Option<String>> {
        (self.seen.lock().unwrap().iter())
            .map(|s| s.budget.clone())
            .collect()
    }

    /// How many requests came.
    pub fn arrived(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Forgets what was seen; row `i` is reported `rows[i]` from now on.
    pub fn reset(&self, rows: Vec<Report>) {
        self.seen.lock().unwrap().clear();
        *self.rows.lock().unwrap() = rows;
    }

    /// Every row is reported `report` from now on.
    pub fn reports(&self, report: Report) {
        self.rows.lock().unwrap().clear();
        *self.report.lock().unwrap() = Some(report);
    }

    /// Lets held answers go.
    pub fn release(&self) {
        self.held.store(false, SeqCst);
        self.released.notify_waiters();
    }

    fn report_for(&self, row: usize) -> Report {
        let rows = self.rows.lock().unwrap();
        (rows.get(row).cloned())
            .or_else(|| self.report.lock().unwrap().clone())
            .unwrap_or(Report::Granted)
    }
}

/// A member of a `Fanout-Budget` value (as this engine writes it).
pub fn member(budget: &str, key: &str) -> Option<u64> {
    budget.split(", ").find_map(|m| {
        let (k, v) = m.split_once('=')?;
        (k == key).then(|| v.parse().unwrap())
    })
}

async fn answer(
    State(service): State<Arc<Service>>,
    method: http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let budget = headers
        .get("fanout-budget")
        .map(|v| v.to_str().unwrap().to_string());
    let path = uri.path().to_string();
    let row: usize = body.parse().unwrap_or(0);
    service.seen.lock().unwrap().push(Seen {
        method: method.to_string(),
        path: path.clone(),
        budget: budget.clone(),
        row,
    });
    if service.hang.load(SeqCst) {
        std::future::pending::<()>().await;
    }
    loop {
        let released = service.released.notified();
        if !service.held.load(SeqCst) {
            break;
        }
        released.await;
    }
    let granted = budget.as_deref().and_then(|b| member(b, "reads"));
    let spent = match service.report_for(row) {
        Report::Nothing => None,
        Report::Reads(n) => Some(n.to_string()),
        Report::Granted => granted.map(|g| g.to_string()),
        Report::Raw(raw) => {
            let mut answer = "raw".into_response();
            answer
                .headers_mut()
                .insert("fanout-spent", raw.parse().unwrap());
            return answer;
        }
    };
    let mut answer = match path.as_str() {
        "/redirect" => {
            let to = service.elsewhere.lock().unwrap().clone();
            (StatusCode::FOUND, [("location", to)]).into_response()
        }
        "/auth" => {
            let challenge = [("www-authenticate", "Basic realm=\"svc\"")];
            (StatusCode::UNAUTHORIZED, challenge, "no").into_response()
        }
        "/cached" => ([("cache-control", "public, max-age=600")], "cached").into_response(),
        _ => format!("row {row}").into_response(),
    };
    if let Some(spent) = spent {
        let value = format!("reads={spent}").parse().unwrap();
        answer.headers_mut().insert("fanout-spent", value);
    }
    answer
}

/// A stand-in service on a loopback port, stopped when dropped.
pub struct Running {
    pub service: Arc<Service>,
    /// `127.0.0.1:PORT`.
    pub host: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a stand-in service.
pub async fn stand_in() -> Running {
    let service = Arc::new(Service::default());
    let app = Router::new().fallback(answer).with_state(service.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Running {
        service,
        host,
        task,
    }
}
