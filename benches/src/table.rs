//! nccl-tests' table: the same columns, widths, busbw factors and footer.

use bcl_core::Collective;
use serde::Serialize;

/// One measurement: a size, a placement (out-of-place or in-place).
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub collective: String,
    pub nranks: usize,
    pub devices: String,
    pub transport: String,
    pub size_bytes: usize,
    pub count: usize,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub in_place: bool,
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    pub wrong: u64,
    /// The algorithm the call ran with (`hier-ring`, `ring`, ...).
    pub algorithm: String,
    /// A row of `bcl-sim` (the plans run on a modelled network), not a measurement.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
}

/// nccl-tests' bus bandwidth factor: what fraction of the data each link must carry.
pub fn busbw_factor(collective: Collective, n: usize) -> f64 {
    let n = n as f64;
    match collective {
        Collective::AllReduce { .. } => 2.0 * (n - 1.0) / n,
        Collective::AllGather
        | Collective::ReduceScatter { .. }
        | Collective::AllToAll
        | Collective::Gather { .. }
        | Collective::Scatter { .. } => (n - 1.0) / n,
        _ => 1.0,
    }
}

pub fn header() -> String {
    [
        "#                                                              out-of-place                       in-place                    ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong      algo",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)                 ",
    ]
    .join("\n")
}

fn half(m: &Measurement) -> String {
    let time = if m.time_us >= 10_000.0 {
        format!("{:8.0}", m.time_us)
    } else {
        format!("{:8.2}", m.time_us)
    };
    format!(
        " {time} {:7.2} {:7.2} {:6}",
        m.algbw_gbs, m.busbw_gbs, m.wrong
    )
}

/// One table row from its out-of-place and in-place measurements.
pub fn row(oop: &Measurement, ip: &Measurement) -> String {
    format!(
        "{:12} {:13} {:>9} {:>7} {:7}{}{} {:>9}",
        oop.size_bytes,
        oop.count,
        oop.dtype,
        oop.redop,
        oop.root,
        half(oop),
        half(ip),
        oop.algorithm
    )
}

pub fn footer(all: &[Measurement]) -> String {
    let wrong: u64 = all.iter().map(|m| m.wrong).sum();
    let avg = if all.is_empty() {
        0.0
    } else {
        all.iter().map(|m| m.busbw_gbs).sum::<f64>() / all.len() as f64
    };
    format!(
        "# Out of bounds values : {wrong} {}\n# Avg bus bandwidth    : {avg:.4}\n#",
        if wrong == 0 { "OK" } else { "FAILED" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(wrong: u64, busbw: f64) -> Measurement {
        Measurement {
            collective: "allreduce".into(),
            nranks: 2,
            devices: "cpu".into(),
            transport: "tcp".into(),
            size_bytes: 8,
            count: 2,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            in_place: false,
            time_us: 10.0,
            algbw_gbs: busbw,
            busbw_gbs: busbw,
            wrong,
            algorithm: "ring".into(),
            simulated: false,
        }
    }

    #[test]
    fn footer_reports_wrong_values_and_average() {
        assert!(
            footer(&[m(0, 1.0), m(0, 3.0)]).contains(": 0 OK\n# Avg bus bandwidth    : 2.0000")
        );
        assert!(footer(&[m(0, 1.0), m(5, 1.0)]).contains(": 5 FAILED"));
        let r = row(&m(0, 1.0), &m(3, 1.0));
        let columns: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(columns.len(), 14, "{r}");
        assert_eq!(columns[12], "3", "{r}");
        assert_eq!(columns[13], "ring", "{r}");
    }

    #[test]
    fn busbw_factors_are_nccl_tests() {
        assert_eq!(
            busbw_factor(
                Collective::AllReduce {
                    op: bcl_core::ReduceOp::Sum
                },
                4
            ),
            1.5
        );
        assert_eq!(busbw_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(busbw_factor(Collective::Broadcast { root: 0 }, 4), 1.0);
        assert_eq!(busbw_factor(Collective::Gather { root: 1 }, 4), 0.75);
    }
}
