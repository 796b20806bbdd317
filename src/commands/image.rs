//! `spark-kit image sync [--kit K] [--json]`: every node gets the head's engine image, same id.
//! `spark-kit image build [--kit K] [--json]`: make the image of a kit that mounts its venv.

use std::io::Write;
use std::sync::Mutex;

use super::{io_failure, load, Context};
use crate::cli::ImageSyncArgs;
use crate::cluster::push;
use crate::dirs::Dirs;
use crate::engine::image_build::{self, BuildReporter};
use crate::error::Failure;
use crate::image_sync::{self, SyncReporter};
use crate::kit::schema::Runtime;

struct Lines<'a>(Mutex<&'a mut dyn Write>);

impl SyncReporter for Lines<'_> {
    fn line(&self, text: &str) {
        if let Ok(mut w) = self.0.lock() {
            let _ = writeln!(w, "{text}");
        }
    }
}

pub fn sync(args: &ImageSyncArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let kit = load::resolve(&args.kit, &ctx.env)?.kit;
    if kit.engine.runtime != Runtime::Docker {
        return Err(Failure::usage(format!(
            "kit {} runs its engine in a venv (engine.runtime: venv): no image to sync",
            kit.name
        ))
        .with_hint("pick a kit with engine.runtime: docker, e.g. --kit tiny-cpu-docker"));
    }
    let exe =
        crate::dirs::self_exe().map_err(|e| Failure::runtime(format!("cannot find the spark-kit executable: {e}")))?;
    let sha = push::sha256_file(&exe).map_err(|e| Failure::runtime(format!("cannot read {}: {e}", exe.display())))?;
    let dirs = Dirs::from_env(&ctx.env);
    let rep = Lines(Mutex::new(&mut *ctx.err));
    let done = image_sync::sync(&kit, &dirs.cache, &exe, &sha, &rep).map_err(|e| {
        let hint = e.fix();
        Failure::runtime(format!("image sync: {e}")).with_hint(hint)
    })?;
    if args.json {
        let text = serde_json::to_string(&done).map_err(|e| Failure::runtime(e.to_string()))?;
        writeln!(ctx.out, "{text}").map_err(|e| io_failure(&e))?;
    } else {
        for n in &done {
            writeln!(ctx.out, "{}: {} {}", n.node, n.action, n.image_id).map_err(|e| io_failure(&e))?;
        }
    }
    Ok(())
}

impl BuildReporter for Lines<'_> {
    fn line(&self, text: &str) {
        SyncReporter::line(self, text);
    }
}

/// The reporter of the venv build (when `image build` has to make the venv first).
struct SetupLines<'a>(&'a Lines<'a>);
impl crate::engine::venv::SetupReporter for SetupLines<'_> {
    fn step(&self, index: usize, total: usize, label: &str) {
        SyncReporter::line(self.0, &format!("setup [{index}/{total}] {label}"));
    }
    fn step_done(&self, _: &str, _: f64) {}
}

pub fn build(args: &ImageSyncArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let kit = load::resolve(&args.kit, &ctx.env)?.kit;
    if kit.engine.runtime != Runtime::Docker {
        return Err(Failure::usage(format!(
            "kit {} runs its engine in a venv (engine.runtime: venv): no image to build",
            kit.name
        ))
        .with_hint("pick a kit with engine.runtime: docker, e.g. --kit tiny-cpu-docker"));
    }
    if !kit.engine.docker_mount_venv {
        let e = image_build::ImageError::NotBuildable { kit: kit.name.clone() };
        return Err(Failure::usage(e.to_string()).with_hint(e.fix()));
    }
    let dirs = Dirs::from_env(&ctx.env);
    let rep = Lines(Mutex::new(&mut *ctx.err));
    let venv = match &kit.engine.venv {
        Some(p) => dirs.expand(p),
        None => {
            let recipe = crate::engine::recipe::Recipe::load(&kit.engine.requirements)
                .map_err(|e| Failure::usage(format!("engine.requirements: {e}")))?;
            crate::engine::venv::ensure(&dirs.cache, &recipe, &SetupLines(&rep))
                .map_err(|e| Failure::runtime(format!("engine venv: {e}")))?
                .path
        }
    };
    let built = image_build::build(&kit, &venv, &dirs.cache, &rep).map_err(|e| {
        let hint = e.fix();
        Failure::runtime(format!("image build: {e}")).with_hint(hint)
    })?;
    if args.json {
        let text = serde_json::to_string(&built).map_err(|e| Failure::runtime(e.to_string()))?;
        writeln!(ctx.out, "{text}").map_err(|e| io_failure(&e))?;
    } else {
        writeln!(ctx.out, "{}: {} {}", built.image, built.action, built.image_id).map_err(|e| io_failure(&e))?;
    }
    Ok(())
}
