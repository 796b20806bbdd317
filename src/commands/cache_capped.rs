//! `spark-kit __cache-capped --cap BYTES -- PROGRAM…` (internal): rsync on both ends of a weight
//! sync runs under it; exits with the program's status.

use crate::cli::CacheCappedArgs;
use crate::error::Failure;
use crate::weights::cachecap;

pub fn run(args: &CacheCappedArgs) -> Result<(), Failure> {
    let status = cachecap::run(&args.argv, args.cap).map_err(|e| {
        Failure::runtime(format!("cannot run {}: {e}", args.argv.first().map_or("", String::as_str)))
            .caused_by_chain_of(&e)
    })?;
    if status.success() {
        Ok(())
    } else {
        // rsync's own exit code tells the other end what happened: pass it through.
        std::process::exit(status.code().unwrap_or(1));
    }
}
