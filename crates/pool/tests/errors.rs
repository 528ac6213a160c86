//! Typed errors for bad input; never a panic.

use zmem_pool::{Handle, Pool, PoolConfig, PoolError, PAGE_SIZE};

#[test]
fn too_large_and_empty() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    let max = pool.max_object_size();
    assert_eq!(max, 64 * 1024 + 64);
    let big = vec![0u8; max + 1];
    assert_eq!(
        pool.alloc(&big),
        Err(PoolError::TooLarge { size: max + 1, max })
    );
    assert_eq!(pool.alloc(&[]), Err(PoolError::Empty));
    let s = pool.stats();
    assert_eq!((s.objects, s.mem_used_total), (0, 0));
    // Boundary sizes work and read back exactly.
    for len in [
        1,
        15,
        16,
        17,
        31,
        32,
        33,
        PAGE_SIZE - 1,
        PAGE_SIZE,
        PAGE_SIZE + 1,
        max - 1,
        max,
    ] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let h = pool.alloc(&data).unwrap();
        assert_eq!(pool.object_len(h), Ok(len));
        assert!(pool.with_object(h, |b| b == data.as_slice()).unwrap());
        assert!(pool.slot_size(len).unwrap() >= len);
    }
    assert_eq!(pool.slot_size(0), None);
    assert_eq!(pool.slot_size(max + 1), None);
}

#[test]
fn invalid_handles() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    assert!(Handle::from_raw(0).is_none());
    let _other = pool.alloc(b"other").unwrap();
    let live = pool.alloc(b"hello").unwrap();
    let raw = live.to_raw();
    assert_eq!(Handle::from_raw(raw), Some(live));
    let garbage = [
        1,
        u64::MAX,
        0xdead_beef,
        raw ^ (1 << 48),      // other generation
        raw + 1,              // next table index (never allocated)
        raw | (0xfff0 << 32), // class id out of range
        raw | (1 << 62),      // reserved bits
        raw & !(0xfff << 48), // generation 0
        raw + (1 << 32),      // same index in another class
    ];
    for v in garbage {
        let Some(h) = Handle::from_raw(v) else {
            continue;
        };
        let invalid = Some(PoolError::InvalidHandle(v));
        assert_eq!(pool.free(h).err(), invalid, "{v:#x}");
        assert_eq!(pool.object_len(h).err(), invalid);
        assert_eq!(pool.with_object(h, |b| b.to_vec()).err(), invalid);
    }
    // The live object is untouched by all that.
    assert_eq!(
        pool.with_object(live, |b| b.to_vec()),
        Ok(b"hello".to_vec())
    );
    // Double free.
    pool.free(live).unwrap();
    assert_eq!(pool.free(live), Err(PoolError::InvalidHandle(raw)));
    assert_eq!(pool.object_len(live), Err(PoolError::InvalidHandle(raw)));
    // A new object in the same table entry does not revive the old handle.
    let again = pool.alloc(b"world").unwrap();
    assert_ne!(again, live);
    assert_eq!(pool.free(live), Err(PoolError::InvalidHandle(raw)));
    assert_eq!(
        pool.with_object(again, |b| b.to_vec()),
        Ok(b"world".to_vec())
    );
    assert_eq!(pool.stats().objects, 2);
}

#[test]
fn bad_configs_and_messages() {
    for cfg in [
        PoolConfig {
            max_object_size: 0,
            ..PoolConfig::default()
        },
        PoolConfig {
            max_object_size: (1 << 20) + 1,
            ..PoolConfig::default()
        },
        PoolConfig {
            max_span_pages: 0,
            ..PoolConfig::default()
        },
        PoolConfig {
            max_span_pages: 33,
            ..PoolConfig::default()
        },
    ] {
        assert!(matches!(Pool::new(cfg), Err(PoolError::InvalidConfig(_))));
    }
    let pool = Pool::new(PoolConfig {
        max_object_size: 1 << 20,
        max_span_pages: 32,
        ..PoolConfig::default()
    })
    .unwrap();
    let data = vec![0x5a; 1 << 20];
    let h = pool.alloc(&data).unwrap();
    assert!(pool.with_object(h, |b| b == data.as_slice()).unwrap());
    pool.free(h).unwrap();
    assert_eq!(
        PoolError::TooLarge { size: 10, max: 5 }.to_string(),
        "object of 10 bytes is larger than the pool's maximum object size 5"
    );
    assert_eq!(
        PoolError::InvalidHandle(0x10).to_string(),
        "invalid or stale handle 0x10"
    );
}
