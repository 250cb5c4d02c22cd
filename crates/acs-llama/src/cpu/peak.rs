//! This machine's int8 multiply-add rate: the ceiling `acs bench` sets decode rates
//! against.

#[cfg(target_arch = "x86_64")]
use super::{isa::Isa, team};

/// A machine's int8 multiply-add rate, measured by [`int8_peak`].
#[derive(Debug, Clone, Copy)]
pub struct Int8Peak {
    /// Multiply-adds per second, on every thread of the forward pass.
    pub macs_per_sec: f64,
    /// The instruction issued: `vpdpbusd` (VNNI) or `vpmaddubsw` (AVX2).
    pub instruction: &'static str,
}

/// This machine's int8 multiply-add rate with every thread of the forward pass issuing
/// the block-format kernels' multiplying instruction on registers alone: `vpdpbusd`
/// (AVX-512 VNNI, else AVX-VNNI), else AVX2's `vpmaddubsw` (whose 16-bit pair sums the
/// kernels still widen, so there it is a looser ceiling). `acs bench` sets its decode
/// rates against it. `None` without AVX2.
pub fn int8_peak() -> Option<Int8Peak> {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = Isa::detect() {
        // Eight loops per thread, so that a helper that starts late still gets its
        // share; about 20 ms in all at a few G instructions per second.
        let (loops, iters) = (8 * team::threads(), 500_000u64);
        let (macs, instruction) = spin::int8_macs(t);
        let start = std::time::Instant::now();
        team::session(|| team::run(loops, |_| spin::int8_spin(t, iters)));
        let secs = start.elapsed().as_secs_f64();
        return Some(Int8Peak {
            macs_per_sec: (loops as u64 * iters * macs) as f64 / secs,
            instruction,
        });
    }
    None
}

/// The spinning loops, one per instruction.
#[cfg(target_arch = "x86_64")]
mod spin {
    use std::arch::x86_64::*;

    use crate::cpu::x86::{Avx2Token, hsum_epi32};

    /// Independent chains of [`int8_spin`]: enough to cover the instruction's
    /// latency on both of its ports.
    const CHAINS: usize = 12;

    /// Multiply-adds per turn of [`int8_spin`]'s loop, and the instruction it issues.
    pub(super) fn int8_macs(t: Avx2Token) -> (u64, &'static str) {
        let (lanes, name) = if t.avx512() {
            (64, "vpdpbusd zmm")
        } else if t.vnni() {
            (32, "vpdpbusd ymm")
        } else {
            (32, "vpmaddubsw ymm")
        };
        (CHAINS as u64 * lanes, name)
    }

    /// `iters` turns of [`CHAINS`] independent int8 multiply-adds, in the widest
    /// form the CPU has.
    pub(super) fn int8_spin(t: Avx2Token, iters: u64) {
        // SAFETY: `avx512` is set only when runtime detection found AVX-512 F, BW, VL
        // and VNNI, and `vnni` only when it found AVX-VNNI, with the AVX2 every token
        // proves: the features of the function called. None touches memory.
        let sum = unsafe {
            if t.avx512() {
                spin512(iters)
            } else if t.vnni() {
                spin256(iters)
            } else {
                spin_maddubs(iters)
            }
        };
        std::hint::black_box(sum);
    }

    #[target_feature(enable = "avx2")]
    fn spin_maddubs(iters: u64) -> i32 {
        let b = std::hint::black_box(_mm256_set1_epi8(5));
        let mut acc = std::hint::black_box([_mm256_set1_epi8(3); CHAINS]);
        for _ in 0..iters {
            for r in acc.iter_mut() {
                // Each chain feeds its 16-bit sums back as bytes: only the rate counts.
                *r = _mm256_maddubs_epi16(*r, b);
            }
        }
        acc.iter().fold(0, |s, &r| s ^ hsum_epi32(r))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn spin512(iters: u64) -> i32 {
        // Opaque operands, so that nothing is computed ahead of the loop.
        let (a, b) = std::hint::black_box((_mm512_set1_epi8(3), _mm512_set1_epi8(5)));
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..iters {
            for r in acc.iter_mut() {
                *r = _mm512_dpbusd_epi32(*r, a, b);
            }
        }
        acc.iter().fold(0, |s, &r| s ^ _mm512_reduce_add_epi32(r))
    }

    #[target_feature(enable = "avx2,avxvnni")]
    fn spin256(iters: u64) -> i32 {
        let (a, b) = std::hint::black_box((_mm256_set1_epi8(3), _mm256_set1_epi8(5)));
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        for _ in 0..iters {
            for r in acc.iter_mut() {
                *r = _mm256_dpbusd_avx_epi32(*r, a, b);
            }
        }
        acc.iter().fold(0, |s, &r| s ^ hsum_epi32(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::cpu::x86::Avx2Token;

    /// The int8 peak is measured wherever the block kernels have SIMD (AVX2), with the
    /// instruction they multiply with.
    #[test]
    fn int8_peak_is_measured_where_there_are_int8_kernels() {
        #[cfg(target_arch = "x86_64")]
        let expect = Avx2Token::detect().map(|t| spin::int8_macs(t).1);
        #[cfg(not(target_arch = "x86_64"))]
        let expect: Option<&str> = None;
        let got = int8_peak();
        assert_eq!(got.map(|p| p.instruction), expect);
        if let Some(p) = got {
            // Any AVX2 core does billions of multiply-adds a second.
            assert!(p.macs_per_sec.is_finite() && p.macs_per_sec > 1e9, "{p:?}");
        }
    }
}
