//! The checked settings of a run ([`Plan`]) and the server binary they name.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use zmem_runenv::size::format_size;

use super::server::ServerSpec;
use super::{KvArgs, KvConfig, MIB, VALUE_MAX, VALUE_MIN};

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
    pub seed: u64,
    pub value_bytes: (usize, usize),
    pub stall_timeout_s: u64,
    pub zram_full_stall_s: u64,
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
            seed: args.seed,
            value_bytes: (VALUE_MIN, VALUE_MAX),
            stall_timeout_s: args.stall_timeout,
            zram_full_stall_s: args.zram_full_stall,
        })
    }

    pub(super) fn stall(&self) -> Duration {
        Duration::from_secs(self.stall_timeout_s)
    }
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
