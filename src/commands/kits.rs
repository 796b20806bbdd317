//! `spark-kit kits` and `spark-kit kit show`.

use serde::Serialize;

use super::{io_failure, load::kit_failure, Context};
use crate::error::Failure;
use crate::kit::{self, builtin::BUILTINS};

#[derive(Serialize)]
struct Entry<'a> {
    name: &'a str,
    description: String,
    path: &'a str,
    default: bool,
}

/// List built-in kits with their descriptions.
pub fn list(json: bool, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let mut entries = Vec::new();
    for b in BUILTINS {
        let src = kit::source(Some(b.name)).map_err(kit_failure)?;
        let resolved = kit::resolve(src, &[], &[]).map_err(kit_failure)?;
        entries.push(Entry {
            name: b.name,
            description: resolved.kit.description,
            path: b.path,
            default: b.name == kit::builtin::DEFAULT_KIT,
        });
    }
    if json {
        let text = serde_json::to_string_pretty(&entries).map_err(|e| Failure::runtime(e.to_string()))?;
        writeln!(ctx.out, "{text}").map_err(|e| io_failure(&e))?;
        return Ok(());
    }
    let width = entries.iter().map(|e| e.name.len()).max().unwrap_or(0) + 2;
    for e in &entries {
        let mark = if e.default { " (default)" } else { "" };
        writeln!(ctx.out, "{:<width$}{}{mark}", e.name, e.description).map_err(|e| io_failure(&e))?;
    }
    Ok(())
}

/// Print a kit's text exactly as written.
pub fn show(name: Option<&str>, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let src = kit::source(name).map_err(kit_failure)?;
    ctx.out.write_all(src.text.as_bytes()).map_err(|e| io_failure(&e))
}
