//! `/proc/meminfo`: the counters the guard trusts on GB10 (gb10-ops.md §1.2). Parsing is pure
//! and allocation-free, so the guard's hot path can run it on a preallocated buffer.

use serde::Serialize;

/// The `/proc/meminfo` fields the guard and the planner use, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Meminfo {
    pub mem_total: u64,
    /// What CUDA calls "free" on GB10 (`cudaMemGetInfo` free = MemFree).
    pub mem_free: u64,
    /// The kernel's estimate of memory available without swapping; tracks vLLM on GB10.
    pub mem_available: u64,
    pub cached: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// Parse `/proc/meminfo` text. `None` unless MemTotal, MemFree and MemAvailable are present.
#[must_use]
pub fn parse(text: &[u8]) -> Option<Meminfo> {
    let mut m = Meminfo::default();
    let (mut total, mut free, mut avail) = (false, false, false);
    for line in text.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let (key, rest) = (&line[..colon], &line[colon + 1..]);
        let slot = match key {
            b"MemTotal" => {
                total = true;
                &mut m.mem_total
            }
            b"MemFree" => {
                free = true;
                &mut m.mem_free
            }
            b"MemAvailable" => {
                avail = true;
                &mut m.mem_available
            }
            b"Cached" => &mut m.cached,
            b"SwapTotal" => &mut m.swap_total,
            b"SwapFree" => &mut m.swap_free,
            _ => continue,
        };
        *slot = kib_value(rest)?.checked_mul(1024)?;
    }
    (total && free && avail).then_some(m)
}

/// `"   123456 kB"` → 123456.
fn kib_value(rest: &[u8]) -> Option<u64> {
    let mut digits = rest.iter().skip_while(|b| b.is_ascii_whitespace()).peekable();
    digits.peek()?.is_ascii_digit().then_some(())?;
    let mut v: u64 = 0;
    for &b in digits.take_while(|b| b.is_ascii_digit()) {
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB10_LOADED: &str = include_str!("../../tests/fixtures/node/gb10-healthy/proc/meminfo");

    #[test]
    fn parses_recorded_gb10_meminfo() {
        let m = parse(GB10_LOADED.as_bytes()).unwrap();
        assert_eq!(m.mem_total, 127_601_076 * 1024);
        assert_eq!(m.mem_free, 118_020_344 * 1024);
        assert_eq!(m.mem_available, 121_552_908 * 1024);
        assert_eq!(m.cached, 3_020_104 * 1024);
        assert_eq!(m.swap_total, 16_777_212 * 1024);
        assert_eq!(m.swap_free, 16_777_212 * 1024);
    }

    #[test]
    fn missing_or_garbled_fields_are_refused() {
        assert_eq!(parse(b"MemTotal: 1 kB\nMemFree: 1 kB\n"), None);
        assert_eq!(parse(b"MemTotal: x kB\nMemFree: 1 kB\nMemAvailable: 1 kB\n"), None);
        assert_eq!(parse(b""), None);
        let m = parse(b"MemTotal: 4 kB\nMemFree: 2 kB\nMemAvailable: 3 kB\n").unwrap();
        assert_eq!((m.mem_total, m.mem_free, m.mem_available, m.swap_total), (4096, 2048, 3072, 0));
    }
}
