//! Facts about the machine running the benchmark, and UTC timestamps, for the receipt.

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

pub use crate::clock::now_rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

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
