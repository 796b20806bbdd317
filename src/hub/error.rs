//! Everything that can stop a download or a verification, each naming the object and the fix.

use std::path::PathBuf;

/// A download or verification failure.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{repo} is gated: the Hub answered {status} for {path}")]
    Gated { repo: String, path: String, status: u16, url: String, with_token: bool },
    #[error("the Hub rejected the token ({source_name}) for {repo}")]
    BadToken { repo: String, source_name: String },
    #[error("repository {repo} not found on {endpoint} (or it is private and the token has no access)")]
    RepoNotFound {
        repo: String,
        endpoint: String,
        /// The kit key naming the repo (`model.repo`), once known.
        key: Option<String>,
    },
    #[error("revision `{revision}` not found in {repo} on {endpoint}")]
    RevisionNotFound {
        repo: String,
        revision: String,
        endpoint: String,
        /// The kit key naming the revision (`model.revision`), once known.
        key: Option<String>,
    },
    #[error("cannot reach {}: {reason}", if *.default { format!("the Hub at {endpoint} (HF_ENDPOINT is not set)") } else { format!("HF_ENDPOINT={endpoint}") })]
    Unreachable {
        endpoint: String,
        reason: String,
        /// The public Hub because `HF_ENDPOINT` is not set.
        default: bool,
    },
    #[error("{repo} at {commit} has no file {path}")]
    EntryNotFound { repo: String, commit: String, path: String },
    #[error("{what}: HTTP {status}{message}")]
    Http { what: String, status: u16, message: String },
    #[error("{what}: {reason}")]
    Network { what: String, reason: String },
    #[error("{what}: {reason}")]
    Protocol { what: String, reason: String },
    #[error("{repo}: the file listing names `{path}` ({reason}); refusing to write outside the cache")]
    UnsafePath { repo: String, path: String, reason: &'static str },
    #[error("{repo}: {path}: {what} disagrees: listing {listed}, resolve {resolved}")]
    Mismatch { repo: String, path: String, what: &'static str, listed: String, resolved: String },
    #[error("{repo}: {path}: SHA-256 mismatch after a refetch: expected {expected}, got {actual}")]
    HashMismatch { repo: String, path: String, expected: String, actual: String },
    #[error("{repo}: {path}: git blob sha1 mismatch: expected {expected}, got {actual}")]
    Sha1Mismatch { repo: String, path: String, expected: String, actual: String },
    #[error("not enough disk space in {dir}: need {need} bytes ({remaining} still to fetch + 5%), {free} free")]
    DiskSpace { dir: PathBuf, need: u64, remaining: u64, free: u64 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("another download holds {lock} (writing {path})")]
    Busy { lock: PathBuf, path: String },
    #[error("HF_ENDPOINT `{endpoint}` is not a URL: {reason}")]
    BadEndpoint { endpoint: String, reason: String },
    #[error("{0}")]
    Kit(String),
    #[error("{0}")]
    Engram(String),
    #[error("{repo}: {source}")]
    Slim {
        repo: String,
        #[source]
        source: super::engram::SlimError,
    },
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: not a spark-kit lock file: {source}", path.display())]
    BadLock {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: lock file version {found} (expected {expected})", path.display())]
    LockVersion { path: PathBuf, found: u32, expected: u32 },
    #[error("internal: {0}")]
    Internal(&'static str),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl HubError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    /// Name the kit section (`model`, `engram`) whose repo or revision is missing.
    #[must_use]
    pub fn in_kit(self, section: &str) -> Self {
        match self {
            Self::RepoNotFound { repo, endpoint, .. } => {
                Self::RepoNotFound { repo, endpoint, key: Some(format!("{section}.repo")) }
            }
            Self::RevisionNotFound { repo, revision, endpoint, .. } => {
                Self::RevisionNotFound { repo, revision, endpoint, key: Some(format!("{section}.revision")) }
            }
            e => e,
        }
    }

    /// A configuration problem (exit code 2) rather than a runtime one.
    #[must_use]
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Self::Kit(_)
                | Self::BadLock { .. }
                | Self::LockVersion { .. }
                | Self::BadEndpoint { .. }
                | Self::RevisionNotFound { .. }
                | Self::RepoNotFound { .. }
        )
    }

    /// One line saying how to fix it.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            Self::Gated { url, with_token, .. } => {
                if *with_token {
                    format!("accept the licence at {url} with the account of your token (HF_TOKEN / HF_TOKEN_PATH)")
                } else {
                    format!("accept the licence at {url} or set HF_TOKEN")
                }
            }
            Self::BadToken { .. } => {
                "set HF_TOKEN (or HF_TOKEN_PATH) to a valid token; `hf auth whoami` checks it".into()
            }
            Self::RepoNotFound { key, .. } => format!(
                "check {} (owner/name as on the Hub); a private repo needs HF_TOKEN; HF_ENDPOINT selects another server",
                key.as_deref().unwrap_or("model.repo / engram.repo")
            ),
            Self::RevisionNotFound { repo, key, .. } => format!(
                "set {} to a branch, tag or 40-hex commit of {repo} (e.g. --set {}=main)",
                key.as_deref().unwrap_or("model.revision / engram.revision"),
                key.as_deref().unwrap_or("model.revision")
            ),
            Self::Unreachable { default: true, .. } => {
                "check the network connection and proxy (HTTPS_PROXY); or set HF_ENDPOINT to a reachable mirror".into()
            }
            Self::Unreachable { .. } => {
                "check the address and the network (or proxy); unset HF_ENDPOINT to use https://huggingface.co".into()
            }
            Self::EntryNotFound { .. } => {
                "the repo changed or the kit names a file it does not have; fix the kit's files list".into()
            }
            Self::Http { .. } | Self::Network { .. } | Self::Protocol { .. } => {
                "rerun the same command: finished ranges are kept and the download resumes".into()
            }
            Self::UnsafePath { .. } => {
                "the Hub (or HF_ENDPOINT mirror) sent a malicious listing; use a trusted endpoint".into()
            }
            Self::Mismatch { .. } => {
                "the repo changed while downloading; rerun (pin a 40-hex commit in the kit to avoid this)".into()
            }
            Self::HashMismatch { .. } | Self::Sha1Mismatch { .. } => {
                "the server sends corrupt bytes; try later or another HF_ENDPOINT; nothing corrupt was put in the cache"
                    .into()
            }
            Self::DiskSpace { .. } => {
                "free space there, or point HF_HUB_CACHE / paths.hf_cache at a larger disk".into()
            }
            Self::Io { .. } => "check the path's permissions and free space".into(),
            Self::Busy { .. } => "wait for the other download to finish (or stop it), then rerun".into(),
            Self::BadEndpoint { .. } => "set HF_ENDPOINT to a URL such as https://huggingface.co, or unset it".into(),
            Self::Kit(_) => "fix the kit (spark-kit kit show) or pin the revision the kit was written for".into(),
            Self::Engram(_) | Self::Slim { .. } => {
                "check engram.files and engram.layers against the repo's model.safetensors.index.json".into()
            }
            Self::Json { .. } | Self::Internal(_) | Self::Runtime(_) => return None,
            Self::BadLock { .. } | Self::LockVersion { .. } => {
                "rerun `spark-kit download`: it rewrites the lock file from the cache".into()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_names_the_endpoint_and_whether_it_was_set() {
        let set = HubError::Unreachable { endpoint: "http://m:1".into(), reason: "refused".into(), default: false };
        assert_eq!(set.to_string(), "cannot reach HF_ENDPOINT=http://m:1: refused");
        assert!(set.hint().is_some_and(|h| h.contains("unset HF_ENDPOINT")));
        let default = HubError::Unreachable {
            endpoint: crate::hub::DEFAULT_ENDPOINT.into(),
            reason: "no DNS".into(),
            default: true,
        };
        assert_eq!(
            default.to_string(),
            "cannot reach the Hub at https://huggingface.co (HF_ENDPOINT is not set): no DNS"
        );
        assert!(default.hint().is_some_and(|h| h.contains("set HF_ENDPOINT to a reachable mirror")));
        assert!(!default.is_config() && !set.is_config());
    }
}
