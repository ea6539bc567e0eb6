//! The copies and stores under the pool's accessors (`media::pool`): reads into a caller's
//! buffer, non-temporal stores of whole lines, and the ordered stores that let recovery tell a
//! journal line a crash caught being written from a damaged one. Nothing here checks bounds;
//! every caller is a `Pool` method that did.
#![allow(unsafe_code)] // raw copies into and out of the mapping (one of the few such modules)
#![deny(clippy::cast_possible_truncation)]

use std::sync::atomic::{Ordering, fence};

/// A cache line (`pool::CACHE_LINE`, which checks the two agree; not imported, which would
/// make the two files a cycle).
pub(crate) const CACHE_LINE: u64 = 64;

/// A pool offset or length as a `usize`, for pointer arithmetic. Callers pass only values within
/// the mapping (bounds-checked against `Pool::len`) or within a slice, and `Pool::map` checked
/// that the mapping's length fits a `usize`, so this cannot fail.
pub(crate) fn ix(v: u64) -> usize {
    usize::try_from(v).expect("offsets inside the mapping fit a usize")
}

/// Where `persist_from` takes its bytes.
#[derive(Clone, Copy)]
pub(crate) enum PersistSrc<'a> {
    Bytes(&'a [u8]),
    /// `len` bytes at a pool offset (bounds-checked, not overlapping the destination).
    Pool(u64, u64),
    Zero(u64),
}

impl PersistSrc<'_> {
    pub(crate) fn len(&self) -> u64 {
        match self {
            PersistSrc::Bytes(b) => b.len() as u64,
            PersistSrc::Pool(_, n) | PersistSrc::Zero(n) => *n,
        }
    }

    /// Ordinary stores of source bytes `from..from+n` to `base + dst`.
    pub(crate) fn copy_to(&self, base: *mut u8, dst: u64, from: u64, n: u64) {
        // SAFETY: callers pass a destination inside the bounds-checked range and `from + n`
        // within the source length; sources never overlap the destination.
        unsafe {
            let d = base.add(ix(dst));
            match self {
                PersistSrc::Bytes(b) => {
                    std::ptr::copy_nonoverlapping(b.as_ptr().add(ix(from)), d, ix(n))
                }
                PersistSrc::Pool(s, _) => {
                    std::ptr::copy_nonoverlapping(base.add(ix(s + from)), d, ix(n))
                }
                PersistSrc::Zero(_) => std::ptr::write_bytes(d, 0, ix(n)),
            }
        }
    }
}

/// Copies of this many bytes up to [`VECTOR_COPY_MAX`] use [`copy_avx2`] where the CPU has
/// AVX2. glibc copies such sizes with `rep movsb` on CPUs that advertise fast short `rep movsb`
/// (FSRM), unless the destination sits just past the source's offset in a page; on this
/// project's test machine that ran at 55-60% of the speed of plain 32-byte vector moves for
/// 2-4 KiB (4 KiB from a shared mapping: 21.9 against 36.2 GB/s), level at 16 KiB, and from
/// 32 KiB up glibc's own copy was the faster (docs/BENCHMARKS.md, "Reads into aligned buffers").
const VECTOR_COPY_MIN: usize = 512;
/// See [`VECTOR_COPY_MIN`].
pub(crate) const VECTOR_COPY_MAX: usize = 16 << 10;

/// Copy `len` bytes from pool address `src` to `dst`.
///
/// # Safety
/// `src..src + len` and `dst..dst + len` must be valid for reads and writes respectively and
/// must not overlap.
pub(crate) unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if (VECTOR_COPY_MIN..=VECTOR_COPY_MAX).contains(&len) && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the caller's contract, and the CPU has AVX2 (checked just above).
        unsafe { copy_avx2(src, dst, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// [`copy_out`] in 128-byte steps of four unaligned 32-byte loads and stores, the rest by
/// `copy_nonoverlapping`.
///
/// # Safety
/// As [`copy_out`]'s, and the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let mut i = 0;
    while i + 128 <= len {
        // SAFETY: `i + 128 <= len`, so all four 32-byte loads and stores lie inside the
        // caller's ranges; the unaligned forms need no alignment.
        unsafe {
            let s = src.add(i).cast::<__m256i>();
            let d = dst.add(i).cast::<__m256i>();
            let (a, b) = (_mm256_loadu_si256(s), _mm256_loadu_si256(s.add(1)));
            let (c, e) = (_mm256_loadu_si256(s.add(2)), _mm256_loadu_si256(s.add(3)));
            _mm256_storeu_si256(d, a);
            _mm256_storeu_si256(d.add(1), b);
            _mm256_storeu_si256(d.add(2), c);
            _mm256_storeu_si256(d.add(3), e);
        }
        i += 128;
    }
    // SAFETY: `i <= len`: the rest lies inside the caller's ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
}

/// Store the bytes of `src` that belong at pool offsets `a..b` (whole lines; `src` starts at
/// pool offset `off`) with one non-temporal 64-byte store per line.
///
/// # Safety
/// The processor has AVX-512F; `a..b` is 64-byte aligned and inside the mapping at `base`, and
/// no Rust reference aliases it; `src` covers `off..off + src.len()` ⊇ `a..b` and, when it is a
/// pool range, does not overlap `a..b`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn stream_src_lines(base: *mut u8, a: u64, b: u64, off: u64, src: PersistSrc<'_>) {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_setzero_si512, _mm512_stream_si512};
    let mut o = a;
    while o < b {
        // SAFETY: as the function's contract says: the store is aligned and inside the
        // mapping, the load inside the source.
        unsafe {
            let v = match src {
                PersistSrc::Zero(_) => _mm512_setzero_si512(),
                PersistSrc::Bytes(s) => {
                    _mm512_loadu_si512(s.as_ptr().add(ix(o - off)).cast::<__m512i>())
                }
                PersistSrc::Pool(so, _) => {
                    _mm512_loadu_si512(base.add(ix(so + o - off)).cast::<__m512i>())
                }
            };
            _mm512_stream_si512(base.add(ix(o)).cast::<__m512i>(), v);
        }
        o += CACHE_LINE;
    }
}

/// Store `src` (whole 64-byte lines) at `dst` with one non-temporal 64-byte store per line.
///
/// # Safety
/// The processor has AVX-512F; `dst` is 64-byte aligned and valid for `src.len()` bytes of
/// writes, which no other slice aliases.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn stream_lines(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{_mm512_loadu_si512, _mm512_stream_si512};
    for (i, line) in src.chunks_exact(64).enumerate() {
        // SAFETY: `line` is 64 readable bytes (unaligned load); `dst + 64 i` is aligned and
        // inside the caller's range, as the function's contract says.
        unsafe {
            let v = _mm512_loadu_si512(line.as_ptr().cast());
            _mm512_stream_si512(dst.add(i * 64).cast(), v);
        }
    }
}


/// Bytes of a line's *check word*: its last eight, which a record stored whole lines at a time
/// (a journal entry: its epoch and checksum) keeps its validity in.
pub(crate) const CHECK_WORD: usize = 8;
/// Where in a line its check word starts.
const CHECK_AT: usize = 64 - CHECK_WORD;

/// The order [`store_lines_in_order`] stores one 64-byte line `line` in: (offset in the line,
/// eight bytes), each one aligned store. First the check word becomes zero, then the seven
/// other words get their new bytes, then the check word gets its own. A process killed after
/// any prefix of these stores (the processor makes a thread's stores visible in program order)
/// leaves the line either as it was, or with a zero check word over new and old bytes (a line
/// recovery recognises as caught being written), or whole. So does a power failure, whose
/// write-back of the line at any moment captures such a prefix. Only the journal's lines go
/// this way, and only where a line cannot be stored by one instruction.
pub(crate) fn line_store_order(line: &[u8; 64]) -> [(usize, [u8; 8]); 9] {
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&line[at..at + 8]);
        (at, w)
    };
    [
        (CHECK_AT, [0u8; 8]),
        word(0),
        word(8),
        word(16),
        word(24),
        word(32),
        word(40),
        word(48),
        word(CHECK_AT),
    ]
}

/// Store `src` (whole 64-byte lines) at `dst` line by line in [`line_store_order`], with
/// ordinary stores (the caller writes the lines back).
///
/// # Safety
/// `dst` is 64-byte aligned and valid for `src.len()` bytes of writes, which no Rust reference
/// aliases.
pub(crate) unsafe fn store_lines_in_order(dst: *mut u8, src: &[u8]) {
    for (i, chunk) in src.chunks_exact(64).enumerate() {
        let mut line = [0u8; 64];
        line.copy_from_slice(chunk);
        for (k, (at, w)) in line_store_order(&line).into_iter().enumerate() {
            // The zeroed check word before any other byte, every other byte before the new
            // check word: a release fence keeps the processor (on x86 only the compiler) from
            // moving a store across it.
            if k == 1 || k == 8 {
                fence(Ordering::Release);
            }
            // SAFETY: `dst + 64 i + at` is 8-byte aligned (dst is 64-byte aligned, `at` a
            // multiple of 8) and inside the caller's range; volatile, so the compiler neither
            // drops the zeroing store as dead nor merges the stores.
            unsafe {
                std::ptr::write_volatile(dst.add(i * 64 + at).cast::<[u8; 8]>(), w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every prefix of a line's stores, applied over an old line: what a kill can leave.
    fn prefixes(old: &[u8; 64], new: &[u8; 64]) -> Vec<[u8; 64]> {
        let order = line_store_order(new);
        (0..=order.len())
            .map(|k| {
                let mut l = *old;
                for (at, w) in &order[..k] {
                    l[*at..*at + 8].copy_from_slice(w);
                }
                l
            })
            .collect()
    }

    #[test]
    fn every_prefix_of_a_line_store_is_old_whole_or_marked_unfinished() {
        let old = [0xa5u8; 64];
        let new: [u8; 64] = std::array::from_fn(|i| u8::try_from(i + 1).unwrap_or(0));
        let states = prefixes(&old, &new);
        assert_eq!(states[0], old);
        assert_eq!(*states.last().unwrap(), new);
        for s in &states[1..states.len() - 1] {
            assert_eq!(s[CHECK_AT..], [0u8; CHECK_WORD], "a half-stored line shows a zero check word");
        }
        // The stores end in exactly the line.
        let mut dst = vec![0u8; 64 + 64];
        let at = dst.as_ptr().align_offset(64);
        // SAFETY: `dst[at..at + 64]` is 64-byte aligned, inside the vector and aliased by no
        // reference while the function runs.
        unsafe { store_lines_in_order(dst.as_mut_ptr().add(at), &new) };
        assert_eq!(dst[at..at + 64], new);
    }
}
