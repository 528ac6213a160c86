//! Copies a live process's anonymous memory into a file of pages: the private, writable,
//! anonymous mappings of /proc/PID/maps (heap, allocator arenas, a VM's managed heap), only
//! their pages that are present or swapped (/proc/PID/pagemap), read through /proc/PID/mem
//! while the process is stopped. Pages that are all zeros are counted and left out: zram and
//! zmem both keep them as a flag, so they would only inflate every ratio alike.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::target::PAGE;

/// One line of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// "rw-p" and the like.
    pub perms: String,
    pub inode: u64,
    /// The path or pseudo-name ("[heap]", "[stack]", "[anon:...]"); empty for plain anonymous.
    pub name: String,
}

impl Mapping {
    /// Private, writable and backed by no file: the memory the kernel would swap and zmem
    /// tiers. Stacks and the kernel's own pages ([vvar], [vdso], [vsyscall]) are left out.
    pub fn is_private_anonymous(&self) -> bool {
        let p = self.perms.as_bytes();
        let private_writable = p.len() == 4 && p[1] == b'w' && p[3] == b'p';
        let anonymous = self.inode == 0
            && (self.name.is_empty() || self.name == "[heap]" || self.name.starts_with("[anon:"));
        private_writable && anonymous
    }

    pub fn pages(&self) -> u64 {
        (self.end - self.start) / PAGE as u64
    }
}

/// Parses /proc/PID/maps; a line that does not parse is an error naming it.
pub fn parse_maps(text: &str) -> anyhow::Result<Vec<Mapping>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| parse_line(line).with_context(|| format!("unexpected maps line {line:?}")))
        .collect()
}

fn parse_line(line: &str) -> anyhow::Result<Mapping> {
    // start-end perms offset dev inode [name, which may hold spaces]
    let mut rest = line;
    let mut field = || -> anyhow::Result<&str> {
        let t = rest.trim_start();
        let end = t.find(' ').unwrap_or(t.len());
        anyhow::ensure!(end > 0, "too few fields");
        let (f, r) = t.split_at(end);
        rest = r;
        Ok(f)
    };
    let range = field()?;
    let perms = field()?.to_string();
    let _offset = field()?;
    let _dev = field()?;
    let inode: u64 = field()?.parse().context("inode")?;
    let name = rest.trim().to_string();
    let (a, b) = range.split_once('-').context("address range")?;
    let start = u64::from_str_radix(a, 16).context("start address")?;
    let end = u64::from_str_radix(b, 16).context("end address")?;
    anyhow::ensure!(start < end && start % PAGE as u64 == 0, "bad address range");
    Ok(Mapping {
        start,
        end,
        perms,
        inode,
        name,
    })
}

/// What [`capture`] found.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CaptureStats {
    /// Private anonymous writable mappings, and the pages they span.
    pub mappings: u64,
    pub mapped_pages: u64,
    /// Pages present in DRAM or swapped out.
    pub present_pages: u64,
    /// Present pages that were all zeros (not written).
    pub zero_pages: u64,
    /// Pages written to the file.
    pub kept_pages: u64,
    /// Present pages /proc/PID/mem would not read (skipped).
    pub unreadable_pages: u64,
}

/// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;

/// Stops `pid` for the copy (SIGSTOP) and lets it go again on drop (SIGCONT), error or not.
struct Stopped(libc::pid_t);

impl Stopped {
    fn new(pid: libc::pid_t) -> anyhow::Result<Stopped> {
        // SAFETY: kill has no memory effects; pid is a child the caller started and holds.
        if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
            return Err(std::io::Error::last_os_error()).context(format!("stopping pid {pid}"));
        }
        // Wait until it is really stopped (state T in /proc/PID/stat) before reading.
        for _ in 0..500 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            if matches!(state, Some("T") | Some("t")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Ok(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as in new().
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Copies the anonymous pages of `pid` into `out` (created or truncated), `out` written
/// whole or not at all (a temporary file renamed at the end).
pub fn capture(pid: u32, out: &Path) -> anyhow::Result<CaptureStats> {
    let pid_t = pid as libc::pid_t;
    let proc = format!("/proc/{pid}");
    let maps = std::fs::read_to_string(format!("{proc}/maps"))
        .with_context(|| format!("reading {proc}/maps"))?;
    let open = |what: &str| {
        File::open(format!("{proc}/{what}")).with_context(|| {
            format!(
                "opening {proc}/{what} (reading another process's memory needs the same user \
                 and ptrace permission: run as its parent or as root)"
            )
        })
    };
    let pagemap = open("pagemap")?;
    let mem = open("mem")?;
    let tmp = out.with_extension("partial");
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);

    let mut stats = CaptureStats::default();
    {
        let _stopped = Stopped::new(pid_t)?;
        // The maps read before the stop may have changed: read them again, stopped.
        let maps = std::fs::read_to_string(format!("{proc}/maps")).unwrap_or(maps);
        let mut entries = Vec::new();
        let mut page = vec![0u8; PAGE];
        for m in parse_maps(&maps)?
            .iter()
            .filter(|m| m.is_private_anonymous())
        {
            stats.mappings += 1;
            stats.mapped_pages += m.pages();
            entries.resize(m.pages() as usize * 8, 0);
            let first = m.start / PAGE as u64;
            if pagemap.read_exact_at(&mut entries, first * 8).is_err() {
                // A mapping that went away (the process was between two calls): skip it.
                continue;
            }
            for (i, e) in entries.chunks_exact(8).enumerate() {
                let e = u64::from_le_bytes(e.try_into().expect("8-byte chunk"));
                if e & (PM_PRESENT | PM_SWAPPED) == 0 {
                    continue;
                }
                stats.present_pages += 1;
                let addr = m.start + (i * PAGE) as u64;
                if mem.read_exact_at(&mut page, addr).is_err() {
                    stats.unreadable_pages += 1;
                    continue;
                }
                if page.iter().all(|&b| b == 0) {
                    stats.zero_pages += 1;
                    continue;
                }
                w.write_all(&page)
                    .with_context(|| format!("writing {}", tmp.display()))?;
                stats.kept_pages += 1;
            }
        }
    }
    w.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse_with_names_that_hold_spaces() {
        let text = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f1c00000000-7f1c00021000 rw-p 00000000 00:00 0 \n\
7f1c04000000-7f1c04100000 r--p 00000000 08:01 1234                       /usr/lib/locale/C.utf8/LC_CTYPE
7f1c05000000-7f1c05001000 rw-p 00002000 08:01 99                         /tmp/a file (deleted)
7ffd0000-7ffd1000 rw-p 00000000 00:00 0                                  [stack]
7f1c06000000-7f1c06002000 rw-p 00000000 00:00 0                          [anon:v8 heap]
7f1c07000000-7f1c07001000 rw-s 00000000 00:01 5                          /dev/zero (deleted)
";
        let maps = parse_maps(text).unwrap();
        assert_eq!(maps.len(), 7);
        assert_eq!(maps[0].name, "[heap]");
        assert_eq!(maps[0].pages(), 0x21);
        assert_eq!(maps[3].name, "/tmp/a file (deleted)");
        assert_eq!(maps[5].name, "[anon:v8 heap]");
        let kept: Vec<bool> = maps.iter().map(Mapping::is_private_anonymous).collect();
        assert_eq!(kept, [true, true, false, false, false, true, false]);
    }

    #[test]
    fn a_malformed_maps_line_is_an_error_that_names_it() {
        let err = parse_maps("not a maps line\n").unwrap_err();
        assert!(format!("{err:#}").contains("not a maps line"), "{err:#}");
        let err = parse_maps("1000-0800 rw-p 0 00:00 0\n").unwrap_err();
        assert!(format!("{err:#}").contains("bad address range"), "{err:#}");
    }

    #[test]
    fn a_child_process_heap_is_captured_with_its_contents() {
        // A child that fills 4 MiB of its heap with a pattern we know, then waits on stdin.
        let Ok(mut child) = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys\nb = bytearray(b'zmem-heap-probe!' * (1 << 18))\n\
                 print('ready', flush=True)\nsys.stdin.read()",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("python3 is not installed: the capture of a child process was not tested");
            return;
        };
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("heap.pages");
        let stats = capture(child.id(), &out);
        drop(child.stdin.take());
        let _ = child.kill();
        let _ = child.wait();
        let stats = stats.unwrap();
        let data = std::fs::read(&out).unwrap();
        assert_eq!(data.len() as u64, stats.kept_pages * PAGE as u64);
        assert!(!out.with_extension("partial").exists());
        // Every page of the pattern is there (1024 full pages, wherever the buffer starts).
        let probe = b"zmem-heap-probe!".repeat(PAGE / 16);
        let full = data.chunks_exact(PAGE).filter(|p| *p == &probe[..]).count();
        assert!(
            full >= 1023,
            "{full} pattern pages of 1024 captured: {stats:?}"
        );
        assert!(stats.present_pages >= stats.kept_pages + stats.zero_pages);
        assert!(stats.mapped_pages >= stats.present_pages);
    }

    #[test]
    fn a_process_that_does_not_exist_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = capture(u32::MAX / 2, &dir.path().join("x")).unwrap_err();
        assert!(format!("{err:#}").contains("/maps"), "{err:#}");
    }
}
