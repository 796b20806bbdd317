//! TCP ports in the kit (`engine.port`, `engine.master_port`, `engine.internal_port`,
//! `nodes.N.ssh_port`): `u16` in the schema, range-checked once, here, while the kit is read.
//! A value out of range is refused with the key's file:line like every other kit error
//! (`K:10:3: engine.port: 70000 is out of range 1..=65535; fix: use a value between 1 and 65535`).

use serde::{Deserialize, Deserializer};

/// What a deserializer puts between its message and the fix it names; the loader splits there.
pub const FIX_MARK: &str = "; fix: ";

/// The one range check: `v` as a port, `0` allowed only where it means "derive it" (`auto`).
fn check(v: u64, auto: bool) -> Result<u16, String> {
    let lo = u64::from(!auto);
    match u16::try_from(v) {
        Ok(p) if u64::from(p) >= lo => Ok(p),
        _ => Err(format!("{v} is out of range {lo}..=65535{FIX_MARK}use a value between {lo} and 65535")),
    }
}

/// A port, 1-65535.
pub fn port<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    check(u64::deserialize(d)?, false).map_err(serde::de::Error::custom)
}

/// A port, or 0 for "derive it" (`engine.internal_port`).
pub fn port_or_auto<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    check(u64::deserialize(d)?, true).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_range_for_every_port() {
        assert_eq!(check(1, false), Ok(1));
        assert_eq!(check(65535, false), Ok(65535));
        assert_eq!(check(0, true), Ok(0));
        assert_eq!(check(0, false).unwrap_err(), "0 is out of range 1..=65535; fix: use a value between 1 and 65535");
        assert!(check(70000, true).unwrap_err().starts_with("70000 is out of range 0..=65535; fix: "));
    }
}
