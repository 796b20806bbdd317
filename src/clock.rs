//! Wall-clock formatting shared by logs, receipts and bench results (no time crate needed).

use std::time::{SystemTime, UNIX_EPOCH};

/// `2026-12-02T13:45:07.123Z` from Unix seconds (civil-from-days, proleptic Gregorian).
#[must_use]
pub fn rfc3339(secs: u64, millis: u32) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Now, as RFC 3339 UTC with milliseconds.
#[must_use]
pub fn now_rfc3339() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_civil_dates() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_219_107, 123), "2026-12-02T13:45:07.123Z");
        assert_eq!(rfc3339(4_107_542_399, 999), "2100-02-28T23:59:59.999Z");
        assert_eq!(now_rfc3339().len(), 24);
    }
}
