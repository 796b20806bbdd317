//! Fuzz the safetensors header parser: any byte string is a whole "file"; the parser must
//! return Ok or a named error, never panic, and what it accepts must be self-consistent.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
#[allow(dead_code)]
#[path = "../../src/checkpoint/safetensors.rs"]
mod safetensors;

use safetensors::parse_shard_bytes;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = parse_shard_bytes(Path::new("fuzz.safetensors"), data) {
        let data_len = header.data_len();
        let mut last_end = 0;
        for t in &header.tensors {
            assert!(t.begin <= t.end && t.end <= data_len);
            if t.begin < t.end {
                assert!(t.begin >= last_end, "overlap accepted");
                last_end = t.end;
            }
        }
    }
});
