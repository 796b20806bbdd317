//! The vLLM releases the overlay supports: the `SUPPORTED_VLLM_VERSIONS` constant of
//! `python_overlay/spark_overlay/plugin.py`, embedded at build time and parsed here, so the
//! overlay's registration gate, kit validation, preflight's vLLM check and
//! `tests/vllm-matrix.sh` (which reads the same constant) can never disagree. Pure.

/// The overlay's plugin module, as committed.
const PLUGIN: &str = include_str!("../python_overlay/spark_overlay/plugin.py");

/// The name of the constant in [`PLUGIN`].
const CONSTANT: &str = "SUPPORTED_VLLM_VERSIONS";

/// The quoted strings inside the braces of the `SUPPORTED_VLLM_VERSIONS` assignment of a Python
/// module's text (`… = frozenset({"0.32.0", "0.33.0"})`), sorted by release.
#[must_use]
pub fn parse(module: &str) -> Vec<&str> {
    let at = if module.starts_with(CONSTANT) { Some(0) } else { module.find(&format!("\n{CONSTANT}")).map(|i| i + 1) };
    let Some(tail) = at.map(|i| &module[i..]) else { return Vec::new() };
    let Some(open) = tail.find('{') else { return Vec::new() };
    let Some(len) = tail[open + 1..].find('}') else { return Vec::new() };
    let mut out: Vec<&str> = tail[open + 1..open + 1 + len]
        .split(',')
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\''))
        .filter(|v| !v.is_empty())
        .collect();
    out.sort_by_key(|v| v.split('.').map(|p| p.parse::<u32>().unwrap_or(0)).collect::<Vec<_>>());
    out
}

/// The supported public versions, oldest first.
#[must_use]
pub fn supported() -> Vec<&'static str> {
    parse(PLUGIN)
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
    fn the_constant_is_parsed_from_the_plugin_module() {
        let module = "X = 1\nSUPPORTED_VLLM_VERSIONS: frozenset[str] = frozenset(\n    {\"0.33.0\", '0.10.1'}\n)\n";
        assert_eq!(parse(module), ["0.10.1", "0.33.0"]);
        assert!(parse("nothing here").is_empty());
    }

    #[test]
    fn the_plugin_lists_releases_and_local_parts_are_ignored() {
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
