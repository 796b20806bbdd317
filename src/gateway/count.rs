//! Prompt tokens counted in process with the served checkpoint's own `tokenizer.json` (Hugging
//! Face's `tokenizers`, the library vLLM's fast tokenizer wraps), for prompts that need no chat
//! template: `/v1/completions` strings. Chat requests are counted by the engine's `/tokenize`
//! (the template is Jinja, rendered by vLLM's Python).

use std::path::{Path, PathBuf};

/// A loaded tokenizer. Its `Debug` names the file only.
pub struct Counter {
    tokenizer: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter").field("path", &self.path).finish()
    }
}

/// Why a checkpoint's tokenizer could not be used (the engine's `/tokenize` counts instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("{0} does not exist")]
    Missing(PathBuf),
    #[error("{path} could not be loaded: {why}")]
    Bad { path: PathBuf, why: String },
}

/// A prompt the tokenizer could not encode (the engine's `/tokenize` counts it instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the tokenizer could not encode the prompt: {0}")]
pub struct EncodeError(String);

impl Counter {
    /// `tokenizer.json` in the checkpoint directory `dir`.
    #[must_use]
    pub fn file_in(dir: &Path) -> PathBuf {
        dir.join("tokenizer.json")
    }

    /// Load `path` (a `tokenizer.json`).
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        if !path.is_file() {
            return Err(LoadError::Missing(path.to_path_buf()));
        }
        let tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| LoadError::Bad { path: path.to_path_buf(), why: e.to_string() })?;
        Ok(Self { tokenizer, path: path.to_path_buf() })
    }

    /// The file it was loaded from.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokens of `text` as vLLM counts a completion prompt: the tokenizer's post-processor
    /// (BOS and the like) applied when `add_special_tokens` (vLLM's default is true).
    pub fn count(&self, text: &str, add_special_tokens: bool) -> Result<u64, EncodeError> {
        let enc = self.tokenizer.encode_fast(text, add_special_tokens).map_err(|e| EncodeError(e.to_string()))?;
        Ok(enc.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE tokenizer as the tiny checkpoints have (the same pre-tokenizer and
    /// BOS post-processor), with a vocabulary of every byte, one merge and the specials.
    fn fixture(dir: &Path) -> PathBuf {
        let bytes = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
        let mut chars: Vec<char> = bytes.into_iter().collect();
        chars.sort_unstable();
        let mut vocab = serde_json::Map::new();
        for (i, t) in ["<unk>", "<s>", "</s>", "<pad>"].iter().enumerate() {
            vocab.insert((*t).to_string(), serde_json::json!(i));
        }
        for c in &chars {
            let n = vocab.len();
            vocab.insert(c.to_string(), serde_json::json!(n));
        }
        // "Ġ" is the byte-level space: "Ġh" is one token.
        let n = vocab.len();
        vocab.insert("Ġh".into(), serde_json::json!(n));
        let special = |id: u64, c: &str| {
            serde_json::json!({"id": id, "content": c, "single_word": false, "lstrip": false, "rstrip": false,
                               "normalized": false, "special": true})
        };
        let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                                    "use_regex": true});
        let t = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>"), special(3, "<pad>")],
            "normalizer": null, "pre_tokenizer": bl, "decoder": bl,
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": [["Ġ", "h"]]}
        });
        let p = Counter::file_in(dir);
        std::fs::write(&p, t.to_string()).unwrap();
        p
    }

    #[test]
    fn counts_bytes_merges_and_the_bos_as_vllm_would() {
        let d = tempfile::tempdir().unwrap();
        let c = Counter::load(&fixture(d.path())).unwrap();
        // BOS + one token per byte, "Ġh" merged.
        assert_eq!(c.count("ab", true), Ok(3));
        assert_eq!(c.count("ab", false), Ok(2));
        assert_eq!(c.count("a h", true), Ok(3));
        assert_eq!(c.count("", true), Ok(1));
        assert_eq!(c.count("", false), Ok(0));
        // "é" is two bytes; "→" three.
        assert_eq!(c.count("é→", true), Ok(6));
        // A special token's text in the prompt is that token (as vLLM's tokenizer parses it).
        assert_eq!(c.count("<s>a", false), Ok(2));
    }

    #[test]
    fn a_missing_or_bad_file_is_an_error_not_a_panic() {
        let d = tempfile::tempdir().unwrap();
        let p = Counter::file_in(d.path());
        assert_eq!(Counter::load(&p).unwrap_err(), LoadError::Missing(p.clone()));
        std::fs::write(&p, "{not json").unwrap();
        let e = Counter::load(&p).unwrap_err();
        assert!(matches!(e, LoadError::Bad { .. }), "{e}");
    }

    /// The tiny checkpoint's own file, where a run of the tiny-cpu kit made one.
    #[test]
    fn the_tiny_checkpoint_loads_when_present() {
        let Some(home) = std::env::var_os("HOME") else { return };
        let models = Path::new(&home).join(".cache/spark-kit/data/models");
        let Ok(dirs) = std::fs::read_dir(models) else { return };
        for d in dirs.filter_map(Result::ok) {
            let p = Counter::file_in(&d.path());
            if p.is_file() {
                let c = Counter::load(&p).unwrap();
                assert!(c.count("Hello, world", true).unwrap() >= 2, "{}", p.display());
            }
        }
    }
}
