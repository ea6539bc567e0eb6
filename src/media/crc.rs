//! crc32c, the checksum of every on-media structure, with a fast path for the short inputs that
//! metadata writes checksum all the time (a 60-byte journal entry, a 256-byte inode, a dentry):
//! the processor's `crc32` instruction over 8-byte words, nothing else. The `crc32c` crate
//! computes the same values (it is the reference, in the tests below and for long inputs, where
//! its three interleaved streams win), but for short inputs it spends most of its instructions
//! on alignment and dispatch: 226 instructions for a journal entry, about 40 here
//! (docs/BENCHMARKS.md, "Metadata paths on a diet").
#![allow(unsafe_code)] // calls a `target_feature` function once the feature is detected
#![deny(clippy::cast_possible_truncation)]

/// Longest input the word loop takes; from here on the crate's interleaved streams are faster.
const SHORT_MAX: usize = 512;

/// crc32c of `data` (the Castagnoli polynomial, as `crc32c::crc32c`).
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// crc32c of the bytes checksummed into `crc` followed by `data` (as `crc32c::crc32c_append`).
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() <= SHORT_MAX && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the processor has SSE4.2, the only requirement of `short_sse42`.
        return unsafe { short_sse42(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

/// The word loop: 8 bytes per `crc32` instruction, then 4, 2 and 1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn short_sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64};
    let mut words = data.chunks_exact(8);
    let mut c = u64::from(!crc);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        c = _mm_crc32_u64(c, u64::from_le_bytes(b));
    }
    // The instruction leaves the checksum in the low 32 bits.
    let mut c = u32::try_from(c & u64::from(u32::MAX)).unwrap_or(u32::MAX);
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        c = _mm_crc32_u32(c, u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]));
        rest = &rest[4..];
    }
    if rest.len() >= 2 {
        c = _mm_crc32_u16(c, u16::from_le_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
    }
    if let Some(&b) = rest.first() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_short_length_matches_the_crate() {
        let data: Vec<u8> = (0..SHORT_MAX + 64).map(|i| u8::try_from((i * 131 + 7) % 256).unwrap_or(0)).collect();
        for start in 0..8 {
            for len in 0..=SHORT_MAX + 8 {
                let d = &data[start..start + len];
                assert_eq!(crc32c(d), crc32c::crc32c(d), "offset {start}, length {len}");
                assert_eq!(
                    crc32c_append(0x1234_5678, d),
                    crc32c::crc32c_append(0x1234_5678, d),
                    "append, offset {start}, length {len}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn random_inputs_match_the_crate(d in proptest::collection::vec(any::<u8>(), 0..1200),
                                         seed in any::<u32>()) {
            prop_assert_eq!(crc32c(&d), crc32c::crc32c(&d));
            prop_assert_eq!(crc32c_append(seed, &d), crc32c::crc32c_append(seed, &d));
            // Split anywhere, the checksum is the same as of the whole.
            let cut = d.len() / 3;
            prop_assert_eq!(crc32c_append(crc32c(&d[..cut]), &d[cut..]), crc32c::crc32c(&d));
        }
    }
}
