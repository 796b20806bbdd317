//! The fake Hub's data: repos, commits, files, faults, and what it served.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use sha1::Digest as _;

/// Where a file's bytes come from.
#[derive(Clone, Debug)]
pub enum Content {
    Mem(Arc<Vec<u8>>),
    Disk(PathBuf),
}

impl Content {
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        match self {
            Content::Mem(v) => {
                let s = usize::try_from(offset).unwrap();
                v[s..s + len].to_vec()
            }
            Content::Disk(p) => {
                let mut buf = vec![0u8; len];
                std::fs::File::open(p).unwrap().read_exact_at(&mut buf, offset).unwrap();
                buf
            }
        }
    }
}

/// One file at one commit.
#[derive(Clone, Debug)]
pub struct FakeFile {
    pub path: String,
    pub size: u64,
    pub lfs: bool,
    pub sha256: String,
    pub git_sha1: String,
    pub content: Content,
    /// Size the listing and `X-Linked-Size` claim (tests of the disk-space check).
    pub claimed_size: Option<u64>,
    /// The Xet file hash when the file is in the CAS (`resolve` then sends `X-Xet-Hash`).
    pub xet_hash: Option<String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Deterministic pseudo-random bytes for `seed`.
pub fn seeded_bytes(seed: &str, len: usize) -> Vec<u8> {
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes() {
        x = (x ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

impl FakeFile {
    /// A file with the given bytes; `lfs` decides LFS (sha256, CDN) vs regular (git sha1, 307).
    pub fn bytes(path: &str, data: Vec<u8>, lfs: bool) -> Self {
        let sha256 = hex(&sha2::Sha256::digest(&data));
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", data.len()).as_bytes());
        h.update(&data);
        let git_sha1 = hex(&h.finalize());
        Self {
            path: path.into(),
            size: data.len() as u64,
            lfs,
            sha256,
            git_sha1,
            content: Content::Mem(Arc::new(data)),
            claimed_size: None,
            xet_hash: None,
        }
    }

    /// An LFS file of `len` seeded random bytes.
    pub fn random(path: &str, len: usize) -> Self {
        Self::bytes(path, seeded_bytes(path, len), true)
    }

    /// An LFS file backed by a file on disk with a known sha256 (benchmarks).
    pub fn disk(path: &str, file: PathBuf, size: u64, sha256: &str) -> Self {
        Self {
            path: path.into(),
            size,
            lfs: true,
            sha256: sha256.into(),
            git_sha1: "0".repeat(40),
            content: Content::Disk(file),
            claimed_size: None,
            xet_hash: None,
        }
    }

    /// The git id of the LFS pointer (what the tree's `oid` is for LFS files).
    pub fn pointer_oid(&self) -> String {
        let ptr =
            format!("version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n", self.sha256, self.size);
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", ptr.len()).as_bytes());
        h.update(ptr.as_bytes());
        hex(&h.finalize())
    }

    /// The file's bytes.
    pub fn content_bytes(&self) -> Vec<u8> {
        self.content.read(0, usize::try_from(self.size).unwrap())
    }

    pub fn listed_size(&self) -> u64 {
        self.claimed_size.unwrap_or(self.size)
    }
}

/// Which listener a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Cdn,
    Resolve,
    /// The JSON API (`/api/models/…`: revision, tree, repo info); `path` is the API route name
    /// (`revision`, `tree`, `info`, `xet-read-token`).
    Api,
    /// The CAS proxy; `path` is the request kind (`reconstructions`, `fetch_term`).
    Cas,
}

/// How the server reports what is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Dialect {
    /// As huggingface.co: `X-Error-Code` `RepoNotFound` (401 anonymous), `RevisionNotFound`
    /// (404), `EntryNotFound` (404 + `X-Repo-Commit`), `GatedRepo` (401/403).
    #[default]
    Hub,
    /// Another Hub implementation: every missing thing is `404` + `X-Error-Code: EntryNotFound`.
    EntryOnly,
    /// A plain mirror: `404` with no error headers at all.
    Bare,
}

/// What goes wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Close the connection after this many body bytes.
    DropAfter(u64),
    /// Answer with this status (500, 503 …).
    Status(u16),
    /// 429 with `Retry-After: n`.
    TooMany { retry_after: u64 },
    /// 429 with only `RateLimit: "resolvers";r=0;t=n` (the Hub's quota header).
    QuotaExhausted { reset: u64 },
    /// 206 with a Content-Range one byte off.
    WrongContentRange,
    /// 200 with the whole file, ignoring Range.
    IgnoreRange,
    /// Flip one byte of the body.
    CorruptByte,
    /// Send this many bytes at ~10 KiB/s, then go silent.
    TrickleStall { bytes: u64 },
    /// Treat the signed link as expired (403).
    Expire,
}

/// A scripted fault: on requests to `route` for `path` (any when `None`), after `skip` matching
/// requests, fire `times` times.
#[derive(Clone, Debug)]
pub struct Fault {
    pub route: Route,
    pub path: Option<String>,
    pub kind: FaultKind,
    pub skip: u32,
    pub times: u32,
}

impl Fault {
    pub fn cdn(path: &str, kind: FaultKind) -> Self {
        Self { route: Route::Cdn, path: Some(path.into()), kind, skip: 0, times: 1 }
    }
}

/// A commit: its files by path.
#[derive(Clone, Debug, Default)]
pub struct CommitFiles {
    pub files: Vec<FakeFile>,
}

/// A repository.
#[derive(Clone, Debug, Default)]
pub struct Repo {
    pub branches: HashMap<String, String>,
    pub commits: HashMap<String, CommitFiles>,
    /// The token that unlocks a gated repo (`None` = not gated).
    pub gate: Option<String>,
    /// Extra raw tree entries (e.g. a traversal attempt), listed as regular files.
    pub extra_listing: Vec<String>,
}

/// One request the CDN answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub path: String,
    /// Requested range, inclusive end.
    pub range: Option<(u64, u64)>,
    pub status: u16,
    /// Body bytes handed to the connection.
    pub bytes: u64,
    /// Whether the whole requested body was handed over.
    pub complete: bool,
}

/// Logs and counters.
#[derive(Default, Debug)]
pub struct Log {
    pub served: Vec<Served>,
    pub resolves: HashMap<String, u32>,
    /// (listener, Authorization header) of every request.
    pub auth: Vec<(Route, Option<String>)>,
    pub api_calls: Vec<String>,
    /// CAS requests: (kind, Range header).
    pub cas_calls: Vec<(String, Option<String>)>,
}
