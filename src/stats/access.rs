//! The access log's line: one per request, the record's numbers and no content.
//!
//! In the text format without colour (the usual log file or journal) the line is written
//! here, byte for byte what `tracing`'s text formatter writes for the same event, straight
//! into the access log's buffer: formatting the event's two dozen fields through
//! `tracing`'s visitor and `core::fmt` was the largest piece of goodput's own CPU per
//! request (5% of it in the `requests` load scenario). JSON, colour, or a filter that
//! leaves the access target out go through `tracing` as before.

use std::{
    io::Write as _,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::{measure::RequestRecord, telemetry};

/// Logs `r`'s access line.
pub(super) fn log(r: &RequestRecord) {
    if telemetry::access_lines_direct() {
        telemetry::write_access_line(|out| text_line(out, r, SystemTime::now()));
    } else {
        event(r);
    }
}

/// The access line as a `tracing` event (JSON, colour, other subscribers).
fn event(r: &RequestRecord) {
    tracing::info!(
        target: telemetry::ACCESS_TARGET,
        id = %r.id,
        target = r.pairing.target.as_str(),
        pair_id = r.pairing.pair_id.as_deref(),
        shadow_cut = r.pairing.cut.map(|c| c.as_str()),
        model = r.model.as_deref().unwrap_or("-"),
        api = r.api,
        stream = r.stream,
        status = r.status.unwrap_or(0),
        outcome = r.outcome.as_str(),
        slo_class = %r.slo_class,
        slo_met = r.slo_met,
        slo_miss = r.slo_miss_reason,
        finish_reason = r.finish_reason.map(|f| f.as_str()),
        ttft_ms = r.ttft_ms.map(round2),
        ttfo_ms = r.ttfo_ms.map(round2),
        tpot_ms = r.tpot_ms.map(round2),
        e2e_ms = round2(r.e2e_ms),
        upload_ms = r.upload_ms.map(round2),
        input_tokens = r.input_tokens,
        output_tokens = r.output_tokens,
        output_tokens_source = r.output_tokens_source.map(|s| s.as_str()),
        events = r.events,
        bytes_in = r.bytes_in,
        bytes_out = r.bytes_out,
        "request"
    );
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Appends the line [`event`] makes `tracing`'s text formatter write (no colour, no span):
/// the time, the level, the target, the message, then each field present as `name=value`
/// (strings quoted and escaped as `Debug` does, `%` fields as they are, a `None` left out).
fn text_line(out: &mut Vec<u8>, r: &RequestRecord, now: SystemTime) {
    timestamp(out, now);
    out.extend_from_slice(b"  INFO ");
    out.extend_from_slice(telemetry::ACCESS_TARGET.as_bytes());
    out.extend_from_slice(b": request");
    key(out, "id");
    out.extend_from_slice(r.id.as_bytes());
    text(out, "target", Some(r.pairing.target.as_str()));
    text(out, "pair_id", r.pairing.pair_id.as_deref());
    text(out, "shadow_cut", r.pairing.cut.map(|c| c.as_str()));
    text(out, "model", Some(r.model.as_deref().unwrap_or("-")));
    text(out, "api", Some(r.api));
    flag(out, "stream", Some(r.stream));
    number(out, "status", Some(u64::from(r.status.unwrap_or(0))));
    text(out, "outcome", Some(r.outcome.as_str()));
    key(out, "slo_class");
    out.extend_from_slice(r.slo_class.as_bytes());
    flag(out, "slo_met", r.slo_met);
    text(out, "slo_miss", r.slo_miss_reason);
    text(out, "finish_reason", r.finish_reason.map(|f| f.as_str()));
    float(out, "ttft_ms", r.ttft_ms.map(round2));
    float(out, "ttfo_ms", r.ttfo_ms.map(round2));
    float(out, "tpot_ms", r.tpot_ms.map(round2));
    float(out, "e2e_ms", Some(round2(r.e2e_ms)));
    float(out, "upload_ms", r.upload_ms.map(round2));
    number(out, "input_tokens", r.input_tokens);
    number(out, "output_tokens", r.output_tokens);
    text(
        out,
        "output_tokens_source",
        r.output_tokens_source.map(|s| s.as_str()),
    );
    number(out, "events", Some(r.events));
    number(out, "bytes_in", Some(r.bytes_in));
    number(out, "bytes_out", Some(r.bytes_out));
    out.push(b'\n');
}

fn key(out: &mut Vec<u8>, name: &str) {
    out.push(b' ');
    out.extend_from_slice(name.as_bytes());
    out.push(b'=');
}

/// A string field, quoted as `Debug` quotes it.
fn text(out: &mut Vec<u8>, name: &str, value: Option<&str>) {
    let Some(value) = value else { return };
    key(out, name);
    let plain = value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    if plain {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        // Writing into a Vec cannot fail.
        let _ = write!(out, "{value:?}");
    }
}

fn flag(out: &mut Vec<u8>, name: &str, value: Option<bool>) {
    let Some(value) = value else { return };
    key(out, name);
    out.extend_from_slice(if value { b"true" } else { b"false" });
}

fn number(out: &mut Vec<u8>, name: &str, value: Option<u64>) {
    let Some(value) = value else { return };
    key(out, name);
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// A float as `Debug` writes it: the shortest digits that read back to it, `.0` on a
/// whole number. Between 10⁻³ and 10¹⁵ that is Ryū's output when it has at most 15
/// significant digits (the shortest such digits are then the only ones: two candidates
/// would be further apart than a double's spacing); with more, the two may break a tie
/// differently. Those, and anything else (zero, negative, huge, not finite), go through
/// `Debug` itself. The access log's numbers (milliseconds to two places) are the first
/// kind.
fn float(out: &mut Vec<u8>, name: &str, value: Option<f64>) {
    let Some(value) = value else { return };
    key(out, name);
    if value.is_finite() && (1e-3..1e15).contains(&value) {
        let mut buffer = ryu::Buffer::new();
        let written = buffer.format_finite(value);
        let significant = written
            .bytes()
            .filter(u8::is_ascii_digit)
            .skip_while(|&d| d == b'0')
            .count();
        if significant <= 15 {
            out.extend_from_slice(written.as_bytes());
            return;
        }
    }
    let _ = write!(out, "{value:?}");
}

/// `now` as `tracing`'s `SystemTime` timer writes it: RFC 3339 in UTC with microseconds.
fn timestamp(out: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_date(secs / 86_400);
    let of_day = secs % 86_400;
    if year > 9999 {
        let _ = write!(out, "+{year}");
    } else {
        digits(out, year, 4);
    }
    out.push(b'-');
    digits(out, month, 2);
    out.push(b'-');
    digits(out, day, 2);
    out.push(b'T');
    digits(out, of_day / 3600, 2);
    out.push(b':');
    digits(out, of_day / 60 % 60, 2);
    out.push(b':');
    digits(out, of_day % 60, 2);
    out.push(b'.');
    digits(out, u64::from(since.subsec_micros()), 6);
    out.push(b'Z');
}

/// `value`'s last `width` decimal digits, zero-padded.
fn digits(out: &mut Vec<u8>, value: u64, width: u32) {
    let mut scale = 10u64.pow(width - 1);
    while scale > 0 {
        out.push(b'0' + u8::try_from(value / scale % 10).unwrap_or(0));
        scale /= 10;
    }
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use proptest::prelude::*;

    use super::*;
    use crate::{
        decode::FinishReason,
        measure::{Outcome, ShadowCut, record::example},
    };

    /// What `tracing`'s text formatter, without colour, writes for `r`'s event.
    fn formatted_by_tracing(r: &RequestRecord) -> String {
        #[derive(Clone, Default)]
        struct Shared(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Shared {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let shared = Shared::default();
        let writer = shared.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || event(r));
        let bytes = shared.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn written_here(r: &RequestRecord) -> String {
        let mut out = Vec::new();
        text_line(&mut out, r, SystemTime::now());
        String::from_utf8(out).unwrap()
    }

    /// Both lines, the time (27 bytes) apart, must be the same.
    fn assert_same_line(r: &RequestRecord) {
        let theirs = formatted_by_tracing(r);
        let ours = written_here(r);
        assert_eq!(theirs.len(), ours.len(), "{theirs}{ours}");
        assert_eq!(theirs[27..], ours[27..]);
        assert_eq!(theirs.as_bytes()[10], b'T');
        assert_eq!(ours.as_bytes()[26], b'Z');
    }

    #[test]
    fn the_line_is_the_one_tracing_writes() {
        assert_same_line(&example::record());
        let mut r = example::record();
        r.model = None;
        r.status = None;
        r.slo_met = Some(false);
        r.slo_miss_reason = Some("ttft");
        r.finish_reason = Some(FinishReason::Length);
        r.outcome = Outcome::UpstreamReset;
        r.ttft_ms = None;
        r.tpot_ms = Some(0.004);
        r.e2e_ms = 0.0;
        r.upload_ms = None;
        r.input_tokens = None;
        r.output_tokens_source = None;
        r.pairing.pair_id = Some("pair-1".into());
        r.stream = false;
        assert_same_line(&r);
        r.pairing.cut = Some(ShadowCut::TooLarge);
        assert_same_line(&r);
        assert!(written_here(&r).contains(" shadow_cut=\"too_large\" "));
    }

    #[test]
    fn strings_are_escaped_as_tracing_escapes_them() {
        let mut r = example::record();
        for model in [
            "a \"quoted\" model",
            "back\\slash",
            "tab\there",
            "new\nline",
            "bell\u{7}",
            "ünïcödé 模型",
            "zero\u{200b}width",
            "combining\u{301}",
            "",
        ] {
            r.model = Some(model.into());
            r.id = format!("id-{model}");
            r.slo_class = format!("class {model}").into();
            assert_same_line(&r);
        }
    }

    #[test]
    fn the_time_is_rfc_3339_with_microseconds() {
        let at = |secs: u64, micros: u64| {
            let mut out = Vec::new();
            timestamp(
                &mut out,
                UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros),
            );
            String::from_utf8(out).unwrap()
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 1), "2000-02-29T00:00:00.000001Z");
        assert_eq!(at(1_796_605_539, 939_568), "2026-12-07T01:05:39.939568Z");
        assert_eq!(at(4_107_542_399, 999_999), "2100-02-28T23:59:59.999999Z");
        assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000000Z");
    }

    proptest! {
        #[test]
        fn the_time_agrees_with_humantime(secs in 0u64..253_402_300_800, micros in 0u64..1_000_000) {
            let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros);
            let mut out = Vec::new();
            timestamp(&mut out, t);
            prop_assert_eq!(
                String::from_utf8(out).unwrap(),
                humantime::format_rfc3339_micros(t).to_string()
            );
        }

        #[test]
        fn floats_are_written_as_debug_writes_them(v in prop_oneof![
            0.0f64..1e15,
            1e-3f64..10.0,
            (0u64..100_000_000_000).prop_map(|c| round2(c as f64 / 100.0)),
            (0u64..1_000_000_000).prop_map(|c| c as f64 / 1000.0),
            any::<f64>(),
        ]) {
            let mut out = Vec::new();
            float(&mut out, "x", Some(v));
            prop_assert_eq!(String::from_utf8(out).unwrap(), format!(" x={v:?}"));
        }

        #[test]
        fn any_record_gives_the_same_line(
            ttft in proptest::option::of(0.0f64..1e7),
            e2e in 0.0f64..1e8,
            tokens in proptest::option::of(any::<u64>()),
            bytes in any::<u64>(),
            status in proptest::option::of(any::<u16>()),
            model in proptest::option::of(".{0,12}"),
            met in proptest::option::of(any::<bool>()),
            stream in any::<bool>(),
            cut in any::<bool>(),
        ) {
            let mut r = example::record();
            r.ttft_ms = ttft;
            r.e2e_ms = e2e;
            r.output_tokens = tokens;
            r.bytes_out = bytes;
            r.status = status;
            r.model = model;
            r.slo_met = met;
            r.stream = stream;
            r.pairing.cut = cut.then_some(ShadowCut::TooLarge);
            assert_same_line(&r);
        }
    }
}
