//! A real OpenSSH server for tests: keys made by the test, a config in a temp dir, started
//! directly or behind a command prefix (`ip netns exec NS`); client options that trust only it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Why sshd-based tests cannot run here (not root, tools missing).
pub fn skip_reason(extra_tools: &[&str]) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root to run sshd".into());
    }
    for tool in ["sshd", "ssh-keygen", "ssh"].iter().chain(extra_tools) {
        let found = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().any(|d| Path::new(d).join(tool).exists());
        if !found {
            return Some(format!("{tool} is missing (tests/apt-packages.txt lists the packages)"));
        }
    }
    None
}

/// Host and client keys in `dir`; the client key is authorised; `hosts` (`10.0.0.2` or
/// `[127.0.0.1]:2222`) are trusted with the host key.
pub fn make_keys(dir: &Path, hosts: &[String]) {
    for key in ["host", "id"] {
        let ok = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(dir.join(key)).status();
        assert!(ok.unwrap().success(), "ssh-keygen failed");
    }
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    let host_pub = std::fs::read_to_string(dir.join("host.pub")).unwrap();
    let known: String = hosts.iter().map(|h| format!("{h} {host_pub}")).collect();
    std::fs::write(dir.join("known_hosts"), known).unwrap();
}

/// Start `sshd -D` listening on `listen` (`ip` or `ip:port`), prefixed by `prefix` (e.g.
/// `["ip", "netns", "exec", "spark2"]`); `name` tells its files apart.
pub fn spawn(dir: &Path, listen: &str, name: &str, prefix: &[&str]) -> Child {
    spawn_with(dir, listen, name, prefix, "")
}

/// [`spawn`] with extra `sshd_config` lines (e.g. `SetEnv DOCKER_HOST=…` for a second daemon).
pub fn spawn_with(dir: &Path, listen: &str, name: &str, prefix: &[&str], extra: &str) -> Child {
    let cfg = format!(
        "ListenAddress {listen}\nHostKey {0}/host\nAuthorizedKeysFile {0}/authorized_keys\nPidFile {0}/sshd-{name}.pid\n\
         PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\nUsePAM no\nPrintMotd no\n{extra}",
        dir.display()
    );
    let conf = dir.join(format!("sshd_config-{name}"));
    std::fs::write(&conf, cfg).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let bin = if Path::new("/usr/sbin/sshd").exists() { "/usr/sbin/sshd" } else { "/sbin/sshd" };
    let mut argv: Vec<&str> = prefix.to_vec();
    argv.extend([bin, "-D", "-e", "-f"]);
    Command::new(argv[0])
        .args(&argv[1..])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("sshd-{name}.log"))).unwrap())
        .spawn()
        .unwrap()
}

/// ssh client options that use the test key and trust only the test host key.
pub fn client_opts(dir: &Path) -> Vec<String> {
    let path = |f: &str| -> PathBuf { dir.join(f) };
    vec![
        "-i".into(),
        path("id").display().to_string(),
        "-o".into(),
        format!("UserKnownHostsFile={}", path("known_hosts").display()),
        "-o".into(),
        "StrictHostKeyChecking=yes".into(),
    ]
}
