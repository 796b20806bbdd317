//! Safetensors shard headers: our own bounded parser.
//!
//! Layout (docs/exl3-format.md §1.1): `u64` little-endian header length `n`, `n` bytes of JSON,
//! then the data area. Every tensor entry is `{"dtype", "shape", "data_offsets": [begin, end]}`
//! with offsets relative to the data area; `__metadata__` is an optional string → string map.
//!
//! The parser never panics: every malformed input becomes a [`HeaderError`] naming the shard and,
//! where there is one, the tensor. Only the header is read; tensor data is never touched.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::{Deserialize, DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, Visitor};
use serde::Serialize;
use serde_json::Value;

/// Largest header we accept (the Python reference caps it at 100 MB too).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Element types of the safetensors format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Dtype {
    #[serde(rename = "BOOL")]
    Bool,
    #[serde(rename = "U8")]
    U8,
    #[serde(rename = "I8")]
    I8,
    #[serde(rename = "F8_E4M3")]
    F8E4M3,
    #[serde(rename = "F8_E5M2")]
    F8E5M2,
    #[serde(rename = "F8_E8M0")]
    F8E8M0,
    #[serde(rename = "F4")]
    F4,
    #[serde(rename = "F6_E2M3")]
    F6E2M3,
    #[serde(rename = "F6_E3M2")]
    F6E3M2,
    #[serde(rename = "I16")]
    I16,
    #[serde(rename = "U16")]
    U16,
    #[serde(rename = "F16")]
    F16,
    #[serde(rename = "BF16")]
    BF16,
    #[serde(rename = "I32")]
    I32,
    #[serde(rename = "U32")]
    U32,
    #[serde(rename = "F32")]
    F32,
    #[serde(rename = "I64")]
    I64,
    #[serde(rename = "U64")]
    U64,
    #[serde(rename = "F64")]
    F64,
    #[serde(rename = "C64")]
    C64,
}

impl Dtype {
    /// Every dtype, for parsing and tests.
    pub const ALL: [Dtype; 20] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
        Dtype::F8E8M0,
        Dtype::F4,
        Dtype::F6E2M3,
        Dtype::F6E3M2,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::I64,
        Dtype::U64,
        Dtype::F64,
        Dtype::C64,
    ];

    /// The name written in headers (`F16`, `F8_E4M3`, …).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::F4 => "F4",
            Dtype::F6E2M3 => "F6_E2M3",
            Dtype::F6E3M2 => "F6_E3M2",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::F64 => "F64",
            Dtype::C64 => "C64",
        }
    }

    /// Parse a header dtype name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bits per element (sub-byte types F4/F6 are packed).
    #[must_use]
    pub const fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6E2M3 | Dtype::F6E3M2 => 6,
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F8E8M0 => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::I64 | Dtype::U64 | Dtype::F64 | Dtype::C64 => 64,
        }
    }

    /// Bytes a tensor of this dtype with `numel` elements occupies, if that is a whole number
    /// of bytes that fits in a `u64`.
    #[must_use]
    pub fn bytes_for(self, numel: u64) -> Option<u64> {
        let bits = numel.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Product of a shape, `None` on overflow. The empty shape (a scalar) has one element.
#[must_use]
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// One tensor entry of a header. Offsets are relative to the start of the data area.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorHeader {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub begin: u64,
    pub end: u64,
}

/// Bytes of the data area that no tensor covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gap {
    /// Start, relative to the data area.
    pub begin: u64,
    /// End (exclusive), relative to the data area.
    pub end: u64,
    /// The tensor the gap follows (`None`: the gap opens the data area).
    pub after: Option<String>,
}

/// A parsed and validated shard header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardHeader {
    pub path: PathBuf,
    /// Length of the JSON header in bytes (the `u64` prefix).
    pub header_len: u64,
    /// Length of the whole file.
    pub file_len: u64,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Tensors in data-area order.
    pub tensors: Vec<TensorHeader>,
    /// Uncovered byte ranges of the data area, in order.
    pub gaps: Vec<Gap>,
}

impl ShardHeader {
    /// Absolute file offset where the data area starts.
    #[must_use]
    pub const fn data_start(&self) -> u64 {
        8 + self.header_len
    }
    /// Length of the data area.
    #[must_use]
    pub const fn data_len(&self) -> u64 {
        self.file_len.saturating_sub(self.data_start())
    }
}

/// Why a shard header was refused.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("{path}: cannot read: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {len} bytes is too short for a safetensors file (needs an 8-byte header length)", path = path.display())]
    TooShort { path: PathBuf, len: u64 },
    #[error("{path}: header length {header_len} exceeds the {max}-byte limit (corrupt file or not safetensors)", path = path.display())]
    HeaderTooLarge { path: PathBuf, header_len: u64, max: u64 },
    #[error("{path}: header length {header_len} runs past the end of the {file_len}-byte file (truncated or corrupt shard)", path = path.display())]
    HeaderBeyondFile { path: PathBuf, header_len: u64, file_len: u64 },
    #[error("{path}: header is not valid JSON: {source}", path = path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: tensor `{tensor}` appears twice in the header", path = path.display())]
    DuplicateTensor { path: PathBuf, tensor: String },
    #[error("{path}: `__metadata__` {why}", path = path.display())]
    BadMetadata { path: PathBuf, why: String },
    #[error("{path}: tensor `{tensor}`: {why}", path = path.display())]
    BadEntry { path: PathBuf, tensor: String, why: String },
    #[error("{path}: tensor `{tensor}`: unknown dtype `{dtype}`", path = path.display())]
    UnknownDtype { path: PathBuf, tensor: String, dtype: String },
    #[error("{path}: tensor `{tensor}`: {dtype} {shape:?} overflows a 64-bit byte count", path = path.display())]
    SizeOverflow { path: PathBuf, tensor: String, dtype: Dtype, shape: Vec<u64> },
    #[error("{path}: tensor `{tensor}`: data_offsets [{begin}, {end}] end before they begin", path = path.display())]
    OffsetsReversed { path: PathBuf, tensor: String, begin: u64, end: u64 },
    #[error("{path}: tensor `{tensor}`: data ends at byte {end} of the data area but the file holds only {data_len} data bytes (truncated shard?)", path = path.display())]
    OutOfBounds { path: PathBuf, tensor: String, end: u64, data_len: u64 },
    #[error("{path}: tensor `{tensor}`: {dtype} {shape:?} needs {expected} bytes but data_offsets span {actual}", path = path.display())]
    ByteCount { path: PathBuf, tensor: String, dtype: Dtype, shape: Vec<u64>, expected: u64, actual: u64 },
    #[error("{path}: tensor `{tensor}` [{begin}, {end}) overlaps tensor `{other}` (ends at {other_end})", path = path.display())]
    Overlap { path: PathBuf, tensor: String, begin: u64, end: u64, other: String, other_end: u64 },
}

/// Read and validate the header of one shard: 8 + `n` bytes are read, never the data.
///
/// # Errors
/// Any I/O failure or malformed header, as a [`HeaderError`] naming the file (and tensor).
pub fn read_shard_header(path: &Path) -> Result<ShardHeader, HeaderError> {
    let io = |source| HeaderError::Io { path: path.to_path_buf(), source };
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let header_len = check_prefix(path, file_len, || {
        let mut len = [0u8; 8];
        file.read_exact(&mut len).map_err(io)?;
        Ok(len)
    })?;
    // Bounded by MAX_HEADER_BYTES above, so this fits in usize on 64-bit and 32-bit hosts alike.
    let len = usize::try_from(header_len).map_err(|_| HeaderError::HeaderTooLarge {
        path: path.to_path_buf(),
        header_len,
        max: MAX_HEADER_BYTES,
    })?;
    let mut json = vec![0u8; len];
    file.read_exact(&mut json).map_err(io)?;
    parse_header_json(path, &json, header_len, file_len)
}

/// Validate a whole shard held in memory (`bytes` is the complete file). Used by the fuzz target
/// and by tests; `path` only labels errors.
///
/// # Errors
/// Any malformed header, as a [`HeaderError`].
pub fn parse_shard_bytes(path: &Path, bytes: &[u8]) -> Result<ShardHeader, HeaderError> {
    let file_len = bytes.len() as u64;
    let header_len = check_prefix(path, file_len, || {
        let mut len = [0u8; 8];
        let prefix = bytes.get(..8).ok_or(HeaderError::TooShort { path: path.to_path_buf(), len: file_len })?;
        len.copy_from_slice(prefix);
        Ok(len)
    })?;
    let json = usize::try_from(header_len)
        .ok()
        .and_then(|n| bytes.get(8..8usize.checked_add(n)?))
        .ok_or(HeaderError::HeaderBeyondFile { path: path.to_path_buf(), header_len, file_len })?;
    parse_header_json(path, json, header_len, file_len)
}

/// Check the file is long enough, read the length prefix and bound it.
fn check_prefix(
    path: &Path,
    file_len: u64,
    read_len: impl FnOnce() -> Result<[u8; 8], HeaderError>,
) -> Result<u64, HeaderError> {
    if file_len < 8 {
        return Err(HeaderError::TooShort { path: path.to_path_buf(), len: file_len });
    }
    let header_len = u64::from_le_bytes(read_len()?);
    if header_len > MAX_HEADER_BYTES {
        return Err(HeaderError::HeaderTooLarge { path: path.to_path_buf(), header_len, max: MAX_HEADER_BYTES });
    }
    if header_len > file_len - 8 {
        return Err(HeaderError::HeaderBeyondFile { path: path.to_path_buf(), header_len, file_len });
    }
    Ok(header_len)
}

/// One tensor entry as read: only the three fields we use, each kept as a small JSON value so a
/// wrong type becomes an error naming the tensor. Other keys are skipped unread.
#[derive(Default)]
struct RawEntry {
    dtype: Option<Value>,
    shape: Option<Value>,
    data_offsets: Option<Value>,
}

/// A header key and what it holds.
enum RawItem {
    Metadata(Value),
    Tensor(RawEntry),
}

struct RawEntrySeed;

impl<'de> DeserializeSeed<'de> for RawEntrySeed {
    type Value = RawEntry;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<RawEntry, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RawEntrySeed {
    type Value = RawEntry;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor entry object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEntry, A::Error> {
        let mut e = RawEntry::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "dtype" => e.dtype = Some(map.next_value()?),
                "shape" => e.shape = Some(map.next_value()?),
                "data_offsets" => e.data_offsets = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(e)
    }
}

/// The top-level JSON object as an ordered list, so duplicate keys are seen rather than merged.
struct Entries(Vec<(String, RawItem)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let item = if key == "__metadata__" {
                        RawItem::Metadata(map.next_value()?)
                    } else {
                        match map.next_value_seed(RawEntrySeed) {
                            Ok(e) => RawItem::Tensor(e),
                            Err(e) => return Err(A::Error::custom(format_args!("tensor `{key}`: {e}"))),
                        }
                    };
                    entries.push((key, item));
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// Validate the JSON header text against the file it came from.
fn parse_header_json(path: &Path, json: &[u8], header_len: u64, file_len: u64) -> Result<ShardHeader, HeaderError> {
    let Entries(entries) =
        serde_json::from_slice(json).map_err(|source| HeaderError::Json { path: path.to_path_buf(), source })?;
    let data_len = file_len.saturating_sub(8 + header_len);
    let mut seen = HashSet::with_capacity(entries.len());
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, item) in entries {
        if !seen.insert(name.clone()) {
            return Err(HeaderError::DuplicateTensor { path: path.to_path_buf(), tensor: name });
        }
        let raw = match item {
            RawItem::Metadata(value) => {
                metadata = parse_metadata(path, value)?;
                continue;
            }
            RawItem::Tensor(raw) => raw,
        };
        let tensor = parse_entry(path, name, &raw)?;
        if tensor.end > data_len {
            return Err(HeaderError::OutOfBounds {
                path: path.to_path_buf(),
                tensor: tensor.name,
                end: tensor.end,
                data_len,
            });
        }
        tensors.push(tensor);
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    let gaps = check_layout(path, &tensors, data_len)?;
    Ok(ShardHeader { path: path.to_path_buf(), header_len, file_len, metadata, tensors, gaps })
}

fn parse_metadata(path: &Path, value: Value) -> Result<BTreeMap<String, String>, HeaderError> {
    let bad = |why: String| HeaderError::BadMetadata { path: path.to_path_buf(), why };
    let Value::Object(map) = value else {
        return Err(bad("is not a JSON object".into()));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            other => Err(bad(format!("key `{k}` is {other}, expected a string"))),
        })
        .collect()
}

fn parse_entry(path: &Path, name: String, raw: &RawEntry) -> Result<TensorHeader, HeaderError> {
    let bad = |name: &str, why: &str| HeaderError::BadEntry {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        why: why.to_string(),
    };
    let dtype_name = raw.dtype.as_ref().and_then(Value::as_str).ok_or_else(|| bad(&name, "missing string `dtype`"))?;
    let dtype = Dtype::parse(dtype_name).ok_or_else(|| HeaderError::UnknownDtype {
        path: path.to_path_buf(),
        tensor: name.clone(),
        dtype: dtype_name.to_string(),
    })?;
    let shape = raw
        .shape
        .as_ref()
        .and_then(Value::as_array)
        .ok_or_else(|| bad(&name, "missing array `shape`"))?
        .iter()
        .map(Value::as_u64)
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| bad(&name, "`shape` holds something other than non-negative integers"))?;
    let offsets = raw
        .data_offsets
        .as_ref()
        .and_then(Value::as_array)
        .ok_or_else(|| bad(&name, "missing array `data_offsets`"))?;
    let (begin, end) = match offsets.as_slice() {
        [b, e] => match (b.as_u64(), e.as_u64()) {
            (Some(b), Some(e)) => (b, e),
            _ => return Err(bad(&name, "`data_offsets` must be two non-negative integers")),
        },
        _ => return Err(bad(&name, "`data_offsets` must be two non-negative integers")),
    };
    if end < begin {
        return Err(HeaderError::OffsetsReversed { path: path.to_path_buf(), tensor: name, begin, end });
    }
    let Some(expected) = numel(&shape).and_then(|n| dtype.bytes_for(n)) else {
        return Err(HeaderError::SizeOverflow { path: path.to_path_buf(), tensor: name, dtype, shape });
    };
    if expected != end - begin {
        return Err(HeaderError::ByteCount {
            path: path.to_path_buf(),
            tensor: name,
            dtype,
            shape,
            expected,
            actual: end - begin,
        });
    }
    Ok(TensorHeader { name, dtype, shape, begin, end })
}

/// Tensors are sorted by `begin`: refuse overlaps, collect gaps.
fn check_layout(path: &Path, tensors: &[TensorHeader], data_len: u64) -> Result<Vec<Gap>, HeaderError> {
    let mut gaps = Vec::new();
    let mut cursor = 0u64;
    let mut holder: Option<&TensorHeader> = None;
    for t in tensors {
        if t.begin == t.end {
            continue; // empty tensors occupy nothing
        }
        if t.begin < cursor {
            let (other, other_end) = holder.map_or((String::new(), cursor), |h| (h.name.clone(), h.end));
            return Err(HeaderError::Overlap {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                begin: t.begin,
                end: t.end,
                other,
                other_end,
            });
        }
        if t.begin > cursor {
            gaps.push(Gap { begin: cursor, end: t.begin, after: holder.map(|h| h.name.clone()) });
        }
        cursor = t.end;
        holder = Some(t);
    }
    if cursor < data_len {
        gaps.push(Gap { begin: cursor, end: data_len, after: holder.map(|h| h.name.clone()) });
    }
    Ok(gaps)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn file(json: &str, data: usize) -> Vec<u8> {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    }

    #[test]
    fn parses_a_minimal_header_with_metadata_and_gap() {
        let json = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}"#;
        let h = parse_shard_bytes(Path::new("x.safetensors"), &file(json, 16)).unwrap();
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].name, "a");
        assert_eq!(h.metadata.get("format").map(String::as_str), Some("pt"));
        assert_eq!(h.gaps.len(), 2, "{:?}", h.gaps);
        assert_eq!((h.gaps[0].begin, h.gaps[0].end), (4, 8));
        assert_eq!((h.gaps[1].begin, h.gaps[1].end), (12, 16));
    }

    #[test]
    fn sub_byte_dtypes_need_whole_bytes() {
        assert_eq!(Dtype::F4.bytes_for(3), None);
        assert_eq!(Dtype::F4.bytes_for(4), Some(2));
        assert_eq!(Dtype::F6E2M3.bytes_for(4), Some(3));
        assert_eq!(Dtype::parse("F8_E8M0"), Some(Dtype::F8E8M0));
        assert_eq!(Dtype::parse("Q4"), None);
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let json = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        let e = parse_shard_bytes(Path::new("d.safetensors"), &file(json, 2)).unwrap_err();
        assert!(e.to_string().contains("tensor `a` appears twice"), "{e}");
    }
}
