//! `Communicator::split`: a 4 × 4 grid of 16 ranks (rows: tensor parallel, columns: data
//! parallel) running collectives in both families at once, a split of a split, ranks that
//! take no part, and bad colors; groups made by their members alone (`create_group`). Ranks are threads here (in-process and shared-memory
//! transports); `lifecycle.rs` splits real processes.

use bcl_core::{CommConfig, Communicator, ReduceOp, TransportKind};
use std::time::Duration;

fn threads(world: usize, transport: TransportKind) -> Vec<Communicator> {
    Communicator::init_threads(
        world,
        CommConfig {
            transport,
            op_timeout: Duration::from_secs(20),
            // Bounds the bad-use tests' waits (a grow whose new rank never comes).
            init_timeout: Duration::from_secs(8),
            ..CommConfig::default()
        },
    )
    .expect("init")
}

/// On every rank of `comms`, concurrently.
fn each<T: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn grid(transport: TransportKind) {
    let comms = threads(16, transport);
    let results = each(&comms, |c| {
        let r = c.rank();
        let (row, col) = (r / 4, r % 4);
        // Key reverses the order within a row: new rank = 3 - col.
        let row_comm = c
            .split(Some(row as u32), -(col as i32))
            .expect("row split")
            .expect("in a row");
        let col_comm = c
            .split(Some(col as u32), row as i32)
            .expect("column split")
            .expect("in a column");
        assert_eq!(row_comm.world_size(), 4);
        assert_eq!(row_comm.rank(), 3 - col);
        assert_eq!(col_comm.rank(), row);
        // Both families at once: the row allreduce on this thread, the column one beside it.
        let (row_sum, col_sum) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut x = vec![r as f64; 1000];
                row_comm
                    .all_reduce_in_place(&mut x, ReduceOp::Sum)
                    .expect("row allreduce");
                x
            });
            let mut y = vec![r as i64 + 1; 777];
            for _ in 0..5 {
                col_comm
                    .all_reduce_in_place(&mut y, ReduceOp::Max)
                    .expect("column allreduce");
            }
            (h.join().expect("row thread"), y)
        });
        let want_row: f64 = (0..4).map(|k| (row * 4 + k) as f64).sum();
        assert!(
            row_sum.iter().all(|&v| v == want_row),
            "rank {r}: row sum {}",
            row_sum[0]
        );
        assert!(
            col_sum.iter().all(|&v| v == (12 + col) as i64 + 1),
            "rank {r}: col max {}",
            col_sum[0]
        );
        // An allgather in the row shows the order by key.
        let mut seen = vec![0u32; 4];
        row_comm
            .all_gather(&[r as u32], &mut seen)
            .expect("row allgather");
        let want: Vec<u32> = (0..4).rev().map(|k| (row * 4 + k) as u32).collect();
        assert_eq!(seen, want, "rank {r}: row order");
        // A split of a split: the even and odd column members of each row.
        let half = row_comm
            .split(Some((col % 2) as u32), 0)
            .expect("split of a split")
            .expect("member");
        assert_eq!(half.world_size(), 2);
        let mut z = [1u8; 3];
        half.all_reduce_in_place(&mut z, ReduceOp::Sum)
            .expect("half allreduce");
        assert_eq!(z, [2; 3]);
        (row_comm.ring().len(), col_comm.world_size())
    });
    assert!(results.iter().all(|&(a, b)| a == 4 && b == 4));
}

#[test]
fn a_4_by_4_grid_runs_rows_and_columns_at_once_in_process() {
    grid(TransportKind::Auto);
}

#[test]
fn a_4_by_4_grid_runs_rows_and_columns_at_once_over_shared_memory() {
    grid(TransportKind::Shm);
}

#[test]
fn nocolor_ranks_get_no_communicator_and_the_rest_carry_on() {
    let comms = threads(5, TransportKind::Auto);
    let got = each(&comms, |c| {
        let color = (c.rank() % 2 == 0).then_some(7);
        let child = c.split(color, c.rank() as i32).expect("split");
        let size = child.as_ref().map(|k| k.world_size());
        if let Some(k) = &child {
            let mut x = [1u32; 8];
            k.all_reduce_in_place(&mut x, ReduceOp::Sum)
                .expect("allreduce");
            assert_eq!(x, [3; 8]);
        }
        // The parent keeps working after the split.
        let mut y = [1u32; 2];
        c.all_reduce_in_place(&mut y, ReduceOp::Sum)
            .expect("parent allreduce");
        assert_eq!(y, [5; 2]);
        size
    });
    assert_eq!(got, vec![Some(3), None, Some(3), None, Some(3)]);
}

/// `create_group`: called by the members alone (MPI_Comm_create_group, as torch's new_group
/// calls its backend): two disjoint groups made at once, one of them twice.
fn groups_of_members_alone(transport: TransportKind) {
    let comms = threads(6, transport);
    let got = each(&comms, |c| {
        let r = c.rank();
        // New ranks follow the list: 4, 1, 3 become 0, 1, 2.
        let members: &[usize] = if [1, 3, 4].contains(&r) {
            &[4, 1, 3]
        } else {
            &[0, 2, 5]
        };
        let g = c.create_group(members, 7).expect("create_group");
        assert_eq!(g.world_size(), 3);
        assert_eq!(
            g.rank(),
            members.iter().position(|&m| m == r).expect("member")
        );
        let mut seen = vec![0u32; 3];
        g.all_gather(&[r as u32], &mut seen)
            .expect("group allgather");
        let want: Vec<u32> = members.iter().map(|&m| m as u32).collect();
        assert_eq!(seen, want, "rank {r}: the group's order");
        // The same membership again: a second, separate communicator.
        let again = c.create_group(members, 7).expect("the same group again");
        let mut x = [r as u64; 5];
        again
            .all_reduce_in_place(&mut x, ReduceOp::Sum)
            .expect("allreduce");
        let mut y = [1u64; 5];
        g.all_reduce_in_place(&mut y, ReduceOp::Sum)
            .expect("allreduce");
        // The parent still works, with every rank.
        let mut z = [1u32; 2];
        c.all_reduce_in_place(&mut z, ReduceOp::Sum)
            .expect("parent allreduce");
        assert_eq!(z, [6; 2]);
        (x[0], y[0])
    });
    let sum = |m: &[u64]| m.iter().sum::<u64>();
    for (r, &(x, y)) in got.iter().enumerate() {
        let want = if [1, 3, 4].contains(&r) {
            sum(&[4, 1, 3])
        } else {
            sum(&[0, 2, 5])
        };
        assert_eq!((x, y), (want, 3), "rank {r}");
    }
}

#[test]
fn members_alone_make_groups_in_process() {
    groups_of_members_alone(TransportKind::Auto);
}

#[test]
fn members_alone_make_groups_over_shared_memory() {
    groups_of_members_alone(TransportKind::Shm);
}

#[test]
fn a_group_with_a_bad_member_list_is_refused_at_once() {
    let comms = threads(3, TransportKind::Auto);
    let errs = each(&comms, |c| {
        let list: &[usize] = match c.rank() {
            0 => &[1, 2],    // not a member itself
            1 => &[1, 1],    // twice
            _ => &[2, 3, 0], // 3 is beyond the world
        };
        c.create_group(list, 0).expect_err("refused").to_string()
    });
    assert!(
        errs[0].contains("rank 0 called it but is not among"),
        "{}",
        errs[0]
    );
    assert!(errs[1].contains("rank 1 is listed twice"), "{}", errs[1]);
    assert!(errs[2].contains("member 3 is not a rank"), "{}", errs[2]);
}

#[test]
fn a_split_of_a_poisoned_communicator_is_refused() {
    let comms = threads(2, TransportKind::Auto);
    comms[0].abort();
    let errors = each(&comms, |c| {
        c.split(Some(0), 0).expect_err("poisoned").to_string()
    });
    for e in errors {
        assert!(e.contains("aborted"), "{e}");
    }
}

/// Shrink with threads: rank 3 destroys its communicator (its health port closes, as a dead
/// process's does); the others shrink, by list and by finding it gone.
fn shrink_without_rank_3(exclude: bcl_core::Exclude<'static>) {
    let mut comms = threads(4, TransportKind::Auto);
    drop(comms.pop());
    let shrunk = each(&comms, |c| {
        let s = c
            .shrink(exclude, bcl_core::ShrinkMode::Default)
            .expect("shrink");
        let mut x = [c.rank() as u32 + 1; 16];
        s.all_reduce_in_place(&mut x, ReduceOp::Sum)
            .expect("allreduce on the survivors");
        (s.rank(), s.world_size(), x[0])
    });
    assert_eq!(shrunk, vec![(0, 3, 6), (1, 3, 6), (2, 3, 6)]);
}

#[test]
fn survivors_shrink_by_list_in_process() {
    shrink_without_rank_3(bcl_core::Exclude::Ranks(&[3]));
}

#[test]
fn survivors_shrink_by_finding_the_gone_rank_in_process() {
    shrink_without_rank_3(bcl_core::Exclude::Failed);
}

#[test]
fn survivors_passing_different_lists_get_an_error_naming_both() {
    let comms = threads(4, TransportKind::Auto);
    let errors = each(&comms[..3], |c| {
        let list: &[usize] = if c.rank() == 0 { &[3] } else { &[2, 3] };
        if c.rank() == 2 {
            // rank 2 is on rank 1's list: it tries to stay, and is told it was excluded.
            return c
                .shrink(
                    bcl_core::Exclude::Ranks(&[3]),
                    bcl_core::ShrinkMode::Default,
                )
                .map(|_| ())
                .expect_err("excluded")
                .to_string();
        }
        c.shrink(
            bcl_core::Exclude::Ranks(list),
            bcl_core::ShrinkMode::Default,
        )
        .map(|_| ())
        .expect_err("inconsistent lists")
        .to_string()
    });
    eprintln!("{errors:#?}");
    assert!(
        errors[0].contains("[3]") && errors[0].contains("[2, 3]"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("[3]") && errors[1].contains("[2, 3]"),
        "{}",
        errors[1]
    );
    assert!(
        errors[2].contains("excluded") || errors[2].contains("[2, 3]"),
        "{}",
        errors[2]
    );
}

#[test]
fn a_new_rank_joins_a_grown_communicator_and_existing_ranks_keep_theirs() {
    let comms = threads(3, TransportKind::Auto);
    let id = comms[1].grow_unique_id().expect("id");
    let grown = std::thread::scope(|s| {
        let newcomer = s.spawn(|| {
            bcl_core::CommBuilder::new(CommConfig::default())
                .join_grown(3, 4, &id)
                .expect("join the grown communicator")
        });
        let old: Vec<_> = comms
            .iter()
            .map(|c| {
                let id = (c.rank() == 1).then_some(&id);
                s.spawn(move || c.grow(4, id).expect("grow"))
            })
            .collect();
        let mut all: Vec<Communicator> = old
            .into_iter()
            .map(|h| h.join().expect("grow thread"))
            .collect();
        all.push(newcomer.join().expect("newcomer"));
        all
    });
    let sums = each(&grown, |c| {
        let mut x = [c.rank() as u64 + 1; 5];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum)
            .expect("allreduce on 4");
        (c.rank(), c.world_size(), x[0])
    });
    assert_eq!(sums, vec![(0, 4, 10), (1, 4, 10), (2, 4, 10), (3, 4, 10)]);
}

#[test]
fn grow_with_a_wrong_size_or_without_a_root_is_refused() {
    let comms = threads(2, TransportKind::Auto);
    let errors = each(&comms, |c| {
        c.grow(2 + c.rank() + 1, None)
            .map(|_| ())
            .expect_err("sizes differ")
            .to_string()
    });
    assert!(
        errors.iter().all(|e| e.contains("different sizes")),
        "{errors:?}"
    );
    let errors = each(&comms, |c| {
        c.grow(3, None)
            .map(|_| ())
            .expect_err("no root")
            .to_string()
    });
    assert!(
        errors.iter().all(|e| e.contains("exactly one")),
        "{errors:?}"
    );
    let e = comms[0]
        .grow(1, None)
        .map(|_| ())
        .expect_err("not larger")
        .to_string();
    assert!(e.contains("already has 2"), "{e}");
    // A new rank told another size than the root's is refused, naming both.
    let id = comms[0].grow_unique_id().expect("id");
    std::thread::scope(|s| {
        let wrong = s.spawn(|| {
            let cfg = CommConfig {
                init_timeout: Duration::from_secs(5),
                ..CommConfig::default()
            };
            bcl_core::CommBuilder::new(cfg)
                .join_grown(2, 4, &id)
                .map(|_| ())
                .expect_err("wrong size")
                .to_string()
        });
        let old: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || c.grow(3, (c.rank() == 0).then_some(&id)).map(|_| ())))
            .collect();
        let e = wrong.join().expect("thread");
        assert!(
            e.contains("grows to 4") && e.contains("grows it to 3"),
            "{e}"
        );
        for h in old {
            // Rank 2 never came: the existing ranks time out naming it.
            let _ = h.join().expect("thread");
        }
    });
}

/// A topology set on the parent (`BCL_TOPOLOGY=2x2` in code) carries over to its children as
/// their members' hosts: a group of ranks 1, 2, 3 has hosts [0] [1, 2] (its ranks), a split by
/// parity [0] [1] each side, and the hierarchical allreduce runs on them.
#[test]
fn a_set_topology_carries_over_to_groups_and_splits() {
    let comms = Communicator::init_threads(
        4,
        CommConfig {
            transport: TransportKind::Shm,
            op_timeout: Duration::from_secs(20),
            topology: Some(bcl_core::config::TopologySpec::Grid {
                hosts: 2,
                per_host: 2,
            }),
            algorithm: Some(bcl_core::schedule::Algorithm::HierRing),
            ..CommConfig::default()
        },
    )
    .expect("init");
    assert_eq!(comms[0].topology(), "2 hosts: [0, 1] [2, 3]");
    let seen = each(&comms, |c| {
        let group = (c.rank() > 0).then(|| c.create_group(&[1, 2, 3], 5).expect("group"));
        let split = c
            .split(Some(c.rank() as u32 % 2), 0)
            .expect("split")
            .expect("a member");
        let mut x = vec![c.rank() as f32; 300];
        split
            .all_reduce_in_place(&mut x, ReduceOp::Sum)
            .expect("allreduce");
        let want = if c.rank() % 2 == 0 { 2.0 } else { 4.0 };
        assert!(x.iter().all(|&v| v == want), "rank {}: {}", c.rank(), x[0]);
        let group_hosts = group.map(|g| {
            let mut y = vec![1.0f32; 300];
            g.all_reduce_in_place(&mut y, ReduceOp::Sum)
                .expect("group allreduce");
            assert!(y.iter().all(|&v| v == 3.0));
            g.topology()
        });
        (group_hosts, split.topology())
    });
    assert_eq!(seen[0].0, None);
    for (rank, (group, _)) in seen.iter().enumerate().skip(1) {
        assert_eq!(group.as_deref(), Some("2 hosts: [0] [1, 2]"), "rank {rank}");
    }
    for (rank, (_, split)) in seen.iter().enumerate() {
        assert_eq!(split, "2 hosts: [0] [1]", "rank {rank}");
    }
}
