//! The f32 helpers of the CPU forward pass: attention's scores and weighted sums over
//! a KV cache of half floats, softmax, SwiGLU and the cache's rounding, bound once to
//! the instruction set detected.

use half::f16;

use super::isa::Isa;

#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

/// The f32 vector helpers of the forward pass (attention's scores and weighted sums),
/// bound once to the instruction set detected, as they run on slices of one head.
#[derive(Debug, Clone, Copy)]
pub struct F32Ops(pub(crate) Isa);

impl F32Ops {
    /// The helpers for this CPU.
    pub fn detect() -> Self {
        F32Ops(Isa::detect())
    }

    /// `scores[h][t] = q[h] · keys[t * stride..][..head_dim]` for every query head
    /// `h` and position `t`: the attention scores of `heads` query heads that share
    /// one key/value head, against a cache (of half floats) whose positions are
    /// `stride` apart. `q` holds the heads side by side, `scores` one row of
    /// positions per head. The heads go through the keys together, so each key is
    /// read and widened once for all of them; each score is summed as it would be
    /// alone.
    pub fn dots(self, q: &[f32], heads: usize, keys: &[f16], stride: usize, scores: &mut [f32]) {
        self.scores((q, heads), (keys, stride), false, scores);
    }

    /// [`F32Ops::dots`] for keys that many heads read while they are in the caches (a
    /// gang's stretch of a shared prompt): the same bits, and on AVX-512 heads wider
    /// than 64 values take the 512-bit kernel too, which runs faster there and
    /// slower on keys streaming from memory.
    pub fn dots_hot(
        self,
        q: &[f32],
        heads: usize,
        keys: &[f16],
        stride: usize,
        scores: &mut [f32],
    ) {
        self.scores((q, heads), (keys, stride), true, scores);
    }

    /// [`F32Ops::dots`], `hot` as [`F32Ops::dots_hot`].
    fn scores(
        self,
        (q, heads): (&[f32], usize),
        (keys, stride): (&[f16], usize),
        hot: bool,
        scores: &mut [f32],
    ) {
        let (hd, n) = (q.len() / heads.max(1), scores.len() / heads.max(1));
        assert!(
            heads > 0 && q.len() == heads * hd && scores.len() == heads * n,
            "{heads} heads of queries and scores"
        );
        assert_holds(keys.len(), n, stride, hd, "keys");
        if n == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0
            && x86::serves(hd)
        {
            return x86::dots(t, (q, heads), (keys, stride), hot, scores);
        }
        // The portable loop sums hot and cold keys alike.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = hot;
        for (qh, sh) in q.chunks_exact(hd).zip(scores.chunks_exact_mut(n)) {
            for (t, s) in sh.iter_mut().enumerate() {
                let k = &keys[t * stride..t * stride + hd];
                // Eight running sums the compiler can keep in vector lanes.
                let mut acc = [0f32; 8];
                let (cq, ck) = (qh.chunks_exact(8), k.chunks_exact(8));
                let tail: f32 = cq
                    .remainder()
                    .iter()
                    .zip(ck.remainder())
                    .map(|(a, &b)| a * half_to_f32(b))
                    .sum();
                for (a, b) in cq.zip(ck) {
                    for l in 0..8 {
                        acc[l] += a[l] * half_to_f32(b[l]);
                    }
                }
                *s = acc.iter().sum::<f32>() + tail;
            }
        }
    }

    /// `out[h] += Σ_t weights[h][t] · values[t * stride..][..head_dim]`: the attention
    /// output of `heads` query heads that share one key/value head, from a cache of
    /// half floats (`weights` one row of positions per head, `out` the heads side by
    /// side). As in [`F32Ops::dots`], each value is widened once for all the heads.
    /// Each output value is one chain of multiply-adds from its value in `out`, in
    /// position order, so a cache in two parts summed by two calls gives the same bits
    /// as one call over both.
    pub fn weighted_sum(
        self,
        weights: &[f32],
        heads: usize,
        values: &[f16],
        stride: usize,
        out: &mut [f32],
    ) {
        let (hd, n) = (out.len() / heads.max(1), weights.len() / heads.max(1));
        assert!(
            heads > 0 && out.len() == heads * hd && weights.len() == heads * n,
            "{heads} heads of weights and outputs"
        );
        assert_holds(values.len(), n, stride, hd, "values");
        if n == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0
            && x86::serves(hd)
        {
            return x86::weighted_sum(t, weights, heads, values, stride, out);
        }
        for (wh, oh) in weights.chunks_exact(n).zip(out.chunks_exact_mut(hd)) {
            for (t, &w) in wh.iter().enumerate() {
                let v = &values[t * stride..t * stride + hd];
                for (o, &x) in oh.iter_mut().zip(v) {
                    *o += w * half_to_f32(x);
                }
            }
        }
    }

    /// Appends `src` to `dst` as half floats, rounded to nearest even and saturated
    /// at ±65504 (so that no key or value becomes infinite); NaN stays NaN. F16C
    /// rounds as `half`'s `f16::from_f32` does, so every target stores the same bits.
    pub fn append_halves(self, src: &[f32], dst: &mut Vec<f16>) {
        dst.reserve(src.len());
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0 {
            return x86::append_halves(t, src, dst);
        }
        dst.extend(src.iter().map(|&x| to_half(x)));
    }

    /// `scores = softmax(scale · scores)` in place: one head's attention weights.
    pub fn softmax(self, scores: &mut [f32], scale: f32) {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0 {
            return x86::softmax(t, scores, scale);
        }
        softmax_lanes(scores, scale);
    }

    /// `gate[i] = silu(gate[i]) · up[i]`: the MLP's gated activation. The same
    /// arithmetic on every target (no fused multiply-adds), so results do not depend
    /// on the instruction set; AVX2 only makes the vectors twice as wide.
    pub fn swiglu(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "gate and up of one width");
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0 {
            return x86::swiglu(t, gate, up);
        }
        swiglu_lanes(gate, up);
    }

    /// `gate[i] = gelu(gate[i]) · up[i]` with GELU's tanh approximation: Gemma's
    /// gated activation, as [`F32Ops::swiglu`] computes SwiGLU.
    pub fn geglu(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "gate and up of one width");
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0 {
            return x86::geglu(t, gate, up);
        }
        geglu_lanes(gate, up);
    }
}

/// Panics unless a cache of `len` halves holds `n` positions `stride` apart, `hd`
/// halves each: what the kernels' loads rely on.
fn assert_holds(len: usize, n: usize, stride: usize, hd: usize, what: &str) {
    assert!(
        n == 0 || (n - 1) * stride + hd <= len,
        "{what} too short for {n} positions"
    );
}

/// The body of [`F32Ops::softmax`], inlined into each instruction set's copy.
#[inline(always)]
pub(crate) fn softmax_lanes(scores: &mut [f32], scale: f32) {
    use crate::lanes::{LANES, max_of};
    let max = max_of(scores) * scale;
    let mut sums = [0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (s, x) in sums.iter_mut().zip(c) {
            *x = crate::exp::exp(*x * scale - max);
            *s += *x;
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for x in chunks.into_remainder() {
        *x = crate::exp::exp(*x * scale - max);
        sum += *x;
    }
    for x in scores.iter_mut() {
        *x /= sum;
    }
}

/// The largest finite half float, where KV cache values saturate.
pub(crate) const HALF_MAX: f32 = 65504.0;

/// The half float nearest `x` (ties to even), saturated at ±65504 (the largest finite half): a KV cache
/// value.
pub fn to_half(x: f32) -> f16 {
    f16::from_f32(x.clamp(-HALF_MAX, HALF_MAX))
}

/// Every f16 as f32: wasm has no f16 conversion instruction, and the software one
/// costs more per block of a weight format than the block's 32 multiplies.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|h| f16::from_bits(h).to_f32()).collect())
}

/// `h` as f32 (exact): by table in wasm, which has no conversion instruction.
#[inline(always)]
pub(crate) fn half_to_f32(h: f16) -> f32 {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return f16_table()[usize::from(h.to_bits())];
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    h.to_f32()
}

/// The body of [`F32Ops::geglu`], inlined into each instruction set's copy. GELU's
/// tanh approximation x/2 · (1 + tanh(u)), u = sqrt(2/π) · (x + 0.044715·x³), is
/// x · sigmoid(2u): the form of SiLU, with the vectorised `exp` rather than a `tanh`
/// call per value (a quarter of a Gemma prefill).
#[inline(always)]
pub(crate) fn geglu_lanes(gate: &mut [f32], up: &[f32]) {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let two_u = TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
        *g = x / (1.0 + crate::exp::exp(-two_u)) * u;
    }
}

/// The body of [`F32Ops::swiglu`], inlined into each instruction set's copy.
#[inline(always)]
pub(crate) fn swiglu_lanes(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + crate::exp::exp(-*g)) * u;
    }
}
