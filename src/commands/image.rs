//! `spark-kit image sync [--kit K] [--json]`: every node gets the head's engine image, same id.
//! `spark-kit image build [--kit K] [--json]`: make the image of a kit that mounts its venv.

use super::{io_failure, load, Context};
use crate::cli::ImageSyncArgs;
use crate::cluster::push;
use crate::error::Failure;
use crate::reporter::WriterLines;
use crate::runtime::docker::image_build;
use crate::settings::Settings;

/// The settings of a docker kit (`what`: the image work refused for a venv kit).
fn docker_kit(args: &ImageSyncArgs, ctx: &Context<'_>, what: &str) -> Result<Settings, Failure> {
    let s = load::settings(&args.kit, &ctx.env)?;
    if crate::runtime::of(&s.kit).image(&s.kit).is_none() {
        return Err(Failure::usage(format!(
            "kit {} runs its engine in a venv (engine.runtime: venv): no image to {what}",
            s.kit.name
        ))
        .with_hint("pick a kit with engine.runtime: docker, e.g. --kit tiny-cpu-docker"));
    }
    Ok(s)
}

pub fn sync(args: &ImageSyncArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = docker_kit(args, ctx, "sync")?;
    let exe = crate::dirs::self_exe()
        .map_err(|e| Failure::runtime(format!("cannot find the spark-kit executable: {e}")).caused_by_chain_of(&e))?;
    let sha = push::sha256_file(&exe)
        .map_err(|e| Failure::runtime(format!("cannot read {}: {e}", exe.display())).caused_by_chain_of(&e))?;
    let rep = WriterLines::new(&mut *ctx.err);
    let done = crate::image_sync::sync(&s.kit, &s.deploy.dirs.cache, &exe, &sha, &rep)
        .map_err(|e| Failure::runtime(format!("image sync: {e}")).caused_by_chain_of(&e).with_hint(e.fix()))?;
    if args.json {
        let text = serde_json::to_string(&done)?;
        writeln!(ctx.out, "{text}").map_err(|e| io_failure(&e))?;
    } else {
        for n in &done {
            writeln!(ctx.out, "{}: {} {}", n.node, n.action, n.image_id).map_err(|e| io_failure(&e))?;
        }
    }
    Ok(())
}

pub fn build(args: &ImageSyncArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = docker_kit(args, ctx, "build")?;
    if !crate::runtime::of(&s.kit).builds_image(&s.kit) {
        let e = image_build::ImageError::NotBuildable { kit: s.kit.name.clone() };
        return Err(Failure::usage_error(&e).with_hint(e.fix()));
    }
    let rep = WriterLines::new(&mut *ctx.err);
    let venv = match &s.deploy.venv {
        Some(p) => p.clone(),
        None => {
            let recipe = crate::runtime::venv::recipe::Recipe::load(&s.kit.engine.requirements)
                .map_err(|e| Failure::usage(format!("engine.requirements: {e}")).caused_by_chain_of(&e))?;
            crate::runtime::venv::build::ensure(&s.deploy.dirs.cache, &recipe, &rep, &crate::cancel::Cancel::default())
                .map_err(|e| Failure::runtime(format!("engine venv: {e}")).caused_by_chain_of(&e))?
                .path
        }
    };
    let built = image_build::build(&s.kit, &venv, &s.deploy.dirs.cache, &rep)
        .map_err(|e| Failure::runtime(format!("image build: {e}")).caused_by_chain_of(&e).with_hint(e.fix()))?;
    if args.json {
        let text = serde_json::to_string(&built)?;
        writeln!(ctx.out, "{text}").map_err(|e| io_failure(&e))?;
    } else {
        writeln!(ctx.out, "{}: {} {}", built.image, built.action, built.image_id).map_err(|e| io_failure(&e))?;
    }
    Ok(())
}
