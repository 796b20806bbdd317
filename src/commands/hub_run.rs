//! Glue shared by `download` and `verify --repair`: running a download (its progress through
//! `reporter::download`), and Hub errors as command failures.

use std::sync::Arc;

use crate::dirs::Dirs;
use crate::error::Failure;
use crate::hub::api::HubClient;
use crate::hub::auth::find_token;
use crate::hub::report::Reporter;
use crate::hub::run::{download, Request, Summary};
use crate::hub::{endpoint, HubError};

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
    let token = find_token(env, &dirs.home, |p| std::fs::read_to_string(p).ok());
    let client = HubClient::new(&endpoint(env), token, req.opts.jobs, req.opts.backoff, req.opts.idle)
        .map_err(|e| hub_failure(&e))?
        .with_reporter(reporter.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8)))
        .enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the async runtime: {e}")))?;
    let summary = rt.block_on(download(Arc::new(client), req, reporter)).map_err(|e| hub_failure(&e));
    drop(rt);
    summary
}
