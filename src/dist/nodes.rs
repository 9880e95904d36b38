//! `Nodes`: which MPI ranks form a node, for local SGD's hierarchical scope (`[cluster]
//! sync_scope = "node"`: gradients all-reduced within a node every step, parameters averaged
//! across nodes). A node is the ranks that share memory (one host, as `MPI_Comm_split_type`
//! finds it), or consecutive blocks of `cluster.node_ranks` ranks. Nodes are numbered in the
//! order of their lowest rank; a rank's replicas belong to its node, so universal rank `u`
//! (`rank × replicas_per_rank + i`) is on node `of_rank[u / replicas_per_rank]`.
//!
//! `Bootstrap::nodes` finds them (a collective); the pure part here is what every rank derives
//! from the gathered colours.

/// The ranks of every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nodes {
    /// The node of each MPI rank.
    pub of_rank: Vec<usize>,
}

impl Nodes {
    /// Nodes from one colour per rank (equal colours: one node), numbered by their lowest rank.
    pub fn from_colors(colors: &[u64]) -> Nodes {
        let mut seen: Vec<u64> = Vec::new();
        let of_rank = colors
            .iter()
            .map(|c| match seen.iter().position(|s| s == c) {
                Some(i) => i,
                None => {
                    seen.push(*c);
                    seen.len() - 1
                }
            })
            .collect();
        Nodes { of_rank }
    }

    /// Every rank its own node (one process per host, or no hierarchy).
    pub fn one_per_rank(ranks: usize) -> Nodes {
        Nodes {
            of_rank: (0..ranks).collect(),
        }
    }

    /// Number of nodes.
    pub fn count(&self) -> usize {
        self.of_rank.iter().max().map_or(0, |m| m + 1)
    }

    /// The ranks of `node`, in order.
    pub fn ranks_of(&self, node: usize) -> Vec<usize> {
        (0..self.of_rank.len())
            .filter(|&r| self.of_rank[r] == node)
            .collect()
    }

    /// Where `rank` sits in its node: (its index among the node's ranks, the node's ranks).
    pub fn place(&self, rank: usize) -> (usize, usize) {
        let ranks = self.ranks_of(self.of_rank[rank]);
        let index = ranks.iter().position(|&r| r == rank).unwrap_or(0);
        (index, ranks.len())
    }

    /// The node of universal rank `universal`, with `per_rank` replicas per rank.
    pub fn of_replica(&self, universal: usize, per_rank: usize) -> usize {
        self.of_rank[universal / per_rank.max(1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_become_nodes_numbered_by_their_lowest_rank() {
        // Ranks 0 and 2 on one host, 1 and 3 on another (a round-robin launch).
        let n = Nodes::from_colors(&[0, 1, 0, 1]);
        assert_eq!(n.of_rank, [0, 1, 0, 1]);
        assert_eq!(n.count(), 2);
        assert_eq!(n.ranks_of(1), [1, 3]);
        assert_eq!(n.place(2), (1, 2));
        assert_eq!(n.place(1), (0, 2));
        // Two replicas per rank: universal 5 is rank 2's, on node 0.
        assert_eq!(n.of_replica(5, 2), 0);
        let blocks = Nodes::from_colors(&[7, 7, 3, 3, 3]);
        assert_eq!(blocks.of_rank, [0, 0, 1, 1, 1]);
        assert_eq!(blocks.place(4), (2, 3));
        assert_eq!(Nodes::one_per_rank(3).count(), 3);
    }
}
