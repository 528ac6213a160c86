use super::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use zmem_codec::{Codec, CodecId};

const PS: usize = PAGE_SIZE;

/// Page content kinds the tests mix: text-like, same-filled, zero, incompressible.
pub(crate) fn content(kind: u8, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match kind % 4 {
        0 => {
            let words = [
                "page ",
                "store ",
                "zram ",
                "memory ",
                "compress\n",
                "block ",
            ];
            let mut v = format!("seed {seed} ").into_bytes();
            while v.len() < PS {
                v.extend_from_slice(words[(next() % 6) as usize].as_bytes());
            }
            v.truncate(PS);
            v
        }
        1 => {
            let mut v = vec![0u8; PS];
            zmem_codec::fill_same(&mut v, seed | 1);
            v
        }
        2 => vec![0u8; PS],
        _ => (0..PS).map(|_| next() as u8).collect(),
    }
}

fn store(pages: u64, policy: Policy, block_pages: usize) -> PageStore {
    let mut cfg = StoreConfig::new(pages, policy);
    cfg.block_pages = block_pages;
    cfg.engine.cpu_workers = 2;
    PageStore::new(cfg).unwrap()
}

/// A balanced store with a zstd dictionary trained on text pages.
fn store_with_dictionary(pages: u64) -> PageStore {
    let samples: Vec<Vec<u8>> = (0..64).map(|i| content(0, i)).collect();
    let refs: Vec<&[u8]> = samples.iter().map(|v| &v[..]).collect();
    let dict = zmem_codec::train_dictionary(&refs, 8192).unwrap();
    let mut cfg = StoreConfig::new(pages, Policy::Balanced);
    cfg.dictionary = Some(Arc::new(Dictionary::new(3, dict).unwrap()));
    PageStore::new(cfg).unwrap()
}

fn read_page(s: &PageStore, i: u64) -> Vec<u8> {
    let mut b = vec![0xAAu8; PS];
    s.read(i, &mut b).unwrap();
    b
}

#[derive(Clone, Debug)]
enum Op {
    Write(u64, u8, u64),
    Batch(u64, u64, u8, u64, bool),
    Discard(u64),
    DiscardRange(u64, u64),
    Read(u64),
    ReadBatch(u64, u64),
    Flush,
    Compact,
    Recompress,
    /// A group of scattered pages (duplicates removed), content kinds from the u8 and seed.
    Group(Vec<u64>, u8, u64),
    Repack(usize),
}

fn op(pages: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..pages, any::<u8>(), any::<u64>()).prop_map(|(i, k, s)| Op::Write(i, k, s)),
        3 => (0..pages, 1..=20u64, any::<u8>(), any::<u64>(), any::<bool>())
            .prop_map(|(i, n, k, s, w)| Op::Batch(i, n, k, s, w)),
        1 => (0..pages).prop_map(Op::Discard),
        1 => (0..pages, 1..=20u64).prop_map(|(i, n)| Op::DiscardRange(i, n)),
        3 => (0..pages).prop_map(Op::Read),
        2 => (0..pages, 1..=24u64).prop_map(|(i, n)| Op::ReadBatch(i, n)),
        1 => Just(Op::Flush),
        1 => Just(Op::Compact),
        1 => Just(Op::Recompress),
        3 => (proptest::collection::vec(0..pages, 1..=16), any::<u8>(), any::<u64>())
            .prop_map(|(v, k, s)| Op::Group(v, k, s)),
        1 => (1..=16usize).prop_map(Op::Repack),
    ]
}

/// Mostly groups, single writes, discards and overwrites: many sparse blocks and repacks.
fn group_op(pages: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (proptest::collection::vec(0..pages, 1..=16), any::<u8>(), any::<u64>())
            .prop_map(|(v, k, s)| Op::Group(v, k, s)),
        3 => (0..pages, any::<u8>(), any::<u64>()).prop_map(|(i, k, s)| Op::Write(i, k, s)),
        3 => (0..pages).prop_map(Op::Discard),
        3 => (0..pages).prop_map(Op::Read),
        2 => (0..pages, 1..=24u64).prop_map(|(i, n)| Op::ReadBatch(i, n)),
        2 => (1..=16usize).prop_map(Op::Repack),
        1 => Just(Op::Compact),
        1 => (0..pages, 1..=20u64, any::<u8>(), any::<u64>(), any::<bool>())
            .prop_map(|(i, n, k, s, w)| Op::Batch(i, n, k, s, w)),
    ]
}

/// Content of page `p` of a group: mostly text, some same-filled, zero or incompressible.
fn group_content(kind: u8, seed: u64, p: usize) -> Vec<u8> {
    let k = match kind % 8 {
        0..=3 => 0,
        4 => (p % 4) as u8,
        5 => 3,
        6 => (p % 2) as u8 * 3,
        _ => (seed as usize + p) as u8 % 3,
    };
    content(k, seed ^ (p as u64 * 7919))
}

fn check_against_model(policy: Policy, block_pages: usize, ops: Vec<Op>) {
    check_against_model_pages(policy, block_pages, 64, ops)
}

fn check_against_model_pages(policy: Policy, block_pages: usize, pages: u64, ops: Vec<Op>) {
    let s = store(pages, policy, block_pages);
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let expect = |m: &HashMap<u64, Vec<u8>>, i: u64| m.get(&i).cloned().unwrap_or(vec![0; PS]);
    for op in ops {
        match op {
            Op::Write(i, k, seed) => {
                let c = content(k, seed);
                s.write(i, &c).unwrap();
                model.insert(i, c);
            }
            Op::Batch(i, n, k, seed, wait) => {
                let n = n.min(pages - i);
                let mut data = Vec::new();
                for p in 0..n {
                    let c = content(k.wrapping_add(p as u8 % 3), seed ^ p);
                    model.insert(i + p, c.clone());
                    data.extend(c);
                }
                if wait {
                    s.write_batch(i, &data).unwrap();
                } else {
                    s.write_async(i, &data).unwrap();
                }
            }
            Op::Discard(i) => {
                s.discard(i).unwrap();
                model.remove(&i);
            }
            Op::DiscardRange(i, n) => {
                let n = n.min(pages - i);
                s.discard_range(i, n).unwrap();
                for p in i..i + n {
                    model.remove(&p);
                }
            }
            Op::Read(i) => assert_eq!(read_page(&s, i), expect(&model, i), "page {i}"),
            Op::ReadBatch(i, n) => {
                let n = n.min(pages - i);
                let mut buf = vec![0x55u8; n as usize * PS];
                s.read_batch(i, &mut buf).unwrap();
                for p in 0..n {
                    assert_eq!(
                        &buf[p as usize * PS..][..PS],
                        &expect(&model, i + p)[..],
                        "page {} of batch at {i}",
                        i + p
                    );
                }
            }
            Op::Flush => s.flush().unwrap(),
            Op::Compact => {
                s.compact();
            }
            Op::Recompress => {
                s.flush().unwrap();
                s.recompress_with(Codec::Zstd { level: 1 }, Codec::Zstd { level: 1 }, false);
            }
            Op::Group(mut idx, k, seed) => {
                let mut seen = std::collections::HashSet::new();
                idx.retain(|i| seen.insert(*i));
                let data: Vec<Vec<u8>> =
                    (0..idx.len()).map(|p| group_content(k, seed, p)).collect();
                let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
                s.write_group(&idx, &refs).unwrap();
                for (i, d) in idx.iter().zip(data) {
                    model.insert(*i, d);
                }
            }
            Op::Repack(n) => {
                s.repack_groups(n);
            }
        }
    }
    s.flush().unwrap();
    for i in 0..pages {
        assert_eq!(read_page(&s, i), expect(&model, i), "final page {i}");
    }
    let st = s.stats();
    assert_eq!(st.orig_data_size, model.len() as u64 * PS as u64);
    assert_eq!(st.pending_pages, 0);
    let same = model
        .values()
        .filter(|c| zmem_codec::same_filled(c).is_some())
        .count() as u64;
    // Same-filled pages written inside a compressed block are block members, not same pages.
    assert!(st.same_pages <= same);
    if block_pages == 1 {
        assert_eq!(st.same_pages, same);
    }
    assert_block_counts(&s);
    // Every object is freed with the last page that uses it: nothing leaks.
    s.discard_range(0, pages).unwrap();
    let st = s.stats();
    assert_eq!(
        st.pool.objects, 0,
        "objects left after discarding every page"
    );
    assert_eq!(st.compr_data_size, 0);
    assert_eq!(st.block_pages, 0);
    assert_eq!(st.orig_data_size, 0);
}

/// The live count of every block equals the pages that point at it, and block_pages counts
/// them all.
fn assert_block_counts(s: &PageStore) {
    let mut per_block: HashMap<u64, u32> = HashMap::new();
    for slot in s.inner.slots.iter() {
        let (st, aux) = slot.lock();
        slot.unlock_keep(st, 0);
        if st.kind() == BLOCK {
            *per_block.entry(aux).or_default() += 1;
        }
    }
    let mut recorded: HashMap<u64, u32> = HashMap::new();
    for shard in &s.inner.blocks {
        for (h, m) in shard.lock().iter() {
            recorded.insert(*h, m.live);
        }
    }
    assert_eq!(per_block, recorded, "block live counts");
    assert_eq!(
        s.stats().block_pages,
        per_block.values().map(|&n| u64::from(n)).sum::<u64>()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn store_matches_model_single_pages(ops in proptest::collection::vec(op(64), 1..120), p in 0usize..4) {
        check_against_model(Policy::ALL[p], 1, ops);
    }

    #[test]
    fn store_matches_model_with_groups(ops in proptest::collection::vec(group_op(48), 1..160), p in 0usize..4) {
        check_against_model_pages(Policy::ALL[p], 1, 48, ops);
    }

    #[test]
    fn store_matches_model_with_blocks(ops in proptest::collection::vec(op(64), 1..120), p in 0usize..4, b in prop_oneof![Just(4usize), Just(16usize)]) {
        check_against_model(Policy::ALL[p], b, ops);
    }
}

#[test]
fn never_written_pages_read_as_zeros() {
    let s = store(8, Policy::Fast, 1);
    for i in 0..8 {
        assert_eq!(read_page(&s, i), vec![0u8; PS]);
    }
    assert_eq!(s.stats().orig_data_size, 0);
}

#[test]
fn block_neighbours_survive_overwrite_and_discard() {
    let s = store(32, Policy::Balanced, 16);
    let pages: Vec<Vec<u8>> = (0..16).map(|i| content(0, i)).collect();
    s.write_batch(0, &pages.concat()).unwrap();
    let st = s.stats();
    assert_eq!(st.block_pages, 16);
    assert_eq!(st.pool.objects, 1, "one block object for 16 pages");
    s.write(3, &content(0, 99)).unwrap();
    s.discard(7).unwrap();
    for i in 0..16u64 {
        let want = match i {
            3 => content(0, 99),
            7 => vec![0; PS],
            _ => pages[i as usize].clone(),
        };
        assert_eq!(read_page(&s, i), want, "page {i}");
    }
    // Releasing every remaining member frees the block.
    s.discard_range(0, 16).unwrap();
    let st = s.stats();
    assert_eq!(st.pool.objects, 0);
    assert_eq!(st.block_pages, 0);
    assert_eq!(st.compr_data_size, 0);
}

#[test]
fn blocks_compress_better_than_pages() {
    let text: Vec<u8> = (0..64).flat_map(|i| content(0, i)).collect();
    let single = store(64, Policy::Balanced, 1);
    let blocks = store(64, Policy::Balanced, 16);
    single.write_batch(0, &text).unwrap();
    blocks.write_batch(0, &text).unwrap();
    assert!(blocks.stats().compr_data_size < single.stats().compr_data_size);
    let mut a = vec![0u8; text.len()];
    blocks.read_batch(0, &mut a).unwrap();
    assert_eq!(a, text);
}

#[test]
fn stats_have_zram_meanings() {
    let s = store(16, Policy::Fast, 1);
    s.write(0, &content(0, 1)).unwrap();
    s.write(1, &content(1, 2)).unwrap();
    s.write(2, &content(2, 3)).unwrap();
    s.write(3, &content(3, 4)).unwrap();
    let st = s.stats();
    assert_eq!(st.orig_data_size, 4 * PS as u64);
    assert_eq!(st.same_pages, 2);
    assert_eq!(st.huge_pages, 1, "random data is stored raw");
    assert_eq!(st.pool.objects, 2);
    assert!(st.compr_data_size > PS as u64 && st.compr_data_size < 2 * PS as u64 + 64);
    assert!(st.mem_used_total >= st.compr_data_size);
    assert!(st.engine.rejected >= 1);
    s.discard(3).unwrap();
    assert_eq!(s.stats().huge_pages, 0);
    s.write(1, &content(0, 5)).unwrap();
    assert_eq!(s.stats().same_pages, 1);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = store(4, Policy::Fast, 1);
    s.write(1, &content(0, 1)).unwrap();
    let before = s.stats().orig_data_size;
    assert!(matches!(
        s.write(1, &[0u8; 100]),
        Err(StoreError::BadLength { len: 100, .. })
    ));
    assert!(matches!(
        s.write(4, &content(0, 1)),
        Err(StoreError::OutOfRange { index: 4, .. })
    ));
    assert!(matches!(
        s.write(u64::MAX, &content(0, 1)),
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        s.write_batch(3, &[0u8; 2 * PS]),
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        s.write_async(0, &[0u8; PS + 1]),
        Err(StoreError::BadLength { .. })
    ));
    assert!(matches!(
        s.write_batch(0, &[]),
        Err(StoreError::BadLength { .. })
    ));
    let mut b = vec![0u8; PS];
    assert!(matches!(
        s.read(9, &mut b),
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        s.read(0, &mut b[..10]),
        Err(StoreError::BadLength { .. })
    ));
    assert!(matches!(
        s.discard_range(2, 3),
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        s.discard_range(0, 0),
        Err(StoreError::OutOfRange { .. })
    ));
    assert_eq!(s.stats().orig_data_size, before);
    assert_eq!(read_page(&s, 1), content(0, 1));
    for bad in [0usize, 17] {
        let mut cfg = StoreConfig::new(4, Policy::Fast);
        cfg.block_pages = bad;
        assert!(matches!(PageStore::new(cfg), Err(StoreError::Config(_))));
    }
    assert!(matches!(
        PageStore::new(StoreConfig::new(0, Policy::Fast)),
        Err(StoreError::Config(_))
    ));
}

#[test]
fn memory_limit_refuses_writes_and_keeps_old_data() {
    let mut cfg = StoreConfig::new(4096, Policy::Fast);
    cfg.mem_limit = Some(256 * 1024);
    let s = PageStore::new(cfg).unwrap();
    let mut written = 0u64;
    let err = loop {
        match s.write(written, &content(0, written)) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 4096, "the limit never hit");
    };
    assert!(
        matches!(err, StoreError::MemoryLimit { limit: 262144, .. }),
        "{err}"
    );
    let st = s.stats();
    assert!(st.mem_used_total <= 256 * 1024);
    assert_eq!(st.orig_data_size, written * PS as u64);
    // The refused page keeps what it had (nothing) and the others are intact.
    assert_eq!(read_page(&s, written), vec![0u8; PS]);
    for i in 0..written {
        assert_eq!(read_page(&s, i), content(0, i));
    }
    // Batches are refused up front near the limit.
    assert!(matches!(
        s.write_batch(written, &content(0, 1).repeat(4)),
        Err(StoreError::MemoryLimit { .. })
    ));
    // Same-filled pages cost no pool memory and still go in.
    s.write(written, &content(2, 0)).unwrap();
    // Raising the limit lets writes continue.
    s.set_mem_limit(None);
    s.write(written + 1, &content(0, 7)).unwrap();
    assert_eq!(read_page(&s, written + 1), content(0, 7));
}

#[test]
fn corrupt_objects_give_errors_not_crashes() {
    let s = store(4, Policy::Fast, 1);
    s.write(0, &content(0, 1)).unwrap();
    let garbage: [&[u8]; 4] = [
        &[1, 0, 16, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        &[2, 0, 16, 0, 9, 9, 9],
        &[3, 0, 16, 0, 0xff, 0xfe],
        &[9, 0, 16, 0],
    ];
    for g in garbage {
        let h = s.inner.pool.alloc(g).unwrap();
        let slot = &s.inner.slots[2];
        let (st, aux) = slot.lock();
        s.inner.release(st, aux);
        let new = State::new(OBJECT).with_object(1, g.len());
        s.inner.count_new(new, 1);
        slot.unlock_with(new, h.to_raw());
        let mut b = vec![0u8; PS];
        assert!(matches!(
            s.read(2, &mut b),
            Err(StoreError::Corrupt { index: 2, .. })
        ));
        let mut bb = vec![0u8; 3 * PS];
        assert!(matches!(
            s.read_batch(0, &mut bb),
            Err(StoreError::Corrupt { index: 2, .. })
        ));
    }
    // The store is still usable and the slot can be overwritten.
    s.write(2, &content(0, 3)).unwrap();
    assert_eq!(read_page(&s, 2), content(0, 3));
    assert_eq!(read_page(&s, 0), content(0, 1));
}

#[test]
fn many_threads_write_and_verify_checksummed_pages() {
    // Every page carries its index, a version and a checksum; any read must be one whole write.
    fn stamped(index: u64, version: u64) -> Vec<u8> {
        let mut p = content(0, index * 1000 + version);
        p[..8].copy_from_slice(&index.to_le_bytes());
        p[8..16].copy_from_slice(&version.to_le_bytes());
        p[16..24].fill(0);
        let sum: u64 = p[24..].iter().map(|&b| u64::from(b)).sum();
        p[16..24].copy_from_slice(&sum.to_le_bytes());
        p
    }
    fn check(index: u64, p: &[u8]) {
        if p.iter().all(|&b| b == 0) {
            return;
        }
        assert_eq!(u64::from_le_bytes(p[..8].try_into().unwrap()), index);
        let stored = u64::from_le_bytes(p[16..24].try_into().unwrap());
        let sum: u64 = p[24..].iter().map(|&b| u64::from(b)).sum();
        assert_eq!(sum, stored, "torn page {index}");
    }
    let pages = 256u64;
    let s = Arc::new(store(pages, Policy::Fast, 4));
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut x = t + 1;
                let mut buf = vec![0u8; 4 * PS];
                for v in 0..1500u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = x % (pages - 4);
                    match v % 6 {
                        0 => s.write(i, &stamped(i, v)).unwrap(),
                        1 => {
                            let start = i & !3;
                            let data: Vec<u8> =
                                (0..4).flat_map(|k| stamped(start + k, v)).collect();
                            s.write_async(start, &data).unwrap();
                        }
                        2 => s.discard(i).unwrap(),
                        3 => {
                            s.read_batch(i, &mut buf).unwrap();
                            for k in 0..4 {
                                check(i + k as u64, &buf[k * PS..][..PS]);
                            }
                        }
                        _ => {
                            s.read(i, &mut buf[..PS]).unwrap();
                            check(i, &buf[..PS]);
                        }
                    }
                }
            })
        })
        .collect();
    let compactor = {
        let s = s.clone();
        std::thread::spawn(move || {
            for _ in 0..50 {
                s.compact();
                std::thread::yield_now();
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    compactor.join().unwrap();
    s.flush().unwrap();
    let mut b = vec![0u8; PS];
    for i in 0..pages {
        s.read(i, &mut b).unwrap();
        check(i, &b);
    }
}

#[test]
fn compaction_after_random_overwrites_keeps_overhead_low() {
    let pages = 8192u64;
    let s = store(pages, Policy::Fast, 1);
    let data: Vec<u8> = (0..pages).flat_map(|i| content(0, i)).collect();
    s.write_batch(0, &data).unwrap();
    let mut x = 7u64;
    for _ in 0..pages * 2 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = x % pages;
        if x & 1 == 0 {
            s.discard(i).unwrap();
        } else {
            s.write(i, &content(0, x)).unwrap();
        }
    }
    let before = s.stats();
    let c = s.compact();
    let after = s.stats();
    assert!(c.pages_freed > 0);
    assert!(after.mem_used_total < before.mem_used_total);
    let overhead = after.mem_used_total as f64 / after.compr_data_size as f64;
    assert!(
        overhead <= 1.05,
        "mem_used_total/compr_data_size = {overhead:.3}"
    );
    assert_eq!(after.pages_compacted, c.pages_freed);
}

#[test]
fn recompression_improves_ratio_and_respects_idle_marks() {
    let pages = 64u64;
    let s = store(pages, Policy::Auto, 1);
    let data: Vec<u8> = (0..pages).flat_map(|i| content(0, i)).collect();
    s.write_batch(0, &data).unwrap();
    let before = s.stats().compr_data_size;
    s.mark_idle();
    // Touch page 5: its run of 16 is no longer all idle, so only the other runs become blocks.
    read_page(&s, 5);
    let r = s.recompress_with(Codec::Zstd { level: 1 }, Codec::Zstd { level: 1 }, true);
    assert_eq!(r.blocks_built, 3);
    assert_eq!(r.pages_recompressed, 48 + 15);
    let after = s.stats();
    assert!(after.compr_data_size < before);
    assert_eq!(after.recompressed_pages, 63);
    let mut back = vec![0u8; data.len()];
    s.read_batch(0, &mut back).unwrap();
    assert_eq!(back, data);
    // A second pass has nothing left to do.
    assert_eq!(
        s.recompress_with(Codec::Zstd { level: 1 }, Codec::Zstd { level: 1 }, false)
            .pages_recompressed,
        1
    );
}

/// Recompressing half of the pages frees objects all over the old codec's spans; the pass
/// compacts the pool, so it does not keep the DRAM of the objects it replaced.
#[test]
fn recompression_compacts_the_spans_it_empties() {
    let pages = 4096u64;
    let s = store(pages, Policy::Auto, 1);
    let data: Vec<u8> = (0..pages).flat_map(|i| content(0, i)).collect();
    s.write_batch(0, &data).unwrap();
    s.flush().unwrap();
    s.mark_idle();
    // Every other page is touched: only the others are recompressed (alone, no run is idle).
    for i in (0..pages).step_by(2) {
        read_page(&s, i);
    }
    let r = s.recompress_with(Codec::Zstd { level: 1 }, Codec::Zstd { level: 1 }, true);
    assert_eq!(r.pages_recompressed, pages / 2);
    assert_eq!(r.blocks_built, 0);
    let st = s.stats();
    assert!(st.pages_compacted > 0, "{st:?}");
    assert!(
        st.mem_used_total as f64 <= 1.05 * st.pool.object_bytes as f64 + 256.0 * 1024.0,
        "pool {} bytes for {} bytes of objects",
        st.mem_used_total,
        st.pool.object_bytes
    );
    let mut back = vec![0u8; data.len()];
    s.read_batch(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn background_recompression_runs_for_auto() {
    let mut cfg = StoreConfig::new(64, Policy::Auto);
    cfg.recompress_interval = Some(Duration::from_millis(30));
    let s = PageStore::new(cfg).unwrap();
    let data: Vec<u8> = (0..64).flat_map(|i| content(0, i)).collect();
    s.write_batch(0, &data).unwrap();
    let t = Instant::now();
    while s.stats().recompressed_pages < 64 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.stats().recompressed_pages, 64);
    let mut back = vec![0u8; data.len()];
    s.read_batch(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn dropping_with_writes_in_flight_is_clean() {
    for _ in 0..10 {
        let s = store(1024, Policy::Balanced, 16);
        let data: Vec<u8> = (0..1024).flat_map(|i| content(0, i)).collect();
        s.write_async(0, &data).unwrap();
        drop(s);
    }
}

#[test]
fn dictionary_policy_round_trips() {
    let s = store_with_dictionary(64);
    for i in 0..64 {
        s.write(i, &content(0, i + 500)).unwrap();
    }
    for i in 0..64 {
        assert_eq!(read_page(&s, i), content(0, i + 500));
    }
}

fn write_group_owned(s: &PageStore, idx: &[u64], data: &[Vec<u8>]) -> Result<(), StoreError> {
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    s.write_group(idx, &refs)
}

#[test]
fn a_group_of_scattered_pages_is_one_block() {
    let s = store(256, Policy::Balanced, 1);
    let idx = [200u64, 3, 77, 150, 9, 41, 128, 255];
    let data: Vec<Vec<u8>> = (0..8).map(|i| content(0, i)).collect();
    write_group_owned(&s, &idx, &data).unwrap();
    let st = s.stats();
    assert_eq!(st.pool.objects, 1, "one object for the group");
    assert_eq!(st.block_pages, 8);
    assert_eq!(st.orig_data_size, 8 * PS as u64);
    for (i, d) in idx.iter().zip(&data) {
        assert_eq!(&read_page(&s, *i), d, "page {i}");
    }
    // Smaller than the same pages stored one by one.
    let single = store(256, Policy::Balanced, 1);
    for (i, d) in idx.iter().zip(&data) {
        single.write(*i, d).unwrap();
    }
    assert!(st.compr_data_size < single.stats().compr_data_size);
    // Overwrite one member, discard another: the others keep their data.
    s.write(77, &content(0, 99)).unwrap();
    s.discard(9).unwrap();
    assert_eq!(s.stats().block_pages, 6);
    for (i, d) in idx.iter().zip(&data) {
        let want = match i {
            77 => content(0, 99),
            9 => vec![0; PS],
            _ => d.clone(),
        };
        assert_eq!(read_page(&s, *i), want, "page {i}");
    }
    assert_block_counts(&s);
    // The last member frees the block.
    for i in idx {
        if i != 77 {
            s.discard(i).unwrap();
        }
    }
    let st = s.stats();
    assert_eq!(st.block_pages, 0);
    assert_eq!(st.pool.objects, 1, "only page 77's own object is left");
}

#[test]
fn a_batch_read_decodes_a_group_block_once() {
    let s = store(64, Policy::Max, 1);
    // Members at 5, 2, 9, 3 (positions 0..4); page 4 is another object in between.
    let data: Vec<Vec<u8>> = (0..4).map(|i| content(0, i)).collect();
    write_group_owned(&s, &[5, 2, 9, 3], &data).unwrap();
    s.write(4, &content(0, 50)).unwrap();
    let before = s.inner.counters.decodes.load(Ordering::Relaxed);
    let mut buf = vec![0u8; 10 * PS];
    s.read_batch(0, &mut buf).unwrap();
    let decodes = s.inner.counters.decodes.load(Ordering::Relaxed) - before;
    assert_eq!(decodes, 2, "the block once, page 4 once");
    let want = |i: usize| match i {
        5 => data[0].clone(),
        2 => data[1].clone(),
        9 => data[2].clone(),
        3 => data[3].clone(),
        4 => content(0, 50),
        _ => vec![0; PS],
    };
    for i in 0..10 {
        assert_eq!(&buf[i * PS..][..PS], &want(i)[..], "page {i}");
    }
    // Single reads of members decode the block each time, into the caller's buffer.
    for i in [2u64, 3, 5, 9] {
        assert_eq!(read_page(&s, i), want(i as usize));
    }
}

#[test]
fn groups_store_same_filled_and_incompressible_pages_as_the_other_paths_do() {
    let s = store(64, Policy::Balanced, 1);
    // Text, same-filled, zero and random pages: the text pages share a block; same-filled
    // pages take no pool memory.
    let kinds = [0u8, 1, 2, 0, 3, 0, 1, 0];
    let idx: Vec<u64> = (0..8).map(|i| 60 - 7 * i).collect();
    let data: Vec<Vec<u8>> = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| content(k, i as u64 + 1))
        .collect();
    write_group_owned(&s, &idx, &data).unwrap();
    let st = s.stats();
    assert_eq!(st.same_pages, 3);
    assert_eq!(
        st.block_pages, 5,
        "four text pages and the random one share a block"
    );
    assert_eq!(st.pool.objects, 1);
    for (i, d) in idx.iter().zip(&data) {
        assert_eq!(&read_page(&s, *i), d);
    }
    // A group that does not compress as a block is stored page by page (raw pages).
    let random: Vec<Vec<u8>> = (0..6).map(|i| content(3, 100 + i)).collect();
    write_group_owned(&s, &[1, 2, 3, 4, 5, 6], &random).unwrap();
    let st = s.stats();
    assert_eq!(st.pool.objects, 7);
    assert_eq!(st.huge_pages, 6);
    assert_eq!(st.block_pages, 5);
    for (i, d) in (1..=6).zip(&random) {
        assert_eq!(&read_page(&s, i), d);
    }
    // One compressible page is stored alone, not as a block of one.
    write_group_owned(&s, &[30, 31], &[content(1, 7), content(0, 7)]).unwrap();
    assert_eq!(s.stats().block_pages, 5);
    assert_eq!(read_page(&s, 31), content(0, 7));
    assert_block_counts(&s);
}

#[test]
fn bad_groups_are_refused_and_change_nothing() {
    let s = store(32, Policy::Fast, 1);
    s.write(1, &content(0, 1)).unwrap();
    let page = content(0, 2);
    let p: &[u8] = &page;
    let bad: Vec<(Vec<u64>, Vec<&[u8]>)> = vec![
        (vec![], vec![]),
        (vec![1, 2], vec![p]),
        (vec![1], vec![p, p]),
        ((0..17).collect(), vec![p; 17]),
        (vec![1, 2, 1], vec![p, p, p]),
        (vec![1, 32], vec![p, p]),
        (vec![1, 2], vec![p, &page[..100]]),
    ];
    for (idx, pages) in bad {
        let e = s.write_group(&idx, &pages).unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::BadGroup(_)
                    | StoreError::OutOfRange { .. }
                    | StoreError::BadLength { .. }
            ),
            "{idx:?}: {e}"
        );
    }
    assert_eq!(read_page(&s, 1), content(0, 1));
    assert_eq!(read_page(&s, 2), vec![0; PS]);
    assert_eq!(s.stats().orig_data_size, PS as u64);
}

#[test]
fn a_group_over_the_memory_limit_changes_nothing() {
    for incompressible in [false, true] {
        let mut cfg = StoreConfig::new(4096, Policy::Balanced);
        cfg.mem_limit = Some(256 * 1024);
        let s = PageStore::new(cfg).unwrap();
        // Old content for the group's pages: same-filled and text pages.
        for i in 0..8u64 {
            s.write(i, &content((i % 2) as u8, i)).unwrap();
        }
        let mut n = 8;
        while s.write(n, &content(0, n)).is_ok() {
            n += 1;
            assert!(n < 4096, "the limit never hit");
        }
        let before = s.stats();
        let kind = if incompressible { 3 } else { 0 };
        let data: Vec<Vec<u8>> = (0..8)
            .map(|i| {
                if i == 3 {
                    content(2, 0) // a zero page: would cost nothing, still must not change
                } else {
                    content(kind, 1000 + i)
                }
            })
            .collect();
        let e = write_group_owned(&s, &(0..8).collect::<Vec<_>>(), &data).unwrap_err();
        assert!(matches!(e, StoreError::MemoryLimit { .. }), "{e}");
        let after = s.stats();
        assert_eq!(after.pool.objects, before.pool.objects, "nothing leaked");
        assert_eq!(after.orig_data_size, before.orig_data_size);
        assert_eq!(after.same_pages, before.same_pages);
        for i in 0..8u64 {
            assert_eq!(read_page(&s, i), content((i % 2) as u8, i), "page {i}");
        }
        // Room again: the group goes in.
        s.set_mem_limit(None);
        write_group_owned(&s, &(0..8).collect::<Vec<_>>(), &data).unwrap();
        for i in 0..8 {
            assert_eq!(read_page(&s, i), data[i as usize]);
        }
    }
}

#[test]
fn corrupt_group_blocks_give_errors_not_crashes() {
    let s = store(16, Policy::Balanced, 1);
    let data: Vec<Vec<u8>> = (0..4).map(|i| content(0, i)).collect();
    write_group_owned(&s, &[8, 1, 12, 5], &data).unwrap();
    // A garbage object, a valid object of the wrong length, and a position past the end.
    let one_page = {
        let (obj, _) = s
            .engine
            .compress_now(Codec::Zstd { level: 1 }, None, &content(0, 9))
            .unwrap();
        obj
    };
    let cases: [(&[u8], usize, usize); 3] = [
        (&[2, 0, 64, 0, 9, 9, 9, 9], 0, 4),
        (&one_page, 1, 4),
        (&one_page, 5, 4),
    ];
    for (obj, pos, pages) in cases {
        let h = s.inner.pool.alloc(obj).unwrap().to_raw();
        s.inner.block_register(h, &[3]);
        let slot = &s.inner.slots[3];
        let (st, aux) = slot.lock();
        s.inner.release(st, aux);
        let new = State::new(BLOCK)
            .with_object(CodecId::Zstd as u8, obj.len())
            .with_block(pos, pages);
        s.inner.count_new(new, 1);
        slot.unlock_with(new, h);
        let mut b = vec![0u8; PS];
        assert!(matches!(
            s.read(3, &mut b),
            Err(StoreError::Corrupt { index: 3, .. })
        ));
        let mut bb = vec![0u8; 16 * PS];
        assert!(matches!(
            s.read_batch(0, &mut bb),
            Err(StoreError::Corrupt { index: 3, .. })
        ));
        // The good block's members still read, and the bad page can be overwritten.
        for (i, d) in [8u64, 1, 12, 5].iter().zip(&data) {
            assert_eq!(&read_page(&s, *i), d);
        }
        s.write(3, &content(0, 3)).unwrap();
        assert_eq!(read_page(&s, 3), content(0, 3));
    }
    assert_block_counts(&s);
}

#[test]
fn sparse_group_blocks_are_repacked() {
    let s = store(256, Policy::Max, 1);
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    // Four blocks of eight scattered pages; each then loses five of them.
    for b in 0..4u64 {
        let idx: Vec<u64> = (0..8).map(|k| (k * 31 + b * 7) % 256).collect();
        let data: Vec<Vec<u8>> = (0..8).map(|k| content(0, b * 8 + k)).collect();
        write_group_owned(&s, &idx, &data).unwrap();
        for (i, d) in idx.iter().zip(data) {
            model.insert(*i, d);
        }
    }
    assert_eq!(s.stats().pool.objects, 4);
    let mut dropped = 0;
    for b in 0..4u64 {
        for k in [0u64, 2, 3, 5, 7] {
            let i = (k * 31 + b * 7) % 256;
            if k % 2 == 0 {
                s.discard(i).unwrap();
                model.remove(&i);
            } else {
                s.write(i, &content(1, i)).unwrap(); // same-filled: no object
                model.insert(i, content(1, i));
            }
            dropped += 1;
        }
    }
    assert_eq!(dropped, 20);
    assert_eq!(s.inner.sparse.lock().len(), 4);
    let before = s.stats();
    assert_eq!(before.block_pages, 12);
    // 12 survivors: one block of 8 (two sources freed whole, one split), then the rest.
    assert_eq!(s.repack_groups(8), 8);
    assert_eq!(s.repack_groups(8), 4);
    assert_eq!(s.repack_groups(8), 0);
    let after = s.stats();
    assert_eq!(after.repacked_pages, 12);
    assert_eq!(after.block_pages, 12);
    assert_eq!(
        after.pool.objects, 2,
        "four sparse blocks became two dense ones"
    );
    assert!(after.compr_data_size < before.compr_data_size);
    for i in 0..256 {
        let want = model.get(&i).cloned().unwrap_or(vec![0; PS]);
        assert_eq!(read_page(&s, i), want, "page {i}");
    }
    assert_block_counts(&s);
}

#[test]
fn many_threads_with_groups_repacks_and_compaction() {
    // Every page carries its index, a version and a checksum; any read must be one whole write.
    fn stamped(index: u64, version: u64) -> Vec<u8> {
        let mut p = content(0, index * 1000 + version);
        p[..8].copy_from_slice(&index.to_le_bytes());
        p[8..16].copy_from_slice(&version.to_le_bytes());
        p[16..24].fill(0);
        let sum: u64 = p[24..].iter().map(|&b| u64::from(b)).sum();
        p[16..24].copy_from_slice(&sum.to_le_bytes());
        p
    }
    fn check(index: u64, p: &[u8]) {
        if p.iter().all(|&b| b == 0) {
            return;
        }
        assert_eq!(u64::from_le_bytes(p[..8].try_into().unwrap()), index);
        let stored = u64::from_le_bytes(p[16..24].try_into().unwrap());
        let sum: u64 = p[24..].iter().map(|&b| u64::from(b)).sum();
        assert_eq!(sum, stored, "torn page {index}");
    }
    let pages = 256u64;
    let s = Arc::new(store(pages, Policy::Balanced, 1));
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut x = t + 1;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut buf = vec![0u8; 8 * PS];
                for v in 0..1200u64 {
                    let i = next() % (pages - 8);
                    match v % 7 {
                        0 | 1 => {
                            let mut idx: Vec<u64> = (0..8).map(|_| next() % pages).collect();
                            idx.sort_unstable();
                            idx.dedup();
                            let data: Vec<Vec<u8>> = idx.iter().map(|&i| stamped(i, v)).collect();
                            write_group_owned(&s, &idx, &data).unwrap();
                        }
                        2 => s.write(i, &stamped(i, v)).unwrap(),
                        3 => s.discard(i).unwrap(),
                        4 => {
                            s.repack_groups(1 + (v % 16) as usize);
                        }
                        5 => {
                            s.read_batch(i, &mut buf).unwrap();
                            for k in 0..8 {
                                check(i + k as u64, &buf[k * PS..][..PS]);
                            }
                        }
                        _ => {
                            s.read(i, &mut buf[..PS]).unwrap();
                            check(i, &buf[..PS]);
                        }
                    }
                }
            })
        })
        .collect();
    let compactor = {
        let s = s.clone();
        std::thread::spawn(move || {
            for _ in 0..50 {
                s.compact();
                std::thread::yield_now();
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    compactor.join().unwrap();
    let mut b = vec![0u8; PS];
    for i in 0..pages {
        s.read(i, &mut b).unwrap();
        check(i, &b);
    }
    assert_block_counts(&s);
    s.discard_range(0, pages).unwrap();
    assert_eq!(s.stats().pool.objects, 0);
}

/// Bytes drawn at random from 16 letters: no repeats for lz4 to find, but 4 bits of entropy
/// per byte, which zstd's entropy coder halves.
fn skewed_random(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..PS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b"abcdefghijklmnop"[(x % 16) as usize]
        })
        .collect()
}

#[test]
fn what_lz4_cannot_shrink_is_tried_with_an_entropy_coder() {
    let s = store(4, Policy::Fast, 1);
    let page = skewed_random(7);
    s.write(0, &page).unwrap();
    let st = s.stats();
    assert_eq!((st.entropy_tries, st.entropy_wins), (1, 1));
    assert_eq!(st.huge_pages, 0, "stored compressed, not raw");
    assert!(
        st.compr_data_size < 3 * PS as u64 / 4,
        "{}",
        st.compr_data_size
    );
    assert_eq!(read_page(&s, 0), page);
    // Truly random bytes beat both codecs: stored raw after two tries.
    s.write(1, &content(3, 9)).unwrap();
    let st = s.stats();
    assert_eq!(
        (st.entropy_tries, st.entropy_wins, st.huge_pages),
        (2, 1, 1)
    );
    assert_eq!(read_page(&s, 1), content(3, 9));
    // A zstd policy does not try zstd twice.
    let z = store(4, Policy::Balanced, 1);
    z.write(0, &content(3, 9)).unwrap();
    assert_eq!(z.stats().entropy_tries, 0);
}

/// A store for `pages` pages that defers the entropy coder's tries, and holds as many more
/// same-filled pages above them: a pool that saves memory, so that the tries may wait (a pool
/// of raw pages alone saves too little, and its tries are made at once: see
/// `a_pool_that_saves_little_makes_its_tries_at_once`).
fn store_with_entropy_later(pages: u64) -> PageStore {
    let s = bare_store_with_entropy_later(2 * pages);
    for i in pages..2 * pages {
        s.write(i, &[7u8; PS]).unwrap();
    }
    s
}

fn bare_store_with_entropy_later(pages: u64) -> PageStore {
    let mut cfg = StoreConfig::new(pages, Policy::Fast);
    cfg.entropy_later = true;
    PageStore::new(cfg).unwrap()
}

#[test]
fn the_entropy_gate_opens_on_a_run_of_wins_and_still_samples() {
    use crate::entropy::defer;
    assert!(!defer(0, 1), "no wins yet: try at once");
    assert!(!defer((1 << 23) - 1, 1), "23 wins of 32 are not enough");
    assert!(defer((1 << 24) - 1, 1), "24 wins of 32 are");
    assert!(defer(u32::MAX, 15));
    assert!(!defer(u32::MAX, 16), "one page in 16 is tried at once");
    assert!(!defer(u32::MAX, 0));
}

#[test]
fn entropy_tries_are_left_for_later_and_made_by_the_pass() {
    let n = 200u64;
    let s = store_with_entropy_later(n);
    let pages: Vec<Vec<u8>> = (0..n).map(skewed_random).collect();
    for (i, p) in pages.iter().enumerate() {
        assert!(s.write_if_smaller(i as u64, p).unwrap(), "page {i} stored");
    }
    let st = s.stats();
    // The first 24 are tried at once (the gate opens after 24 wins), then one in 16.
    assert!(st.entropy_deferred >= n - 24 - n / 16 - 1, "{st:?}");
    assert_eq!(st.entropy_tries + st.entropy_deferred, n, "{st:?}");
    assert_eq!(st.entropy_wins, st.entropy_tries);
    assert_eq!(
        st.huge_pages, st.entropy_deferred,
        "deferred pages are stored raw"
    );
    assert_eq!(s.entropy_waiting() as u64, st.entropy_deferred);
    // Read back, rewritten or discarded meanwhile: those owe nothing any more.
    let deferred: Vec<u64> = (24..n).filter(|i| i % 16 != 0).collect();
    let (read, rewritten, dropped) = (deferred[0], deferred[1], deferred[2]);
    assert_eq!(read_page(&s, read), pages[read as usize]);
    s.write(rewritten, &content(0, 77)).unwrap();
    s.discard(dropped).unwrap();
    assert_eq!(
        s.entropy_pass(usize::MAX),
        0,
        "nothing is due before LATER_AFTER_MS"
    );
    std::thread::sleep(Duration::from_millis(u64::from(LATER_AFTER_MS) + 50));
    let before = s.stats();
    let tried = s.entropy_pass(10);
    assert_eq!(tried, 10, "a pass stops at its max");
    let tried = tried + s.entropy_pass(usize::MAX);
    let after = s.stats();
    // The rewritten and discarded pages are skipped; the page only read is still raw.
    assert_eq!(tried as u64, before.entropy_deferred - 2, "{after:?}");
    assert_eq!(after.entropy_tries - before.entropy_tries, tried as u64);
    assert_eq!(
        after.entropy_wins, after.entropy_tries,
        "all of them shrink"
    );
    assert_eq!(after.huge_pages, 0, "{after:?}");
    assert!(
        after.compr_data_size < before.compr_data_size * 3 / 4,
        "{after:?}"
    );
    assert_eq!(s.entropy_waiting(), 0);
    assert_eq!(s.entropy_pass(usize::MAX), 0, "each page is tried once");
    for i in 0..n {
        let want = if i == rewritten {
            content(0, 77)
        } else if i == dropped {
            vec![0u8; PS]
        } else {
            pages[i as usize].clone()
        };
        assert_eq!(read_page(&s, i), want, "page {i}");
    }
}

#[test]
fn the_entropy_wait_grows_while_coded_pages_come_back() {
    use crate::entropy::{next_wait, WAIT_MAX_MS};
    let min = LATER_AFTER_MS;
    assert_eq!(next_wait(min, 256, 128), 2 * min, "half came back: doubled");
    assert_eq!(
        next_wait(min, 256, 400),
        2 * min,
        "more reads than tries count as all"
    );
    assert_eq!(
        next_wait(WAIT_MAX_MS, 256, 256),
        WAIT_MAX_MS,
        "no longer than the most"
    );
    assert_eq!(next_wait(4 * min, 256, 32), 2 * min, "one in eight: halved");
    assert_eq!(next_wait(4 * min, 256, 0), 2 * min);
    assert_eq!(next_wait(min, 256, 0), min, "no shorter than the least");
    assert_eq!(next_wait(4 * min, 256, 64), 4 * min, "in between: kept");
}

/// The store's side of the wait: tries won and coded pages read back are counted, and the pass
/// reconsiders the wait once a window of wins is complete.
#[test]
fn the_entropy_wait_follows_what_comes_back() {
    let n = 400u64;
    let s = store_with_entropy_later(n);
    let pages: Vec<Vec<u8>> = (0..n).map(skewed_random).collect();
    let write_all = |s: &PageStore| {
        for (i, p) in pages.iter().enumerate() {
            assert!(s.write_if_smaller(i as u64, p).unwrap(), "page {i} stored");
        }
    };
    write_all(&s);
    assert_eq!(s.stats().entropy_wait_ms, u64::from(LATER_AFTER_MS));
    std::thread::sleep(Duration::from_millis(u64::from(LATER_AFTER_MS) + 50));
    s.entropy_pass(usize::MAX);
    let st = s.stats();
    assert_eq!(st.entropy_wins, n, "every page coded: {st:?}");
    assert_eq!(
        st.entropy_wait_ms,
        u64::from(LATER_AFTER_MS),
        "no decision yet"
    );
    // Every coded page comes back (a scan over a set larger than the budget).
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(&read_page(&s, i as u64), p);
    }
    assert_eq!(s.entropy_pass(0), 0);
    let doubled = 2 * u64::from(LATER_AFTER_MS);
    assert_eq!(
        s.stats().entropy_wait_ms,
        doubled,
        "they came back: wait longer"
    );
    // Stored again: the gate is open, so they wait (now twice as long) for their try.
    write_all(&s);
    std::thread::sleep(Duration::from_millis(u64::from(LATER_AFTER_MS) + 50));
    assert_eq!(
        s.entropy_pass(usize::MAX),
        0,
        "not due after the shortest wait"
    );
    std::thread::sleep(Duration::from_millis(u64::from(LATER_AFTER_MS)));
    assert!(s.entropy_pass(usize::MAX) > 0, "due after the longer one");
    // This time none comes back: the next decision halves the wait.
    let st = s.stats();
    assert!(st.entropy_wins >= n + 256, "{st:?}");
    assert_eq!(s.entropy_pass(0), 0);
    assert_eq!(s.stats().entropy_wait_ms, u64::from(LATER_AFTER_MS));
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(&read_page(&s, i as u64), p, "page {i}");
    }
}

#[test]
fn the_entropy_gate_follows_the_data() {
    let s = store_with_entropy_later(2000);
    for i in 0..100 {
        assert!(s.write_if_smaller(i, &skewed_random(i)).unwrap());
    }
    assert!(s.stats().entropy_deferred > 0);
    // Random bytes now: stored raw while the gate is open, until the sampled tries (one in
    // 16) have lost 9 of the last 32; from then on they are refused at once, as without
    // entropy_later.
    let outcome: Vec<bool> = (100..1000)
        .map(|i| s.write_if_smaller(i, &content(3, i)).unwrap())
        .collect();
    let last_stored = outcome.iter().rposition(|&o| o).unwrap();
    assert!(last_stored < 9 * 16 + 16, "stored until page {last_stored}");
    assert!(outcome[last_stored + 1..].iter().all(|&o| !o));
    // Pages stored raw owe a try, which they lose: they stay raw, and nothing reads wrong.
    std::thread::sleep(Duration::from_millis(u64::from(LATER_AFTER_MS) + 50));
    let before = s.stats();
    s.entropy_pass(usize::MAX);
    let after = s.stats();
    assert!(after.entropy_tries > before.entropy_tries);
    assert!(after.huge_pages >= last_stored as u64 / 2, "{after:?}");
    for i in 0..100 {
        assert_eq!(read_page(&s, i), skewed_random(i));
    }
    for (k, &stored) in outcome.iter().enumerate() {
        let i = 100 + k as u64;
        let want = if stored { content(3, i) } else { vec![0u8; PS] };
        assert_eq!(read_page(&s, i), want, "page {i}");
    }
}

#[test]
fn a_pool_saves_little_below_an_eighth() {
    use crate::entropy::saves_little;
    assert!(!saves_little(0, 0), "an empty pool");
    assert!(!saves_little(700, 800), "an eighth saved");
    assert!(saves_little(701, 800), "less than an eighth");
    assert!(
        saves_little(4200, 4096),
        "raw pages and the pool's overhead"
    );
    assert!(!saves_little(u64::MAX / 2, u64::MAX), "no overflow");
}

/// Raw pages waiting for their try are all a pool of such pages holds: it saves nothing, and
/// the program's DRAM under zmem is what it would be without. Then no try waits: a refused page
/// is tried at once, and the pages already waiting are due after `URGENT_AFTER_MS`.
#[test]
fn a_pool_that_saves_little_makes_its_tries_at_once() {
    use crate::entropy::URGENT_AFTER_MS;
    let (raw, same) = (200u64, 200u64);
    // A few more: enough coded pages would make the pool save an eighth again, and the tries
    // wait again (`saves_little` is what holds the pool there).
    let more = 8;
    let s = bare_store_with_entropy_later(raw + same + more);
    for i in raw..raw + same {
        s.write(i, &[7u8; PS]).unwrap();
    }
    let pages: Vec<Vec<u8>> = (0..raw + same + more).map(skewed_random).collect();
    for i in 0..raw {
        assert!(s.write_if_smaller(i, &pages[i as usize]).unwrap());
    }
    let st = s.stats();
    assert!(st.entropy_deferred >= raw - 24 - raw / 16 - 1, "{st:?}");
    assert!(
        !s.entropy_urgent(),
        "the same-filled pages save enough: {st:?}"
    );
    // Without them the pool holds raw pages only.
    for i in raw..raw + same {
        s.discard(i).unwrap();
    }
    assert!(s.entropy_urgent(), "{:?}", s.stats());
    let before = s.stats();
    for i in raw + same..raw + same + more {
        assert!(s.write_if_smaller(i, &pages[i as usize]).unwrap());
    }
    let after = s.stats();
    assert_eq!(
        after.entropy_deferred, before.entropy_deferred,
        "none deferred"
    );
    assert_eq!(
        after.entropy_tries - before.entropy_tries,
        more,
        "{after:?}"
    );
    assert_eq!(after.entropy_wins, after.entropy_tries);
    // The waiting pages are due well before the shortest wait.
    std::thread::sleep(Duration::from_millis(u64::from(URGENT_AFTER_MS) + 50));
    let tried = s.entropy_pass(usize::MAX);
    assert_eq!(tried as u64, before.entropy_deferred, "{:?}", s.stats());
    let done = s.stats();
    assert_eq!(done.huge_pages, 0, "{done:?}");
    assert!(!s.entropy_urgent(), "coded, they save: {done:?}");
    for i in (0..raw).chain(raw + same..raw + same + more) {
        assert_eq!(read_page(&s, i), pages[i as usize], "page {i}");
    }
}

#[test]
fn a_zstd_policy_defers_nothing() {
    let mut cfg = StoreConfig::new(64, Policy::Balanced);
    cfg.entropy_later = true;
    let s = PageStore::new(cfg).unwrap();
    for i in 0..64 {
        s.write(i, &skewed_random(i)).unwrap();
    }
    let st = s.stats();
    assert_eq!((st.entropy_deferred, st.entropy_tries), (0, 0));
    assert_eq!(s.entropy_pass(usize::MAX), 0);
}

#[test]
fn write_if_smaller_keeps_only_pages_that_save_memory() {
    let s = store(4, Policy::Fast, 1);
    assert!(
        s.write_if_smaller(0, &content(0, 1)).unwrap(),
        "text compresses"
    );
    assert!(
        s.write_if_smaller(1, &content(1, 2)).unwrap(),
        "same-filled pages"
    );
    assert!(
        s.write_if_smaller(2, &skewed_random(3)).unwrap(),
        "entropy-coded"
    );
    // Random data would be stored raw: refused, and the page keeps what it held before.
    let old = content(0, 5);
    s.write(3, &old).unwrap();
    let before = s.stats();
    assert!(!s.write_if_smaller(3, &content(3, 4)).unwrap());
    let after = s.stats();
    assert_eq!(after.not_stored, 1);
    assert_eq!(after.huge_pages, 0);
    assert_eq!(after.compr_data_size, before.compr_data_size);
    assert_eq!(read_page(&s, 3), old);
    assert_eq!(read_page(&s, 0), content(0, 1));
    assert_eq!(read_page(&s, 2), skewed_random(3));
    // Bad input is refused as by write.
    assert!(matches!(
        s.write_if_smaller(9, &content(0, 1)),
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        s.write_if_smaller(0, &[0u8; 100]),
        Err(StoreError::BadLength { .. })
    ));
}

/// `copy_page_from` (a fork's snapshot) against the model: every single-page object and
/// same-filled page arrives as it was, compressed bytes and all; what it cannot copy (a block
/// member, a page never written, an object of a dictionary the destination lacks, the same
/// store, a full pool) is refused
/// with the destination unchanged, and the counters stay those of the pages held.
#[test]
fn copy_page_from_copies_objects_and_refuses_the_rest() {
    let from = store(256, Policy::Balanced, 1);
    let to = store(256, Policy::Balanced, 1);
    // Pages 0..64: text, same-filled, zero and incompressible (stored raw: HUGE).
    for i in 0..64u64 {
        from.write(i, &content(i as u8, i)).unwrap();
    }
    // Pages 100..108: members of one block.
    let idx: Vec<u64> = (100..108).collect();
    let data: Vec<Vec<u8>> = (0..8).map(|i| content(0, 1000 + i)).collect();
    write_group_owned(&from, &idx, &data).unwrap();
    // The destination already holds something at some of the pages: replaced, then freed.
    for i in (0..64u64).step_by(5) {
        to.write(i, &content(0, 9000 + i)).unwrap();
    }
    for i in 0..64u64 {
        assert!(to.copy_page_from(&from, i).unwrap(), "page {i}");
        assert_eq!(read_page(&to, i), content(i as u8, i), "page {i}");
    }
    let (a, b) = (from.stats(), to.stats());
    let singles = a.pool.objects - 1; // all but the block's object
    assert_eq!(b.pool.objects, singles);
    assert_eq!(b.orig_data_size, 64 * PS as u64);
    assert_eq!(b.huge_pages, a.huge_pages);
    assert_eq!(b.same_pages, a.same_pages);
    // Same object sizes: nothing was compressed again (the block is the difference).
    let block_only = store(256, Policy::Balanced, 1);
    write_group_owned(&block_only, &idx, &data).unwrap();
    assert_eq!(
        b.compr_data_size + block_only.stats().compr_data_size,
        a.compr_data_size
    );
    // Refused: block members, pages never written; the destination keeps what it had.
    to.write(100, &content(0, 5)).unwrap();
    for i in [100u64, 107, 200] {
        assert!(!to.copy_page_from(&from, i).unwrap(), "page {i}");
    }
    assert_eq!(read_page(&to, 100), content(0, 5));
    assert_eq!(read_page(&to, 200), vec![0u8; PS]);
    // A plain object decodes anywhere: a store with a dictionary takes it. An object made with
    // a dictionary goes only where the same one is; the store itself is refused.
    let with_dict = store_with_dictionary(256);
    assert!(with_dict.copy_page_from(&from, 0).unwrap());
    assert_eq!(read_page(&with_dict, 0), content(0, 0));
    with_dict.write(1, &content(0, 77)).unwrap();
    assert!(!to.copy_page_from(&with_dict, 1).unwrap());
    assert_eq!(read_page(&to, 1), content(1, 1));
    assert!(!from.copy_page_from(&from, 0).unwrap());
    // Out of range: an error, as for any other page operation.
    assert!(to.copy_page_from(&from, 256).is_err());
    // A full pool refuses (the caller reads and writes instead); the page keeps its content.
    let mut cfg = StoreConfig::new(256, Policy::Balanced);
    cfg.mem_limit = Some(64 * 1024);
    let small = PageStore::new(cfg).unwrap();
    let mut copied = 0;
    for i in (0..64u64).filter(|i| i % 4 == 3) {
        // Incompressible pages, 4 KiB objects each: 16 of them fill the limit.
        if small.copy_page_from(&from, i).unwrap() {
            copied += 1;
            assert_eq!(read_page(&small, i), content(3, i));
        } else {
            assert_eq!(read_page(&small, i), vec![0u8; PS]);
        }
    }
    assert!(
        copied > 0 && copied < 16,
        "{copied} copied under a 64 KiB limit"
    );
}

#[test]
fn rename_gives_a_page_another_index_without_decoding() {
    let s = store(64, Policy::Fast, 1);
    let text = content(0, 3);
    let same = content(1, 4);
    s.write(1, &text).unwrap();
    s.write(2, &same).unwrap();
    s.write(9, &content(0, 9)).unwrap();
    let before = s.stats();
    // An object and a same-filled page move; what they held is freed nowhere, decoded never.
    assert!(s.rename(1, 40).unwrap());
    assert!(s.rename(2, 0).unwrap()); // downwards too (locks in index order)
    let after = s.stats();
    assert_eq!(after.renamed, 2);
    assert_eq!(after.decompress_nanos, before.decompress_nanos);
    assert_eq!(after.reads, before.reads);
    assert_eq!(after.orig_data_size, before.orig_data_size);
    assert_eq!(after.compr_data_size, before.compr_data_size);
    assert_eq!(read_page(&s, 40), text);
    assert_eq!(read_page(&s, 0), same);
    assert_eq!(read_page(&s, 1), vec![0u8; PS]);
    assert_eq!(read_page(&s, 2), vec![0u8; PS]);
    // Nothing changes where the target holds a page, the source holds nothing, or both are one.
    assert!(!s.rename(40, 9).unwrap());
    assert!(!s.rename(5, 6).unwrap());
    assert!(!s.rename(9, 9).unwrap());
    assert_eq!(read_page(&s, 40), text);
    assert_eq!(read_page(&s, 9), content(0, 9));
    // A member of a block is not moved alone: its block's other members share the object.
    write_group_owned(&s, &[20, 21], &[content(0, 20), content(0, 21)]).unwrap();
    assert!(!s.rename(20, 30).unwrap());
    assert_eq!(read_page(&s, 20), content(0, 20));
    assert_eq!(read_page(&s, 30), vec![0u8; PS]);
    // Out of range is an error and changes nothing.
    assert!(matches!(
        s.rename(64, 3),
        Err(StoreError::OutOfRange { index: 64, .. })
    ));
    assert!(matches!(
        s.rename(40, u64::MAX),
        Err(StoreError::OutOfRange { .. })
    ));
    assert_eq!(read_page(&s, 40), text);
    assert_eq!(s.stats().renamed, 2);
    // The renamed page is a page like any other: rewritten and discarded at its new index.
    s.write(40, &content(0, 41)).unwrap();
    assert_eq!(read_page(&s, 40), content(0, 41));
    s.discard(0).unwrap();
    assert_eq!(read_page(&s, 0), vec![0u8; PS]);
}

/// Waits up to 30 s for the store's statistics to show `what`; whether they did.
fn wait_for_stats(s: &PageStore, what: impl Fn(&StoreStats) -> bool) -> bool {
    let t = std::time::Instant::now();
    while !what(&s.stats()) && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    what(&s.stats())
}

/// Pages of 64 fixed phrases in random order (`zmem_workload::phrase_page`).
fn phrase_page(seed: u64) -> Vec<u8> {
    phrase_page_of(0, seed)
}

/// A page of the phrases of set `set` (each set has its own 64 phrases).
fn phrase_page_of(set: u64, seed: u64) -> Vec<u8> {
    zmem_workload::phrase_page(set, seed, PS)
}

/// A dictionary is learnt only where it pays on later pages: on the phrases, not on text of six
/// words in random order (where zstd-1 with a trained dictionary came out 37% larger), nor
/// where the later pages are of another kind.
#[test]
fn a_learnt_dictionary_is_kept_only_if_it_shrinks_its_samples() {
    let codec = Policy::Balanced.write_codec();
    let pages = |page: &dyn Fn(u64) -> Vec<u8>, from: u64, n: u64| {
        (from..from + n).flat_map(page).collect::<Vec<u8>>()
    };
    let phrases = pages(&phrase_page, 0, 256);
    assert!(crate::learn::train(&phrases, &pages(&phrase_page, 5000, 128), codec, 1, None).is_ok());
    let words = |i| content(0, i);
    let refused = crate::learn::train(
        &pages(&words, 0, 256),
        &pages(&words, 5000, 128),
        codec,
        1,
        None,
    )
    .unwrap_err();
    assert!(refused.contains("does not pay"), "{refused}");
    // Learnt on one kind of page, checked on another: refused too.
    let refused = crate::learn::train(&phrases, &pages(&|i| content(3, i), 0, 128), codec, 1, None)
        .unwrap_err();
    assert!(refused.contains("does not pay"), "{refused}");
}

/// Blocks or unblocks SIGBUS on the calling thread.
fn sigbus_blocked(on: bool) {
    // SAFETY: a sigset on this stack, passed to pthread_sigmask for this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGBUS);
        let how = if on {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        assert_eq!(libc::pthread_sigmask(how, &set, std::ptr::null_mut()), 0);
    }
}

/// A zstd store without a dictionary learns one from its first pages (`learn`): the pages
/// written after it shrink more than in a store that does not learn, and every page reads
/// back, those written before the dictionary and those after. `fast` (lz4) never learns.
#[test]
fn a_zstd_store_learns_its_dictionary_from_its_first_pages() {
    assert!(!StoreConfig::new(8, Policy::Fast).learn_dictionary);
    let learnt = store(4096, Policy::Balanced, 1);
    let mut cfg = StoreConfig::new(4096, Policy::Balanced);
    cfg.learn_dictionary = false;
    let plain = PageStore::new(cfg).unwrap();
    let both = [&learnt, &plain];
    // The samples come from the first 1024 pages, the check pages from the next 2048: written
    // with SIGBUS blocked, as inside the signal route's handler, where no trainer may start.
    sigbus_blocked(true);
    for i in 0..4096u64 {
        for s in both {
            s.write(i % 1024, &phrase_page(i)).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        learnt.stats().dictionary_bytes,
        0,
        "trained inside a handler"
    );
    sigbus_blocked(false);
    // The next page written elsewhere starts it.
    learnt.write(4000, &phrase_page(4000)).unwrap();
    assert!(
        wait_for_stats(&learnt, |st| st.dictionary_bytes > 0),
        "{:?}",
        learnt.stats()
    );
    assert_eq!(plain.stats().dictionary_bytes, 0);
    let before: Vec<u64> = both.iter().map(|s| s.stats().compr_data_size).collect();
    for i in 1024..2048u64 {
        for s in both {
            s.write(i, &phrase_page(i)).unwrap();
        }
    }
    let grew: Vec<u64> = both
        .iter()
        .zip(&before)
        .map(|(s, b)| s.stats().compr_data_size - b)
        .collect();
    assert!(
        (grew[0] as f64) < 0.9 * grew[1] as f64,
        "with the learnt dictionary {} bytes, without {}",
        grew[0],
        grew[1]
    );
    // Pages written before the dictionary (odd ones below 1024) and after it read back.
    for s in both {
        for i in (0..1024u64).step_by(2) {
            s.write(i, &phrase_page(3072 + i)).unwrap();
        }
    }
    for s in both {
        for i in 0..2048u64 {
            let want = if i < 1024 { 3072 + i } else { i };
            assert_eq!(read_page(s, i), phrase_page(want), "page {i}");
        }
    }
}

/// A store learns again when its pages change (`learn`'s rounds): a first round on text a
/// dictionary does not help learns nothing, a later one on phrases learns dictionary 1, and
/// one on other phrases replaces it with dictionary 2, which shrinks those pages more. Every
/// page reads back whichever dictionary wrote it.
#[test]
fn a_store_learns_again_where_its_pages_change() {
    let s = store(4096, Policy::Balanced, 1);
    let mut model: Vec<Option<Vec<u8>>> = vec![None; 4096];
    let mut seed = 0u64;
    let mut write = |s: &PageStore, page: &dyn Fn(u64) -> Vec<u8>| {
        let p = page(seed);
        let i = seed % 4096;
        s.write(i, &p).unwrap();
        model[i as usize] = Some(p);
        seed += 1;
    };
    // Round 1: six words in random order, where a dictionary does not pay.
    for _ in 0..4096 {
        write(&s, &|i| content(0, i));
    }
    assert!(
        wait_for_stats(&s, |st| st.dictionary_rounds == 1),
        "{:?}",
        s.stats()
    );
    assert_eq!(s.stats().dictionaries_learnt, 0);
    assert_eq!(s.stats().dictionary_bytes, 0);
    // Writes pages of phrase set `set` 1024 at a time, at most `max` times, until `learnt`
    // dictionaries were learnt; whether they were.
    let mut write_until_learnt = |set: u64, max: usize, learnt: u64| {
        for _ in 0..max {
            for _ in 0..1024 {
                write(&s, &|i| phrase_page_of(set, i));
            }
            if s.stats().dictionaries_learnt == learnt {
                return true;
            }
        }
        false
    };
    // A later round on phrases learns one.
    assert!(write_until_learnt(1, 40, 1), "{:?}", s.stats());
    assert!(
        wait_for_stats(&s, |st| st.dictionary_rounds == 2),
        "{:?}",
        s.stats()
    );
    // Pages of other phrases: dictionary 1 fits them less, so a round learns dictionary 2.
    assert!(write_until_learnt(2, 80, 2), "{:?}", s.stats());
    assert!(s.stats().dictionary_bytes > 0);
    // Set 2 costs less with dictionary 2 than in a store that learnt set 1 only.
    let other = store(4096, Policy::Balanced, 1);
    for k in 0..4096 + 16 {
        other.write(k % 4096, &phrase_page_of(1, k)).unwrap();
    }
    assert!(wait_for_stats(&other, |st| st.dictionaries_learnt == 1));
    let cost = |st: &PageStore| {
        for i in 0..256u64 {
            st.discard(i).unwrap();
        }
        let before = st.stats().compr_data_size;
        for i in 0..256u64 {
            st.write(i, &phrase_page_of(2, 900_000 + i)).unwrap();
        }
        st.stats().compr_data_size - before
    };
    let (with_2, with_1) = (cost(&s), cost(&other));
    assert!(
        (with_2 as f64) < 0.97 * with_1 as f64,
        "256 pages of set 2: {with_2} bytes with dictionary 2, {with_1} with dictionary 1"
    );
    for i in 0..256u64 {
        model[i as usize] = Some(phrase_page_of(2, 900_000 + i));
    }
    for (i, want) in model.iter().enumerate() {
        if let Some(want) = want {
            assert_eq!(&read_page(&s, i as u64), want, "page {i}");
        }
    }
}

/// A store made with `dictionary_thread` off (a region's) never trains where a round's last
/// page is written, nor on a thread of its own: only when its owner calls `learn_pass`.
#[test]
fn a_store_without_a_trainer_thread_learns_in_its_owners_pass() {
    let mut cfg = StoreConfig::new(4096, Policy::Balanced);
    cfg.dictionary_thread = false;
    let s = PageStore::new(cfg).unwrap();
    assert!(!s.learn_pass(), "no round is complete yet");
    for i in 0..4096 + 16 {
        s.write(i % 4096, &phrase_page(i)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.stats().dictionary_rounds, 0, "trained without the pass");
    assert!(s.learn_pass());
    let st = s.stats();
    assert_eq!((st.dictionary_rounds, st.dictionaries_learnt), (1, 1));
    assert!(!s.learn_pass(), "the next round is not due yet");
    for i in 0..4096 {
        assert_eq!(
            read_page(&s, i),
            phrase_page(i + if i < 16 { 4096 } else { 0 })
        );
    }
}

/// A learnt dictionary that stops paying is retired (`learn`'s watch): learnt on phrases, then
/// pages of words it cannot help are written; new pages are written without it, and every page
/// reads back, those written with it too.
#[test]
fn a_dictionary_that_stops_paying_is_retired() {
    let s = store(4096, Policy::Balanced, 1);
    for i in 0..4096 + 16 {
        s.write(i % 4096, &phrase_page(i)).unwrap();
    }
    assert!(wait_for_stats(&s, |st| st.dictionaries_learnt == 1));
    // Pages 0..2048 keep phrases written with the dictionary; the rest become words.
    for k in 0..4 * 8192u64 {
        s.write(2048 + k % 2048, &content(0, k)).unwrap();
        if s.stats().dictionaries_retired == 1 {
            break;
        }
    }
    let st = s.stats();
    assert_eq!(
        (st.dictionaries_retired, st.dictionary_bytes),
        (1, 0),
        "{st:?}"
    );
    for i in 0..2048u64 {
        assert_eq!(
            read_page(&s, i),
            phrase_page(i + if i < 16 { 4096 } else { 0 })
        );
    }
    for i in 2048..4096u64 {
        s.write(i, &content(0, i)).unwrap();
        assert_eq!(read_page(&s, i), content(0, i));
    }
}
