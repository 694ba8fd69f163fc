//! The k-ary tree over ranks that BCL's control plane gathers along (rank 0 at the root, the
//! children of rank `r` are `r·k + 1 ..= r·k + k`): the rendezvous collects the ranks' records
//! up it, and the slow-node reports travel up it to rank 0's detector, so that rank 0 hears
//! from `k` ranks rather than from all of them.

/// Children per rank for the rendezvous, and by default for the reports
/// (`BCL_REPORT_FANOUT`): 10k ranks are 4 levels deep.
pub const FANOUT: usize = 16;

/// The parent of `rank` (`None` for rank 0).
pub fn parent(rank: usize, fanout: usize) -> Option<usize> {
    (rank > 0).then(|| (rank - 1) / fanout.max(1))
}

/// The children of `rank` in a world of `world` ranks.
pub fn children(rank: usize, world: usize, fanout: usize) -> impl Iterator<Item = usize> {
    let fanout = fanout.max(1);
    let first = rank.saturating_mul(fanout).saturating_add(1);
    (first..first.saturating_add(fanout)).take_while(move |&c| c < world)
}

/// Whether `rank` lies in the subtree under `root` (itself included).
pub fn in_subtree(mut rank: usize, root: usize, fanout: usize) -> bool {
    loop {
        if rank == root {
            return true;
        }
        match parent(rank, fanout) {
            Some(p) if p >= root => rank = p,
            _ => return false,
        }
    }
}

/// Ranks in the subtree under `root` (itself included) in a world of `world`.
pub fn subtree_size(root: usize, world: usize, fanout: usize) -> usize {
    let fanout = fanout.max(1);
    let (mut size, mut first, mut width) = (0usize, root, 1usize);
    while first < world {
        size += width.min(world - first);
        first = first.saturating_mul(fanout).saturating_add(1);
        width = width.saturating_mul(fanout);
    }
    size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_children_and_subtrees_agree() {
        for fanout in [1, 2, 3, 16] {
            for world in [1, 2, 5, 17, 18, 100, 300] {
                let mut reached = vec![false; world];
                reached[0] = true;
                for r in 0..world {
                    for c in children(r, world, fanout) {
                        assert_eq!(parent(c, fanout), Some(r), "k {fanout}, world {world}");
                        assert!(!reached[c], "k {fanout}: rank {c} has two parents");
                        reached[c] = true;
                    }
                    // The subtree by membership, counted over the whole world.
                    let members = (0..world).filter(|&x| in_subtree(x, r, fanout)).count();
                    assert_eq!(
                        subtree_size(r, world, fanout),
                        members,
                        "k {fanout}, {world}, {r}"
                    );
                }
                assert!(reached.iter().all(|&x| x), "k {fanout}, world {world}");
                assert_eq!(parent(0, fanout), None);
            }
        }
    }
}
