//! The vLLM releases the overlay supports: `python_overlay/supported_vllm.txt`, embedded at build
//! time. The one list that `spark_overlay/plugin.py` (at registration), kit validation,
//! preflight's vLLM check and `tests/vllm-matrix.sh` all read. Pure.

/// The file's text, as committed.
pub const TEXT: &str = include_str!("../python_overlay/supported_vllm.txt");

/// The supported public versions, in file order (comments and blanks skipped).
#[must_use]
pub fn supported() -> Vec<&'static str> {
    TEXT.lines().map(|l| l.split('#').next().unwrap_or_default().trim()).filter(|l| !l.is_empty()).collect()
}

/// `0.32.0, 0.33.0, 0.34.0`: the supported set for messages.
#[must_use]
pub fn supported_list() -> String {
    supported().join(", ")
}

/// The public release of a version: `0.32.0+cpu` → `0.32.0` (the local part is a build flavour).
#[must_use]
pub fn release_of(version: &str) -> &str {
    version.split('+').next().unwrap_or_default().trim()
}

/// Whether the overlay supports `version` (its public release is in the file).
#[must_use]
pub fn is_supported(version: &str) -> bool {
    supported().contains(&release_of(version))
}

/// Whether a found version satisfies the kit's `engine.vllm_version` pin (empty: any). A pin
/// with a local part (`0.32.0+cpu`) must match exactly; a bare release matches any local part.
#[must_use]
pub fn matches_pin(found: &str, pin: &str) -> bool {
    let (found, pin) = (found.trim(), pin.trim());
    pin.is_empty() || found == pin || (!pin.contains('+') && release_of(found) == pin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_lists_releases_and_local_parts_are_ignored() {
        let s = supported();
        assert!(s.contains(&"0.34.0") && s.iter().all(|v| v.split('.').count() == 3), "{s:?}");
        assert!(is_supported("0.32.0+cpu") && is_supported("0.34.0+empty"));
        assert!(!is_supported("0.1.dev20904+g179dd0fa9"));
        assert_eq!(release_of("0.1.dev20904+g179dd0fa9"), "0.1.dev20904");
    }

    #[test]
    fn pins_match_the_release_unless_they_name_a_local_part() {
        assert!(matches_pin("0.34.0", "0.34.0") && matches_pin("0.34.0+empty", "0.34.0"));
        assert!(matches_pin("0.1.dev1", ""));
        assert!(!matches_pin("0.33.0", "0.34.0"));
        assert!(matches_pin("0.32.0+cpu", "0.32.0+cpu") && !matches_pin("0.32.0", "0.32.0+cpu"));
    }
}
