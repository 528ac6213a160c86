#!/usr/bin/env python3
"""A model of zmem-pool's size classes (crates/pool/src/class.rs: 16-byte classes, spans of
1..max_span_pages pages chosen for a tail waste of at most 1/div, merged classes of the same
geometry) on a list of compressed object sizes, one per line.

  pool-overhead-sim.py pages SIZES   # single 4 KiB pages (zstd -1/-2/-3 of each Calgary page),
                                     # repeated to 512 MiB as `zmem bench compare` writes them
  pool-overhead-sim.py blocks SIZES  # 64 KiB blocks (zstd -3 of 512 MiB of Calgary, cut in 64k)

Session 50: pages (zstd-1) 2.275 by memory against 2.269 measured; blocks 3.5% over the bytes."""
import collections, sys
PAGE = 4096

def span_range(size, maxp):
    minp = max(1, -(-size // PAGE))
    if size <= PAGE:
        return minp, maxp
    return minp, max(maxp, min(4 * minp, 128), minp)

def choose(size, maxp=16, div=64):
    lo, hi = span_range(size, maxp)
    best = None
    for p in range(lo, hi + 1):
        span = p * PAGE
        objs = span // size
        w = span - objs * size
        if objs == 0 or objs > 8192:
            continue
        if w * div <= span:
            return (p, objs)
        if best is None or w * best[1] < best[0] * span:
            best = (w, span, p, objs)
    return (best[2], best[3])

def memory(classes, maxp=16, div=64):
    """Bytes of spans for `classes` (class size -> objects): classes of one geometry share spans."""
    geo = collections.Counter()
    for cs, n in classes.items():
        geo[choose(cs, maxp, div)] += n
    full = sum(n * p * PAGE / o for (p, o), n in geo.items())
    return sum(-(-n // o) * p * PAGE for (p, o), n in geo.items()), full

def report(name, sizes, orig, rounding=16, maxp=16, div=64):
    classes = collections.Counter(-(-s // rounding) * rounding for s in sizes)
    mem, full = memory(classes, maxp, div)
    ob = sum(sizes)
    print(f"{name}: {rounding}-byte classes, spans <= {maxp} pages, tails <= 1/{div}: "
          f"overhead {(mem / ob - 1) * 100:.2f}% (full spans {(full / ob - 1) * 100:.2f}%), "
          f"ratio by memory {orig / mem:.3f}, by bytes {orig / ob:.3f}")

mode, path = sys.argv[1], sys.argv[2]
sizes = [int(x) for x in open(path)]
if mode == "pages":
    reps = 512 * 1024 * 1024 // (len(sizes) * PAGE)
    sizes = [min(s, PAGE) for s in sizes] * reps
    for rounding, maxp, div in [(16, 16, 64), (16, 16, 128), (16, 16, 256), (16, 32, 256), (8, 16, 64), (8, 16, 256)]:
        report("pages", sizes, len(sizes) * PAGE, rounding, maxp, div)
else:
    orig = len(sizes) * 65536
    for div in (64, 256):
        report("blocks", sizes, orig, 16, 16, div)
    # A block stored as its whole pages (no waste) plus its tail as a small object.
    tails = collections.Counter(-(-(s % PAGE) // 16) * 16 for s in sizes if s % PAGE)
    mem = sum(s // PAGE * PAGE for s in sizes) + memory(tails)[0]
    print(f"blocks as whole pages + tail: overhead {(mem / sum(sizes) - 1) * 100:.2f}%, "
          f"ratio by memory {orig / mem:.3f}")
