//! `spark-kit pack-engram [--rank R] [--src DIR] [--out DIR] [--json]`: this rank's Engram rows
//! from the slim Engram directory into packed per-rank shards (see docs/engram.md).

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{io_failure, load, Context};
use crate::cli::PackEngramArgs;
use crate::dirs::Dirs;
use crate::engram::pack::{pack, Outcome, PackJob, Packed};
use crate::engram::table::{checkpoint_table, open_source};
use crate::engram::EngramError;
use crate::error::Failure;
use crate::kit::bytes::human_size as size;
use crate::reporter::PackLines;

fn failure(e: &EngramError) -> Failure {
    let f = if e.is_config() { Failure::usage(e.to_string()) } else { Failure::runtime(e.to_string()) };
    match e.hint() {
        Some(h) => f.with_hint(h),
        None => f,
    }
}

/// Where `pack-engram` puts the shards by default (the engine's `SPARK_ENGRAM_PACKED_DIR`).
#[must_use]
pub fn default_packed_dir(kit: &crate::kit::schema::Kit, dirs: &Dirs) -> PathBuf {
    crate::engram::packed_dir(kit, dirs)
}

pub fn run(args: &PackEngramArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let resolved = load::resolve(&args.kit, &ctx.env)?;
    let kit = &resolved.kit;
    let Some(engram) = &kit.engram else {
        return Err(Failure::usage(format!("kit `{}` has no `engram` section: nothing to pack", kit.name))
            .with_hint("use a kit whose model has Engram tables (DeepSeek V4.1)"));
    };
    let dirs = Dirs::from_env(&ctx.env);
    let src = args.src.clone().unwrap_or_else(|| dirs.expand(&kit.paths.engram_dir));
    if !src.is_dir() {
        return Err(Failure::usage(format!("Engram directory {} does not exist", src.display()))
            .with_hint("run `spark-kit download --only engram` (it builds paths.engram_dir), or pass --src DIR"));
    }
    let out: PathBuf = args.out.clone().unwrap_or_else(|| default_packed_dir(kit, &dirs));
    let tp = kit.tensor_parallel_size;
    let ranks: Vec<u32> = match args.rank {
        Some(r) if r >= tp => {
            return Err(Failure::usage(format!("--rank {r} is out of range: tensor_parallel_size is {tp}"))
                .with_hint(format!("use a rank from 0 to {}", tp.saturating_sub(1))))
        }
        Some(r) => vec![r],
        None => (0..tp).collect(),
    };
    let (geometry, ckpt) = open_source(&src).map_err(|e| failure(&e))?;
    let mut jobs = Vec::new();
    for &layer in &engram.layers {
        let Some(i) = geometry.index_of(layer) else {
            return Err(Failure::usage(format!(
                "engram.layers lists layer {layer}, but {}/config.json engram_layer_ids is {:?}",
                src.display(),
                geometry.layer_ids
            ))
            .with_hint("fix engram.layers in the kit"));
        };
        let table = checkpoint_table(&ckpt, &src, layer).map_err(|e| failure(&e))?;
        if table.rows != geometry.num_embeddings[i] {
            return Err(Failure::runtime(format!(
                "{}: layer {layer}'s table has {} rows, config.json engram_num_embeddings says {}",
                table.weight.path.display(),
                table.rows,
                geometry.num_embeddings[i]
            ))
            .with_hint("the shards and config.json come from different checkpoints; re-download the Engram files"));
        }
        for &rank in &ranks {
            let owned = geometry.owned(layer, tp, 1, rank).map_err(|e| Failure::usage_error(&e))?;
            jobs.push(PackJob { table: table.clone(), owned, rank, world: tp, out_dir: out.clone() });
        }
    }
    let rep = PackLines::new(args.quiet || args.json);
    let mut done: Vec<Packed> = Vec::with_capacity(jobs.len());
    for job in &jobs {
        done.push(pack(job, &rep).map_err(|e| failure(&e))?);
    }
    let text = if args.json {
        serde_json::to_string_pretty(&serde_json::json!({ "src": src, "out": out, "tp": tp, "shards": done }))
            .map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        let mut s = String::new();
        for p in &done {
            let what = match p.outcome {
                Outcome::Written => format!("written in {:.1} s", p.seconds),
                Outcome::AlreadyComplete => "already complete".to_string(),
            };
            let _ = writeln!(
                s,
                "{}: layer {} rank {}/{} rows [{}, {}), {}, {what}",
                p.path.display(),
                p.layer,
                p.rank,
                p.world,
                p.lo,
                p.hi,
                size(p.bytes)
            );
        }
        s
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))
}
