//! `up`'s texts: the ready banner and the failure of a deployment that did not come up. Pure.

use crate::error::Failure;
use crate::hints::{curl_example, KeySource, KitRef};
use crate::supervisor::{ClusterError, Snapshot};

/// The ready banner: endpoint, model, a `curl` that works as copied (with the API key's header
/// when the kit has keys), where the logs are, and the commands for this deployment.
#[must_use]
pub fn banner(s: &Snapshot, secs: f64, key: Option<&KeySource>, kit_ref: &KitRef) -> String {
    let log_hint = s.nodes.iter().filter_map(|n| n.engine_log.clone()).collect::<Vec<_>>().join(", ");
    let base = s.endpoint.trim_end_matches("/v1");
    let model = &s.model;
    let curl = curl_example(&format!("{base}/v1"), model, key);
    format!(
        "ready in {secs:.1} s\nendpoint: {base}/v1\nmodel:    {model}\ntry:      {curl}\nlogs:     {log_hint}\nstatus:   {}\nfollow:   {}\nstop:     {}",
        kit_ref.command("status", &[]),
        kit_ref.command("logs", &["-f"]),
        kit_ref.command("down", &[]),
    )
}

/// The failure of a deployment that stopped or never became ready: the reason, each node's last
/// error, and where to read more.
#[must_use]
pub fn failure_from(s: &Snapshot, kit_ref: &KitRef) -> Failure {
    let mut msg = s.reason.clone().unwrap_or_else(|| "the deployment failed".into());
    for n in &s.nodes {
        if let Some(e) = &n.last_error {
            msg.push_str(&format!("\n{}: {e}", n.name));
        }
    }
    let log = s.nodes.iter().find_map(|n| n.engine_log.clone());
    let f = Failure::runtime(msg);
    match log {
        Some(l) => f.with_hint(format!("full engine log: {l}")),
        None => f.with_hint(format!("see {}", kit_ref.quoted("logs", &[]))),
    }
}

/// The fix for a supervisor that could not run, with the kit as the user gave it: `--replace`
/// that could not remove an earlier run's leftovers is run again once the reason is fixed (it
/// removes them first; no other spark-kit command removes them).
#[must_use]
pub fn cluster_hint(e: &ClusterError, kit_ref: &KitRef) -> Option<String> {
    match e {
        ClusterError::Replace(_) => Some(format!(
            "fix what stopped the removal on that node (the reason above), then run {} again",
            kit_ref.quoted("up", &["--replace"])
        )),
        _ => e.hint(),
    }
}

/// The hint for a deployment that is still running.
#[must_use]
pub fn still_running_hint(kit_ref: &KitRef) -> String {
    format!(
        "see {} and {}, or stop it with {}",
        kit_ref.quoted("status", &[]),
        kit_ref.quoted("logs", &[]),
        kit_ref.quoted("down", &[])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_replace_names_up_replace_with_the_kit_as_given() {
        let e = ClusterError::Replace("--replace: spark-2 did not answer within 30 s".into());
        let hint = cluster_hint(&e, &KitRef::new(Some("my kits/a.yaml")));
        assert_eq!(
            hint.as_deref(),
            Some(
                "fix what stopped the removal on that node (the reason above), then run \
                 `spark-kit up --kit 'my kits/a.yaml' --replace` again"
            )
        );
        let e = ClusterError::NoHello { node: "spark-2".into(), secs: 30, log: "/l".into() };
        assert_eq!(cluster_hint(&e, &KitRef::new(None)), None);
    }
}
