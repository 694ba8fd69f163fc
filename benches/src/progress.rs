//! Where a long sweep is, on one line of stderr that rewrites itself: shown only when stderr
//! is a terminal (a file or a pipe gets the table alone, as nccl-tests' output would be).

use std::io::Write;

/// A progress line over `total` rows, written to `out` when `enabled`.
#[derive(Debug)]
pub struct Progress<W: Write> {
    out: W,
    enabled: bool,
    total: usize,
    done: usize,
}

impl Progress<std::io::Stderr> {
    /// Progress on stderr, shown only when stderr is a terminal.
    pub fn on_stderr(total: usize, wanted: bool) -> Self {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        Progress::new(std::io::stderr(), total, wanted && terminal)
    }
}

impl<W: Write> Progress<W> {
    pub fn new(out: W, total: usize, enabled: bool) -> Self {
        Progress {
            out,
            enabled,
            total,
            done: 0,
        }
    }

    /// The next row, `what`, is starting.
    pub fn row(&mut self, what: &str) {
        self.done += 1;
        if self.enabled {
            let _ = write!(self.out, "\r\x1b[K[{}/{}] {what}", self.done, self.total);
            let _ = self.out.flush();
        }
    }

    /// Clear the line (before a row of the table goes to the same terminal, and at the end).
    pub fn clear(&mut self) {
        if self.enabled && self.done > 0 {
            let _ = write!(self.out, "\r\x1b[K");
            let _ = self.out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    #[test]
    fn counts_rows_rewrites_one_line_and_clears_it() {
        let mut out = Vec::new();
        let mut p = Progress::new(&mut out, 2, true);
        p.row("float sum 8 B");
        p.clear();
        p.row("float sum 16 B");
        p.clear();
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(
            text,
            "\r\x1b[K[1/2] float sum 8 B\r\x1b[K\r\x1b[K[2/2] float sum 16 B\r\x1b[K"
        );
    }

    #[test]
    fn writes_nothing_when_not_a_terminal() {
        let mut out = Vec::new();
        let mut p = Progress::new(&mut out, 3, false);
        p.row("x");
        p.clear();
        assert!(out.is_empty());
    }
}
