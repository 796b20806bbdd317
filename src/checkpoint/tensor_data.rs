//! Reading tensor bytes of a [`Checkpoint`] on disk: byte ranges of one tensor, read with
//! positioned reads (no mmap, no alignment assumptions: exllamav3 writes unaligned data).

use std::collections::HashMap;
use std::fs::File;

use super::{read_at, Checkpoint, CheckpointError, Origin, Tensor};

/// Opens each shard once and reads tensor bytes from it.
pub struct TensorData<'a> {
    ckpt: &'a Checkpoint,
    open: HashMap<usize, File>,
}

impl<'a> TensorData<'a> {
    #[must_use]
    pub fn new(ckpt: &'a Checkpoint) -> Self {
        Self { ckpt, open: HashMap::new() }
    }

    /// Bytes `[begin, end)` of tensor `t`'s data (offsets relative to the tensor).
    ///
    /// # Errors
    /// A virtual checkpoint (no data), a range outside the tensor, or an I/O failure; each names
    /// the tensor and the shard.
    pub fn read(&mut self, t: &Tensor, begin: u64, end: u64) -> Result<Vec<u8>, CheckpointError> {
        if let Origin::Virtual { name } = &self.ckpt.origin {
            return Err(CheckpointError::Virtual {
                name: name.clone(),
                why: format!("tensor `{}` has no data (modelled shapes only)", t.name),
            });
        }
        let shard = self.ckpt.shards.get(t.shard).ok_or_else(|| CheckpointError::Virtual {
            name: t.name.clone(),
            why: "tensor refers to a shard that does not exist".into(),
        })?;
        let err = |source| CheckpointError::DataRead { path: shard.path.clone(), tensor: t.name.clone(), source };
        if begin > end || end > t.bytes() {
            let why = format!("byte range [{begin}, {end}) is outside the tensor's {} bytes", t.bytes());
            return Err(err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why)));
        }
        let len = usize::try_from(end - begin)
            .map_err(|_| err(std::io::Error::new(std::io::ErrorKind::OutOfMemory, "range too large")))?;
        let file = match self.open.entry(t.shard) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(File::open(&shard.path).map_err(err)?),
        };
        let mut buf = vec![0u8; len];
        read_at(file, shard.data_start + t.begin + begin, &mut buf).map_err(err)?;
        Ok(buf)
    }

    /// The whole tensor.
    ///
    /// # Errors
    /// As [`TensorData::read`].
    pub fn read_all(&mut self, t: &Tensor) -> Result<Vec<u8>, CheckpointError> {
        self.read(t, 0, t.bytes())
    }
}

/// Little-endian 16-bit values (I16 / F16 / BF16 data) as `u16` bit patterns; a trailing odd
/// byte is ignored.
#[must_use]
pub fn le_u16(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn le_u16_reads_pairs() {
        assert_eq!(le_u16(&[0x34, 0x12, 0xFF, 0x80, 7]), vec![0x1234, 0x80FF]);
    }
}
