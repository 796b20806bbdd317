//! `spark-kit kits`, `spark-kit kit show` and `spark-kit kit check`.

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
        let text = serde_json::to_string_pretty(&entries)?;
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

/// Validate every part of a kit (environment and flags not applied), one line per problem with
/// the commands that need the key; exit 2 when there is any.
pub fn check(name: Option<&str>, ctx: &mut Context<'_>) -> Result<(), Failure> {
    use crate::kit::problem::Problem;
    use crate::kit::validate::{validate, Part};
    let src = kit::source(name).map_err(kit_failure)?;
    let shown = src.display.clone();
    let resolved = kit::resolve_for(src, &[], &[], &[]).map_err(kit_failure)?;
    let findings = validate(&resolved.kit);
    if findings.is_empty() {
        writeln!(ctx.out, "{shown}: valid for every command").map_err(|e| io_failure(&e))?;
        return Ok(());
    }
    for f in &findings {
        let p = Problem::new(resolved.layered.locate(&f.key), f.key.clone(), f.message.clone(), f.fix.clone());
        writeln!(ctx.out, "{p}; needed by: {}", f.part.commands()).map_err(|e| io_failure(&e))?;
    }
    let usable: Vec<&str> =
        ["download", "verify"].into_iter().filter(|_| findings.iter().all(|f| f.part != Part::Model)).collect();
    if !usable.is_empty() {
        writeln!(ctx.out, "usable by: {} (they check only model and engram)", usable.join(", "))
            .map_err(|e| io_failure(&e))?;
    }
    Err(Failure::usage(format!("kit {shown}: {} problem(s)", findings.len()))
        .with_hint("fix the keys named above; each line says which commands need it"))
}
