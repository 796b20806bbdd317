//! Value parsers of the flags whose checks need no kit: clap runs them while it parses, so a bad
//! value stops the command before anything is read or started. Each error is the one line
//! `main` prints (`error: …`) and its fix (`hint: …`), as the checks in the commands said.

use crate::kit::bytes::{ByteSize, KIB};
use crate::kit::schema::GuardPolicy;

/// A flag value that is refused: the message names the flag and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FlagError {
    pub message: String,
    pub hint: String,
}

fn refuse(message: String, hint: impl Into<String>) -> FlagError {
    FlagError { message, hint: hint.into() }
}

fn whole<T: std::str::FromStr>(flag: &str, v: &str, hint: &str) -> Result<T, FlagError> {
    v.trim().parse().map_err(|_| refuse(format!("{flag} {v}: not a whole number"), hint))
}

fn number(flag: &str, v: &str, hint: &str) -> Result<f64, FlagError> {
    v.trim().parse().map_err(|_| refuse(format!("{flag} {v}: not a number"), hint))
}

/// `download --jobs`: 1 to 256 connections.
pub fn download_jobs(v: &str) -> Result<usize, FlagError> {
    const HINT: &str = "use 1 to 256 (default 16)";
    let n: usize = whole("--jobs", v, HINT)?;
    if (1..=256).contains(&n) {
        Ok(n)
    } else {
        Err(refuse(format!("--jobs {n} is out of range"), HINT))
    }
}

/// `download --range-size`: a byte size of at least 4 KiB and at most 10 GB (one range is one
/// reconstruction request on the Xet path: the protocol recommends batches of at most 10 GB).
pub fn range_size(v: &str) -> Result<ByteSize, FlagError> {
    const HINT: &str = "use e.g. 32MiB (the default)";
    let b: ByteSize = v.parse().map_err(|e| refuse(format!("--range-size: {e}"), HINT))?;
    if b.bytes() < 4 * KIB {
        return Err(refuse("--range-size is below 4KiB".into(), HINT));
    }
    if b.bytes() > 10_000_000_000 {
        return Err(refuse("--range-size is above 10GB (the largest Xet reconstruction batch)".into(), HINT));
    }
    Ok(b)
}

/// `download --idle-timeout`: at least one second.
pub fn idle_timeout(v: &str) -> Result<u64, FlagError> {
    const HINT: &str = "use e.g. --idle-timeout 60 (the default)";
    match whole("--idle-timeout", v, HINT)? {
        0 => Err(refuse("--idle-timeout 0: must be at least 1 second".into(), HINT)),
        n => Ok(n),
    }
}

/// `download --retries`: at least one attempt.
pub fn retries(v: &str) -> Result<u32, FlagError> {
    const HINT: &str = "use e.g. --retries 8 (the default)";
    match whole("--retries", v, HINT)? {
        0 => Err(refuse("--retries 0: must be at least 1 attempt".into(), HINT)),
        n => Ok(n),
    }
}

/// `bench --timeout`: a positive number of seconds.
pub fn bench_timeout(v: &str) -> Result<f64, FlagError> {
    const HINT: &str = "use e.g. --timeout 600";
    let t = number("--timeout", v, HINT)?;
    if t.is_finite() && t > 0.0 {
        Ok(t)
    } else {
        Err(refuse(format!("--timeout {t}: must be a positive number of seconds"), HINT))
    }
}

/// `bench --temperature`: 0 to 2.
pub fn temperature(v: &str) -> Result<f64, FlagError> {
    const HINT: &str = "use --temperature 0";
    let t = number("--temperature", v, HINT)?;
    if (0.0..=2.0).contains(&t) {
        Ok(t)
    } else {
        Err(refuse(format!("--temperature {t}: out of range 0..=2"), HINT))
    }
}

/// `bench --prefill-repeats`: at least one request per length.
pub fn prefill_repeats(v: &str) -> Result<u32, FlagError> {
    const HINT: &str = "use e.g. --prefill-repeats 3, or --prefill none to skip the ladder";
    match whole("--prefill-repeats", v, HINT)? {
        0 => Err(refuse("--prefill-repeats 0: need at least one request per length".into(), HINT)),
        n => Ok(n),
    }
}

/// `bench --decode-repeats`: 1 to 10000 waves.
pub fn decode_repeats(v: &str) -> Result<u32, FlagError> {
    const HINT: &str = "use e.g. --decode-repeats 1 (one wave per concurrency level)";
    let n: u32 = whole("--decode-repeats", v, HINT)?;
    if (1..=10_000).contains(&n) {
        Ok(n)
    } else {
        Err(refuse(format!("--decode-repeats {n}: out of range 1..=10000"), HINT))
    }
}

fn tokens(flag: &str, v: &str) -> Result<u64, FlagError> {
    let hint = format!("use e.g. {flag} 256");
    let n: u64 = whole(flag, v, &hint)?;
    if (1..=16 * 1024 * 1024).contains(&n) {
        Ok(n)
    } else {
        Err(refuse(format!("{flag} {n}: out of range 1..=16m"), hint))
    }
}

/// `bench --decode-tokens`: 1 to 16m.
pub fn decode_tokens(v: &str) -> Result<u64, FlagError> {
    tokens("--decode-tokens", v)
}

/// `bench --decode-prompt-tokens`: 1 to 16m.
pub fn decode_prompt_tokens(v: &str) -> Result<u64, FlagError> {
    tokens("--decode-prompt-tokens", v)
}

/// `guard --drain`: 0 to 600 seconds.
pub fn drain(v: &str) -> Result<f64, FlagError> {
    const HINT: &str = "give seconds between 0 and 600";
    let d = number("--drain", v, HINT)?;
    if (0.0..=600.0).contains(&d) {
        Ok(d)
    } else {
        Err(refuse(format!("--drain: {d} is out of range"), HINT))
    }
}

fn guard_size(flag: &str, v: &str) -> Result<u64, FlagError> {
    v.parse::<ByteSize>().map(|b| b.bytes()).map_err(|e| {
        refuse(format!("{flag}: {e}"), format!("e.g. {flag} 2.5GiB (units: B, KiB, MiB, GiB, kB, MB, GB)"))
    })
}

/// `guard --soft`: a byte size.
pub fn guard_soft(v: &str) -> Result<u64, FlagError> {
    guard_size("--soft", v)
}

/// `guard --hard`: a byte size.
pub fn guard_hard(v: &str) -> Result<u64, FlagError> {
    guard_size("--hard", v)
}

/// `guard --baseline`: a byte size.
pub fn guard_baseline(v: &str) -> Result<u64, FlagError> {
    guard_size("--baseline", v)
}

/// `guard --policy`: protect-host, kill-offender or off.
pub fn guard_policy(v: &str) -> Result<GuardPolicy, FlagError> {
    match v {
        "protect-host" => Ok(GuardPolicy::ProtectHost),
        "kill-offender" => Ok(GuardPolicy::KillOffender),
        "off" => Ok(GuardPolicy::Off),
        _ => Err(refuse(
            format!("--policy: `{v}` is not a guard policy"),
            "use protect-host (default), kill-offender or off",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_range_values_pass_and_the_rest_say_flag_value_and_fix() {
        assert_eq!(download_jobs("16"), Ok(16));
        assert_eq!(download_jobs("0").unwrap_err().message, "--jobs 0 is out of range");
        assert_eq!(download_jobs("x").unwrap_err().message, "--jobs x: not a whole number");
        assert_eq!(range_size("32MiB").unwrap().bytes(), 32 << 20);
        assert_eq!(range_size("1").unwrap_err().message, "--range-size is below 4KiB");
        assert_eq!(range_size("10GB").unwrap().bytes(), 10_000_000_000);
        assert!(range_size("10GiB").unwrap_err().message.starts_with("--range-size is above 10GB"));
        assert!(idle_timeout("0").is_err() && retries("0").is_err() && retries("2") == Ok(2));
        assert_eq!(bench_timeout("0").unwrap_err().message, "--timeout 0: must be a positive number of seconds");
        assert!(bench_timeout("inf").is_err() && bench_timeout("1.5") == Ok(1.5));
        assert_eq!(temperature("3").unwrap_err().message, "--temperature 3: out of range 0..=2");
        assert_eq!(decode_repeats("0").unwrap_err().message, "--decode-repeats 0: out of range 1..=10000");
        assert_eq!(decode_tokens("0").unwrap_err().message, "--decode-tokens 0: out of range 1..=16m");
        assert_eq!(decode_prompt_tokens("256"), Ok(256));
        assert!(prefill_repeats("0").is_err() && prefill_repeats("3") == Ok(3));
        assert_eq!(drain("601").unwrap_err().message, "--drain: 601 is out of range");
        assert_eq!(drain("2.5"), Ok(2.5));
        assert_eq!(guard_soft("1KiB"), Ok(1024));
        assert_eq!(guard_hard("x").unwrap_err().hint, "e.g. --hard 2.5GiB (units: B, KiB, MiB, GiB, kB, MB, GB)");
        assert!(guard_baseline("2GiB").is_ok() && guard_policy("off") == Ok(GuardPolicy::Off));
        assert_eq!(guard_policy("x").unwrap_err().message, "--policy: `x` is not a guard policy");
    }
}
