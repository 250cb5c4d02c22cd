//! What every x86-64 kernel shares: the proof of the instruction set detected
//! ([`Avx2Token`]) and the loads and horizontal sums of AVX2 registers.

use std::arch::x86_64::*;

/// Proof that AVX2, FMA and F16C are available (and AVX-VNNI when `vnni` is set):
/// only [`Avx2Token::detect`] makes one, from runtime detection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2Token {
    vnni: bool,
    /// AVX-512 F, BW, VL and VNNI: 16-row packed panels in 512-bit registers.
    avx512: bool,
}

impl Avx2Token {
    pub(crate) fn detect() -> Option<Self> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then(|| Avx2Token {
            vnni: is_x86_feature_detected!("avxvnni"),
            avx512: is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni"),
        })
    }

    /// Whether the packed kernels use `vpdpbusd` (AVX-VNNI, or AVX-512 VNNI): then
    /// Q8_0 panels hold their values plus 128, which `vpmaddubsw` cannot take (its
    /// 16-bit pair sums of those, up to 2 × 255 × 127, would saturate).
    pub(crate) fn dpbusd(self) -> bool {
        self.vnni || self.avx512
    }

    /// Whether AVX-VNNI was found (256-bit `vpdpbusd`).
    pub(crate) fn vnni(self) -> bool {
        self.vnni
    }

    /// Whether AVX-512 F, BW, VL and VNNI were found.
    pub(crate) fn avx512(self) -> bool {
        self.avx512
    }

    /// The same proof without AVX-VNNI or AVX-512 (always sound: it claims less),
    /// so tests cover the `vpmaddubsw` path on CPUs that have both.
    #[cfg(test)]
    pub(crate) fn without_vnni(self) -> Self {
        Avx2Token {
            vnni: false,
            avx512: false,
        }
    }

    /// The same proof without AVX-512, so tests cover the 256-bit packed kernels.
    #[cfg(test)]
    pub(crate) fn without_avx512(self) -> Self {
        Avx2Token {
            avx512: false,
            ..self
        }
    }
}

#[inline(always)]
pub(crate) fn load16(b: &[u8]) -> __m128i {
    let b: &[u8; 16] = b[..16].try_into().expect("16 bytes");
    // SAFETY: `b` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline(always)]
pub(crate) fn load32(b: &[u8]) -> __m256i {
    let b: &[u8; 32] = b[..32].try_into().expect("32 bytes");
    // SAFETY: `b` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline(always)]
pub(crate) fn load8f(v: &[f32]) -> __m256 {
    let v: &[f32; 8] = v[..8].try_into().expect("8 floats");
    // SAFETY: `v` is 8 readable floats; the load is unaligned.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

/// The eight lanes (one per row of a panel) as floats.
#[inline]
#[target_feature(enable = "avx")]
pub(crate) fn lanes(v: __m256) -> [f32; 8] {
    let mut o = [0f32; 8];
    // SAFETY: `o` is 8 writable floats; the store is unaligned.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
    o
}
