//! `[telemetry]`: OpenTelemetry export, its keys, their rules, and the
//! standard `OTEL_*` variables that override them.
//!
//! The section parses with or without the `otel` cargo feature, so one
//! configuration file serves both builds; without the feature nothing is
//! exported whatever it says.
//!
//! The three standard variables are resolved here, not by the OpenTelemetry
//! SDK: in the SDK the value given in code beats the environment, while the
//! contract has the environment override the file ([`resolve`](TelemetryConfig::resolve)).

use super::error::ConfigError;
use serde::Deserialize;

/// The variable that overrides `otlp_endpoint`.
pub(crate) const ENV_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The variable that overrides `service_name`.
pub(crate) const ENV_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// The variable that overrides `sample_ratio`.
pub(crate) const ENV_SAMPLE_RATIO: &str = "OTEL_TRACES_SAMPLER_ARG";
/// The variable that overrides `attribute_value_length_limit`.
pub(crate) const ENV_SPAN_VALUE_LIMIT: &str = "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT";
/// The variable that overrides `attribute_value_length_limit` when
/// [`ENV_SPAN_VALUE_LIMIT`] is not set (it covers every signal).
pub(crate) const ENV_VALUE_LIMIT: &str = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT";

section! {
    /// `[telemetry]`: traces exported over OTLP (HTTP/protobuf). Off by
    /// default.
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct TelemetryConfig {
        /// The collector's base URL, `http(s)://host[:port]` (e.g.
        /// `http://collector:4318`); `/v1/traces` is appended. Empty: off.
        pub otlp_endpoint: String = String::new() => into,
        /// The `service.name` of the exported spans; empty: the binary's
        /// name.
        pub service_name: String = String::new() => into,
        /// The share of traces kept, from 0.0 to 1.0.
        pub sample_ratio: f64 = 1.0,
        /// Whether an operation's span carries its document (the query
        /// text) as `graphql.document`. Off: a document may hold a user's
        /// data in its literals. Variables are never recorded.
        pub record_document: bool = false,
        /// The attribute value length limit, in bytes: every text a span
        /// carries (an attribute's value, an event's, the document) is cut
        /// to it, at a character boundary, before it is queued for export.
        /// At least 1.
        pub attribute_value_length_limit: usize = 1024,
    }
}

impl TelemetryConfig {
    /// The section with the standard variables applied from the process's
    /// environment (see [`resolve`](Self::resolve)).
    pub fn with_env(self) -> Result<Self, ConfigError> {
        self.resolve(|name| std::env::var(name).ok())
    }

    /// The section with the standard variables applied, read through `env`:
    /// a non-empty `OTEL_EXPORTER_OTLP_ENDPOINT` replaces `otlp_endpoint`
    /// (and so turns export on when the file leaves it off), a non-empty
    /// `OTEL_SERVICE_NAME` replaces `service_name`, a non-empty
    /// `OTEL_TRACES_SAMPLER_ARG` replaces `sample_ratio`, and
    /// `OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT` (else
    /// `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`) replaces
    /// `attribute_value_length_limit`. The result is checked as the file
    /// is; the error names the variable.
    pub fn resolve(mut self, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        if let Some(endpoint) = set(ENV_ENDPOINT) {
            self.otlp_endpoint = endpoint.trim().to_owned();
            check_endpoint(ENV_ENDPOINT, &self.otlp_endpoint)?;
        }
        if let Some(name) = set(ENV_SERVICE_NAME) {
            self.service_name = name.trim().to_owned();
        }
        if let Some(ratio) = set(ENV_SAMPLE_RATIO) {
            self.sample_ratio = ratio
                .trim()
                .parse()
                .map_err(|_| ConfigError::rule(ENV_SAMPLE_RATIO, RATIO_RULE))?;
            check_ratio(ENV_SAMPLE_RATIO, self.sample_ratio)?;
        }
        let limit = [ENV_SPAN_VALUE_LIMIT, ENV_VALUE_LIMIT]
            .into_iter()
            .find_map(|name| set(name).map(|value| (name, value)));
        if let Some((name, limit)) = limit {
            self.attribute_value_length_limit = limit
                .trim()
                .parse()
                .map_err(|_| ConfigError::rule(name, LIMIT_RULE))?;
            check_limit(name, self.attribute_value_length_limit)?;
        }
        Ok(self)
    }

    /// Whether spans are exported: an endpoint is set.
    pub fn is_enabled(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }

    /// The endpoint of one signal: the base URL, without a trailing `/`,
    /// then `path` (`/v1/traces`).
    pub fn signal_endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.otlp_endpoint.trim_end_matches('/'))
    }

    /// An endpoint that is empty or an `http(s)://` URL; a ratio in [0, 1];
    /// a length limit of at least 1.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        check_endpoint("telemetry.otlp_endpoint", &self.otlp_endpoint)?;
        check_ratio("telemetry.sample_ratio", self.sample_ratio)?;
        check_limit(
            "telemetry.attribute_value_length_limit",
            self.attribute_value_length_limit,
        )
    }
}

const RATIO_RULE: &str = "must be a number from 0.0 to 1.0";
const LIMIT_RULE: &str = "must be a whole number of bytes, at least 1";

fn check_limit(key: &str, limit: usize) -> Result<(), ConfigError> {
    if limit >= 1 {
        Ok(())
    } else {
        Err(ConfigError::rule(key, LIMIT_RULE))
    }
}

fn check_ratio(key: &str, ratio: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&ratio) {
        Ok(())
    } else {
        Err(ConfigError::rule(key, RATIO_RULE))
    }
}

fn check_endpoint(key: &str, endpoint: &str) -> Result<(), ConfigError> {
    if endpoint.is_empty() {
        return Ok(());
    }
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') && !rest.contains(['?', '#']) => {
            Ok(())
        }
        _ => Err(ConfigError::rule(
            key,
            "must be empty or an http(s)://host[:port] URL",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn defaults_are_off_with_every_trace_kept() {
        let config = TelemetryConfig::default();
        assert_eq!(config.otlp_endpoint, "");
        assert_eq!(config.service_name, "");
        assert_eq!(config.sample_ratio, 1.0);
        assert_eq!(config.attribute_value_length_limit, 1024);
        assert!(!config.is_enabled());
        assert!(config.check().is_ok());
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let file = TelemetryConfig::default()
            .otlp_endpoint("http://file:4318")
            .service_name("file")
            .sample_ratio(0.5);
        let resolved = file
            .clone()
            .resolve(env(&[
                (ENV_ENDPOINT, "http://env:4318/"),
                (ENV_SERVICE_NAME, "env"),
                (ENV_SAMPLE_RATIO, "0.1"),
            ]))
            .unwrap();
        assert_eq!(resolved.otlp_endpoint, "http://env:4318/");
        assert_eq!(
            resolved.signal_endpoint("/v1/traces"),
            "http://env:4318/v1/traces"
        );
        assert_eq!(resolved.service_name, "env");
        assert_eq!(resolved.sample_ratio, 0.1);
        // Unset or empty variables leave the file's values.
        let kept = file
            .clone()
            .resolve(env(&[(ENV_ENDPOINT, ""), (ENV_SERVICE_NAME, " ")]))
            .unwrap();
        assert_eq!(kept, file);
    }

    #[test]
    fn an_endpoint_in_the_environment_turns_export_on() {
        let resolved = TelemetryConfig::default()
            .resolve(env(&[(ENV_ENDPOINT, "http://127.0.0.1:4318")]))
            .unwrap();
        assert!(resolved.is_enabled());
    }

    #[test]
    fn the_span_limit_variable_beats_the_general_one() {
        let file = TelemetryConfig::default().attribute_value_length_limit(4096);
        let general = file
            .clone()
            .resolve(env(&[(ENV_VALUE_LIMIT, "2048")]))
            .unwrap();
        assert_eq!(general.attribute_value_length_limit, 2048);
        let both = file
            .clone()
            .resolve(env(&[
                (ENV_VALUE_LIMIT, "2048"),
                (ENV_SPAN_VALUE_LIMIT, "300"),
            ]))
            .unwrap();
        assert_eq!(both.attribute_value_length_limit, 300);
        assert_eq!(file.clone().resolve(env(&[])).unwrap(), file);
    }

    #[test]
    fn bad_values_name_their_key_or_variable() {
        for (config, key) in [
            (
                TelemetryConfig::default().sample_ratio(1.5),
                "telemetry.sample_ratio",
            ),
            (
                TelemetryConfig::default().sample_ratio(f64::NAN),
                "telemetry.sample_ratio",
            ),
            (
                TelemetryConfig::default().otlp_endpoint("collector:4318"),
                "telemetry.otlp_endpoint",
            ),
            (
                TelemetryConfig::default().otlp_endpoint("http://"),
                "telemetry.otlp_endpoint",
            ),
            (
                TelemetryConfig::default().attribute_value_length_limit(0),
                "telemetry.attribute_value_length_limit",
            ),
        ] {
            assert_eq!(config.check().unwrap_err().key(), Some(key), "{config:?}");
        }
        for (name, value) in [
            (ENV_SAMPLE_RATIO, "half"),
            (ENV_SAMPLE_RATIO, "-0.1"),
            (ENV_ENDPOINT, "ftp://collector"),
            (ENV_SPAN_VALUE_LIMIT, "0"),
            (ENV_VALUE_LIMIT, "-1"),
            (ENV_VALUE_LIMIT, "many"),
        ] {
            let error = TelemetryConfig::default()
                .resolve(env(&[(name, value)]))
                .unwrap_err();
            assert_eq!(error.key(), Some(name), "{value}");
        }
    }
}
