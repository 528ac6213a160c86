//! The calling thread's effective capabilities (capget(2)), for choices that depend on
//! privilege without asking for it (e.g. `zmem run`'s default fault route).

/// CAP_SYS_ADMIN: with it, seccomp filters can be installed without `no_new_privs`.
pub const SYS_ADMIN: u32 = 21;

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets in two 32-bit words.
const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Whether capability number `cap` is in the calling thread's effective set. False when the
/// kernel does not answer or `cap` is out of range.
pub fn effective(cap: u32) -> bool {
    if cap >= 64 {
        return false;
    }
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two `Data` words for version 3, which `data` holds.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    };
    r == 0 && data[(cap / 32) as usize].effective & (1 << (cap % 32)) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The effective set as /proc/self/status's CapEff says (hex, 64 bits).
    fn cap_eff() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .expect("CapEff in /proc/self/status");
        u64::from_str_radix(line.trim(), 16).unwrap()
    }

    #[test]
    fn agrees_with_proc_status() {
        let eff = cap_eff();
        for cap in [0, 1, 12, SYS_ADMIN, 31, 32, 38, 40, 63] {
            assert_eq!(effective(cap), eff & (1 << cap) != 0, "capability {cap}");
        }
        assert!(!effective(64));
        assert!(!effective(u32::MAX));
    }
}
