//! Objects larger than a page stored split (whole pages + a tail in the page classes): exact
//! contents at the edges, less memory than the large size classes, the limit honoured with
//! nothing half allocated, tails moved by compaction, and reads from two pools nested.

mod common;

use common::Rng;
use zmem_pool::{Pool, PoolConfig, PoolError, PAGE_SIZE};

fn pool(split: bool, mem_limit: Option<u64>) -> Pool {
    Pool::new(PoolConfig {
        split_large_objects: split,
        mem_limit,
        ..PoolConfig::default()
    })
    .unwrap()
}

#[test]
fn lengths_at_page_edges_read_back_exactly() {
    let p = pool(true, None);
    let lens = [
        PAGE_SIZE - 1,
        PAGE_SIZE,
        PAGE_SIZE + 1,
        2 * PAGE_SIZE - 1,
        2 * PAGE_SIZE,
        16 * PAGE_SIZE,
        p.max_object_size(),
    ];
    let hs: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| p.alloc(&common::content(i as u64, len)).unwrap())
        .collect();
    for (i, (&h, &len)) in hs.iter().zip(&lens).enumerate() {
        common::check(&p, h, i as u64, len);
        assert_eq!(p.splits(len), len > PAGE_SIZE);
    }
    let s = p.stats();
    assert_eq!(s.objects, lens.len() as u64);
    assert_eq!(s.split_objects, 5);
    assert_eq!(s.object_bytes, lens.iter().sum::<usize>() as u64);
    for h in hs {
        p.free(h).unwrap();
        assert_eq!(p.free(h), Err(PoolError::InvalidHandle(h.to_raw())));
        assert!(p.with_object(h, |_| ()).is_err());
    }
    let s = p.stats();
    assert_eq!((s.objects, s.split_objects, s.mem_used_total), (0, 0, 0));
}

#[test]
fn whole_pages_cost_no_rounding_and_no_partial_large_spans() {
    // Blocks of the idle pass's sizes (~16-40 KiB) among single-page objects, as in a store:
    // split, the blocks' tails share the page objects' spans, and the pool holds less than
    // with the blocks in the large size classes.
    let mut used = [0u64; 2];
    for (k, split) in [true, false].into_iter().enumerate() {
        let p = pool(split, None);
        let mut rng = Rng::new(11);
        let mut hs = Vec::new();
        for i in 0..12_000u64 {
            let len = if i % 10 == 0 {
                rng.range(16 << 10, 40 << 10)
            } else {
                rng.range(1000, PAGE_SIZE)
            };
            hs.push((p.alloc(&common::content(i, len)).unwrap(), i, len));
        }
        let s = p.stats();
        used[k] = s.mem_used_total;
        for (h, i, len) in hs {
            common::check(&p, h, i, len);
        }
    }
    // 4.0% over the objects' bytes against 5.3% here.
    assert!(
        (used[0] as f64) < 0.995 * used[1] as f64,
        "split {} vs classes {}",
        used[0],
        used[1]
    );
}

#[test]
fn a_split_object_over_the_limit_leaves_nothing_behind() {
    // Room for the pages of a 3.5-page object but not for a span for its tail: refused whole.
    let p = pool(true, Some(4 * PAGE_SIZE as u64));
    let small = p.alloc(&[7u8; 100]).unwrap();
    let before = p.stats();
    let err = p
        .alloc(&common::content(1, 3 * PAGE_SIZE + 2000))
        .unwrap_err();
    assert!(matches!(err, PoolError::LimitExceeded { .. }), "{err}");
    let after = p.stats();
    assert_eq!(
        (after.mem_used_total, after.objects, after.split_objects),
        (before.mem_used_total, before.objects, 0)
    );
    // The same object without the small one's span fits.
    p.free(small).unwrap();
    let h = p.alloc(&common::content(1, 3 * PAGE_SIZE + 2000)).unwrap();
    common::check(&p, h, 1, 3 * PAGE_SIZE + 2000);
}

#[test]
fn compaction_moves_tails_and_split_objects_still_read_back() {
    let p = pool(true, None);
    let mut rng = Rng::new(5);
    let mut objs = Vec::new();
    for i in 0..3000u64 {
        // Tails of the large objects land among small objects of the same classes.
        let len = if i % 3 == 0 {
            3 * PAGE_SIZE + rng.range(1, 2000)
        } else {
            rng.range(1, 2000)
        };
        objs.push((p.alloc(&common::content(i, len)).unwrap(), i, len));
    }
    rng.shuffle(&mut objs);
    let keep = objs.split_off(objs.len() / 2);
    for &(h, _, _) in objs.iter().filter(|o| o.2 < PAGE_SIZE) {
        p.free(h).unwrap();
    }
    let cs = p.compact();
    assert!(cs.objects_moved > 0 && cs.pages_freed > 0, "{cs:?}");
    for &(h, i, len) in keep.iter().chain(objs.iter().filter(|o| o.2 > PAGE_SIZE)) {
        common::check(&p, h, i, len);
    }
}

#[test]
fn a_read_may_read_another_pools_split_object() {
    let (a, b) = (pool(true, None), pool(true, None));
    let ha = a.alloc(&common::content(1, 5 * PAGE_SIZE + 17)).unwrap();
    let hb = b.alloc(&common::content(2, 2 * PAGE_SIZE + 900)).unwrap();
    let (la, lb) = a
        .with_object(ha, |x| {
            let lb = b.with_object(hb, |y| {
                assert_eq!(y, common::content(2, 2 * PAGE_SIZE + 900).as_slice());
                y.len()
            });
            (x.len(), lb.unwrap())
        })
        .unwrap();
    assert_eq!((la, lb), (5 * PAGE_SIZE + 17, 2 * PAGE_SIZE + 900));
    common::check(&a, ha, 1, 5 * PAGE_SIZE + 17);
}
