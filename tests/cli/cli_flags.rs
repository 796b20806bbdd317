//! The flags checked by clap value parsers (src/cli/values.rs), through the real binary: a bad
//! value is refused while the command line is parsed — before the kit is read (the kit named
//! here does not exist) — with one `error:` line and its `hint:`, exit 2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::spark_kit;

/// `(args, the error line, the hint line)`; each command also names a kit that does not exist.
const CASES: &[(&[&str], &str, &str)] = &[
    (&["download", "--jobs", "0"], "--jobs 0 is out of range", "use 1 to 256 (default 16)"),
    (&["download", "--jobs", "many"], "--jobs many: not a whole number", "use 1 to 256 (default 16)"),
    (&["download", "--range-size", "1"], "--range-size is below 4KiB", "use e.g. 32MiB (the default)"),
    (
        &["download", "--idle-timeout", "0"],
        "--idle-timeout 0: must be at least 1 second",
        "use e.g. --idle-timeout 60 (the default)",
    ),
    (&["download", "--retries", "0"], "--retries 0: must be at least 1 attempt", "use e.g. --retries 8 (the default)"),
    (&["bench", "--timeout", "0"], "--timeout 0: must be a positive number of seconds", "use e.g. --timeout 600"),
    (&["bench", "--temperature", "2.5"], "--temperature 2.5: out of range 0..=2", "use --temperature 0"),
    (
        &["bench", "--prefill-repeats", "0"],
        "--prefill-repeats 0: need at least one request per length",
        "use e.g. --prefill-repeats 3, or --prefill none to skip the ladder",
    ),
    (
        &["bench", "--decode-repeats", "10001"],
        "--decode-repeats 10001: out of range 1..=10000",
        "use e.g. --decode-repeats 1 (one wave per concurrency level)",
    ),
    (&["bench", "--decode-tokens", "0"], "--decode-tokens 0: out of range 1..=16m", "use e.g. --decode-tokens 256"),
    (
        &["bench", "--decode-prompt-tokens", "99999999"],
        "--decode-prompt-tokens 99999999: out of range 1..=16m",
        "use e.g. --decode-prompt-tokens 256",
    ),
    (&["guard", "--drain", "601"], "--drain: 601 is out of range", "give seconds between 0 and 600"),
];

#[test]
fn a_refused_flag_value_is_one_error_line_and_its_hint_before_the_kit_is_read() {
    for (args, error, hint) in CASES {
        let out = spark_kit().args(*args).args(["--kit", "/nonexistent/kit.yaml"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr, format!("error: {error}\nhint: {hint}\n"), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn other_parse_errors_are_still_clap_s() {
    let out = spark_kit().args(["download", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: unexpected argument '--no-such-flag'"), "{stderr}");
}
