//! The per-response streaming decoder used on the data path: framing (SSE or NDJSON) plus
//! the dialect's event classification, reporting one [`EventInfo`] per complete event.
//!
//! It never fails: whatever cannot be decoded only sets [`StreamDecoder::is_broken`], so the
//! record can say `decode: unknown` while the bytes flow on untouched.
//!
//! On request ([`StreamDecoder::collect_text`]) it also keeps the generated text for token
//! counting, and drops it as soon as the stream reports its output token count.

use crate::decode::ndjson::NdjsonFramer;
use crate::decode::openai::{ChunkTemplate, EventText};
use crate::decode::sse::{SseEvent, SseFramer};
use crate::decode::text::{self, Path, TextBuf, paths};
use crate::decode::{Api, EventInfo, StreamKind};
use crate::decode::{anthropic, llamacpp, ollama, responses, tgi};

/// Incremental decoder for one streamed response.
#[derive(Debug)]
pub struct StreamDecoder {
    framing: Framing,
    broken: bool,
    /// The generated text, while it is being collected (see [`StreamDecoder::collect_text`]).
    text: Option<TextBuf>,
    /// Keep the text to the end even when the stream reports its usage (an answer read
    /// for comparison, [`answer_text`]).
    whole: bool,
    /// OpenAI chunks are mostly recognised by the bytes around their text.
    template: ChunkTemplate,
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
            text: None,
            whole: false,
            template: ChunkTemplate::default(),
        })
    }

    /// Starts keeping the generated text (up to `limit` bytes) so its tokens can be counted
    /// if the stream reports no usage. This costs a second, allocation-free walk of each
    /// content-bearing event plus the copy of its text; it stops, and the text is dropped,
    /// as soon as an event carries the output token count.
    pub fn collect_text(&mut self, limit: usize) {
        self.text = Some(TextBuf::new(limit));
    }

    /// The text collected so far, if collection was on and no usage has arrived.
    pub fn take_text(&mut self) -> Option<TextBuf> {
        self.text.take()
    }

    /// Feeds the next chunk of the body; `on_event` is called once per event that this chunk
    /// completes, in stream order.
    ///
    /// Every dispatched SSE event and every non-blank NDJSON line is reported, so the caller
    /// sees each event's arrival; events that carry nothing (`ping`, `event: ping`) and
    /// undecodable ones report as empty.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(EventInfo)) {
        let Self {
            framing,
            broken,
            text,
            whole,
            template,
        } = self;
        let whole = *whole;
        match framing {
            Framing::Sse(framer, dialect) => {
                let dialect = *dialect;
                framer.push(chunk, |event| {
                    let (info, known) = match classify(dialect, event, template) {
                        Ok((info, known)) => (info, known),
                        Err(_) => {
                            *broken = true;
                            (EventInfo::default(), EventText::None)
                        }
                    };
                    keep_text(text, whole, &info, known, event.data, dialect.text_paths());
                    on_event(info)
                });
            }
            Framing::Ndjson(framer) => {
                framer.push(chunk, |line| {
                    let info = or_broken(ollama::classify_line(line), broken);
                    keep_text(text, whole, &info, EventText::Other, line, paths::OLLAMA);
                    on_event(info)
                });
            }
        }
    }

    /// Ends the stream. For SSE an event not closed by its blank line is discarded (WHATWG),
    /// so nothing is reported. For NDJSON a last line without its `\n` is still a record and
    /// is reported; if it does not parse, the stream was cut mid-line, which the missing
    /// terminal event already says, so the decoder is not marked broken for it.
    pub fn finish(&mut self, mut on_event: impl FnMut(EventInfo)) {
        let text = &mut self.text;
        let whole = self.whole;
        match &mut self.framing {
            Framing::Sse(framer, _) => {
                framer.finish();
            }
            Framing::Ndjson(framer) => framer.finish(|line| {
                if let Ok(info) = ollama::classify_line(line) {
                    keep_text(text, whole, &info, EventText::Other, line, paths::OLLAMA);
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

impl SseDialect {
    fn text_paths(self) -> &'static [Path] {
        match self {
            SseDialect::OpenAi => paths::OPENAI_EVENT,
            SseDialect::Responses => paths::RESPONSES_EVENT,
            SseDialect::Anthropic => paths::ANTHROPIC_EVENT,
            SseDialect::Tgi => paths::TGI_EVENT,
            SseDialect::LlamaCpp => paths::LLAMACPP,
        }
    }
}

/// Adds a content-bearing event's text while collecting; stops collecting for good once
/// the stream has reported its output token count, which makes the text unnecessary.
/// Text the classifier already found (`known`) is taken as is; otherwise the event is
/// walked again at the dialect's text paths.
fn keep_text(
    text: &mut Option<TextBuf>,
    whole: bool,
    info: &EventInfo,
    known: EventText<'_>,
    data: &[u8],
    paths: &[Path],
) {
    if !whole && info.usage.is_some_and(|u| u.output_tokens.is_some()) {
        *text = None;
    } else if let Some(buf) = text.as_mut()
        && info.content
    {
        match known {
            EventText::One(s) => buf.push(s),
            EventText::None => {}
            EventText::Other => text::collect(data, paths, buf),
        }
        buf.mark();
    }
}

/// The whole generated text of an answer already read (`chunks`, its body's frames), up
/// to `limit` bytes, with where each content event ended when it was streamed; `None`
/// where there is no decoder for it. Used off the data path, to compare two answers.
pub fn answer_text(
    api: Api,
    kind: crate::decode::StreamKind,
    chunks: &[bytes::Bytes],
    limit: usize,
) -> Option<TextBuf> {
    if kind == crate::decode::StreamKind::Json {
        let mut body = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum());
        for c in chunks {
            body.extend_from_slice(c);
        }
        return crate::decode::response_body_text(api, &body, limit);
    }
    let mut decoder = StreamDecoder::new(api, kind)?;
    decoder.text = Some(TextBuf::with_marks(limit));
    decoder.whole = true;
    for c in chunks {
        decoder.feed(c, |_| {});
    }
    decoder.finish(|_| {});
    decoder.take_text()
}

/// Classifies one event; the text comes along where the dialect's classifier saw it
/// (OpenAI), else it is [`EventText::Other`] (walk the event for it).
fn classify<'a>(
    dialect: SseDialect,
    event: SseEvent<'a>,
    template: &mut ChunkTemplate,
) -> Result<(EventInfo, EventText<'a>), serde_json::Error> {
    let SseEvent { event, data } = event;
    let other = |info| (info, EventText::Other);
    match dialect {
        SseDialect::OpenAi => match event {
            "message" => template.classify(data),
            "error" => Ok((
                EventInfo {
                    error: true,
                    ..EventInfo::default()
                },
                EventText::None,
            )),
            _ => Ok((EventInfo::default(), EventText::None)),
        },
        SseDialect::Responses => responses::classify_event(event, data).map(other),
        SseDialect::Anthropic => anthropic::classify_event(event, data).map(other),
        SseDialect::Tgi => tgi::classify_event(event, data).map(other),
        SseDialect::LlamaCpp => llamacpp::classify_event(event, data).map(other),
    }
}

fn or_broken(result: Result<EventInfo, serde_json::Error>, broken: &mut bool) -> EventInfo {
    result.unwrap_or_else(|_| {
        *broken = true;
        EventInfo::default()
    })
}
