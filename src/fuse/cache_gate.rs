//! Which opens of a regular file the kernel may cache (docs/DESIGN.md §7b, "Page cache or
//! direct path"). A file's data is either cached by the kernel for the processes that opened it
//! through FUSE, or stored into directly by direct-path clients (the preload library) behind
//! the kernel's back — never both at once, since a direct store would leave a cached copy
//! stale:
//!
//! - an open is *cached* (no `FOPEN_DIRECT_IO`) unless the file is leased to a direct-path
//!   client or the opener belongs to a client's process (whose kernel reads must see its own
//!   direct stores);
//! - a lease is granted only while no cached open of the file is left; one released a moment
//!   ago (the kernel sends RELEASE after close(2) returns) is waited for briefly, and a file
//!   others keep open cached is refused (the client then goes through FUSE for it).
//!
//! Direct-I/O opens may coexist with cached ones: the kernel drops the cached pages a direct-I/O
//! write covers, so both see every write made through FUSE. Cached opens keep the kernel's pages
//! from one open to the next; the channel drops a file's pages when a lease of it ends, before
//! [`CacheGate::unleased`] lets cached opens of it be made again.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a lease waits for cached opens of its file to be released: long enough for the
/// RELEASE of a close(2) that has returned to arrive, short enough that a client refused
/// because another process keeps the file open does not stall noticeably.
pub const RELEASE_WAIT: Duration = Duration::from_millis(50);

/// How the kernel is to treat one open of a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Through the kernel's page cache (counted until released).
    Cached,
    /// Direct I/O: every read and write is a request.
    Direct,
}

/// The cached opens and direct-path leases of every file, and the processes of direct-path
/// clients; shared by the FUSE adapter and the direct-path channel.
#[derive(Default)]
pub struct CacheGate {
    inner: Mutex<Inner>,
    /// Signalled when a file's last cached open goes.
    released: Condvar,
}

#[derive(Default)]
struct Inner {
    /// Process id (thread group) of each connected client, with its number of connections.
    clients: HashMap<u32, u32>,
    /// Files with cached opens or leases.
    files: HashMap<u64, Use>,
}

#[derive(Default, Clone, Copy)]
struct Use {
    cached: u32,
    leases: u32,
}

impl CacheGate {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A direct-path client in process `pid` said hello.
    pub fn client_connected(&self, pid: u32) {
        *self.lock().clients.entry(pid).or_default() += 1;
    }

    /// A connection of the client in process `pid` closed.
    pub fn client_gone(&self, pid: u32) {
        let mut g = self.lock();
        if let Some(n) = g.clients.get_mut(&pid) {
            *n -= 1;
            if *n == 0 {
                g.clients.remove(&pid);
            }
        }
    }

    /// Decide how thread `tid` (the pid a FUSE request carries) opens `ino` with open flags
    /// `flags`, counting a cached open until [`CacheGate::closed`]. As ext4 chooses between
    /// buffered and direct I/O: an open that may read (`O_RDONLY`, `O_RDWR`) is cached, so a
    /// program that reads back what it keeps in a file (a database's pages) is answered from
    /// memory instead of one request per `read(2)`, and its writes still reach winefs before
    /// `write(2)` returns. An open that only writes or appends, and an `O_DIRECT` one, is
    /// direct I/O: such a writer gains nothing from the cache, and direct-I/O writes inside
    /// the file need not hold the kernel's inode lock, so threads writing one file proceed in
    /// parallel. So is every open while the file is leased, and every open by a client.
    pub fn open(&self, ino: u64, tid: u32, flags: i32) -> OpenMode {
        let writes_only = flags & libc::O_ACCMODE == libc::O_WRONLY;
        if writes_only || flags & (libc::O_APPEND | libc::O_DIRECT) != 0 {
            return OpenMode::Direct;
        }
        let mut g = self.lock();
        let leased = g.files.get(&ino).is_some_and(|u| u.leases > 0);
        if leased || is_client_thread(&g.clients, tid) {
            return OpenMode::Direct;
        }
        g.files.entry(ino).or_default().cached += 1;
        OpenMode::Cached
    }

    /// A cached open of `ino` was released.
    pub fn closed(&self, ino: u64) {
        let mut g = self.lock();
        if let Some(u) = g.files.get_mut(&ino) {
            u.cached = u.cached.saturating_sub(1);
            if u.cached == 0 {
                if u.leases == 0 {
                    g.files.remove(&ino);
                }
                self.released.notify_all();
            }
        }
    }

    /// Count a lease of `ino` if no cached open of it is left, waiting up to `wait` for those
    /// there are to be released. False: the file stays cached, no lease.
    pub fn lease(&self, ino: u64, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut g = self.lock();
        loop {
            let u = g.files.entry(ino).or_default();
            if u.cached == 0 {
                u.leases += 1;
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self
                .released
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A lease of `ino` counted by [`CacheGate::lease`] was given back (or never used).
    pub fn unleased(&self, ino: u64) {
        let mut g = self.lock();
        if let Some(u) = g.files.get_mut(&ino) {
            u.leases = u.leases.saturating_sub(1);
            if u.leases == 0 && u.cached == 0 {
                g.files.remove(&ino);
            }
        }
    }
}

/// Whether thread `tid` belongs to the process of a connected client: it is one (a process's
/// first thread has its id), or `/proc/PID/task/TID` exists for one.
fn is_client_thread(clients: &HashMap<u32, u32>, tid: u32) -> bool {
    if clients.is_empty() {
        return false;
    }
    clients.contains_key(&tid)
        || clients
            .keys()
            .any(|pid| std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::ZERO;

    #[test]
    fn a_file_is_cached_or_leased_never_both() {
        let g = CacheGate::default();
        let me = std::process::id();
        // Another process's open is cached, and keeps leases away until released.
        assert_eq!(g.open(7, u32::MAX - 1, libc::O_RDONLY), OpenMode::Cached);
        assert!(!g.lease(7, NOW));
        g.closed(7);
        assert!(g.lease(7, NOW));
        // While leased, every open is direct; other files are unaffected.
        assert_eq!(g.open(7, u32::MAX - 1, libc::O_RDONLY), OpenMode::Direct);
        assert_eq!(g.open(8, u32::MAX - 1, libc::O_RDONLY), OpenMode::Cached);
        g.unleased(7);
        assert_eq!(g.open(7, u32::MAX - 1, libc::O_RDONLY), OpenMode::Cached);
        g.closed(7);
        g.closed(8);
        // A client's process (any of its threads) opens direct and leaves no cached open.
        g.client_connected(me);
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other_thread = std::thread::spawn(move || {
            tx.send(thread_id()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        assert_eq!(g.open(9, me, libc::O_RDONLY), OpenMode::Direct);
        assert_eq!(g.open(9, tid, libc::O_RDONLY), OpenMode::Direct);
        drop(done_tx);
        other_thread.join().unwrap();
        assert!(g.lease(9, NOW));
        g.unleased(9);
        g.client_gone(me);
        assert_eq!(g.open(9, me, libc::O_RDONLY), OpenMode::Cached);
        g.closed(9);
        assert!(g.lock().files.is_empty(), "counts left behind");
    }

    #[test]
    fn a_lease_waits_for_a_release_on_its_way() {
        let g = std::sync::Arc::new(CacheGate::default());
        assert_eq!(g.open(5, u32::MAX - 1, libc::O_RDONLY), OpenMode::Cached);
        let closer = {
            let g = std::sync::Arc::clone(&g);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10));
                g.closed(5);
            })
        };
        assert!(
            g.lease(5, Duration::from_secs(10)),
            "the release was not waited for"
        );
        closer.join().unwrap();
    }

    /// The calling thread's id, read from `/proc/thread-self` (no unsafe code needed).
    fn thread_id() -> u32 {
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        link.file_name().unwrap().to_str().unwrap().parse().unwrap()
    }
}
