//! `spark-kit config [--explain] [--json]`.

use super::{io_failure, load, Context};
use crate::cli::ConfigArgs;
use crate::error::Failure;
use crate::kit::explain;

pub fn run(args: &ConfigArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let resolved = load::resolve(&args.kit, &ctx.env)?;
    let text = if args.explain {
        let rows = explain::rows(&resolved)
            .map_err(|e| Failure::runtime(format!("cannot render the kit: {e}")).caused_by_chain_of(&e))?;
        if args.json {
            serde_json::to_string_pretty(&rows)?
        } else {
            table(&rows)
        }
    } else if args.json {
        serde_json::to_string_pretty(&resolved.kit)?
    } else {
        serde_yaml::to_string(&resolved.kit)?
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))
}

fn table(rows: &[explain::Row]) -> String {
    let cells: Vec<(String, String, &str)> = rows
        .iter()
        .map(|r| (r.key.clone(), r.written.clone().unwrap_or_else(|| compact(&r.value)), r.origin.as_str()))
        .collect();
    let kw = cells.iter().map(|c| c.0.len()).max().unwrap_or(3).max(3);
    let vw = cells.iter().map(|c| c.1.chars().count()).max().unwrap_or(5).clamp(5, 48);
    let mut out = format!("{:<kw$}  {:<vw$}  ORIGIN\n", "KEY", "VALUE");
    for (k, v, o) in cells {
        let v = if v.chars().count() > vw { format!("{}…", v.chars().take(vw - 1).collect::<String>()) } else { v };
        out.push_str(&format!("{k:<kw$}  {v:<vw$}  {o}\n"));
    }
    out
}

fn compact(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
