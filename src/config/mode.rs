//! `mode`: whether a limit refuses, or only counts what it would refuse.

use serde::Deserialize;

/// `mode` of a limit (`[budget]`, `[quota]`, `[rate_limit]`,
/// `[subscriptions]`): `"enforce"` refuses; `"measure"` refuses nothing and
/// counts what enforce would have refused (`fanout_would_refuse_total`), so
/// a limit can be rehearsed on live traffic before it bites. The limit's
/// own accounting is the same in both modes.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum LimitMode {
    /// Refuse past the limit.
    #[default]
    Enforce,
    /// Refuse nothing; count what would have been refused.
    Measure,
}

impl LimitMode {
    /// Whether the limit only measures.
    pub fn measures(self) -> bool {
        self == Self::Measure
    }
}
