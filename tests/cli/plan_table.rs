//! Issue 21 item 1(c): the reference kit's measured long-prefill runs replayed through the
//! planner. Fails if the plan approves a run the reference saw die, or if docs/plan.md does not
//! show the table the code renders (`SPARK_KIT_TEST_BLESS=1` rewrites it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use spark_kit::checkpoint::budget::weight_budget;
use spark_kit::checkpoint::virtual_ckpt::{deepseek_v41_flash_exl3, DeepSeekV41Dims};
use spark_kit::kit::bytes::GIB;
use spark_kit::kit::schema::Kit;
use spark_kit::plan::reference::Outcome;
use spark_kit::plan::replay::{markdown, replay, Replayed};
use spark_kit::plan::{input_from_kit, PlanInput};

fn spark_kit() -> Kit {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/launch-kits/dgx-spark-2x-dsv41-exl3.yaml"))
            .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// What `spark-kit plan` runs on before a download: the Spark kit over the modelled checkpoint,
/// with the ±0.5 % band of a modelled estimate (src/commands/plan.rs).
fn modelled() -> PlanInput {
    let kit = spark_kit();
    let ckpt = deepseek_v41_flash_exl3(&DeepSeekV41Dims::default()).unwrap();
    let per_rank = weight_budget(&ckpt, 2, 40).unwrap().per_rank_bytes;
    let mut input = input_from_kit(&kit, per_rank, "virtual", &[]);
    input.weights_band = per_rank / 1000 * 5;
    input
}

/// The reference configuration as measured: 99.5 GiB/rank, 121.7 GiB nodes, no band.
fn measured() -> PlanInput {
    let mut input = input_from_kit(&spark_kit(), (99.5 * GIB as f64) as u64, "reference-kit.md D", &[]);
    for n in &mut input.nodes {
        n.memory_total = Some((121.7 * GIB as f64) as u64);
    }
    input
}

fn check(name: &str, rows: &[Replayed]) {
    for r in rows {
        println!(
            "{name}: pool {:.1} GiB at {} tokens ({:?}): floor {:.2} (central {:.2}), required {:.2}, safe {} → {}",
            r.row.pool_gib,
            r.row.tokens,
            r.row.outcome,
            r.floor_gib,
            r.floor_central_gib,
            r.required_gib,
            r.safe_prompt,
            if r.approved { "approves" } else { "refuses" }
        );
        if r.row.outcome != Outcome::Alive {
            // Died, or bigger than the pool that died: never approved.
            assert!(!r.approved, "{name}: the plan approves {:?}, which the reference saw die", r.row);
        }
        if let (Outcome::Alive, Some(seen)) = (r.row.outcome, r.row.floor_gib) {
            // The verdict's floor may not be above what was measured: pessimistic means ≤.
            assert!(r.floor_gib <= seen + 0.02, "{name}: predicted floor {:.2} above measured {seen}", r.floor_gib);
        }
    }
}

#[test]
fn the_plan_refuses_every_run_the_reference_saw_die() {
    let m = replay(&measured());
    check("measured inputs", &m);
    // With the reference's own numbers the model reproduces its anchors and approves them.
    assert!(m.iter().filter(|r| r.row.outcome == Outcome::Alive).all(|r| r.approved));
    assert!((m[1].floor_gib - 2.10).abs() < 0.02, "{}", m[1].floor_gib);
    let v = replay(&modelled());
    check("modelled shapes", &v);
    // The 2.5 GiB pool that served 455k is approved on modelled shapes too; 601k is refused:
    // the band of a modelled estimate is larger than the 0.09 GiB the run had to spare.
    assert!(v[0].approved && !v[1].approved);
}

#[test]
fn docs_show_the_replay_table() {
    let table = format!(
        "{}\n{}",
        markdown("Measured inputs (reference-kit.md D)", &measured(), &replay(&measured())),
        markdown("`spark-kit plan` before a download (modelled shapes)", &modelled(), &replay(&modelled()))
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/plan.md");
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    let (begin, end) = ("<!-- replay table: begin -->\n", "<!-- replay table: end -->");
    let start = doc.find(begin).map(|i| i + begin.len());
    let stop = doc.find(end);
    let current = match (start, stop) {
        (Some(a), Some(b)) if a <= b => &doc[a..b],
        _ => "",
    };
    if current != table {
        if std::env::var_os("SPARK_KIT_TEST_BLESS").is_some() {
            let (a, b) = (start.unwrap(), stop.unwrap());
            std::fs::write(path, format!("{}{table}{}", &doc[..a], &doc[b..])).unwrap();
        } else {
            panic!("docs/plan.md's replay table differs from the plan's; rerun with SPARK_KIT_TEST_BLESS=1\n{table}");
        }
    }
}

#[test]
fn the_pool_fix_works_as_printed() {
    // The warning's `--set engine.kv_cache_bytes=…` for a 3.5 GiB pool (no prompt safe), applied
    // as printed, gives a plan whose max_model_len prefill is safe.
    use spark_kit::plan::plan;
    let mut input = modelled();
    input.kv_cache_bytes = 3584 * 1024 * 1024;
    let p = plan(&input);
    let w = p.warnings.iter().find(|w| w.message.contains("600000-token prefill")).unwrap();
    assert!(!w.fix.contains("max_model_len to 0"), "{}", w.fix);
    assert!(w.fix.contains("(no prompt is safe with this pool)"), "{}", w.fix);
    let set = w.fix.split("`--set ").nth(1).unwrap().split('`').next().unwrap();
    let (key, value) = set.split_once('=').unwrap();
    assert_eq!(key, "engine.kv_cache_bytes");
    let mib: u64 = value.strip_suffix("MiB").unwrap().parse().unwrap();
    input.kv_cache_bytes = mib * 1024 * 1024;
    let p = plan(&input);
    let pre = p.nodes[0].prefill.as_ref().unwrap();
    assert!(pre.floor_at_max_model_len >= pre.required_floor, "{value}: {pre:?}");
    assert_eq!(pre.safe_max_prompt, 600_000, "{value}");
}
