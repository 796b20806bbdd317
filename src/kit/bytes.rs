//! Byte sizes in kit files: `2684354560`, `512MiB`, `2.5GiB`, `10 GB`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes. Written as an integer or a number with a unit (B, KB/MB/GB/TB decimal,
/// KiB/MiB/GiB/TiB binary); serialised as an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
pub const TIB: u64 = 1024 * GIB;

impl ByteSize {
    #[must_use]
    pub const fn gib(n: u64) -> Self {
        Self(n * GIB)
    }
    #[must_use]
    pub const fn mib(n: u64) -> Self {
        Self(n * MIB)
    }
    #[must_use]
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

/// Why a byte-size string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a byte size ({why}); write e.g. `2684354560`, `512MiB` or `2.5GiB`")]
pub struct ByteSizeError {
    input: String,
    why: &'static str,
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ByteSizeError { input: s.to_string(), why };
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit = unit.trim();
        if num.is_empty() {
            return Err(err("no number"));
        }
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1000,
            "m" | "mb" => 1000 * 1000,
            "g" | "gb" => 1000 * 1000 * 1000,
            "t" | "tb" => 1000 * 1000 * 1000 * 1000,
            "kib" => KIB,
            "mib" => MIB,
            "gib" => GIB,
            "tib" => TIB,
            _ => return Err(err("unknown unit")),
        };
        if let Some((int, frac)) = num.split_once('.') {
            if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
                return Err(err("malformed number"));
            }
            // Exact decimal arithmetic: value = (int * 10^d + frac) * mult / 10^d.
            let digits = u32::try_from(frac.len()).map_err(|_| err("too many decimals"))?;
            let scale = 10u128.checked_pow(digits).ok_or_else(|| err("too many decimals"))?;
            let int: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| err("number too large"))? };
            let frac: u128 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| err("number too large"))? };
            let total = int
                .checked_mul(scale)
                .and_then(|v| v.checked_add(frac))
                .and_then(|v| v.checked_mul(u128::from(mult)))
                .ok_or_else(|| err("number too large"))?;
            if total % scale != 0 {
                return Err(err("not a whole number of bytes"));
            }
            let bytes = u64::try_from(total / scale).map_err(|_| err("number too large"))?;
            Ok(Self(bytes))
        } else {
            let n: u64 = num.parse().map_err(|_| err("number too large"))?;
            n.checked_mul(mult).map(Self).ok_or_else(|| err("number too large"))
        }
    }
}

/// `812.0 KiB`, `3.4 MiB`, `182.571 GiB`: a size for people (progress lines, summaries).
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn human_size(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes >= GIB {
        format!("{:.3} GiB", b / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", b / MIB as f64)
    } else {
        format!("{:.1} KiB", b / KIB as f64)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        human(self.0, f)
    }
}

fn human(n: u64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for (unit, size) in [("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
        if n >= size {
            if n % size == 0 {
                return write!(f, "{}{unit}", n / size);
            }
            #[allow(clippy::cast_precision_loss)] // display only
            let v = n as f64 / size as f64;
            return write!(f, "{v:.2}{unit}");
        }
    }
    write!(f, "{n}B")
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a byte size such as 2684354560, 512MiB or 2.5GiB")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v).map(ByteSize).map_err(|_| E::custom("a byte size cannot be negative"))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ByteSize, E> {
                Err(E::custom(format!("{v} is not a whole number of bytes; add a unit, e.g. 2.5GiB")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": ["integer", "string"],
            "format": "byte-size",
            "description": "bytes: an integer or a number with a unit (512MiB, 2.5GiB, 10GB)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forms() {
        assert_eq!("2684354560".parse::<ByteSize>().unwrap().0, 2_684_354_560);
        assert_eq!("2.5GiB".parse::<ByteSize>().unwrap().0, 2_684_354_560);
        assert_eq!("512MiB".parse::<ByteSize>().unwrap().0, 512 * MIB);
        assert_eq!("12 GiB".parse::<ByteSize>().unwrap().0, 12 * GIB);
        assert_eq!("10GB".parse::<ByteSize>().unwrap().0, 10_000_000_000);
        assert_eq!("0.5KiB".parse::<ByteSize>().unwrap().0, 512);
    }

    #[test]
    fn rejects_bad() {
        for bad in ["", "GiB", "1.2.3GiB", "5 parsecs", "0.3B", "99999999999999999999", "-1"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn displays_human() {
        assert_eq!(ByteSize(2_684_354_560).to_string(), "2.50GiB");
        assert_eq!(ByteSize::gib(12).to_string(), "12GiB");
        assert_eq!(ByteSize(100).to_string(), "100B");
    }

    #[test]
    fn yaml_both_forms() {
        let a: ByteSize = serde_yaml::from_str("2.5GiB").unwrap();
        let b: ByteSize = serde_yaml::from_str("2684354560").unwrap();
        assert_eq!(a, b);
        assert!(serde_yaml::from_str::<ByteSize>("2.5").is_err());
    }
}
