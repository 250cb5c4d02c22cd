//! Causal grouped-query attention of a step's new rows against their sequences' KV
//! caches on the CPU, shared out over the thread team.
//!
//! A step with many (row, key/value head) pairs — a prefill, or many sequences
//! decoding — gives each pair to one task, in which the query heads that share a
//! key/value head read its cache once. A step with few pairs over long contexts — one
//! sequence of a model with three key/value heads on two cores, or eight heads on
//! sixteen — would leave cores idle that way while one pair streams thousands of
//! positions. Such a step runs in three loops instead: the scores by stretches of
//! positions, the softmax by query head, and the weighted sums by slices of the head's
//! width. Each score, weight and output value is the same chain of arithmetic in
//! either plan (a weighted sum's output is one chain of multiply-adds in position
//! order, which a slice of the width keeps and a stretch of positions would not), so
//! the plan, chosen from the step's shape and the team's size, never changes a bit of
//! the result.
//!
//! Rows that read the same cache memory — a prompt's choices decoding side by side, a
//! long prefill's rows — run in gangs ([`gangs`]), each of which reads a shared stretch
//! once for all its rows' query heads, with the same bits again.
//!
//! A sliding-window layer's row reads only the positions in its window: the ones
//! before it get no weight, and adding their zero products leaves every sum as it is.

use std::ops::Range;

use half::f16;

use crate::cpu::F32Ops;
use crate::cpu::team::for_each_chunk_mut;
use crate::kv_cache::KvCache;

/// Keys and values of consecutive positions of one (layer, key/value head), and how
/// many positions they hold.
type Part<'a> = (&'a [f16], &'a [f16], usize);

/// Positions `range` of `parts` (end to end, `hd` halves a position), as parts.
fn cut<'a>(parts: &[Part<'a>], hd: usize, range: Range<usize>) -> Vec<Part<'a>> {
    let mut start = 0;
    let mut out = Vec::new();
    for &(k, v, len) in parts {
        let (a, b) = (range.start.max(start), range.end.min(start + len));
        if a < b {
            let (a, b) = ((a - start) * hd, (b - start) * hd);
            out.push((&k[a..b], &v[a..b], (b - a) / hd));
        }
        start += len;
    }
    out
}

/// One layer's attention in a step: its heads and the rows' sequences.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layer<'a> {
    /// The layer's index in the caches.
    pub layer: usize,
    pub head_dim: usize,
    pub n_kv_heads: usize,
    /// Query heads per key/value head.
    pub group: usize,
    /// The scores' factor before the softmax.
    pub scale: f32,
    /// Positions a sliding-window layer sees (None for a global layer).
    pub window: Option<usize>,
    /// Each sequence's cache, with the step's positions already appended.
    pub caches: &'a [&'a KvCache],
    /// Each row's sequence (an index into `caches`) and position.
    pub owner: &'a [usize],
    pub positions: &'a [usize],
}

/// Loops the team balances well on its own: with this many pairs a thread, the
/// pairs' claims even out.
const PAIRS_A_THREAD: usize = 8;

/// The fewest positions any pair of a step must see before splitting pays for the
/// two extra loops.
const SPLIT_FROM: usize = 512;

/// Positions at least in a stretch of the split plan's scores.
const STRETCH_MIN: usize = 64;

/// Halves in a cache line: a slice of the width is a whole number of them, so that
/// the split plan's tasks do not share the lines they read.
const LINE_HALVES: usize = 32;

/// How a step's attention is shared out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// One task per (row, key/value head).
    Pairs,
    /// One task per (gang of rows that read the same memory, key/value head).
    Gangs(Vec<Vec<usize>>),
    /// Scores in `stretches` stretches of positions per pair, softmax per query head,
    /// weighted sums in `slices` slices of the head's width per pair.
    Split { stretches: usize, slices: usize },
}

impl Layer<'_> {
    /// The positions row `r` sees: from its window's start to its own position.
    fn span(&self, r: usize) -> Range<usize> {
        let n = self.positions[r] + 1;
        self.window.map_or(0, |w| n.saturating_sub(w))..n
    }

    /// The cache of row `r` under key/value head `g`, over `range` of its positions,
    /// part by part.
    fn parts(&self, r: usize, g: usize, range: Range<usize>) -> Vec<Part<'_>> {
        let cache = self.caches[self.owner[r]];
        let all = cache.parts(self.layer * self.n_kv_heads + g, range.end);
        cut(&all, self.head_dim, range)
    }

    /// Row `r`'s query heads that share key/value head `g`, side by side.
    fn queries<'q>(&self, q: &'q [f32], r: usize, g: usize) -> &'q [f32] {
        let width = self.group * self.head_dim;
        let row = &q[r * self.n_kv_heads * width..][..self.n_kv_heads * width];
        &row[g * width..(g + 1) * width]
    }

    /// The plan for this step on `threads` threads.
    pub(crate) fn plan(&self, threads: usize) -> Plan {
        let rows = self.positions.len();
        let pairs = rows * self.n_kv_heads;
        // Gangs of two rows at least, as large as still gives each thread two tasks,
        // where they give each thread one at least.
        let most = pairs.div_ceil(2 * threads).clamp(2, gangs::MOST_ROWS);
        if let Some(gangs) = self.gangs(most, gangs::PREFILL_FROM)
            && gangs.len() * self.n_kv_heads >= threads
        {
            return Plan::Gangs(gangs);
        }
        if threads < 2 || pairs >= PAIRS_A_THREAD * threads {
            return Plan::Pairs;
        }
        let lengths: Vec<usize> = (0..rows).map(|r| self.span(r).len()).collect();
        if lengths.iter().any(|&n| n < SPLIT_FROM) {
            return Plan::Pairs;
        }
        // The pairs' work dealt out longest first, as the team's claims roughly do:
        // split when the busiest thread would have a tenth more than its share.
        let mut work: Vec<usize> = lengths
            .iter()
            .flat_map(|&n| std::iter::repeat_n(n, self.n_kv_heads))
            .collect();
        work.sort_unstable_by(|a, b| b.cmp(a));
        let mut load = vec![0usize; threads];
        for w in work {
            *load.iter_mut().min().expect("threads") += w;
        }
        let total: usize = load.iter().sum();
        let busiest = load.into_iter().max().unwrap_or(0);
        if 10 * busiest * threads <= 11 * total {
            return Plan::Pairs;
        }
        let stretches = (4 * threads).div_ceil(pairs);
        let mut slices = 1;
        while pairs * slices < 2 * threads && self.head_dim.is_multiple_of(2 * slices * LINE_HALVES)
        {
            slices *= 2;
        }
        Plan::Split { stretches, slices }
    }
}

/// `out` = attention of every row of `q` (rows of `n_kv_heads × group` query heads)
/// against its sequence's cache: rows of heads side by side, as `q`.
pub(crate) fn attend(ops: F32Ops, layer: &Layer<'_>, q: &[f32], out: &mut [f32]) {
    match layer.plan(crate::cpu::team::threads()) {
        Plan::Pairs => by_pairs(ops, layer, q, out),
        Plan::Gangs(gangs) => gangs::by_gangs(ops, layer, q, out, &gangs),
        Plan::Split { stretches, slices } => split(ops, layer, q, out, stretches, slices),
    }
}

/// One task per (row, key/value head).
fn by_pairs(ops: F32Ops, l: &Layer<'_>, q: &[f32], out: &mut [f32]) {
    let (hd, group, nkv) = (l.head_dim, l.group, l.n_kv_heads);
    for_each_chunk_mut(out, group * hd, |i, heads| {
        pair(ops, l, q, i / nkv, i % nkv, heads)
    });
}

/// Row `r`'s attention under key/value head `g`, into its `group` output heads.
fn pair(ops: F32Ops, l: &Layer<'_>, q: &[f32], r: usize, g: usize, heads: &mut [f32]) {
    let (hd, group) = (l.head_dim, l.group);
    let span = l.span(r);
    let parts = l.parts(r, g, span.clone());
    let mut weights = vec![0f32; group * span.len()];
    scores(ops, l.queries(q, r, g), group, &parts, hd, &mut weights);
    for row in weights.chunks_exact_mut(span.len()) {
        ops.softmax(row, l.scale);
    }
    heads.fill(0.0);
    weighted_sums(ops, &weights, group, &parts, hd, 0, heads);
}

/// The three loops of [`Plan::Split`].
fn split(ops: F32Ops, l: &Layer<'_>, q: &[f32], out: &mut [f32], stretches: usize, slices: usize) {
    let (hd, group, nkv) = (l.head_dim, l.group, l.n_kv_heads);
    let rows = l.positions.len();
    let spans: Vec<Range<usize>> = (0..rows).map(|r| l.span(r)).collect();
    // Every pair's scores, then weights: `group` rows of its span's positions, pair
    // after pair.
    let mut weights = vec![0f32; spans.iter().map(|s| nkv * group * s.len()).sum()];

    // The scores, a task per stretch of a pair's positions; each task writes its
    // stretch of the pair's `group` rows.
    struct Stretch<'w> {
        r: usize,
        g: usize,
        positions: Range<usize>,
        rows: Vec<&'w mut [f32]>,
    }
    let mut tasks: Vec<Stretch<'_>> = Vec::new();
    let mut rest: &mut [f32] = &mut weights;
    for (r, span) in spans.iter().enumerate() {
        let n = span.len();
        let step = n.div_ceil(stretches).next_multiple_of(8).max(STRETCH_MIN);
        for g in 0..nkv {
            let first = tasks.len();
            for a in (0..n).step_by(step) {
                let positions = span.start + a..span.start + (a + step).min(n);
                let rows = Vec::with_capacity(group);
                tasks.push(Stretch {
                    r,
                    g,
                    positions,
                    rows,
                });
            }
            for _ in 0..group {
                let (mut row, after) = std::mem::take(&mut rest).split_at_mut(n);
                rest = after;
                for task in &mut tasks[first..] {
                    let (piece, after) =
                        std::mem::take(&mut row).split_at_mut(task.positions.len());
                    row = after;
                    task.rows.push(piece);
                }
            }
        }
    }
    for_each_chunk_mut(&mut tasks, 1, |_, task| {
        let Stretch {
            r,
            g,
            positions,
            rows,
        } = &mut task[0];
        let parts = l.parts(*r, *g, positions.clone());
        let mut s = vec![0f32; group * positions.len()];
        scores(ops, l.queries(q, *r, *g), group, &parts, hd, &mut s);
        for (row, s) in rows.iter_mut().zip(s.chunks_exact(positions.len())) {
            row.copy_from_slice(s);
        }
    });
    drop(tasks);

    // The softmax of each query head's row.
    let mut heads: Vec<&mut [f32]> = Vec::with_capacity(rows * nkv * group);
    let mut rest: &mut [f32] = &mut weights;
    for span in &spans {
        for _ in 0..nkv * group {
            let (row, after) = std::mem::take(&mut rest).split_at_mut(span.len());
            rest = after;
            heads.push(row);
        }
    }
    for_each_chunk_mut(&mut heads, 1, |_, row| ops.softmax(row[0], l.scale));
    drop(heads);

    // The weighted sums, a task per slice of a pair's width; each task writes its
    // slice of the pair's `group` output heads.
    struct Slice<'o> {
        r: usize,
        g: usize,
        weights: Range<usize>,
        dims: Range<usize>,
        heads: Vec<&'o mut [f32]>,
    }
    let width = hd / slices;
    let mut tasks: Vec<Slice<'_>> = Vec::with_capacity(rows * nkv * slices);
    let mut at = 0;
    for ((r, span), row) in spans
        .iter()
        .enumerate()
        .zip(out.chunks_exact_mut(nkv * group * hd))
    {
        for (g, pair) in row.chunks_exact_mut(group * hd).enumerate() {
            let first = tasks.len();
            let weights = at..at + group * span.len();
            at = weights.end;
            for s in 0..slices {
                let dims = s * width..(s + 1) * width;
                let heads = Vec::with_capacity(group);
                tasks.push(Slice {
                    r,
                    g,
                    weights: weights.clone(),
                    dims,
                    heads,
                });
            }
            for head in pair.chunks_exact_mut(hd) {
                for (task, piece) in tasks[first..].iter_mut().zip(head.chunks_exact_mut(width)) {
                    task.heads.push(piece);
                }
            }
        }
    }
    for_each_chunk_mut(&mut tasks, 1, |_, task| {
        let Slice {
            r,
            g,
            weights: w,
            dims,
            heads,
        } = &mut task[0];
        let parts = l.parts(*r, *g, spans[*r].clone());
        let mut sums = vec![0f32; group * dims.len()];
        weighted_sums(
            ops,
            &weights[w.clone()],
            group,
            &parts,
            hd,
            dims.start,
            &mut sums,
        );
        for (head, s) in heads.iter_mut().zip(sums.chunks_exact(dims.len())) {
            head.copy_from_slice(s);
        }
    });
}

/// `out[h][t]` = query head `h` of `q` (`group` heads side by side) against key `t`
/// of `parts`, positions end to end (`out`: `group` rows of all the parts'
/// positions).
fn scores(ops: F32Ops, q: &[f32], group: usize, parts: &[Part<'_>], hd: usize, out: &mut [f32]) {
    if let [(keys, _, _)] = parts {
        return ops.dots(q, group, keys, hd, out);
    }
    let n = out.len() / group;
    let mut part_rows = Vec::new();
    let mut start = 0;
    for &(keys, _, len) in parts {
        part_rows.resize(group * len, 0.0);
        ops.dots(q, group, keys, hd, &mut part_rows);
        for (row, part) in out.chunks_exact_mut(n).zip(part_rows.chunks_exact(len)) {
            row[start..start + len].copy_from_slice(part);
        }
        start += len;
    }
}

/// `out[h] += Σ_t weights[h][t] · values[t][from..from + width]` over the positions
/// of `parts` in order (`weights`: `group` rows of them; `out`: `group` heads of
/// `width`), so that each output value is one chain of multiply-adds in position
/// order however the cache is cut into parts or the head into slices.
fn weighted_sums(
    ops: F32Ops,
    weights: &[f32],
    group: usize,
    parts: &[Part<'_>],
    hd: usize,
    from: usize,
    out: &mut [f32],
) {
    if let [(_, values, _)] = parts {
        return ops.weighted_sum(weights, group, &values[from..], hd, out);
    }
    let n = weights.len() / group;
    let mut part_rows = Vec::new();
    let mut start = 0;
    for &(_, values, len) in parts {
        part_rows.clear();
        for row in weights.chunks_exact(n) {
            part_rows.extend_from_slice(&row[start..start + len]);
        }
        ops.weighted_sum(&part_rows, group, &values[from..], hd, out);
        start += len;
    }
}

mod gangs;
#[cfg(test)]
mod tests;
