//! Small objects in tiered memory: what page-level tiering costs an object workload, and what
//! putting hot and cold objects on different pages buys (HMM_alloc's object granularity,
//! without its kernel module). See crates/heap/README.md for the figures.
//!
//! Many objects of 64-512 bytes (random sizes), 10% of them hot and accessed at random, the
//! rest cold; the DRAM budget is a fraction of the data. An access reads the whole object,
//! checks its id and bumps its counter; every counter is checked at the end. Modes:
//!
//! - `one`: one heap, objects allocated in random order (hot and cold share pages, as when
//!   a program does not know which objects will be hot);
//! - `one-hot-first`: one heap, the hot objects allocated first (same size classes, so they
//!   share pages with each other: segregation by allocation time, i.e. age);
//! - `two`: a heap for hot objects, one for cold (the budget split 7:1);
//! - `promote`: allocated in the cold heap in random order; an object is moved to the hot
//!   heap on its first access (what a program can do through a handle table when it does not
//!   know hotness in advance). Its moves are counted in the measured time;
//! - `churn`: one heap, random order, and each measured operation frees a random object and
//!   allocates a new one in its place (allocator metadata and free lists under eviction).
//!
//! ```text
//! cargo run --release -p zmem-heap --example objects -- --data 64M --budget 16M \
//!     --accesses 400000 [--modes one,one-hot-first,two,promote] [--cold-share 0.0] [--seed 1]
//! ```

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use zmem_heap::{Budget, Heap, HeapStats, RegionConfig};

struct Args {
    data: u64,
    budget: u64,
    accesses: u64,
    hot: f64,
    cold_share: f64,
    seed: u64,
    modes: Vec<String>,
}

fn size_arg(s: &str) -> u64 {
    let (n, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().expect("a size like 64M") * mult
}

fn parse() -> Args {
    let mut a = Args {
        data: 64 << 20,
        budget: 16 << 20,
        accesses: 400_000,
        hot: 0.1,
        cold_share: 0.0,
        seed: 1,
        modes: ["one", "one-hot-first", "two", "promote"]
            .map(String::from)
            .to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--data" => a.data = size_arg(&v()),
            "--budget" => a.budget = size_arg(&v()),
            "--accesses" => a.accesses = v().parse().expect("a count"),
            "--hot" => a.hot = v().parse().expect("a fraction"),
            "--cold-share" => a.cold_share = v().parse().expect("a fraction"),
            "--seed" => a.seed = v().parse().expect("a number"),
            "--modes" => a.modes = v().split(',').map(String::from).collect(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// An object: where it is, its size, which heap holds it (0 = the first).
#[derive(Clone, Copy)]
struct Obj {
    ptr: *mut u8,
    size: u32,
    heap: u8,
}

/// Fills an object: its id, a counter, then half noise, half text (about 2:1 under lz4, like
/// the process memory measured in DESIGN.md).
///
/// # Safety
/// `p` is valid for `size` >= 16 bytes.
unsafe fn fill_object(p: *mut u8, size: usize, id: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        (p as *mut u64).write_unaligned(id);
        (p.add(8) as *mut u64).write_unaligned(0);
        let words = b"object tier heap page cold hot zmem ";
        for i in 16..size {
            *p.add(i) = if i % 8 < 2 {
                ((id ^ (i as u64) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
            } else {
                words[(i + id as usize) % words.len()]
            };
        }
    }
}

/// Reads the whole object (as a program using it would), checks its id, bumps its counter.
///
/// # Safety
/// `p` is a live object of `size` bytes filled for `id`.
unsafe fn access(p: *mut u8, size: usize, id: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe {
        let s = std::slice::from_raw_parts(p, size);
        let sum = s.iter().fold(0u64, |a, &b| a.wrapping_add(b as u64));
        assert_eq!(
            (p as *const u64).read_unaligned(),
            id,
            "object {id} corrupt"
        );
        let c = (p.add(8) as *mut u64).read_unaligned();
        (p.add(8) as *mut u64).write_unaligned(c + 1);
        sum
    }
}

struct Heaps {
    heaps: Vec<Heap>,
}

impl Heaps {
    fn stats(&self) -> Vec<HeapStats> {
        self.heaps.iter().map(|h| h.stats()).collect()
    }
}

/// Sums of the fields the report shows, over all heaps.
#[derive(Default, Clone, Copy)]
struct Sum {
    faults: u64,
    major: u64,
    evictions: u64,
    resident: u64,
    pool: u64,
    meta_resident: u64,
    stored: u64,
}

fn sum(stats: &[HeapStats]) -> Sum {
    let mut s = Sum::default();
    for h in stats {
        s.faults += h.region.faults();
        s.major += h.region.major_faults;
        s.evictions += h.region.evictions;
        s.resident += h.region.resident;
        s.pool += h.region.store.mem_used_total;
        s.meta_resident += h.metadata_resident;
        s.stored += h.region.store.orig_data_size;
    }
    s
}

fn heap(capacity: u64, budget: u64) -> Heap {
    Heap::new(RegionConfig::new(capacity, Budget::Fixed(budget))).expect("Heap::new")
}

struct Outcome {
    mode: String,
    fill: Duration,
    time: Duration,
    accesses: u64,
    before: Sum,
    after: Sum,
    moved: u64,
}

fn run(a: &Args, mode: &str) -> Outcome {
    let mut rng = StdRng::seed_from_u64(a.seed);
    // Objects of 64..=512 bytes until the data size is reached.
    let mut sizes = Vec::new();
    let mut total = 0u64;
    while total < a.data {
        let s = rng.random_range(64..=512u32);
        sizes.push(s);
        total += s as u64;
    }
    let n = sizes.len();
    let mut ids: Vec<usize> = (0..n).collect();
    ids.shuffle(&mut rng);
    let hot_n = ((n as f64) * a.hot) as usize;
    let hot: Vec<usize> = ids[..hot_n].to_vec();
    let cold: Vec<usize> = ids[hot_n..].to_vec();
    let mut is_hot = vec![false; n];
    for &i in &hot {
        is_hot[i] = true;
    }
    // Room for the data twice over (size classes round up; promote allocates twice).
    let capacity = (a.data * 2).next_multiple_of(32 << 20);
    let heaps = Heaps {
        heaps: match mode {
            "one" | "one-hot-first" | "churn" => vec![heap(capacity, a.budget)],
            "two" | "promote" => vec![
                heap(capacity, a.budget * 7 / 8),
                heap(capacity, a.budget / 8),
            ],
            other => panic!("unknown mode {other}"),
        },
    };
    // Allocation order: random, or hot first; which heap: by hotness where the mode knows it.
    let order: Vec<usize> = match mode {
        "one-hot-first" => hot.iter().chain(cold.iter()).copied().collect(),
        _ => {
            let mut o: Vec<usize> = (0..n).collect();
            o.shuffle(&mut rng);
            o
        }
    };
    let mut objs = vec![
        Obj {
            ptr: std::ptr::null_mut(),
            size: 0,
            heap: 0
        };
        n
    ];
    let t0 = Instant::now();
    for &i in &order {
        let h = match mode {
            "two" if !is_hot[i] => 1,
            "promote" => 1,
            _ => 0,
        };
        let size = sizes[i] as usize;
        let p = heaps.heaps[h].malloc(size).expect("malloc").as_ptr();
        // SAFETY: a fresh block of size bytes.
        unsafe { fill_object(p, size, i as u64) };
        objs[i] = Obj {
            ptr: p,
            size: size as u32,
            heap: h as u8,
        };
    }
    let fill_time = t0.elapsed();
    let mut counts = vec![0u64; n];
    let mut moved = 0u64;
    let mut touch = |i: usize, objs: &mut [Obj], moved: &mut u64| -> u64 {
        let o = objs[i];
        if mode == "promote" && o.heap == 1 {
            // First access: the object moves to the hot heap.
            let q = heaps.heaps[0]
                .malloc(o.size as usize)
                .expect("malloc")
                .as_ptr();
            // SAFETY: both blocks hold o.size bytes; o.ptr is a live block of heap 1.
            unsafe {
                std::ptr::copy_nonoverlapping(o.ptr, q, o.size as usize);
                heaps.heaps[1].free(o.ptr).expect("free");
            }
            objs[i] = Obj {
                ptr: q,
                size: o.size,
                heap: 0,
            };
            *moved += 1;
        }
        let o = objs[i];
        counts[i] += 1;
        // SAFETY: o is a live object filled for id i.
        unsafe { access(o.ptr, o.size as usize, i as u64) }
    };
    if mode == "churn" {
        return churn(a, &mut rng, &heaps, &mut objs, fill_time);
    }
    let pick = |rng: &mut StdRng| -> usize {
        if a.cold_share > 0.0 && rng.random_bool(a.cold_share) {
            cold[rng.random_range(0..cold.len())]
        } else {
            hot[rng.random_range(0..hot.len())]
        }
    };
    // Warm-up (a fifth of the accesses, not measured): the budget fills with what is hot.
    let mut sink = 0u64;
    for _ in 0..a.accesses / 5 {
        let i = pick(&mut rng);
        sink = sink.wrapping_add(touch(i, &mut objs, &mut moved));
    }
    let before = sum(&heaps.stats());
    let t1 = Instant::now();
    for _ in 0..a.accesses {
        let i = pick(&mut rng);
        sink = sink.wrapping_add(touch(i, &mut objs, &mut moved));
    }
    let time = t1.elapsed();
    let after = sum(&heaps.stats());
    std::hint::black_box(sink);
    // Every counter is what the accesses made it.
    for (i, o) in objs.iter().enumerate() {
        // SAFETY: live objects.
        let c = unsafe { (o.ptr.add(8) as *const u64).read_unaligned() };
        assert_eq!(c, counts[i], "counter of object {i}");
    }
    Outcome {
        mode: mode.to_string(),
        fill: fill_time,
        time,
        accesses: a.accesses,
        before,
        after,
        moved,
    }
}

/// The `churn` mode's measured phase: free a random object, allocate a new one of a random
/// size in its place, read it back. Counted as one access each.
fn churn(a: &Args, rng: &mut StdRng, heaps: &Heaps, objs: &mut [Obj], fill: Duration) -> Outcome {
    let h = &heaps.heaps[0];
    let n = objs.len();
    let op = |rng: &mut StdRng, objs: &mut [Obj]| {
        let i = rng.random_range(0..n);
        let size = rng.random_range(64..=512usize);
        // SAFETY: objs[i] is a live block of h, replaced by the new one.
        unsafe {
            h.free(objs[i].ptr).expect("free");
            let p = h.malloc(size).expect("malloc").as_ptr();
            fill_object(p, size, i as u64);
            objs[i] = Obj {
                ptr: p,
                size: size as u32,
                heap: 0,
            };
            access(p, size, i as u64)
        }
    };
    let mut sink = 0u64;
    for _ in 0..a.accesses / 5 {
        sink = sink.wrapping_add(op(rng, objs));
    }
    let before = sum(&heaps.stats());
    let t = Instant::now();
    for _ in 0..a.accesses {
        sink = sink.wrapping_add(op(rng, objs));
    }
    let time = t.elapsed();
    let after = sum(&heaps.stats());
    std::hint::black_box(sink);
    for (i, o) in objs.iter().enumerate() {
        // SAFETY: live objects.
        assert_eq!(unsafe { (o.ptr as *const u64).read_unaligned() }, i as u64);
    }
    Outcome {
        mode: "churn".into(),
        fill,
        time,
        accesses: a.accesses,
        before,
        after,
        moved: 0,
    }
}

fn main() {
    let a = parse();
    println!(
        "objects of 64-512 B, {} MiB of data, budget {} MiB, {:.0}% hot, {:.1}% of accesses to \
         cold objects, {} accesses measured (after {} of warm-up), seed {}",
        a.data >> 20,
        a.budget >> 20,
        a.hot * 100.0,
        a.cold_share * 100.0,
        a.accesses,
        a.accesses / 5,
        a.seed
    );
    println!(
        "| mode | us/access | faults/access | major faults | evictions | resident MiB | pool MiB \
         | store ratio | metadata resident KiB | moved | fill s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for mode in &a.modes {
        let o = run(&a, mode);
        let faults = o.after.faults - o.before.faults;
        println!(
            "| {} | {:.2} | {:.3} | {} | {} | {:.1} | {:.1} | {:.2} | {} | {} | {:.1} |",
            o.mode,
            o.time.as_secs_f64() * 1e6 / o.accesses as f64,
            faults as f64 / o.accesses as f64,
            o.after.major - o.before.major,
            o.after.evictions - o.before.evictions,
            o.after.resident as f64 / (1 << 20) as f64,
            o.after.pool as f64 / (1 << 20) as f64,
            o.after.stored as f64 / o.after.pool.max(1) as f64,
            o.after.meta_resident >> 10,
            o.moved,
            o.fill.as_secs_f64()
        );
    }
}
