//! Borrowed-JSON building blocks shared by the dialect decoders.
//!
//! Every streamed event is classified on the data path, so the dialects read JSON without
//! building a `serde_json::Value`, without collecting arrays and without copying strings:
//! fields whose only question is "empty or not" stay borrowed raw JSON text ([`non_empty`]),
//! string tags are matched while borrowed ([`Tag`]), arrays are folded element by element
//! while parsed ([`Folded`]), and everything else is skipped with `IgnoredAny` by serde's
//! derive. Both leniency helpers live here too, [`lenient_object`] for nested usage objects
//! and [`Lenient`] for request fields: an odd value loses only itself, never the event.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::decode::{EventInfo, FinishReason};

/// Parses a JSON object; serde's derive would also accept an array as a struct, and no
/// dialect's event or body is an array.
pub(crate) fn parse_object<'a, T: Deserialize<'a>>(json: &'a [u8]) -> Result<T, serde_json::Error> {
    if !json.trim_ascii_start().starts_with(b"{") {
        return Err(de::Error::invalid_type(
            de::Unexpected::Other("non-object JSON"),
            &"a JSON object",
        ));
    }
    serde_json::from_slice(json)
}

/// How an event's payload opens, before its dialect reads it.
pub(crate) enum Opening<T> {
    /// Already classified: blank data (a keep-alive), the `[DONE]` marker, or the
    /// upstream's failure report.
    Classified(EventInfo),
    /// The dialect's event object, to be read on.
    Object(T),
}

/// The preamble every SSE event classifier shares: blank data (a keep-alive some servers
/// send) is an empty event; where `done_marker` is tolerated, `[DONE]` ends the stream; a
/// payload that does not parse as the dialect's object is the upstream's failure report in
/// an SSE `error` event and a decode error anywhere else.
pub(crate) fn open_event<'a, T: Deserialize<'a>>(
    event: &str,
    data: &'a [u8],
    done_marker: bool,
) -> Result<Opening<T>, serde_json::Error> {
    let data = data.trim_ascii();
    if data.is_empty() {
        return Ok(Opening::Classified(EventInfo::default()));
    }
    if done_marker && data == b"[DONE]" {
        return Ok(Opening::Classified(EventInfo {
            terminal: true,
            ..EventInfo::default()
        }));
    }
    match parse_object(data) {
        Ok(wire) => Ok(Opening::Object(wire)),
        Err(_) if event == "error" => Ok(Opening::Classified(EventInfo::failure())),
        Err(e) => Err(e),
    }
}

/// The error a dialect gives for a well-formed JSON object that is not one of its events:
/// the stream was routed to the wrong decoder, which must show as `decode: unknown` rather
/// than as a stream without a terminal event.
pub(crate) fn foreign(dialect: &str) -> serde_json::Error {
    de::Error::custom(format_args!("not a {dialect} event"))
}

/// Parses a small nested object captured raw (usage counts); `None` when it is null, not an
/// object, or has a field of the wrong type, so an odd value never fails the whole event.
pub(crate) fn lenient_object<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    let text = raw?.get();
    if !text.starts_with('{') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// Judges emptiness on the raw JSON text, so escapes (`"\n"`, `"\u00e9"`) are non-empty
/// without being decoded. JSON `null` already arrives as `None`.
pub(crate) fn non_empty(raw: Option<&RawValue>) -> bool {
    non_empty_raw(raw.map(RawValue::get))
}

/// [`non_empty`] on raw JSON text, however it was captured.
pub(crate) fn non_empty_raw(raw: Option<&str>) -> bool {
    let Some(raw) = raw else {
        return false;
    };
    let text = raw.trim();
    if text == r#""""# || text == "null" {
        return false;
    }
    match text.as_bytes() {
        [b'[' | b'{', inner @ .., _] => !inner.trim_ascii().is_empty(),
        _ => true,
    }
}

/// A value read from a JSON string without allocating, even when the string has escapes.
pub(crate) trait FromTag: Sized {
    fn from_tag(tag: &str) -> Self;
}

impl FromTag for FinishReason {
    fn from_tag(tag: &str) -> Self {
        FinishReason::from_wire(tag)
    }
}

/// A JSON string mapped to `K` while borrowed (event types, finish reasons).
pub(crate) struct Tag<K>(pub K);

impl<'de, K: FromTag> Deserialize<'de> for Tag<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<K>(PhantomData<K>);
        impl<K: FromTag> Visitor<'_> for V<K> {
            type Value = Tag<K>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Tag<K>, E> {
                Ok(Tag(K::from_tag(s)))
            }
        }
        deserializer.deserialize_str(V(PhantomData))
    }
}

/// What a JSON array folds into, element by element, so no `Vec` is built.
pub(crate) trait Accumulate<'de>: Default {
    type Item: Deserialize<'de>;
    fn add(&mut self, item: Self::Item);
}

/// A JSON array folded into `A` while it is parsed.
pub(crate) struct Folded<A>(pub A);

impl<'de, A: Accumulate<'de>> Deserialize<'de> for Folded<A> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<A>(PhantomData<A>);
        impl<'de, A: Accumulate<'de>> Visitor<'de> for V<A> {
            type Value = Folded<A>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }

            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Folded<A>, S::Error> {
                let mut acc = A::default();
                while let Some(item) = seq.next_element::<A::Item>()? {
                    acc.add(item);
                }
                Ok(Folded(acc))
            }
        }
        deserializer.deserialize_seq(V(PhantomData))
    }
}

/// The length of an array whose elements are skipped unread.
#[derive(Default)]
pub(crate) struct Count(pub u64);

impl Accumulate<'_> for Count {
    type Item = IgnoredAny;

    fn add(&mut self, _: IgnoredAny) {
        self.0 += 1;
    }
}

/// A field that reads as `None` when it is null or of another type, instead of failing.
/// These fields are small, so capturing the raw text and parsing it again costs little.
pub(crate) struct Lenient<T>(pub Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Lenient(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(deserializer)?;
        Ok(Lenient(serde_json::from_str(raw.get()).ok()))
    }
}
