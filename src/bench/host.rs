//! Facts about the machine running the benchmark, and UTC timestamps, for the receipt.

use std::time::{SystemTime, UNIX_EPOCH};

use super::result::Host;

/// Read the host facts from /proc and /etc (missing ones are `None`).
#[must_use]
pub fn facts() -> Host {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let trimmed = |p: &str| read(p).map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    Host {
        hostname: trimmed("/proc/sys/kernel/hostname"),
        os: read("/etc/os-release").as_deref().and_then(os_pretty_name),
        kernel: trimmed("/proc/sys/kernel/osrelease"),
        arch: std::env::consts::ARCH.to_string(),
        cpu: read("/proc/cpuinfo").as_deref().and_then(cpu_model),
        cpus: std::thread::available_parallelism().ok().map(|n| n.get() as u64),
        memory_bytes: read("/proc/meminfo").as_deref().and_then(crate::plan::parse_meminfo).map(|(total, _)| total),
    }
}

/// `PRETTY_NAME` from os-release text.
#[must_use]
pub fn os_pretty_name(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
}

/// The first `model name` (x86) or `Model`/`CPU part` line of /proc/cpuinfo.
#[must_use]
pub fn cpu_model(text: &str) -> Option<String> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string()).filter(|v| !v.is_empty())
        })
    };
    field("model name").or_else(|| field("Model")).or_else(|| field("CPU part").map(|p| format!("CPU part {p}")))
}

/// Now as RFC 3339 UTC with milliseconds, e.g. `2026-12-02T13:36:53.120Z`.
#[must_use]
pub fn now_rfc3339() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_millis())
}

/// Format seconds since the Unix epoch (UTC) as RFC 3339.
#[must_use]
pub fn rfc3339(secs: u64, millis: u32) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (era arithmetic over 400-year cycles).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_218_613, 120), "2026-12-02T13:36:53.120Z");
        assert_eq!(rfc3339(4_107_542_399, 999), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn host_text_parsers() {
        assert_eq!(
            os_pretty_name("NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 12\"\n").as_deref(),
            Some("Debian GNU/Linux 12")
        );
        assert_eq!(os_pretty_name("NAME=x\n"), None);
        assert_eq!(cpu_model("processor\t: 0\nmodel name\t: AMD EPYC\n").as_deref(), Some("AMD EPYC"));
        assert_eq!(cpu_model("CPU part\t: 0xd85\n").as_deref(), Some("CPU part 0xd85"));
    }
}
