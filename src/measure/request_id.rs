//! The request id: an incoming `x-request-id` is kept (so goodput's records join the
//! client's and the gateway's logs); otherwise one is generated and sent upstream.

use http::{HeaderMap, HeaderName, HeaderValue};
use rand::Rng;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Ids longer than this are replaced: they end up in logs and the API.
const MAX_ID_LEN: usize = 200;

/// Returns the request's id, inserting a fresh one when absent or unusable.
pub fn ensure(headers: &mut HeaderMap) -> String {
    if let Some(v) = headers.get(&REQUEST_ID)
        && let Ok(s) = v.to_str()
        && !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes().all(|b| b.is_ascii_graphic())
    {
        return s.to_owned();
    }
    let id = generate();
    if let Ok(v) = HeaderValue::from_str(&id) {
        headers.insert(REQUEST_ID, v);
    }
    id
}

/// A random UUID (version 4 layout), without pulling in a crate for it.
fn generate() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_usable_incoming_id() {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(ensure(&mut h), "abc-123");
    }

    #[test]
    fn generates_and_inserts_when_missing_or_unusable() {
        let mut h = HeaderMap::new();
        let id = ensure(&mut h);
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_eq!(h.get(&REQUEST_ID).unwrap(), id.as_str());
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("has space"));
        assert_ne!(ensure(&mut h), "has space");
        assert_ne!(ensure(&mut HeaderMap::new()), id);
    }
}
