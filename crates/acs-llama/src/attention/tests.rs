use super::*;
use crate::cpu::to_half;
use crate::test_values::values;

/// A layer's keys and values, as the cache holds them and widened back to f32 for the
/// reference.
struct Sequence {
    cache: KvCache,
    /// `[position][head · hd + i]`, keys then values, rounded to halves.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

const LAYERS: usize = 2;
/// The layer the tests attend in (not the first, so that the cache's layer offset
/// counts).
const LAYER: usize = 1;

fn position_rows(seed: u64, width: usize) -> (Vec<f32>, Vec<f32>) {
    (values(seed, width), values(seed ^ 0xABCD, width))
}

fn widened(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| to_half(v).to_f32()).collect()
}

/// Appends positions `range` (their values seeded by position) to `seq`.
fn append(seq: &mut Sequence, nkv: usize, hd: usize, range: Range<usize>, salt: u64) {
    let ops = F32Ops::detect();
    for p in range {
        let (k, v) = position_rows(salt * 100_000 + p as u64, nkv * hd);
        for layer in 0..LAYERS {
            seq.cache.append(ops, layer, &k, &v);
        }
        seq.cache.advance(1);
        seq.keys.push(widened(&k));
        seq.values.push(widened(&v));
    }
}

/// A sequence of `len` positions: all its own when `shared` is 0, else a branch of a
/// prompt of `shared` positions (the branch holds the prompt's keys as a shared
/// part, then its own).
fn sequence(nkv: usize, hd: usize, len: usize, shared: usize, salt: u64) -> Sequence {
    let mut seq = Sequence {
        cache: KvCache::new(LAYERS, nkv, hd),
        keys: Vec::new(),
        values: Vec::new(),
    };
    append(&mut seq, nkv, hd, 0..shared, salt);
    if shared > 0 {
        seq.cache = seq.cache.fork(len);
    }
    append(&mut seq, nkv, hd, shared..len, salt);
    seq
}

/// The attention of one row's query heads in f64, from the rounded keys and values.
fn reference(l: &Layer<'_>, seq: &Sequence, q: &[f32], r: usize) -> Vec<f32> {
    let (hd, group) = (l.head_dim, l.group);
    // The row's own position and the `window - 1` before it (all for a global layer).
    let n = l.positions[r] + 1;
    let span = l.window.map_or(0, |w| n.saturating_sub(w))..n;
    let mut out = vec![0f32; l.n_kv_heads * group * hd];
    for (h, (qh, oh)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let g = h / group;
        let key = |t: usize| &seq.keys[t][g * hd..(g + 1) * hd];
        let scores: Vec<f64> = span
            .clone()
            .map(|t| {
                let dot: f64 = qh
                    .iter()
                    .zip(key(t))
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                dot * f64::from(l.scale)
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        for (i, o) in oh.iter_mut().enumerate() {
            let v: f64 = span
                .clone()
                .zip(&exps)
                .map(|(t, e)| e * f64::from(seq.values[t][g * hd + i]))
                .sum();
            *o = (v / sum) as f32;
        }
    }
    out
}

/// One layout: heads, and the rows of a step (each a sequence's position).
struct Case {
    hd: usize,
    nkv: usize,
    group: usize,
    window: Option<usize>,
}

fn case(hd: usize, nkv: usize, group: usize, window: Option<usize>) -> Case {
    Case {
        hd,
        nkv,
        group,
        window,
    }
}

fn check(case: &Case, seqs: &[Sequence], owner: &[usize], positions: &[usize]) {
    let Case {
        hd,
        nkv,
        group,
        window,
    } = *case;
    let caches: Vec<&KvCache> = seqs.iter().map(|s| &s.cache).collect();
    let l = Layer {
        layer: LAYER,
        head_dim: hd,
        n_kv_heads: nkv,
        group,
        scale: 1.0 / (hd as f32).sqrt(),
        window,
        caches: &caches,
        owner,
        positions,
    };
    let qd = nkv * group * hd;
    let q = values(7, positions.len() * qd);
    let ops = F32Ops::detect();
    let mut pairs = vec![f32::NAN; q.len()];
    by_pairs(ops, &l, &q, &mut pairs);
    for (r, got) in pairs.chunks_exact(qd).enumerate() {
        let want = reference(&l, &seqs[owner[r]], &q[r * qd..(r + 1) * qd], r);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "row {r} value {i}: {g} against {w}"
            );
        }
    }
    let mut most_slices = 1;
    while hd.is_multiple_of(2 * most_slices * LINE_HALVES) {
        most_slices *= 2;
    }
    for most in [2, 3, gangs::MOST_ROWS] {
        if let Some(gangs) = l.gangs(most, 0) {
            let mut got = vec![f32::NAN; q.len()];
            gangs::by_gangs(ops, &l, &q, &mut got, &gangs);
            let same = got
                .iter()
                .zip(&pairs)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "gangs of {most} at most: not the pairs' bits");
        }
    }
    for stretches in [1, 2, 3, 7] {
        for slices in (0..).map(|i| 1 << i).take_while(|&s| s <= most_slices) {
            let mut got = vec![f32::NAN; q.len()];
            split(ops, &l, &q, &mut got, stretches, slices);
            let same = got
                .iter()
                .zip(&pairs)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{stretches} stretches, {slices} slices: not the pairs' bits"
            );
        }
    }
}

#[test]
fn both_plans_give_the_same_bits_and_the_attention() {
    let cases = [
        case(64, 3, 3, None),
        case(128, 2, 4, None),
        case(256, 1, 4, Some(100)),
        case(96, 2, 2, None),
        case(64, 1, 1, Some(1)),
        // Not a multiple of 8: the portable kernels.
        case(20, 2, 2, None),
    ];
    for (i, case) in cases.iter().enumerate() {
        let (hd, nkv) = (case.hd, case.nkv);
        let salt = i as u64;
        // A sequence of its own, one branched from a shared prompt, one branched at
        // the prompt's end.
        let seqs = [
            sequence(nkv, hd, 300, 0, salt),
            sequence(nkv, hd, 261, 130, salt + 10),
            sequence(nkv, hd, 77, 77, salt + 20),
        ];
        // Each sequence's last position (a decode step), and a prefill's rows of the
        // second one.
        let owner = [0, 1, 2, 1, 1, 1];
        let positions = [299, 260, 76, 0, 129, 130];
        check(case, &seqs, &owner, &positions);
    }
}

/// Branches of one prompt of `shared` positions, each with `own[i]` more positions
/// (seeded by branch), as a request's choices.
fn branches(nkv: usize, hd: usize, shared: usize, own: &[usize], salt: u64) -> Vec<Sequence> {
    let mut prompt = sequence(nkv, hd, shared, 0, salt);
    own.iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut seq = Sequence {
                cache: prompt.cache.fork(shared + n),
                keys: prompt.keys.clone(),
                values: prompt.values.clone(),
            };
            append(&mut seq, nkv, hd, shared..shared + n, salt + 1 + i as u64);
            seq
        })
        .collect()
}

#[test]
fn choices_of_one_prompt_attend_in_gangs_with_the_same_bits() {
    let cases = [
        case(64, 3, 3, None),
        case(256, 1, 4, Some(200)),
        case(128, 2, 4, None),
        case(20, 2, 2, None),
    ];
    for (i, case) in cases.iter().enumerate() {
        let (hd, nkv) = (case.hd, case.nkv);
        // Five choices of a 600-position prompt (more than one stretch of the
        // shared keys), each some tokens in, and two of another prompt.
        let mut seqs = branches(nkv, hd, 600, &[1, 5, 5, 5, 12], i as u64);
        seqs.extend(branches(nkv, hd, 40, &[3, 3], 50 + i as u64));
        let owner: Vec<usize> = (0..seqs.len()).collect();
        let positions: Vec<usize> = seqs.iter().map(|s| s.cache.len() - 1).collect();
        let caches: Vec<&KvCache> = seqs.iter().map(|s| &s.cache).collect();
        let l = Layer {
            window: case.window,
            ..layer(&caches, &owner, &positions, nkv, hd)
        };
        let gangs = l
            .gangs(16, gangs::PREFILL_FROM)
            .expect("the choices share their prompts");
        // Rows at the same position in each gang (a window starts with the row).
        let want: Vec<Vec<usize>> = match case.window {
            None => vec![vec![0, 1, 2, 3, 4], vec![5, 6]],
            Some(_) => vec![vec![0], vec![1, 2, 3], vec![4], vec![5, 6]],
        };
        assert_eq!(gangs, want);
        check(case, &seqs, &owner, &positions);
    }
}

#[test]
fn a_prefills_rows_attend_in_gangs() {
    let case = case(64, 2, 3, None);
    let seqs = [sequence(2, 64, 400, 0, 3), sequence(2, 64, 350, 200, 4)];
    // The last 40 rows of each sequence's prefill, in one step.
    let owner: Vec<usize> = (0..80).map(|r| r / 40).collect();
    let positions: Vec<usize> = (360..400).chain(310..350).collect();
    check(&case, &seqs, &owner, &positions);
    // Such short spans run alone in a step; long ones (here 100 rows from position
    // 3000 of one prefill) gang.
    let caches: Vec<&KvCache> = seqs.iter().map(|s| &s.cache).collect();
    let l = layer(&caches, &owner, &positions, 2, 64);
    assert_eq!(l.gangs(16, gangs::PREFILL_FROM), None);
    let long = sequence(1, 64, 3100, 0, 5);
    let caches = [&long.cache];
    let rows: Vec<usize> = (3000..3100).collect();
    let owner = vec![0; rows.len()];
    let l = layer(&caches, &owner, &rows, 1, 64);
    let gangs = l
        .gangs(16, gangs::PREFILL_FROM)
        .expect("long prefill rows gang");
    assert_eq!(gangs.len(), 7, "100 rows in gangs of 16 at most: {gangs:?}");
    assert!(gangs.iter().all(|g| (14..=15).contains(&g.len())));
}

fn layer<'a>(
    caches: &'a [&'a KvCache],
    owner: &'a [usize],
    positions: &'a [usize],
    nkv: usize,
    hd: usize,
) -> Layer<'a> {
    Layer {
        layer: 0,
        head_dim: hd,
        n_kv_heads: nkv,
        group: 3,
        scale: 0.125,
        window: None,
        caches,
        owner,
        positions,
    }
}

#[test]
fn few_pairs_over_long_contexts_split_and_the_rest_do_not() {
    let cache = KvCache::new(1, 3, 64);
    let caches = [&cache];
    let one = |pos: usize| vec![pos];
    // Three pairs on two threads: one thread would take two of them.
    let long = one(4095);
    let l = layer(&caches, &[0], &long, 3, 64);
    assert_eq!(
        l.plan(2),
        Plan::Split {
            stretches: 3,
            slices: 2
        }
    );
    assert_eq!(l.plan(1), Plan::Pairs);
    // A short context is not worth two more loops.
    let short = one(300);
    assert_eq!(layer(&caches, &[0], &short, 3, 64).plan(2), Plan::Pairs);
    // Four pairs share out evenly on two threads, not on sixteen.
    assert_eq!(layer(&caches, &[0], &long, 4, 64).plan(2), Plan::Pairs);
    assert_eq!(
        layer(&caches, &[0], &long, 4, 128).plan(16),
        Plan::Split {
            stretches: 16,
            slices: 4
        }
    );
    // Many rows (a prefill, or many sequences) share out on their own.
    let rows: Vec<usize> = (3000..3064).collect();
    let owner = vec![0; rows.len()];
    assert_eq!(layer(&caches, &owner, &rows, 1, 64).plan(4), Plan::Pairs);
}
