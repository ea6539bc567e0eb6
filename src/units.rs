//! Byte sizes for people: parsing "64M"-style arguments and formatting sizes in binary units.
//! One copy, used by the CLI, the reports and the tools.

/// Parse "4096", "64K", "256M", "4G", "1T" (binary; optional trailing "B" or "iB").
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .unwrap_or(t);
    let t = if t.len() > 1 {
        t.strip_suffix(['B', 'b']).unwrap_or(t)
    } else {
        t
    };
    let (num, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num.trim().parse().map_err(|_| {
        format!("bad size {s:?}: expected a number with an optional K/M/G/T suffix")
    })?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// [`parse_size`] for a size that must not be zero (a pool, a file, a benchmark's data).
pub fn parse_nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("size {s:?} must be greater than zero")),
        n => Ok(n),
    }
}

/// Format `bytes` as "512 B", "1.5 KiB", "4.0 GiB" (one decimal above bytes).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("8MB"), Ok(8 << 20));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999T").is_err());
        assert_eq!(parse_nonzero_size("1K"), Ok(1024));
        assert!(parse_nonzero_size("0").is_err());
        assert!(parse_nonzero_size("0M").is_err());
    }

    #[test]
    fn sizes_format_in_binary_units() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(4 << 30), "4.0 GiB");
        assert_eq!(format_size(3 << 40), "3.0 TiB");
    }
}
