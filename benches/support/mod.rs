//! What the criterion benches share: a short configuration, and a summary
//! that reads back the medians criterion measured in this run and prints
//! them with their ratios.
#![allow(dead_code)]

use criterion::Criterion;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Where criterion writes its estimates: `<target>/criterion`.
pub fn output_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir).join("criterion");
    }
    // The bench binary is `<target>/<profile>/deps/<name>-<hash>`.
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("criterion")))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

/// Short runs: the whole `cargo bench` must fit in a few minutes on 2 cores.
pub fn criterion() -> Criterion {
    Criterion::default()
        .output_directory(&output_dir())
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .without_plots()
        .configure_from_args()
}

/// The median (ns per iteration) criterion measured for `group/id` in this
/// run; `None` when that bench did not run in this process (filtered out).
pub fn median_ns(group: &str, id: &str, started: SystemTime) -> Option<f64> {
    let path = output_dir()
        .join(group)
        .join(id)
        .join("new")
        .join("estimates.json");
    let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
    if modified < started {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["median"]["point_estimate"].as_f64()
}

/// A duration in ns, µs or ms, whichever reads best.
pub fn human(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.1} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

/// The medians of one run, for the summary.
pub struct Medians {
    started: SystemTime,
}

impl Medians {
    /// Medians written after `started` (the start of this process).
    pub fn since(started: SystemTime) -> Self {
        Self { started }
    }

    /// The median of `group/id`.
    pub fn get(&self, group: &str, id: &str) -> Option<f64> {
        median_ns(group, id, self.started)
    }
}

/// `a / b` as `1.23×`, or `n/a`.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "n/a".into(),
    }
}

/// A median as text, or `not run`.
pub fn show(ns: Option<f64>) -> String {
    ns.map_or_else(|| "not run".into(), human)
}

/// `met` / `MISSED` / `n/a`.
pub fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "n/a",
    }
}

pub use fanout_testkit::{paired, Paired};

/// Whether criterion was asked only to list or test the benches (then the
/// paired passes are skipped too), or to run a filtered subset.
pub fn quick_mode() -> bool {
    std::env::args().any(|a| a == "--list" || a == "--test" || a == "--profile-time")
}
