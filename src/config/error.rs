//! [`ConfigError`]: what is wrong with a configuration and which key it is,
//! and how an error of the TOML parser finds its key.

use std::fmt;

/// A configuration that could not be used, naming the key.
///
/// Its text is `<key>: <what is wrong>` or `<key> must …`, followed by
/// ` (line N)` for an error found while reading TOML:
///
/// ```
/// use fanout_budget::Config;
///
/// let err = Config::from_toml("[hosts.\"registry:5000\"]\nmax_concurrent = -1\n").unwrap_err();
/// assert_eq!(err.key(), Some("hosts.\"registry:5000\".max_concurrent"));
/// assert_eq!((err.line(), err.column()), (Some(2), Some(18)));
/// assert!(err.to_string().starts_with("hosts.\"registry:5000\".max_concurrent: invalid value"), "{err}");
///
/// let err = Config::from_toml("[budget]\nmax_reads = 0\n").unwrap_err();
/// assert_eq!(err.key(), Some("budget.max_reads"));
/// assert_eq!(err.message(), "must be at least 1");
/// assert_eq!(err.to_string(), "budget.max_reads must be at least 1");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    key: Option<String>,
    message: String,
    /// The message is a rule the key breaks (`must be at least 1`), written
    /// after the key without a colon.
    rule: bool,
    line: Option<usize>,
    column: Option<usize>,
}

impl ConfigError {
    /// `key: message`.
    pub(crate) fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: Some(key.into()),
            message: message.into(),
            rule: false,
            line: None,
            column: None,
        }
    }

    /// `key must …`: `rule` is the rest of the sentence, `must …`.
    pub(crate) fn rule(key: impl Into<String>, rule: &str) -> Self {
        Self {
            rule: true,
            ..Self::new(key, rule)
        }
    }

    /// From a message that starts with its key, dotted, followed by `: ` or
    /// by ` ` and a rule (as the checks that return text write them).
    pub(crate) fn keyed(text: String) -> Self {
        let end = text.find([':', ' ']).unwrap_or(text.len());
        let (key, rest) = text.split_at(end);
        if let Some(message) = rest.strip_prefix(": ") {
            Self::new(key, message)
        } else if let Some(rule) = rest.strip_prefix(' ').filter(|_| !key.is_empty()) {
            Self::rule(key, rule)
        } else {
            Self {
                key: None,
                ..Self::new("", text)
            }
        }
    }

    /// The TOML parser's `err` on `text`: its line and column, and the key
    /// at that position (the key of that line, under the nearest `[table]`
    /// above it), when there is one.
    pub(crate) fn from_toml(text: &str, err: &toml::de::Error) -> Self {
        let message = err.message().trim_end().to_string();
        let Some(span) = err.span() else {
            return Self {
                key: None,
                ..Self::new("", message)
            };
        };
        let start = span.start.min(text.len());
        let before = &text[..start];
        let line_start = before.rfind('\n').map_or(0, |at| at + 1);
        let line_no = before.matches('\n').count() + 1;
        let column = before[line_start..].chars().count() + 1;
        let line = text[line_start..].lines().next().unwrap_or("").trim();
        let table = |header: &str| {
            let inner = header.trim_start_matches('[').trim_end_matches(']');
            dotted_key(inner).and_then(|(key, rest)| rest.trim().is_empty().then_some(key))
        };
        let key = if line.starts_with('[') {
            table(line)
        } else {
            let above = text[..line_start.saturating_sub(1)]
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| l.starts_with('['));
            let here = dotted_key(line)
                .and_then(|(key, rest)| rest.trim_start().starts_with('=').then_some(key));
            match (above.and_then(table), here) {
                (Some(t), Some(k)) => Some(format!("{t}.{k}")),
                (t, k) => k.or(t),
            }
        };
        Self {
            key,
            message,
            rule: false,
            line: Some(line_no),
            column: Some(column),
        }
    }

    /// The key, dotted as TOML writes it (`budget.max_reads`,
    /// `hosts."registry:5000".max_concurrent`), when one is known.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// What is wrong, without the key or the position
    /// (`must be at least 1`).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The line of the TOML text the error is on (from 1), when it was found
    /// while reading TOML.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The column (from 1, in characters) on [`line`](Self::line).
    pub fn column(&self) -> Option<usize> {
        self.column
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) if self.rule => write!(f, "{key} {}", self.message)?,
            Some(key) => write!(f, "{key}: {}", self.message)?,
            None => write!(f, "invalid configuration: {}", self.message)?,
        }
        match self.line {
            Some(line) => write!(f, " (line {line})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for ConfigError {}

/// `section.key must be at least 1` for the first of `values` that is 0.
pub(super) fn at_least_one<const N: usize>(
    section: &str,
    values: [(&str, u64); N],
) -> Result<(), ConfigError> {
    match values.into_iter().find(|(_, value)| *value == 0) {
        Some((key, _)) => Err(ConfigError::rule(
            format!("{section}.{key}"),
            "must be at least 1",
        )),
        None => Ok(()),
    }
}

/// One segment of a dotted key as TOML writes it: bare if it can be,
/// otherwise quoted (`registry.local`, `"registry:5000"`).
pub(crate) fn key_segment(segment: &str) -> String {
    let bare = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !segment.is_empty() && segment.chars().all(bare) {
        segment.to_string()
    } else {
        format!("{segment:?}")
    }
}

/// The dotted key `text` starts with, each segment written as
/// [`key_segment`] writes it, and what follows it; `None` if `text` does
/// not start with a key.
fn dotted_key(text: &str) -> Option<(String, &str)> {
    let mut segments = Vec::new();
    let mut rest = text.trim_start();
    loop {
        let (segment, after) = match rest.chars().next()? {
            quote @ ('"' | '\'') => {
                let end = rest[1..].find(quote)? + 1;
                (&rest[1..end], &rest[end + 1..])
            }
            _ => {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        if segment.is_empty() && !rest.starts_with(['"', '\'']) {
            return None;
        }
        segments.push(key_segment(segment));
        let after = after.trim_start();
        match after.strip_prefix('.') {
            Some(next) => rest = next.trim_start(),
            None => return Some((segments.join("."), after)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_are_read_as_toml_writes_them() {
        assert_eq!(
            dotted_key("max_reads = 3"),
            Some(("max_reads".into(), "= 3"))
        );
        assert_eq!(
            dotted_key("hosts . 'registry:5000'.max_concurrent=1"),
            Some(("hosts.\"registry:5000\".max_concurrent".into(), "=1"))
        );
        assert_eq!(dotted_key("\"a=b\" = 1"), Some(("\"a=b\"".into(), "= 1")));
        assert_eq!(dotted_key("= 3"), None);
        assert_eq!(dotted_key("\"open"), None);
        assert_eq!(key_segment("registry.local"), "\"registry.local\"");
    }

    #[test]
    fn a_keyed_message_is_split_at_its_key() {
        let rule = ConfigError::keyed("redis.timeout_ms must be less than x".into());
        assert_eq!(rule.key(), Some("redis.timeout_ms"));
        assert_eq!(rule.message(), "must be less than x");
        assert_eq!(rule.to_string(), "redis.timeout_ms must be less than x");
        let colon = ConfigError::keyed("redis.url: \"x\" must start with redis://".into());
        assert_eq!(colon.key(), Some("redis.url"));
        assert_eq!(colon.message(), "\"x\" must start with redis://");
        assert_eq!(
            colon.to_string(),
            "redis.url: \"x\" must start with redis://"
        );
        let empty = ConfigError::keyed(String::new());
        assert_eq!((empty.key(), empty.message()), (None, ""));
    }
}
