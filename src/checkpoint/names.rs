//! What a tensor name means: its class (routed experts, attention, …), its layer, and how tensor
//! parallelism splits it.
//!
//! Two naming schemes are understood:
//! - DeepSeek V4.1 (docs/reference-kit.md C.1): `layers.L.ffn.experts.E.{w1,w2,w3}`,
//!   `layers.L.ffn.shared_experts.w{1,2,3}`, `layers.L.attn.{wq_a,wq_b,wkv,wo_a.slice.i,wo_b}`,
//!   `layers.L.attn.indexer.{wk,weights_proj}`, `layers.L.engram.{wkv,embed}`, `mtp.*`, `head`, `embed`;
//! - Hugging Face Llama / MoE (docs/exl3-format.md §1.5): `model.layers.N.self_attn.{q,k,v,o}_proj`,
//!   `….mlp.{gate,up,down}_proj`, `….mlp.experts.E.{gate,up,down}_proj`, `lm_head`, `model.embed_tokens`.

use serde::Serialize;

/// Matrix / tensor classes reported by the audit and the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    RoutedExperts,
    SharedExperts,
    Attention,
    Indexer,
    EngramWkv,
    Mtp,
    Head,
    /// A dense (non-expert) MLP, e.g. Llama `mlp.{gate,up,down}_proj`.
    DenseMlp,
    Embedding,
    /// Engram hash tables (file-backed at runtime, never in GPU memory).
    EngramTable,
    Router,
    Norm,
    Vision,
    Other,
}

impl Class {
    /// Snake-case name, as in JSON and in k-map keys.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Class::RoutedExperts => "routed_experts",
            Class::SharedExperts => "shared_experts",
            Class::Attention => "attention",
            Class::Indexer => "indexer",
            Class::EngramWkv => "engram_wkv",
            Class::Mtp => "mtp",
            Class::Head => "head",
            Class::DenseMlp => "dense_mlp",
            Class::Embedding => "embedding",
            Class::EngramTable => "engram_table",
            Class::Router => "router",
            Class::Norm => "norm",
            Class::Vision => "vision",
            Class::Other => "other",
        }
    }

    /// Classes whose linears are expected to be EXL3-packed in an EXL3 checkpoint.
    #[must_use]
    pub const fn expects_packed(self) -> bool {
        matches!(
            self,
            Class::RoutedExperts
                | Class::SharedExperts
                | Class::Attention
                | Class::EngramWkv
                | Class::Mtp
                | Class::Head
                | Class::DenseMlp
        )
    }
}

/// How tensor parallelism lays a matrix over ranks (reference-kit.md C.3; vLLM's linear layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Output features split (ColumnParallelLinear, ParallelLMHead): trellis dim 1, `svh`, `bias`.
    Column,
    /// Input features split (RowParallelLinear): trellis dim 0, `suh`.
    Row,
    /// Vocabulary rows split (VocabParallelEmbedding): native dim 0.
    VocabRows,
    /// A full copy on every rank.
    Replicated,
    /// Not in GPU memory at all (Engram tables are served from files).
    Excluded,
}

/// What a module prefix (a tensor name without its last component) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Role {
    /// The reporting class (MTP blocks report as [`Class::Mtp`]).
    pub class: Class,
    /// What the tensor is regardless of MTP (an MTP expert is `RoutedExperts` here).
    pub base: Class,
    /// Decoder layer, when the name has one (`layers.N.`); MTP layers keep their own index.
    pub layer: Option<u32>,
    pub split: Split,
}

/// Leaf names that mark a column-parallel linear (output split).
const COLUMN_LEAVES: &[&str] =
    &["w1", "w3", "gate_proj", "up_proj", "wq_b", "q_proj", "k_proj", "v_proj", "q_b_proj", "kv_b_proj", "wo_a"];
/// Leaf names that mark a row-parallel linear (input split).
const ROW_LEAVES: &[&str] = &["w2", "down_proj", "wo_b", "o_proj"];

/// The layer index after a `layers.` component, if any.
fn layer_of(parts: &[&str]) -> Option<u32> {
    parts.windows(2).find(|w| w[0] == "layers").and_then(|w| w[1].parse().ok())
}

/// Index of the MTP block: `mtp.I.…` names it directly.
fn mtp_index(parts: &[&str]) -> Option<u32> {
    (parts.first() == Some(&"mtp")).then(|| parts.get(1).and_then(|p| p.parse().ok())).flatten()
}

/// Classify a module prefix. `num_hidden_layers` marks layers at or past it as MTP (vLLM names
/// MTP blocks `model.layers.{40+i}`, reference-kit.md C.1).
#[must_use]
pub fn classify(prefix: &str, num_hidden_layers: u32) -> Role {
    let parts: Vec<&str> = prefix.split('.').filter(|p| !p.is_empty()).collect();
    let parts: &[&str] = match parts.first() {
        Some(&"model") => &parts[1..],
        _ => &parts,
    };
    let has = |s: &str| parts.contains(&s);
    // The leaf: for `wo_a.slice.3` the module is `wo_a`.
    let leaf = parts.iter().rev().find(|p| p.parse::<u32>().is_err() && **p != "slice").copied().unwrap_or_default();
    let layer = layer_of(parts).or_else(|| mtp_index(parts));
    let is_mtp = mtp_index(parts).is_some()
        || parts.first() == Some(&"mtp")
        || layer_of(parts).is_some_and(|l| l >= num_hidden_layers)
        || has("main_proj")
        || has("eh_proj");
    let split_of_leaf = || {
        if COLUMN_LEAVES.contains(&leaf) {
            Split::Column
        } else if ROW_LEAVES.contains(&leaf) {
            Split::Row
        } else {
            Split::Replicated
        }
    };
    let (class, split) =
        if has("vision") || has("visual") || has("aligner") || has("vision_tower") || leaf.starts_with("image_") {
            (Class::Vision, Split::Replicated)
        } else if has("engram") {
            if has("embed") {
                (Class::EngramTable, Split::Excluded)
            } else if leaf == "wkv" {
                (Class::EngramWkv, Split::Replicated)
            } else {
                (Class::Other, Split::Replicated)
            }
        } else if has("experts") && !has("shared_experts") {
            (Class::RoutedExperts, split_of_leaf())
        } else if has("shared_experts") || has("shared_expert") {
            (Class::SharedExperts, split_of_leaf())
        } else if has("indexer") {
            // vLLM's sparse-attention indexer is ReplicatedLinear throughout (keys, queries, weights).
            (Class::Indexer, Split::Replicated)
        } else if has("markov_head") || has("confidence_head") {
            // DSpark's Markov and confidence heads: native (not EXL3, C.3), one copy per rank.
            (Class::Other, Split::Replicated)
        } else if leaf.ends_with("norm") || leaf.starts_with("norm") {
            (Class::Norm, Split::Replicated)
        } else if has("attn") || has("self_attn") {
            (Class::Attention, split_of_leaf())
        } else if leaf == "main_proj" || leaf == "eh_proj" {
            (Class::Mtp, Split::Replicated)
        } else if (has("ffn") || has("mlp")) && (leaf == "gate" || leaf == "router") {
            (Class::Router, Split::Replicated)
        } else if has("mlp") || has("ffn") {
            (Class::DenseMlp, split_of_leaf())
        } else if leaf == "head" || leaf == "lm_head" {
            (Class::Head, Split::Column)
        } else if leaf == "embed" || leaf == "embed_tokens" || leaf == "wte" {
            (Class::Embedding, Split::VocabRows)
        } else {
            (Class::Other, Split::Replicated)
        };
    // MTP is its own class for reporting, but keeps the split of what the matrix is.
    let base = class;
    let class = if is_mtp && !matches!(class, Class::Norm | Class::Router | Class::Other) { Class::Mtp } else { class };
    Role { class, base, layer, split }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepseek_names() {
        let r = classify("layers.3.ffn.experts.17.w1", 40);
        assert_eq!((r.class, r.layer, r.split), (Class::RoutedExperts, Some(3), Split::Column));
        assert_eq!(classify("layers.3.ffn.experts.17.w2", 40).split, Split::Row);
        assert_eq!(classify("layers.3.ffn.shared_experts.w3", 40).class, Class::SharedExperts);
        let r = classify("layers.0.attn.wo_a.slice.5", 40);
        assert_eq!((r.class, r.split), (Class::Attention, Split::Column));
        assert_eq!(classify("layers.0.attn.wq_a", 40).split, Split::Replicated);
        assert_eq!(classify("layers.0.attn.wo_b", 40).split, Split::Row);
        assert_eq!(classify("layers.9.attn.indexer.wk", 40).class, Class::Indexer);
        assert_eq!(classify("layers.14.engram.wkv", 40).class, Class::EngramWkv);
        assert_eq!(classify("layers.14.engram.embed", 40).split, Split::Excluded);
        let r = classify("mtp.0.ffn.experts.3.w2", 40);
        assert_eq!((r.class, r.split), (Class::Mtp, Split::Row));
        assert_eq!(classify("model.layers.40.attn.wq_b", 40).class, Class::Mtp);
        assert_eq!(classify("mtp.0.main_proj", 40).class, Class::Mtp);
        assert_eq!(classify("head", 40).class, Class::Head);
        assert_eq!(classify("embed", 40).split, Split::VocabRows);
        assert_eq!(classify("layers.2.ffn.gate", 40).class, Class::Router);
        assert_eq!(classify("layers.2.attn_norm", 40).class, Class::Norm);
        let r = classify("layers.8.attn.indexer.wq_b", 40);
        assert_eq!((r.class, r.split), (Class::Indexer, Split::Replicated));
        assert_eq!(classify("layers.2.attn.compressor.wgate", 40).split, Split::Replicated);
        let r = classify("mtp.2.markov_head.embed", 40);
        assert_eq!((r.class, r.split), (Class::Other, Split::Replicated));
        assert_eq!(classify("image_newline", 40).class, Class::Vision);
    }

    #[test]
    fn llama_names() {
        let r = classify("model.layers.1.self_attn.q_proj", 40);
        assert_eq!((r.class, r.layer, r.split), (Class::Attention, Some(1), Split::Column));
        assert_eq!(classify("model.layers.1.self_attn.o_proj", 40).split, Split::Row);
        assert_eq!(classify("model.layers.1.mlp.gate_proj", 40).class, Class::DenseMlp);
        assert_eq!(classify("model.layers.1.mlp.down_proj", 40).split, Split::Row);
        assert_eq!(classify("model.layers.1.mlp.experts.2.up_proj", 40).class, Class::RoutedExperts);
        assert_eq!(classify("lm_head", 40).class, Class::Head);
        assert_eq!(classify("model.embed_tokens", 40).class, Class::Embedding);
        assert_eq!(classify("model.layers.0.input_layernorm", 40).class, Class::Norm);
        assert_eq!(classify("model.norm", 40).class, Class::Norm);
    }
}
