//! Label text: window lengths ("30s", "5m", "1h") both ways, for the API's `?window=` and
//! the `window` metric label, and input-length bucket names ("<=1k", ">64k").

use std::{fmt, time::Duration};

/// `Duration` → "30s", "5m", "1h", "1d" (the largest unit that divides it exactly);
/// sub-second lengths as "250ms".
pub fn format_window(d: Duration) -> String {
    if d.subsec_nanos() != 0 {
        return format!("{}ms", d.as_millis());
    }
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// Why a window label did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseWindowError {
    /// Not `<positive integer><unit>`.
    Syntax,
    /// A unit other than `ms`, `s`, `m`, `h`, `d`.
    Unit,
    /// Zero or too long to represent.
    Range,
}

impl fmt::Display for ParseWindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseWindowError::Syntax => "expected a positive integer and a unit, e.g. 5m",
            ParseWindowError::Unit => "unknown unit (use ms, s, m, h or d)",
            ParseWindowError::Range => "window must be longer than zero and at most 100 years",
        })
    }
}

impl std::error::Error for ParseWindowError {}

/// "5m" → 5 minutes. The inverse of [`format_window`] for every label it produces.
pub fn parse_window(s: &str) -> Result<Duration, ParseWindowError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or(ParseWindowError::Syntax)?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| ParseWindowError::Syntax)?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(ParseWindowError::Unit),
    };
    const MAX_MS: u64 = 100 * 365 * 86_400_000;
    match n.checked_mul(unit_ms) {
        Some(ms) if ms > 0 && ms <= MAX_MS => Ok(Duration::from_millis(ms)),
        _ => Err(ParseWindowError::Range),
    }
}

/// "1k" for 1024, "1M" for 1048576, else the number.
fn tokens(n: u64) -> String {
    const K: u64 = 1024;
    match n {
        0 => "0".into(),
        _ if n.is_multiple_of(K * K) => format!("{}M", n / (K * K)),
        _ if n.is_multiple_of(K) => format!("{}k", n / K),
        _ => n.to_string(),
    }
}

/// One label per input bucket: `<=b` for each bound, then `>last`; `all` without bounds.
pub fn bucket_labels(bounds: &[u64]) -> Vec<String> {
    let Some(last) = bounds.last() else {
        return vec!["all".into()];
    };
    let mut labels: Vec<String> = bounds.iter().map(|&b| format!("<={}", tokens(b))).collect();
    labels.push(format!(">{}", tokens(*last)));
    labels
}

/// The bucket of an input length: the first bound it does not exceed, else the last bucket.
pub fn bucket_of(bounds: &[u64], input_tokens: u64) -> usize {
    bounds
        .iter()
        .position(|&b| input_tokens <= b)
        .unwrap_or(bounds.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_format_and_parse_round_trip() {
        for (label, secs) in [
            ("30s", 30),
            ("1m", 60),
            ("5m", 300),
            ("1h", 3600),
            ("90s", 90),
        ] {
            assert_eq!(format_window(Duration::from_secs(secs)), label);
            assert_eq!(parse_window(label), Ok(Duration::from_secs(secs)));
        }
        assert_eq!(format_window(Duration::from_secs(86_400)), "1d");
        assert_eq!(format_window(Duration::from_millis(250)), "250ms");
        assert_eq!(parse_window("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_window(" 2h "), Ok(Duration::from_secs(7200)));
    }

    #[test]
    fn bad_windows_are_errors() {
        assert_eq!(parse_window(""), Err(ParseWindowError::Syntax));
        assert_eq!(parse_window("5"), Err(ParseWindowError::Syntax));
        assert_eq!(parse_window("m"), Err(ParseWindowError::Syntax));
        assert_eq!(parse_window("-5m"), Err(ParseWindowError::Syntax));
        assert_eq!(parse_window("5w"), Err(ParseWindowError::Unit));
        assert_eq!(parse_window("0s"), Err(ParseWindowError::Range));
        assert_eq!(
            parse_window("99999999999999999d"),
            Err(ParseWindowError::Range)
        );
        assert_eq!(
            parse_window("999999999999999999999m"),
            Err(ParseWindowError::Syntax)
        );
    }

    #[test]
    fn bucket_labels_and_lookup() {
        let b = [1024, 4096, 16384, 65536];
        assert_eq!(
            bucket_labels(&b),
            ["<=1k", "<=4k", "<=16k", "<=64k", ">64k"]
        );
        assert_eq!(bucket_labels(&[1000, 1 << 20]), ["<=1000", "<=1M", ">1M"]);
        assert_eq!(bucket_labels(&[]), ["all"]);
        assert_eq!(bucket_of(&b, 0), 0);
        assert_eq!(bucket_of(&b, 1024), 0);
        assert_eq!(bucket_of(&b, 1025), 1);
        assert_eq!(bucket_of(&b, u64::MAX), 4);
        assert_eq!(bucket_of(&[], 7), 0);
    }
}
