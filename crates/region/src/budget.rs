//! Adaptive budget: how many bytes of a region may stay resident in DRAM, decided at run time.
//!
//! A fixed budget is either too small (the region pays CPU to compress and refault pages that
//! DRAM could have kept) or too large (it takes memory the rest of the machine needs). CompCache's
//! adaptive variant sized the compressed cache at run time; Meta's senpai uses PSI to find the
//! least memory a workload can have without stalling. The [`Controller`] does both from one
//! [`BudgetSample`] per control interval. It is pure (no I/O, no clock: time is the `dt` given),
//! so it is deterministic and tested below against a simulated machine; [`read_machine`] reads
//! the real inputs.
//!
//! # Control law
//!
//! Per step, with `B` the budget, `R` resident bytes, `A` MemAvailable, `r` refaults/s,
//! `t = min(dt, 2·interval)` in seconds (bounds a step after a late wake-up):
//!
//! ```text
//! p = Δ(PSI some total µs) / dt_µs  stall fraction over exactly this interval (avg10/100 on
//!                                   the first step, or when the caller leaves `total` at 0)
//! e = min(B, R)                     the budget in use (shrinking above it frees nothing)
//! C = R + A − reserve               bytes the region could hold; the region's own faults move
//!                                   R and A oppositely, so C moves when others take/free memory
//! first rule that applies:
//! 1 ShrinkMemAvailable  A < reserve, D = reserve − A:
//!                       B ← max(e − D − band/2, e·(1 − max_shrink))
//! 2 CapMemAvailable     B > C + band:  B ← C   (budget nothing could back; evicts nothing)
//! 3 ShrinkPressure      p > psi_threshold:
//!                       B ← e·(1 − min(t·shrink_step·min(p/psi_threshold, 3), max_shrink))
//! 4 Grow                r > refault_grow, p ≤ psi_calm, R ≥ grow_fill·B,
//!                       no shrink (rule 1 or 3) in the last grow_cooldown:
//!                       B ← min(B + t·max(grow_step·B, grow_min), C − band)
//! 5 Hold*               otherwise B unchanged (the Hold variants say why it did not grow)
//! finally B ← clamp(B, min, max)   (so a shrink reason can come with an unchanged B at min)
//! ```
//!
//! Shrinking is multiplicative: rule 1 gives back the whole deficit plus half the band at once,
//! at most `max_shrink` of the budget in use per step. Growth is multiplicative with an additive
//! floor, and only while the region is pressed against its budget (`grow_fill`) and refaulting.
//! Hysteresis against oscillation: a deficit starts at `A < reserve` but growth stops at
//! `A = reserve + band`; the cap applies above `C + band` but growth stops at `C − band`;
//! pressure shrinks above `psi_threshold` but growth needs `p ≤ psi_calm`; no growth for
//! `grow_cooldown` after a shrink; and nothing shrinks because refaults are low (no probing), so
//! steady inputs give a constant budget. The budget starts at `max`; the first step caps it to
//! what MemAvailable allows (rule 2). An evicted page still costs its compressed size, so
//! shrinking by `D` frees less than `D`: the extra `band/2` covers that (at ratio ≥ 2, for
//! deficits up to `band/2`), else rule 1 fires again next step with the smaller deficit left.

use std::fmt;
use std::io;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Path of the kernel's memory pressure (PSI) file.
pub const PSI_MEMORY: &str = "/proc/pressure/memory";
/// Path of the kernel's memory statistics.
pub const MEMINFO: &str = "/proc/meminfo";

/// Bounds and tuning of an adaptive budget. [`AdaptiveConfig::new`] documents the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveConfig {
    /// Bytes; the budget never goes below.
    pub min: u64,
    /// Bytes; the budget never goes above. It is also the starting point.
    pub max: u64,
    /// Control period (default 1 s).
    pub interval: Duration,
    /// MemAvailable to keep free for the rest of the machine (default 512 MiB).
    pub reserve: u64,
    /// Hysteresis around MemAvailable limits, bytes (default 128 MiB).
    pub band: u64,
    /// PSI "some" stall fraction above which the budget shrinks (default 0.001 = 0.1% =
    /// 1000 µs of stall per second).
    pub psi_threshold: f64,
    /// Stall fraction at or below which the budget may grow (default 0.0005).
    pub psi_calm: f64,
    /// Fraction of the budget in use shed per second at `psi_threshold` (default 0.05); scales
    /// with the pressure up to 3× the threshold.
    pub shrink_step: f64,
    /// Largest fraction of the budget in use that one step can shed (default 0.5).
    pub max_shrink: f64,
    /// Refaults per second above which the region grows (default 500: at ~10–20 µs per fault and
    /// decompression that is about 1% of a core).
    pub refault_grow: f64,
    /// Growth per second as a fraction of the budget (default 0.1).
    pub grow_step: f64,
    /// Growth per second at least, bytes (default 16 MiB).
    pub grow_min: u64,
    /// The region grows only if resident ≥ `grow_fill` × budget (default 0.9): refaults into
    /// unused budget are pages coming back, not a working set that does not fit.
    pub grow_fill: f64,
    /// No growth for this long after any shrink (default 5 s).
    pub grow_cooldown: Duration,
}

impl AdaptiveConfig {
    /// Bounds `min..=max` bytes and the defaults documented on each field.
    pub fn new(min: u64, max: u64) -> AdaptiveConfig {
        AdaptiveConfig {
            min,
            max,
            interval: Duration::from_secs(1),
            reserve: 512 * MIB,
            band: 128 * MIB,
            psi_threshold: 0.001,
            psi_calm: 0.0005,
            shrink_step: 0.05,
            max_shrink: 0.5,
            refault_grow: 500.0,
            grow_step: 0.1,
            grow_min: 16 * MIB,
            grow_fill: 0.9,
            grow_cooldown: Duration::from_secs(5),
        }
    }

    /// Checks the bounds and knobs; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if self.max == 0 {
            return Err("adaptive budget: max must be > 0".into());
        }
        if self.min > self.max {
            return Err(format!(
                "adaptive budget: min ({}) > max ({})",
                self.min, self.max
            ));
        }
        if self.interval.is_zero() {
            return Err("adaptive budget: interval must be > 0".into());
        }
        let unit = |name: &str, v: f64, lo_open: bool| -> Result<(), String> {
            let ok = v.is_finite() && v <= 1.0 && if lo_open { v > 0.0 } else { v >= 0.0 };
            if ok {
                Ok(())
            } else {
                let lo = if lo_open { "(0" } else { "[0" };
                Err(format!("adaptive budget: {name} ({v}) must be in {lo}, 1]"))
            }
        };
        unit("psi_threshold", self.psi_threshold, true)?;
        unit("psi_calm", self.psi_calm, false)?;
        if self.psi_calm > self.psi_threshold {
            return Err(format!(
                "adaptive budget: psi_calm ({}) > psi_threshold ({})",
                self.psi_calm, self.psi_threshold
            ));
        }
        unit("shrink_step", self.shrink_step, true)?;
        unit("max_shrink", self.max_shrink, true)?;
        unit("grow_fill", self.grow_fill, false)?;
        if !(self.grow_step.is_finite() && self.grow_step >= 0.0) {
            return Err(format!(
                "adaptive budget: grow_step ({}) must be >= 0",
                self.grow_step
            ));
        }
        if !(self.refault_grow.is_finite() && self.refault_grow >= 0.0) {
            return Err(format!(
                "adaptive budget: refault_grow ({}) must be >= 0",
                self.refault_grow
            ));
        }
        Ok(())
    }
}

/// One reading of the machine and the region, taken every control interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BudgetSample {
    /// `some avg10` of /proc/pressure/memory, in percent.
    pub psi_some_avg10: f64,
    /// `some total=` of /proc/pressure/memory, microseconds (cumulative).
    pub psi_some_total_us: u64,
    /// MemAvailable, bytes.
    pub mem_available: u64,
    /// The region's demand faults on pages it had evicted, per second over the last interval.
    pub refaults_per_sec: f64,
    /// All the region's faults per second (informational).
    pub faults_per_sec: f64,
    /// Bytes of the region resident now.
    pub resident: u64,
}

/// Why the budget moved (or did not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// MemAvailable fell below the reserve: the region gives back the deficit.
    ShrinkMemAvailable,
    /// The budget exceeded what MemAvailable could back; lowered without evicting anything.
    CapMemAvailable,
    /// PSI memory pressure above the threshold.
    ShrinkPressure,
    /// Refaults high, memory plentiful.
    Grow,
    /// Nothing to do.
    Hold,
    /// Refaults high, but a shrink happened less than `grow_cooldown` ago.
    HoldCooldown,
    /// Refaults high, but the budget is at `max` or at what MemAvailable allows.
    HoldNoRoom,
    /// Refaults high, but pressure is between `psi_calm` and `psi_threshold`.
    HoldPressure,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::ShrinkMemAvailable => "shrink: MemAvailable below reserve",
            Reason::CapMemAvailable => "cap: budget above what MemAvailable allows",
            Reason::ShrinkPressure => "shrink: memory pressure (PSI)",
            Reason::Grow => "grow: refaults high, memory plentiful",
            Reason::Hold => "hold",
            Reason::HoldCooldown => "hold: refaults high, cooling down after a shrink",
            Reason::HoldNoRoom => "hold: refaults high, no room to grow",
            Reason::HoldPressure => "hold: refaults high, some memory pressure",
        })
    }
}

/// Result of one control step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// The new budget in bytes, within `[min, max]`.
    pub budget: u64,
    pub reason: Reason,
    /// Stall fraction (PSI some) the step saw over the interval, 0..=1.
    pub pressure: f64,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget {} MiB ({}; psi {:.3}%)",
            self.budget / MIB,
            self.reason,
            self.pressure * 100.0
        )
    }
}

/// The adaptive budget's controller: feed it a sample every interval, apply the budget it returns.
#[derive(Clone, Debug)]
pub struct Controller {
    cfg: AdaptiveConfig,
    budget: u64,
    prev_total_us: Option<u64>,
    /// Time since the last shrink; `None` = never shrunk.
    since_shrink: Option<Duration>,
}

impl Controller {
    /// Starts at `max`; the first step caps it to what MemAvailable allows. Call `step` once
    /// right after creating the region so the cap applies before it fills.
    pub fn new(cfg: AdaptiveConfig) -> Controller {
        let budget = cfg.max.max(cfg.min);
        Controller {
            cfg,
            budget,
            prev_total_us: None,
            since_shrink: None,
        }
    }

    /// The current budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn config(&self) -> &AdaptiveConfig {
        &self.cfg
    }

    /// One control step over the `dt` since the previous sample (pure: no I/O, no clock).
    pub fn step(&mut self, s: &BudgetSample, dt: Duration) -> Decision {
        if dt.is_zero() {
            return Decision {
                budget: self.budget,
                reason: Reason::Hold,
                pressure: 0.0,
            };
        }
        let pressure = self.pressure(s, dt);
        let cfg = &self.cfg;
        let t = dt.min(cfg.interval * 2).as_secs_f64();
        let refaults = if s.refaults_per_sec.is_finite() {
            s.refaults_per_sec
        } else {
            0.0
        };
        let b = self.budget;
        let r = s.resident;
        let a = s.mem_available;
        let used = b.min(r);
        let room = r.saturating_add(a).saturating_sub(cfg.reserve);
        let since_shrink = self.since_shrink.map(|d| d.saturating_add(dt));

        let (new, reason) = if a < cfg.reserve {
            let deficit = cfg.reserve - a;
            let floor = scale(used, 1.0 - cfg.max_shrink);
            let target = used.saturating_sub(deficit.saturating_add(cfg.band / 2));
            (target.max(floor), Reason::ShrinkMemAvailable)
        } else if b > room.saturating_add(cfg.band) {
            (room, Reason::CapMemAvailable)
        } else if pressure > cfg.psi_threshold {
            let over = (pressure / cfg.psi_threshold).min(3.0);
            let frac = (t * cfg.shrink_step * over).min(cfg.max_shrink);
            (scale(used, 1.0 - frac), Reason::ShrinkPressure)
        } else if refaults > cfg.refault_grow {
            let cap = room.saturating_sub(cfg.band).min(cfg.max);
            if pressure > cfg.psi_calm {
                (b, Reason::HoldPressure)
            } else if since_shrink.is_some_and(|d| d < cfg.grow_cooldown) {
                (b, Reason::HoldCooldown)
            } else if (r as f64) < cfg.grow_fill * b as f64 {
                (b, Reason::Hold)
            } else if cap <= b {
                (b, Reason::HoldNoRoom)
            } else {
                let step = (cfg.grow_step * b as f64).max(cfg.grow_min as f64) * t;
                let grown = b.saturating_add(step.min(u64::MAX as f64) as u64);
                (grown.min(cap), Reason::Grow)
            }
        } else {
            (b, Reason::Hold)
        };

        let new = new.clamp(cfg.min, cfg.max.max(cfg.min));
        self.since_shrink = if new < b && reason != Reason::CapMemAvailable {
            Some(Duration::ZERO)
        } else {
            since_shrink
        };
        self.budget = new;
        Decision {
            budget: new,
            reason,
            pressure,
        }
    }

    /// Stall fraction over this interval from the cumulative counter; avg10 when there is no
    /// previous counter, the counter went backwards, or the caller does not fill it.
    fn pressure(&mut self, s: &BudgetSample, dt: Duration) -> f64 {
        let total = s.psi_some_total_us;
        let prev = self.prev_total_us.replace(total);
        let p = match prev {
            Some(prev) if total >= prev && total != 0 => {
                (total - prev) as f64 / (dt.as_secs_f64() * 1e6)
            }
            _ => s.psi_some_avg10 / 100.0,
        };
        if p.is_finite() {
            p.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// `x · f` for `f` in 0..=1, rounded down.
fn scale(x: u64, f: f64) -> u64 {
    (x as f64 * f.clamp(0.0, 1.0)) as u64
}

/// A malformed /proc/pressure/* or /proc/meminfo text.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    #[error("no `{0}` line")]
    MissingLine(&'static str),
    #[error("`{line}` line lacks `{field}`")]
    MissingField {
        line: &'static str,
        field: &'static str,
    },
    #[error("bad value for `{field}`: {text:?}")]
    BadValue { field: &'static str, text: String },
}

impl From<ParseError> for io::Error {
    fn from(e: ParseError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// One line of a PSI file.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiLine {
    /// Percent of time stalled, averaged over 10, 60 and 300 s.
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Cumulative stall time, microseconds.
    pub total_us: u64,
}

/// A PSI file: `some` (at least one task stalled) and `full` (all non-idle tasks stalled; absent
/// in some files on older kernels).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Psi {
    pub some: PsiLine,
    pub full: Option<PsiLine>,
}

/// Parses the text of a PSI file such as /proc/pressure/memory:
/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=0` and the same for `full`.
pub fn parse_psi(text: &str) -> Result<Psi, ParseError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("some") => some = Some(parse_psi_line("some", words)?),
            Some("full") => full = Some(parse_psi_line("full", words)?),
            _ => {}
        }
    }
    Ok(Psi {
        some: some.ok_or(ParseError::MissingLine("some"))?,
        full,
    })
}

fn parse_psi_line<'a>(
    line: &'static str,
    words: impl Iterator<Item = &'a str>,
) -> Result<PsiLine, ParseError> {
    let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            continue;
        };
        match k {
            "avg10" => avg10 = Some(parse_avg("avg10", v)?),
            "avg60" => avg60 = Some(parse_avg("avg60", v)?),
            "avg300" => avg300 = Some(parse_avg("avg300", v)?),
            "total" => {
                total = Some(v.parse::<u64>().map_err(|_| ParseError::BadValue {
                    field: "total",
                    text: v.to_string(),
                })?)
            }
            _ => {}
        }
    }
    let need = |v: Option<f64>, field| v.ok_or(ParseError::MissingField { line, field });
    Ok(PsiLine {
        avg10: need(avg10, "avg10")?,
        avg60: need(avg60, "avg60")?,
        avg300: need(avg300, "avg300")?,
        total_us: total.ok_or(ParseError::MissingField {
            line,
            field: "total",
        })?,
    })
}

fn parse_avg(field: &'static str, v: &str) -> Result<f64, ParseError> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && (0.0..=100.0).contains(&x) => Ok(x),
        _ => Err(ParseError::BadValue {
            field,
            text: v.to_string(),
        }),
    }
}

/// Parses `MemAvailable:   123456 kB` out of /proc/meminfo text; returns bytes.
pub fn parse_meminfo_available(text: &str) -> Result<u64, ParseError> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .ok_or(ParseError::MissingLine("MemAvailable"))?;
    let bad = || ParseError::BadValue {
        field: "MemAvailable",
        text: line.trim().to_string(),
    };
    let mut words = line.split_whitespace();
    let n: u64 = words.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    match (words.next(), words.next()) {
        (Some("kB"), None) => n.checked_mul(1024).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Reads PSI memory pressure. A missing file (kernel without PSI, or booted with `psi=0`) gives
/// an error naming the file.
pub fn read_psi() -> io::Result<Psi> {
    read_psi_from(Path::new(PSI_MEMORY))
}

/// Reads MemAvailable in bytes.
pub fn read_mem_available() -> io::Result<u64> {
    read_mem_available_from(Path::new(MEMINFO))
}

/// Reads `(some avg10 %, some total µs, MemAvailable bytes)` from /proc/pressure/memory and
/// /proc/meminfo. Errors name the file; a missing PSI file says PSI is off.
pub fn read_machine() -> io::Result<(f64, u64, u64)> {
    let psi = read_psi()?;
    let avail = read_mem_available()?;
    Ok((psi.some.avg10, psi.some.total_us, avail))
}

fn read_named(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::NotFound && path.starts_with("/proc/pressure") {
            " (PSI is off: needs CONFIG_PSI and no psi=0 on the kernel command line)"
        } else {
            ""
        };
        // Runs on the budget thread: the errno by name, never through libc's strerror.
        let e_text = zmem_os::errno::display(&e);
        io::Error::new(e.kind(), format!("{}: {e_text}{hint}", path.display()))
    })
}

fn with_path(path: &Path, e: ParseError) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {e}", path.display()),
    )
}

fn read_psi_from(path: &Path) -> io::Result<Psi> {
    parse_psi(&read_named(path)?).map_err(|e| with_path(path, e))
}

fn read_mem_available_from(path: &Path) -> io::Result<u64> {
    parse_meminfo_available(&read_named(path)?).map_err(|e| with_path(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    const GIB: u64 = 1 << 30;
    const SEC: Duration = Duration::from_secs(1);

    const PSI_TEXT: &str = "some avg10=1.25 avg60=0.50 avg300=0.10 total=123456\n\
                            full avg10=0.30 avg60=0.05 avg300=0.00 total=4567\n";

    #[test]
    fn parses_psi() {
        let p = parse_psi(PSI_TEXT).unwrap();
        assert_eq!(
            p.some,
            PsiLine {
                avg10: 1.25,
                avg60: 0.5,
                avg300: 0.1,
                total_us: 123456
            }
        );
        assert_eq!(p.full.unwrap().total_us, 4567);
        let idle = parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap();
        assert_eq!(idle.some, PsiLine::default());
        assert_eq!(idle.full, None);
    }

    #[test]
    fn malformed_psi_is_an_error() {
        use ParseError::*;
        assert_eq!(parse_psi(""), Err(MissingLine("some")));
        assert_eq!(
            parse_psi("full avg10=0.00 avg60=0.00 avg300=0.00 total=0"),
            Err(MissingLine("some"))
        );
        assert_eq!(
            parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00"),
            Err(MissingField {
                line: "some",
                field: "total"
            })
        );
        assert!(matches!(
            parse_psi("some avg10=x avg60=0.00 avg300=0.00 total=0"),
            Err(BadValue { field: "avg10", .. })
        ));
        assert!(matches!(
            parse_psi("some avg10=NaN avg60=0.00 avg300=0.00 total=0"),
            Err(BadValue { field: "avg10", .. })
        ));
        assert!(matches!(
            parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=-1"),
            Err(BadValue { field: "total", .. })
        ));
        assert!(matches!(
            parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=99999999999999999999999"),
            Err(BadValue { field: "total", .. })
        ));
        let e: io::Error = parse_psi("garbage").unwrap_err().into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // Arbitrary bytes never panic.
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let n = rng.random_range(0..60);
            let s: String = (0..n)
                .map(|_| b"some fula=vg0123456789.tol \n-"[rng.random_range(0..29)] as char)
                .collect();
            let _ = parse_psi(&s);
            let _ = parse_meminfo_available(&s);
        }
    }

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       32803544 kB\nMemFree:         1234567 kB\n\
                    MemAvailable:   24246824 kB\nBuffers:          123456 kB\n";
        assert_eq!(parse_meminfo_available(text), Ok(24246824 * 1024));
        assert_eq!(
            parse_meminfo_available("MemAvailable:   123456 kB"),
            Ok(123456 * 1024)
        );
    }

    #[test]
    fn malformed_meminfo_is_an_error() {
        use ParseError::*;
        assert_eq!(
            parse_meminfo_available("MemTotal:       32803544 kB\n"),
            Err(MissingLine("MemAvailable"))
        );
        for bad in [
            "MemAvailable:",
            "MemAvailable:   abc kB",
            "MemAvailable:   -5 kB",
            "MemAvailable:   123456",
            "MemAvailable:   123456 MB",
            "MemAvailable:   123456 kB extra",
            "MemAvailable:   99999999999999999999 kB",
            "MemAvailable:   18446744073709551615 kB",
        ] {
            let e = parse_meminfo_available(bad).unwrap_err();
            assert!(matches!(e, BadValue { .. }), "{bad}: {e:?}");
        }
    }

    #[test]
    fn read_machine_here() {
        if Path::new(PSI_MEMORY).exists() {
            let (avg10, _total, avail) = read_machine().unwrap();
            assert!((0.0..=100.0).contains(&avg10));
            assert!(avail > 0);
        } else {
            let e = read_machine().unwrap_err();
            assert!(e.to_string().contains(PSI_MEMORY), "{e}");
        }
        assert!(read_mem_available().unwrap() > 0);
        let e = read_psi_from(Path::new("/proc/pressure/nonexistent")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("/proc/pressure/nonexistent"), "{e}");
        assert!(e.to_string().contains("PSI is off"), "{e}");
    }

    #[test]
    fn validate_catches_bad_configs() {
        assert_eq!(AdaptiveConfig::new(GIB, 2 * GIB).validate(), Ok(()));
        assert_eq!(AdaptiveConfig::new(GIB, GIB).validate(), Ok(()));
        assert!(AdaptiveConfig::new(2 * GIB, GIB)
            .validate()
            .unwrap_err()
            .contains("min"));
        assert!(AdaptiveConfig::new(0, 0).validate().is_err());
        let mut c = AdaptiveConfig::new(0, GIB);
        c.interval = Duration::ZERO;
        assert!(c.validate().unwrap_err().contains("interval"));
        let mut c = AdaptiveConfig::new(0, GIB);
        c.psi_calm = 0.01;
        assert!(c.validate().unwrap_err().contains("psi_calm"));
        let mut c = AdaptiveConfig::new(0, GIB);
        c.max_shrink = f64::NAN;
        assert!(c.validate().unwrap_err().contains("max_shrink"));
        let mut c = AdaptiveConfig::new(0, GIB);
        c.refault_grow = -1.0;
        assert!(c.validate().unwrap_err().contains("refault_grow"));
    }

    /// A machine of `total` bytes; other processes use `other`; the region's working set is `ws`
    /// pages touched uniformly at `access` pages/s; evicted pages cost 1/3 of their size in the
    /// compressed pool. PSI rises when MemAvailable nears zero.
    struct Sim {
        total: u64,
        other: u64,
        ws: u64,
        access: f64,
        resident: u64,
        psi_total_us: u64,
        /// Stall caused by something else, fraction of time.
        extra_stall: f64,
    }

    impl Sim {
        fn mem_available(&self) -> u64 {
            let pool = (self.ws - self.resident) / 3;
            self.total.saturating_sub(self.other + self.resident + pool)
        }

        /// One second with budget `b`; returns the sample at its end.
        fn run(&mut self, b: u64) -> BudgetSample {
            // The manager evicts down to the budget; faults bring the working set back up to it.
            self.resident = b.min(self.ws);
            let missing = (self.ws - self.resident) as f64 / self.ws as f64;
            let refaults = self.access * missing;
            let avail = self.mem_available();
            // Reclaim stalls once less than 256 MiB is left.
            let stall =
                0.05 * (1.0 - avail as f64 / (256 << 20) as f64).max(0.0) + self.extra_stall;
            self.psi_total_us += (stall * 1e6) as u64;
            BudgetSample {
                psi_some_avg10: stall * 100.0,
                psi_some_total_us: self.psi_total_us,
                mem_available: avail,
                refaults_per_sec: refaults,
                faults_per_sec: refaults,
                resident: self.resident,
            }
        }
    }

    #[test]
    fn scenario_other_process_takes_memory_and_gives_it_back() {
        let cfg = AdaptiveConfig::new(GIB, 8 * GIB);
        cfg.validate().unwrap();
        let mut c = Controller::new(cfg.clone());
        assert_eq!(c.budget(), 8 * GIB);
        let ws = 6 * GIB;
        let mut sim = Sim {
            total: 16 * GIB,
            other: 2 * GIB,
            ws,
            access: 50_000.0,
            resident: 0,
            psi_total_us: 0,
            extra_stall: 0.0,
        };
        let mut budgets = vec![];
        for t in 0..110u32 {
            if t == 10 {
                sim.other += 9 * GIB; // another process takes 9 GiB
            }
            if t == 30 {
                sim.other -= 9 * GIB; // and gives it back
            }
            // t = 50..55: another workload stalls on memory (0.5%).
            sim.extra_stall = if (50..55).contains(&t) { 0.005 } else { 0.0 };
            let s = sim.run(c.budget());
            let d = c.step(&s, SEC);
            assert!((cfg.min..=cfg.max).contains(&d.budget));
            budgets.push(d.budget);
            eprintln!(
                "t={t:2} avail={:5} MiB res={:5} MiB refaults={:6.0} -> {d}",
                s.mem_available / MIB,
                s.resident / MIB,
                s.refaults_per_sec
            );
        }
        // Before: plenty of memory, the whole working set fits: the budget holds at max.
        assert!(budgets[..10].iter().all(|&b| b == 8 * GIB));
        // Other process at t=10: within 5 steps the region is down near what fits
        // (R + A ≥ reserve needs R ≤ 3.75 GiB with a 1/3 pool), never below min.
        let fits = 3.75 * GIB as f64;
        assert!(
            (budgets[15] as f64) < fits * 1.08,
            "budget {} MiB 5 s after the squeeze",
            budgets[15] / MIB
        );
        assert!(budgets[10..30].iter().all(|&b| b >= GIB));
        assert!(
            (budgets[29] as f64) > fits * 0.85,
            "overshot: {}",
            budgets[29] / MIB
        );
        // Machine back to normal at MemAvailable ≥ reserve.
        sim.resident = budgets[29].min(ws);
        assert!(sim.mem_available() + 64 * MIB >= cfg.reserve);
        // Released at t=30: grows back to the working set (±) within 15 s, capped by max.
        let after = budgets[45];
        assert!(
            after >= ws * 97 / 100 && after <= ws * 115 / 100,
            "budget {} MiB 15 s after release",
            after / MIB
        );
        let tail = &budgets[45..50];
        assert!(tail.iter().all(|&b| b == tail[0]));
        // PSI at t = 50..55: shrinks by bounded steps (≤ 15% a step) while it lasts ...
        for t in 50..55 {
            assert!(budgets[t] < budgets[t - 1], "t={t}");
            assert!(budgets[t] as f64 >= 0.85 * budgets[t - 1].min(ws) as f64 - 1.0);
        }
        assert!(budgets[54] >= GIB);
        // ... holds through the cooldown, then grows back to the working set.
        assert!(budgets[55..59].iter().all(|&b| b == budgets[54]));
        let back = budgets[80];
        assert!(
            back >= ws * 97 / 100 && back <= ws * 115 / 100,
            "{}",
            back / MIB
        );
        // Steady afterwards: < 2% change over 20 steps.
        let tail = &budgets[80..100];
        let (lo, hi) = (tail.iter().min().unwrap(), tail.iter().max().unwrap());
        assert!((hi - lo) as f64 <= 0.02 * *lo as f64, "{lo} .. {hi}");
        // Also steady while squeezed (t = 20..30).
        let mid = &budgets[20..30];
        let (lo, hi) = (mid.iter().min().unwrap(), mid.iter().max().unwrap());
        assert!((hi - lo) as f64 <= 0.02 * *lo as f64, "{lo} .. {hi}");
    }

    #[test]
    fn max_is_capped_by_mem_available_on_the_first_step() {
        let mut c = Controller::new(AdaptiveConfig::new(GIB, 64 * GIB));
        let s = BudgetSample {
            mem_available: 10 * GIB,
            resident: 0,
            ..Default::default()
        };
        let d = c.step(&s, SEC);
        assert_eq!(d.reason, Reason::CapMemAvailable);
        assert_eq!(d.budget, 10 * GIB - 512 * MIB);
        // The region filling up does not move it: R + A is invariant.
        let s = BudgetSample {
            mem_available: 2 * GIB,
            resident: 8 * GIB,
            ..Default::default()
        };
        assert_eq!(c.step(&s, SEC).reason, Reason::Hold);
        assert_eq!(c.budget(), 10 * GIB - 512 * MIB);
        // A cap evicts nothing, so it starts no cooldown: a region that then fills its budget and
        // refaults grows at once (when memory came back).
        let b = c.budget();
        let s = BudgetSample {
            mem_available: 8 * GIB,
            resident: b,
            refaults_per_sec: 10_000.0,
            ..Default::default()
        };
        let d = c.step(&s, SEC);
        assert_eq!(d.reason, Reason::Grow);
        assert_eq!(d.budget, b + scale(b, 0.1));
        // Without a PSI counter (total left at 0), avg10 is used: 0.3% > 0.1% shrinks.
        let s = BudgetSample {
            psi_some_avg10: 0.3,
            ..s
        };
        assert_eq!(c.step(&s, SEC).reason, Reason::ShrinkPressure);
    }

    #[test]
    fn pressure_shrinks_in_bounded_steps_and_growth_waits_for_calm() {
        let mut c = Controller::new(AdaptiveConfig::new(GIB, 8 * GIB));
        let mut total = 0u64;
        let mut sample = |psi_per_sec: u64, refaults: f64, resident: u64| {
            total += psi_per_sec;
            BudgetSample {
                psi_some_avg10: 0.0,
                psi_some_total_us: total,
                mem_available: 20 * GIB,
                refaults_per_sec: refaults,
                faults_per_sec: refaults,
                resident,
            }
        };
        // First step: total known only from now on; avg10 is 0, so hold.
        assert_eq!(c.step(&sample(0, 0.0, 8 * GIB), SEC).reason, Reason::Hold);
        // 2000 µs/s = 0.2% = 2× threshold: 10% per step.
        let d = c.step(&sample(2000, 0.0, 8 * GIB), SEC);
        assert_eq!(d.reason, Reason::ShrinkPressure);
        assert!((d.pressure - 0.002).abs() < 1e-9);
        assert_eq!(d.budget, scale(8 * GIB, 0.9));
        // Heavy pressure: at most 15% per step.
        let b = c.budget();
        let d = c.step(&sample(500_000, 0.0, b), SEC);
        assert_eq!(d.budget, scale(b, 0.85));
        // Between calm and threshold with high refaults: hold.
        let b = c.budget();
        assert_eq!(
            c.step(&sample(700, 5000.0, b), SEC).reason,
            Reason::HoldPressure
        );
        // Calm, refaulting, but within the cooldown: hold, then grow.
        let mut reasons = vec![];
        for _ in 0..6 {
            let b = c.budget();
            reasons.push(c.step(&sample(0, 5000.0, b), SEC).reason);
        }
        assert_eq!(reasons[..3], [Reason::HoldCooldown; 3]);
        assert_eq!(reasons[3..], [Reason::Grow; 3]);
        // Refaults into unused budget (resident well below it) do not grow it.
        let b = c.budget();
        assert_eq!(c.step(&sample(0, 5000.0, b / 2), SEC).reason, Reason::Hold);
        // Pressure over a long interval is the same fraction (dt is honoured).
        let mut c2 = Controller::new(AdaptiveConfig::new(GIB, 8 * GIB));
        let base = BudgetSample {
            mem_available: 20 * GIB,
            resident: 8 * GIB,
            ..Default::default()
        };
        c2.step(
            &BudgetSample {
                psi_some_total_us: 1,
                ..base
            },
            SEC,
        );
        let d = c2.step(
            &BudgetSample {
                psi_some_total_us: 1 + 5_000,
                ..base
            },
            Duration::from_secs(10),
        );
        assert_eq!(d.reason, Reason::Hold);
        assert!((d.pressure - 0.0005).abs() < 1e-9);
    }

    #[test]
    fn deficit_shrinks_fast_but_at_most_max_shrink_per_step() {
        let mut c = Controller::new(AdaptiveConfig::new(GIB / 2, 16 * GIB));
        let s = BudgetSample {
            mem_available: 0,
            resident: 16 * GIB,
            ..Default::default()
        };
        let d = c.step(&s, SEC);
        assert_eq!(d.reason, Reason::ShrinkMemAvailable);
        assert_eq!(d.budget, 16 * GIB - 512 * MIB - 64 * MIB);
        let s = BudgetSample {
            mem_available: 0,
            resident: GIB,
            ..Default::default()
        };
        assert_eq!(c.step(&s, SEC).budget, GIB / 2); // half of what is in use, = min
        assert_eq!(c.step(&s, SEC).budget, GIB / 2); // never below min
    }

    #[test]
    fn steady_inputs_hold_exactly() {
        let mut c = Controller::new(AdaptiveConfig::new(GIB, 8 * GIB));
        let s = BudgetSample {
            psi_some_avg10: 0.02,
            psi_some_total_us: 1_000_000,
            mem_available: 6 * GIB,
            refaults_per_sec: 100.0,
            faults_per_sec: 3000.0,
            resident: 4 * GIB,
        };
        let first = c.step(&s, SEC).budget;
        for _ in 0..20 {
            let d = c.step(&s, SEC);
            assert_eq!(d.budget, first);
            assert_eq!(d.reason, Reason::Hold);
        }
        // Zero dt changes nothing.
        assert_eq!(c.step(&s, Duration::ZERO).budget, first);
    }

    #[test]
    fn random_samples_stay_within_bounds() {
        let mut rng = StdRng::seed_from_u64(0x2e3e);
        for case in 0..200 {
            let min = rng.random_range(0..4 * GIB);
            let max = min + rng.random_range(0..8 * GIB);
            let mut cfg = AdaptiveConfig::new(min, max);
            if case % 3 == 0 {
                cfg.reserve = rng.random_range(0..2 * GIB);
                cfg.band = rng.random_range(0..GIB);
                cfg.max_shrink = rng.random_range(0.01..1.0);
                cfg.grow_step = rng.random_range(0.0..2.0);
            }
            cfg.validate().unwrap();
            let mut c = Controller::new(cfg);
            assert!((min..=max).contains(&c.budget()));
            let mut total = 0u64;
            for _ in 0..100 {
                total = match rng.random_range(0..10) {
                    0 => rng.random(),
                    1 => 0,
                    _ => total.saturating_add(rng.random_range(0..2_000_000)),
                };
                let odd = |rng: &mut StdRng, x: f64| match rng.random_range(0..20) {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => -1.0,
                    _ => x,
                };
                let (avg10, refaults) = (rng.random_range(0.0..100.0), rng.random_range(0.0..1e5));
                let s = BudgetSample {
                    psi_some_avg10: odd(&mut rng, avg10),
                    psi_some_total_us: total,
                    mem_available: if rng.random_bool(0.05) {
                        u64::MAX
                    } else {
                        rng.random_range(0..32 * GIB)
                    },
                    refaults_per_sec: odd(&mut rng, refaults),
                    faults_per_sec: rng.random_range(0.0..1e5),
                    resident: if rng.random_bool(0.05) {
                        u64::MAX
                    } else {
                        rng.random_range(0..16 * GIB)
                    },
                };
                let dt = Duration::from_millis(rng.random_range(0..5000));
                let d = c.step(&s, dt);
                assert!(
                    (min..=max).contains(&d.budget),
                    "{d:?} not in {min}..={max}"
                );
                assert!((0.0..=1.0).contains(&d.pressure));
                assert_eq!(d.budget, c.budget());
            }
        }
    }
}
