//! The load of one configuration: SET until it ends, GET, and how it ended.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::abort::{aborted, Interrupted};
use crate::kernel::memcg::{memory_stat, oom_kills};
use crate::kernel::zram::{parse_mm_stat, ZRAM_INDEX};
use crate::process::describe_status;
use crate::report::progress_bar;
use zmem_runenv::size::{format_mib, format_size};

use super::client::{Conn, KvError, Protocol, Watch};
use super::plan::Plan;
use super::report::{GetFaults, Step, Stop};
use super::server::{Server, ServerSpec, StatPoller, ZramWatchdog};
use super::values::{key, key_string, mix, Values};
use super::{KvConfig, VALUE_MAX, VALUE_MIN};
use crate::kernel::memcg::MemCgroup;
use crate::kernel::swap::SwapOn;
use crate::kernel::swapfile::SwapFile;
use crate::kernel::zram::ZramSession;
use crate::ssd::run::LogDir;

/// The steps of one configuration until it ends; Err for an interrupt or a hard error.
pub(super) fn load_loop(
    plan: &Plan,
    spec: &ServerSpec,
    c: KvConfig,
    values: &Values,
    g: &mut Guards,
    cg: &Path,
    oom_before: u64,
) -> anyhow::Result<(Vec<Step>, Stop, Option<u32>)> {
    let proto = spec.protocol;
    let port = g.server.as_ref().expect("server").port;
    let stall = plan.stall();
    let watch = Arc::new(Watch::default());
    let mut ctl = Conn::connect(port, stall, &watch).context("connecting to the server")?;
    let stats0 = proto.stats(&mut ctl).map_err(anyhow::Error::from)?;
    let server_pid = proto.server_pid(&stats0);
    let mut conns = Vec::with_capacity(plan.clients);
    for _ in 0..plan.clients {
        conns.push(Conn::connect(port, stall, &watch).context("connecting to the server")?);
    }
    let _watchdog = (c == KvConfig::Zram && plan.zram_full_stall_s > 0).then(|| {
        ZramWatchdog::start(
            watch.clone(),
            ZRAM_INDEX,
            plan.compressed,
            Duration::from_secs(plan.zram_full_stall_s),
        )
    });
    let pb = progress_bar(plan.max_data, format!("{} {}", spec.name, c.as_str()));
    let mut steps: Vec<Step> = Vec::new();
    let (mut keys, mut bytes) = (0u64, 0u64);
    let mut n_step = 0u64;
    let end = |e: KvError, at: u64, g: &mut Guards| -> anyhow::Result<Stop> {
        let server = g.server.as_mut().expect("server");
        classify(e, at, server, cg, oom_before)
    };
    let stop = loop {
        if bytes >= plan.max_data {
            break Stop {
                kind: "max-data".into(),
                at_data: plan.max_data,
                detail: format!("--max-data {} reached", format_size(plan.max_data)),
            };
        }
        n_step += 1;
        let target = (n_step * plan.step).min(plan.max_data);
        let (end_key, end_bytes) = values.end_for(keys, bytes, target);
        pb.set_message(format!("{} {}: SET", spec.name, c.as_str()));
        let t0 = Instant::now();
        let r = set_phase(&mut conns, proto, values, keys..end_key, plan.pipeline, &pb);
        let set_s = t0.elapsed().as_secs_f64();
        if let Err(e) = r {
            break end(e, end_bytes, g)?;
        }
        pb.set_message(format!("{} {}: GET", spec.name, c.as_str()));
        // zmem's own statistics around the GETs: the fault path's breakdown.
        let zmem_stats = || {
            let pid = server_pid.filter(|_| c.is_zmem())?;
            zmem_runenv::query_stats(&zmem_runenv::socket_dir_from_env(), pid).ok()
        };
        let before_get = zmem_stats();
        let t1 = Instant::now();
        let seed = plan.seed ^ (n_step << 32) ^ ((c as u64) << 56);
        let r = get_phase(
            &mut conns,
            proto,
            values,
            end_key,
            plan.gets,
            plan.pipeline,
            seed,
        );
        let get_s = t1.elapsed().as_secs_f64();
        if let Err(e) = r {
            break end(e, end_bytes, g)?;
        }
        let zmem_get = before_get
            .zip(zmem_stats())
            .map(|(a, b)| GetFaults::between(&a.region, &b.region));
        let st = match proto.stats(&mut ctl) {
            Ok(s) => s,
            Err(e) => break end(e, end_bytes, g)?,
        };
        let n = end_key - keys;
        let b = end_bytes - bytes;
        let mut step = measure(
            proto,
            &st,
            server_pid,
            cg,
            c == KvConfig::Zram,
            StepCounts {
                data_bytes: end_bytes,
                keys: end_key,
                set_ops: n,
                set_bytes: b,
                set_s,
                gets: plan.gets,
                get_s,
            },
        );
        step.zmem_get = zmem_get;
        pb.set_position(end_bytes.min(plan.max_data));
        if !crate::report::progress_enabled() {
            eprintln!(
                "zmem: {} {}: {}: SET {:.0} ops/s, GET {} ops/s, cgroup {}",
                spec.name,
                c.as_str(),
                format_mib(end_bytes),
                step.set_ops_s,
                step.get_ops_s.map_or("-".into(), |v| format!("{v:.0}")),
                step.cgroup_usage.map_or("-".into(), format_mib)
            );
        }
        steps.push(step);
        keys = end_key;
        bytes = end_bytes;
    };
    pb.finish_and_clear();
    Ok((steps, stop, server_pid))
}

pub(super) struct StepCounts {
    data_bytes: u64,
    keys: u64,
    set_ops: u64,
    set_bytes: u64,
    set_s: f64,
    gets: u64,
    get_s: f64,
}

pub(super) fn measure(
    proto: &dyn Protocol,
    st: &BTreeMap<String, String>,
    server_pid: Option<u32>,
    cg: &Path,
    zram: bool,
    n: StepCounts,
) -> Step {
    let status = server_pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok());
    let kib = |name: &str| {
        status.as_ref().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .map(|k| k * 1024)
        })
    };
    let stat = memory_stat(cg).unwrap_or_default();
    let cgroup_stat: BTreeMap<String, u64> = ["rss", "cache", "swap", "pgmajfault"]
        .iter()
        .filter_map(|k| Some((k.to_string(), *stat.get(*k)?)))
        .collect();
    let zram = zram
        .then(|| {
            let t = std::fs::read_to_string(format!("/sys/block/zram{ZRAM_INDEX}/mm_stat")).ok()?;
            parse_mm_stat(&t).ok()
        })
        .flatten();
    let server_stats = proto
        .recorded_stats()
        .iter()
        .filter_map(|k| Some((k.to_string(), st.get(*k)?.trim().parse::<u64>().ok()?)))
        .collect();
    let per_s = |ops: u64, s: f64| if s > 0.0 { ops as f64 / s } else { 0.0 };
    let get_bytes = n.gets * ((VALUE_MIN + VALUE_MAX) / 2) as u64;
    Step {
        data_bytes: n.data_bytes,
        keys: n.keys,
        set_ops: n.set_ops,
        set_s: n.set_s,
        set_ops_s: per_s(n.set_ops, n.set_s),
        set_mb_s: per_s(n.set_bytes, n.set_s) / 1e6,
        gets: n.gets,
        get_s: n.get_s,
        get_ops_s: (n.gets > 0).then(|| per_s(n.gets, n.get_s)),
        get_mb_s: (n.gets > 0).then(|| per_s(get_bytes, n.get_s) / 1e6),
        server_rss: kib("VmRSS:"),
        server_swap: kib("VmSwap:"),
        cgroup_usage: read_u64(&cg.join("memory.usage_in_bytes")),
        cgroup_max_usage: read_u64(&cg.join("memory.max_usage_in_bytes")),
        cgroup_stat,
        cgroup_failcnt: read_u64(&cg.join("memory.failcnt")),
        zram,
        server_stats,
        zmem_get: None,
    }
}

/// What an error of the load means: the end of the configuration (a [`Stop`]), or an error of
/// the run ([`HardError`], [`Interrupted`]).
pub(super) fn classify(
    e: KvError,
    at: u64,
    server: &mut Server,
    cg: &Path,
    oom_before: u64,
) -> anyhow::Result<Stop> {
    if aborted() || matches!(e, KvError::Interrupted) {
        return Err(Interrupted.into());
    }
    if e.is_hard() {
        return Err(HardError(e.to_string()).into());
    }
    let stop = |kind: &str, detail: String| Stop {
        kind: kind.into(),
        at_data: at,
        detail,
    };
    if let KvError::Server { reply, .. } = &e {
        let r = reply.to_ascii_lowercase();
        if r.contains("memory") || r.starts_with("-oom") {
            return Ok(stop("out-of-memory", e.to_string()));
        }
        return Err(HardError(e.to_string()).into());
    }
    // The connection failed or stalled: did the server die, and did the OOM killer do it?
    let stuck = matches!(e, KvError::GaveUp | KvError::Stalled(_));
    let status = server.wait_exit(Duration::from_secs(if stuck { 0 } else { 5 }));
    if status.is_some() {
        server.settle_output(Duration::from_secs(1));
    }
    let ooms = oom_kills(cg).saturating_sub(oom_before);
    let last = server.output();
    if ooms > 0 {
        let how = status.map_or("still running".into(), describe_status);
        return Ok(stop(
            "oom-killed",
            format!(
                "the memory cgroup's OOM killer struck {ooms} time(s); the process started {how}"
            ),
        ));
    }
    if let Some(s) = status {
        if server.log().says_out_of_memory() {
            return Ok(stop(
                "out-of-memory",
                format!("the server {}: {last}", describe_status(s)),
            ));
        }
        return Ok(stop(
            "server-died",
            format!(
                "the server {} ({e}); its last output: {last}",
                describe_status(s)
            ),
        ));
    }
    if matches!(e, KvError::GaveUp) {
        return Ok(stop(
            "zram-full",
            "zram reached its mem_limit and the server answered nothing for --zram-full-stall \
             seconds (the kernel reclaims in vain; its OOM killer had not struck yet)"
                .into(),
        ));
    }
    if matches!(e, KvError::Stalled(_)) {
        return Ok(stop("stalled", e.to_string()));
    }
    Ok(stop("connection-failed", e.to_string()))
}

/// The most severe of the errors of the client threads.
pub(super) fn worst(errs: Vec<KvError>) -> Result<(), KvError> {
    match errs.into_iter().max_by_key(|e| e.rank()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// SETs of keys `range`, split in batches of `pipeline` over the connections.
pub(super) fn set_phase(
    conns: &mut [Conn],
    proto: &dyn Protocol,
    values: &Values,
    range: std::ops::Range<u64>,
    pipeline: usize,
    pb: &indicatif::ProgressBar,
) -> Result<(), KvError> {
    let next = AtomicU64::new(range.start);
    let failed = AtomicBool::new(false);
    let errs: Vec<KvError> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .map(|c| {
                let (next, failed) = (&next, &failed);
                let end = range.end;
                s.spawn(move || -> Result<(), KvError> {
                    let (mut out, mut val, mut k, mut line) =
                        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                    loop {
                        if failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if aborted() {
                            return Err(KvError::Interrupted);
                        }
                        let start = next.fetch_add(pipeline as u64, Ordering::Relaxed);
                        if start >= end {
                            return Ok(());
                        }
                        let stop = (start + pipeline as u64).min(end);
                        out.clear();
                        let mut bytes = 0;
                        for i in start..stop {
                            key(i, &mut k);
                            values.fill(i, &mut val);
                            bytes += val.len() as u64;
                            proto.encode_set(&mut out, &k, &val);
                        }
                        let r = c.send(&out).and_then(|()| {
                            for i in start..stop {
                                key(i, &mut k);
                                proto.read_set_reply(c, &k, &mut line)?;
                            }
                            Ok(())
                        });
                        if let Err(e) = r {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        pb.inc(bytes);
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(r) => r.err(),
                Err(_) => Some(KvError::Protocol {
                    key: "-".into(),
                    detail: "a client thread panicked".into(),
                }),
            })
            .collect()
    });
    worst(errs)
}

/// `gets` GETs of keys drawn uniformly from 0..keys, split over the connections, each value
/// verified.
pub(super) fn get_phase(
    conns: &mut [Conn],
    proto: &dyn Protocol,
    values: &Values,
    keys: u64,
    gets: u64,
    pipeline: usize,
    seed: u64,
) -> Result<(), KvError> {
    if gets == 0 || keys == 0 {
        return Ok(());
    }
    let failed = AtomicBool::new(false);
    let n = conns.len() as u64;
    let errs: Vec<KvError> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(t, c)| {
                let failed = &failed;
                let mine = gets / n + u64::from((t as u64) < gets % n);
                s.spawn(move || -> Result<(), KvError> {
                    let mut rng = StdRng::seed_from_u64(mix(seed ^ t as u64));
                    let (mut out, mut buf, mut k, mut line) =
                        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                    let mut batch: Vec<u64> = Vec::with_capacity(pipeline);
                    let mut done = 0;
                    while done < mine {
                        if failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if aborted() {
                            return Err(KvError::Interrupted);
                        }
                        let m = (mine - done).min(pipeline as u64);
                        batch.clear();
                        out.clear();
                        for _ in 0..m {
                            let i = rng.random_range(0..keys);
                            batch.push(i);
                            key(i, &mut k);
                            proto.encode_get(&mut out, &k);
                        }
                        let r = c.send(&out).and_then(|()| {
                            for &i in &batch {
                                key(i, &mut k);
                                if !proto.read_get_reply(c, &k, &mut line, &mut buf)? {
                                    return Err(KvError::Missing { key: key_string(i) });
                                }
                                if let Some(detail) = values.check(i, &buf) {
                                    return Err(KvError::Mismatch {
                                        key: key_string(i),
                                        detail,
                                    });
                                }
                            }
                            Ok(())
                        });
                        if let Err(e) = r {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        done += m;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(r) => r.err(),
                Err(_) => Some(KvError::Protocol {
                    key: "-".into(),
                    detail: "a client thread panicked".into(),
                }),
            })
            .collect()
    });
    worst(errs)
}

/// An error that fails the whole run (a wrong value, a protocol error): a bug, not an end.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HardError(pub String);

/// Guards of one configuration, dropped in reverse order: server, poller, cgroup, zmem's log
/// directory, swap file, swap, zram.
#[derive(Default)]
pub(super) struct Guards {
    pub(super) zram: Option<ZramSession>,
    pub(super) swap: Option<SwapOn>,
    pub(super) swapfile: Option<SwapFile>,
    pub(super) log_dir: Option<LogDir>,
    pub(super) cgroup: Option<MemCgroup>,
    pub(super) poller: Option<StatPoller>,
    pub(super) server: Option<Server>,
}

impl Drop for Guards {
    fn drop(&mut self) {
        drop(self.server.take());
        drop(self.poller.take());
        drop(self.cgroup.take());
        drop(self.log_dir.take());
        drop(self.swapfile.take());
        drop(self.swap.take());
        drop(self.zram.take());
    }
}

pub(super) fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}
