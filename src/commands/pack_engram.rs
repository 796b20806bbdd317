//! `spark-kit pack-engram [--rank R] [--src DIR] [--out DIR] [--json]`: this rank's Engram rows
//! from the slim Engram directory into packed per-rank shards (see docs/engram.md).

use std::path::PathBuf;

use super::{io_failure, load, Context};
use crate::cli::PackEngramArgs;
use crate::engram::pack::{pack, Packed};
use crate::engram::pack_jobs::{line, pack_jobs};
use crate::error::Failure;
use crate::reporter::PackLines;

pub fn run(args: &PackEngramArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = load::settings(&args.kit, &ctx.env)?;
    let kit = &s.kit;
    let Some(engram) = &kit.engram else {
        return Err(Failure::usage(format!("kit `{}` has no `engram` section: nothing to pack", kit.name))
            .with_hint("use a kit whose model has Engram tables (DeepSeek V4.1)"));
    };
    let src = args.src.clone().unwrap_or_else(|| s.deploy.engram_dir.clone());
    if !src.is_dir() {
        return Err(Failure::usage(format!("Engram directory {} does not exist", src.display()))
            .with_hint("run `spark-kit download --only engram` (it builds paths.engram_dir), or pass --src DIR"));
    }
    let out: PathBuf = args.out.clone().unwrap_or_else(|| s.deploy.packed_dir.clone());
    let tp = kit.tensor_parallel_size;
    let ranks: Vec<u32> = match args.rank {
        Some(r) if r >= tp => {
            return Err(Failure::usage(format!("--rank {r} is out of range: tensor_parallel_size is {tp}"))
                .with_hint(format!("use a rank from 0 to {}", tp.saturating_sub(1))))
        }
        Some(r) => vec![r],
        None => (0..tp).collect(),
    };
    let jobs = pack_jobs(&src, &engram.layers, &ranks, tp, &out).map_err(|e| {
        let f = if e.is_config() { Failure::usage_error(&e) } else { Failure::runtime_error(&e) };
        f.with_hint_opt(e.hint().map(str::to_string))
    })?;
    let rep = PackLines::new(args.quiet || args.json);
    let mut done: Vec<Packed> = Vec::with_capacity(jobs.len());
    for job in &jobs {
        done.push(pack(job, &rep)?);
    }
    let text = if args.json {
        serde_json::to_string_pretty(&serde_json::json!({ "src": src, "out": out, "tp": tp, "shards": done }))?
    } else {
        done.iter().map(|p| format!("{}\n", line(p))).collect()
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))
}
