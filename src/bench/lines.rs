//! `bench`'s progress as lines (on stderr): phases, notes, one line per request (failures even
//! with `--quiet`).

use std::io::Write;

use super::result::Request;
use super::run::BenchReporter;

/// Progress lines on `out`.
pub struct Lines<'a> {
    pub out: &'a mut dyn Write,
    pub quiet: bool,
}

impl BenchReporter for Lines<'_> {
    fn phase(&mut self, name: &str, detail: &str) {
        if !self.quiet {
            let _ = writeln!(self.out, "==> {name}: {detail}");
        }
    }
    fn note(&mut self, message: &str) {
        let _ = writeln!(self.out, "note: {message}");
    }
    fn request(&mut self, phase: &str, outcome: Result<&Request, &str>) {
        match outcome {
            Ok(r) if !self.quiet => {
                // Only a decode stream's rate means something here: a prefill or calibration
                // request generates a handful of tokens, and its rate is the table's to compute.
                let decode = r
                    .decode_tok_s
                    .filter(|_| phase.starts_with("decode"))
                    .map_or_else(String::new, |d| format!(", decode {d:.1} tok/s/stream"));
                let _ = writeln!(
                    self.out,
                    "    {phase}: TTFT {:.0} ms, {} prompt + {} completion tokens{decode}",
                    r.ttft_s * 1000.0,
                    r.prompt_tokens,
                    r.completion_tokens
                );
            }
            Ok(_) => {}
            Err(e) => {
                let _ = writeln!(self.out, "    {phase}: FAILED: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_keeps_notes_and_failures_only() {
        let mut buf = Vec::new();
        let mut l = Lines { out: &mut buf, quiet: true };
        l.phase("decode", "c=1");
        l.note("n");
        l.request("decode c=1", Err("boom"));
        assert_eq!(String::from_utf8(buf).unwrap(), "note: n\n    decode c=1: FAILED: boom\n");
    }
}
