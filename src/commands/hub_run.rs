//! Glue shared by `download` and `verify --repair`: running a download (its progress through
//! `reporter::download`), and Hub errors as command failures.

use std::sync::Arc;

use crate::dirs::Dirs;
use crate::error::Failure;
use crate::hub::report::Reporter;
use crate::hub::run::{download_blocking, Request, Summary};

/// Run `req` against `HF_ENDPOINT` with the token the environment names.
pub(super) fn run_download(
    req: &Request,
    env: &[(String, String)],
    dirs: &Dirs,
    reporter: Arc<dyn Reporter>,
) -> Result<Summary, Failure> {
    download_blocking(req, env, &dirs.home, reporter).map_err(Failure::from)
}
