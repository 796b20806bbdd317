//! Preflight verdicts for kits with `engine.runtime: docker` (pure, over [`DockerFacts`]):
//! the daemon answers, `engine.docker_image` is on the node (with the id `spark-kit.lock`
//! recorded, once it has one), no container of this deployment survives from an earlier run,
//! and every node has the same image id. Also how a survivor is named and removed, in preflight's
//! fix and in `status`'s error with nothing running ([`leftovers_named`]).

use super::checks::{Check, Verdict};
use super::facts::DockerFacts;
use super::probe::ProbeError;
use crate::hints::KitRef;
use crate::runtime::docker::dockerctl::{classify, parse_ps, DockerError};
use crate::runtime::Leftover;

fn check(node: &str, id: &'static str, verdict: Verdict, message: String, fix: Option<String>) -> Check {
    Check { node: node.to_string(), id, verdict, message, fix }
}

/// What a failed probe of the docker CLI means.
fn error_of(e: &ProbeError, what: &str, image: Option<&str>) -> DockerError {
    match e {
        ProbeError::NotFound(_) => DockerError::NotInstalled,
        // `exit status: 1: <first stderr line>`: the stderr line is what docker said.
        ProbeError::Failed { why, .. } => {
            let said =
                why.strip_prefix("exit status: ").and_then(|r| r.split_once(": ")).map_or(why.as_str(), |(_, s)| s);
            classify(what, said, image)
        }
    }
}

/// What to do about containers an earlier run left on `node` (`names`): start over them with
/// spark-kit (`replace`, `spark-kit up --kit K --replace`, when known), or only remove them by
/// hand (no spark-kit command removes them without starting the deployment: `down` needs a
/// running one). Also `status`'s hint, with nothing running.
#[must_use]
pub fn survivors_fix(node: &str, names: &[&str], replace: Option<&str>) -> String {
    let by_hand = format!("`docker rm -f {}` on {node}", names.join(" "));
    match replace {
        Some(cmd) => format!("start over them with `{cmd}` (it removes them first), or only remove them: {by_hand}"),
        None => format!("remove them: {by_hand}"),
    }
}

/// `status`'s words, with nothing running, for the containers earlier runs left on this node
/// (each with the kit it was started for): the error's tail and the fix, or None when there are
/// none. `asked`: the `--kit` the user named (`left` is then that kit's): the fix starts over
/// them with it. Without one, every kit's are named with their kit, and the restart is named only
/// when they are all of one built-in kit (a kit file's path is not on the container).
#[must_use]
pub fn leftovers_named(left: &[(String, Leftover)], asked: Option<&KitRef>) -> Option<(String, String)> {
    let mut left: Vec<&(String, Leftover)> = left.iter().collect();
    left.sort_by(|a, b| (&a.0, &a.1.name).cmp(&(&b.0, &b.1.name)));
    let first = &left.first()?.0;
    let short = |id: &str| id[..id.len().min(12)].to_string();
    let names: Vec<&str> = left.iter().map(|(_, c)| c.name.as_str()).collect();
    let (tail, replace) = match asked {
        Some(kit_ref) => {
            let named: Vec<String> =
                left.iter().map(|(_, c)| format!("{} ({}, {})", c.name, short(&c.id), c.state)).collect();
            let tail = format!("containers of it from an earlier run on this node: {}", named.join(", "));
            (tail, Some(kit_ref.command("up", &["--replace"])))
        }
        None => {
            let named: Vec<String> =
                left.iter().map(|(k, c)| format!("{} (kit {k}, {}, {})", c.name, short(&c.id), c.state)).collect();
            let one_builtin = left.iter().all(|(k, _)| k == first) && crate::kit::builtin::find(first).is_some();
            let replace = one_builtin.then(|| KitRef::new(Some(first)).command("up", &["--replace"]));
            (format!("containers from an earlier run on this node: {}", named.join(", ")), replace)
        }
    };
    Some((tail, survivors_fix("this node", &names, replace.as_deref())))
}

/// The image id on this node, when the facts have one.
#[must_use]
pub fn image_id(f: &DockerFacts) -> Option<&str> {
    f.image_id.as_ref().ok().map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// The command a missing image's fix names, as the user can run it.
#[derive(Debug, Clone, Copy)]
pub enum ImageFix<'a> {
    /// The head makes it (`spark-kit image build --kit K`).
    Build(&'a str),
    /// A worker gets the head's (`spark-kit image sync --kit K`, run on the head).
    Sync(&'a str),
}

impl ImageFix<'_> {
    fn text(self) -> String {
        match self {
            Self::Build(m) => format!("make it here, offline: `{m}`"),
            Self::Sync(m) => format!("copy the head's image here: run `{m}` on the head"),
        }
    }
}

/// The image id `spark-kit.lock` recorded for the kit's image, and the lock's path.
#[derive(Debug, Clone, Copy)]
pub struct Recorded<'a> {
    pub id: &'a str,
    pub lock: &'a str,
}

/// Checks of one node. `make` is the command that puts the image here, when spark-kit can: a
/// missing image's fix names it. `recorded`: the id the node's image must have. `replace`: the
/// command that starts the deployment over its leftovers (`spark-kit up --kit K --replace`,
/// which removes them on every node first), as the user can run it: a survivor's fix names it.
#[must_use]
pub fn node_checks(
    node: &str,
    f: &DockerFacts,
    make: Option<ImageFix<'_>>,
    recorded: Option<Recorded<'_>>,
    replace: Option<&str>,
) -> Vec<Check> {
    let mut out = Vec::new();
    if let Err(e) = &f.info {
        let e = error_of(e, "info", None);
        out.push(check(node, "docker", Verdict::Fail, e.to_string(), Some(e.fix())));
        return out;
    }
    let version = f.info.as_ref().map(|v| v.trim().to_string()).unwrap_or_default();
    out.push(check(node, "docker", Verdict::Pass, format!("Docker daemon {version} answers"), None));
    match (&f.image_id, image_id(f)) {
        (Ok(_), Some(id)) => match recorded.filter(|r| r.id.trim() != id) {
            None => out.push(check(
                node,
                "image",
                Verdict::Pass,
                format!("image {} is here ({})", f.image, short(id)),
                None,
            )),
            Some(r) => out.push(check(
                node,
                "image",
                Verdict::Fail,
                format!("image {} on {node} is {id}, but {} recorded {} for it", f.image, r.lock, r.id),
                Some(format!(
                    "the tag now names another image: put the recorded one back on {node} (`docker load` it, or \
                     `spark-kit image sync` from a node that has it); to move to the new image on purpose, delete \
                     its entry under \"images\" in {} and run preflight again",
                    r.lock
                )),
            )),
        },
        (Ok(_), None) => {
            let e = DockerError::NoImage(f.image.clone());
            let fix = make.map_or_else(|| e.fix(), ImageFix::text);
            out.push(check(node, "image", Verdict::Fail, e.to_string(), Some(fix)));
        }
        (Err(e), _) => {
            let e = error_of(e, "image inspect", Some(&f.image));
            let fix = match (&e, make) {
                (DockerError::NoImage(_), Some(m)) => m.text(),
                _ => e.fix(),
            };
            out.push(check(node, "image", Verdict::Fail, e.to_string(), Some(fix)));
        }
    }
    match &f.containers {
        Ok(text) => {
            let left = parse_ps(text);
            if left.is_empty() {
                out.push(check(node, "containers", Verdict::Pass, "no container of this deployment".into(), None));
            } else {
                let names: Vec<String> =
                    left.iter().map(|c| format!("{} ({}, {})", c.name, short(&c.id), c.state)).collect();
                out.push(check(
                    node,
                    "containers",
                    Verdict::Fail,
                    format!("containers of this deployment from an earlier run: {}", names.join(", ")),
                    Some(survivors_fix(node, &left.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), replace)),
                ));
            }
        }
        Err(e) => {
            let e = error_of(e, "ps", None);
            out.push(check(node, "containers", Verdict::Fail, e.to_string(), Some(e.fix())));
        }
    }
    out
}

/// The image id every node has, when every node has the image and they agree (what
/// `spark-kit.lock` records the first time).
#[must_use]
pub fn common_image_id<'a>(nodes: &[&'a DockerFacts]) -> Option<&'a str> {
    let first = image_id(nodes.first()?)?;
    nodes.iter().all(|f| image_id(f) == Some(first)).then_some(first)
}

/// Every node that has the image has the same image id (a mismatch names both ids). `sync` is
/// the `spark-kit image sync --kit K` the fix names (None: the bare command).
#[must_use]
pub fn cross_checks(nodes: &[(&str, &DockerFacts)], sync: Option<&str>) -> Vec<Check> {
    let ids: Vec<(&str, &str)> = nodes.iter().filter_map(|(n, f)| image_id(f).map(|id| (*n, id))).collect();
    if ids.len() < 2 {
        return Vec::new();
    }
    let (first_node, first) = ids[0];
    if let Some((other_node, other)) = ids.iter().find(|(_, id)| *id != first) {
        let image = &nodes[0].1.image;
        return vec![check(
            "all",
            "image-id",
            Verdict::Fail,
            format!("image {image} differs between nodes: {first_node} has {first}, {other_node} has {other}"),
            Some(format!(
                "run `{}` to copy the head's image to the workers (or `docker load` the same image on {other_node})",
                sync.unwrap_or("spark-kit image sync")
            )),
        )];
    }
    vec![check("all", "image-id", Verdict::Pass, format!("same image id on every node ({})", short(first)), None)]
}

fn short(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    &id[..id.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(id: Result<&str, ProbeError>, ps: &str) -> DockerFacts {
        DockerFacts {
            info: Ok("20.10.24\n".into()),
            image_id: id.map(str::to_string),
            image: "vllm/x:1".into(),
            containers: Ok(ps.into()),
            vllm_version: None,
        }
    }

    const ID_A: &str = "sha256:62d68dee0229b98c0f560677b0ded94ddc0f860a6d6123b7b3ea461b1a698bdd";
    const ID_B: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn a_healthy_node_passes() {
        let c = node_checks("spark-1", &facts(Ok(ID_A), ""), None, None, None);
        assert!(c.iter().all(|c| c.verdict == Verdict::Pass), "{c:?}");
        assert!(c[1].message.contains("62d68dee0229"));
    }

    #[test]
    fn daemon_problems_are_one_line_with_the_fix() {
        let mut f = facts(Ok(ID_A), "");
        f.info = Err(ProbeError::Failed {
            what: "docker info".into(),
            why: "exit status: 1: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?".into(),
        });
        let c = node_checks("spark-2", &f, None, None, None);
        assert_eq!((c.len(), c[0].verdict), (1, Verdict::Fail));
        assert!(
            c[0].message.contains("not running") && c[0].fix.as_deref().unwrap().contains("systemctl start docker")
        );
        f.info = Err(ProbeError::NotFound("docker".into()));
        assert!(node_checks("n", &f, None, None, None)[0]
            .fix
            .as_deref()
            .unwrap()
            .contains("apt-get install docker.io"));
    }

    fn missing_again() -> Result<&'static str, ProbeError> {
        Err(ProbeError::Failed {
            what: "docker image inspect".into(),
            why: "exit status: 1: Error: No such image: vllm/x:1".into(),
        })
    }

    #[test]
    fn missing_image_and_leftovers_fail() {
        let missing = Err(ProbeError::Failed {
            what: "docker image inspect".into(),
            why: "exit status: 1: Error: No such image: vllm/x:1".into(),
        });
        let c = node_checks("spark-2", &facts(missing, "abc123\tspark-kit-k-spark-2\trunning\n"), None, None, None);
        let image = c.iter().find(|c| c.id == "image").unwrap();
        assert_eq!(image.verdict, Verdict::Fail);
        assert!(
            image.message.contains("`vllm/x:1` is not on this node")
                && image.fix.as_deref().unwrap().contains("image sync")
        );
        // A kit whose image spark-kit makes names that command.
        for f in [facts(Ok(""), ""), facts(missing_again(), "")] {
            let c = node_checks("local", &f, Some(ImageFix::Build("spark-kit image build --kit k")), None, None);
            let made = c.iter().find(|c| c.id == "image").unwrap();
            assert_eq!(made.verdict, Verdict::Fail);
            assert_eq!(made.fix.as_deref(), Some("make it here, offline: `spark-kit image build --kit k`"));
        }
        // A worker's fix is the head's sync, with the kit as the user named it.
        let c = node_checks(
            "spark-2",
            &facts(missing_again(), ""),
            Some(ImageFix::Sync("spark-kit image sync --kit k")),
            None,
            None,
        );
        let synced = c.iter().find(|c| c.id == "image").unwrap();
        assert_eq!(
            synced.fix.as_deref(),
            Some("copy the head's image here: run `spark-kit image sync --kit k` on the head")
        );
        // A survivor: start over it with the kit's `up --replace` (runnable as printed), or remove it by hand.
        let ps = "abc123\tspark-kit-k-spark-2\trunning\ndef456\tspark-kit-k-spark-2b\texited\n";
        let c = node_checks("spark-2", &facts(missing_again(), ps), None, None, Some("spark-kit up --kit k --replace"));
        let left = c.iter().find(|c| c.id == "containers").unwrap();
        assert_eq!(left.verdict, Verdict::Fail);
        assert!(left.message.contains("spark-kit-k-spark-2 (abc123, running), spark-kit-k-spark-2b (def456, exited)"));
        assert_eq!(
            left.fix.as_deref(),
            Some(
                "start over them with `spark-kit up --kit k --replace` (it removes them first), or only remove them: \
                 `docker rm -f spark-kit-k-spark-2 spark-kit-k-spark-2b` on spark-2"
            )
        );
        let c = node_checks("spark-2", &facts(missing_again(), ps), None, None, None);
        let fix = c.iter().find(|c| c.id == "containers").and_then(|c| c.fix.clone());
        assert_eq!(
            fix.as_deref(),
            Some("remove them: `docker rm -f spark-kit-k-spark-2 spark-kit-k-spark-2b` on spark-2")
        );
    }

    #[test]
    fn a_node_whose_image_is_not_the_recorded_one_fails() {
        let lock = "/d/k/spark-kit.lock";
        let rec = Some(Recorded { id: ID_A, lock });
        let same = node_checks("spark-1", &facts(Ok(ID_A), ""), None, rec, None);
        assert_eq!(same.iter().find(|c| c.id == "image").unwrap().verdict, Verdict::Pass);
        let c = node_checks("spark-2", &facts(Ok(ID_B), ""), None, rec, None);
        let image = c.iter().find(|c| c.id == "image").unwrap();
        assert_eq!(image.verdict, Verdict::Fail);
        assert_eq!(
            image.message,
            format!("image vllm/x:1 on spark-2 is {ID_B}, but /d/k/spark-kit.lock recorded {ID_A} for it")
        );
        assert!(image.fix.as_deref().unwrap().contains("delete its entry under \"images\" in /d/k/spark-kit.lock"));
        let (a, b) = (facts(Ok(ID_A), ""), facts(Ok(ID_B), ""));
        assert_eq!(common_image_id(&[&a, &a.clone()]), Some(ID_A));
        assert_eq!(common_image_id(&[&a, &b]), None);
        assert_eq!(common_image_id(&[&a, &facts(missing_again(), "")]), None);
    }

    #[test]
    fn image_ids_are_compared_across_nodes() {
        let (a, b) = (facts(Ok(ID_A), ""), facts(Ok(ID_B), ""));
        let c = cross_checks(&[("spark-1", &a), ("spark-2", &b)], Some("spark-kit image sync --kit k"));
        assert!(
            c[0].fix.as_deref().unwrap().starts_with("run `spark-kit image sync --kit k` to copy"),
            "{:?}",
            c[0].fix
        );
        assert_eq!(c[0].verdict, Verdict::Fail);
        assert!(c[0].message.contains(&format!("spark-1 has {ID_A}, spark-2 has {ID_B}")), "{}", c[0].message);
        assert_eq!(cross_checks(&[("spark-1", &a), ("spark-2", &a.clone())], None)[0].verdict, Verdict::Pass);
        assert!(cross_checks(&[("spark-1", &a)], None).is_empty());
    }

    fn left(kit: &str, name: &str) -> (String, Leftover) {
        (kit.into(), Leftover { name: name.into(), id: format!("{name:0<64}"), state: "running".into() })
    }

    #[test]
    fn leftovers_are_named_with_their_fix() {
        assert_eq!(leftovers_named(&[], None), None);
        // The kit asked for: its containers, restarted with the --kit as the user gave it.
        let asked = KitRef::new(Some("/k/my kit.yaml"));
        let (tail, fix) = leftovers_named(&[left("mine", "b"), left("mine", "a")], Some(&asked)).unwrap();
        assert_eq!(
            tail,
            "containers of it from an earlier run on this node: a (a00000000000, running), b (b00000000000, running)"
        );
        assert_eq!(
            fix,
            "start over them with `spark-kit up --kit '/k/my kit.yaml' --replace` (it removes them first), \
             or only remove them: `docker rm -f a b` on this node"
        );
        // Every kit's: each with its kit; one built-in kit gets its restart.
        let (tail, fix) = leftovers_named(&[left("tiny-cpu-docker", "b"), left("tiny-cpu-docker", "a")], None).unwrap();
        assert_eq!(
            tail,
            "containers from an earlier run on this node: \
             a (kit tiny-cpu-docker, a00000000000, running), b (kit tiny-cpu-docker, b00000000000, running)"
        );
        assert_eq!(
            fix,
            "start over them with `spark-kit up --kit tiny-cpu-docker --replace` (it removes them first), \
             or only remove them: `docker rm -f a b` on this node"
        );
        // Two kits, or a kit file's: only the removal by hand.
        let two = leftovers_named(&[left("tiny-cpu-docker", "a"), left("mine", "c")], None).unwrap();
        assert_eq!(two.1, "remove them: `docker rm -f c a` on this node");
        assert_eq!(
            leftovers_named(&[left("mine", "c")], None).unwrap().1,
            "remove them: `docker rm -f c` on this node"
        );
    }
}
