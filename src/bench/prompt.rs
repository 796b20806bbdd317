//! Benchmark prompts: salted so no two requests share a cacheable prefix, sized in tokens (pure).

/// Common words that tokenize to about one token each in most vocabularies.
const WORDS: &[&str] = &[
    "the", "river", "bends", "past", "an", "old", "mill", "where", "children", "count", "boats", "and", "clouds",
    "drift", "over", "green", "hills", "while", "a", "baker", "sells", "warm", "bread", "to", "people", "who", "walk",
    "slowly", "home", "after", "work", "in", "small", "town", "near", "sea", "light", "falls", "on", "stone", "roofs",
    "birds", "sing", "from", "tall", "trees", "by", "road", "every", "morning", "is", "quiet", "then", "market",
    "opens", "with", "fresh", "fruit", "fish", "soft", "music",
];

/// The instruction that precedes the filler (the salt goes before it).
const LEAD: &str = "Continue this story without stopping:";

/// A prompt of `words` filler words after the salt, deterministic for a given salt and count.
///
/// The salt (a UUID) is the first thing in the message, so the prefix cache cannot reuse any
/// block of the prompt across requests.
#[must_use]
pub fn salted(salt: &str, words: usize) -> String {
    let mut s = String::with_capacity(salt.len() + LEAD.len() + words * 6 + 2);
    s.push_str(salt);
    s.push(' ');
    s.push_str(LEAD);
    // A small LCG seeded from the salt: the text differs per request but needs no RNG.
    let mut x: u64 = salt.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    for _ in 0..words {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        // The high bits of an LCG are the well-mixed ones; the modulus keeps the index in range.
        #[allow(clippy::cast_possible_truncation)]
        let i = ((x >> 33) % WORDS.len() as u64) as usize;
        s.push(' ');
        s.push_str(WORDS[i]);
    }
    s
}

/// The next filler word count when `words` words measured `measured` tokens and `target` is wanted.
///
/// Scales linearly around the fixed overhead (salt, instruction, chat template) estimated from
/// `base` = the token count of the prompt with no filler words.
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn next_words(target: u64, words: usize, measured: u64, base: u64) -> usize {
    if measured <= base || words == 0 {
        return target.saturating_sub(base).max(1) as usize;
    }
    let per_word = (measured - base) as f64 / words as f64;
    let want = (target.saturating_sub(base) as f64 / per_word).round();
    (want.max(1.0) as usize).max(1)
}

/// Close enough to the target: within 1 % or 2 tokens (salts tokenize to slightly different lengths).
#[must_use]
pub fn close_enough(target: u64, measured: u64) -> bool {
    measured.abs_diff(target) <= (target / 100).max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salted_prompts_start_with_the_salt_and_differ() {
        let a = salted("aaaa-1", 50);
        let b = salted("bbbb-2", 50);
        assert!(a.starts_with("aaaa-1 Continue"));
        assert_eq!(a.split_whitespace().count(), 1 + 5 + 50);
        assert_ne!(a.split_once(':').unwrap().1, b.split_once(':').unwrap().1);
        assert_eq!(a, salted("aaaa-1", 50), "deterministic");
    }

    #[test]
    fn word_count_converges() {
        // A tokenizer that makes 1.5 tokens per word plus 20 tokens of overhead.
        let tokens = |w: usize| 20 + (w as u64 * 3) / 2;
        let target = 1000;
        let mut w = next_words(target, 0, 0, tokens(0));
        for _ in 0..3 {
            if close_enough(target, tokens(w)) {
                break;
            }
            w = next_words(target, w, tokens(w), tokens(0));
        }
        assert!(close_enough(target, tokens(w)), "{w} words -> {}", tokens(w));
        assert!(close_enough(100, 102) && !close_enough(100, 103));
    }
}
