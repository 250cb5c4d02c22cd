//! Sampling one token from a sequence's logits: logit bias, presence and frequency
//! penalties, temperature (0 is greedy), top-k, top-p, a seeded random stream per
//! sequence, and log-probabilities with the likeliest alternatives.

use std::collections::HashMap;

/// How one sequence samples.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the likeliest token; higher flattens the distribution.
    pub temperature: f32,
    /// Keep only the `top_k` likeliest tokens; 0 keeps all.
    pub top_k: u32,
    /// Keep the smallest set of likeliest tokens whose mass reaches `top_p`.
    pub top_p: f32,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per earlier occurrence.
    pub frequency_penalty: f32,
    /// Added to given tokens' logits.
    pub logit_bias: Vec<(u32, f32)>,
    /// How many alternatives to report with each token's log-probability; `None`
    /// skips the log-softmax altogether.
    pub logprobs: Option<u8>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

/// A token drawn, with its log-probability and alternatives when asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its log-probability under the adjusted distribution (before temperature).
    pub logprob: Option<f32>,
    /// The likeliest tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// A small, fast PRNG (xoshiro256**), seeded through splitmix64 so that nearby
/// seeds give unrelated streams. Not for secrets; for reproducible sampling.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    /// A stream for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    /// The stream of choice `index` of a request seeded with `seed`: each choice
    /// samples on its own, and the same request gives the same texts.
    pub fn for_choice(seed: u64, index: u64) -> Self {
        Rng::new(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03).rotate_left(17))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform float in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// One sequence's sampler: its parameters, random stream and token counts.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    counts: HashMap<u32, u32>,
    /// The candidates' weights, kept between draws (a vocabulary's worth).
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler with its own random stream.
    pub fn new(params: SamplingParams, rng: Rng) -> Self {
        Sampler {
            params,
            rng,
            counts: HashMap::new(),
            weights: Vec::new(),
        }
    }

    /// Draws the next token from `logits` (adjusted in place) and counts it for the
    /// penalties of later steps.
    pub fn sample(&mut self, logits: &mut [f32]) -> Sampled {
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &n) in &self.counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
        let (greedy, logprobs) = (p.temperature <= 0.0, p.logprobs);
        let token = if greedy {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        let (logprob, top) = match logprobs {
            None => (None, Vec::new()),
            Some(k) => {
                let lse = log_sum_exp(logits);
                let top = top_k_indices(logits, k as usize)
                    .into_iter()
                    .map(|i| (i as u32, logits[i] - lse))
                    .collect();
                (Some(logits[token as usize] - lse), top)
            }
        };
        *self.counts.entry(token).or_default() += 1;
        Sampled {
            token,
            logprob,
            top,
        }
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let Sampler {
            params: p,
            rng,
            weights,
            ..
        } = self;
        let inv_t = 1.0 / p.temperature;
        let k = if p.top_k == 0 {
            logits.len()
        } else {
            (p.top_k as usize).min(logits.len())
        };
        // Candidates: the k likeliest, best first, when top-k or top-p needs them;
        // otherwise every token in id order, without a list.
        let cand: Option<Vec<usize>> = (k < logits.len() || p.top_p < 1.0).then(|| {
            let mut c = top_k_indices(logits, k);
            c.truncate(k);
            c
        });
        let id = |j: usize| cand.as_ref().map_or(j, |c| c[j]);
        let mut n = cand.as_ref().map_or(logits.len(), Vec::len);
        let max = (0..n)
            .map(|j| logits[id(j)])
            .fold(f32::NEG_INFINITY, f32::max);
        weights.clear();
        weights.extend((0..n).map(|j| ((logits[id(j)] - max) * inv_t).exp()));
        if p.top_p < 1.0 {
            // The candidates are sorted best first here; keep the shortest prefix
            // reaching top_p.
            let total: f32 = weights.iter().sum();
            let mut acc = 0.0;
            for (j, w) in weights.iter().enumerate() {
                acc += w / total;
                if acc >= p.top_p {
                    n = j + 1;
                    break;
                }
            }
        }
        let total: f32 = weights[..n].iter().sum();
        let mut u = rng.next_f32() * total;
        for (j, &w) in weights[..n].iter().enumerate() {
            if u < w {
                return id(j) as u32;
            }
            u -= w;
        }
        // Rounding left a sliver: the last candidate takes it.
        id(n - 1) as u32
    }
}

/// The index of the largest value; the lowest index among ties.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The indices of the `k` largest values, largest first (ties: lower index first).
pub fn top_k_indices(v: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(v.len());
    if k == 0 {
        return Vec::new();
    }
    let by_value = |a: &usize, b: &usize| v[*b].total_cmp(&v[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..v.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_value);
        idx.truncate(k);
    }
    idx.sort_by(by_value);
    idx
}

/// `log Σ exp(v)`, computed stably.
pub fn log_sum_exp(v: &[f32]) -> f32 {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + v.iter().map(|x| (x - max).exp()).sum::<f32>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams, seed: u64) -> Sampler {
        Sampler::new(params, Rng::new(seed))
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = sampler(
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            1,
        );
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]).token, 1);
    }

    #[test]
    fn same_seed_same_stream_other_choice_other_stream() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |rng: Rng| {
            let mut s = Sampler::new(SamplingParams::default(), rng);
            (0..20)
                .map(|_| s.sample(&mut logits.clone()).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(Rng::for_choice(42, 0)), run(Rng::for_choice(42, 0)));
        assert_ne!(run(Rng::for_choice(42, 0)), run(Rng::for_choice(42, 1)));
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_small_is_greedy() {
        let logits = [1.0, 5.0, 4.9, 0.0];
        for params in [
            SamplingParams {
                top_k: 1,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.01,
                ..Default::default()
            },
        ] {
            let mut s = sampler(params, 7);
            for _ in 0..50 {
                assert_eq!(s.sample(&mut logits.clone()).token, 1);
            }
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // p = softmax([0, ln 3]) = [0.25, 0.75]
        let mut s = sampler(SamplingParams::default(), 3);
        let n = 20_000;
        let ones = (0..n)
            .filter(|_| s.sample(&mut [0.0, 3f32.ln()]).token == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
    }

    #[test]
    fn bias_and_penalties_move_logits() {
        let mut s = sampler(
            SamplingParams {
                temperature: 0.0,
                logit_bias: vec![(0, 100.0)],
                ..Default::default()
            },
            1,
        );
        assert_eq!(s.sample(&mut [0.0, 1.0]).token, 0);
        let mut s = sampler(
            SamplingParams {
                temperature: 0.0,
                frequency_penalty: 2.0,
                ..Default::default()
            },
            1,
        );
        assert_eq!(s.sample(&mut [1.0, 0.0]).token, 0);
        // Token 0 now carries a penalty of 2: token 1 wins.
        assert_eq!(s.sample(&mut [1.0, 0.0]).token, 1);
    }

    #[test]
    fn logprobs_are_normalised_with_sorted_alternatives() {
        let mut s = sampler(
            SamplingParams {
                temperature: 0.0,
                logprobs: Some(2),
                ..Default::default()
            },
            1,
        );
        let out = s.sample(&mut [0.0, 2.0, 1.0]);
        let lse = log_sum_exp(&[0.0, 2.0, 1.0]);
        assert_eq!(out.token, 1);
        assert!((out.logprob.unwrap() - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn top_k_indices_sorts_and_breaks_ties_by_index() {
        assert_eq!(top_k_indices(&[1.0, 3.0, 3.0, 2.0], 3), vec![1, 2, 3]);
        assert_eq!(top_k_indices(&[1.0], 5), vec![0]);
    }
}
