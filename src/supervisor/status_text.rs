//! What `status` prints: the human table of a snapshot, and the JSON of a deployment that runs
//! (the snapshot with `"running": true`) or does not (`"running": false`, the kit asked for, the
//! reason and its fix, no nodes), so a script reads one shape either way.

use serde::Serialize;

use super::state::State;
use super::Snapshot;

fn gib(b: Option<u64>) -> String {
    #[allow(clippy::cast_precision_loss)] // display only
    b.map_or_else(|| "-".into(), |b| format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)))
}

/// Human table of a snapshot.
#[must_use]
pub fn render(s: &Snapshot) -> String {
    let mut out = format!(
        "kit {}  state {:?}  restarts {}  up {:.0} s  supervisor pid {}\nendpoint {}  model {}\n",
        s.kit, s.state, s.restarts, s.uptime_s, s.supervisor_pid, s.endpoint, s.model
    );
    if let Some(r) = &s.reason {
        out.push_str(&format!("last event: {r}\n"));
    }
    if let Some(g) = &s.gateway {
        out.push_str(&format!("gateway {}  {}  in flight {}  queued {}\n", g.listen, g.state, g.in_flight, g.queued));
    }
    out.push_str("NODE        RANK  AGENT   ENGINE PGID  ALIVE  HEALTH  MEMAVAILABLE  TOK/S   UPTIME  NOTE\n");
    for n in &s.nodes {
        out.push_str(&format!(
            "{:<11} {:>4}  {:<7} {:>11}  {:<5}  {:<6}  {:>12}  {:>6}  {:>6}  {}\n",
            n.name,
            n.rank,
            if n.agent_connected { "ok" } else { "lost" },
            n.engine_pgid.map_or_else(|| "-".into(), |p| p.to_string()),
            if n.engine_alive { "yes" } else { "no" },
            n.healthy.map_or("-", |h| if h { "ok" } else { "fail" }),
            gib(n.mem_available),
            n.tokens_per_s.map_or_else(|| "-".into(), |t| format!("{t:.1}")),
            n.uptime_s.map_or_else(|| "-".into(), |u| format!("{u:.0}s")),
            n.last_error.as_deref().or(n.phase.as_deref()).unwrap_or(""),
        ));
    }
    out
}

#[derive(Serialize)]
struct Running<'a> {
    running: bool,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
}

#[derive(Serialize)]
struct NotRunning<'a> {
    running: bool,
    kit: Option<&'a str>,
    state: State,
    reason: &'a str,
    hint: Option<&'a str>,
    nodes: [(); 0],
}

/// `status --json` of a running deployment.
pub fn running_json(s: &Snapshot) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&Running { running: true, snapshot: s })
}

/// `status --json` when nothing answers: `kit` as asked for (None: any), why, and the fix.
pub fn not_running_json(kit: Option<&str>, reason: &str, hint: Option<&str>) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&NotRunning { running: false, kit, state: State::Stopped, reason, hint, nodes: [] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_or_not_one_shape_with_running_first() {
        let s = Snapshot {
            schema: 1,
            kit: "k".into(),
            state: State::Ready,
            reason: None,
            supervisor_pid: 1,
            uptime_s: 0.0,
            restarts: 0,
            endpoint: "http://127.0.0.1:8000/v1".into(),
            model: "m".into(),
            nodes: vec![],
            gateway: None,
        };
        let v: serde_json::Value = serde_json::from_str(&running_json(&s).unwrap()).unwrap();
        assert_eq!(
            (v["running"].as_bool(), v["kit"].as_str(), v["state"].as_str()),
            (Some(true), Some("k"), Some("ready"))
        );
        let text = not_running_json(None, "nothing here", Some("start it")).unwrap();
        assert!(text.starts_with("{\n  \"running\": false,"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (v["kit"].is_null(), v["state"].as_str(), v["nodes"].as_array().map(Vec::len)),
            (true, Some("stopped"), Some(0))
        );
        assert!(render(&s).starts_with("kit k  state Ready  restarts 0"), "{}", render(&s));
    }
}
