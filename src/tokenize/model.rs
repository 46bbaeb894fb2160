//! The two ways of counting tokens: a HuggingFace `tokenizer.json` configured for the model
//! (exact for that model, chat template aside), or the o200k_base encoding embedded in
//! `tiktoken-rs` as an estimate when no tokenizer is configured for the model.

use std::{fmt, path::Path, sync::Arc, sync::OnceLock};

use tiktoken_rs::CoreBPE;

/// Why a tokenizer could not be loaded or could not count.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot load `{path}`: {source}")]
    Load {
        path: String,
        #[source]
        source: tokenizers::Error,
    },
    #[error("tokenizing failed: {0}")]
    Encode(#[source] tokenizers::Error),
    #[error("the embedded o200k_base encoding did not load")]
    Estimate,
}

/// A HuggingFace tokenizer loaded from a `tokenizer.json`; cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    path: Arc<str>,
    inner: Arc<tokenizers::Tokenizer>,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`. Truncation and padding configured in the file are turned
    /// off: a count must see the whole text, whatever length the file was trained to cut at.
    pub fn load(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let shown = path.display().to_string();
        let mut inner =
            tokenizers::Tokenizer::from_file(path).map_err(|source| TokenizerError::Load {
                path: shown.clone(),
                source,
            })?;
        inner
            .with_truncation(None)
            .map_err(|source| TokenizerError::Load {
                path: shown.clone(),
                source,
            })?;
        inner.with_padding(None);
        Ok(Tokenizer {
            path: shown.into(),
            inner: Arc::new(inner),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Tokens in `text`, special tokens (BOS, chat template) not added.
    pub fn count(&self, text: &str) -> Result<u64, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(encoding.len() as u64)
    }
}

impl fmt::Debug for Tokenizer {
    // The vocabulary is megabytes: show where it came from, not what it holds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .finish()
    }
}

/// What counts a request's tokens.
#[derive(Debug, Clone)]
pub enum Counter {
    /// The model's own tokenizer: the record says `tokenizer`.
    Model(Tokenizer),
    /// o200k_base, whatever the model: the record says `estimate`.
    Estimate,
}

impl Counter {
    pub fn count(&self, text: &str) -> Result<u64, TokenizerError> {
        if text.is_empty() {
            return Ok(0);
        }
        match self {
            Counter::Model(t) => t.count(text),
            Counter::Estimate => {
                let bpe = o200k().ok_or(TokenizerError::Estimate)?;
                Ok(bpe.encode_ordinary(text).len() as u64)
            }
        }
    }
}

/// o200k_base, parsed on first use (about a quarter of a second and ~45 MB), so that a
/// deployment whose upstream always reports usage never pays for it.
fn o200k() -> Option<&'static CoreBPE> {
    static BPE: OnceLock<Option<CoreBPE>> = OnceLock::new();
    BPE.get_or_init(|| tiktoken_rs::o200k_base().ok()).as_ref()
}

/// The estimate's count of `text` (o200k_base), for tests and tools that compare with it.
pub fn estimate(text: &str) -> Option<u64> {
    Counter::Estimate.count(text).ok()
}
