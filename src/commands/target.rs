//! Which running deployment `status`, `logs` and `down` mean: the kit named by `--kit` (its
//! socket, or its live record), or with no kit flags the one live deployment of any kit
//! (src/live.rs); several live ones without `--kit` are listed.

use super::load;
use crate::cli::KitArgs;
use crate::dirs::Dirs;
use crate::error::Failure;
use crate::hints::KitRef;
use crate::kit::schema::Kit;
use crate::live::{self, LocateError, Target};

/// Whether the command line names a kit or changes one (then that kit is meant).
fn names_a_kit(args: &KitArgs) -> bool {
    args.kit.is_some() || !args.set.is_empty() || !args.common().is_empty()
}

/// The kit the flags name (resolved, for `logs` of a deployment that is not running), or `None`
/// when no kit flag was given.
pub fn given_kit(args: &KitArgs, env: &[(String, String)]) -> Result<Option<Kit>, Failure> {
    if names_a_kit(args) {
        Ok(Some(load::resolve(args, env)?.kit))
    } else {
        Ok(None)
    }
}

/// Find the deployment; `sub` is the command, for the hint that names one of several.
pub fn find(args: &KitArgs, env: &[(String, String)], sub: &str) -> Result<Target, Failure> {
    locate(args, env)?.map_err(|e| failure(&e, sub, &KitRef::new(args.kit.as_deref())))
}

/// [`find`], with why none was found kept (`status --json` prints a value when nothing runs);
/// the outer error is the kit's.
pub fn locate(args: &KitArgs, env: &[(String, String)]) -> Result<Result<Target, LocateError>, Failure> {
    let dirs = Dirs::from_env(env)?;
    let kit_ref = KitRef::new(args.kit.as_deref());
    let given = given_kit(args, env)?;
    // No kit flags: the default kit is still tried at its own socket (its record may be missing).
    let fallback = if given.is_none() { load::resolve(args, env).ok().map(|r| r.kit) } else { None };
    Ok(live::locate(&dirs, given.as_ref().map(|k| (k, &kit_ref)), fallback.as_ref()))
}

/// The error for a deployment that could not be found (`kit_ref`: the kit as the user named it).
#[must_use]
pub fn failure(e: &LocateError, sub: &str, kit_ref: &KitRef) -> Failure {
    match e {
        LocateError::NotRunning { .. } => {
            Failure::runtime_error(e).with_hint(format!("start it with {}", kit_ref.quoted("up", &["--detach"])))
        }
        LocateError::Several(v) => {
            let choices: Vec<String> = v.iter().map(|r| KitRef { arg: r.kit_arg.clone() }.quoted(sub, &[])).collect();
            Failure::usage_error(e).with_hint(format!("name one with --kit: {}", choices.join(" or ")))
        }
    }
}
