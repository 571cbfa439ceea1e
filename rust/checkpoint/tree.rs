//! The prefix tree over token chunks that indexes sequences and checkpoints.
//!
//! A node stands for a prefix whose length is a multiple of the tree's chunk size `g`; its
//! children are keyed by the next `g` tokens. Every sequence the cache has seen adds its full
//! chunks (that is what the engine's attention KV / radix index holds), and, in a tree that keeps
//! them, the tokens past its last full chunk. A checkpoint at position `p` hangs on the node of
//! `p / g` chunks, with the `p % g` tokens after that node as its tail, so checkpoints can sit at
//! any position while lookups and inserts walk `O(len / g)` nodes (each step hashes one chunk, or
//! compares it with a node's only child: `O(len)` token reads in all), never the set of
//! checkpoints.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

/// A fast multiplicative hash over 8-byte words (FxHash's mix), seeded per tree from std's random
/// state: chunk keys are hashed on every lookup, and SipHash's cost dominated the decision time.
/// Keys of 32 bytes or more are mixed in four independent lanes (one word each per 32-byte block,
/// folded into the state at the end), so the multiplies overlap instead of waiting on each other.
#[derive(Clone, Copy)]
pub struct FastHash(u64);

/// FxHash's multiplier.
const MIX: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for FastHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let lane = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(MIX);
        let mut blocks = bytes.chunks_exact(32);
        if bytes.len() >= 32 {
            // Distinct starting points, so that words swapped between lanes hash differently.
            let s = self.0;
            let mut l = [s, s ^ 0x9e37_79b9_7f4a_7c15, s.rotate_left(21), !s];
            for b in &mut blocks {
                l = [lane(l[0], word(b, 0)), lane(l[1], word(b, 1)), lane(l[2], word(b, 2)), lane(l[3], word(b, 3))];
            }
            for x in l {
                self.add(x);
            }
        }
        let mut words = blocks.remainder().chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        for &b in words.remainder() {
            self.add(u64::from(b));
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.add(u64::from(x));
    }
    fn write_usize(&mut self, x: usize) {
        self.add(x as u64);
    }
}

impl FastHash {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(MIX);
    }
}

/// Builds [`FastHash`]ers from one random seed.
#[derive(Clone, Copy)]
pub struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Self {
        Seeded(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64))
    }
}

impl BuildHasher for Seeded {
    type Hasher = FastHash;
    fn build_hasher(&self) -> FastHash {
        FastHash(self.0)
    }
}

/// A checkpoint's handle: unique for the life of a cache (never reused after eviction).
pub type Handle = u64;

/// One node: a chunk-aligned prefix.
#[derive(Debug, Default)]
struct Node {
    parent: u32,
    /// The chunk from the parent to this node (empty for the root).
    key: Arc<[u32]>,
    /// Keyed by the children's own keys (one allocation per chunk, shared with the child).
    children: HashMap<Arc<[u32]>, u32, Seeded>,
    /// Live checkpoints whose position lies in `[depth * g, (depth + 1) * g)`: (tail, handle).
    checkpoints: Vec<(Box<[u32]>, Handle)>,
    /// In a tree that keeps them ([`PrefixTree::with_tails`]): the tokens past this node of the
    /// sequences that end within the next chunk (fewer than `g` each; none a prefix of another or
    /// of a child's key), so that a walk's `shared_tokens` counts them.
    tails: Vec<Box<[u32]>>,
}

/// Where a live checkpoint sits.
#[derive(Clone, Debug)]
pub struct Located {
    pub node: u32,
    pub position: usize,
}

/// What one walk down the tree found for a token sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// The deepest usable checkpoint: (position, handle), or None.
    pub checkpoint: Option<(usize, Handle)>,
    /// The longest chunk-aligned prefix shared with a sequence seen before.
    pub shared_chunks: usize,
    /// The longest prefix (in tokens, any position) shared with a sequence seen before, counting
    /// the partial chunk after `shared_chunks` against the children's keys (only when the walk
    /// was asked for it: it reads every child of the node where the walk stops).
    pub shared_tokens: usize,
    /// The child chunks of the node where the walk stopped (0: every sequence seen on this
    /// path ends within the next chunk).
    pub stop_children: usize,
    /// The node where the walk stopped: the one of `shared_chunks` tokens, where
    /// [`insert_path_from`](PrefixTree::insert_path_from) can resume.
    pub node: u32,
}

/// The prefix tree: sequences seen (their full chunks) and live checkpoints.
#[derive(Debug)]
pub struct PrefixTree {
    g: usize,
    keep_tails: bool,
    nodes: Vec<Node>,
    located: HashMap<Handle, Located, Seeded>,
}

impl PrefixTree {
    /// An empty tree with chunks of `g >= 1` tokens (the caller validates `g`).
    pub fn new(g: usize) -> Self {
        assert!(g >= 1, "chunk size must be >= 1");
        Self { g, keep_tails: false, nodes: vec![Node::default()], located: HashMap::default() }
    }

    /// An empty tree that also keeps each sequence's tokens past its last full chunk, so that an
    /// exact walk ([`walk_with`](Self::walk_with)) finds a branch point inside a sequence's last,
    /// partial chunk (fewer than `g` tokens more per sequence).
    pub fn with_tails(g: usize) -> Self {
        Self { keep_tails: true, ..Self::new(g) }
    }

    /// The chunk size.
    pub fn chunk(&self) -> usize {
        self.g
    }

    /// The number of live checkpoints.
    pub fn len(&self) -> usize {
        self.located.len()
    }

    /// Whether no checkpoint is live.
    pub fn is_empty(&self) -> bool {
        self.located.is_empty()
    }

    /// The position of a live checkpoint.
    pub fn position(&self, h: Handle) -> Option<usize> {
        self.located.get(&h).map(|l| l.position)
    }

    /// The number of child chunks of the node that holds a live checkpoint.
    pub fn children_of(&self, h: Handle) -> usize {
        self.located.get(&h).map_or(0, |l| self.nodes[l.node as usize].children.len())
    }

    /// Walks `tokens` from the root: the deepest live checkpoint at a position `<= max_position`
    /// whose prefix is `tokens[..position]`, and how far `tokens` follows sequences seen before.
    pub fn walk(&self, tokens: &[u32], max_position: usize) -> Walk {
        self.walk_with(tokens, max_position, false)
    }

    /// [`walk`](Self::walk), with `shared_tokens` at token granularity when `exact`.
    pub fn walk_with(&self, tokens: &[u32], max_position: usize, exact: bool) -> Walk {
        let g = self.g;
        let mut walk = Walk::default();
        let mut node = 0u32;
        let mut depth = 0usize; // tokens matched
        loop {
            let n = &self.nodes[node as usize];
            for (tail, h) in &n.checkpoints {
                let p = depth + tail.len();
                if p <= max_position && p <= tokens.len() && tokens[depth..p] == **tail && walk.checkpoint.map_or(true, |(q, _)| p > q) {
                    walk.checkpoint = Some((p, *h));
                }
            }
            let next = depth + g;
            match (next <= tokens.len()).then(|| self.child(node, &tokens[depth..next])).flatten() {
                Some(child) => {
                    node = child;
                    depth = next;
                }
                None => {
                    let rest = &tokens[depth..tokens.len().min(next)];
                    let lcp = |k: &[u32]| k.iter().zip(rest).take_while(|(a, b)| a == b).count();
                    let partial = if exact { n.children.keys().map(|k| lcp(k)).chain(n.tails.iter().map(|t| lcp(t))).max().unwrap_or(0) } else { 0 };
                    walk.shared_chunks = depth;
                    walk.shared_tokens = depth + partial;
                    walk.stop_children = n.children.len();
                    walk.node = node;
                    return walk;
                }
            }
        }
    }

    /// Records the full chunks of a sequence seen (creating their nodes; a tails tree also keeps
    /// its tokens past the last full chunk); returns the node of its deepest full chunk.
    pub fn insert_sequence(&mut self, tokens: &[u32]) -> u32 {
        *self.insert_path(tokens).last().expect("a path holds the root")
    }

    /// Records the full chunks of a sequence seen (and, in a tails tree, its partial last chunk);
    /// returns the nodes along it: `path[k]` is the
    /// node of its first `k` chunks (`path[0]` the root). [`find_exact_on`](Self::find_exact_on)
    /// and [`add_checkpoint_on`](Self::add_checkpoint_on) take it, so that one request hashes its
    /// chunks once.
    pub fn insert_path(&mut self, tokens: &[u32]) -> Vec<u32> {
        self.insert_path_from(tokens, None)
    }

    /// [`insert_path`](Self::insert_path), resuming at `known`: a node and its depth in chunks
    /// from an earlier walk of a prefix of `tokens` (nodes are never removed, so a walk's node
    /// stays valid). The path up to it is read back through the parents, each node's key checked
    /// against `tokens` instead of hashed; when the node does not stand for that prefix of
    /// `tokens` (another tree's walk, another sequence), the insert starts from the root.
    pub fn insert_path_from(&mut self, tokens: &[u32], known: Option<(u32, usize)>) -> Vec<u32> {
        let g = self.g;
        let mut path = Vec::with_capacity(tokens.len() / g + 1);
        let (start, mut node) = known.filter(|&(node, chunks)| self.stands_for(node, chunks, tokens)).map_or((0, 0), |(node, chunks)| (chunks, node));
        path.resize(start + 1, 0);
        let mut x = node;
        for c in (1..=start).rev() {
            path[c] = x;
            x = self.nodes[x as usize].parent;
        }
        for c in start..tokens.len() / g {
            let key = &tokens[c * g..(c + 1) * g];
            node = match self.child(node, key) {
                Some(child) => child,
                None => {
                    let id = u32::try_from(self.nodes.len()).expect("prefix tree holds fewer than 2^32 nodes");
                    let key: Arc<[u32]> = key.into();
                    self.nodes[node as usize].children.insert(Arc::clone(&key), id);
                    self.nodes.push(Node { parent: node, key, ..Node::default() });
                    id
                }
            };
            path.push(node);
        }
        let rest = &tokens[tokens.len() / g * g..];
        if self.keep_tails && !rest.is_empty() {
            let n = &mut self.nodes[node as usize];
            if !n.tails.iter().any(|t| t.starts_with(rest)) && !n.children.keys().any(|k| k.starts_with(rest)) {
                n.tails.retain(|t| !rest.starts_with(t));
                n.tails.push(rest.into());
            }
        }
        path
    }

    /// The child of `node` keyed by `key`. A node with one child (most of them: a path shared by
    /// every sequence through it) compares that child's key instead of hashing `key`.
    fn child(&self, node: u32, key: &[u32]) -> Option<u32> {
        let children = &self.nodes[node as usize].children;
        if children.len() == 1 {
            return children.iter().next().filter(|(k, _)| ***k == *key).map(|(_, &c)| c);
        }
        children.get(key).copied()
    }

    /// Whether `node` is the node of `tokens[..chunks * g]`: its key and its ancestors' keys are
    /// those chunks, and the root lies `chunks` parents up.
    fn stands_for(&self, node: u32, chunks: usize, tokens: &[u32]) -> bool {
        if (node as usize) >= self.nodes.len() || chunks * self.g > tokens.len() {
            return false;
        }
        let mut x = node;
        for c in (0..chunks).rev() {
            let n = &self.nodes[x as usize];
            if x == 0 || *n.key != tokens[c * self.g..(c + 1) * self.g] {
                return false;
            }
            x = n.parent;
        }
        x == 0
    }

    fn node_for(&mut self, tokens: &[u32], chunks: usize) -> u32 {
        self.insert_path(&tokens[..chunks * self.g])[chunks]
    }

    /// The live checkpoint for exactly `tokens[..position]`, given the path
    /// [`insert_path`](Self::insert_path) returned for `tokens` (`position <= tokens.len()`).
    pub fn find_exact_on(&self, path: &[u32], tokens: &[u32], position: usize) -> Option<Handle> {
        let node = path[position / self.g];
        let depth = position / self.g * self.g;
        self.nodes[node as usize].checkpoints.iter().find(|(tail, _)| **tail == tokens[depth..position]).map(|&(_, h)| h)
    }

    /// [`add_checkpoint`](Self::add_checkpoint) on a path from [`insert_path`](Self::insert_path).
    pub fn add_checkpoint_on(&mut self, path: &[u32], tokens: &[u32], position: usize, h: Handle) {
        let node = path[position / self.g];
        let tail: Box<[u32]> = tokens[position / self.g * self.g..position].into();
        self.nodes[node as usize].checkpoints.push((tail, h));
        self.located.insert(h, Located { node, position });
    }

    /// The live checkpoint for exactly `tokens[..position]`, if any.
    pub fn find_exact(&self, tokens: &[u32], position: usize) -> Option<Handle> {
        let g = self.g;
        let mut node = 0u32;
        for c in 0..position / g {
            node = self.child(node, &tokens[c * g..(c + 1) * g])?;
        }
        let depth = position / g * g;
        self.nodes[node as usize].checkpoints.iter().find(|(tail, _)| **tail == tokens[depth..position]).map(|&(_, h)| h)
    }

    /// Adds a live checkpoint for `tokens[..position]` under handle `h` (the caller checks that
    /// none exists for that prefix and that `h` is new).
    pub fn add_checkpoint(&mut self, tokens: &[u32], position: usize, h: Handle) {
        let g = self.g;
        let node = self.node_for(tokens, position / g);
        let tail: Box<[u32]> = tokens[position / g * g..position].into();
        self.nodes[node as usize].checkpoints.push((tail, h));
        self.located.insert(h, Located { node, position });
    }

    /// Removes a live checkpoint; returns its position, or None when `h` is not live.
    pub fn remove_checkpoint(&mut self, h: Handle) -> Option<usize> {
        let l = self.located.remove(&h)?;
        let list = &mut self.nodes[l.node as usize].checkpoints;
        let i = list.iter().position(|&(_, x)| x == h).expect("a located checkpoint is on its node");
        list.swap_remove(i);
        Some(l.position)
    }

    /// The position of the deepest live checkpoint strictly above `h` on its path (0 when none):
    /// what a request falls back to if `h` is evicted. Walks `O(depth / g)` nodes.
    pub fn ancestor_position(&self, h: Handle) -> usize {
        self.ancestor_position_where(h, |_| true)
    }

    /// [`ancestor_position`](Self::ancestor_position) counting only the checkpoints `keep` accepts.
    pub fn ancestor_position_where(&self, h: Handle, keep: impl Fn(Handle) -> bool) -> usize {
        let Some(l) = self.located.get(&h) else { return 0 };
        let mut node = l.node;
        let mut best = 0usize;
        // On the checkpoint's own node: the deepest other checkpoint whose tail prefixes this one's.
        let own = &self.nodes[node as usize].checkpoints;
        let own_tail = own.iter().find(|&&(_, x)| x == h).map(|(t, _)| t.clone()).unwrap_or_default();
        let depth = self.depth_of(node);
        for (tail, x) in own {
            if *x != h && keep(*x) && tail.len() < own_tail.len() && own_tail.starts_with(tail) {
                best = best.max(depth + tail.len());
            }
        }
        if best > 0 {
            return best;
        }
        let mut d = depth;
        while node != 0 {
            node = self.nodes[node as usize].parent;
            d -= self.g;
            // Any checkpoint on an ancestor node with a tail lying on the path: the path's tokens
            // below a node are its child's key, so compare against that key.
            if let Some(p) = self.deepest_on_path(node, l.node, d, &keep) {
                return p;
            }
        }
        0
    }

    fn depth_of(&self, mut node: u32) -> usize {
        let mut d = 0;
        while node != 0 {
            node = self.nodes[node as usize].parent;
            d += self.g;
        }
        d
    }

    /// The deepest checkpoint on `node` (at depth `d`) whose tail follows the path towards `target`.
    fn deepest_on_path(&self, node: u32, target: u32, d: usize, keep: &impl Fn(Handle) -> bool) -> Option<usize> {
        let list = &self.nodes[node as usize].checkpoints;
        if list.is_empty() {
            return None;
        }
        // The child of `node` on the way to `target`.
        let mut child = target;
        while self.nodes[child as usize].parent != node {
            child = self.nodes[child as usize].parent;
        }
        let key = &self.nodes[child as usize].key;
        list.iter().filter(|(tail, x)| keep(*x) && key.starts_with(tail)).map(|(tail, _)| d + tail.len()).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_finds_the_deepest_checkpoint_and_the_shared_prefix() {
        let mut t = PrefixTree::new(4);
        let a: Vec<u32> = (0..12).collect();
        t.insert_sequence(&a);
        t.add_checkpoint(&a, 4, 1);
        t.add_checkpoint(&a, 10, 2);
        let mut b = a.clone();
        b[9] = 99;
        let w = t.walk_with(&b, b.len() - 1, true);
        assert_eq!(w.checkpoint, Some((4, 1)), "the tail of checkpoint 2 differs at token 9");
        assert_eq!(w.shared_chunks, 8);
        assert_eq!(w.shared_tokens, 9);
        assert_eq!(t.walk(&a, 11).checkpoint, Some((10, 2)));
        assert_eq!(t.walk(&a, 9).checkpoint, Some((4, 1)), "capped by max_position");
        assert_eq!(t.find_exact(&a, 10), Some(2));
        assert_eq!(t.ancestor_position(2), 4);
        assert_eq!(t.remove_checkpoint(1), Some(4));
        assert_eq!(t.ancestor_position(2), 0);
        assert_eq!(t.remove_checkpoint(1), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_tree_with_tails_counts_a_sequences_partial_last_chunk() {
        let a: Vec<u32> = (0..11).collect(); // two chunks of 4, then 3 tokens
        let mut b = a[..10].to_vec();
        b.extend([70, 71]);
        let (mut plain, mut tails) = (PrefixTree::new(4), PrefixTree::with_tails(4));
        for t in [&mut plain, &mut tails] {
            t.insert_sequence(&a[..9]);
            t.insert_sequence(&a);
            t.insert_sequence(&a[..10]);
        }
        assert_eq!(plain.walk_with(&b, 0, true).shared_tokens, 8, "without tails: the last full chunk");
        assert_eq!(tails.walk_with(&b, 0, true).shared_tokens, 10);
        assert_eq!(tails.walk_with(&b, 0, false).shared_tokens, 8, "only an exact walk reads them");
        assert_eq!(tails.nodes[2].tails.len(), 1, "a tail that prefixes another is not kept twice");
        tails.insert_sequence(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        tails.insert_sequence(&a);
        assert_eq!(tails.nodes[2].tails.len(), 1, "nor one that prefixes a child's key");
    }

    #[test]
    fn an_insert_resumes_at_a_walks_node_only_when_it_stands_for_the_prefix() {
        let mut t = PrefixTree::new(2);
        let a: Vec<u32> = (0..9).collect();
        let path_a = t.insert_path(&a);
        let mut b = a.clone();
        b.extend([70, 71, 72]);
        let w = t.walk(&b, 0);
        assert_eq!((w.node, w.shared_chunks), (path_a[4], 8));
        let mut fresh = PrefixTree::new(2);
        fresh.insert_path(&a);
        let want = fresh.insert_path(&b);
        assert_eq!(t.insert_path_from(&b, Some((w.node, 4))), want);
        // A node that is not the prefix's (another sequence, a wrong depth, another tree's id)
        // falls back to the walk from the root: same path, no node made twice.
        let mut c = b.clone();
        c[1] = 99;
        let nodes = t.nodes.len();
        let from_root = t.insert_path(&c);
        for known in [(w.node, 4), (w.node, 3), (path_a[2], 4), (10_000, 4), (0, 1)] {
            assert_eq!(t.insert_path_from(&c, Some(known)), from_root, "{known:?}");
        }
        assert_eq!(t.nodes.len(), nodes + 6, "c differs in its first chunk: six new nodes, once");
    }
}
