//! Engram row store and packer against synthetic shards written as real safetensors
//! (tests/engram_fixture): owned rows exact, non-owned zeros, out-of-range errors, ranks 0 and 1
//! covering every row once, packed == checkpoint, corrupt / truncated / wrong-rank / wrong-layer
//! shards refused, and a `kill -9` in the middle of `pack-engram` followed by a clean rerun.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::engram_fixture;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use engram_fixture::{record, LAYERS};
use spark_kit::engram::header::{file_name, PackedHeader};
use spark_kit::engram::layout::{Geometry, Owned};
use spark_kit::engram::pack::{pack, Outcome, PackJob, PackReporter};
use spark_kit::engram::store::{IoReporter, RowStore, StoreOptions};
use spark_kit::engram::table::{checkpoint_table, open_source};
use spark_kit::engram::ROW_BYTES;

/// Rows ≈ 24 heads × the base: 12,000 gives ~288k rows (~76 MiB) a layer.
const VOCAB: u64 = 12_000;

#[derive(Default)]
struct Notes(Mutex<Vec<String>>);
impl IoReporter for Notes {
    fn buffered_fallback(&self, path: &Path, reason: &str) {
        self.0.lock().unwrap().push(format!("{}: {reason}", path.display()));
    }
}
impl PackReporter for Notes {
    fn note(&self, m: &str) {
        self.0.lock().unwrap().push(m.to_string());
    }
}

/// Deterministic pseudo-random ids in `[0, n)`.
fn ids(n: u64, count: usize, seed: u64) -> Vec<i64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as i64
        })
        .collect()
}

fn opts(threads: usize) -> StoreOptions {
    StoreOptions { direct: true, threads, cache_bytes: 0, cache_ways: 8, resident_scales: false }
}

fn check_rows(layer: u32, owned: Owned, ids: &[i64], out: &[u8]) {
    for (&id, row) in ids.iter().zip(out.chunks_exact(ROW_BYTES)) {
        if id >= 0 && owned.contains(id as u64) {
            assert_eq!(row, &record(layer, id as u64)[..], "layer {layer} row {id}");
        } else {
            assert!(row.iter().all(|&b| b == 0), "layer {layer} id {id} not owned but not zero");
        }
    }
}

#[test]
fn store_and_packer_on_real_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("engram");
    let rows = engram_fixture::write(&src, VOCAB);
    let (geometry, ckpt) = open_source(&src).unwrap();
    let out_dir = tmp.path().join("packed");
    let notes = Notes::default();
    for (li, &layer) in LAYERS.iter().enumerate() {
        let table = checkpoint_table(&ckpt, &src, layer).unwrap();
        assert_eq!(table.rows, rows[li]);
        assert_ne!(table.weight.offset % 4096, 0, "the fixture puts the table at an unaligned offset");
        let r0 = geometry.owned(layer, 2, 1, 0).unwrap();
        let r1 = geometry.owned(layer, 2, 1, 1).unwrap();
        // Ranks 0 and 1 cover every row once: adjacent, disjoint, from 0 to the table's end.
        assert_eq!((r0.lo, r0.hi, r1.lo, r1.hi), (0, r0.hi, r0.hi, table.rows));
        assert!(r0.rows() > 0 && r1.rows() > 0);
        let mut probe = ids(table.rows, 3000, u64::from(layer));
        probe.extend([0, -1, r0.hi as i64 - 1, r0.hi as i64, table.rows as i64 - 1]);
        let mut owned_by = vec![0u8; probe.len()];
        for (rank, owned) in [(0, r0), (1, r1)] {
            for threads in [1, 6] {
                let store = RowStore::open_checkpoint(&table, owned, opts(threads), &notes).unwrap();
                let mut out = vec![0xAAu8; probe.len() * ROW_BYTES];
                let stats = store.lookup(&probe, &mut out).unwrap();
                check_rows(layer, owned, &probe, &out);
                assert_eq!(stats.read + stats.zero_filled, probe.len());
                if threads == 1 {
                    for (k, &id) in probe.iter().enumerate() {
                        owned_by[k] += u8::from(id >= 0 && owned.contains(id as u64));
                    }
                }
                // Out of range: an error naming the shard, the id and the offset; no partial silence.
                for bad in [table.rows as i64, -2] {
                    let e = store.lookup(&[5, bad], &mut vec![0u8; 2 * ROW_BYTES]).unwrap_err().to_string();
                    assert!(
                        e.contains(&table.weight.path.display().to_string())
                            && e.contains(&format!("row id {bad} is outside the {}-row table", table.rows))
                            && e.contains("offset"),
                        "{e}"
                    );
                }
                assert!(store.lookup(&[1], &mut [0u8; 10]).is_err());
            }
            // Cache and resident scales change nothing in the result.
            let cached = StoreOptions { cache_bytes: 8 << 20, resident_scales: true, ..opts(4) };
            let store = RowStore::open_checkpoint(&table, owned, cached, &notes).unwrap();
            assert!(store.cache_bytes() > 0);
            for _ in 0..2 {
                let mut out = vec![0u8; probe.len() * ROW_BYTES];
                store.lookup(&probe, &mut out).unwrap();
                check_rows(layer, owned, &probe, &out);
            }
            let mut out = vec![0u8; probe.len() * ROW_BYTES];
            assert!(store.lookup(&probe, &mut out).unwrap().cached > 0);
            // Pack this rank, then the packed shard serves the same rows.
            let job = PackJob { table: table.clone(), owned, rank, world: 2, out_dir: out_dir.clone() };
            let packed = pack(&job, &notes).unwrap();
            assert_eq!(packed.outcome, Outcome::Written);
            assert_eq!(packed.path, out_dir.join(file_name(layer, rank, 2)));
            let bytes = std::fs::read(&packed.path).unwrap();
            assert_eq!(bytes.len() as u64, 4096 + owned.rows() * 264);
            for (i, rec) in bytes[4096..].chunks_exact(ROW_BYTES).enumerate() {
                if rec != &record(layer, owned.lo + i as u64)[..] {
                    panic!("packed record {i} of layer {layer} rank {rank} differs from the checkpoint row");
                }
            }
            let store = RowStore::open_packed(&packed.path, &job.header(), opts(4), &notes).unwrap();
            let mut out = vec![0u8; probe.len() * ROW_BYTES];
            store.lookup(&probe, &mut out).unwrap();
            check_rows(layer, owned, &probe, &out);
            assert_eq!(pack(&job, &notes).unwrap().outcome, Outcome::AlreadyComplete);
        }
        assert!(owned_by.iter().all(|&n| n == 1 || n == 0), "a row owned by both ranks");
        assert_eq!(
            owned_by.iter().filter(|&&n| n == 1).count(),
            probe.iter().filter(|&&i| i >= 0).count(),
            "a valid row owned by no rank"
        );
    }
    packed_refusals(&out_dir, &geometry, &src, &notes);
}

/// Wrong rank, wrong layer, corrupt header, truncation: clear errors naming the file; the packer
/// replaces a bad shard.
fn packed_refusals(out_dir: &Path, g: &Geometry, src: &Path, notes: &Notes) {
    let r0 = g.owned(1, 2, 1, 0).unwrap();
    let r1 = g.owned(1, 2, 1, 1).unwrap();
    let rows = g.num_embeddings[0];
    let p0 = out_dir.join(file_name(1, 0, 2));
    let open = |p: &Path, want: PackedHeader| match RowStore::open_packed(p, &want, opts(2), notes) {
        Ok(_) => panic!("{} opened with the wrong expectation", p.display()),
        Err(e) => e.to_string(),
    };
    let e = open(&p0, PackedHeader::new(1, r1.lo, r1.hi, rows));
    assert!(e.contains(&p0.display().to_string()) && e.contains("another rank"), "{e}");
    let e = open(&p0, PackedHeader::new(14, r0.lo, r0.hi, rows));
    assert!(e.contains("holds layer 1, expected layer 14"), "{e}");
    let want = PackedHeader::new(1, r0.lo, r0.hi, rows);
    let mut bytes = std::fs::read(&p0).unwrap();
    bytes[3] ^= 0xFF;
    std::fs::write(&p0, &bytes).unwrap();
    assert!(open(&p0, want).contains("not a packed Engram shard"));
    bytes[3] ^= 0xFF;
    bytes.truncate(bytes.len() - 100);
    std::fs::write(&p0, &bytes).unwrap();
    let e = open(&p0, want);
    assert!(e.contains(&p0.display().to_string()) && e.contains("truncated"), "{e}");
    // The packer does not trust it: it rewrites the shard.
    let (_, ckpt) = open_source(src).unwrap();
    let table = checkpoint_table(&ckpt, src, 1).unwrap();
    let job = PackJob { table, owned: r0, rank: 0, world: 2, out_dir: out_dir.to_path_buf() };
    assert_eq!(pack(&job, notes).unwrap().outcome, Outcome::Written);
    assert!(notes.0.lock().unwrap().iter().any(|n| n.contains("replacing") && n.contains("truncated")));
    assert!(RowStore::open_packed(&p0, &want, opts(2), notes).is_ok());
}

fn spark_kit(args: &[&str], home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_spark-kit"));
    c.args(args).env_clear().env("HOME", home).env("PATH", std::env::var_os("PATH").unwrap_or_default());
    c
}

#[test]
fn pack_engram_command_survives_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("engram");
    engram_fixture::write(&src, VOCAB);
    let out = tmp.path().join("packed");
    let (s, o): (String, String) = (src.display().to_string(), out.display().to_string());
    let args = ["pack-engram", "--kit", "dgx-spark-2x-dsv41-exl3", "--src", &s, "--out", &o, "--rank", "1"];
    // Kill -9 as soon as the first shard's .partial has records in it.
    let partial: PathBuf = out.join(format!("{}.partial", file_name(1, 1, 2)));
    let mut child = spark_kit(&args, tmp.path()).spawn().unwrap();
    let mut killed_mid_write = false;
    for _ in 0..20_000 {
        if std::fs::metadata(&partial).is_ok_and(|m| m.len() > 4096) {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL)
                .unwrap();
            killed_mid_write = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let status = child.wait().unwrap();
    assert!(killed_mid_write, "the .partial never appeared (exit {status:?})");
    assert!(!out.join(file_name(1, 1, 2)).exists(), "a final shard exists after kill -9 mid-write");
    assert!(partial.exists());
    // The rerun starts the partial over, completes and leaves no partial behind.
    let run = spark_kit(&[&args[..], &["--json"]].concat(), tmp.path()).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let shards = v["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 2);
    assert!(shards.iter().all(|s| s["outcome"] == "written" && s["rank"] == 1 && s["world"] == 2));
    assert!(!partial.exists());
    let geometry =
        Geometry::from_config(&serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap())
            .unwrap();
    for layer in LAYERS {
        let owned = geometry.owned(layer, 2, 1, 1).unwrap();
        let bytes = std::fs::read(out.join(file_name(layer, 1, 2))).unwrap();
        assert_eq!(bytes.len() as u64, 4096 + owned.rows() * 264);
        for i in [0, owned.rows() / 2, owned.rows() - 1] {
            let at = 4096 + (i * 264) as usize;
            assert_eq!(&bytes[at..at + 264], &record(layer, owned.lo + i)[..]);
        }
    }
    // Third run: nothing to do.
    let run = spark_kit(&args, tmp.path()).output().unwrap();
    assert!(run.status.success());
    assert_eq!(String::from_utf8_lossy(&run.stdout).matches("already complete").count(), 2);
    // Usage errors exit 2 with a hint.
    for (bad, want) in
        [(vec!["--rank", "2"], "--rank 2 is out of range"), (vec!["--src", "/nonexistent/engram"], "does not exist")]
    {
        let mut a = vec!["pack-engram", "--kit", "dgx-spark-2x-dsv41-exl3", "--out", &o];
        a.extend(bad.iter().copied());
        if !a.contains(&"--src") {
            a.extend(["--src", &s]);
        }
        let r = spark_kit(&a, tmp.path()).output().unwrap();
        let e = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{e}");
        assert!(e.contains(want) && e.contains("hint: "), "{e}");
    }
    // A truncated source shard is a runtime error naming the file.
    let shard = src.join("model-00048-of-00048.safetensors");
    let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.set_len(f.metadata().unwrap().len() - 1000).unwrap();
    let r = spark_kit(&args, tmp.path()).output().unwrap();
    let e = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{e}");
    assert!(e.contains("model-00048-of-00048.safetensors") && e.contains("truncated"), "{e}");
}
