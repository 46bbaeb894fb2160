//! Request bodies: the measurement's field reader (`inspect_request`) and the prompt
//! extraction used for input token counts, in every dialect, over arbitrary bytes.

#![no_main]

use goodput::decode::{Api, inspect_request};
use goodput::tokenize::prompt;
use libfuzzer_sys::fuzz_target;

const APIS: [Api; 10] = [
    Api::ChatCompletions,
    Api::Completions,
    Api::Responses,
    Api::Messages,
    Api::TgiGenerate {
        stream_endpoint: true,
    },
    Api::TgiGenerate {
        stream_endpoint: false,
    },
    Api::LlamaCppCompletion,
    Api::OllamaChat,
    Api::OllamaGenerate,
    Api::Unknown,
];

fuzz_target!(|data: &[u8]| {
    let parsed = prompt::parse(data);
    for api in APIS {
        if inspect_request(api, data).is_some() {
            assert!(data.trim_ascii().starts_with(b"{"));
        }
        if let Some(body) = &parsed {
            let _ = prompt::extract(api, body).is_empty();
        }
    }
});
