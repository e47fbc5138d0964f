//! `Fanout-Budget` and `Fanout-Spent`, read and written: RFC 9651
//! dictionaries of non-negative integers (`shared/CONTRACT.md` §14).
//!
//! Reading is lenient where the contract asks it to be: a member that is
//! not a non-negative integer is ignored and counted
//! (`fanout_budget_header_ignored_total{member}`), the others still apply;
//! a field that does not parse as a whole is read member by member (split
//! at its commas), so one bad member never drops the good ones. A repeated
//! key, on one line or over several, takes its last value (RFC 9651).
//! Unknown keys are ignored, uncounted: the dictionary may grow.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use sfv::{BareItem, Dictionary, ListEntry, Parser};

/// The request header a read to a `propagate` upstream carries.
pub(crate) const BUDGET: HeaderName = HeaderName::from_static("fanout-budget");

/// The response header a service answers a request that carried
/// [`BUDGET`] with: the reads it spent.
pub(crate) const SPENT: HeaderName = HeaderName::from_static("fanout-spent");

/// The largest integer RFC 9651 writes (15 digits): larger values are
/// written as this.
const MAX_INTEGER: u64 = 999_999_999_999_999;

/// The members of `Fanout-Budget` (or `Fanout-Spent`) the engine reads,
/// each `None` when absent or ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Members {
    pub(crate) reads: Option<u64>,
    pub(crate) deadline_ms: Option<u64>,
    pub(crate) hops: Option<u64>,
}

/// The members of every `name` field line of `headers`; `None` when the
/// header is absent.
pub(crate) fn read(headers: &HeaderMap, name: &HeaderName) -> Option<Members> {
    let mut lines = headers.get_all(name).iter().peekable();
    let first = lines.next()?;
    // What an engine writes, on one line: read without the full parser.
    if lines.peek().is_none() {
        if let Some(members) = canonical(first.as_bytes()) {
            return Some(members);
        }
    }
    let lines = std::iter::once(first).chain(lines);
    // Lines of one field are one field, joined by commas (RFC 9110 § 5.3).
    let mut joined = Vec::new();
    for (i, line) in lines.enumerate() {
        if i > 0 {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    let mut members = Members::default();
    // What an ignored member is counted as: its key, or `spent`.
    let spent = *name == SPENT;
    match Parser::new(&joined).parse::<Dictionary>() {
        Ok(dictionary) => take(&dictionary, &mut members, spent),
        // Read member by member: the well-formed ones still apply.
        Err(_) => {
            for piece in joined.split(|b| *b == b',') {
                match Parser::new(piece.trim_ascii()).parse::<Dictionary>() {
                    Ok(dictionary) => take(&dictionary, &mut members, spent),
                    Err(_) if spent => crate::metrics::budget_header_ignored("spent"),
                    Err(_) => crate::metrics::budget_header_ignored("unparsable"),
                }
            }
        }
    }
    Some(members)
}

/// The members of `field` when it is written as this engine writes it —
/// `key=digits` members of the engine's keys, each once, joined by `", "`,
/// at most 15 digits each — which RFC 9651 reads the same way; `None` for
/// anything else (the full parser reads it).
fn canonical(field: &[u8]) -> Option<Members> {
    let mut members = Members::default();
    for (i, member) in field.split(|b| *b == b',').enumerate() {
        let member = if i == 0 {
            member
        } else {
            member.strip_prefix(b" ")?
        };
        let eq = member.iter().position(|b| *b == b'=')?;
        let (key, digits) = (&member[..eq], &member[eq + 1..]);
        if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        let slot = match key {
            b"reads" => &mut members.reads,
            b"deadline-ms" => &mut members.deadline_ms,
            b"hops" => &mut members.hops,
            _ => return None,
        };
        if slot.replace(n).is_some() {
            return None;
        }
    }
    Some(members)
}

/// The engine's members of `dictionary` into `members` (a later value
/// over an earlier one); a member of the wrong kind counted (as `spent`
/// when `spent`, else by its key) and skipped.
fn take(dictionary: &Dictionary, members: &mut Members, spent: bool) {
    for (key, entry) in dictionary {
        let (slot, name) = match key.as_str() {
            "reads" => (&mut members.reads, "reads"),
            "deadline-ms" => (&mut members.deadline_ms, "deadline-ms"),
            "hops" => (&mut members.hops, "hops"),
            _ => continue,
        };
        match count(entry) {
            Some(n) => *slot = Some(n),
            None => crate::metrics::budget_header_ignored(if spent { "spent" } else { name }),
        }
    }
}

/// A member's value when it is a non-negative integer (its parameters, if
/// any, ignored).
fn count(entry: &ListEntry) -> Option<u64> {
    let ListEntry::Item(item) = entry else {
        return None;
    };
    let BareItem::Integer(n) = item.bare_item else {
        return None;
    };
    u64::try_from(i64::from(n)).ok()
}

/// `Fanout-Budget`'s value: `reads` (omitted when `None`: the upstream is
/// not limited by this request), `deadline-ms` and `hops`.
pub(crate) fn budget(reads: Option<u64>, deadline_ms: u64, hops: u64) -> HeaderValue {
    let (deadline_ms, hops) = (deadline_ms.min(MAX_INTEGER), hops.min(MAX_INTEGER));
    let text = match reads {
        Some(reads) => format!(
            "reads={}, deadline-ms={deadline_ms}, hops={hops}",
            reads.min(MAX_INTEGER)
        ),
        None => format!("deadline-ms={deadline_ms}, hops={hops}"),
    };
    HeaderValue::try_from(text).expect("digits, commas and letters are a header value")
}

/// `Fanout-Spent`'s value for `reads` spent.
pub(crate) fn spent(reads: u64) -> HeaderValue {
    HeaderValue::try_from(format!("reads={}", reads.min(MAX_INTEGER)))
        .expect("digits and letters are a header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(lines: &[&str]) -> Option<Members> {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(BUDGET, HeaderValue::from_str(line).unwrap());
        }
        read(&headers, &BUDGET)
    }

    #[test]
    fn the_three_members_are_read() {
        let got = members(&["reads=42, deadline-ms=2875, hops=1"]).unwrap();
        assert_eq!(
            got,
            Members {
                reads: Some(42),
                deadline_ms: Some(2875),
                hops: Some(1)
            }
        );
        assert_eq!(members(&[]), None);
    }

    #[test]
    fn a_bad_member_is_skipped_and_the_others_apply() {
        for bad in [
            "reads=-1, hops=2",
            "reads=1.5, hops=2",
            "reads=abc, hops=2",
            "reads=\"7\", hops=2",
            "reads=(1 2), hops=2",
            "reads, hops=2",
            "reads=@@, hops=2",
            "reads=1e3, hops=2",
        ] {
            let got = members(&[bad]).unwrap();
            assert_eq!(got.reads, None, "{bad}");
            assert_eq!(got.hops, Some(2), "{bad}");
        }
    }

    #[test]
    fn the_last_value_of_a_key_wins_across_lines() {
        let got = members(&["reads=9", "reads=3, hops=4"]).unwrap();
        assert_eq!((got.reads, got.hops), (Some(3), Some(4)));
        let got = members(&["reads=9, reads=5"]).unwrap();
        assert_eq!(got.reads, Some(5));
    }

    #[test]
    fn parameters_and_unknown_keys_are_ignored() {
        let got = members(&["reads=4;unit=x, colour=blue, deadline-ms=10"]).unwrap();
        assert_eq!((got.reads, got.deadline_ms), (Some(4), Some(10)));
    }

    #[test]
    fn the_fast_reading_agrees_with_the_full_parser() {
        let full = |field: &str| {
            let mut members = Members::default();
            let dictionary = Parser::new(field).parse::<Dictionary>().unwrap();
            take(&dictionary, &mut members, false);
            members
        };
        for field in [
            "reads=42, deadline-ms=2875, hops=1",
            "hops=3",
            "reads=007",
            "deadline-ms=999999999999999, reads=0",
        ] {
            assert_eq!(canonical(field.as_bytes()), Some(full(field)), "{field}");
        }
        // Anything else is left to the full parser.
        for field in [
            "reads=1,hops=2",
            "reads=1,  hops=2",
            "reads=-1",
            "reads=1;x",
            "reads=1, reads=2",
            "colour=1",
            "reads=1000000000000000",
            "reads=",
            "reads",
            "",
        ] {
            assert_eq!(canonical(field.as_bytes()), None, "{field}");
        }
    }

    #[test]
    fn what_is_written_reads_back() {
        let mut headers = HeaderMap::new();
        headers.insert(BUDGET, budget(Some(u64::MAX), 250, 3));
        let got = read(&headers, &BUDGET).unwrap();
        assert_eq!(got.reads, Some(MAX_INTEGER));
        assert_eq!((got.deadline_ms, got.hops), (Some(250), Some(3)));
        headers.insert(BUDGET, budget(None, 0, 1));
        assert_eq!(read(&headers, &BUDGET).unwrap().reads, None);
        headers.insert(SPENT, spent(17));
        assert_eq!(read(&headers, &SPENT).unwrap().reads, Some(17));
    }
}
