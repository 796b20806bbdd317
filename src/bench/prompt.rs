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
/// block of the prompt across requests. With no filler words the prompt is the salt alone (the
/// shortest prompt possible).
#[must_use]
pub fn salted(salt: &str, words: usize) -> String {
    let mut s = String::with_capacity(salt.len() + LEAD.len() + words * 6 + 2);
    s.push_str(salt);
    if words == 0 {
        return s;
    }
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

/// Filler words at which the two calibration probes of [`Tokens::from_probes`] are taken.
pub const PROBE_WORDS: [usize; 2] = [16, 216];

/// A linear model of a tokenizer on salted prompts: tokens ≈ `intercept + per_word × words`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tokens {
    pub intercept: f64,
    pub per_word: f64,
}

impl Tokens {
    /// From the token counts of prompts with [`PROBE_WORDS`] filler words.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn from_probes(small: u64, large: u64) -> Self {
        let span = (PROBE_WORDS[1] - PROBE_WORDS[0]) as f64;
        let per_word = ((large as f64 - small as f64) / span).max(0.05);
        Self { intercept: small as f64 - per_word * PROBE_WORDS[0] as f64, per_word }
    }

    /// Without a tokenizer: one token per word plus a guessed overhead.
    #[must_use]
    pub fn guess() -> Self {
        Self { intercept: 16.0, per_word: 1.0 }
    }

    /// Filler words expected to give `target` tokens (0 when even the salt alone is longer).
    #[must_use]
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn words_for(&self, target: u64) -> usize {
        ((target as f64 - self.intercept) / self.per_word).round().max(0.0) as usize
    }

    /// The next word count after `words` words measured `measured` tokens (moves at least one word).
    #[must_use]
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss
    )]
    pub fn adjust(&self, target: u64, words: usize, measured: u64) -> usize {
        let mut step = ((target as f64 - measured as f64) / self.per_word).round() as i64;
        if step == 0 {
            step = if target > measured { 1 } else { -1 };
        }
        (words as i64 + step).max(0) as usize
    }
}

/// Close enough to the target: within 1 % or 2 tokens.
#[must_use]
pub fn close_enough(target: u64, measured: u64) -> bool {
    measured.abs_diff(target) <= (target / 100).max(2)
}

/// Measurements per salt before a fresh salt is tried, and salts tried in all.
const FIT_TRIES: usize = 4;
const FIT_SALTS: usize = 4;

/// Fitting a prompt's filler to a token target with the server's tokenizer (pure). One word more
/// can add several tokens (a salt whose filler has no count close enough to the target), so
/// after [`FIT_TRIES`] measurements of one salt a fresh one is tried, up to [`FIT_SALTS`]; the
/// closest prompt measured is kept either way.
#[derive(Debug, Clone)]
pub struct Fit {
    target: u64,
    model: Tokens,
    start: usize,
    salt: usize,
    tries: usize,
    /// (distance to the target, salt, words) of the closest prompt measured.
    best: Option<(u64, usize, usize)>,
}

/// What to do after a measurement: measure `words` filler words of salt number `salt`
/// (0, 1, …: the caller makes a fresh salt for each new number), or take the closest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitStep {
    Measure { salt: usize, words: usize },
    Done { salt: usize, words: usize },
}

impl Fit {
    /// Start at `words` filler words (the model's guess, or what fitted this target before).
    #[must_use]
    pub fn new(target: u64, model: Tokens, words: usize) -> Self {
        Self { target, model, start: words, salt: 0, tries: 0, best: None }
    }

    /// The first prompt to measure.
    #[must_use]
    pub fn first(&self) -> FitStep {
        FitStep::Measure { salt: 0, words: self.start }
    }

    /// `words` filler words of the current salt measured `measured` tokens.
    pub fn measured(&mut self, words: usize, measured: u64) -> FitStep {
        let d = measured.abs_diff(self.target);
        if self.best.is_none_or(|(bd, _, _)| d < bd) {
            self.best = Some((d, self.salt, words));
        }
        self.tries += 1;
        let at_floor = words == 0 && measured > self.target;
        if close_enough(self.target, measured) || at_floor {
            return FitStep::Done { salt: self.salt, words };
        }
        if self.tries < FIT_TRIES {
            return FitStep::Measure { salt: self.salt, words: self.model.adjust(self.target, words, measured) };
        }
        if self.salt + 1 < FIT_SALTS {
            self.salt += 1;
            self.tries = 0;
            return FitStep::Measure { salt: self.salt, words: self.start };
        }
        let (_, salt, words) = self.best.unwrap_or((0, self.salt, words));
        FitStep::Done { salt, words }
    }
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
        let model = Tokens::from_probes(tokens(PROBE_WORDS[0]), tokens(PROBE_WORDS[1]));
        assert!((model.per_word - 1.5).abs() < 1e-9 && (model.intercept - 20.0).abs() < 1e-9);
        for target in [24, 64, 1000, 100_000] {
            let mut w = model.words_for(target);
            for _ in 0..3 {
                if close_enough(target, tokens(w)) {
                    break;
                }
                w = model.adjust(target, w, tokens(w));
            }
            assert!(close_enough(target, tokens(w)), "{target}: {w} words -> {}", tokens(w));
        }
        assert_eq!(model.words_for(5), 0, "shorter than the overhead: the salt alone");
        assert_eq!(model.adjust(100, 10, 100), 9, "moves at least one word");
        assert!(close_enough(100, 102) && !close_enough(100, 103));
        assert_eq!(salted("abc", 0), "abc");
    }

    /// Runs a fit against `tokens(salt, words)` (6 tokens a word); the (salt, words) it settles on and
    /// how many prompts it measured.
    fn run_fit(target: u64, start: usize, tokens: impl Fn(usize, usize) -> u64) -> ((usize, usize), usize) {
        let mut fit = Fit::new(target, Tokens { intercept: 20.0, per_word: 6.0 }, start);
        let mut step = fit.first();
        let mut n = 0;
        loop {
            match step {
                FitStep::Measure { salt, words } => {
                    n += 1;
                    assert!(n <= FIT_TRIES * FIT_SALTS, "no end after {n} measurements");
                    step = fit.measured(words, tokens(salt, words));
                }
                FitStep::Done { salt, words } => return ((salt, words), n),
            }
        }
    }

    #[test]
    fn a_salt_whose_filler_jumps_past_the_target_is_replaced_and_the_closest_kept() {
        // Salt 0 counts 125 or 131 around 128 (3 away either way); salt 1 hits 128 at 18 words.
        let tokens = |salt: usize, w: usize| if salt == 0 { 23 } else { 20 } + 6 * w as u64;
        let ((salt, words), n) = run_fit(128, 18, tokens);
        assert_eq!((salt, words, tokens(salt, words)), (1, 18, 128), "after {n} measurements");
        assert_eq!(n, FIT_TRIES + 1);
        // No salt fits: the closest measured prompt is taken, after every salt was tried.
        let ((salt, words), n) = run_fit(128, 18, |_, w| 23 + 6 * w as u64);
        assert_eq!((23 + 6 * words as u64, salt, n), (131, 0, FIT_TRIES * FIT_SALTS), "the first of the closest");
        // The first measurement close enough ends it.
        assert_eq!(run_fit(128, 18, |_, w| 20 + 6 * w as u64), ((0, 18), 1));
        // Even the salt alone is longer than the target: no filler, at once.
        assert_eq!(run_fit(10, 0, |_, w| 20 + 6 * w as u64), ((0, 0), 1));
    }
}
