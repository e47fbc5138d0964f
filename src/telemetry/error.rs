//! Why telemetry could not start.

/// Why telemetry could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum TelemetryError {
    /// Built outside a tokio runtime: exports run on the runtime.
    NoRuntime,
    /// The exporter or its HTTP client could not be built.
    Exporter(String),
}

impl std::fmt::Display for TelemetryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoRuntime => f.write_str("telemetry must be built inside a tokio runtime"),
            Self::Exporter(why) => write!(f, "the OTLP exporter could not be built: {why}"),
        }
    }
}

impl std::error::Error for TelemetryError {}
