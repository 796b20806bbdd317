//! Live deployments on this machine. Every supervisor (foreground or detached `up`) registers
//! itself in `<cache>/run/<kit>-<pid>.json`: its kit name, the `--kit` it was started with, its
//! control socket and the effective kit (every layer applied). `status`, `logs` and `down` find
//! a running deployment there when no `--kit` is given (or when the kit's own socket path, from
//! the current environment and flags, does not answer), and list them when there are several.
//!
//! The record is written to a temporary file and renamed into place; it is removed when the
//! supervisor exits; a record whose process is gone is stale and removed by the next reader.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::dirs::logs_dir;
use crate::dirs::Dirs;
use crate::hints::KitRef;
use crate::kit::schema::Kit;
use crate::supervisor::control::{request, socket_path};
use crate::supervisor::Snapshot;

/// One running supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    /// The kit's name (`status` shows it).
    pub kit_name: String,
    /// `--kit` as the user gave it (`None`: the default kit); a kit file is made absolute.
    pub kit_arg: Option<String>,
    pub socket: PathBuf,
    pub pid: u32,
    pub endpoint: String,
    /// The effective kit the supervisor runs (so `logs` reads the nodes it really started).
    pub kit: Kit,
}

/// The registry directory.
#[must_use]
pub fn run_dir(dirs: &Dirs) -> PathBuf {
    dirs.cache.join("run")
}

fn record_path(dir: &Path, kit: &str, pid: u32) -> PathBuf {
    dir.join(format!("{kit}-{pid}.json"))
}

/// The `--kit` to record: a kit file becomes absolute (it is read from any directory later).
#[must_use]
pub fn recorded_arg(arg: Option<&str>) -> Option<String> {
    let a = arg?;
    if crate::kit::builtin::find(a).is_some() {
        return Some(a.to_string());
    }
    Some(std::fs::canonicalize(a).map_or_else(|_| a.to_string(), |p| p.display().to_string()))
}

/// Register a supervisor; returns the record's path (remove it with [`unregister`]).
pub fn register(dir: &Path, rec: &Record) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = record_path(dir, &rec.kit_name, rec.pid);
    let tmp = dir.join(format!(".{}-{}.json.tmp", rec.kit_name, rec.pid));
    let text = serde_json::to_string_pretty(rec).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Remove a record (missing is fine).
pub fn unregister(path: &Path) {
    let _ = std::fs::remove_file(path);
}

fn pid_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else { return false };
    // Signal 0 checks existence; EPERM means it exists under another user.
    matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None), Ok(()) | Err(nix::errno::Errno::EPERM))
}

/// Every record whose supervisor process is alive, by pid then kit name; stale records are removed.
#[must_use]
pub fn list(dir: &Path) -> Vec<Record> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(rec) = std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str::<Record>(&t).ok())
        else {
            continue;
        };
        if pid_alive(rec.pid) {
            out.push(rec);
        } else {
            unregister(&path);
        }
    }
    out.sort_by(|a, b| (a.pid, &a.kit_name).cmp(&(b.pid, &b.kit_name)));
    out
}

/// What a command without an unambiguous target found.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    One(Box<Record>),
    None,
    Several(Vec<Record>),
}

/// Pick the deployment a command means: of kit `name` when given, else any.
#[must_use]
pub fn choose(records: Vec<Record>, name: Option<&str>) -> Choice {
    let mut matching: Vec<Record> = records.into_iter().filter(|r| name.is_none_or(|n| r.kit_name == n)).collect();
    match matching.len() {
        0 => Choice::None,
        1 => Choice::One(Box::new(matching.remove(0))),
        _ => Choice::Several(matching),
    }
}

/// One line per deployment, for the "several are running" error.
#[must_use]
pub fn describe(records: &[Record]) -> String {
    records
        .iter()
        .map(|r| format!("{} (supervisor pid {}, {})", r.kit_name, r.pid, r.endpoint))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A running deployment a command talks to.
#[derive(Debug, Clone)]
pub struct Target {
    pub socket: PathBuf,
    /// The kit it runs (its record's effective kit when found through the registry).
    pub kit: Kit,
    /// How to name it in printed commands.
    pub kit_ref: KitRef,
    pub snapshot: Snapshot,
}

/// Why no single deployment was found.
#[derive(Debug, Clone)]
pub enum LocateError {
    /// Nothing answers (of kit `kit`, when one was asked for).
    NotRunning { kit: Option<String> },
    /// More than one is running and no `--kit` says which.
    Several(Vec<Record>),
}

impl std::fmt::Display for LocateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotRunning { kit: Some(k) } => write!(f, "no deployment of kit {k} is running here"),
            Self::NotRunning { kit: None } => write!(f, "no spark-kit deployment is running here"),
            Self::Several(v) => write!(f, "{} deployments are running here: {}", v.len(), describe(v)),
        }
    }
}

impl std::error::Error for LocateError {}

fn ask(socket: &Path, kit: &str) -> Option<Snapshot> {
    request(socket, kit, "status", Some(Duration::from_secs(5))).ok()
}

/// Find the deployment a command means. `given`: the kit named by `--kit` (resolved with the
/// current environment and flags) and how the user named it; `fallback`: the default kit, tried
/// at its own socket path when no `--kit` was given and the registry holds nothing.
pub fn locate(dirs: &Dirs, given: Option<(&Kit, &KitRef)>, fallback: Option<&Kit>) -> Result<Target, LocateError> {
    let at_socket = |kit: &Kit, kit_ref: &KitRef| {
        let socket = socket_path(&logs_dir(kit, dirs), &kit.name);
        ask(&socket, &kit.name).map(|snapshot| Target { socket, kit: kit.clone(), kit_ref: kit_ref.clone(), snapshot })
    };
    if let Some((kit, kit_ref)) = given {
        if let Some(t) = at_socket(kit, kit_ref) {
            return Ok(t);
        }
    }
    let live: Vec<(Record, Snapshot)> =
        list(&run_dir(dirs)).into_iter().filter_map(|r| ask(&r.socket, &r.kit_name).map(|s| (r, s))).collect();
    let records: Vec<Record> = live.iter().map(|(r, _)| r.clone()).collect();
    match choose(records, given.map(|(k, _)| k.name.as_str())) {
        Choice::One(r) => {
            let snapshot = live.into_iter().find(|(x, _)| x.pid == r.pid).map(|(_, s)| s);
            let snapshot = snapshot.ok_or(LocateError::NotRunning { kit: Some(r.kit_name.clone()) })?;
            let r = *r;
            Ok(Target { socket: r.socket, kit_ref: KitRef { arg: r.kit_arg }, kit: r.kit, snapshot })
        }
        Choice::Several(v) => Err(LocateError::Several(v)),
        Choice::None => {
            if given.is_none() {
                if let Some(t) = fallback.and_then(|k| at_socket(k, &KitRef::default())) {
                    return Ok(t);
                }
            }
            Err(LocateError::NotRunning { kit: given.map(|(k, _)| k.name.clone()) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, pid: u32) -> Record {
        Record {
            schema: 1,
            kit_name: name.into(),
            kit_arg: Some(name.into()),
            socket: PathBuf::from(format!("/x/{name}.sock")),
            pid,
            endpoint: "http://127.0.0.1:8000/v1".into(),
            kit: Kit::default(),
        }
    }

    #[test]
    fn choose_one_none_or_several() {
        assert_eq!(choose(vec![], None), Choice::None);
        assert_eq!(choose(vec![rec("a", 1)], None), Choice::One(Box::new(rec("a", 1))));
        assert_eq!(choose(vec![rec("a", 1), rec("b", 2)], Some("b")), Choice::One(Box::new(rec("b", 2))));
        assert_eq!(choose(vec![rec("a", 1)], Some("b")), Choice::None);
        let several = choose(vec![rec("a", 1), rec("b", 2)], None);
        let Choice::Several(v) = several else { panic!("{several:?}") };
        assert_eq!(
            describe(&v),
            "a (supervisor pid 1, http://127.0.0.1:8000/v1), b (supervisor pid 2, http://127.0.0.1:8000/v1)"
        );
    }

    #[test]
    fn register_list_and_stale_records() {
        let d = tempfile::tempdir().unwrap();
        let me = rec("tiny-cpu", std::process::id());
        let path = register(d.path(), &me).unwrap();
        assert_eq!(list(d.path()), vec![me]);
        // A record of a process that is gone is dropped (and deleted).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = register(d.path(), &rec("old", dead)).unwrap();
        std::fs::write(d.path().join("garbage.json"), "{").unwrap();
        assert_eq!(list(d.path()).len(), 1);
        assert!(!stale.exists());
        unregister(&path);
        assert!(list(d.path()).is_empty());
        assert!(list(&d.path().join("missing")).is_empty());
    }

    #[test]
    fn kit_files_are_recorded_absolute() {
        assert_eq!(recorded_arg(Some("tiny-cpu")).as_deref(), Some("tiny-cpu"));
        assert_eq!(recorded_arg(None), None);
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("k.yaml");
        std::fs::write(&f, "name: k\n").unwrap();
        let rel = f.strip_prefix("/").unwrap();
        let abs = std::fs::canonicalize(&f).unwrap().display().to_string();
        let cwd = std::env::current_dir().unwrap();
        // Relative to / (the test's cwd may be anywhere).
        let arg = format!("{}{}", "../".repeat(cwd.components().count()), rel.display());
        assert_eq!(recorded_arg(Some(&arg)), Some(abs));
    }
}
