//! The per-response streaming decoder used on the data path: framing (SSE or NDJSON) plus
//! the dialect's event classification, reporting one [`EventInfo`] per complete event.
//!
//! It never fails: whatever cannot be decoded only sets [`StreamDecoder::is_broken`], so the
//! record can say `decode: unknown` while the bytes flow on untouched.

use crate::decode::ndjson::NdjsonFramer;
use crate::decode::openai::classify_chunk;
use crate::decode::sse::{SseEvent, SseFramer};
use crate::decode::{Api, EventInfo, StreamKind};
use crate::decode::{anthropic, llamacpp, ollama, responses, tgi};

/// Incremental decoder for one streamed response.
#[derive(Debug)]
pub struct StreamDecoder {
    framing: Framing,
    broken: bool,
}

#[derive(Debug)]
enum Framing {
    Sse(SseFramer, SseDialect),
    /// Ollama is the only NDJSON dialect.
    Ndjson(NdjsonFramer),
}

#[derive(Copy, Clone, Debug)]
enum SseDialect {
    OpenAi,
    Responses,
    Anthropic,
    Tgi,
    LlamaCpp,
}

impl StreamDecoder {
    /// A decoder for this API and framing, or `None` when there is no decoder for the pair
    /// (the dialect is chosen, never assumed).
    pub fn new(api: Api, kind: StreamKind) -> Option<StreamDecoder> {
        let sse = |dialect| Some(Framing::Sse(SseFramer::new(), dialect));
        let framing = match (api, kind) {
            (Api::ChatCompletions | Api::Completions, StreamKind::Sse) => sse(SseDialect::OpenAi),
            (Api::Responses, StreamKind::Sse) => sse(SseDialect::Responses),
            (Api::Messages, StreamKind::Sse) => sse(SseDialect::Anthropic),
            (Api::TgiGenerate { .. }, StreamKind::Sse) => sse(SseDialect::Tgi),
            (Api::LlamaCppCompletion, StreamKind::Sse) => sse(SseDialect::LlamaCpp),
            (Api::OllamaChat | Api::OllamaGenerate, StreamKind::Ndjson) => {
                Some(Framing::Ndjson(NdjsonFramer::new()))
            }
            _ => None,
        }?;
        Some(StreamDecoder {
            framing,
            broken: false,
        })
    }

    /// Feeds the next chunk of the body; `on_event` is called once per event that this chunk
    /// completes, in stream order.
    ///
    /// Every dispatched SSE event and every non-blank NDJSON line is reported, so the caller
    /// sees each event's arrival; events that carry nothing (`ping`, `event: ping`) and
    /// undecodable ones report as empty.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(EventInfo)) {
        let Self { framing, broken } = self;
        match framing {
            Framing::Sse(framer, dialect) => {
                let dialect = *dialect;
                framer.push(chunk, |event| {
                    on_event(or_broken(classify(dialect, event), broken))
                });
            }
            Framing::Ndjson(framer) => {
                framer.push(chunk, |line| {
                    on_event(or_broken(ollama::classify_line(line), broken))
                });
            }
        }
    }

    /// Ends the stream. For SSE an event not closed by its blank line is discarded (WHATWG),
    /// so nothing is reported. For NDJSON a last line without its `\n` is still a record and
    /// is reported; if it does not parse, the stream was cut mid-line, which the missing
    /// terminal event already says, so the decoder is not marked broken for it.
    pub fn finish(&mut self, mut on_event: impl FnMut(EventInfo)) {
        match &mut self.framing {
            Framing::Sse(framer, _) => {
                framer.finish();
            }
            Framing::Ndjson(framer) => framer.finish(|line| {
                if let Ok(info) = ollama::classify_line(line) {
                    on_event(info);
                }
            }),
        }
    }

    /// Whether something in the stream could not be decoded (or was too large to).
    pub fn is_broken(&self) -> bool {
        let overflowed = match &self.framing {
            Framing::Sse(framer, _) => framer.overflowed(),
            Framing::Ndjson(framer) => framer.overflowed(),
        };
        self.broken || overflowed
    }
}

fn classify(dialect: SseDialect, event: SseEvent<'_>) -> Result<EventInfo, serde_json::Error> {
    let SseEvent { event, data } = event;
    match dialect {
        SseDialect::OpenAi => match event {
            "message" => classify_chunk(data),
            "error" => Ok(EventInfo {
                error: true,
                ..EventInfo::default()
            }),
            _ => Ok(EventInfo::default()),
        },
        SseDialect::Responses => responses::classify_event(event, data),
        SseDialect::Anthropic => anthropic::classify_event(event, data),
        SseDialect::Tgi => tgi::classify_event(event, data),
        SseDialect::LlamaCpp => llamacpp::classify_event(event, data),
    }
}

fn or_broken(result: Result<EventInfo, serde_json::Error>, broken: &mut bool) -> EventInfo {
    result.unwrap_or_else(|_| {
        *broken = true;
        EventInfo::default()
    })
}
