//! `bench`'s flags that need no server, checked before a run that can take an hour: the
//! concurrency levels and prefill lengths, and the output paths (so the result is not lost at
//! the end). Each refusal names the flag and its fix.

use std::path::Path;

use super::{plot, sizes};
use crate::cli::values::FlagError;

/// The levels a run measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    pub concurrency: Vec<u32>,
    /// `None`: the default lengths (fitted to the model); empty: `--prefill none`.
    pub prefill: Option<Vec<u64>>,
}

/// `--concurrency` and `--prefill`.
pub fn levels(concurrency: &str, prefill: Option<&str>) -> Result<Levels, FlagError> {
    let concurrency = sizes::parse_concurrency(concurrency).map_err(|e| FlagError {
        message: format!("--concurrency {concurrency}: {e}"),
        hint: "use e.g. --concurrency 1,2,4".into(),
    })?;
    let prefill = match prefill {
        Some(p) => Some(sizes::parse_lengths(p).map_err(|e| FlagError {
            message: format!("--prefill {p}: {e}"),
            hint: "use e.g. --prefill 1k,8k,32k or --prefill none".into(),
        })?),
        None => None,
    };
    Ok(Levels { concurrency, prefill })
}

/// `--plot` (a format spark-kit draws, in a directory that exists) and `--json` (`-` or a path
/// in a directory that exists).
pub fn check_outputs(plot_path: Option<&Path>, json: Option<&Path>) -> Result<(), FlagError> {
    if let Some(p) = plot_path {
        plot::format_of(p).map_err(|e| FlagError { message: e.to_string(), hint: e.hint().into() })?;
        check_parent("--plot", p)?;
    }
    if let Some(j) = json {
        check_parent("--json", j)?;
    }
    Ok(())
}

/// A parent directory that must exist before a long run.
fn check_parent(flag: &str, path: &Path) -> Result<(), FlagError> {
    if path == Path::new("-") {
        return Ok(());
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if parent.is_dir() {
        Ok(())
    } else {
        Err(FlagError {
            message: format!("{flag} {}: directory {} does not exist", path.display(), parent.display()),
            hint: "create the directory or pick another path".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_outputs_are_refused_with_the_flag_named() {
        assert_eq!(levels("1,2", None).unwrap(), Levels { concurrency: vec![1, 2], prefill: None });
        assert!(levels("x", None).unwrap_err().message.starts_with("--concurrency x: "));
        assert!(levels("1", Some("q")).unwrap_err().message.starts_with("--prefill q: "));
        assert!(check_outputs(None, Some(Path::new("-"))).is_ok());
        let e = check_outputs(None, Some(Path::new("/no/such/dir/r.json"))).unwrap_err();
        assert_eq!(e.message, "--json /no/such/dir/r.json: directory /no/such/dir does not exist");
        assert!(check_outputs(Some(Path::new("p.gif")), None).is_err());
    }
}
