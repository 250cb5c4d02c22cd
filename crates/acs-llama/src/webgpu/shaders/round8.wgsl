// Rounding activations to 8-bit blocks of 32, exactly as the CPU path (and llama.cpp)
// rounds the inputs of block-format matmuls: each value to d * round(x / d), with
// d = max|x| / 127 per block, ties to even. Keeping the rounding makes the GPU logits
// match the CPU's rather than an exact f32 forward pass. Prepended to the kernels
// that round (quantize.wgsl, rms_norm.wgsl, attention.wgsl).

// A block's scale d and its inverse (0 for a block of zeros) from its largest
// magnitude. WGSL lets division be off by 2.5 ulp; one FMA correction step each makes
// d and 1/d the correctly rounded values the CPU computes, so that fewer values near
// a rounding boundary land on the other side.
fn round8_scale(amax: f32) -> vec2<f32> {
    let d0 = amax / 127.0;
    let d = d0 + fma(-d0, 127.0, amax) / 127.0;
    var inv = 0.0;
    if d > 0.0 {
        let i0 = 1.0 / d;
        inv = fma(i0, fma(-d, i0, 1.0), i0);
    }
    return vec2<f32>(d, inv);
}

// One value rounded with its block's `round8_scale` (WGSL's round() rounds halves to
// even).
fn round8(v: f32, s: vec2<f32>) -> f32 {
    return s.x * clamp(round(v * s.y), -127.0, 127.0);
}

// A block of 32 values rounded in place, with the scale of its largest magnitude.
fn round8_block(v: ptr<function, array<f32, 32>>) {
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs((*v)[j]));
    }
    let s = round8_scale(amax);
    for (var j = 0u; j < 32u; j++) {
        (*v)[j] = round8((*v)[j], s);
    }
}
