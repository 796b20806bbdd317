//! Admission arithmetic: does a request fit what the memory plan says the engine holds? Pure.
//!
//! A request is refused (HTTP 400) before any engine memory is spent when its prompt is longer
//! than the plan's safe prompt (the prefill budget), or its prompt + `max_tokens` exceeds the KV
//! pool in tokens or `engine.max_model_len`.

use crate::plan::Plan;

/// What the plan says one sequence may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `engine.max_model_len`.
    pub max_model_len: u64,
    /// Whole tokens the KV pool holds (None when the plan cannot say: bytes per token unknown).
    pub kv_pool_tokens: Option<u64>,
    /// Largest prompt whose prefill keeps every node above its memory floor (the smallest over
    /// the nodes; None when no node's memory is known).
    pub safe_max_prompt: Option<u64>,
}

impl Limits {
    /// The limits of a computed plan.
    #[must_use]
    pub fn from_plan(plan: &Plan) -> Self {
        let safe_max_prompt = plan.nodes.iter().filter_map(|n| n.prefill.as_ref()).map(|p| p.safe_max_prompt).min();
        Self { max_model_len: plan.max_model_len, kv_pool_tokens: plan.kv.tokens, safe_max_prompt }
    }
}

/// Which limit a request crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The prompt alone is longer than the plan's safe prompt.
    PrefillBudget,
    /// Prompt + max_tokens exceeds the KV pool.
    KvPool,
    /// Prompt + max_tokens exceeds `engine.max_model_len`.
    MaxModelLen,
}

impl Limit {
    /// Metric label and error `param`-style name.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Limit::PrefillBudget => "prefill_budget",
            Limit::KvPool => "kv_pool",
            Limit::MaxModelLen => "max_model_len",
        }
    }
}

/// A refused request: the limit, its value and the request's figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub limit: Limit,
    /// The limit's value in tokens.
    pub allowed: u64,
    /// The request's figure compared with it (prompt tokens, or prompt + max_tokens).
    pub requested: u64,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// The binding limit on prompt + max_tokens (the smaller of the KV pool and
    /// `max_model_len`): the fix keeps the request under it too, so the advice, followed, admits.
    pub total_cap: u64,
    /// The prefill budget, when the plan has one: the fix never advises a longer prompt.
    pub safe_prompt: Option<u64>,
}

impl Refusal {
    /// One-line message naming the limit, the request's figure and a fix that admits the
    /// request when followed (every limit considered, not only the one crossed).
    #[must_use]
    pub fn message(&self) -> String {
        let (p, m, a) = (self.prompt_tokens, self.max_tokens, self.allowed);
        match self.limit {
            Limit::PrefillBudget if a == 0 => format!(
                "this deployment's memory plan allows no prompt at all (prefill budget 0 tokens; this prompt is {p} tokens): \
                 run `spark-kit plan` and follow its fix for the prefill floor"
            ),
            Limit::PrefillBudget => format!(
                "prompt is {p} tokens; the memory plan's prefill budget (safe prompt) is {a} tokens: {} (`spark-kit plan` \
                 shows the budget)",
                self.shorten_fix()
            ),
            Limit::KvPool | Limit::MaxModelLen => {
                let what = if self.limit == Limit::KvPool {
                    format!("the KV pool holds {a} tokens")
                } else {
                    format!("engine.max_model_len is {a} tokens")
                };
                let fix = if p < a {
                    format!("lower max_tokens to at most {} or shorten the prompt", a - p)
                } else {
                    self.shorten_fix()
                };
                format!("prompt {p} + max_tokens {m} = {} tokens; {what}: {fix}", self.requested)
            }
        }
    }

    /// "shorten the prompt to at most P' tokens", and the max_tokens that then fits.
    fn shorten_fix(&self) -> String {
        let cap = self.total_cap;
        let longest = self.safe_prompt.unwrap_or(u64::MAX).min(cap.saturating_sub(1));
        let mut fix = format!("shorten the prompt to at most {longest} tokens");
        if longest.saturating_add(self.max_tokens) > cap {
            fix.push_str(&format!(" and lower max_tokens to at most {}", cap - longest));
        }
        fix
    }
}

/// Admit or refuse one sequence of `prompt_tokens` that may generate `max_tokens`.
///
/// `max_tokens` None (the request does not set it) counts as 1: vLLM then generates up to
/// `max_model_len − prompt`, which the engine itself caps. The prefill budget is checked first,
/// then prompt + max_tokens against the smaller of the KV pool and `max_model_len` (the binding
/// one is named, so following its fix cannot hit the other).
pub fn admit(limits: &Limits, prompt_tokens: u64, max_tokens: Option<u64>) -> Result<(), Refusal> {
    let max_tokens_v = max_tokens.unwrap_or(1);
    let total = prompt_tokens.saturating_add(max_tokens_v);
    let (total_limit, total_cap) = match limits.kv_pool_tokens {
        Some(pool) if pool < limits.max_model_len => (Limit::KvPool, pool),
        _ => (Limit::MaxModelLen, limits.max_model_len),
    };
    let refuse = |limit, allowed, requested| {
        Err(Refusal {
            limit,
            allowed,
            requested,
            prompt_tokens,
            max_tokens: max_tokens_v,
            total_cap,
            safe_prompt: limits.safe_max_prompt,
        })
    };
    if let Some(safe) = limits.safe_max_prompt {
        if prompt_tokens > safe {
            return refuse(Limit::PrefillBudget, safe, prompt_tokens);
        }
    }
    if total > total_cap {
        return refuse(total_limit, total_cap, total);
    }
    Ok(())
}

/// The request's output budget: `max_completion_tokens`, else `max_tokens` (OpenAI names both).
#[must_use]
pub fn requested_max_tokens(body: &serde_json::Value) -> Option<u64> {
    body.get("max_completion_tokens").and_then(serde_json::Value::as_u64).or_else(|| body.get("max_tokens")?.as_u64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const L: Limits = Limits { max_model_len: 4096, kv_pool_tokens: Some(3000), safe_max_prompt: Some(2000) };

    #[test]
    fn fits_when_every_limit_holds() {
        assert_eq!(admit(&L, 1999, Some(1000)), Ok(()));
        assert_eq!(admit(&L, 2000, Some(1000)), Ok(()));
    }

    #[test]
    fn prefill_budget_is_checked_first() {
        let r = admit(&L, 2001, Some(10)).unwrap_err();
        assert_eq!((r.limit, r.allowed, r.requested), (Limit::PrefillBudget, 2000, 2001));
        assert!(r.message().contains("prompt is 2001 tokens"), "{}", r.message());
        assert!(r.message().contains("at most 2000 tokens"), "{}", r.message());
    }

    #[test]
    fn kv_pool_counts_prompt_plus_max_tokens() {
        let r = admit(&L, 1500, Some(1501)).unwrap_err();
        assert_eq!((r.limit, r.allowed, r.requested), (Limit::KvPool, 3000, 3001));
        assert!(r.message().contains("lower max_tokens to at most 1500"), "{}", r.message());
    }

    #[test]
    fn max_model_len_when_pool_is_larger_or_unknown() {
        let l = Limits { max_model_len: 4096, kv_pool_tokens: None, safe_max_prompt: None };
        let r = admit(&l, 4000, Some(97)).unwrap_err();
        assert_eq!((r.limit, r.requested), (Limit::MaxModelLen, 4097));
        assert!(r.message().contains("engine.max_model_len is 4096"), "{}", r.message());
        assert_eq!(admit(&l, 4000, Some(96)), Ok(()));
    }

    #[test]
    fn absent_max_tokens_counts_one() {
        assert_eq!(admit(&L, 2000, None), Ok(()));
        let l = Limits { safe_max_prompt: None, ..L };
        assert_eq!(admit(&l, 3000, None).unwrap_err().requested, 3001);
    }

    #[test]
    fn zero_budget_says_no_prompt_is_safe() {
        let l = Limits { safe_max_prompt: Some(0), ..L };
        let r = admit(&l, 1, Some(1)).unwrap_err();
        assert!(r.message().contains("allows no prompt"), "{}", r.message());
    }

    #[test]
    fn prompt_alone_over_the_pool_says_shorten() {
        let l = Limits { safe_max_prompt: None, ..L };
        let r = admit(&l, 3000, Some(5)).unwrap_err();
        assert!(
            r.message().contains("shorten the prompt to at most 2999 tokens and lower max_tokens to at most 1"),
            "{}",
            r.message()
        );
    }

    /// Follow the advice of every refusal: the request it describes is then admitted.
    fn follow(l: &Limits, prompt: u64, max_tokens: u64) -> (u64, u64, usize) {
        let (mut p, mut m, mut refusals) = (prompt, max_tokens, 0);
        while let Err(r) = admit(l, p, Some(m)) {
            refusals += 1;
            assert!(refusals < 2, "the advice, followed, was refused again: {}", r.message());
            let msg = r.message();
            let at_most = |what: &str| {
                let i = msg.find(what)? + what.len();
                msg[i..].split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
            };
            if let Some(n) = at_most("shorten the prompt to at most ") {
                p = p.min(n);
            }
            if let Some(n) = at_most("lower max_tokens to at most ") {
                m = m.min(n);
            }
        }
        (p, m, refusals)
    }

    #[test]
    fn the_binding_limit_is_named_first_and_its_advice_admits() {
        // The case: a pool larger than max_model_len (512) and max_tokens 99999999.
        let l = Limits { max_model_len: 512, kv_pool_tokens: Some(65536), safe_max_prompt: Some(400) };
        let r = admit(&l, 3, Some(99_999_999)).unwrap_err();
        assert_eq!((r.limit, r.allowed), (Limit::MaxModelLen, 512), "{}", r.message());
        assert!(r.message().contains("lower max_tokens to at most 509"), "{}", r.message());
        for (p, m) in [(3, 99_999_999), (450, 100), (600, 10), (511, 5), (400, 200), (1, 1)] {
            for l in [l, Limits { kv_pool_tokens: Some(300), ..l }, Limits { safe_max_prompt: None, ..l }] {
                let (p2, m2, _) = follow(&l, p, m);
                assert!(p2 <= p && m2 <= m, "{p2} {m2}");
            }
        }
    }

    #[test]
    fn max_completion_tokens_wins() {
        assert_eq!(requested_max_tokens(&json!({"max_tokens": 5, "max_completion_tokens": 7})), Some(7));
        assert_eq!(requested_max_tokens(&json!({"max_tokens": 5})), Some(5));
        assert_eq!(requested_max_tokens(&json!({})), None);
    }
}
