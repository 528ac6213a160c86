//! The checked settings of a run ([`Plan`]) and the server binary they name.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use crate::kernel::swapfile::{fs_available, fs_type, FREE_RESERVE};
use zmem_runenv::size::format_size;

use super::server::ServerSpec;
use super::{KvArgs, KvConfig, MIB, VALUE_MAX, VALUE_MIN};

/// The least log or swap file (`zmem run`'s least --ssd-size).
pub const MIN_SSD_SIZE: u64 = 16 * MIB;

/// The settings of the SSD configurations (`swapfile`, `zmem-ssd`): both use `dir`'s file system
/// and the same DRAM, `--limit`.
#[derive(Clone, Debug, Serialize)]
pub struct SsdPlan {
    pub dir: PathBuf,
    /// The file system type of `dir` ("ext4", "xfs", ...).
    pub file_system: String,
    /// Bytes free on it when the run started.
    pub free_bytes: u64,
    /// The swap file's size and zmem's --ssd-size.
    pub size: u64,
    /// zmem-ssd: --resident and --store-limit; resident + store_limit + margin = --limit.
    pub resident: u64,
    pub store_limit: u64,
    pub margin: u64,
    /// zmem-ssd: the log is encrypted (false with --ssd-no-encrypt).
    pub encrypt: bool,
    /// zmem-ssd: `--ssd-read-ahead`, when given.
    pub read_ahead: Option<u64>,
}

/// The run's parameters after validation.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub server: String,
    pub server_bin: PathBuf,
    pub server_version: String,
    pub limit: u64,
    pub compressed: u64,
    pub step: u64,
    pub max_data: u64,
    pub gets: u64,
    pub pipeline: usize,
    pub clients: usize,
    pub configs: Vec<KvConfig>,
    pub zram_alg: String,
    pub zmem_resident: u64,
    pub zmem_size: u64,
    pub zmem_policy: Option<String>,
    pub zmem_fault_route: Option<String>,
    pub seed: u64,
    pub value_bytes: (usize, usize),
    pub stall_timeout_s: u64,
    pub zram_full_stall_s: u64,
    /// The SSD configurations' settings, when one of them is asked for.
    pub ssd: Option<SsdPlan>,
}

impl Plan {
    /// Checks the flags (an error names the flag), finds the server binary.
    pub fn new(args: &KvArgs, spec: &ServerSpec) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            args.limit >= 16 * MIB,
            "--limit {} is too small for a server (at least 16M)",
            format_size(args.limit)
        );
        let compressed = args.compressed.unwrap_or(args.limit);
        anyhow::ensure!(
            compressed >= 4 * MIB,
            "--compressed {} is too small (at least 4M; zram's mem_limit 0 would mean no limit)",
            format_size(compressed)
        );
        anyhow::ensure!(
            args.step >= MIB,
            "--step {} is too small (at least 1M)",
            format_size(args.step)
        );
        let max_data = args.max_data.unwrap_or(args.limit.saturating_mul(16));
        anyhow::ensure!(
            max_data >= args.step,
            "--max-data {} is smaller than --step {}",
            format_size(max_data),
            format_size(args.step)
        );
        anyhow::ensure!(
            (1..=4096).contains(&args.pipeline),
            "--pipeline must be 1..4096, got {}",
            args.pipeline
        );
        anyhow::ensure!(
            (1..=64).contains(&args.clients),
            "--clients must be 1..64, got {}",
            args.clients
        );
        anyhow::ensure!(
            args.stall_timeout >= 1,
            "--stall-timeout must be at least 1 s"
        );
        anyhow::ensure!(!args.configs.is_empty(), "--configs names no configuration");
        for (i, c) in args.configs.iter().enumerate() {
            anyhow::ensure!(
                !args.configs[..i].contains(c),
                "--configs names {} twice",
                c.as_str()
            );
        }
        anyhow::ensure!(
            !args.zram_alg.trim().is_empty(),
            "--zram-alg must name an algorithm"
        );
        let zmem_resident = args.limit.saturating_sub(args.margin);
        if args.configs.contains(&KvConfig::Zmem) {
            anyhow::ensure!(
                zmem_resident >= 16 * MIB,
                "--limit {} minus --margin {} leaves {} for zmem's resident heap (at least 16M)",
                format_size(args.limit),
                format_size(args.margin),
                format_size(zmem_resident)
            );
        }
        let zmem_size = args
            .zmem_size
            .unwrap_or_else(|| (max_data.saturating_mul(2) + 256 * MIB).div_ceil(MIB) * MIB);
        anyhow::ensure!(
            zmem_size > zmem_resident,
            "--zmem-size {} must be larger than zmem's resident heap {}",
            format_size(zmem_size),
            format_size(zmem_resident)
        );
        let ssd = args
            .configs
            .iter()
            .any(|c| c.is_ssd())
            .then(|| ssd_plan(args, max_data))
            .transpose()?;
        let server_bin = find_binary(args.server.as_deref(), spec)?;
        let server_version = binary_version(&server_bin, spec.version_arg);
        Ok(Plan {
            server: spec.name.to_string(),
            server_bin,
            server_version,
            limit: args.limit,
            compressed,
            step: args.step,
            max_data,
            gets: args.gets,
            pipeline: args.pipeline,
            clients: args.clients,
            configs: args.configs.clone(),
            zram_alg: args.zram_alg.trim().to_string(),
            zmem_resident,
            zmem_size,
            zmem_policy: args.policy.clone(),
            zmem_fault_route: args.fault_route.clone(),
            seed: args.seed,
            value_bytes: (VALUE_MIN, VALUE_MAX),
            stall_timeout_s: args.stall_timeout,
            zram_full_stall_s: args.zram_full_stall,
            ssd,
        })
    }

    pub(super) fn stall(&self) -> Duration {
        Duration::from_secs(self.stall_timeout_s)
    }
}

/// The SSD configurations' sizes (zmem-ssd's split of `--limit` checked only when it runs) and
/// their directory, checked: it must exist, be on a file system the kernel swaps to files on,
/// and have room for the swap file (or log) and [`FREE_RESERVE`] to spare. The two
/// configurations run one after the other, so the room is needed once.
pub fn ssd_plan(args: &KvArgs, max_data: u64) -> anyhow::Result<SsdPlan> {
    let size = args
        .ssd_size
        .unwrap_or_else(|| (max_data + 1024 * MIB).div_ceil(MIB) * MIB);
    anyhow::ensure!(
        size >= MIN_SSD_SIZE,
        "--ssd-size {} is too small (at least {})",
        format_size(size),
        format_size(MIN_SSD_SIZE)
    );
    let (resident, store_limit) = ssd_split(args.limit, args.margin, args.ssd_store_limit);
    if args.configs.contains(&KvConfig::ZmemSsd) {
        anyhow::ensure!(
            store_limit >= MIB,
            "--ssd-store-limit {} is too small (at least 1M)",
            format_size(store_limit)
        );
        anyhow::ensure!(
            resident >= 16 * MIB,
            "--limit {} minus --ssd-store-limit {} minus --margin {} leaves {} for zmem-ssd's \
             resident heap (at least 16M)",
            format_size(args.limit),
            format_size(store_limit),
            format_size(args.margin),
            format_size(resident)
        );
    }
    let dir = &args.ssd_dir;
    let file_system = check_ssd_dir(dir)?;
    let free_bytes = fs_available(dir)?;
    anyhow::ensure!(
        free_bytes >= size + FREE_RESERVE,
        "--ssd-dir {} has {} free; --ssd-size {} needs that and {} to spare",
        dir.display(),
        format_size(free_bytes),
        format_size(size),
        format_size(FREE_RESERVE)
    );
    Ok(SsdPlan {
        dir: dir.clone(),
        file_system,
        free_bytes,
        size,
        resident,
        store_limit,
        margin: args.margin,
        encrypt: !args.ssd_no_encrypt,
        read_ahead: args.ssd_read_ahead,
    })
}

/// zmem-ssd's resident heap and store limit out of `limit` (the store limit a quarter of it
/// unless given, whole MiB): what is not `margin` is heap, DRAM or compressed, so that its
/// cgroup holds the same DRAM as the swap file's, where the kernel has no compressed pool
/// either. The resident part saturates at 0 (checked by the caller).
pub fn ssd_split(limit: u64, margin: u64, store_limit: Option<u64>) -> (u64, u64) {
    let store = store_limit.unwrap_or(limit / 4 / MIB * MIB);
    (limit.saturating_sub(store).saturating_sub(margin), store)
}

/// The file system type of `dir`, or why the SSD configurations cannot use it.
pub fn check_ssd_dir(dir: &Path) -> anyhow::Result<String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => anyhow::bail!("--ssd-dir {} is not a directory", dir.display()),
        Err(e) => anyhow::bail!("--ssd-dir {}: {e}", dir.display()),
    }
    let fs = fs_type(dir)?;
    let why = match fs.as_str() {
        "tmpfs" | "ramfs" => Some("memory, not a disk: a swap file cannot live there"),
        "overlayfs" | "nfs" => Some("a file system the kernel cannot swap to a file on"),
        "btrfs" => {
            Some("btrfs, which takes a swap file only made NOCOW, as this benchmark does not")
        }
        _ => None,
    };
    if let Some(why) = why {
        anyhow::bail!(
            "--ssd-dir {} is on {fs}: {why}; use a directory on a disk file system (ext4, xfs)",
            dir.display()
        );
    }
    Ok(fs)
}

/// `--server` as given (it must exist), or the server's name looked up in PATH.
pub(super) fn find_binary(given: Option<&Path>, spec: &ServerSpec) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        anyhow::ensure!(
            p.is_file(),
            "--server {} does not exist or is not a file",
            p.display()
        );
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(spec.default_bin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} not found in PATH ({}; or pass --server PATH)",
                spec.default_bin,
                spec.install_hint
            )
        })
}

/// "7.0.15" out of "Redis server v=7.0.15 sha=...", "1.6.18" out of "memcached 1.6.18".
pub(super) fn short_version(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    if let Some(v) = words.iter().find_map(|w| w.strip_prefix("v=")) {
        return v.to_string();
    }
    words
        .iter()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .map_or_else(|| line.trim().to_string(), |w| w.to_string())
}

pub(super) fn binary_version(bin: &Path, arg: &str) -> String {
    Command::new(bin)
        .arg(arg)
        .stdin(Stdio::null())
        .output()
        .ok()
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            short_version(s.lines().next().unwrap_or(""))
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: KvArgs,
    }

    fn args(extra: &[&str]) -> KvArgs {
        let mut v = vec!["x"];
        v.extend_from_slice(extra);
        P::parse_from(v).a
    }

    #[test]
    fn ssd_split_leaves_the_margin_and_a_quarter_for_the_pool() {
        assert_eq!(ssd_split(128 * MIB, 48 * MIB, None), (48 * MIB, 32 * MIB));
        assert_eq!(
            ssd_split(128 * MIB, 16 * MIB, Some(64 * MIB)),
            (48 * MIB, 64 * MIB)
        );
        // A quarter in whole MiB.
        assert_eq!(ssd_split(50 * MIB, 8 * MIB, None).1, 12 * MIB);
        assert_eq!(ssd_split(32 * MIB, 48 * MIB, None), (0, 8 * MIB));
    }

    #[test]
    fn ssd_plan_sizes_and_errors() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let d = dir.path().display().to_string();
        let a = args(&[
            "--configs",
            "swapfile,zmem-ssd",
            "--limit",
            "128M",
            "--ssd-dir",
            &d,
        ]);
        let fs = fs_type(dir.path()).unwrap();
        if check_ssd_dir(dir.path()).is_err() {
            eprintln!("skipped: /var/tmp is on {fs}");
            return;
        }
        let p = ssd_plan(&a, 512 * MIB).unwrap();
        assert_eq!(p.size, 1536 * MIB);
        assert_eq!((p.resident, p.store_limit), (48 * MIB, 32 * MIB));
        assert_eq!(p.file_system, fs);
        assert!(p.encrypt);
        // The split is checked only when zmem-ssd runs.
        let small = ["--limit", "64M", "--ssd-dir", &d];
        let e = ssd_plan(
            &args(&[&["--configs", "zmem-ssd"], &small[..]].concat()),
            MIB,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("leaves 0 for zmem-ssd's resident heap"), "{e}");
        assert!(ssd_plan(
            &args(&[&["--configs", "swapfile"], &small[..]].concat()),
            MIB
        )
        .is_ok());
        let e = ssd_plan(&args(&["--ssd-size", "4M", "--ssd-dir", &d]), MIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--ssd-size 4M is too small"), "{e}");
        let e = ssd_plan(&args(&["--ssd-size", "1000000G", "--ssd-dir", &d]), MIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("free; --ssd-size 1000000G needs that"), "{e}");
    }

    #[test]
    fn ssd_dir_must_exist_and_be_on_a_disk() {
        let e = check_ssd_dir(Path::new("/nonexistent/zmem")).unwrap_err();
        assert!(
            e.to_string().starts_with("--ssd-dir /nonexistent/zmem: "),
            "{e}"
        );
        let e = check_ssd_dir(Path::new("/proc/self/status")).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        let shm = Path::new("/dev/shm");
        if fs_type(shm).is_ok_and(|t| t == "tmpfs") {
            let e = check_ssd_dir(shm).unwrap_err().to_string();
            assert!(e.contains("/dev/shm is on tmpfs"), "{e}");
        } else {
            eprintln!("note: /dev/shm is not tmpfs here: that case is not checked");
        }
    }

    #[test]
    fn versions_are_short() {
        assert_eq!(
            short_version("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64"),
            "7.0.15"
        );
        assert_eq!(short_version("memcached 1.6.18"), "1.6.18");
        assert_eq!(short_version("odd"), "odd");
    }
}
