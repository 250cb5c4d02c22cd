//! Which instruction set the CPU kernels may use.

/// The instruction set the kernels may use, decided by runtime detection (which std
/// caches, so asking again is a couple of loads). `Portable` is plain Rust: on wasm32
/// it compiles to SIMD128 where the build enables it (wasm has no runtime detection).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Isa {
    /// Portable code (wasm SIMD128 included, where compiled in).
    Portable,
    /// Holding this value proves AVX2, FMA and F16C were detected on this CPU.
    #[cfg(target_arch = "x86_64")]
    Avx2(super::x86::Avx2Token),
}

impl Isa {
    /// The best instruction set of this CPU.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = super::x86::Avx2Token::detect() {
            return Isa::Avx2(t);
        }
        Isa::Portable
    }
}
