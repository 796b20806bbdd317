//! Lower-case hex of a byte string (digests, content ids). A leaf: imports nothing of the crate,
//! so the wire (`cluster/push.rs`), the engine overlay and the hub hashing share one spelling.

use std::fmt::Write as _;

/// `bytes` as lower-case hex, two digits a byte.
#[must_use]
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn two_lower_case_digits_per_byte() {
        assert_eq!(encode(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(encode(&[]), "");
    }
}
