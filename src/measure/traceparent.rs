//! The W3C Trace Context `traceparent` request header, parsed on the request path into a
//! fixed-size value (no allocation) so a request's span can join the caller's trace. The
//! header itself is forwarded upstream unchanged.

/// A valid incoming `traceparent`: the caller's trace and its span (our span's parent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    /// The trace-flags byte (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a header value; `None` for anything the specification says to ignore
    /// (wrong length or characters, upper-case hex, version `ff`, all-zero ids, a version
    /// 00 value with trailing data).
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        // version "-" trace-id "-" parent-id "-" trace-flags
        if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        if version == 0xff {
            return None;
        }
        // Version 00 is exactly 55 bytes; a later version may append "-" and more fields.
        if (version == 0 && value.len() != 55) || (value.len() > 55 && value[55] != b'-') {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        let mut parent_id = [0u8; 8];
        for (i, b) in parent_id.iter_mut().enumerate() {
            *b = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Two lower-case hex digits (the specification does not allow upper case).
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_specification_example() {
        let t = TraceParent::parse(VALID.as_bytes()).unwrap();
        assert_eq!(
            t.trace_id,
            [
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36
            ]
        );
        assert_eq!(
            t.parent_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert!(t.sampled());
        let unsampled = VALID.replace("-01", "-00");
        assert!(!TraceParent::parse(unsampled.as_bytes()).unwrap().sampled());
    }

    #[test]
    fn a_later_version_may_carry_more_fields() {
        let v = format!("01{}-extra", &VALID[2..]);
        assert!(TraceParent::parse(v.as_bytes()).is_some());
        let glued = format!("01{}x", &VALID[2..]);
        assert!(TraceParent::parse(glued.as_bytes()).is_none());
    }

    #[test]
    fn rejects_what_the_specification_rejects() {
        let bad = [
            "",
            "00",
            &VALID[..54],
            &format!("{VALID}-"),
            &VALID.to_uppercase(),
            &VALID.replacen("00-", "ff-", 1),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1x",
        ];
        for b in bad {
            assert!(TraceParent::parse(b.as_bytes()).is_none(), "{b}");
        }
    }
}
