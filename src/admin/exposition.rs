//! The two expositions of `/metrics` and how a scraper picks one: OpenMetrics text (the
//! default, and all a scraper gets unless it asks otherwise) or the Prometheus protobuf
//! exposition (`io.prometheus.client.MetricFamily`, length-delimited), the only one that
//! carries the latency histograms' native buckets. Prometheus asks for protobuf in its
//! `Accept` header when native histograms are on (`--enable-feature=native-histograms`, or
//! `scrape_protocols` starting with `PrometheusProto`).

use prometheus_client::{encoding::prometheus_protobuf, registry::Registry};
use prost::Message;

/// The media type of the protobuf exposition, as served.
pub const PROTOBUF: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// The media type of the text exposition, as served.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which exposition a scrape gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Protobuf,
}

/// The format `accept` prefers: protobuf when its delimited `MetricFamily` form is listed
/// with a weight at least that of every other entry, text otherwise (no header, `*/*`,
/// `text/plain`, OpenMetrics, or protobuf with `q=0`).
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Text;
    };
    let (mut protobuf, mut other) = (0.0_f64, 0.0_f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let (mut q, mut proto, mut delimited) = (1.0_f64, false, false);
        for param in parts {
            let Some((k, v)) = param.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"');
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = v.parse().unwrap_or(0.0),
                "proto" => proto = v == "io.prometheus.client.MetricFamily",
                "encoding" => delimited = v == "delimited",
                _ => {}
            }
        }
        if media == "application/vnd.google.protobuf" {
            if proto && delimited {
                protobuf = protobuf.max(q);
            }
        } else if !media.is_empty() {
            other = other.max(q);
        }
    }
    if protobuf > 0.0 && protobuf >= other {
        Format::Protobuf
    } else {
        Format::Text
    }
}

/// Failures of an exposition (answered with a 500; the next scrape tries again).
#[derive(Debug, thiserror::Error)]
pub enum ExpositionError {
    #[error("encoding the registry failed")]
    Encode(#[from] std::fmt::Error),
    #[error("framing a metric family failed")]
    Frame(#[from] prost::EncodeError),
}

/// `registry` in the length-delimited protobuf exposition. Families with no series are
/// left out (the text exposition keeps their `# HELP` lines; a protobuf family without a
/// metric says nothing).
pub fn protobuf(registry: &Registry) -> Result<Vec<u8>, ExpositionError> {
    let families = prometheus_protobuf::encode(registry)?;
    let mut out = Vec::with_capacity(16 * 1024);
    for family in families.iter().filter(|f| !f.metric.is_empty()) {
        family.encode_length_delimited(&mut out)?;
    }
    Ok(out)
}

/// `registry` in the OpenMetrics text exposition.
pub fn text(registry: &Registry) -> Result<String, ExpositionError> {
    let mut out = String::with_capacity(16 * 1024);
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Prometheus sends with native histograms on (protobuf first), and without.
    const PROMETHEUS_PROTOBUF_FIRST: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    const PROMETHEUS_TEXT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(None), Format::Text);
        assert_eq!(negotiate(Some("*/*")), Format::Text);
        assert_eq!(negotiate(Some(PROMETHEUS_TEXT)), Format::Text);
        assert_eq!(negotiate(Some(PROMETHEUS_PROTOBUF_FIRST)), Format::Protobuf);
        assert_eq!(
            negotiate(Some(
                "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
            )),
            Format::Protobuf
        );
        // Not the delimited MetricFamily form, or refused, or outweighed.
        assert_eq!(
            negotiate(Some(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"
            )),
            Format::Text
        );
        assert_eq!(
            negotiate(Some(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0"
            )),
            Format::Text
        );
        assert_eq!(
            negotiate(Some(
                "text/plain;q=0.9,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5"
            )),
            Format::Text
        );
    }
}
