//! Attention of rows that read the same cache memory, together: a prompt's choices
//! decoding side by side (their caches share the prompt's positions), or a long
//! prefill's rows (each sees the positions before the first of them).
//!
//! Each row alone streams every shared key and value from memory once a step, so n
//! choices of a long prompt read it n times; a gang reads each stretch of it once,
//! for all its rows' query heads, while the stretch is in L1. Every score, weight
//! and output value is the same chain of arithmetic as in [`super::by_pairs`]: the
//! scores do not depend on which heads share a call, and each output value is one
//! chain of multiply-adds in position order (the shared positions come first in
//! every row's span, then its own), so ganging never changes a bit of the result.

use std::collections::HashMap;

use super::{Layer, Part, cut, pair, scores, weighted_sums};
use crate::cpu::F32Ops;
use crate::cpu::team::for_each_chunk_mut;

/// Rows at most in one gang: enough query heads to read each key and value once
/// for many of them, and a bound on a task's weights (its rows' spans).
pub(super) const MOST_ROWS: usize = 16;

/// The fewest positions a prefill's rows (rows of one sequence) must each see before
/// they run in gangs. Their gang reads the positions before its first row once, but
/// gathers and scatters every score and weight, and each row's last few positions run
/// alone: for a prefill's early rows, which share few positions, that costs more than
/// the shared reads save (`docs/performance.md` has the prefills measured both ways).
/// A prompt's choices (rows of different sequences) share their whole prompt and gang
/// at any length.
pub(super) const PREFILL_FROM: usize = 2048;

/// Bytes of halves in a stretch of shared keys or values: each is read from memory
/// once and then from L1 by every four query heads of the gang.
const STRETCH_BYTES: usize = 16 << 10;

impl Layer<'_> {
    /// The step's rows in gangs of at most `most`: rows whose spans begin with the
    /// same memory (the same first part, from the same position), in row order,
    /// split as evenly as `most` allows. A row that shares with none is a gang of
    /// one, and so is each row of a gang of a prefill's rows (some of one sequence)
    /// where one of them sees fewer than `prefill_from` positions. `None` when no
    /// gang has two rows.
    pub(super) fn gangs(&self, most: usize, prefill_from: usize) -> Option<Vec<Vec<usize>>> {
        let mut by_start: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
        let mut order = Vec::new();
        for r in 0..self.positions.len() {
            let span = self.span(r);
            let key = match self.parts(r, 0, span.clone()).first() {
                Some((k, _, _)) => (k.as_ptr() as usize, span.start),
                // No positions cached (only in tests of the plan): a gang of its own.
                None => (usize::MAX - r, 0),
            };
            by_start
                .entry(key)
                .or_insert_with(|| {
                    order.push(key);
                    Vec::new()
                })
                .push(r);
        }
        let mut gangs = Vec::new();
        let mut any = false;
        for key in order {
            let rows = &by_start[&key];
            let pieces = rows.len().div_ceil(most);
            let base = rows.len() / pieces;
            let mut rest = &rows[..];
            for i in 0..pieces {
                let (gang, after) = rest.split_at(base + usize::from(i < rows.len() % pieces));
                rest = after;
                if gang.len() > 1 && self.prefill_rows(gang) && self.shortest(gang) < prefill_from {
                    gangs.extend(gang.iter().map(|&r| vec![r]));
                } else {
                    any |= gang.len() > 1;
                    gangs.push(gang.to_vec());
                }
            }
        }
        any.then_some(gangs)
    }

    /// Whether some of `rows` are one sequence's (a prefill's rows).
    fn prefill_rows(&self, rows: &[usize]) -> bool {
        let mut owners: Vec<usize> = rows.iter().map(|&r| self.owner[r]).collect();
        owners.sort_unstable();
        owners.dedup();
        owners.len() < rows.len()
    }

    /// The fewest positions any of `rows` sees.
    fn shortest(&self, rows: &[usize]) -> usize {
        rows.iter().map(|&r| self.span(r).len()).min().unwrap_or(0)
    }
}

/// A gang's task: a key/value head, the gang's rows, and their output heads under it.
struct Task<'a> {
    g: usize,
    rows: &'a [usize],
    outs: Vec<&'a mut [f32]>,
}

/// One task per (gang, key/value head).
pub(super) fn by_gangs(
    ops: F32Ops,
    l: &Layer<'_>,
    q: &[f32],
    out: &mut [f32],
    gangs: &[Vec<usize>],
) {
    let (hd, group, nkv) = (l.head_dim, l.group, l.n_kv_heads);
    // Each row's output heads per key/value head, handed to the gangs' tasks.
    let mut heads: Vec<Option<&mut [f32]>> = out.chunks_exact_mut(group * hd).map(Some).collect();
    let mut tasks: Vec<Task<'_>> = Vec::with_capacity(gangs.len() * nkv);
    for rows in gangs {
        for g in 0..nkv {
            let outs = rows
                .iter()
                .map(|&r| heads[r * nkv + g].take().expect("each row in one gang"))
                .collect();
            tasks.push(Task { g, rows, outs });
        }
    }
    for_each_chunk_mut(&mut tasks, 1, |_, task| {
        let Task { g, rows, outs } = &mut task[0];
        match rows {
            // A row alone reads its span in one pass, without a gang's gathers.
            [r] => pair(ops, l, q, *r, *g, outs[0]),
            _ => gang(ops, l, q, rows, *g, outs),
        }
    });
}

/// The attention of `rows` under key/value head `g`, into their output heads
/// (`outs`, `group` heads side by side each).
fn gang(ops: F32Ops, l: &Layer<'_>, q: &[f32], rows: &[usize], g: usize, outs: &mut [&mut [f32]]) {
    let (hd, group) = (l.head_dim, l.group);
    let parts: Vec<Vec<Part<'_>>> = rows.iter().map(|&r| l.parts(r, g, l.span(r))).collect();
    let shared_len = shared_positions(&parts);
    let shared = cut(&parts[0], hd, 0..shared_len);
    let own: Vec<Vec<Part<'_>>> = parts
        .iter()
        .map(|p| cut(p, hd, shared_len..usize::MAX))
        .collect();
    let lens: Vec<usize> = rows.iter().map(|&r| l.span(r).len()).collect();
    let heads = rows.len() * group;
    let mut qs = Vec::with_capacity(heads * hd);
    for &r in rows {
        qs.extend_from_slice(l.queries(q, r, g));
    }

    // Each row's `group` rows of weights over its span: first the scores, the shared
    // positions' stretch by stretch for every head of the gang.
    let mut weights: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0f32; group * n]).collect();
    let stretch = (STRETCH_BYTES / (2 * hd)).max(8);
    let mut block = vec![0f32; heads * stretch.min(shared_len)];
    let mut at = 0;
    for (keys, _, len) in stretches(&shared, hd, stretch) {
        let s = &mut block[..heads * len];
        ops.dots_hot(&qs, heads, keys, hd, s);
        for (i, row) in s.chunks_exact(len).enumerate() {
            let (r, h) = (i / group, i % group);
            weights[r][h * lens[r] + at..][..len].copy_from_slice(row);
        }
        at += len;
    }
    for (r, own) in own.iter().enumerate() {
        let (n, m) = (lens[r], lens[r] - shared_len);
        if m == 0 {
            continue;
        }
        let mut s = vec![0f32; group * m];
        scores(
            ops,
            &qs[r * group * hd..][..group * hd],
            group,
            own,
            hd,
            &mut s,
        );
        for (h, s) in s.chunks_exact(m).enumerate() {
            weights[r][h * n + shared_len..][..m].copy_from_slice(s);
        }
    }
    for (w, &n) in weights.iter_mut().zip(&lens) {
        for row in w.chunks_exact_mut(n) {
            ops.softmax(row, l.scale);
        }
    }

    // The weighted sums: the shared positions' stretch by stretch for every head,
    // then each row's own, continuing each output value's chain.
    let mut sums = vec![0f32; heads * hd];
    let mut at = 0;
    for (_, values, len) in stretches(&shared, hd, stretch) {
        let w = &mut block[..heads * len];
        for (i, piece) in w.chunks_exact_mut(len).enumerate() {
            let (r, h) = (i / group, i % group);
            piece.copy_from_slice(&weights[r][h * lens[r] + at..][..len]);
        }
        ops.weighted_sum(w, heads, values, hd, &mut sums);
        at += len;
    }
    for (r, own) in own.iter().enumerate() {
        let (n, m) = (lens[r], lens[r] - shared_len);
        let sums = &mut sums[r * group * hd..][..group * hd];
        if m > 0 {
            let mut w = Vec::with_capacity(group * m);
            for row in weights[r].chunks_exact(n) {
                w.extend_from_slice(&row[shared_len..]);
            }
            weighted_sums(ops, &w, group, own, hd, 0, sums);
        }
        outs[r].copy_from_slice(sums);
    }
}

/// Positions at the start of every row's span that lie in the same memory: whole
/// parts the rows share, and of the first part they do not all hold whole, as much
/// as every row holds (a prefill's rows see its own part up to their positions).
fn shared_positions(parts: &[Vec<Part<'_>>]) -> usize {
    let mut n = 0;
    for (i, &(k, _, len)) in parts[0].iter().enumerate() {
        let mut common = len;
        for other in &parts[1..] {
            match other.get(i) {
                Some(&(ok, _, olen)) if ok.as_ptr() == k.as_ptr() => common = common.min(olen),
                _ => return n,
            }
        }
        n += common;
        if parts[1..].iter().any(|p| p[i].2 != len) {
            break;
        }
    }
    n
}

/// `parts` in stretches of at most `most` positions, in order.
fn stretches<'p, 'a>(
    parts: &'p [Part<'a>],
    hd: usize,
    most: usize,
) -> impl Iterator<Item = Part<'a>> + 'p {
    parts.iter().flat_map(move |&(k, v, len)| {
        (0..len).step_by(most).map(move |a| {
            let b = (a + most).min(len);
            (&k[a * hd..b * hd], &v[a * hd..b * hd], b - a)
        })
    })
}
