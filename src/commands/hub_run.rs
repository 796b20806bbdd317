//! Glue shared by `download` and `verify --repair`: running a download (its progress through
//! `reporter::download`), and Hub errors as command failures.

use std::sync::Arc;

use crate::dirs::Dirs;
use crate::error::Failure;
use crate::hub::report::Reporter;
use crate::hub::run::{download_blocking, Request, Summary};
use crate::hub::HubError;

/// A library error as a command failure (configuration problems exit 2).
pub(super) fn hub_failure(e: &HubError) -> Failure {
    let f = if e.is_config() { Failure::usage(e.to_string()) } else { Failure::runtime(e.to_string()) };
    match e.hint() {
        Some(h) => f.with_hint(h),
        None => f,
    }
}

/// Run `req` against `HF_ENDPOINT` with the token the environment names.
pub(super) fn run_download(
    req: &Request,
    env: &[(String, String)],
    dirs: &Dirs,
    reporter: Arc<dyn Reporter>,
) -> Result<Summary, Failure> {
    download_blocking(req, env, &dirs.home, reporter).map_err(|e| hub_failure(&e))
}
