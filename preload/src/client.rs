//! One connection to a mount's daemon (docs/DESIGN.md §7b): the hello that brings the pool and
//! the size board, map and unmap requests, and a watcher thread that revokes every direct
//! mapping of the mount the moment the daemon goes away.

use crate::proto::{self, MapReply};
use crate::size_word;
use crate::sys::{self, Errno};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// A connected client of one mount.
pub struct Client {
    /// Device number of the mount.
    pub dev: u64,
    sock: i32,
    /// One request and its reply at a time.
    talk: Mutex<()>,
    /// The pool, shared with the daemon (and its lock: the pool cannot be mounted again while
    /// this process maps it).
    pub pool_fd: i32,
    /// The pool open read-only (-1 if it could not be): the mappings of a file opened
    /// read-only are made from it, so `mprotect` cannot make them writable, as the kernel
    /// refuses for the file's own mapping.
    pub pool_ro_fd: i32,
    /// The size board, mapped shared (its size words grow by this client's direct appends).
    board: usize,
    board_len: usize,
    /// The process that connected (a forked child makes its own connection).
    pub pid: u32,
    /// The daemon went away: nothing of this mount goes direct any more.
    pub dead: AtomicBool,
}

impl Client {
    /// Connect to the channel named `name` and say hello.
    pub fn connect(dev: u64, name: &[u8]) -> Result<Client, Errno> {
        let sock = sys::connect_abstract(name)?;
        let fail = |e| {
            sys::next_close(sock);
            Err(e)
        };
        if let Err(e) = sys::send_all(sock, &proto::frame(proto::OP_HELLO, &proto::VERSION.to_le_bytes())) {
            return fail(e);
        }
        let mut fds = Vec::new();
        let mut head = [0u8; 8];
        if let Err(e) = sys::recv_exact(sock, &mut head, &mut fds) {
            return fail(e);
        }
        let (status, len) = proto::parse_head(head);
        let mut body = vec![0u8; len.min(64) as usize];
        if status != 0 || len != 16 || sys::recv_exact(sock, &mut body, &mut fds).is_err() || fds.len() != 2 {
            for fd in fds {
                sys::next_close(fd);
            }
            return fail(if status != 0 { status as Errno } else { libc::EPROTO });
        }
        let board_len = proto::u64_at(&body, 1).unwrap_or(0) as usize;
        let board = match sys::sys_mmap(0, board_len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fds[1], 0) {
            Ok(a) => a,
            Err(e) => {
                for fd in fds {
                    sys::next_close(fd);
                }
                return fail(e);
            }
        };
        sys::next_close(fds[1]);
        Ok(Client {
            dev,
            sock,
            talk: Mutex::new(()),
            pool_fd: fds[0],
            pool_ro_fd: sys::reopen_read_only(fds[0]).unwrap_or(-1),
            board,
            board_len,
            pid: sys::pid(),
            dead: AtomicBool::new(false),
        })
    }

    /// Tell the daemon of the channel named `name` that this process is a client (see
    /// `direct::announce_to_mounts`). The connection is kept open, unused, for the life of the
    /// process (it is closed on exec): the daemon forgets the process when it closes. Best
    /// effort: a daemon that refuses, or knows no such request, is left alone, and so is a
    /// listener that runs as neither root nor `owner` (the pool's owner, who alone besides
    /// root may serve it): the name is made from the pool, so anyone could take it.
    pub fn announce(name: &[u8], owner: u32) {
        let Ok(sock) = sys::connect_abstract(name) else { return };
        if !sys::peer_uid(sock).is_ok_and(|uid| uid == 0 || uid == owner) {
            sys::next_close(sock);
            return;
        }
        let mut head = [0u8; 8];
        let mut fds = Vec::new();
        let told = sys::send_all(sock, &proto::frame(proto::OP_ANNOUNCE, &proto::VERSION.to_le_bytes()))
            .and_then(|()| sys::recv_exact(sock, &mut head, &mut fds));
        for fd in fds {
            sys::next_close(fd);
        }
        if told.is_err() || proto::parse_head(head) != (0, 0) {
            sys::next_close(sock);
        }
    }

    /// Send one request and read its reply: (status, payload).
    fn request(&self, op: u32, payload: &[u8]) -> Result<Vec<u8>, Errno> {
        if self.dead.load(Ordering::Acquire) {
            return Err(libc::ENOTCONN);
        }
        let _g = self.talk.lock().unwrap_or_else(|e| e.into_inner());
        sys::send_all(self.sock, &proto::frame(op, payload))?;
        let mut head = [0u8; 8];
        let mut fds = Vec::new();
        sys::recv_exact(self.sock, &mut head, &mut fds)?;
        let (status, len) = proto::parse_head(head);
        if len > proto::MAX_PAYLOAD {
            return Err(libc::EPROTO);
        }
        let mut body = vec![0u8; len as usize];
        sys::recv_exact(self.sock, &mut body, &mut fds)?;
        for fd in fds {
            sys::next_close(fd);
        }
        if status != 0 {
            return Err(status as Errno);
        }
        Ok(body)
    }

    /// Lease [off, off+len) of inode `ino` (`fill`: holes inside the file are filled).
    pub fn map(&self, ino: u64, off: u64, len: u64, fill: bool) -> Result<MapReply, Errno> {
        let flags = if fill { 0 } else { proto::MAP_NO_FILL };
        let body = self.request(proto::OP_MAP, &proto::encode_map(ino, off, len, flags))?;
        proto::decode_map_reply(&body).ok_or(libc::EPROTO)
    }

    /// An append lease of [off, off+len) of inode `ino`: every block allocated, past the end
    /// of the file too; this client may grow the size ([`Client::grow`]) until it gives it back.
    pub fn map_append(&self, ino: u64, off: u64, len: u64) -> Result<MapReply, Errno> {
        let body = self.request(proto::OP_MAP, &proto::encode_map(ino, off, len, proto::MAP_APPEND))?;
        proto::decode_map_reply(&body).ok_or(libc::EPROTO)
    }

    /// Give lease `lease` back.
    pub fn unmap(&self, lease: u64) {
        let _ = self.request(proto::OP_UNMAP, &lease.to_le_bytes());
    }

    /// (size, layout generation) of leased inode `ino` now.
    pub fn board(&self, ino: u64) -> Option<(u64, u64)> {
        self.board_word(ino).map(|(w, g)| (size_word::size(w), g))
    }

    /// (size word, layout generation) of leased inode `ino` now.
    pub fn board_word(&self, ino: u64) -> Option<(u64, u64)> {
        let at = self.board_at(ino)?;
        Some((sys::load_u64(self.board + at), size_word::generation(sys::load_u64(self.board + at + 8))))
    }

    /// After a direct write of leased inode `ino`: flag it (`size_word::WRITTEN`), so the daemon
    /// gives it new modification and change times at its next look, as a `write(2)` would.
    pub fn mark_written(&self, ino: u64) {
        let Some(at) = self.board_at(ino) else { return };
        loop {
            let w = sys::load_u64(self.board + at + 8);
            if w & size_word::WRITTEN != 0 || sys::cas_u64(self.board + at + 8, w, w | size_word::WRITTEN) {
                return;
            }
        }
    }

    fn board_at(&self, ino: u64) -> Option<usize> {
        let at = usize::try_from(ino).ok()?.checked_mul(16)?;
        (at + 16 <= self.board_len).then_some(at)
    }

    /// After storing bytes up to `end` of inode `ino` (held under an append lease) that the
    /// size word `seen` (read before the store) did not cover: grow the size to `end`. False
    /// when the daemon froze or republished the word since `seen` — it may have changed the
    /// file's size or blocks meanwhile, and the write must go through FUSE instead.
    pub fn grow(&self, ino: u64, seen: u64, end: u64) -> bool {
        let Some(at) = self.board_at(ino) else { return false };
        let mut w = seen;
        loop {
            let Some(new) = size_word::grown(w, end) else { return false };
            if new == w || sys::cas_u64(self.board + at, w, new) {
                return true;
            }
            // Another appender's swap (same sequence number) is no reason to give up.
            let now = sys::load_u64(self.board + at);
            if size_word::frozen(now) || !size_word::same_epoch(now, seen) {
                return false;
            }
            w = now;
        }
    }

    /// Block until the daemon hangs up.
    pub fn wait_hangup(&self) {
        sys::wait_hangup(self.sock);
    }
}
