//! Load the kit a command asked for, with the environment and flag layers.

use crate::cli::KitArgs;
use crate::error::Failure;
use crate::kit::{self, layers, KitError, Origin, Override, Resolved};
use crate::settings::Settings;

/// The flag layer: the common flags, then `--set` entries (highest precedence; later wins).
pub fn flag_overrides(args: &KitArgs) -> Result<Vec<Override>, Failure> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (flag, key, value) in args.common() {
        out.push(Override {
            path: key.split('.').map(str::to_string).collect(),
            raw: value.to_string(),
            origin: Origin::Flag(flag.to_string()),
        });
    }
    for s in &args.set {
        match layers::set_override(s) {
            Ok(o) => out.push(o),
            Err(p) => problems.push(p),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(kit_failure(KitError::Invalid(problems)))
    }
}

/// Resolve the kit named by `args` (or the default kit).
pub fn resolve(args: &KitArgs, env: &[(String, String)]) -> Result<Resolved, Failure> {
    resolve_for(args, env, &kit::validate::Part::ALL)
}

/// The kit named by `args`, resolved, and its settings on this machine (src/settings.rs).
pub fn settings(args: &KitArgs, env: &[(String, String)]) -> Result<Settings, Failure> {
    Ok(Settings::new(resolve(args, env)?.kit, args.kit.as_deref(), env)?)
}

/// [`settings`], validating only the parts of the kit the command uses.
pub fn settings_for(
    args: &KitArgs,
    env: &[(String, String)],
    parts: &[kit::validate::Part],
) -> Result<Settings, Failure> {
    Ok(Settings::new(resolve_for(args, env, parts)?.kit, args.kit.as_deref(), env)?)
}

/// [`resolve`], validating only the parts of the kit the command uses.
pub fn resolve_for(
    args: &KitArgs,
    env: &[(String, String)],
    parts: &[kit::validate::Part],
) -> Result<Resolved, Failure> {
    let flags = flag_overrides(args)?;
    let src = kit::source(args.kit.as_deref()).map_err(kit_failure)?;
    kit::resolve_for(src, env, &flags, parts).map_err(kit_failure)
}

/// Every kit error is a configuration error (exit code 2).
#[must_use]
pub fn kit_failure(e: KitError) -> Failure {
    Failure::from(e)
}
