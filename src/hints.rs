//! The commands spark-kit prints for the user to copy: `spark-kit status --kit tiny-cpu`, the
//! `curl` example with its `Authorization` header. Pure text; every hint is run as printed by
//! the tests.

use crate::deploy::keys::{first_key, FirstKey};
use crate::kit::schema::ApiKeys;

/// The kit a deployment was started with, as the user named it (`None`: the default kit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KitRef {
    pub arg: Option<String>,
}

impl KitRef {
    #[must_use]
    pub fn new(arg: Option<&str>) -> Self {
        Self { arg: arg.map(str::to_string) }
    }

    /// `spark-kit <sub> [--kit K] <extra…>`, quoted for a POSIX shell.
    #[must_use]
    pub fn command(&self, sub: &str, extra: &[&str]) -> String {
        let mut out = format!("spark-kit {sub}");
        if let Some(k) = &self.arg {
            out.push_str(" --kit ");
            out.push_str(&shell_quote(k));
        }
        for e in extra {
            out.push(' ');
            out.push_str(&shell_quote(e));
        }
        out
    }

    /// The same command in backticks, for running text.
    #[must_use]
    pub fn quoted(&self, sub: &str, extra: &[&str]) -> String {
        format!("`{}`", self.command(sub, extra))
    }
}

/// Quote `s` for a POSIX shell when it needs it (single quotes; `'` as `'\''`).
#[must_use]
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '=' | ',' | '+' | '@'));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Where a copied `curl` gets the API key from: never the key itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `engine.api_keys.env`: the variable's name.
    Env(String),
    /// `engine.api_keys.env` holding several comma-separated keys: the header takes the first.
    EnvList(String),
    /// `engine.api_keys.file`: the file (its first non-blank line is the key).
    File(String),
}

impl KeySource {
    /// Where the running deployment's first key comes from, by the deployment layer's one
    /// env-then-file rule ([`crate::deploy::keys::first_key`]).
    #[must_use]
    pub fn of(keys: &ApiKeys, env: &[(String, String)]) -> Option<Self> {
        Some(match first_key(keys, env)? {
            FirstKey::Env { var, list: false } => Self::Env(var),
            FirstKey::Env { var, list: true } => Self::EnvList(var),
            FirstKey::File(f) => Self::File(f),
        })
    }

    /// The header argument, expanded by the user's shell: `-H "Authorization: Bearer $VAR"`.
    #[must_use]
    pub fn header(&self) -> String {
        match self {
            Self::Env(name) => format!("-H \"Authorization: Bearer ${name}\""),
            // The first of the comma-separated keys (`${VAR%%,*}`), each of which the gateway takes.
            Self::EnvList(name) => format!("-H \"Authorization: Bearer ${{{name}%%,*}}\""),
            // awk: the first field of the first non-blank line, as `engine.api_keys.file` is read.
            Self::File(path) => {
                let p = match path.strip_prefix("~/") {
                    Some(rest) => format!("\"$HOME\"/{}", shell_quote(rest)),
                    None => shell_quote(path),
                };
                format!("-H \"Authorization: Bearer $(awk 'NF{{print $1; exit}}' {p})\"")
            }
        }
    }
}

/// The `curl` example `up` prints: one chat completion against the endpoint.
#[must_use]
pub fn curl_example(base_v1: &str, model: &str, key: Option<&KeySource>) -> String {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 32,
    })
    .to_string();
    let auth = key.map(|k| format!(" {}", k.header())).unwrap_or_default();
    format!("curl {base_v1}/chat/completions -H 'Content-Type: application/json'{auth} -d {}", shell_quote(&body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_sh(script: &str, env: &[(&str, &str)]) -> String {
        let out = std::process::Command::new("sh").arg("-c").arg(script).envs(env.iter().copied()).output().unwrap();
        assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn commands_carry_the_kit_as_given() {
        assert_eq!(KitRef::new(None).command("status", &[]), "spark-kit status");
        assert_eq!(KitRef::new(Some("tiny-cpu")).command("logs", &["-f"]), "spark-kit logs --kit tiny-cpu -f");
        assert_eq!(
            KitRef::new(Some("my kits/a'b.yaml")).quoted("down", &[]),
            r"`spark-kit down --kit 'my kits/a'\''b.yaml'`"
        );
        // The shell gives back exactly what was quoted.
        for s in ["my kits/a'b.yaml", "plain.yaml", "$HOME", "", "a\"b"] {
            assert_eq!(run_sh(&format!("printf %s {}", shell_quote(s)), &[]), s);
        }
    }

    #[test]
    fn header_names_the_variable_or_file_never_the_key() {
        let keys = ApiKeys { env: Some("SPARK_TOKEN".into()), file: None };
        let k = KeySource::of(&keys, &[("SPARK_TOKEN".into(), "s3cret".into())]).unwrap();
        assert_eq!(k.header(), r#"-H "Authorization: Bearer $SPARK_TOKEN""#);
        let curl = curl_example("http://127.0.0.1:8000/v1", "m", Some(&k));
        assert!(!curl.contains("s3cret"), "{curl}");
        // Expanded by the shell, the header carries the key.
        let echoed = run_sh(&format!("printf '%s\\n' {}", k.header()), &[("SPARK_TOKEN", "s3cret")]);
        assert_eq!(echoed, "-H\nAuthorization: Bearer s3cret\n");
        // Several keys in the variable: the header sends the first one.
        let k = KeySource::of(&keys, &[("SPARK_TOKEN".into(), "k-a,k-b".into())]).unwrap();
        assert_eq!(k, KeySource::EnvList("SPARK_TOKEN".into()));
        let echoed = run_sh(&format!("printf '%s\\n' {}", k.header()), &[("SPARK_TOKEN", "k-a,k-b")]);
        assert_eq!(echoed, "-H\nAuthorization: Bearer k-a\n");

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key file");
        std::fs::write(&f, "\n  k-1  \nk-2\n").unwrap();
        let keys = ApiKeys { env: None, file: Some(f.display().to_string()) };
        let k = KeySource::of(&keys, &[]).unwrap();
        assert!(matches!(k, KeySource::File(_)));
        assert_eq!(run_sh(&format!("printf '%s\\n' {}", k.header()), &[]), "-H\nAuthorization: Bearer k-1\n");
        // `~/` in the kit is the user's home.
        let home = dir.path().display().to_string();
        let k = KeySource::File("~/key file".into());
        assert_eq!(
            run_sh(&format!("printf '%s\\n' {}", k.header()), &[("HOME", &home)]),
            "-H\nAuthorization: Bearer k-1\n"
        );
        assert_eq!(KeySource::of(&ApiKeys::default(), &[]), None);
        assert!(!curl_example("http://h:1/v1", "m", None).contains("Authorization"));
    }

    #[test]
    fn curl_body_is_valid_json_after_the_shell() {
        let curl = curl_example("http://127.0.0.1:1/v1", "it's", None);
        let body = curl.split(" -d ").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(&run_sh(&format!("printf %s {body}"), &[])).unwrap();
        assert_eq!(v["model"], "it's");
    }
}
