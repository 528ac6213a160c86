//! The benchmark's data: a corpus directory, concatenated; write buffers are filled from it in
//! order, cycling, so the expected content of any offset is a pure function and reads can be
//! verified.

use std::path::{Path, PathBuf};

/// Checksum files shipped inside corpus directories, not data.
pub const SKIPPED_FILES: [&str; 3] = ["SHA256SUMS", "SHA1SUM.upstream", "MD5SUM.reference"];

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("corpus directory {0} does not exist")]
    Missing(PathBuf),
    #[error("corpus {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("corpus directory {0} has no data (no regular file with bytes)")]
    Empty(PathBuf),
    #[error("reading corpus {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

/// A corpus loaded in memory.
#[derive(Clone, Debug)]
pub struct Corpus {
    dir: PathBuf,
    files: Vec<(String, u64)>,
    data: Vec<u8>,
}

impl Corpus {
    /// Loads all regular files of `dir` (not recursive), sorted by name, concatenated; checksum
    /// files ([`SKIPPED_FILES`]) are skipped.
    pub fn load(dir: &Path) -> Result<Self, CorpusError> {
        let io = |err| CorpusError::Io {
            path: dir.to_path_buf(),
            err,
        };
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CorpusError::Missing(dir.to_path_buf()))
            }
            Err(e) => return Err(io(e)),
        };
        if !meta.is_dir() {
            return Err(CorpusError::NotADirectory(dir.to_path_buf()));
        }
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if SKIPPED_FILES.contains(&name.as_str()) {
                continue;
            }
            // metadata() follows symbolic links: a link to a regular file counts.
            let path = entry.path();
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => entries.push((name, path)),
                Ok(_) => {}
                Err(e) => {
                    return Err(CorpusError::Io { path, err: e });
                }
            }
        }
        entries.sort();
        let mut data = Vec::new();
        let mut files = Vec::with_capacity(entries.len());
        for (name, path) in entries {
            let bytes = std::fs::read(&path).map_err(|err| CorpusError::Io {
                path: path.clone(),
                err,
            })?;
            files.push((name, bytes.len() as u64));
            data.extend_from_slice(&bytes);
        }
        if data.is_empty() {
            return Err(CorpusError::Empty(dir.to_path_buf()));
        }
        Ok(Corpus {
            dir: dir.to_path_buf(),
            files,
            data,
        })
    }

    /// A corpus from bytes (tests, synthetic data). `None` if `data` is empty.
    pub fn from_bytes(name: &str, data: Vec<u8>) -> Option<Self> {
        (!data.is_empty()).then(|| Corpus {
            dir: PathBuf::from(name),
            files: vec![(name.to_string(), data.len() as u64)],
            data,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// (name, bytes) of the files, in the order they were concatenated.
    pub fn files(&self) -> &[(String, u64)] {
        &self.files
    }

    /// Total bytes (never 0).
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Always false: a loaded corpus has bytes.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Fills `buf` with the corpus bytes starting at `offset mod len`, wrapping.
    pub fn fill(&self, offset: u64, buf: &mut [u8]) {
        let mut pos = (offset % self.len()) as usize;
        let mut done = 0;
        while done < buf.len() {
            let n = (self.data.len() - pos).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&self.data[pos..pos + n]);
            done += n;
            pos = 0;
        }
    }

    /// Index of the first byte of `buf` that differs from what [`fill`](Self::fill) gives for
    /// `offset`, or None if it all matches.
    pub fn first_mismatch(&self, offset: u64, buf: &[u8]) -> Option<usize> {
        let mut pos = (offset % self.len()) as usize;
        let mut done = 0;
        while done < buf.len() {
            let n = (self.data.len() - pos).min(buf.len() - done);
            let got = &buf[done..done + n];
            let want = &self.data[pos..pos + n];
            if got != want {
                let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                return Some(done + i);
            }
            done += n;
            pos = 0;
        }
        None
    }
}

/// Corpus directories tried in order when --corpus is not given.
pub const DEFAULT_CORPORA: [&str; 2] =
    ["../shared/corpora/calgary", "/work/shared/corpora/calgary"];

/// The first of [`DEFAULT_CORPORA`] that exists (the first one if none does, so the error names it).
pub fn default_corpus() -> PathBuf {
    DEFAULT_CORPORA
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CORPORA[0]))
}
