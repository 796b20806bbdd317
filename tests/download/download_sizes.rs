//! Sizes as large as the real Engram shards: the test Hub serves a sparse file of
//! 101,537,926,640 B (`model-00048-of-00048.safetensors`), and spark-kit's data path fetches the
//! ranges a resume journal leaves missing — across the 4 GiB boundary, past 50 GB (where
//! huggingface_hub stops using plain HTTP) and the tail — into their offsets. Range-only: the
//! file is never hashed whole here (the process is killed once the ranges are journaled).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use fake_hub::harness::MODEL;
use fake_hub::{seeded_bytes, FakeFile, Setup};

const SIZE: u64 = 101_537_926_640;
const SHARD: &str = "model-00048-of-00048.safetensors";
const RANGE: u64 = 32 << 20;

#[test]
fn ranges_past_4_gib_and_50_gb_land_at_their_offsets() {
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("shard.bin");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(SIZE).unwrap(); // sparse: no disk used
    let markers = [(4u64 << 30) - 3, 50_000_000_007, SIZE - 16];
    for (i, &at) in markers.iter().enumerate() {
        f.write_all_at(&seeded_bytes(&format!("marker{i}"), 16), at).unwrap();
    }
    let sha = "ab".repeat(32); // never checked: the file is not hashed whole
    let files = vec![
        FakeFile::bytes("config.json", b"{\"model_type\": \"deepseek\"}".to_vec(), false),
        FakeFile::disk(SHARD, src.clone(), SIZE, &sha),
    ];
    let s = Setup::with_files(files, None);
    // The ranges holding the markers (the first one straddles two); everything else "done".
    let mut wanted: Vec<(u64, u64)> = markers
        .iter()
        .flat_map(|&at| [at / RANGE, (at + 15) / RANGE])
        .map(|k| (k * RANGE, ((k + 1) * RANGE).min(SIZE)))
        .collect();
    wanted.dedup();
    assert_eq!(wanted.len(), 4);
    let mut done = Vec::new();
    let mut at = 0;
    for &(a, b) in &wanted {
        if a > at {
            done.push(serde_json::json!([at, a]));
        }
        at = b;
    }
    let blobs = s.repo_dir(MODEL).join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let partial = blobs.join(format!("{sha}.spark-partial"));
    std::fs::File::create(&partial).unwrap().set_len(SIZE).unwrap();
    let journal = serde_json::json!({"version": 1, "repo": MODEL, "path": SHARD, "commit": s.commit,
        "etag": sha, "size": SIZE, "done": done});
    std::fs::write(blobs.join(format!("{sha}.spark-partial.json")), journal.to_string()).unwrap();

    let mut child = s
        .cmd(&["download", "--quiet", "--jobs", "4", "--idle-timeout", "10"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let covered: u64 = s.journals(MODEL).get(SHARD).map_or(0, |d| d.iter().map(|(a, b)| b - a).sum());
        if covered == SIZE {
            break;
        }
        assert!(Instant::now() < deadline, "the missing ranges were not journaled in 120 s");
        if child.try_wait().unwrap().is_some() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            panic!("download ended early: {err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // before it hashes 101.5 GB
    child.wait().unwrap();

    let got = std::fs::File::open(&partial).unwrap();
    for (i, &at) in markers.iter().enumerate() {
        let mut buf = [0u8; 16];
        got.read_exact_at(&mut buf, at).unwrap();
        assert_eq!(buf.to_vec(), seeded_bytes(&format!("marker{i}"), 16), "marker {i} at byte {at}");
    }
    let mut served: Vec<(u64, u64)> = s
        .hub
        .served()
        .iter()
        .filter(|r| r.path == SHARD && r.status == 206)
        .map(|r| r.range.map(|(a, b)| (a, b + 1)).unwrap())
        .collect();
    served.sort_unstable();
    assert_eq!(served, wanted, "exactly the missing ranges, at their real offsets");
}
