//! Repository paths and URL segments: validation (no traversal) and percent-encoding. Pure.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Characters kept as-is in one URL path segment (RFC 3986 unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Why a path from a listing is refused, or `Ok` when it is a plain relative path inside the repo.
pub fn check_repo_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.starts_with('/') {
        return Err("absolute path");
    }
    if path.contains('\\') {
        return Err("backslash in path");
    }
    if path.contains('\0') {
        return Err("NUL byte in path");
    }
    for seg in path.split('/') {
        match seg {
            "" => return Err("empty path segment"),
            "." | ".." => return Err("`.` or `..` segment"),
            _ => {}
        }
    }
    Ok(())
}

/// A revision as one URL segment (`refs/pr/1` → `refs%2Fpr%2F1`).
#[must_use]
pub fn encode_revision(rev: &str) -> String {
    utf8_percent_encode(rev, SEGMENT).to_string()
}

/// A repo path encoded per segment, keeping the `/` between segments.
#[must_use]
pub fn encode_path(path: &str) -> String {
    path.split('/').map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect::<Vec<_>>().join("/")
}

/// A 40-hex git commit id.
#[must_use]
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A ref name usable as a file under `refs/`: relative, no `..`, no empty segments.
#[must_use]
pub fn is_safe_ref(s: &str) -> bool {
    check_repo_path(s).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traversal_refused() {
        for bad in ["../x", "/etc/passwd", "a/../b", "a//b", "./a", "a/.", "", "a\\..\\b", "..", "a/"] {
            assert!(check_repo_path(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["config.json", "a/b/c.safetensors", "..hidden", "a..b/c"] {
            assert!(check_repo_path(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn encoding() {
        assert_eq!(encode_revision("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode_revision("main"), "main");
        assert_eq!(encode_path("dir/a b#.json"), "dir/a%20b%23.json");
        assert!(is_commit(&"ab12".repeat(10)));
        assert!(!is_commit("main"));
    }
}
