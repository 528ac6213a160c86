//! The memory hog of `bench adaptive`: another process that takes memory away and gives it back.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use zmem_os::{Mapping, MappingFlags};
use zmem_region::budget::read_mem_available;

use super::{parse_duration, HogState, HOG_FLOOR};
use crate::target::PAGE;
use zmem_runenv::size::{format_size_mg, parse_size};

/// `zmem bench hog`: the memory hog of `bench adaptive` (internal).
#[derive(Debug, Clone, Args)]
pub struct HogArgs {
    /// Bytes to allocate and touch.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// When to free them and exit, from the start (touching stops there if not done).
    #[arg(long, value_parser = parse_duration)]
    pub hold: Duration,
    /// Exit at once unless this is the parent's PID; the hog also dies with its parent.
    #[arg(long)]
    pub parent: Option<u32>,
}

/// Shared between the sampling loop and the hog's stdout reader.
#[derive(Default, Debug)]
pub(super) struct HogEvents {
    pub(super) ready: Option<f64>,
    pub(super) exit: Option<f64>,
    pub(super) touched: Option<u64>,
    pub(super) note: Option<String>,
}

/// The hog process; killed (by its PID, SIGKILL) and reaped on drop if still running.
pub(super) struct HogGuard {
    child: Option<Child>,
    events: Arc<Mutex<HogEvents>>,
    pub(super) start: f64,
}

impl HogGuard {
    pub(super) fn spawn(take: u64, hold: Duration, t0: Instant) -> anyhow::Result<HogGuard> {
        let exe = crate::process::self_exe()?;
        let mut child = Command::new(exe)
            .args([
                "bench",
                "hog",
                "--size",
                &take.to_string(),
                "--hold",
                &format!("{}ms", hold.as_millis()),
                "--parent",
                &std::process::id().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the memory hog")?;
        let start = t0.elapsed().as_secs_f64();
        let events = Arc::new(Mutex::new(HogEvents::default()));
        let stdout = child.stdout.take().expect("piped stdout");
        let ev = events.clone();
        std::thread::Builder::new()
            .name("zmem-hog-reader".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let now = t0.elapsed().as_secs_f64();
                    let mut e = ev.lock().unwrap_or_else(|p| p.into_inner());
                    let mut words = line.split_whitespace();
                    match words.next() {
                        Some("touched") => {
                            e.ready = Some(now);
                            e.touched = words.next().and_then(|w| w.parse().ok());
                        }
                        Some("freed") => e.exit = Some(now),
                        _ => e.note = Some(line.clone()),
                    }
                }
            })
            .context("starting the hog's reader thread")?;
        Ok(HogGuard {
            child: Some(child),
            events,
            start,
        })
    }

    pub(super) fn events(&self) -> std::sync::MutexGuard<'_, HogEvents> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reaps the hog if it has exited; an exit before it freed its memory is an error.
    pub(super) fn poll(&mut self) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if let Some(status) = child.try_wait().context("waiting for the hog")? {
            self.child = None;
            // The reader may see "freed" a moment after the exit: give it that moment.
            for _ in 0..50 {
                if self.events().exit.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let e = self.events();
            if !status.success() || e.exit.is_none() {
                bail!(
                    "the memory hog failed ({status}){}",
                    e.note
                        .as_deref()
                        .map(|n| format!(": {n}"))
                        .unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    pub(super) fn state(&self) -> HogState {
        let e = self.events();
        if e.exit.is_some() {
            HogState::Gone
        } else if e.ready.is_some() {
            HogState::Holding
        } else {
            HogState::Allocating
        }
    }
}

impl Drop for HogGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::process::kill_and_reap(&mut child);
        }
    }
}

/// `zmem bench hog`: allocate and touch `size` bytes, hold them until `hold` after the start,
/// free them, exit. Prints
/// `touched BYTES SECONDS` once all is touched and `freed` after unmapping.
pub fn hog_main(a: &HogArgs) -> anyhow::Result<()> {
    if let Some(parent) = a.parent {
        // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number has no memory effects.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        // SAFETY: getppid cannot fail.
        if unsafe { libc::getppid() } as u32 != parent {
            bail!("hog: parent {parent} is gone");
        }
    }
    let len = usize::try_from(a.size)
        .ok()
        .filter(|&l| l > 0)
        .context("hog: bad size")?;
    let t = Instant::now();
    let deadline = t + a.hold;
    let map = Mapping::new(len, MappingFlags::default())
        .with_context(|| format!("hog: mmap {len} bytes"))?;
    let base = map.addr();
    let mut touched = 0usize;
    const STEP: usize = 64 << 20;
    while touched < len && Instant::now() < deadline {
        if read_mem_available().unwrap_or(u64::MAX) < HOG_FLOOR {
            eprintln!(
                "zmem bench hog: MemAvailable below {}: holding {} instead of {}",
                format_size_mg(HOG_FLOOR),
                format_size_mg(touched as u64),
                format_size_mg(len as u64)
            );
            break;
        }
        let end = (touched + STEP).min(len);
        let mut off = touched;
        while off < end {
            // SAFETY: inside our own mapping.
            unsafe { std::ptr::write_volatile((base + off) as *mut u8, 1) };
            off += PAGE;
        }
        touched = end;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "touched {touched} {:.3}", t.elapsed().as_secs_f64())?;
    out.flush()?;
    if let Some(d) = deadline.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
    drop(map);
    writeln!(out, "freed")?;
    out.flush()?;
    Ok(())
}
