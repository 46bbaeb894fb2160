//! Usage injection's request rewrite: an injected body is valid JSON that asks for usage
//! and streams, and differs from the original only in `stream_options.include_usage`.

#![no_main]

use goodput::decode::{Api, inspect_request};
use goodput::usage_injection::{Rewrite, rewrite};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The document without `stream_options.include_usage` (and without `stream_options` if
/// that leaves it empty), i.e. what must be equal before and after the rewrite.
fn without_include_usage(mut doc: Value) -> Value {
    if let Some(obj) = doc.as_object_mut() {
        let now_empty = obj
            .get_mut("stream_options")
            .and_then(Value::as_object_mut)
            .is_some_and(|o| {
                o.remove("include_usage");
                o.is_empty()
            });
        if now_empty {
            obj.remove("stream_options");
        }
    }
    doc
}

fuzz_target!(|data: &[u8]| {
    let models = ["*".to_owned()];
    let Rewrite::Inject(new) = rewrite(data, &models) else {
        return;
    };
    // The rewrite reads only the fields it needs, so a body that is not strictly JSON
    // elsewhere (invalid UTF-8 in a skipped key, say) may be rewritten; it stays as invalid
    // as the client sent it. A valid body must stay valid.
    let Ok(before) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(after) = serde_json::from_slice::<Value>(&new) else {
        panic!(
            "the injected body is not JSON: {:?}",
            String::from_utf8_lossy(&new)
        );
    };
    assert_eq!(
        after.pointer("/stream_options/include_usage"),
        Some(&Value::Bool(true))
    );
    assert_eq!(
        without_include_usage(before),
        without_include_usage(after),
        "the rewrite changed more than include_usage"
    );
    // The measurement reads the new body as streaming with usage, and the rest alike. (A
    // body it cannot read, with a duplicate key among its fields, it cannot read after.)
    if let Some(old) = inspect_request(Api::ChatCompletions, data) {
        let new = inspect_request(Api::ChatCompletions, &new);
        assert!(new.is_some_and(|n| n.stream
            && n.include_usage
            && n.model == old.model
            && n.max_tokens == old.max_tokens));
    }
});
