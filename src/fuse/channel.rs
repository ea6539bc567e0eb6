//! The daemon's side of the direct path (docs/DESIGN.md §7b): a Unix socket in the abstract
//! namespace, named by the virtual xattr [`proto::CHANNEL_XATTR`], through which the preload
//! library of a process on the mount asks for the pool, the size board and leases on ranges of
//! files. One thread per connection answers its requests in order; when the connection closes
//! (the client unmapped everything, exited or was killed) its leases are given back.
//!
//! Trust: only the pool's owner and root may connect usefully (their `SO_PEERCRED` user is
//! checked); they could open the pool file themselves anyway. Everyone else gets `EPERM` to
//! their hello and keeps using FUSE.

use crate::Fs;
use crate::fuse::cache_gate::{CacheGate, RELEASE_WAIT};
use crate::fuse::proto::{self, MapReply};
use crate::sys;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use crate::fuse::{invalidate_attributes, invalidate_data};
use fuser::Notifier;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a new channel waits for its name, which the last daemon of the same pool may
/// still hold for a moment after it let the pool go.
const NAME_WAIT: Duration = Duration::from_secs(2);

/// Listen on the abstract socket `name`, waiting up to [`NAME_WAIT`] while it is taken.
fn bind_waiting(name: &str) -> io::Result<UnixListener> {
    let addr = SocketAddr::from_abstract_name(name)?;
    let deadline = Instant::now() + NAME_WAIT;
    loop {
        match UnixListener::bind_addr(&addr) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if Instant::now() >= deadline {
                    return Err(io::Error::other(format!("the channel name {name} is taken by another process")));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// A running channel.
pub struct Channel {
    name: String,
    listener: UnixListener,
    stopping: AtomicBool,
    /// Live connections (to shut them down at unmount) by connection number.
    conns: Mutex<HashMap<u64, UnixStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Channel {
    /// Listen for clients of `fs`; `gate` (the FUSE adapter's) learns their processes and
    /// grants their leases only on files no open caches.
    pub fn start(
        fs: Arc<Fs>,
        notifier: Arc<OnceLock<Notifier>>,
        gate: Arc<CacheGate>,
    ) -> io::Result<Arc<Channel>> {
        fs.check_direct_path().map_err(io::Error::other)?;
        let (dev, ino) = fs.pool_file_id().map_err(io::Error::other)?;
        let name = proto::channel_name(dev, ino);
        let listener = bind_waiting(&name)?;
        let ch = Arc::new(Channel {
            name,
            listener,
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let owner = fs.pool_owner().map_err(io::Error::other)?;
        let c = Arc::clone(&ch);
        let accept = std::thread::Builder::new()
            .name("winefs-channel".into())
            .spawn(move || c.accept_loop(&fs, owner, &notifier, &gate))?;
        ch.lock_threads().push(accept);
        Ok(ch)
    }

    /// The socket's abstract name (without the leading NUL), the value of the xattr.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock_threads(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, UnixStream>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Close the channel: no new clients, every connection shut down (clients see the daemon
    /// go and stop using the pool), every lease given back. Returns when all its threads are
    /// done, so none still holds the mount.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        sys::shutdown_socket(self.listener.as_raw_fd());
        for c in self.lock_conns().values() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        loop {
            let Some(t) = self.lock_threads().pop() else {
                break;
            };
            let _ = t.join();
        }
    }

    fn accept_loop(
        self: &Arc<Channel>,
        fs: &Arc<Fs>,
        owner: u32,
        notifier: &Arc<OnceLock<Notifier>>,
        gate: &Arc<CacheGate>,
    ) {
        let mut id = 0u64;
        for conn in self.listener.incoming() {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let conn = match conn {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("direct-path channel: accept: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            id += 1;
            let (trusted, pid) = match sys::peer_cred(conn.as_raw_fd()) {
                Ok((uid, pid)) => (uid == 0 || uid == owner, pid),
                Err(e) => {
                    log::warn!("direct-path channel: {e}");
                    (false, 0)
                }
            };
            if let Ok(c) = conn.try_clone() {
                self.lock_conns().insert(id, c);
            }
            let (ch, fs, notifier, gate) =
                (Arc::clone(self), Arc::clone(fs), Arc::clone(notifier), Arc::clone(gate));
            let t = std::thread::Builder::new()
                .name(format!("winefs-direct-{id}"))
                .spawn(move || {
                    let mut session = Session {
                        fs: &fs,
                        notifier: &notifier,
                        gate: &gate,
                        pid,
                        greeted: false,
                        leases: HashMap::new(),
                        next_lease: 0,
                    };
                    if let Err(e) = session.serve(conn, trusted) {
                        log::debug!("direct-path client {id}: {e}");
                    }
                    session.end();
                    ch.lock_conns().remove(&id);
                });
            match t {
                Ok(t) => self.lock_threads().push(t),
                Err(e) => log::warn!("direct-path channel: cannot start a thread: {e}"),
            }
        }
    }
}

/// One client connection and the leases it holds.
struct Session<'a> {
    fs: &'a Fs,
    /// The FUSE session's notifier, once it exists (to drop the kernel's cached attributes).
    notifier: &'a OnceLock<Notifier>,
    /// Where leases are weighed against cached opens, and the client's process is known.
    gate: &'a CacheGate,
    /// The client's process (its opens through FUSE are direct I/O once it said hello).
    pid: u32,
    /// Whether a hello or announcement succeeded (the process is then known to the gate).
    greeted: bool,
    /// Lease number → (inode, whether an append lease).
    leases: HashMap<u64, (u64, bool)>,
    next_lease: u64,
}

impl Session<'_> {
    fn serve(&mut self, mut conn: UnixStream, trusted: bool) -> io::Result<()> {
        loop {
            let mut head = [0u8; 8];
            match conn.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            let (op, len) = proto::parse_head(head);
            if len > 64 {
                return Err(io::Error::other(format!("request payload of {len} bytes")));
            }
            let mut payload = vec![0u8; len as usize];
            conn.read_exact(&mut payload)?;
            match op {
                proto::OP_HELLO => self.hello(&mut conn, &payload, trusted)?,
                proto::OP_ANNOUNCE => self.announce(&mut conn, &payload, trusted)?,
                _ if !trusted => return Err(io::Error::other("request before a hello")),
                proto::OP_MAP => {
                    let reply = match proto::decode_map(&payload) {
                        None => Err(libc::EINVAL),
                        Some((ino, off, len, flags)) => self.map(ino, off, len, flags),
                    };
                    match reply {
                        Ok(r) => conn.write_all(&proto::frame(0, &proto::encode_map_reply(&r)))?,
                        Err(errno) => conn.write_all(&proto::frame(errno as u32, &[]))?,
                    }
                }
                proto::OP_UNMAP => {
                    let status = match proto::u64_at(&payload, 0).and_then(|l| self.leases.remove(&l)) {
                        None => libc::EINVAL,
                        Some((ino, append)) => self.unlease(ino, append).err().map_or(0, |e| e.errno()),
                    };
                    conn.write_all(&proto::frame(status as u32, &[]))?;
                }
                _ => conn.write_all(&proto::frame(libc::EOPNOTSUPP as u32, &[]))?,
            }
        }
    }

    /// The client's process will use the direct path: its opens are direct I/O from now on
    /// (until the connection closes). Only for those that may lease at all.
    fn announce(&mut self, conn: &mut UnixStream, payload: &[u8], trusted: bool) -> io::Result<()> {
        let version = payload.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let status = match (trusted, version == Some(proto::VERSION)) {
            (false, _) => libc::EPERM,
            (true, false) => libc::EPROTO,
            (true, true) => {
                self.greet();
                0
            }
        };
        conn.write_all(&proto::frame(status as u32, &[]))
    }

    /// Make the client's process known to the gate (once per connection).
    fn greet(&mut self) {
        if !self.greeted {
            log::debug!("direct-path client: process {} is known", self.pid);
            self.gate.client_connected(self.pid);
            self.greeted = true;
        }
    }

    fn hello(&mut self, conn: &mut UnixStream, payload: &[u8], trusted: bool) -> io::Result<()> {
        let version = payload.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if !trusted {
            conn.write_all(&proto::frame(libc::EPERM as u32, &[]))?;
            return Err(io::Error::other("refused: not the pool's owner or root"));
        }
        if version != Some(proto::VERSION) {
            conn.write_all(&proto::frame(libc::EPROTO as u32, &[]))?;
            return Err(io::Error::other(format!("protocol version {version:?}")));
        }
        let (board, board_len) = match self.fs.size_board() {
            Ok(b) => b,
            Err(e) => {
                conn.write_all(&proto::frame(e.errno() as u32, &[]))?;
                return Err(io::Error::other(e.to_string()));
            }
        };
        let pool_len = self.fs.geometry().pool_size;
        let body: Vec<u8> = [pool_len, board_len].iter().flat_map(|x| x.to_le_bytes()).collect();
        let fds: [RawFd; 2] = [self.fs.pool_fd(), board];
        self.greet();
        sys::send_with_fds(conn.as_raw_fd(), &proto::frame(0, &body), &fds)
    }

    fn map(&mut self, ino: u64, off: u64, len: u64, flags: u64) -> Result<MapReply, i32> {
        // A process with the file open through the kernel's page cache would not see the
        // client's stores: no lease then (the client goes through FUSE for it).
        if !self.gate.lease(ino, RELEASE_WAIT) {
            return Err(libc::EBUSY);
        }
        let reply = self.lease(ino, off, len, flags);
        if reply.is_err() {
            self.gate.unleased(ino);
        }
        reply
    }

    fn lease(&mut self, ino: u64, off: u64, len: u64, flags: u64) -> Result<MapReply, i32> {
        let append = flags & proto::MAP_APPEND != 0;
        let l = if append {
            let l = self.fs.lease_append(ino, off, len);
            // The size now changes without a request: the kernel's cached attributes go.
            self.attributes_changed(ino);
            l
        } else if flags & proto::MAP_NO_FILL == 0 {
            let l = self.fs.lease(ino, off, len, true);
            // Filling holes changes the blocks the file holds (`st_blocks`) without a request.
            self.attributes_changed(ino);
            l
        } else {
            let l = self.fs.lease(ino, off, len, false);
            // Its times now change without a request (direct writes, taken at the next look).
            self.attributes_changed(ino);
            l
        };
        let l = l.map_err(|e| e.errno())?;
        self.next_lease += 1;
        self.leases.insert(self.next_lease, (ino, append));
        Ok(MapReply {
            lease: self.next_lease,
            size: l.size,
            flags: if l.privileged { proto::LEASE_PRIVILEGED } else { 0 },
            extents: l
                .extents
                .iter()
                .map(|&(f, p, n)| proto::Extent {
                    file_block: f,
                    pool_block: p,
                    blocks: n,
                })
                .collect(),
        })
    }

    /// Give back a lease; after an append lease the kernel's cached attributes go (the size
    /// the client reached is the file's now).
    fn unlease(&self, ino: u64, append: bool) -> crate::Result<()> {
        // Pages the kernel holds of the file (a mapping's through FUSE) may have missed the
        // client's stores; they go while the lease still keeps every open direct I/O, so no
        // cached open keeps them (opens keep the cache, `FOPEN_KEEP_CACHE`).
        invalidate_data(self.notifier, ino);
        self.gate.unleased(ino);
        if !append {
            return self.fs.unlease(ino);
        }
        let r = self.fs.unlease_append(ino);
        self.attributes_changed(ino);
        r
    }

    fn attributes_changed(&self, ino: u64) {
        invalidate_attributes(self.notifier, ino);
    }

    /// The connection is gone: every lease it still holds goes back, and its process is no
    /// longer a client's.
    fn end(&mut self) {
        let leases: Vec<(u64, bool)> = self.leases.drain().map(|(_, l)| l).collect();
        for (ino, append) in leases {
            if let Err(e) = self.unlease(ino, append) {
                log::warn!("giving back a lease of inode {ino}: {e}");
            }
        }
        if self.greeted {
            self.gate.client_gone(self.pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_name_is_waited_for_while_its_last_holder_lets_go_and_refused_if_it_does_not() {
        let name = format!("winefs.test.{}.name", std::process::id());
        let holder = bind_waiting(&name).unwrap();
        let start = Instant::now();
        let err = bind_waiting(&name).unwrap_err();
        assert!(err.to_string().contains("is taken by another process"), "{err}");
        assert!(start.elapsed() >= NAME_WAIT, "refused before the wait was up");
        // Let go while another waits: the waiter gets the name.
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(holder);
        });
        let listener = bind_waiting(&name).unwrap();
        letting_go.join().unwrap();
        drop(listener);
    }
}
