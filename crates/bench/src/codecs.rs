//! `zmem bench codecs`: per codec and block size, single-thread compress and decompress MB/s
//! and ratio on a corpus, every block verified after the round trip. An incompressible block
//! counts at its full size (it is stored raw), unlike DAOS's compress_timing which counted it
//! as 0. Beside each zmem codec it times the bare library call on the same blocks, so the cost
//! of zmem's layer (header, capped output, rejection, per-thread contexts) is visible.

use std::time::Instant;

use anyhow::Context;
use zmem_codec::{Codec, DEFAULT_REJECT_RATIO};

use crate::corpus::Corpus;
use crate::report::{corpus_info, progress_bar, write_json, MachineInfo};
use clap::Args;
use std::path::PathBuf;
use zmem_runenv::size::{format_size, parse_size_usize};

#[derive(Debug, Clone, Args)]
pub struct CodecsArgs {
    /// Corpus directory.
    #[arg(long, default_value = "../shared/corpora/calgary")]
    pub corpus: PathBuf,
    /// Block sizes, comma separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_size_usize, default_value = "4k,8k,16k,32k,64k")]
    pub block: Vec<usize>,
    /// JSON output.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where the blocks are compressed: the CPU codecs (one thread, beside the bare
    /// libraries), or the accelerator backend in batches (lz4, deflate-1, deflate-6).
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: crate::offload::BackendKind,
    /// Blocks per batch handed to the accelerator backend.
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
}

const CODECS: [&str; 6] = ["lz4", "zstd-1", "zstd-3", "deflate-1", "deflate-6", "raw"];
/// Each measurement repeats whole passes over the corpus until this much time has passed,
/// then takes the median pass.
const MIN_SECONDS: f64 = 0.3;
const MIN_PASSES: usize = 3;

#[derive(serde::Serialize)]
struct Row {
    codec: String,
    block: usize,
    blocks: usize,
    ratio: f64,
    compress_mb_s: f64,
    decompress_mb_s: f64,
    /// The bare library (lz4 LZ4_compress_default, zstd ZSTD_compressCCtx with its own frame,
    /// libdeflate deflate_compress) on the same blocks.
    library_compress_mb_s: Option<f64>,
    /// zmem's compress speed relative to the bare library's (1.0 = same).
    layer_speed: Option<f64>,
    rejected_blocks: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `pass` repeatedly and returns the median seconds per pass.
pub(crate) fn time_passes(mut pass: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < MIN_PASSES || start.elapsed().as_secs_f64() < MIN_SECONDS {
        let t = Instant::now();
        pass()?;
        times.push(t.elapsed().as_secs_f64());
        crate::abort::check_abort()?;
    }
    Ok(median(times))
}

fn library_pass(codec: Codec, blocks: &[&[u8]], out: &mut [u8]) -> anyhow::Result<()> {
    for b in blocks {
        library_compress(codec, b, out)?;
    }
    Ok(())
}

/// Compresses `b` into `out` with the bare library call of `codec` (lz4
/// LZ4_compress_default, zstd ZSTD_compressCCtx with its own frame, libdeflate
/// deflate_compress, raw a copy); the compressed length. `out` must hold the codec's bound.
pub(crate) fn library_compress(codec: Codec, b: &[u8], out: &mut [u8]) -> anyhow::Result<usize> {
    match codec {
        Codec::Lz4 { .. } => {
            anyhow::ensure!(
                out.len() >= b.len() + b.len() / 255 + 16,
                "lz4 output buffer too small"
            );
            // SAFETY: out holds LZ4_compressBound(b.len()) bytes (checked above).
            let n = unsafe {
                lz4_sys::LZ4_compress_default(
                    b.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    b.len() as i32,
                    out.len() as i32,
                )
            };
            anyhow::ensure!(n > 0, "lz4 failed");
            Ok(n as usize)
        }
        Codec::Zstd { level } => {
            // The library at its best: one reused context (ZSTD_compressCCtx), its own frame.
            thread_local! {
                static Z: std::cell::RefCell<zstd_safe::CCtx<'static>> =
                    std::cell::RefCell::new(zstd_safe::CCtx::create());
            }
            Z.with(|z| z.borrow_mut().compress(out, b, level))
                .map_err(|c| anyhow::anyhow!("zstd: {}", zstd_safe::get_error_name(c)))
        }
        Codec::Deflate { level } => {
            thread_local! {
                static C: std::cell::RefCell<Vec<(i32, libdeflater::Compressor)>> =
                    const { std::cell::RefCell::new(Vec::new()) };
            }
            C.with(|c| -> anyhow::Result<usize> {
                let mut c = c.borrow_mut();
                if !c.iter().any(|(l, _)| *l == level) {
                    let lvl = libdeflater::CompressionLvl::new(level)
                        .map_err(|e| anyhow::anyhow!("deflate level: {e:?}"))?;
                    c.push((level, libdeflater::Compressor::new(lvl)));
                }
                let (_, comp) = c
                    .iter_mut()
                    .find(|(l, _)| *l == level)
                    .context("compressor")?;
                comp.deflate_compress(b, out)
                    .map_err(|e| anyhow::anyhow!("deflate: {e:?}"))
            })
        }
        Codec::Raw => {
            out[..b.len()].copy_from_slice(b);
            Ok(b.len())
        }
    }
}

pub fn run(args: &CodecsArgs) -> anyhow::Result<()> {
    let corpus = Corpus::load(&args.corpus)?;
    if args.block.is_empty() {
        anyhow::bail!("--block needs at least one size");
    }
    for &b in &args.block {
        if b == 0 || b > 16 * 1024 * 1024 - 1 {
            anyhow::bail!("block size {b} is out of range (1 byte .. 16 MiB)");
        }
        if (b as u64) > corpus.len() {
            anyhow::bail!(
                "block size {b} is larger than the corpus ({} bytes)",
                corpus.len()
            );
        }
    }
    if args.backend != crate::offload::BackendKind::Cpu {
        return run_offload(args, &corpus);
    }
    let codecs: Vec<Codec> = CODECS
        .iter()
        .map(|c| c.parse::<Codec>())
        .collect::<Result<_, _>>()?;
    let pb = progress_bar(
        (codecs.len() * args.block.len()) as u64,
        "bench codecs".into(),
    );
    let mut rows = Vec::new();
    for &bs in &args.block {
        let blocks: Vec<&[u8]> = corpus.bytes().chunks_exact(bs).collect();
        let total = (blocks.len() * bs) as f64;
        let mut encoded: Vec<Vec<u8>> = blocks
            .iter()
            .map(|_| vec![0u8; zmem_codec::max_encoded_len(bs)])
            .collect();
        let mut lens = vec![0usize; blocks.len()];
        for &codec in &codecs {
            pb.set_message(format!("{codec} {}", format_size(bs as u64)));
            let mut rejected = 0;
            let ct = time_passes(|| {
                rejected = 0;
                for (i, b) in blocks.iter().enumerate() {
                    let e =
                        zmem_codec::encode(codec, None, b, &mut encoded[i], DEFAULT_REJECT_RATIO)?;
                    lens[i] = e.len;
                    rejected += usize::from(e.rejected);
                }
                Ok(())
            })?;
            let mut back = vec![0u8; bs];
            let dt = time_passes(|| {
                for (i, b) in blocks.iter().enumerate() {
                    let n = zmem_codec::decode(&encoded[i][..lens[i]], None, &mut back)?;
                    anyhow::ensure!(
                        n == bs && back[..] == b[..],
                        "{codec} block {i} of {bs} bytes did not round-trip"
                    );
                }
                Ok(())
            })?;
            let stored: usize = lens.iter().sum();
            let library = if codec == Codec::Raw {
                None
            } else {
                // SAFETY: a pure function of the library.
                let bound = unsafe { lz4_sys::LZ4_compressBound(bs as i32) } as usize;
                let mut out = vec![0u8; bound.max(zstd_safe::compress_bound(bs)) + 1024];
                Some(time_passes(|| library_pass(codec, &blocks, &mut out))?)
            };
            rows.push(Row {
                codec: codec.to_string(),
                block: bs,
                blocks: blocks.len(),
                ratio: total / stored as f64,
                compress_mb_s: total / ct / 1e6,
                decompress_mb_s: total / dt / 1e6,
                library_compress_mb_s: library.map(|t| total / t / 1e6),
                layer_speed: library.map(|t| t / ct),
                rejected_blocks: rejected,
            });
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    println!(
        "{:<10} {:>6} {:>7} {:>12} {:>12} {:>12} {:>8} {:>9}",
        "codec", "block", "ratio", "comp MB/s", "decomp MB/s", "lib MB/s", "layer", "rejected"
    );
    for r in &rows {
        println!(
            "{:<10} {:>6} {:>7.3} {:>12.0} {:>12.0} {:>12} {:>8} {:>9}",
            r.codec,
            format_size(r.block as u64),
            r.ratio,
            r.compress_mb_s,
            r.decompress_mb_s,
            r.library_compress_mb_s
                .map_or("-".into(), |v| format!("{v:.0}")),
            r.layer_speed.map_or("-".into(), |v| format!("{v:.2}x")),
            r.rejected_blocks
        );
    }
    if let Some(path) = &args.json {
        write_json(
            path,
            &serde_json::json!({
                "bench": "codecs",
                "machine": MachineInfo::collect(),
                "corpus": corpus_info(&corpus),
                "reject_ratio": DEFAULT_REJECT_RATIO,
                "rows": rows,
            }),
        )?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The table and JSON of `--backend gpu|sim`.
fn run_offload(args: &CodecsArgs, corpus: &Corpus) -> anyhow::Result<()> {
    if args.batch == 0 || args.batch > 65536 {
        anyhow::bail!("--batch {} is out of range (1..=65536)", args.batch);
    }
    let pb = progress_bar(args.block.len() as u64, "bench codecs (offload)".into());
    let mut rows = Vec::new();
    for &bs in &args.block {
        pb.set_message(format!("{:?} {}", args.backend, format_size(bs as u64)));
        let blocks: Vec<&[u8]> = corpus.bytes().chunks_exact(bs).collect();
        rows.extend(crate::offload::rows(args.backend, &blocks, bs, args.batch)?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    println!(
        "{:<8} {:<10} {:>6} {:>6} {:>7} {:>10} {:>13} {:>9} {:>9}",
        "backend",
        "codec",
        "block",
        "batch",
        "ratio",
        "MB/s",
        "host CPU s/GiB",
        "bus B/B",
        "rejected"
    );
    for r in &rows {
        println!(
            "{:<8} {:<10} {:>6} {:>6} {:>7.3} {:>10.0} {:>13.3} {:>9.2} {:>9}",
            r.backend,
            r.codec,
            format_size(r.block as u64),
            r.batch,
            r.ratio,
            r.compress_mb_s,
            r.host_cpu_s_per_gib,
            r.bus_bytes_per_byte,
            r.rejected_blocks
        );
    }
    if let Some(path) = &args.json {
        write_json(
            path,
            &serde_json::json!({
                "bench": "codecs",
                "backend": format!("{:?}", args.backend).to_lowercase(),
                "machine": MachineInfo::collect(),
                "corpus": corpus_info(corpus),
                "reject_ratio": DEFAULT_REJECT_RATIO,
                "rows": rows,
            }),
        )?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
