//! How clients reach an engine's OpenAI API: the address to probe for a bind address, the base
//! URL, and the API key the kit configures (`engine.api_keys`). Used by the node agent (health,
//! readiness), the supervisor (the endpoint in the status snapshot) and `bench`.

use crate::dirs::Dirs;
use crate::kit::schema::Kit;

/// The address clients on this machine use for a bind address (`0.0.0.0` → loopback).
#[must_use]
pub fn probe_host(bind: &str) -> &str {
    match bind {
        "0.0.0.0" => "127.0.0.1",
        "::" => "::1",
        other => other,
    }
}

/// `http://host:port` with IPv6 hosts bracketed.
#[must_use]
pub fn base_url(host: &str, port: u32) -> String {
    if host.contains(':') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// The API key for the endpoint from `engine.api_keys` (env var name or file), if any.
pub fn api_key(kit: &Kit, env: &[(String, String)], dirs: &Dirs) -> Result<Option<String>, String> {
    if let Some(name) = &kit.engine.api_keys.env {
        if let Some((_, v)) = env.iter().rev().find(|(k, _)| k == name) {
            if !v.is_empty() {
                return Ok(Some(v.clone()));
            }
        }
    }
    if let Some(f) = &kit.engine.api_keys.file {
        let path = dirs.expand(f);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("engine.api_keys.file {}: {e}", path.display()))?;
        return Ok(text.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(base_url(probe_host("0.0.0.0"), 8000), "http://127.0.0.1:8000");
        assert_eq!(base_url(probe_host("::"), 8000), "http://[::1]:8000");
        assert_eq!(base_url("::1", 8000), "http://[::1]:8000");
        assert_eq!(probe_host("10.0.0.1"), "10.0.0.1");
    }
}
