//! Double binary tree allreduce (NCCL's trees): latency that grows with log2(p) while each
//! rank's link still carries about the ring's data, for mid-size messages on many ranks (and
//! between many hosts, as the rails of `hierarchical`).
//!
//! The buffer is cut in two halves, one per tree. In each tree the slices of its half are
//! reduced up towards the root (a node adds its children's slices to its own and forwards the
//! sum), the root has the total, and the slices come back down (a node forwards to its
//! children what its parent sent). Slices pipeline: a node forwards slice s while slice s+1
//! is on its way up, so the time is about 2·(depth + slices) slice steps, not 2·depth whole
//! buffers.
//!
//! The first tree is NCCL's binary tree over the nodes 0..p (the ring order): node i's
//! parent is found from its lowest set bit, node 0 is the root with one child. With 8 nodes:
//!
//! ```text
//!   tree 0:        0                tree 1 (mirrored, i ↔ 7 − i):       7
//!                  4                                                    3
//!              2       6                                            5       1
//!            1   3   5   7                                        6   4   2   0
//! ```
//!
//! The second is the first mirrored (even p) or shifted by one (odd p), so with an even p a
//! node that is interior in one tree is a leaf in the other: in the reduce each rank receives
//! at most two half-slices and sends two, as in the broadcast (2·n per link and direction
//! against the ring's 2(p−1)/p·n, in 2·log2(p) steps against 2(p−1)).

use super::plan::BufferId::{Input, Output};
use super::plan::{Action, PlanBuilder, Region};
use super::ring::part;
use super::{Layout, Reduction};

/// The parent of node `i` in NCCL's binary tree over `0..n` (`None` for the root, node 0).
pub fn binary_parent(n: usize, i: usize) -> Option<usize> {
    if i == 0 || i >= n {
        return None;
    }
    let bit = 1usize << i.trailing_zeros();
    let up = (i ^ bit) | (bit << 1);
    Some(if up >= n { i ^ bit } else { up })
}

/// The parent of node `i` in tree `tree` (0 or 1) of the double binary tree over `0..n`.
pub fn parent(n: usize, tree: usize, i: usize) -> Option<usize> {
    if tree == 0 || n < 2 {
        return binary_parent(n, i);
    }
    if n.is_multiple_of(2) {
        binary_parent(n, n - 1 - i).map(|u| n - 1 - u)
    } else {
        binary_parent(n, (i + n - 1) % n).map(|u| (u + 1) % n)
    }
}

/// The children of node `i` in tree `tree` (at most two, lower first).
pub fn children(n: usize, tree: usize, i: usize) -> Vec<usize> {
    (0..n).filter(|&c| parent(n, tree, c) == Some(i)).collect()
}

pub(crate) fn allreduce(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    reduction: Reduction,
    slice: usize,
) {
    let n = layout.world();
    let me = layout.position();
    if count == 0 {
        return;
    }
    if n == 1 {
        let all = Region::new(Output, 0, count);
        if !in_place {
            b.push(Action::Copy {
                from: Region::new(Input, 0, count),
                to: all,
            });
        }
        if reduction.average {
            b.push(Action::Divide { region: all });
        }
        return;
    }
    // Per tree: its half, its slice count, this node's parent and children (as ranks).
    let trees: Vec<_> = (0..2)
        .map(|t| {
            let (offset, len) = part(count, 2, t);
            let slices = len.div_ceil(slice.max(1)).max(1);
            let up = parent(n, t, me).map(|p| layout.at(p));
            let down: Vec<usize> = children(n, t, me).iter().map(|&c| layout.at(c)).collect();
            (offset, len, slices, up, down)
        })
        .collect();
    let most = trees.iter().map(|t| t.2).max().unwrap_or(1);
    // Tags: slice s of tree t goes up with 4s + 2t and comes down with 4s + 2t + 1 (a pair of
    // ranks can be parent and child in both trees).
    let tag = |s: usize, t: usize, down: bool| (4 * s + 2 * t + usize::from(down)) as u32;
    // The non-empty slices as (slice, tree, region), the two trees' slices interleaved.
    let order: Vec<(usize, usize, Region)> = (0..most)
        .flat_map(|s| (0..2).map(move |t| (s, t)))
        .filter_map(|(s, t)| {
            let (offset, len, slices, ..) = trees[t];
            let (o, l) = part(len, slices, s);
            (s < slices && l > 0).then(|| (s, t, Region::new(Output, offset + o, l)))
        })
        .collect();

    // Up: the children's slices added to this node's, the sum to the parent. A leaf sends its
    // own contribution straight from where it is (the input, out of place).
    for &(s, t, region) in &order {
        let (_, _, _, up, down) = &trees[t];
        let input = Region::new(Input, region.offset, region.len);
        let mut seed = (!in_place).then_some(input);
        for &child in down {
            b.push(Action::Recv {
                peer: child,
                tag: tag(s, t, false),
                into: region,
                reduce: true,
                seed: seed.take(),
            });
        }
        match up {
            Some(parent) => {
                let from = if down.is_empty() && !in_place {
                    input
                } else {
                    region
                };
                b.push(Action::Send {
                    peer: *parent,
                    tag: tag(s, t, false),
                    from,
                    lend: false,
                });
            }
            None if reduction.average => {
                b.push(Action::Divide { region });
            }
            None => {}
        }
    }
    // Down: the total from the parent, on to the children.
    for &(s, t, region) in &order {
        let (_, _, _, up, down) = &trees[t];
        if let Some(parent) = up {
            b.push(Action::Recv {
                peer: *parent,
                tag: tag(s, t, true),
                into: region,
                reduce: false,
                seed: None,
            });
        }
        for &child in down {
            b.push(Action::Send {
                peer: child,
                tag: tag(s, t, true),
                from: region,
                lend: false,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node but the root reaches the root by parents, each has at most two children,
    /// and with an even node count no node is interior in both trees.
    #[test]
    fn two_trees_over_every_size() {
        for n in 1..=70 {
            for t in 0..2 {
                let roots: Vec<usize> = (0..n).filter(|&i| parent(n, t, i).is_none()).collect();
                assert_eq!(roots.len(), 1, "n {n} tree {t}: roots {roots:?}");
                for i in 0..n {
                    let mut at = i;
                    let mut hops = 0;
                    while let Some(p) = parent(n, t, at) {
                        assert!(p < n && p != at, "n {n} tree {t}: {at} → {p}");
                        at = p;
                        hops += 1;
                        assert!(hops <= n, "n {n} tree {t}: a cycle from {i}");
                    }
                    assert_eq!(at, roots[0]);
                    // Depth about log2(n): the latency the tree is for.
                    assert!(hops <= 1 + n.next_power_of_two().trailing_zeros() as usize);
                    assert!(children(n, t, i).len() <= 2, "n {n} tree {t} node {i}");
                }
            }
            if n.is_multiple_of(2) {
                for i in 0..n {
                    let interior = (0..2).filter(|&t| !children(n, t, i).is_empty()).count();
                    assert!(interior <= 1, "n {n}: node {i} interior in both trees");
                }
            }
        }
    }

    #[test]
    fn the_eight_node_trees_of_the_module_doc() {
        let parents = |t| (0..8).map(|i| parent(8, t, i)).collect::<Vec<_>>();
        let tree0 = [
            None,
            Some(2),
            Some(4),
            Some(2),
            Some(0),
            Some(6),
            Some(4),
            Some(6),
        ];
        assert_eq!(parents(0), tree0);
        let tree1 = [
            Some(1),
            Some(3),
            Some(1),
            Some(7),
            Some(5),
            Some(3),
            Some(5),
            None,
        ];
        assert_eq!(parents(1), tree1);
    }
}
