//! Checkpoints as header metadata: names, dtypes, shapes and byte ranges of every tensor,
//! from safetensors shards on disk or from a "virtual checkpoint" that has no data at all.
//!
//! The EXL3 audit (`exl3_audit`) and the weight budget (`budget`) work on [`Checkpoint`] only,
//! so they run the same on a real download and on the modelled DeepSeek V4.1 Flash shape.

pub mod budget;
mod claims;
pub mod decode_check;
pub mod dsv41;
pub mod exl3_audit;
pub mod exl3_decode;
pub mod finding;
pub mod k_map;
pub mod kit_plan;
pub mod names;
mod packed_check;
pub mod quant_ledger;
pub mod reconcile;
pub mod safetensors;
pub mod single_node;
pub mod single_node_text;
pub mod tensor_data;
pub mod text;
pub mod virtual_ckpt;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
#[cfg(not(unix))]
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Serialize;

use self::safetensors::{read_shard_header, Dtype, Gap, HeaderError};

/// Where a checkpoint's headers came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Origin {
    /// Safetensors shards on disk.
    Files { dir: PathBuf },
    /// A modelled checkpoint: names, dtypes and shapes only.
    Virtual { name: String },
}

/// One shard of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shard {
    pub path: PathBuf,
    /// Absolute offset of the data area (8 + header length).
    pub data_start: u64,
    pub file_len: u64,
    /// Data-area bytes no tensor covers (exllamav3 writes none).
    pub gaps: Vec<Gap>,
}

/// One tensor: header metadata and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Index into [`Checkpoint::shards`].
    pub shard: usize,
    /// Byte range relative to the shard's data area.
    pub begin: u64,
    pub end: u64,
}

impl Tensor {
    /// Size of the tensor's data in bytes.
    #[must_use]
    pub const fn bytes(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }
}

/// What else a checkpoint directory holds, for the audit's claims check (`claims`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Folder {
    /// `model.safetensors.index.json` and the tensors its `weight_map` names, when there is one.
    pub index: Option<(PathBuf, BTreeSet<String>)>,
    /// `*.safetensors` files of the directory that were not read as shards.
    pub strays: Vec<PathBuf>,
}

/// All tensors of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: Origin,
    pub shards: Vec<Shard>,
    /// Sorted by name.
    pub tensors: Vec<Tensor>,
    /// The directory's index and stray files (`None` for one file or a virtual checkpoint).
    pub folder: Option<Folder>,
    /// For virtual checkpoints: the 4 bytes each codebook marker would hold.
    recorded_markers: HashMap<String, [u8; 4]>,
}

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("{path}: cannot read: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{dir}: no `*.safetensors` shards found", dir = dir.display())]
    NoShards { dir: PathBuf },
    #[error("{path}: {why}", path = path.display())]
    Index { path: PathBuf, why: String },
    #[error("tensor `{tensor}` is in two shards: {first} and {second}", first = first.display(), second = second.display())]
    DuplicateAcrossShards { tensor: String, first: PathBuf, second: PathBuf },
    #[error("{path}: tensor `{tensor}`: cannot read its 4 marker bytes: {source}", path = path.display())]
    MarkerRead {
        path: PathBuf,
        tensor: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: tensor `{tensor}`: cannot read its data: {source}", path = path.display())]
    DataRead {
        path: PathBuf,
        tensor: String,
        #[source]
        source: std::io::Error,
    },
    #[error("tensor `{tensor}`: cannot decode: {why}")]
    Decode { tensor: String, why: String },
    #[error("virtual checkpoint `{name}`: {why}")]
    Virtual { name: String, why: String },
}

impl Checkpoint {
    /// Read the headers of a checkpoint: a directory (shards from `model.safetensors.index.json`,
    /// else `model.safetensors`, else `model-*.safetensors`, else every `*.safetensors`) or one file.
    ///
    /// # Errors
    /// Unreadable files, malformed headers, a broken index, a tensor in two shards.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let (dir, files, index, strays) = if path.is_file() {
            (path.parent().map(Path::to_path_buf).unwrap_or_default(), vec![path.to_path_buf()], None, None)
        } else {
            let (files, index) = shard_files(path)?;
            let strays = all_safetensors(path)?.into_iter().filter(|p| !files.contains(p)).collect();
            (path.to_path_buf(), files, index, Some(strays))
        };
        let mut shards = Vec::with_capacity(files.len());
        let mut tensors = Vec::new();
        for (i, file) in files.iter().enumerate() {
            let header = read_shard_header(file)?;
            shards.push(Shard {
                path: header.path.clone(),
                data_start: header.data_start(),
                file_len: header.file_len,
                gaps: header.gaps,
            });
            tensors.extend(header.tensors.into_iter().map(|t| Tensor {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                shard: i,
                begin: t.begin,
                end: t.end,
            }));
        }
        let mut ckpt = Self::assemble(Origin::Files { dir }, shards, tensors, HashMap::new())?;
        if let Some(index) = &index {
            ckpt.check_index(index)?;
        }
        ckpt.folder =
            strays.map(|strays| Folder { index: index.map(|i| (i.path, i.weight_map.into_keys().collect())), strays });
        Ok(ckpt)
    }

    /// Every tensor the index names must be in the shard it names.
    fn check_index(&self, index: &Index) -> Result<(), CheckpointError> {
        for (tensor, file) in &index.weight_map {
            let found = self.get(tensor).map(|t| self.shard_path(t));
            let expected = index.dir.join(file);
            if found.as_ref() != Some(&expected) {
                let why = match found {
                    Some(other) => {
                        format!("`weight_map` puts `{tensor}` in `{file}`, but it is in `{}`", other.display())
                    }
                    None => {
                        format!("`weight_map` names `{tensor}` in `{file}`, which does not hold it (incomplete shard?)")
                    }
                };
                return Err(CheckpointError::Index { path: index.path.clone(), why });
            }
        }
        Ok(())
    }

    /// Build a checkpoint from parts (used by the virtual checkpoint): sorts by name and refuses
    /// a name that occurs twice or a tensor outside the shards.
    ///
    /// # Errors
    /// [`CheckpointError::DuplicateAcrossShards`], [`CheckpointError::Virtual`].
    pub fn assemble(
        origin: Origin,
        shards: Vec<Shard>,
        mut tensors: Vec<Tensor>,
        recorded_markers: HashMap<String, [u8; 4]>,
    ) -> Result<Self, CheckpointError> {
        if let Some(t) = tensors.iter().find(|t| t.shard >= shards.len() || t.end < t.begin) {
            return Err(CheckpointError::Virtual {
                name: t.name.clone(),
                why: format!("shard index {} / byte range [{}, {}) is invalid", t.shard, t.begin, t.end),
            });
        }
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
            let path = |t: &Tensor| shards.get(t.shard).map(|s| s.path.clone()).unwrap_or_default();
            return Err(CheckpointError::DuplicateAcrossShards {
                tensor: w[0].name.clone(),
                first: path(&w[0]),
                second: path(&w[1]),
            });
        }
        Ok(Self { origin, shards, tensors, folder: None, recorded_markers })
    }

    /// Look a tensor up by name.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.binary_search_by(|t| t.name.as_str().cmp(name)).ok().and_then(|i| self.tensors.get(i))
    }

    /// Whether marker bytes can be checked (real files, or a virtual checkpoint that recorded them).
    #[must_use]
    pub fn has_marker_bytes(&self) -> bool {
        matches!(self.origin, Origin::Files { .. }) || !self.recorded_markers.is_empty()
    }

    /// Path of a tensor's shard (empty for a malformed index, which `assemble` never produces).
    #[must_use]
    pub fn shard_path(&self, t: &Tensor) -> PathBuf {
        self.shards.get(t.shard).map(|s| s.path.clone()).unwrap_or_default()
    }
}

/// Reads the 4 bytes of codebook markers, keeping each shard open once.
pub struct MarkerReader<'a> {
    ckpt: &'a Checkpoint,
    open: HashMap<usize, File>,
}

impl<'a> MarkerReader<'a> {
    #[must_use]
    pub fn new(ckpt: &'a Checkpoint) -> Self {
        Self { ckpt, open: HashMap::new() }
    }

    /// Where the checkpoint came from.
    #[must_use]
    pub const fn origin(&self) -> &Origin {
        &self.ckpt.origin
    }

    /// The first 4 bytes of `t`'s data: read from the file (only those 4 bytes), or the recorded
    /// value of a virtual checkpoint (`None` when it recorded none).
    ///
    /// # Errors
    /// The shard cannot be opened or is shorter than the header promised.
    pub fn first4(&mut self, t: &Tensor) -> Result<Option<[u8; 4]>, CheckpointError> {
        if let Origin::Virtual { .. } = self.ckpt.origin {
            return Ok(self.ckpt.recorded_markers.get(&t.name).copied());
        }
        if t.bytes() < 4 {
            return Ok(None);
        }
        let shard = self.ckpt.shards.get(t.shard).ok_or_else(|| CheckpointError::Virtual {
            name: t.name.clone(),
            why: "tensor refers to a shard that does not exist".into(),
        })?;
        let err = |source| CheckpointError::MarkerRead { path: shard.path.clone(), tensor: t.name.clone(), source };
        let file = match self.open.entry(t.shard) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(File::open(&shard.path).map_err(err)?),
        };
        let mut buf = [0u8; 4];
        read_at(file, shard.data_start + t.begin, &mut buf).map_err(err)?;
        Ok(Some(buf))
    }
}

/// `model.safetensors.index.json`: which shard holds which tensor.
struct Index {
    path: PathBuf,
    dir: PathBuf,
    weight_map: BTreeMap<String, String>,
}

/// Read exactly `buf.len()` bytes at `offset` (one `pread` on Unix).
#[cfg(unix)]
pub(crate) fn read_at(file: &mut File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Read exactly `buf.len()` bytes at `offset`.
#[cfg(not(unix))]
pub(crate) fn read_at(file: &mut File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(buf)
}

/// The shard files of a checkpoint directory, in order, and its index if it has one.
fn shard_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<Index>), CheckpointError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        return index_files(dir, &index).map(|(f, i)| (f, Some(i)));
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single], None));
    }
    let all = all_safetensors(dir)?;
    let model: Vec<PathBuf> = all
        .iter()
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("model-")))
        .cloned()
        .collect();
    let files = if model.is_empty() { all } else { model };
    if files.is_empty() {
        return Err(CheckpointError::NoShards { dir: dir.to_path_buf() });
    }
    Ok((files, None))
}

/// Every `*.safetensors` file of `dir`, sorted.
fn all_safetensors(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let io = |source| CheckpointError::Io { path: dir.to_path_buf(), source };
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
            all.push(path);
        }
    }
    all.sort();
    Ok(all)
}

/// Shards named by `model.safetensors.index.json`'s `weight_map`.
fn index_files(dir: &Path, index: &Path) -> Result<(Vec<PathBuf>, Index), CheckpointError> {
    let bad = |why: String| CheckpointError::Index { path: index.to_path_buf(), why };
    let text = std::fs::read(index).map_err(|source| CheckpointError::Io { path: index.to_path_buf(), source })?;
    let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut files = BTreeSet::new();
    let mut weight_map = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| bad(format!("`weight_map[{tensor}]` is not a file name")))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(bad(format!("`weight_map[{tensor}]` = `{file}` is not a plain file name")));
        }
        files.insert(file.to_string());
        weight_map.insert(tensor.clone(), file.to_string());
    }
    let files: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
    if let Some(missing) = files.iter().find(|f| !f.is_file()) {
        return Err(bad(format!("names shard `{}`, which is missing", missing.display())));
    }
    if files.is_empty() {
        return Err(CheckpointError::NoShards { dir: dir.to_path_buf() });
    }
    Ok((files, Index { path: index.to_path_buf(), dir: dir.to_path_buf(), weight_map }))
}
