//! A reader of the Prometheus text exposition format (version 0.0.4, and the OpenMetrics
//! text engines may serve instead), one line at a time and without allocation beyond
//! unescaped label values. Only what calibration needs: sample lines with a name, labels
//! and a value; timestamps and OpenMetrics exemplars are accepted and ignored.

/// One sample line.
#[derive(Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, String)>,
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a line is not a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("no metric name")]
    Name,
    #[error("malformed label set")]
    Labels,
    #[error("missing or malformed value")]
    Value,
}

/// Parses one line: `Ok(None)` for blank lines and comments (`# HELP`, `# TYPE`, `# EOF`).
pub fn parse_line(line: &str) -> Result<Option<Sample<'_>>, LineError> {
    let line = line.trim_end_matches('\r');
    let trimmed = line.trim_start();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(None);
    }
    let name_len = name_len(trimmed, true);
    if name_len == 0 {
        return Err(LineError::Name);
    }
    let (name, mut rest) = trimmed.split_at(name_len);
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    // The value must be separated from the name or label set.
    if !rest.starts_with([' ', '\t']) {
        return Err(LineError::Value);
    }
    let raw = rest.split_whitespace().next().ok_or(LineError::Value)?;
    let value = parse_value(raw).ok_or(LineError::Value)?;
    Ok(Some(Sample {
        name,
        labels,
        value,
    }))
}

/// Length of the metric (`colon`) or label name `s` starts with; 0 if none.
fn name_len(s: &str, colon: bool) -> usize {
    s.char_indices()
        .find(|&(i, c)| !is_name_char(c, i == 0, colon))
        .map_or(s.len(), |(i, _)| i)
}

fn is_name_char(c: char, first: bool, colon: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
}

/// Reads `name="value", ...}` and returns what follows the closing brace.
fn parse_labels<'a>(
    mut s: &'a str,
    labels: &mut Vec<(&'a str, String)>,
) -> Result<&'a str, LineError> {
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok(rest);
        }
        let len = name_len(s, false);
        if len == 0 {
            return Err(LineError::Labels);
        }
        let (name, rest) = s.split_at(len);
        let rest = rest
            .trim_start()
            .strip_prefix('=')
            .ok_or(LineError::Labels)?;
        let rest = rest
            .trim_start()
            .strip_prefix('"')
            .ok_or(LineError::Labels)?;
        let (value, rest) = quoted(rest)?;
        labels.push((name, value));
        let rest = rest.trim_start();
        s = match rest.strip_prefix(',') {
            Some(r) => r,
            None if rest.starts_with('}') => rest,
            None => return Err(LineError::Labels),
        };
    }
}

/// Reads a label value up to its closing quote, undoing `\\`, `\"` and `\n`.
fn quoted(s: &str) -> Result<(String, &str), LineError> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, c @ ('\\' | '"'))) => out.push(c),
                Some((_, c)) => {
                    out.push('\\');
                    out.push(c);
                }
                None => return Err(LineError::Labels),
            },
            c => out.push(c),
        }
    }
    Err(LineError::Labels)
}

/// Go-style floats as Prometheus writes them: `1.5`, `1e-3`, `+Inf`, `-Inf`, `NaN`.
fn parse_value(raw: &str) -> Option<f64> {
    match raw {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if raw.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '.')) => {
            raw.parse().ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_with_and_without_labels() {
        let s = parse_line("vllm:e2e_request_latency_seconds_count 12.0")
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.name, s.value, s.labels.len()),
            ("vllm:e2e_request_latency_seconds_count", 12.0, 0)
        );
        let s = parse_line(
            r#"vllm:time_to_first_token_seconds_sum{model_name="m/x",engine="0"} 2.5e-1 1700000000000"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.value, 0.25);
        assert_eq!(s.label("model_name"), Some("m/x"));
        assert_eq!(s.label("engine"), Some("0"));
        assert_eq!(s.label("nope"), None);
    }

    #[test]
    fn unescapes_label_values_and_allows_trailing_commas() {
        let s = parse_line(r#"a_sum{ l = "q\"b\\s\nx" , k="}",} 1"#)
            .unwrap()
            .unwrap();
        assert_eq!(s.label("l"), Some("q\"b\\s\nx"));
        assert_eq!(s.label("k"), Some("}"));
    }

    #[test]
    fn special_values_and_exemplars() {
        let v = |l: &str| parse_line(l).unwrap().unwrap().value;
        assert_eq!(v("a +Inf"), f64::INFINITY);
        assert_eq!(v("a -Inf"), f64::NEG_INFINITY);
        assert!(v("a NaN").is_nan());
        assert_eq!(v(r#"a_bucket{le="0.5"} 3 # {trace_id="x"} 0.4 1.0"#), 3.0);
        assert_eq!(v("a\t7\r"), 7.0);
    }

    #[test]
    fn comments_and_blank_lines_are_not_samples() {
        for l in ["", "   ", "# HELP a b", "# TYPE a histogram", "# EOF", "#"] {
            assert_eq!(parse_line(l), Ok(None), "{l:?}");
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        for (l, e) in [
            ("<html>", LineError::Name),
            ("{a=\"b\"} 1", LineError::Name),
            ("a{b=c} 1", LineError::Labels),
            ("a{b=\"c} 1", LineError::Labels),
            ("a{b=\"c\" d=\"e\"} 1", LineError::Labels),
            ("a{=\"c\"} 1", LineError::Labels),
            ("a{b=\"\\", LineError::Labels),
            ("a", LineError::Value),
            ("a{}", LineError::Value),
            ("a{}1", LineError::Value),
            ("a one", LineError::Value),
            ("a 1.2.3", LineError::Value),
            ("a infinity", LineError::Value),
        ] {
            assert_eq!(parse_line(l), Err(e), "{l:?}");
        }
    }

    #[test]
    fn any_input_is_safe() {
        let text = "a{b=\"\u{e9}\\\u{1f600}\"} 1\n\u{1f600}{} 2\n\\\"{{}}\n";
        for line in text.lines() {
            let _ = parse_line(line);
        }
        for cut in 0..text.len() {
            if text.is_char_boundary(cut) {
                let _ = parse_line(&text[..cut]);
            }
        }
    }
}
