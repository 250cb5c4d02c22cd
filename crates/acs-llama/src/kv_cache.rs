//! One sequence's keys and values on the CPU: half floats per (layer, key/value
//! head), with the positions a fork shares held once.

use std::sync::Arc;

use half::f16;

use crate::arch::KV_VALUE_BYTES;
use crate::cpu::F32Ops;

/// One sequence's keys and values for every layer so far.
///
/// Each (layer, key/value head) has its own buffer of positions end to end, so that
/// attention streams a head's keys and values through contiguous memory (whole
/// positions side by side would make it stride over the other heads).
///
/// Values are half floats, rounded to nearest even and saturated at ±65504 (what
/// [`F32Ops::append_halves`] and the GPU's `half.wgsl` compute, bit for bit): a
/// sequence's cache takes half the memory of f32, so twice the rollouts fit in a KV
/// budget, and attention reads half the bytes. The rounding is below what the 8-bit
/// rounding of every matmul input already costs.
///
/// The caches [`KvCache::fork`]ed from one another share the positions they had in
/// common, read-only, instead of each holding a copy: a prompt's n choices hold its
/// positions once, so n rollouts of a long prompt take about 1/n of the memory, and
/// a step's attention reads the one copy once for each gang of up to 16 of them
/// (the attention's gangs), not once for each.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// The first positions, shared with other caches, oldest first.
    shared: Vec<Arc<KvSegment>>,
    /// This cache's own positions after the shared ones:
    /// `[layer * n_kv_heads + head]`: positions × `head_dim` values.
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    /// Positions in all, shared and own.
    len: usize,
    head_dim: usize,
    n_kv_heads: usize,
}

/// Positions frozen by a [`KvCache::fork`], laid out as a cache's own ones.
#[derive(Debug)]
struct KvSegment {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    len: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of `n_kv_heads` heads `head_dim` wide.
    pub(crate) fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> KvCache {
        let heads = n_layers * n_kv_heads;
        KvCache {
            shared: Vec::new(),
            k: vec![Vec::new(); heads],
            v: vec![Vec::new(); heads],
            len: 0,
            head_dim,
            n_kv_heads,
        }
    }

    /// Counts `n` more positions, once every layer has appended them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of memory this cache takes, for memory accounting: the capacity of its
    /// own buffers (which [`KvCache::reserve`] and [`KvCache::fork`] set) and an equal
    /// share of each segment it shares, so that the caches that share one add up to
    /// its size.
    pub fn bytes(&self) -> usize {
        let capacity = |k: &[Vec<f16>], v: &[Vec<f16>]| -> usize {
            k.iter()
                .chain(v)
                .map(|b| b.capacity() * KV_VALUE_BYTES)
                .sum()
        };
        let shared: usize = self
            .shared
            .iter()
            .map(|s| capacity(&s.k, &s.v) / Arc::strong_count(s))
            .sum();
        capacity(&self.k, &self.v) + shared
    }

    /// Positions held in shared segments, before this cache's own.
    fn shared_len(&self) -> usize {
        self.shared.iter().map(|s| s.len).sum()
    }

    /// Makes room for `positions` positions in all, so that the appends up to there
    /// never reallocate. A cache left to grow on its own doubles: its memory can reach
    /// twice what it holds (twice what a scheduler reserved for it), and each doubling
    /// copies it.
    pub fn reserve(&mut self, positions: usize) {
        let more = positions.saturating_sub(self.len) * self.head_dim;
        for buf in self.k.iter_mut().chain(&mut self.v) {
            buf.reserve_exact(more);
        }
    }

    /// A branch with room for `positions` positions (at least the ones it holds):
    /// how a choice branches from its prompt's cache. The positions this cache holds
    /// become a segment that both share, read-only (this cache's own buffers move
    /// there, trimmed to their length, and it keeps growing in new ones with the room
    /// it had left): nothing is copied, and each cache appends on its own from there,
    /// the branch with room reserved up to `positions` so that its first token does
    /// not reallocate. A cache that holds no positions of its own (all shared) is left
    /// as it is: a kept prompt (see the engine's prompt cache) stays at its size
    /// however many branches it gives.
    pub fn fork(&mut self, positions: usize) -> KvCache {
        let hd = self.head_dim;
        let room = positions.saturating_sub(self.len) * hd;
        let own = self.len - self.shared_len();
        let fresh =
            |n: usize, room: usize| (0..n).map(|_| Vec::with_capacity(room)).collect::<Vec<_>>();
        if own > 0 {
            let heads = self.k.len();
            let left = self.k.first().map_or(0, |b| b.capacity() - own * hd);
            let freeze = |bufs: &mut Vec<Vec<f16>>| {
                let mut frozen = std::mem::replace(bufs, fresh(heads, left));
                for b in &mut frozen {
                    b.shrink_to_fit();
                }
                frozen
            };
            let segment = KvSegment {
                k: freeze(&mut self.k),
                v: freeze(&mut self.v),
                len: own,
            };
            self.shared.push(Arc::new(segment));
        }
        KvCache {
            shared: self.shared.clone(),
            k: fresh(self.k.len(), room),
            v: fresh(self.v.len(), room),
            len: self.len,
            head_dim: self.head_dim,
            n_kv_heads: self.n_kv_heads,
        }
    }

    /// A cache of its own (sharing nothing) that holds a copy of this cache's first
    /// `prefix` positions, with room up to `positions`: a prompt that begins with the
    /// tokens of a prompt prefilled earlier prefills only the rest. A position's keys
    /// and values depend on the tokens up to it alone, so the copy holds what
    /// prefilling those tokens again would give.
    pub fn copy_prefix(&self, prefix: usize, positions: usize) -> KvCache {
        assert!(prefix <= self.len, "{prefix} of {} positions", self.len);
        let hd = self.head_dim;
        let room = positions.max(prefix) * hd;
        let copy = |at: usize, values: bool| {
            let mut buf = Vec::with_capacity(room);
            for (k, v, _) in self.parts(at, prefix) {
                buf.extend_from_slice(if values { v } else { k });
            }
            buf
        };
        let heads = self.k.len();
        KvCache {
            shared: Vec::new(),
            k: (0..heads).map(|at| copy(at, false)).collect(),
            v: (0..heads).map(|at| copy(at, true)).collect(),
            len: prefix,
            head_dim: hd,
            n_kv_heads: self.n_kv_heads,
        }
    }

    /// The keys and values of (layer, head) `at` for the first `n` positions, part by
    /// part (shared segments, then this cache's own), with each part's positions. The
    /// own part's length is its buffer's: a step appends its positions layer by layer
    /// before [`KvCache::len`] counts them.
    pub(crate) fn parts(&self, at: usize, n: usize) -> Vec<(&[f16], &[f16], usize)> {
        let hd = self.head_dim;
        let segments = self.shared.iter().map(|s| (&s.k[at], &s.v[at], s.len));
        let own = (&self.k[at], &self.v[at], self.k[at].len() / hd);
        let mut left = n;
        let mut parts = Vec::with_capacity(self.shared.len() + 1);
        for (k, v, len) in segments.chain([own]) {
            let take = len.min(left);
            if take > 0 {
                parts.push((&k[..take * hd], &v[..take * hd], take));
            }
            left -= take;
        }
        parts
    }

    /// Appends layer `layer`'s keys and values of new positions (each position's
    /// heads side by side, as the projections give them).
    pub(crate) fn append(&mut self, ops: F32Ops, layer: usize, k: &[f32], v: &[f32]) {
        let (hd, n) = (self.head_dim, self.n_kv_heads);
        for (src, dst) in [(k, &mut self.k), (v, &mut self.v)] {
            let heads = &mut dst[layer * n..(layer + 1) * n];
            for pos in src.chunks_exact(hd * n) {
                for (buf, head) in heads.iter_mut().zip(pos.chunks_exact(hd)) {
                    ops.append_halves(head, buf);
                }
            }
        }
    }
}
