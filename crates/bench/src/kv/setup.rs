//! What a run of `bench redis`/`memcached` checks first: the server binary, the machine, each configuration.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::kernel::memcg::MEMCG_ROOT;
use crate::kernel::swapfile::{note_leftover_swapfiles, SWAPFILE_PREFIX};
use crate::kernel::zram::{ZramSession, ZRAM_INDEX};
use crate::process::describe_status;
use crate::ssd::run::LogDir;

use super::plan::Plan;
use super::server::ServerSpec;
use super::{KvConfig, START_TIMEOUT};
use crate::kernel::memcg::{memcg_v1_available, note_leftover_cgroups};

/// Root and the cgroup v1 memory controller: without them nothing can run.
pub(super) fn check_machine() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    anyhow::ensure!(
        uid == 0,
        "this benchmark needs root (memory cgroups, swapon, /dev/zram0); running as uid {uid}"
    );
    anyhow::ensure!(
        memcg_v1_available(),
        "no cgroup v1 memory controller at {MEMCG_ROOT} (cgroup v2 is not supported yet)"
    );
    note_leftover_cgroups();
    Ok(())
}

/// Why a configuration cannot run here (checked before anything runs).
pub(super) fn precheck(c: KvConfig, plan: &Plan, spec: &ServerSpec) -> Result<(), String> {
    match c {
        KvConfig::Noswap => Ok(()),
        KvConfig::Zram => ZramSession::acquire(ZRAM_INDEX)
            .map(drop)
            .map_err(|e| e.to_string()),
        KvConfig::Zmem => zmem_run_available(plan, spec, c),
        KvConfig::Swapfile => {
            let ssd = plan.ssd.as_ref().ok_or("no --ssd-dir was checked")?;
            note_leftover_swapfiles(&ssd.dir);
            let own = ssd
                .dir
                .join(format!("{SWAPFILE_PREFIX}{}", std::process::id()));
            match own.exists() {
                true => Err(format!("{} exists already", own.display())),
                false => Ok(()),
            }
        }
        KvConfig::ZmemSsd => zmem_run_available(plan, spec, c),
    }
}

/// Flags of `zmem run` this benchmark passes (all zmem configurations).
pub(super) const ZMEM_RUN_FLAGS: [&str; 5] = [
    "--resident",
    "--store-limit",
    "--size",
    "--quiet",
    "--stats",
];
/// The flags zmem-ssd passes on top (and --ssd-no-encrypt when asked).
pub(super) const ZMEM_RUN_SSD_FLAGS: [&str; 2] = ["--ssd", "--ssd-size"];

/// The flags of `zmem run` configuration `c` needs that `help` (of `zmem run`) does not list.
pub(super) fn missing_run_flags(help: &str, plan: &Plan, c: KvConfig) -> Vec<&'static str> {
    let words: Vec<&str> = help
        .split(|ch: char| ch.is_whitespace() || ch == ',' || ch == '=')
        .collect();
    let mut needed: Vec<&'static str> = ZMEM_RUN_FLAGS.to_vec();
    if c == KvConfig::ZmemSsd {
        needed.extend(ZMEM_RUN_SSD_FLAGS);
        if plan.ssd.as_ref().is_some_and(|s| !s.encrypt) {
            needed.push("--ssd-no-encrypt");
        }
        if plan.ssd.as_ref().is_some_and(|s| s.read_ahead.is_some()) {
            needed.push("--ssd-read-ahead");
        }
    }
    needed.retain(|f| !words.contains(f));
    needed
}

/// Whether this binary has `zmem run` with the flags configuration `c` uses, and it runs the
/// server (zmem-ssd: with a log in --ssd-dir).
pub(super) fn zmem_run_available(
    plan: &Plan,
    spec: &ServerSpec,
    c: KvConfig,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the zmem binary: {e}"))?;
    let out = Command::new(&exe)
        .args(["run", "--help"])
        .stdin(Stdio::null())
        .env_remove("RUST_LOG")
        .output()
        .map_err(|e| format!("running {} run --help: {e}", exe.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("").trim();
        return Err(format!(
            "`zmem run` is not available in this build ({} run --help: {first}); \
             choose --configs {}",
            exe.display(),
            if c == KvConfig::ZmemSsd {
                "swapfile"
            } else {
                "noswap,zram"
            }
        ));
    }
    let help = String::from_utf8_lossy(&out.stdout);
    let missing = missing_run_flags(&help, plan, c);
    if !missing.is_empty() {
        return Err(format!(
            "`zmem run` lacks {} (its --help does not list them)",
            missing.join(", ")
        ));
    }
    // The whole chain once (the preload library found, the server preloadable, userfaultfd;
    // zmem-ssd: the log opened in --ssd-dir): the server prints its version under `zmem run`
    // and exits.
    let mut run = Command::new(&exe);
    run.args(["run", "--quiet", "--resident", "16M"]);
    let mut _log = None;
    if c == KvConfig::ZmemSsd {
        let ssd = plan.ssd.as_ref().ok_or("no --ssd-dir was checked")?;
        let log = LogDir::create(&ssd.dir).map_err(|e| format!("{e:#}"))?;
        run.arg("--ssd").arg(log.path()).args(["--ssd-size", "16M"]);
        if !ssd.encrypt {
            run.arg("--ssd-no-encrypt");
        }
        _log = Some(log);
    }
    let mut child = run
        .arg("--")
        .arg(&plan.server_bin)
        .arg(spec.version_arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG")
        .spawn()
        .map_err(|e| format!("running {} run: {e}", exe.display()))?;
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() < START_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`zmem run -- {} {}` did not finish within {} s",
                    plan.server_bin.display(),
                    spec.version_arg,
                    START_TIMEOUT.as_secs()
                ));
            }
        }
    };
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let err = err.split_whitespace().collect::<Vec<_>>().join(" ");
        return Err(format!(
            "`zmem run -- {} {}` failed ({}): {err}",
            plan.server_bin.display(),
            spec.version_arg,
            describe_status(status)
        ));
    }
    Ok(())
}
