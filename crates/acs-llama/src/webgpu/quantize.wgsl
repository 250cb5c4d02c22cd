// Rounds activations to 8-bit blocks of 32 and expands them again: Y = d * round(X / d)
// with d = max|X| / 127 per block, ties to even, exactly as the CPU path (and
// llama.cpp) rounds the inputs of block-format matmuls. Keeping the rounding makes
// the GPU logits match the CPU's rather than an exact f32 forward pass.

struct Params {
    n_blocks: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = gid.x + gid.y * nwg.x * 64u;
    if b >= P.n_blocks {
        return;
    }
    let o = b * 32u;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(X[o + j]));
    }
    // WGSL lets division be off by 2.5 ulp; one FMA correction step each makes d
    // and 1/d the correctly rounded values the CPU computes, so that fewer values
    // near a rounding boundary land on the other side.
    let d0 = amax / 127.0;
    let d = d0 + fma(-d0, 127.0, amax) / 127.0;
    var inv = 0.0;
    if d > 0.0 {
        let i0 = 1.0 / d;
        inv = fma(i0, fma(-d, i0, 1.0), i0);
    }
    for (var j = 0u; j < 32u; j++) {
        // WGSL's round() rounds halves to even.
        Y[o + j] = d * clamp(round(X[o + j] * inv), -127.0, 127.0);
    }
}
