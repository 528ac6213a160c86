//! The cold pass (`cold`): pages recompressed in store order, against a model of their
//! contents, with pages rewritten, discarded and read back between their listing and the pass.

use std::time::Duration;

use zmem_codec::{CodecId, PAGE_SIZE};
use zmem_engine::Policy;

use crate::slot::{BLOCK, OBJECT};
use crate::{ColdPressure, PageStore, StoreConfig, MAX_BLOCK_PAGES};

/// Text that lz4 shrinks and zstd shrinks further, distinct per seed (the store tests' own).
fn text(seed: u64) -> Vec<u8> {
    crate::tests::content(0, seed)
}

/// Rewrites every `every`th page from `from` with new text (seeds from `seed`), and discards
/// every `gap`th page from `hole`, in the store and in the model.
fn rewrite_and_discard(
    s: &PageStore,
    model: &mut [Option<Vec<u8>>],
    (from, every, seed): (u64, usize, u64),
    (hole, gap): (u64, usize),
) {
    let pages = model.len() as u64;
    for i in (from..pages).step_by(every) {
        let p = text(seed + i);
        s.write(i, &p).unwrap();
        model[i as usize] = Some(p);
    }
    for i in (hole..pages).step_by(gap) {
        s.discard(i).unwrap();
        model[i as usize] = None;
    }
}

/// An `auto` store whose recompressor thread waits an hour between idle passes (its cold
/// pass may still run beside the test's: both are checked by the same model).
fn auto_store(pages: u64, group: usize) -> PageStore {
    let mut cfg = StoreConfig::new(pages, Policy::Auto);
    cfg.recompress_interval = Some(Duration::from_secs(3600));
    cfg.cold_group = group;
    PageStore::new(cfg).unwrap()
}

fn check(s: &PageStore, model: &[Option<Vec<u8>>]) {
    let mut b = vec![0u8; PAGE_SIZE];
    for (i, want) in model.iter().enumerate() {
        s.read(i as u64, &mut b).unwrap();
        match want {
            Some(w) => assert!(b == *w, "page {i} differs from the model"),
            None => assert!(b.iter().all(|&x| x == 0), "discarded page {i} is not zeros"),
        }
    }
}

fn run(group: usize) {
    let pages = 256u64;
    let s = auto_store(pages, group);
    let mut model: Vec<Option<Vec<u8>>> = (0..pages).map(|i| Some(text(i))).collect();
    for (i, p) in model.iter().enumerate() {
        s.write(i as u64, p.as_ref().unwrap()).unwrap();
    }
    let before = s.stats().compr_data_size;
    assert_eq!(s.cold_waiting(), pages as usize);
    // Between listing and pass: rewrites (listed again), discards, reads.
    rewrite_and_discard(&s, &mut model, (0, 7, 1000), (3, 11));
    check(&s, &model);
    while s.cold_pass_with(64, ColdPressure::Urgent) > 0 {}
    check(&s, &model);
    let st = s.stats();
    assert!(
        st.compr_data_size * 10 < before * 9,
        "the cold codec saved under 10%: {} -> {}",
        before,
        st.compr_data_size
    );
    // Every page still stored is in the cold codec now, alone or in a group block.
    let kept = model.iter().filter(|m| m.is_some()).count();
    let mut cold = 0;
    let mut in_blocks = 0;
    for (i, m) in model.iter().enumerate() {
        let st = s.inner.slots[i].peek();
        if m.is_some() && st.codec() == CodecId::Zstd as u8 {
            cold += 1;
            assert!(matches!(st.kind(), OBJECT | BLOCK));
            in_blocks += usize::from(st.kind() == BLOCK);
        }
    }
    assert_eq!(cold, kept, "pages left in the write codec");
    if group == 1 {
        assert_eq!(in_blocks, 0);
    } else {
        assert!(
            in_blocks > kept / 2,
            "{in_blocks} of {kept} pages in blocks"
        );
        // A member rewritten or discarded leaves the others of its block intact.
        rewrite_and_discard(&s, &mut model, (1, 5, 5000), (2, 9));
        check(&s, &model);
    }
    // Nothing is left to do: a second pass changes nothing.
    let done = s.stats().recompressed_pages;
    while s.cold_pass_with(64, ColdPressure::Urgent) > 0 {}
    check(&s, &model);
    if group == 1 {
        assert_eq!(s.stats().recompressed_pages, done);
    }
}

#[test]
fn the_cold_pass_recompresses_pages_alone() {
    run(1);
}

#[test]
fn the_cold_pass_recompresses_pages_in_groups() {
    run(4);
    run(16);
}

#[test]
fn pages_are_not_taken_before_they_have_stayed() {
    let s = auto_store(32, 1);
    for i in 0..32 {
        s.write(i, &text(i)).unwrap();
    }
    // Just stored: not due (the thread's own passes see the same).
    assert_eq!(s.cold_pass_with(64, ColdPressure::None), 0);
    assert_eq!(s.cold_waiting(), 32);
    assert_eq!(s.stats().recompressed_pages, 0);
}

#[test]
fn incompressible_and_same_filled_pages_are_not_listed() {
    let s = auto_store(8, 1);
    let mut x = 7u64;
    let noise: Vec<u8> = (0..PAGE_SIZE)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            (x >> 33) as u8
        })
        .collect();
    s.write(0, &noise).unwrap();
    s.write(1, &[7u8; PAGE_SIZE]).unwrap();
    s.write(2, &text(2)).unwrap();
    while s.cold_pass_with(64, ColdPressure::Urgent) > 0 {}
    let mut b = vec![0u8; PAGE_SIZE];
    s.read(0, &mut b).unwrap();
    assert_eq!(b, noise);
    s.read(1, &mut b).unwrap();
    assert_eq!(b, [7u8; PAGE_SIZE]);
    assert_eq!(s.stats().recompressed_pages, 1);
}

#[test]
fn a_bad_group_size_is_refused() {
    let mut cfg = StoreConfig::new(8, Policy::Auto);
    cfg.recompress_interval = Some(Duration::from_secs(3600));
    for bad in [0, 17] {
        cfg.cold_group = bad;
        let e = PageStore::new(cfg.clone()).err().expect("accepted");
        assert!(e.to_string().contains("cold_group"), "{e}");
    }
}

#[test]
fn the_table_walks_stop_at_the_highest_stored_page_and_reach_it() {
    let mut cfg = StoreConfig::new(1 << 16, Policy::Auto);
    cfg.recompress_interval = None;
    let s = PageStore::new(cfg).unwrap();
    assert_eq!(s.inner.stored_end(), 0);
    s.write(10, &text(10)).unwrap();
    s.write(40_000, &text(40_000)).unwrap();
    assert_eq!(s.inner.stored_end(), 40_001);
    // A discard does not lower it (the walks may look at a few empty slots).
    s.discard(40_000).unwrap();
    s.write(40_000, &text(7)).unwrap();
    let cold = Policy::Auto.cold_codec().unwrap();
    let st = s.recompress(cold, false);
    assert_eq!(st.pages_recompressed, 2, "{st:?}");
    let mut b = vec![0u8; PAGE_SIZE];
    s.read(40_000, &mut b).unwrap();
    assert_eq!(b, text(7));
    s.read(10, &mut b).unwrap();
    assert_eq!(b, text(10));
}

#[test]
fn aligned_idle_runs_become_blocks_of_the_block_codec() {
    // The same 64 KiB of text recompressed into one block with zstd-1 and with `auto`'s block
    // codec: the denser one is used for the block (and every page reads back).
    let sizes: Vec<u64> = [Policy::Auto.cold_codec(), Policy::Auto.cold_block_codec()]
        .into_iter()
        .map(|block| {
            let mut cfg = StoreConfig::new(1 << 10, Policy::Auto);
            cfg.recompress_interval = None;
            let s = PageStore::new(cfg).unwrap();
            for i in 0..MAX_BLOCK_PAGES as u64 {
                s.write(i, &text(i)).unwrap();
            }
            let st = s.recompress_with(Policy::Auto.cold_codec().unwrap(), block.unwrap(), false);
            assert_eq!(st.pages_recompressed, MAX_BLOCK_PAGES as u64, "{st:?}");
            assert_eq!(s.stats().block_pages, MAX_BLOCK_PAGES as u64);
            let mut b = vec![0u8; PAGE_SIZE];
            for i in 0..MAX_BLOCK_PAGES as u64 {
                s.read(i, &mut b).unwrap();
                assert_eq!(b, text(i), "page {i}");
            }
            s.stats().compr_data_size
        })
        .collect();
    assert!(
        sizes[1] < sizes[0],
        "zstd-1 block {} bytes, block codec {}",
        sizes[0],
        sizes[1]
    );
}

#[test]
fn raw_pages_join_blocks_once() {
    // Pages no codec shrinks alone: a run of four random pages each written four times (a
    // block finds the repeats) and a run of sixteen different random pages (nothing to find).
    let random = |seed: u64| crate::tests::content(3, seed);
    let mut cfg = StoreConfig::new(1 << 10, Policy::Auto);
    cfg.recompress_interval = None;
    let s = PageStore::new(cfg).unwrap();
    let group = MAX_BLOCK_PAGES as u64;
    let page_of = |i: u64| {
        if i < group {
            random(i % 4)
        } else {
            random(100 + i)
        }
    };
    for i in 0..2 * group {
        s.write(i, &page_of(i)).unwrap();
    }
    assert_eq!(s.stats().huge_pages, 2 * group, "{:?}", s.stats());
    let codec = Policy::Auto.cold_codec().unwrap();
    let first = s.recompress(codec, false);
    assert_eq!(
        (first.blocks_built, first.blocks_failed),
        (1, 1),
        "{first:?}"
    );
    assert_eq!(s.stats().block_pages, group);
    assert_eq!(s.stats().huge_pages, group);
    // The failed run is not tried again; rewritten with text, its pages are.
    let again = s.recompress(codec, false);
    assert_eq!(
        (again.blocks_built, again.blocks_failed),
        (0, 0),
        "{again:?}"
    );
    for i in group..2 * group {
        s.write(i, &text(i)).unwrap();
    }
    let third = s.recompress(codec, false);
    assert_eq!(third.blocks_built, 1, "{third:?}");
    let mut b = vec![0u8; PAGE_SIZE];
    for i in 0..2 * group {
        s.read(i, &mut b).unwrap();
        let want = if i < group { page_of(i) } else { text(i) };
        assert!(b == want, "page {i}");
    }
}

/// The memory limit holds during the cold pass (issue 12's "the old copy is freed only after
/// the new one fits"): with the pool's limit at what it holds, every step of the pass leaves
/// it within the limit, and every page reads back.
#[test]
fn the_cold_pass_keeps_the_memory_limit() {
    for group in [1, 8] {
        let pages = 256u64;
        let s = auto_store(pages, group);
        let model: Vec<Option<Vec<u8>>> = (0..pages).map(|i| Some(text(i))).collect();
        for (i, p) in model.iter().enumerate() {
            s.write(i as u64, p.as_ref().unwrap()).unwrap();
        }
        s.flush().unwrap();
        let limit = s.stats().mem_used_total;
        s.set_mem_limit(Some(limit));
        while s.cold_pass_with(8, ColdPressure::Urgent) > 0 {
            let used = s.stats().mem_used_total;
            assert!(
                used <= limit,
                "group {group}: {used} bytes held, limit {limit}"
            );
        }
        assert!(s.stats().mem_used_total <= limit);
        check(&s, &model);
    }
}
