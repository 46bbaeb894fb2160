//! Token counting for requests whose upstream reports no usage, off the request's path.
//!
//! The data path only keeps the generated text (bounded, see
//! [`crate::decode::StreamDecoder::collect_text`]); everything else happens here, on a
//! small pool of worker threads behind a bounded queue ([`Stage`]): the request body is
//! parsed for the model and the prompt ([`prompt`]), the model picks its tokenizer
//! (`[tokenizer].models`, a HuggingFace `tokenizer.json`) or the embedded o200k_base
//! estimate, and the counts are written into the measurement before the aggregator
//! finishes it. Sources, in order of preference: `usage`, `tokenizer`, `estimate`,
//! `events` (output only).
//!
//! Files: [`model`] (the counters), [`prompt`] (prompt text per dialect), `pool` (worker
//! threads), `count` (one job), `stage` (the hand-off between recorder and aggregator).

mod count;
pub mod model;
mod pool;
pub mod prompt;
mod set;
mod stage;

pub use model::{Counter, Tokenizer, TokenizerError, estimate};
pub use pool::Pool;
pub use set::Tokenizers;
pub use stage::{Fallbacks, Stage};
// The shadow's records are counted on a stage of their own, one at a time (`crate::shadow`).
pub(crate) use count::count_tokens;
pub(crate) use stage::wants;

use crate::measure::TokenSource;

impl Counter {
    /// The source a count made by this counter is recorded with.
    pub fn source(&self) -> TokenSource {
        match self {
            Counter::Model(_) => TokenSource::Tokenizer,
            Counter::Estimate => TokenSource::Estimate,
        }
    }
}

/// Why a count was not made as configured: the label of
/// `goodput_tokenizer_fallback_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The worker queue was full: output counted from events, input left absent.
    QueueFull,
    /// The tokenizer failed on the text: that count is left to the next source.
    TokenizeError,
    /// The generated text outgrew `[tokenizer].text_limit`: the count is extrapolated from
    /// the part kept and recorded as `estimate`.
    TextLimit,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::QueueFull => "queue_full",
            Fallback::TokenizeError => "tokenize_error",
            Fallback::TextLimit => "text_limit",
        }
    }
}
