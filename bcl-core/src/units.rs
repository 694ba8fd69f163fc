//! Units as a person reads them in messages and tables.

/// Bytes as a person reads them: "4 MiB", "1536 B".
pub fn human_bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn whole_units_only() {
        assert_eq!(human_bytes(4 << 20), "4 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
        assert_eq!(human_bytes(1536), "1536 B");
        assert_eq!(human_bytes(0), "0 B");
    }
}
