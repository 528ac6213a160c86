//! Anonymous private mappings owned by a guard: the pool's chunks, a region's range and staging
//! area, the benchmarks' working sets. Unmapped on drop unless the owner takes the address over
//! with [`Mapping::into_raw`], so an error between mmap and the point where a structure owns
//! the range never leaks it.

use std::io;
use std::ptr::NonNull;

/// How a mapping is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingFlags {
    /// MAP_NORESERVE: no swap reservation; used for address space larger than its resident use.
    pub noreserve: bool,
    /// MADV_NOHUGEPAGE after the map: keep 4 KiB pages (a huge page would be faulted, counted and
    /// swapped as one). Advisory: a refusal is ignored.
    pub no_huge_pages: bool,
}

impl MappingFlags {
    /// Reserved address space in 4 KiB pages: MAP_NORESERVE and no huge pages.
    pub const RESERVE_SMALL_PAGES: MappingFlags = MappingFlags {
        noreserve: true,
        no_huge_pages: true,
    };
}

/// mmap(2) itself, not the C library's `mmap`: in a program run under `zmem run` that symbol
/// is the preload library's, which places a program thread's anonymous mappings in the
/// compressed region. zmem's own mappings (the pool's chunks, tables) made on a program thread
/// (a free that drops stored pages) landed there, and the region then waited for its own lock
/// to map them (a hang of tests/c/fork_race.c in CI, session 52). Ours never belong there.
///
/// # Safety
/// As mmap(2) with an anonymous mapping (`fd` -1, offset 0).
unsafe fn sys_mmap(
    addr: *mut libc::c_void,
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
) -> *mut libc::c_void {
    // SAFETY: forwarded; the caller upholds mmap's contract.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, -1, 0) as *mut libc::c_void }
}

/// munmap(2) itself (see [`sys_mmap`]).
///
/// # Safety
/// As munmap(2).
unsafe fn sys_munmap(addr: *mut libc::c_void, len: usize) -> libc::c_int {
    // SAFETY: forwarded; the caller upholds munmap's contract.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as libc::c_int }
}

/// An anonymous private read-write mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the guard only holds the range's address; the memory behind it is plain anonymous
// memory whose users synchronise among themselves.
unsafe impl Send for Mapping {}
// SAFETY: as above; &Mapping gives nothing but the address and the length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes (rounded up to whole pages by the kernel) at an address of the kernel's
    /// choosing.
    pub fn new(len: usize, flags: MappingFlags) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a mapping of 0 bytes",
            ));
        }
        let mut map_flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if flags.noreserve {
            map_flags |= libc::MAP_NORESERVE;
        }
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing touches no
        // existing memory; the result is checked before use.
        let p = unsafe {
            sys_mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                map_flags,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned address 0"))?;
        if flags.no_huge_pages {
            // SAFETY: the range is the mapping just made; advice only.
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        }
        Ok(Mapping { ptr, len })
    }

    /// Maps `len` bytes at exactly `addr`, which must be free (MAP_FIXED_NOREPLACE: EEXIST
    /// when anything is mapped there, never a replacement).
    pub fn at(addr: usize, len: usize, flags: MappingFlags) -> io::Result<Mapping> {
        if len == 0 || addr % crate::PAGE_SIZE != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a fixed mapping needs a page-aligned address and a length",
            ));
        }
        let mut map_flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        if flags.noreserve {
            map_flags |= libc::MAP_NORESERVE;
        }
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the result is checked.
        let p = unsafe {
            sys_mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                map_flags,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if p as usize != addr {
            // A kernel older than 4.17 takes the flag as a hint.
            // SAFETY: unmapping what was just mapped.
            unsafe { sys_munmap(p, len) };
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        if flags.no_huge_pages {
            // SAFETY: the range is the mapping just made; advice only.
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast::<u8>()).expect("checked above"),
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives up ownership: the range stays mapped and the caller unmaps it.
    pub fn into_raw(self) -> (NonNull<u8>, usize) {
        let parts = (self.ptr, self.len);
        std::mem::forget(self);
        parts
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once (into_raw forgets the guard).
        unsafe { sys_munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A table of `n` values of `T`, all zero bits at first, in a mapping of its own with
/// MAP_NORESERVE: the kernel maps its pages when first written, so a table sized for a huge
/// region costs DRAM only where it is used, and it is not charged to the commit count either.
/// Allocated zeroed from the heap (calloc) it was: a forked child's snapshot holds two such
/// tables for a 94 GiB heap (~220 MB), glibc's mmaps of them merged into one accounted
/// mapping, and once that passed the machine's memory (about a hundred children alive, or dead
/// ones not yet dropped) every fork of the program failed with ENOMEM (the kernel checks each
/// accounted mapping it copies against RAM + swap).
pub struct ZeroedTable<T> {
    /// The mapping's start (dangling and never read for an empty table).
    ptr: NonNull<T>,
    n: usize,
    /// Unmapped on drop; None for an empty table.
    _map: Option<Mapping>,
}

impl<T> ZeroedTable<T> {
    /// # Safety
    /// All zero bits must be a valid `T` (the table starts that way, never written).
    pub unsafe fn new(n: usize) -> io::Result<ZeroedTable<T>> {
        // Its values are never dropped, only unmapped.
        const { assert!(!std::mem::needs_drop::<T>()) };
        let bytes = n.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "a table larger than memory")
        })?;
        if bytes == 0 {
            return Ok(ZeroedTable {
                ptr: NonNull::dangling(),
                n,
                _map: None,
            });
        }
        let map = Mapping::new(bytes, MappingFlags::RESERVE_SMALL_PAGES)?;
        Ok(ZeroedTable {
            // Page-aligned, so aligned for any T.
            ptr: NonNull::new(map.as_ptr().cast::<T>()).expect("a mapping is never at 0"),
            n,
            _map: Some(map),
        })
    }
}

impl<T> std::ops::Deref for ZeroedTable<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: n values of T from `ptr` (a page-aligned mapping of n * size_of::<T>() bytes,
        // or a dangling pointer with no bytes to read), all zero at first (a valid T, promised
        // by `new`'s caller) and only written through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.n) }
    }
}

impl<T> std::ops::DerefMut for ZeroedTable<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.n) }
    }
}

// SAFETY: the table owns its values like a Box<[T]> does.
unsafe impl<T: Send> Send for ZeroedTable<T> {}
// SAFETY: as above; shared access gives &[T] only.
unsafe impl<T: Sync> Sync for ZeroedTable<T> {}

/// Which pages of `[ptr, ptr + len)` are mapped now (mincore): the indices of those pages,
/// counted from the page holding `ptr`. Memory never touched is not: walking it with reads
/// would map (and fault) every page of a lazily allocated table. None if the kernel refuses
/// (then assume all are).
pub fn pages_in_core(ptr: *const u8, len: usize) -> Option<Vec<usize>> {
    let start = ptr as usize & !(crate::PAGE_SIZE - 1);
    let end = (ptr as usize + len).div_ceil(crate::PAGE_SIZE) * crate::PAGE_SIZE;
    let pages = (end - start) / crate::PAGE_SIZE;
    let mut v = vec![0u8; pages];
    // SAFETY: `v` has one byte per page of the range, which lies in our own mapping.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, end - start, v.as_mut_ptr()) };
    (r == 0).then(|| {
        v.iter()
            .enumerate()
            .filter(|&(_, &b)| b & 1 != 0)
            .map(|(i, _)| i)
            .collect()
    })
}

/// Whether the page holding `addr` is mapped now (mincore; a page of the zero page or one being
/// migrated counts as mapped). None if the kernel refuses (the address is not mapped memory).
/// Allocates nothing: for zmem's fault and eviction paths.
pub fn page_mapped(addr: usize) -> Option<bool> {
    let mut v = 0u8;
    // SAFETY: one page of our own address space; the kernel writes one byte to `v`.
    let r = unsafe {
        libc::mincore(
            (addr & !(crate::PAGE_SIZE - 1)) as *mut libc::c_void,
            crate::PAGE_SIZE,
            &mut v,
        )
    };
    (r == 0).then_some(v & 1 != 0)
}

/// `struct pm_scan_arg` of the PAGEMAP_SCAN ioctl (linux/fs.h, Linux 6.7+).
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`: a run of pages with the same categories.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);
const _: () = assert!(std::mem::size_of::<PageRegion>() == 24);

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = (3 << 30) | (96 << 16) | ((b'f' as libc::c_ulong) << 8) | 16;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_PFNZERO: u64 = 1 << 5;

/// How many pages of the ranges `(ptr, len)` hold memory of their own now: present and not
/// the kernel's shared zero page. A range mapped ahead with zero pages costs no DRAM until it
/// is written, and this counts only what was written (the pagemap's PAGEMAP_SCAN, Linux 6.7+;
/// an error on older kernels). One open of the pagemap for all the ranges. No allocation and
/// no libc text: safe on zmem's threads.
pub fn written_pages(ranges: &[(*const u8, usize)]) -> io::Result<usize> {
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/pagemap".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let result = ranges.iter().try_fold(0usize, |sum, &(ptr, len)| {
        scan_written(fd, ptr, len).map(|n| sum + n)
    });
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(fd) };
    result
}

/// [`written_pages`] of one range, through the open pagemap `fd`.
fn scan_written(fd: libc::c_int, ptr: *const u8, len: usize) -> io::Result<usize> {
    let page = crate::PAGE_SIZE as u64;
    let start = ptr as u64 & !(page - 1);
    let end = (ptr as u64 + len as u64).div_ceil(page) * page;
    let mut regions = [PageRegion::default(); 64];
    let mut pages = 0usize;
    let mut at = start;
    while at < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start: at,
            end,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            category_inverted: PAGE_IS_PFNZERO,
            category_mask: PAGE_IS_PRESENT | PAGE_IS_PFNZERO,
            category_anyof_mask: 0,
            return_mask: PAGE_IS_PRESENT,
        };
        // SAFETY: `arg` and `regions` outlive the call; the kernel writes at most vec_len
        // regions and `walk_end`.
        let n = unsafe { libc::ioctl(fd, PAGEMAP_SCAN, &mut arg as *mut PmScanArg) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for r in &regions[..n as usize] {
            pages += ((r.end - r.start) / page) as usize;
        }
        if arg.walk_end <= at {
            break; // no progress: never loop forever on a kernel quirk
        }
        at = arg.walk_end;
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_pages_counts_written_pages_not_zero_pages() {
        let n = 64;
        let m = Mapping::new(n * crate::PAGE_SIZE, MappingFlags::RESERVE_SMALL_PAGES).unwrap();
        assert_eq!(written_pages(&[(m.as_ptr(), m.len())]).unwrap(), 0);
        // SAFETY: inside the mapping just made.
        let s = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) };
        // Reads map the shared zero page: still nothing of their own.
        let mut sum = 0u64;
        for p in 0..n {
            sum += std::hint::black_box(s[p * crate::PAGE_SIZE]) as u64;
        }
        assert_eq!(sum, 0);
        assert_eq!(written_pages(&[(m.as_ptr(), m.len())]).unwrap(), 0);
        for p in (0..n).step_by(3) {
            s[p * crate::PAGE_SIZE + 1] = 1;
        }
        assert_eq!(
            written_pages(&[(m.as_ptr(), m.len())]).unwrap(),
            n.div_ceil(3)
        );
        // A sub-range, starting inside a page.
        // SAFETY: inside the mapping.
        let sub = unsafe { m.as_ptr().add(crate::PAGE_SIZE + 7) };
        assert_eq!(written_pages(&[(sub, 5 * crate::PAGE_SIZE)]).unwrap(), 2); // pages 3 and 6 of 1..=6
    }

    #[test]
    fn maps_zeroed_writable_memory_and_unmaps_on_drop() {
        let m = Mapping::new(3 * crate::PAGE_SIZE, MappingFlags::RESERVE_SMALL_PAGES).unwrap();
        // SAFETY: inside the mapping just made.
        let s = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) };
        assert!(s.iter().all(|&b| b == 0));
        s[crate::PAGE_SIZE + 5] = 7;
        assert_eq!(s[crate::PAGE_SIZE + 5], 7);
        let addr = m.addr();
        drop(m);
        // The range is gone: mincore on it fails with ENOMEM.
        let mut vec = [0u8; 3];
        // SAFETY: mincore only reports on the range; it does not touch it.
        let rc = unsafe { libc::mincore(addr as *mut _, 3 * crate::PAGE_SIZE, vec.as_mut_ptr()) };
        assert_eq!(rc, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOMEM)
        );
    }

    #[test]
    fn into_raw_keeps_the_range() {
        let m = Mapping::new(crate::PAGE_SIZE, MappingFlags::default()).unwrap();
        let (p, len) = m.into_raw();
        let mut vec = [0u8; 1];
        // SAFETY: mincore only reports on the range.
        let rc = unsafe { libc::mincore(p.as_ptr().cast(), len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: the range into_raw handed over, unmapped once.
        unsafe { libc::munmap(p.as_ptr().cast(), len) };
    }

    /// The smaps "VmFlags" line of the mapping that holds `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.trim().to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn a_zeroed_table_reads_zeros_keeps_writes_and_is_not_charged() {
        // SAFETY: zero is a valid u64.
        let mut t = unsafe { ZeroedTable::<u64>::new(1 << 20) }.unwrap();
        assert_eq!(t.len(), 1 << 20);
        assert!(t.iter().step_by(4096).all(|&v| v == 0));
        t[0] = 7;
        t[(1 << 20) - 1] = 9;
        assert_eq!((t[0], t[(1 << 20) - 1], t[12345]), (7, 9, 0));
        // Not charged to the commit count ("ac"), reserved without it ("nr"): the tables of a
        // hundred forked children's snapshots failed every fork with ENOMEM when they were.
        let flags = vm_flags(t.as_ptr() as usize);
        let flags: Vec<&str> = flags.split_whitespace().collect();
        assert!(flags.contains(&"nr") && !flags.contains(&"ac"), "{flags:?}");
        // SAFETY: as above.
        let empty = unsafe { ZeroedTable::<u64>::new(0) }.unwrap();
        assert!(empty.is_empty());
        // SAFETY: as above.
        assert!(unsafe { ZeroedTable::<u64>::new(usize::MAX) }.is_err());
    }

    #[test]
    fn zero_length_is_an_error() {
        let e = Mapping::new(0, MappingFlags::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn only_touched_pages_are_in_core() {
        let m = Mapping::new(64 * crate::PAGE_SIZE, MappingFlags::RESERVE_SMALL_PAGES).unwrap();
        // SAFETY: writing inside our own mapping.
        unsafe {
            *m.as_ptr() = 1;
            *m.as_ptr().add(10 * crate::PAGE_SIZE + 5) = 1;
        }
        assert_eq!(pages_in_core(m.as_ptr(), m.len()), Some(vec![0, 10]));
        // From the page holding an unaligned start.
        // SAFETY: inside the mapping.
        let inner = unsafe { m.as_ptr().add(9 * crate::PAGE_SIZE + 100) };
        assert_eq!(pages_in_core(inner, 2 * crate::PAGE_SIZE), Some(vec![1]));
    }
}
