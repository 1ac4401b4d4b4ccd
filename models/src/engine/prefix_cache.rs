//! The automatic prefix cache: full KV blocks that finished sequences leave behind, found
//! again by their tokens, so a later request that starts with the same tokens (the next turn
//! of an episode, a shared system prompt, a sequence recomputed after preemption) skips their
//! prefill. A trie over blocks: a node is one full block of tokens under its parent, the
//! root the empty prefix, so a match is exact, token by token (no hashes that could collide).
//!
//! It holds no references: a cached block nobody uses has reference count 0 and waits in an
//! LRU order until the pool needs it (then it and everything cached under it are dropped).
//! The K/V of a block depend on the weights, so the engine clears the cache on every refit.
//! Reference counts live in the pool (`block_pool.rs`), which calls in here.

use std::collections::{BTreeSet, HashMap};

/// A node of the trie (an index into its arena).
pub(crate) type NodeId = usize;

/// The node of the empty prefix.
pub(crate) const ROOT: NodeId = 0;

#[derive(Debug, Default)]
struct Node {
    /// The KV block holding this node's tokens (unused for the root).
    block: usize,
    parent: NodeId,
    /// This block's tokens (the key under `parent`).
    tokens: Box<[u32]>,
    children: HashMap<Box<[u32]>, NodeId>,
    /// Clock of the last match or insertion.
    last_used: u64,
    /// The `idle` key while nobody references the block.
    parked: Option<u64>,
}

/// The trie of cached blocks and the LRU order of the ones nobody references.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    nodes: Vec<Node>,
    spare_nodes: Vec<NodeId>,
    node_of_block: Vec<Option<NodeId>>,
    /// `(last_used, block)` of cached blocks with reference count 0, oldest first.
    idle: BTreeSet<(u64, usize)>,
    clock: u64,
}

impl PrefixCache {
    /// An empty cache for a pool of `num_blocks` blocks.
    pub fn new(num_blocks: usize) -> PrefixCache {
        PrefixCache {
            nodes: vec![Node::default()],
            spare_nodes: vec![],
            node_of_block: vec![None; num_blocks],
            idle: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Blocks in the cache (in use or idle).
    pub fn len(&self) -> usize {
        self.nodes.len() - 1 - self.spare_nodes.len()
    }

    /// Cached blocks nobody references (the pool may take them back).
    pub fn num_idle(&self) -> usize {
        self.idle.len()
    }

    /// Whether `block` is in the cache.
    pub fn holds(&self, block: usize) -> bool {
        self.node_of_block[block].is_some()
    }

    /// The child of `node` whose block holds exactly `tokens`, and its block.
    pub fn child(&self, node: NodeId, tokens: &[u32]) -> Option<(NodeId, usize)> {
        let c = *self.nodes[node].children.get(tokens)?;
        Some((c, self.nodes[c].block))
    }

    /// Marks `node` (and so its prefix) as just used.
    pub fn touch(&mut self, node: NodeId) {
        self.clock += 1;
        self.nodes[node].last_used = self.clock;
    }

    /// Caches `block`, holding `tokens`, under `parent`. Returns its node, or `None` when
    /// `parent` already has a child with these tokens (another sequence computed the same
    /// block) or `block` is cached already.
    pub fn insert(&mut self, parent: NodeId, tokens: &[u32], block: usize) -> Option<NodeId> {
        if self.holds(block) || self.nodes[parent].children.contains_key(tokens) {
            return None;
        }
        self.clock += 1;
        let node = Node {
            block,
            parent,
            tokens: tokens.into(),
            children: HashMap::new(),
            last_used: self.clock,
            parked: None,
        };
        let id = match self.spare_nodes.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.nodes[parent].children.insert(tokens.into(), id);
        self.node_of_block[block] = Some(id);
        Some(id)
    }

    /// `block`, cached, lost its last reference: it waits to be matched again or evicted.
    pub fn park(&mut self, block: usize) {
        if let Some(n) = self.node_of_block[block] {
            let at = self.nodes[n].last_used;
            self.nodes[n].parked = Some(at);
            self.idle.insert((at, block));
        }
    }

    /// `block`, cached and idle, is referenced again.
    pub fn unpark(&mut self, block: usize) {
        if let Some(at) = self.node_of_block[block].and_then(|n| self.nodes[n].parked.take()) {
            self.idle.remove(&(at, block));
        }
    }

    /// Drops the least recently used idle block and every block cached under it (all idle:
    /// a sequence holding a block holds the blocks of its whole prefix). Returns the blocks
    /// now free, or an empty list when nothing is idle.
    pub fn evict_oldest(&mut self) -> Vec<usize> {
        let Some(&(_, block)) = self.idle.iter().next() else {
            return vec![];
        };
        let Some(node) = self.node_of_block[block] else {
            return vec![];
        };
        let parent = self.nodes[node].parent;
        let key = std::mem::take(&mut self.nodes[node].tokens);
        self.nodes[parent].children.remove(&key);
        let mut freed = vec![];
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            let Node {
                block,
                children,
                parked,
                ..
            } = std::mem::take(&mut self.nodes[n]);
            stack.extend(children.into_values());
            self.node_of_block[block] = None;
            self.spare_nodes.push(n);
            // Only idle blocks are free; a referenced one (which the invariant above rules
            // out) would stay with its sequence, uncached.
            if let Some(at) = parked {
                self.idle.remove(&(at, block));
                freed.push(block);
            }
        }
        freed
    }

    /// Empties the cache (the weights changed). Returns the idle blocks, now free; blocks
    /// still referenced stay with their sequences, uncached.
    pub fn clear(&mut self) -> Vec<usize> {
        let idle = std::mem::take(&mut self.idle);
        self.nodes.truncate(1);
        self.nodes[ROOT].children.clear();
        self.spare_nodes.clear();
        self.node_of_block.iter_mut().for_each(|n| *n = None);
        idle.into_iter().map(|(_, b)| b).collect()
    }
}
