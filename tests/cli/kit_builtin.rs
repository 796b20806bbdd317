//! Every built-in kit parses, validates and survives a YAML round trip; reference values hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use spark_kit::kit::{self, builtin::BUILTINS, schema::SpecMethod};

fn load(name: &str) -> kit::Resolved {
    kit::resolve(kit::source(Some(name)).unwrap(), &[], &[]).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_builtin_validates_and_round_trips() {
    for b in BUILTINS {
        let r = load(b.name);
        let text = serde_yaml::to_string(&r.kit).unwrap();
        let src = kit::KitSource { name: b.name.into(), display: "roundtrip.yaml".into(), text, builtin: false };
        let again = kit::resolve(src, &[], &[]).unwrap();
        assert_eq!(again.kit, r.kit, "{}", b.name);
    }
}

#[test]
fn spark_kit_carries_the_reference_values() {
    let k = load("dgx-spark-2x-dsv41-exl3").kit;
    assert_eq!(k.engine.port, 8888);
    assert_eq!(k.tensor_parallel_size, 2);
    assert_eq!(k.engine.max_model_len, 600_000);
    assert_eq!(k.engine.max_num_seqs, 2);
    assert_eq!(k.engine.max_num_batched_tokens, 1536);
    assert_eq!(k.engine.kv_cache_bytes.bytes(), 2_684_354_560);
    assert_eq!(k.engine.block_size, 64);
    assert_eq!((k.engine.speculative.method, k.engine.speculative.tokens), (SpecMethod::Dspark, 3));
    assert_eq!(k.memory.boot_margin.bytes(), 12 << 30);
    assert_eq!(k.model.expected_shards, 39);
    assert_eq!(k.engine.extra_env.get("NCCL_PROTO").map(String::as_str), Some("^LL128"));
    assert_eq!(k.nodes.len(), 2);
}

#[test]
fn env_pairs_are_order_independent() {
    let a = [
        ("SPARK_KIT_ENGINE__PORT".to_string(), "1234".to_string()),
        ("SPARK_KIT_ENGINE__HOST".into(), "0.0.0.0".into()),
    ];
    let mut b = a.clone();
    b.reverse();
    let ka = kit::resolve(kit::source(Some("tiny-cpu")).unwrap(), &a, &[]).unwrap().kit;
    let kb = kit::resolve(kit::source(Some("tiny-cpu")).unwrap(), &b, &[]).unwrap().kit;
    assert_eq!(ka, kb);
    assert_eq!(ka.engine.port, 1234);
}
