//! Two "nodes" on one machine: two network namespaces joined by a veth pair (`veth-spark1`
//! 10.77.0.1 in the first, `veth-spark2` 10.77.0.2 in the second, as the two-node kits name
//! them), a real sshd in each; commands run in a namespace with `ip netns exec` (which also
//! mounts a `/sys` of that namespace, so preflight sees its interfaces). Each test binary uses
//! its own namespace names, so two of them can run side by side. Torn down on drop, and stale
//! namespaces of the same names (a killed run) at start.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub const HEAD_IP: &str = "10.77.0.1";
pub const WORKER_IP: &str = "10.77.0.2";

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Why a two-namespace e2e test cannot run here (SPARK_KIT_TEST_E2E unset, not root, tools
/// missing), if it cannot.
pub fn skip_reason() -> Option<String> {
    if std::env::var_os("SPARK_KIT_TEST_E2E").is_none() {
        return Some("SPARK_KIT_TEST_E2E is not set (run `bash tests/run-all.sh`)".into());
    }
    super::sshd::skip_reason(&["ip"])
}

/// The two namespaces, the veth pair and sshd.
pub struct Net {
    /// (head's, worker's) namespace.
    pub ns: [&'static str; 2],
    pub dir: tempfile::TempDir,
    sshd: Vec<Child>,
}

impl Net {
    /// Namespaces `ns`, joined; an sshd in each, with `sshd_extra[i]` appended to its config
    /// (e.g. `SetEnv DOCKER_HOST=…`: what that node's sessions, its agent among them, see).
    pub fn up(ns: [&'static str; 2], sshd_extra: [&str; 2]) -> Self {
        teardown(ns);
        sh(&["ip", "netns", "add", ns[0]]);
        sh(&["ip", "netns", "add", ns[1]]);
        sh(&[
            "ip",
            "link",
            "add",
            "veth-spark1",
            "netns",
            ns[0],
            "type",
            "veth",
            "peer",
            "name",
            "veth-spark2",
            "netns",
            ns[1],
        ]);
        for (ns, dev, ip) in [(ns[0], "veth-spark1", HEAD_IP), (ns[1], "veth-spark2", WORKER_IP)] {
            sh(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        super::sshd::make_keys(d, &[HEAD_IP.into(), WORKER_IP.into()]);
        // A real sshd in each namespace: the supervisor reaches the worker over ssh, and
        // preflight checks ssh both ways (worker → head too).
        let sshd = [(ns[0], HEAD_IP, sshd_extra[0]), (ns[1], WORKER_IP, sshd_extra[1])]
            .iter()
            .map(|(n, ip, extra)| super::sshd::spawn_with(d, ip, n, &["ip", "netns", "exec", n], extra))
            .collect();
        let net = Self { ns, dir, sshd };
        let t = Instant::now();
        while !net.ssh_ok() {
            assert!(t.elapsed() < Duration::from_secs(20), "sshd in {} did not come up", ns[1]);
            std::thread::sleep(Duration::from_millis(300));
        }
        net
    }

    fn ssh_ok(&self) -> bool {
        self.exec(0, "ssh")
            .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=3"])
            .args(self.ssh_opts())
            .args([&format!("root@{WORKER_IP}"), "true"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// `program` in node `node`'s namespace (0: head, 1: worker).
    pub fn exec(&self, node: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.ns[node]]).arg(program);
        cmd
    }

    pub fn ssh_opts(&self) -> Vec<String> {
        super::sshd::client_opts(self.dir.path())
    }

    pub fn logs(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    /// `spark-kit <args> --kit <kit> …` in the head's namespace: the test's logs dir and ssh
    /// options, boot silence judged on 300 s (boots on a loaded 2-core machine can be quiet for
    /// over a minute), a serving stall on 20 s, a 3 s stop window; a clean `SPARK_KIT_*`
    /// environment (test variables and the cache kept).
    pub fn spark(&self, kit: &str, args: &[&str]) -> Command {
        let mut cmd = self.exec(0, env!("CARGO_BIN_EXE_spark-kit"));
        cmd.args(args);
        cmd.args(["--kit", kit, "--set", &format!("paths.logs={}", self.logs().display())]);
        cmd.args(["--set", &format!("nodes.1.ssh_options=[{}]", self.ssh_opts().join(", "))]);
        cmd.args(["--set", &format!("nodes.0.ssh_options=[{}]", self.ssh_opts().join(", "))]);
        cmd.args(["--set", "engine.hang_timeout_s=300", "--set", "engine.stall_timeout_s=20"]);
        cmd.args(["--set", "engine.shutdown_timeout_s=3"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("SPARK_KIT_") && !k.starts_with("SPARK_KIT_TEST_") && k != "SPARK_KIT_CACHE" {
                cmd.env_remove(k);
            }
        }
        cmd
    }

    /// `pid (comm)` of every engine or spark-kit process in either namespace.
    pub fn leftovers(&self) -> Vec<String> {
        self.ns
            .iter()
            .flat_map(|ns| {
                let o = Command::new("ip").args(["netns", "pids", ns]).output().unwrap();
                String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect::<Vec<_>>()
            })
            .filter_map(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                let comm = comm.trim();
                (comm.starts_with("VLLM") || comm.starts_with("spark-kit")).then(|| format!("{pid} ({comm})"))
            })
            .collect()
    }

    /// No engine or spark-kit process left in either namespace within 30 s (a node agent that
    /// lost its supervisor stops its engine, then exits).
    pub fn assert_no_leftovers(&self) {
        let t = Instant::now();
        loop {
            let left = self.leftovers();
            if left.is_empty() {
                eprintln!("no process left in the namespaces after {:.1} s", t.elapsed().as_secs_f64());
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "processes left in the namespaces after 30 s: {left:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Kill every process in the namespaces `ns` and delete them (stale ones of a killed run too).
pub fn teardown(ns: [&str; 2]) {
    for ns in ns {
        let _ = Command::new("ip").args(["netns", "pids", ns]).output().map(|o| {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        });
        if std::path::Path::new("/run/netns").join(ns).exists() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.sshd {
            let _ = c.kill();
            let _ = c.wait();
        }
        teardown(self.ns);
    }
}
