//! The stats socket: `<socket dir>/<pid>.sock` in a directory only this user can enter, mode
//! 0600, and a peer credential check on every connection. Each connection gets one JSON line
//! (zmem_runenv::ProcessStats) and is closed. The statistics come from the function the
//! runtime passes in, so this module knows nothing of the runtime; so does a tick the thread
//! runs every half second (the runtime samples its peak figures there).

use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use zmem_runenv::ProcessStats;

/// Starts the server thread; returns the socket's path, or None (with a warning) when it cannot
/// be served: statistics are a convenience, never a reason to stop the program. `stats` gives
/// the reply; None (a forked child that inherited the socket) stops the server.
pub fn start(
    dir: Option<&Path>,
    pid: u32,
    stats: fn() -> Option<ProcessStats>,
    tick: fn(),
) -> Option<PathBuf> {
    let dir = zmem_runenv::socket_dir(dir);
    let (listener, path) = match bind(&dir, pid) {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!("no live statistics (zmem stat): {e}");
            return None;
        }
    };
    // Out of the program's way, like the region's userfaultfd (zmem_os::fds).
    let listener = UnixListener::from(zmem_os::fds::move_high(listener.into()));
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::warn!("no live statistics (zmem stat): {e}");
        return None;
    }
    let spawned = zmem_os::thread::spawn("zmem-stat".into(), move || loop {
        // Wakes for a connection or every TICK_MS, to run `tick` (the run's peak figures).
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, TICK_MS) };
        tick();
        while let Ok((mut conn, _)) = listener.accept() {
            if !same_user(&conn) || conn.set_nonblocking(false).is_err() {
                continue;
            }
            let Some(stats) = stats() else {
                return;
            };
            if let Ok(mut line) = serde_json::to_vec(&stats) {
                line.push(b'\n');
                let _ = conn.write_all(&line);
            }
        }
    });
    match spawned {
        Ok(_) => Some(path),
        Err(e) => {
            tracing::warn!("no live statistics (zmem stat): {e}");
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// How often the server thread runs its tick.
const TICK_MS: i32 = 500;

fn same_user(conn: &UnixStream) -> bool {
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len describe a valid buffer for SO_PEERCRED.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    // SAFETY: getuid cannot fail.
    r == 0 && cred.uid == unsafe { libc::getuid() }
}

/// Binds the stats socket.
fn bind(dir: &Path, pid: u32) -> Result<(UnixListener, PathBuf), String> {
    use std::os::unix::fs::PermissionsExt;
    zmem_runenv::private_dir(dir).map_err(|e| e.to_string())?;
    let path = zmem_runenv::socket_path(dir, pid);
    let _ = std::fs::remove_file(&path); // a stale socket of an earlier process with this pid
    let l = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((l, path))
}
