//! Process groups from `/proc`: who is still in the engine's group. Parsing is pure.

use std::fs;

/// The fields of `/proc/<pid>/stat` spark-kit uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
}

/// Parse one `/proc/<pid>/stat` line. `comm` may contain spaces and parentheses, so the
/// fields after it are found from the last `)`.
#[must_use]
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let comm = line.get(open + 1..close)?.to_string();
    let mut rest = line.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some(Stat { pid, comm, state, ppid, pgrp })
}

/// Every live (non-zombie) process whose process group is `pgid`.
#[must_use]
pub fn members(pgid: i32) -> Vec<Stat> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s))
        .filter(|s| s.pgrp == pgid && s.state != 'Z')
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comm_with_spaces_and_parens() {
        let s = parse_stat("4242 (VLLM::Worker (TP0)) S 4200 4100 4100 0 -1 4194560 1 0").unwrap();
        assert_eq!(s, Stat { pid: 4242, comm: "VLLM::Worker (TP0)".into(), state: 'S', ppid: 4200, pgrp: 4100 });
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S").is_none());
    }

    #[test]
    fn finds_own_group() {
        let me = std::process::id() as i32;
        let pgid = nix::unistd::getpgrp().as_raw();
        assert!(members(pgid).iter().any(|s| s.pid == me));
    }
}
