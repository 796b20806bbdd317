//! How to run a command on a node: directly (`local`), through the OpenSSH client in batch mode
//! (`ssh`), or behind a command prefix (`exec`, e.g. `ip netns exec spark2`). Pure command
//! construction, unit-tested.

use std::process::Command;

use crate::kit::schema::{Node, Transport};

/// Quote one argument for a POSIX shell (the remote side of ssh runs a shell).
#[must_use]
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+%^".contains(&b)) {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', r#"'\''"#))
}

/// The full argument vector that runs `argv` on `node`.
#[must_use]
pub fn wrap(node: &Node, argv: &[String]) -> Vec<String> {
    match node.transport {
        Transport::Local => argv.to_vec(),
        Transport::Exec => node.exec_prefix.iter().cloned().chain(argv.iter().cloned()).collect(),
        Transport::Ssh => {
            let mut out = ssh_base(node);
            out.push(ssh_target(node));
            out.push("--".into());
            out.push(argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "));
            out
        }
    }
}

/// The OpenSSH client with spark-kit's options and the node's own: batch mode (never a password
/// prompt), connect timeout, keep-alives, port, `ssh_options`. Without the target.
#[must_use]
pub fn ssh_base(node: &Node) -> Vec<String> {
    let mut out: Vec<String> = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5"]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
    out.extend(["-o".into(), "ServerAliveCountMax=3".into(), "-p".into(), node.ssh_port.to_string()]);
    out.extend(node.ssh_options.iter().cloned());
    out
}

/// `user@host` (or `host`) of an ssh node.
#[must_use]
pub fn ssh_target(node: &Node) -> String {
    let host = node.ssh_host.clone().unwrap_or_default();
    match &node.ssh_user {
        Some(u) if !u.is_empty() => format!("{u}@{host}"),
        _ => host,
    }
}

/// A `Command` running `argv` on `node`.
#[must_use]
pub fn command(node: &Node, argv: &[String]) -> Command {
    let full = wrap(node, argv);
    let mut cmd = Command::new(&full[0]);
    cmd.args(&full[1..]);
    cmd
}

/// `sh -c SCRIPT` on the node (the script sees the node's own `$HOME`).
#[must_use]
pub fn shell(node: &Node, script: &str) -> Command {
    command(node, &["sh".to_string(), "-c".to_string(), script.to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(t: Transport) -> Node {
        Node {
            name: "w".into(),
            transport: t,
            ssh_host: Some("10.0.0.2".into()),
            ssh_user: Some("root".into()),
            ssh_options: vec!["-i".into(), "/k".into()],
            exec_prefix: vec!["ip".into(), "netns".into(), "exec".into(), "spark2".into()],
            ..Node::default()
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc-1.2/x"), "abc-1.2/x");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn wraps_per_transport() {
        let argv = vec!["spark-kit".to_string(), "node".into(), "--rank".into(), "1".into()];
        assert_eq!(wrap(&node(Transport::Local), &argv), argv);
        assert_eq!(wrap(&node(Transport::Exec), &argv)[..5], ["ip", "netns", "exec", "spark2", "spark-kit"]);
        let ssh = wrap(&node(Transport::Ssh), &argv);
        assert_eq!(ssh[0], "ssh");
        assert!(ssh.contains(&"BatchMode=yes".to_string()));
        assert_eq!(ssh[ssh.len() - 3..], ["root@10.0.0.2", "--", "spark-kit node --rank 1"]);
        assert!(ssh.windows(2).any(|w| w == ["-i", "/k"]));
    }
}
