//! `zmem doctor`: what `zmem run` and the benchmarks need from this machine, checked one item at
//! a time, each with what works and how to fix what does not. A user who hits a refusal of
//! `zmem run` (no userfaultfd permission, an old kernel) is sent here.
//!
//! Items `zmem run` cannot work without are FAIL when missing and make the exit status 1; the
//! rest (PSI for `--adaptive`, the cgroup memory controller and zram for the benchmarks'
//! kernel side, io_uring for the SSD tier) are WARN and do not. The checks read the
//! machine through [`Probes`] (paths and functions), so tests can simulate a machine that lacks
//! any of them.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::size::format_size_approx as human;

/// The oldest kernel with everything zmem needs (UFFDIO_MOVE came in 6.8).
pub const MIN_KERNEL: (u32, u32) = (6, 8);

/// The features the region requests, with their names.
pub use zmem_region::userfaultfd::NEEDED_FEATURES;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What opening a userfaultfd gave.
#[derive(Debug)]
pub enum UffdProbe {
    /// Opened (through the device or the syscall); the features the kernel offers.
    Features { features: u64, via: &'static str },
    /// The kernel has userfaultfd but this user may not open it in full mode.
    Permission(io::Error),
    /// The kernel lacks userfaultfd (or it failed otherwise).
    Unavailable(io::Error),
}

/// Where the checks look; [`Probes::machine`] is this machine.
pub struct Probes {
    /// The kernel release (/proc/sys/kernel/osrelease).
    pub osrelease: PathBuf,
    pub userfaultfd: fn() -> UffdProbe,
    /// /proc/pressure/memory.
    pub psi: PathBuf,
    /// /sys/fs/cgroup.
    pub cgroup: PathBuf,
    /// /sys/class/zram-control and /dev/zram0.
    pub zram: [PathBuf; 2],
    pub io_uring: fn() -> io::Result<()>,
    /// Where `zmem run` finds its preload library.
    pub preload: fn() -> Result<PathBuf, String>,
    /// /proc/meminfo.
    pub meminfo: PathBuf,
    /// Whether zmem runs with CAP_SYS_ADMIN (`zmem run --fault-route auto` takes the signal
    /// route then).
    pub sys_admin: fn() -> bool,
    /// The GPU backend: the device and libraries, or why there is none.
    pub gpu: fn() -> Result<String, String>,
}

impl Probes {
    pub fn machine() -> Probes {
        Probes {
            osrelease: "/proc/sys/kernel/osrelease".into(),
            userfaultfd: probe_userfaultfd,
            psi: "/proc/pressure/memory".into(),
            cgroup: "/sys/fs/cgroup".into(),
            zram: ["/sys/class/zram-control".into(), "/dev/zram0".into()],
            io_uring: probe_io_uring,
            preload: || crate::run::find_library(None).map_err(|e| e.to_string()),
            meminfo: "/proc/meminfo".into(),
            sys_admin: || zmem_os::caps::effective(zmem_os::caps::SYS_ADMIN),
            gpu: || zmem_gpu::probe(&zmem_gpu::GpuConfig::default()).map_err(|e| e.to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One checked item.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub status: Status,
    pub item: &'static str,
    pub detail: String,
    /// How to fix it (empty when OK).
    pub fix: String,
    /// Whether `zmem run` needs it (a missing one is FAIL; otherwise WARN).
    pub required: bool,
}

fn ok(item: &'static str, required: bool, detail: String) -> Check {
    Check {
        status: Status::Ok,
        item,
        detail,
        fix: String::new(),
        required,
    }
}

fn bad(item: &'static str, required: bool, detail: String, fix: &str) -> Check {
    Check {
        status: if required { Status::Fail } else { Status::Warn },
        item,
        detail,
        fix: fix.to_string(),
        required,
    }
}

const FIX_PERMISSION: &str = "let this user open /dev/userfaultfd: as root, `groupadd -f zmem && usermod -aG zmem $USER`, \
     write `KERNEL==\"userfaultfd\", GROUP=\"zmem\", MODE=\"0660\"` to /etc/udev/rules.d/60-zmem.rules, \
     `udevadm control --reload && udevadm trigger /dev/userfaultfd`, then log in again; \
     or `sysctl vm.unprivileged_userfaultfd=1`; or run zmem with CAP_SYS_PTRACE";

/// (major, minor) of a release string such as "6.18.44-fc".
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(['.', '-']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn feature_names(bits: u64) -> String {
    NEEDED_FEATURES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs every check.
pub fn checks(p: &Probes) -> Vec<Check> {
    let mut out = Vec::new();

    let release = std::fs::read_to_string(&p.osrelease).unwrap_or_default();
    out.push(match parse_release(&release) {
        Some(v) if v >= MIN_KERNEL => ok("kernel", true, format!("Linux {}", release.trim())),
        Some(_) => bad(
            "kernel",
            true,
            format!(
                "Linux {} is older than 6.8, which added UFFDIO_MOVE",
                release.trim()
            ),
            "boot Linux 6.8 or later (e.g. Debian's bookworm-backports kernel, Ubuntu 24.04)",
        ),
        None => bad(
            "kernel",
            true,
            format!(
                "cannot read the kernel release from {}",
                p.osrelease.display()
            ),
            "zmem needs Linux 6.8 or later; check `uname -r`",
        ),
    });

    let uffd = (p.userfaultfd)();
    out.push(match &uffd {
        UffdProbe::Features { via, .. } => ok("userfaultfd", true, format!("opened ({via})")),
        UffdProbe::Permission(e) => bad(
            "userfaultfd",
            true,
            format!("this user may not open a full-mode userfaultfd: {e}"),
            FIX_PERMISSION,
        ),
        UffdProbe::Unavailable(e) => bad(
            "userfaultfd",
            true,
            format!("the kernel offers no userfaultfd: {e}"),
            "use a kernel built with CONFIG_USERFAULTFD=y (every distribution kernel is)",
        ),
    });
    let all: u64 = NEEDED_FEATURES.iter().map(|(b, _)| b).fold(0, |a, b| a | b);
    out.push(match uffd {
        UffdProbe::Features { features, .. } if features & all == all => ok(
            "userfaultfd features",
            true,
            format!("{features:#x}: {}", feature_names(all)),
        ),
        UffdProbe::Features { features, .. } => bad(
            "userfaultfd features",
            true,
            format!("{features:#x} lacks {}", feature_names(all & !features)),
            "boot Linux 6.8 or later (UFFDIO_MOVE 6.8, POISON 6.6)",
        ),
        _ => bad(
            "userfaultfd features",
            true,
            "not checked: userfaultfd cannot be opened".into(),
            "fix userfaultfd first",
        ),
    });

    out.push(match (p.preload)() {
        Ok(path) => ok("preload library", true, path.display().to_string()),
        Err(e) => bad(
            "preload library",
            true,
            e,
            "build it with `cargo build --release --workspace` (it lands next to zmem), install the \
             zmem package (/usr/lib/zmem), or set ZMEM_PRELOAD",
        ),
    });

    out.push(if (p.sys_admin)() {
        ok(
            "fault route",
            false,
            "signal: `zmem run` serves each fault on the faulting thread (CAP_SYS_ADMIN)".into(),
        )
    } else {
        bad(
            "fault route",
            false,
            "handler: without CAP_SYS_ADMIN `zmem run` hands each fault to its handler thread \
             (slower); `--fault-route signal` works here too, but then the program cannot gain \
             privileges through set-user-ID executables (`sudo` inside it fails)"
                .into(),
            "run zmem as root (or with CAP_SYS_ADMIN) for the signal route",
        )
    });

    out.push(match std::fs::read_to_string(&p.psi) {
        Ok(t) if t.starts_with("some") => ok("PSI", false, format!("{} is on", p.psi.display())),
        Ok(_) | Err(_) => bad(
            "PSI",
            false,
            format!(
                "{} cannot be read: `zmem run --adaptive` has no pressure signal",
                p.psi.display()
            ),
            "use a kernel with CONFIG_PSI=y, booted with psi=1 if it is off by default",
        ),
    });

    let controllers = std::fs::read_to_string(p.cgroup.join("cgroup.controllers"));
    out.push(match controllers {
        Ok(c) if c.split_whitespace().any(|w| w == "memory") => ok(
            "cgroup memory",
            false,
            format!("cgroup v2 at {}", p.cgroup.display()),
        ),
        _ if p.cgroup.join("memory").is_dir() => ok(
            "cgroup memory",
            false,
            format!("cgroup v1 at {}", p.cgroup.join("memory").display()),
        ),
        _ => bad(
            "cgroup memory",
            false,
            "no memory controller: the benchmarks cannot limit the kernel side's memory".into(),
            "mount cgroup v2 with the memory controller (systemd does; or boot with \
             cgroup_enable=memory), and run the benchmarks as root",
        ),
    });

    out.push(match p.zram.iter().find(|z| z.exists()) {
        Some(z) => ok(
            "zram",
            false,
            format!("{} (for the side-by-side benchmarks)", z.display()),
        ),
        None => bad(
            "zram",
            false,
            "no zram module: the benchmarks cannot compare with the kernel's zram".into(),
            "`modprobe zram` as root (Debian: linux-modules-extra on some kernels)",
        ),
    });

    out.push(match (p.io_uring)() {
        Ok(()) => ok(
            "io_uring",
            false,
            "available (the SSD tier writes and reads through it)".into(),
        ),
        Err(e) => bad(
            "io_uring",
            false,
            format!("io_uring_setup failed: {e}; the SSD tier (`zmem run --ssd`) uses pread/pwrite instead"),
            "`sysctl kernel.io_uring_disabled=0` (or 1 and add the user to kernel.io_uring_group)",
        ),
    });

    out.push(match (p.gpu)() {
        Ok(desc) => ok(
            "gpu",
            false,
            format!("{desc}: the accelerator backend (`zmem bench codecs --backend gpu`)"),
        ),
        Err(why) => bad(
            "gpu",
            false,
            format!("no accelerator, the CPU compresses: {why}"),
            "optional: an NVIDIA GPU with its driver, and nvCOMP 6 (`pip install nvidia-libnvcomp-cu13`, or ZMEM_NVCOMP_LIB)",
        ),
    });

    out.push(match meminfo(&p.meminfo) {
        Some((total, avail)) => ok(
            "memory",
            false,
            format!("{} total, {} available", human(total), human(avail)),
        ),
        None => bad(
            "memory",
            false,
            format!("cannot read {}", p.meminfo.display()),
            "mount /proc",
        ),
    });
    out
}

/// MemTotal and MemAvailable.
fn meminfo(path: &Path) -> Option<(u64, u64)> {
    let t = std::fs::read_to_string(path).ok()?;
    let field = |name: &str| -> Option<u64> {
        let l = t.lines().find(|l| l.starts_with(name))?;
        Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// The exit status of a set of checks: 1 if anything `zmem run` needs is missing.
pub fn exit_status(checks: &[Check]) -> i32 {
    i32::from(checks.iter().any(|c| c.status == Status::Fail))
}

/// The aligned table, with each fix on a line of its own under its item.
pub fn render(checks: &[Check]) -> String {
    let w = checks.iter().map(|c| c.item.len()).max().unwrap_or(4);
    let mut out = format!("{:<6} {:<w$}  DETAIL\n", "STATUS", "ITEM");
    for c in checks {
        let s = match c.status {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        out += &format!("{s:<6} {:<w$}  {}\n", c.item, c.detail);
        if !c.fix.is_empty() {
            out += &format!("{:<6} {:<w$}  fix: {}\n", "", "", c.fix);
        }
    }
    let fails = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warns = checks.iter().filter(|c| c.status == Status::Warn).count();
    out += &if fails > 0 {
        format!("zmem run cannot work here: {fails} item(s) FAIL (fix them as said above)\n")
    } else if warns > 0 {
        format!(
            "zmem run works here; {warns} warning(s) concern the benchmarks or later features\n"
        )
    } else {
        "everything zmem needs is here\n".to_string()
    };
    out
}

/// `zmem doctor`: prints the checks; returns the exit status.
pub fn run(a: &DoctorArgs) -> anyhow::Result<i32> {
    let c = checks(&Probes::machine());
    if a.json {
        let doc = serde_json::json!({ "ok": exit_status(&c) == 0, "checks": c });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", render(&c));
    }
    Ok(exit_status(&c))
}

/// Opens a full-mode userfaultfd as the region does (the device, then the syscall) and asks
/// the kernel which features it offers.
pub fn probe_userfaultfd() -> UffdProbe {
    use zmem_region::userfaultfd::{probe, OpenError};
    match probe() {
        Ok(p) => UffdProbe::Features {
            features: p.features,
            via: p.via.describe(),
        },
        Err(OpenError::Permission(e)) => UffdProbe::Permission(e),
        Err(OpenError::Absent(e)) => UffdProbe::Unavailable(e),
        Err(OpenError::Unsupported(_, why)) => UffdProbe::Unavailable(io::Error::other(why)),
    }
}

/// Sets up (and closes) a small io_uring.
pub fn probe_io_uring() -> io::Result<()> {
    let mut params = [0u8; 120]; // struct io_uring_params
                                 // SAFETY: io_uring_setup(entries, params) writes at most sizeof(io_uring_params) = 120 bytes.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 2u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = 0x1ffff;

    /// A machine with everything, in a temporary directory.
    fn healthy(dir: &Path) -> Probes {
        std::fs::write(dir.join("osrelease"), "6.18.4-amd64\n").unwrap();
        std::fs::write(
            dir.join("psi"),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("cgroup")).unwrap();
        std::fs::write(
            dir.join("cgroup/cgroup.controllers"),
            "cpu io memory pids\n",
        )
        .unwrap();
        std::fs::write(dir.join("zram0"), "").unwrap();
        std::fs::write(
            dir.join("meminfo"),
            "MemTotal:       8000000 kB\nMemFree: 1 kB\nMemAvailable:   4000000 kB\n",
        )
        .unwrap();
        Probes {
            osrelease: dir.join("osrelease"),
            userfaultfd: || UffdProbe::Features {
                features: ALL,
                via: "/dev/userfaultfd",
            },
            psi: dir.join("psi"),
            cgroup: dir.join("cgroup"),
            zram: [dir.join("zram-control"), dir.join("zram0")],
            io_uring: || Ok(()),
            preload: || Ok("/usr/lib/zmem/libzmem_preload.so".into()),
            meminfo: dir.join("meminfo"),
            sys_admin: || true,
            gpu: || Ok("NVIDIA H200 (device 0), nvCOMP 6.0.0".into()),
        }
    }

    fn find<'a>(c: &'a [Check], item: &str) -> &'a Check {
        c.iter().find(|c| c.item == item).expect(item)
    }

    #[test]
    fn a_healthy_machine_passes() {
        let t = tempfile::tempdir().unwrap();
        let c = checks(&healthy(t.path()));
        assert!(c.iter().all(|c| c.status == Status::Ok), "{}", render(&c));
        assert_eq!(exit_status(&c), 0);
        let text = render(&c);
        assert!(text.contains("everything zmem needs is here"), "{text}");
        assert!(find(&c, "memory").detail.contains("7.6G total"), "{text}");
    }

    #[test]
    fn a_machine_without_a_gpu_warns_and_says_what_is_missing() {
        let t = tempfile::tempdir().unwrap();
        let mut p = healthy(t.path());
        p.gpu = || Err("the NVIDIA driver's CUDA library not found (tried libcuda.so.1)".into());
        let c = checks(&p);
        let g = find(&c, "gpu");
        assert_eq!(g.status, Status::Warn);
        assert!(g.detail.contains("libcuda.so.1"), "{}", g.detail);
        assert!(g.fix.contains("nvidia-libnvcomp-cu13"), "{}", g.fix);
        assert_eq!(exit_status(&c), 0, "optional");
    }

    #[test]
    fn without_cap_sys_admin_the_fault_route_is_the_handler_and_a_warning() {
        let t = tempfile::tempdir().unwrap();
        let mut p = healthy(t.path());
        assert!(find(&checks(&p), "fault route")
            .detail
            .starts_with("signal"));
        p.sys_admin = || false;
        let c = checks(&p);
        let r = find(&c, "fault route");
        assert_eq!(r.status, Status::Warn);
        assert!(r.detail.starts_with("handler"), "{}", r.detail);
        assert!(r.fix.contains("CAP_SYS_ADMIN"), "{}", r.fix);
        assert_eq!(exit_status(&c), 0);
    }

    #[test]
    fn an_old_kernel_fails() {
        let t = tempfile::tempdir().unwrap();
        let p = healthy(t.path());
        std::fs::write(&p.osrelease, "6.1.0-28-amd64\n").unwrap();
        let c = checks(&p);
        let k = find(&c, "kernel");
        assert_eq!(k.status, Status::Fail);
        assert!(k.detail.contains("older than 6.8"), "{}", k.detail);
        assert!(k.fix.contains("6.8 or later"), "{}", k.fix);
        assert_eq!(exit_status(&c), 1);
    }

    #[test]
    fn userfaultfd_permission_fails_with_the_ways_to_fix_it() {
        let t = tempfile::tempdir().unwrap();
        let mut p = healthy(t.path());
        p.userfaultfd = || UffdProbe::Permission(io::Error::from_raw_os_error(libc::EACCES));
        let c = checks(&p);
        let u = find(&c, "userfaultfd");
        assert_eq!(u.status, Status::Fail);
        for needle in [
            "KERNEL==\"userfaultfd\", GROUP=\"zmem\", MODE=\"0660\"",
            "usermod -aG zmem",
            "vm.unprivileged_userfaultfd=1",
            "CAP_SYS_PTRACE",
        ] {
            assert!(u.fix.contains(needle), "{needle}: {}", u.fix);
        }
        assert_eq!(find(&c, "userfaultfd features").status, Status::Fail);
        assert_eq!(exit_status(&c), 1);
        assert!(render(&c).contains("zmem run cannot work here"));
    }

    #[test]
    fn missing_features_are_named() {
        let t = tempfile::tempdir().unwrap();
        let mut p = healthy(t.path());
        p.userfaultfd = || UffdProbe::Features {
            features: ALL & !(1 << 16) & !(1 << 14),
            via: "/dev/userfaultfd",
        };
        let c = checks(&p);
        let f = find(&c, "userfaultfd features");
        assert_eq!(f.status, Status::Fail);
        assert!(f.detail.contains("lacks MOVE, POISON"), "{}", f.detail);
        assert_eq!(exit_status(&c), 1);
    }

    #[test]
    fn a_missing_preload_library_fails() {
        let t = tempfile::tempdir().unwrap();
        let mut p = healthy(t.path());
        p.preload = || Err("cannot find libzmem_preload.so".into());
        let c = checks(&p);
        let l = find(&c, "preload library");
        assert_eq!(l.status, Status::Fail);
        assert!(
            l.fix.contains("cargo build --release --workspace"),
            "{}",
            l.fix
        );
        assert_eq!(exit_status(&c), 1);
    }

    #[test]
    fn benchmark_items_only_warn() {
        let t = tempfile::tempdir().unwrap();
        let mut p = healthy(t.path());
        p.psi = t.path().join("no-psi");
        p.cgroup = t.path().join("no-cgroup");
        p.zram = [t.path().join("a"), t.path().join("b")];
        p.io_uring = || Err(io::Error::from_raw_os_error(libc::EPERM));
        let c = checks(&p);
        for item in ["PSI", "cgroup memory", "zram", "io_uring"] {
            let x = find(&c, item);
            assert_eq!(x.status, Status::Warn, "{item}");
            assert!(!x.fix.is_empty(), "{item}");
        }
        assert!(find(&c, "zram").fix.contains("modprobe zram"));
        assert_eq!(exit_status(&c), 0);
        assert!(render(&c).contains("4 warning(s)"), "{}", render(&c));
    }

    #[test]
    fn cgroup_v1_counts() {
        let t = tempfile::tempdir().unwrap();
        let mut p = healthy(t.path());
        p.cgroup = t.path().join("v1");
        std::fs::create_dir_all(p.cgroup.join("memory")).unwrap();
        let c = checks(&p);
        assert_eq!(find(&c, "cgroup memory").status, Status::Ok);
        assert!(find(&c, "cgroup memory").detail.contains("v1"));
    }

    #[test]
    fn releases_parse() {
        assert_eq!(parse_release("6.18.44-fc-v669\n"), Some((6, 18)));
        assert_eq!(parse_release("6.8-rc1"), Some((6, 8)));
        assert_eq!(parse_release("garbage"), None);
        assert!(parse_release("6.7.12").unwrap() < MIN_KERNEL);
    }
}
