//! `spark-kit setup`: the kit's engine venv.

use super::{io_failure, load, Context};
use crate::cli::SetupArgs;
use crate::error::Failure;
use crate::reporter::Lines;
use crate::runtime::venv::{build as venv, prune::prune, recipe::Recipe};

pub fn run(args: &SetupArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = load::settings(&args.kit, &ctx.env)?;
    let kit = &s.kit;
    if let Some(image) = crate::runtime::of(kit).image(kit) {
        return Err(Failure::usage(format!(
            "kit {} runs the engine from the docker image {image}; `setup` makes venvs only",
            kit.name
        ))
        .with_hint(format!(
            "pull that image on every node (`docker pull {image}`); `spark-kit preflight` checks its vLLM"
        )));
    }
    let recipe = Recipe::load(&kit.engine.requirements)?;
    recipe.check_host(std::env::consts::ARCH, venv::BUILD_PYTHON_VERSION).map_err(|e| {
        Failure::usage_error(&e).with_hint(
            "run `spark-kit setup` on the nodes themselves, with a spark-kit built there against that CPython \
             (docs/operations.md, \"Which vLLM\"); on this machine use --kit tiny-cpu",
        )
    })?;
    let reporter = Lines::new(args.quiet || args.json);
    let info =
        venv::ensure(&s.deploy.dirs.cache, &recipe, &reporter, &crate::cancel::Cancel::default()).map_err(|e| {
            let cache_hint = e.cache_hint(&s.deploy.dirs.cache);
            let f = Failure::from(e);
            if f.hint.is_none() {
                f.with_hint_opt(cache_hint)
            } else {
                f
            }
        })?;
    let pruned =
        if args.keep_old { Vec::new() } else { prune(&s.deploy.dirs.cache.join("venvs"), &recipe.name, &info.path) };
    if args.json {
        let mut v = serde_json::to_value(&info)?;
        if let serde_json::Value::Object(m) = &mut v {
            m.insert("pruned".into(), serde_json::to_value(&pruned)?);
        }
        let text = serde_json::to_string_pretty(&v)?;
        writeln!(ctx.out, "{text}").map_err(|e| io_failure(&e))
    } else {
        for p in &pruned {
            let gib = p.bytes as f64 / f64::from(1u32 << 30);
            let line = match &p.kept {
                None => format!("removed the old venv {} ({gib:.1} GiB)", p.path.display()),
                Some(why) => format!("kept the old venv {} ({gib:.1} GiB): {why}", p.path.display()),
            };
            writeln!(ctx.err, "{line}").map_err(|e| io_failure(&e))?;
        }
        let how = if info.cached { "ready (cached)" } else { "built" };
        writeln!(ctx.out, "engine venv {how}: {}", info.path.display()).map_err(|e| io_failure(&e))
    }
}
