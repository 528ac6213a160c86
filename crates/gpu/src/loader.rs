//! Finding and opening the CUDA driver and nvCOMP at run time (dlopen through `libloading`),
//! so that building and testing zmem never needs CUDA.

use std::path::{Path, PathBuf};

use libloading::Library;

use crate::GpuError;

/// An opened library and where it came from.
pub(crate) struct Loaded {
    pub(crate) lib: Library,
    pub(crate) path: PathBuf,
    pub(crate) what: &'static str,
}

impl Loaded {
    /// The function `name` as a value of the function-pointer type `T`.
    ///
    /// # Safety
    /// `T` must be the symbol's true C signature; the pointer is valid while `self.lib` lives.
    pub(crate) unsafe fn func<T: Copy>(&self, name: &str) -> Result<T, GpuError> {
        let missing = || GpuError::MissingSymbol {
            what: self.what,
            path: self.path.clone(),
            symbol: name.to_string(),
        };
        let mut c = name.as_bytes().to_vec();
        c.push(0);
        // SAFETY: the caller vouches for the type; a missing symbol is an error, not a crash.
        let sym = unsafe { self.lib.get::<T>(&c) }.map_err(|_| missing())?;
        Ok(*sym)
    }
}

/// Opens the first of `candidates` that loads: an explicit path from `env` first (its failure
/// is the answer: the user asked for that file), then plain names (the dynamic loader's own
/// search: LD_LIBRARY_PATH, ldconfig's cache), then paths.
pub(crate) fn open(
    what: &'static str,
    env: &str,
    names: &[&str],
    dirs: &[PathBuf],
    hint: &'static str,
) -> Result<Loaded, GpuError> {
    if let Some(p) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(p);
        if !path.is_dir() {
            return load(what, &path);
        }
        // A folder (a wheel's lib64): the first of the names in it.
        return match names.iter().map(|n| path.join(n)).find(|p| p.exists()) {
            Some(file) => load(what, &file),
            None => Err(GpuError::LibraryNotFound {
                what,
                tried: names
                    .iter()
                    .map(|n| path.join(n).display().to_string())
                    .collect(),
                hint,
            }),
        };
    }
    let mut tried = Vec::new();
    for name in names {
        tried.push(name.to_string());
        if let Ok(l) = load(what, Path::new(name)) {
            return Ok(l);
        }
    }
    for dir in dirs {
        for name in names {
            let path = dir.join(name);
            if path.exists() {
                // Found but broken: that is the reason to give, not "not found".
                return load(what, &path);
            }
            tried.push(path.display().to_string());
        }
    }
    tried.push(format!("${env}"));
    Err(GpuError::LibraryNotFound { what, tried, hint })
}

fn load(what: &'static str, path: &Path) -> Result<Loaded, GpuError> {
    // SAFETY: loading a library runs its constructors; the CUDA driver's and nvCOMP's are
    // made to be dlopened by any process.
    match unsafe { Library::new(path) } {
        Ok(lib) => Ok(Loaded {
            lib,
            path: path.to_path_buf(),
            what,
        }),
        Err(e) => Err(GpuError::LibraryLoad {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// Where `pip install nvidia-libnvcomp-cu13` (or -cu12) puts libnvcomp: the `nvidia/libnvcomp/lib64`
/// folder of every Python's site-packages or dist-packages zmem can see without running Python
/// (the active virtual environment, the user's, the system's).
pub(crate) fn nvcomp_wheel_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(PathBuf::from(v).join("lib"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(h).join(".local/lib"));
    }
    for r in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        roots.push(PathBuf::from(r));
    }
    let mut dirs = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons.into_iter().rev() {
            for pk in ["site-packages", "dist-packages"] {
                let d = py.join(pk).join("nvidia/libnvcomp/lib64");
                if d.is_dir() {
                    dirs.push(d);
                }
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_found_nowhere_lists_where_it_was_looked_for() {
        let dir = std::env::temp_dir();
        let e = open(
            "the test library",
            "ZMEM_GPU_TEST_UNSET_VARIABLE",
            &["libzmem-no-such-library.so.1"],
            std::slice::from_ref(&dir),
            "install it",
        )
        .err()
        .expect("no such library");
        let msg = e.to_string();
        assert!(matches!(e, GpuError::LibraryNotFound { .. }), "{e:?}");
        assert!(msg.contains("libzmem-no-such-library.so.1"), "{msg}");
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        assert!(msg.contains("$ZMEM_GPU_TEST_UNSET_VARIABLE"), "{msg}");
        assert!(msg.ends_with("install it"), "{msg}");
    }

    #[test]
    fn a_file_that_is_not_a_library_says_it_cannot_be_loaded() {
        let dir = std::env::temp_dir().join(format!("zmem-gpu-loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = "libnvcomp.so.6";
        std::fs::write(dir.join(name), b"not an ELF file").unwrap();
        let e = open(
            "nvCOMP",
            "ZMEM_GPU_TEST_UNSET_VARIABLE",
            &[name],
            std::slice::from_ref(&dir),
            "",
        )
        .err()
        .expect("not a library");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(e, GpuError::LibraryLoad { .. }), "{e:?}");
    }

    #[test]
    fn a_library_without_the_functions_names_the_missing_one() {
        // The C library loads everywhere and has no nvCOMP in it.
        let l = load("nvCOMP", Path::new("libc.so.6")).unwrap();
        // SAFETY: never called.
        let e = unsafe { l.func::<extern "C" fn()>("nvcompGetProperties") }
            .expect_err("libc has no nvCOMP");
        assert!(e.to_string().contains("has no nvcompGetProperties"), "{e}");
        // SAFETY: getpid's true signature.
        let getpid = unsafe { l.func::<extern "C" fn() -> i32>("getpid") }.unwrap();
        assert_eq!(getpid() as u32, std::process::id());
    }
}
