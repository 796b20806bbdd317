//! Parsing of the sweep lists given on the command line (pure).

/// Why a sweep list does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("`{0}` is not a whole number of streams")]
    NotStreams(String),
    #[error("{0} streams is out of range 1..=4096")]
    Streams(u32),
    #[error("`{0}` is not a token count (examples: 512, 8k, 1m)")]
    NotTokens(String),
    #[error("{0} tokens is out of range 16..=16m")]
    Tokens(u64),
}

/// Parse `1,2,4` into ascending, de-duplicated concurrency levels (each ≥ 1).
pub fn parse_concurrency(text: &str) -> Result<Vec<u32>, SizeError> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        let n: u32 = part.parse().map_err(|_| SizeError::NotStreams(part.into()))?;
        if n == 0 || n > 4096 {
            return Err(SizeError::Streams(n));
        }
        out.push(n);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Parse `1k,8k,300000` into ascending, de-duplicated prompt lengths in tokens.
///
/// `k` = ×1024 and `m` = ×1024² (either case); `none` (or an empty string) = no prefill ladder.
pub fn parse_lengths(text: &str) -> Result<Vec<u64>, SizeError> {
    let text = text.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        out.push(parse_length(part)?);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn parse_length(part: &str) -> Result<u64, SizeError> {
    let bad = || SizeError::NotTokens(part.into());
    let (digits, mult) = match part.char_indices().last() {
        Some((i, 'k' | 'K')) => (&part[..i], 1024),
        Some((i, 'm' | 'M')) => (&part[..i], 1024 * 1024),
        _ => (part, 1),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let n = n.checked_mul(mult).ok_or_else(bad)?;
    if !(16..=16 * 1024 * 1024).contains(&n) {
        return Err(SizeError::Tokens(n));
    }
    Ok(n)
}

/// Short label for a length: `8k` for multiples of 1024, else the number.
#[must_use]
pub fn length_label(n: u64) -> String {
    if n >= 1024 && n % (1024 * 1024) == 0 {
        format!("{}m", n / (1024 * 1024))
    } else if n >= 1024 && n % 1024 == 0 {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_sorted_unique() {
        assert_eq!(parse_concurrency("4, 1,2,2").unwrap(), vec![1, 2, 4]);
        assert!(parse_concurrency("0").unwrap_err().to_string().contains("out of range"));
        assert!(parse_concurrency("1,x").unwrap_err().to_string().contains("`x`"));
        assert!(parse_concurrency("").is_err());
    }

    #[test]
    fn lengths_with_suffixes() {
        assert_eq!(parse_lengths("8k,1k,300000,1K").unwrap(), vec![1024, 8192, 300_000]);
        assert_eq!(parse_lengths("1m").unwrap(), vec![1_048_576]);
        assert_eq!(parse_lengths("none").unwrap(), Vec::<u64>::new());
        assert_eq!(parse_lengths("").unwrap(), Vec::<u64>::new());
        assert!(parse_lengths("8q").unwrap_err().to_string().contains("`8q`"));
        assert!(parse_lengths("4").unwrap_err().to_string().contains("out of range"));
        assert!(parse_lengths("99999999999999999999k").is_err());
        assert_eq!(length_label(8192), "8k");
        assert_eq!(length_label(300), "300");
        assert_eq!(length_label(2 * 1024 * 1024), "2m");
    }
}
