//! Where spark-kit keeps things: the cache root and `~` expansion. Pure over the environment
//! pairs `main` hands in.

use std::path::{Path, PathBuf};

/// HOME is unset or empty: there is no home to keep the cache and logs under or to expand `~`
/// against (spark-kit never guesses one: a guess such as `/root` finds another user's files).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "HOME is not set: spark-kit keeps its cache and logs under it and expands `~` in the kit against it; \
     set it to your home directory, e.g. `export HOME=$(getent passwd \"$(id -u)\" | cut -d: -f6)`"
)]
pub struct HomeUnset;

/// Resolved base directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    pub home: PathBuf,
    /// `~/.cache/spark-kit` unless `SPARK_KIT_CACHE` is set.
    pub cache: PathBuf,
}

/// The value of `key` in the environment pairs `main` hands in (the last one wins); None when
/// unset or empty.
#[must_use]
pub fn env_value<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
}

impl Dirs {
    /// The directories of this process's environment; HOME must be set ([`HomeUnset`]).
    pub fn from_env(env: &[(String, String)]) -> Result<Self, HomeUnset> {
        let home = PathBuf::from(env_value(env, "HOME").ok_or(HomeUnset)?);
        let cache = match (env_value(env, "SPARK_KIT_CACHE"), env_value(env, "XDG_CACHE_HOME")) {
            (Some(c), _) => PathBuf::from(c),
            (None, Some(x)) => Path::new(x).join("spark-kit"),
            (None, None) => home.join(".cache/spark-kit"),
        };
        Ok(Self { home, cache })
    }

    /// Expand a leading `~/` (or a lone `~`) against the home directory.
    #[must_use]
    pub fn expand(&self, p: &str) -> PathBuf {
        if p == "~" {
            self.home.clone()
        } else if let Some(rest) = p.strip_prefix("~/") {
            self.home.join(rest)
        } else {
            PathBuf::from(p)
        }
    }
}

/// The kit's log directory (`paths.logs`) resolved against this machine.
#[must_use]
pub fn logs_dir(kit: &crate::kit::schema::Kit, dirs: &Dirs) -> PathBuf {
    dirs.expand(&kit.paths.logs)
}

/// This program's executable, usable to start copies of it even after the file was replaced
/// on disk (an upgrade, a rebuild): then `/proc/self/exe` still names the running binary.
pub fn self_exe() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    if exe.exists() {
        Ok(exe)
    } else {
        Ok(PathBuf::from("/proc/self/exe"))
    }
}

/// Environment pairs as `main` hands them in, from literals (unit tests' shorthand).
#[cfg(test)]
#[must_use]
pub fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| ((*a).to_string(), (*b).to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use pairs as env;

    #[test]
    fn cache_precedence_and_tilde() {
        let d = Dirs::from_env(&env(&[("HOME", "/h")])).unwrap();
        assert_eq!(d.cache, PathBuf::from("/h/.cache/spark-kit"));
        assert_eq!(d.expand("~/x/y"), PathBuf::from("/h/x/y"));
        assert_eq!(d.expand("/abs"), PathBuf::from("/abs"));
        let d = Dirs::from_env(&env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/c")])).unwrap();
        assert_eq!(d.cache, PathBuf::from("/c/spark-kit"));
        let d = Dirs::from_env(&env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/c"), ("SPARK_KIT_CACHE", "/s")])).unwrap();
        assert_eq!(d.cache, PathBuf::from("/s"));
    }

    /// #28: an unset HOME was taken to be `/root` (another user's cache and models).
    #[test]
    fn an_unset_home_is_an_error_naming_home_and_the_fix() {
        for e in [env(&[]), env(&[("HOME", ""), ("SPARK_KIT_CACHE", "/s")])] {
            let msg = Dirs::from_env(&e).unwrap_err().to_string();
            assert!(msg.starts_with("HOME is not set:") && !msg.contains('\n'), "{msg}");
            // The fix runs as printed and sets HOME to this user's home directory.
            let cmd = msg.split('`').nth(3).unwrap();
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{cmd}; printf %s \"$HOME\""))
                .env_remove("HOME")
                .output()
                .unwrap();
            assert!(out.status.success() && out.stdout.starts_with(b"/"), "{cmd}: {out:?}");
        }
    }
}
