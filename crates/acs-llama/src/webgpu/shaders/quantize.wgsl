// Y = X rounded to 8-bit blocks of 32 (round8.wgsl, prepended), the input of a
// block-format matmul. With `gated` set, the values are silu(gate) · up (1) or
// gelu(gate) · up (2, GELU's tanh approximation) instead, the feed-forward's activation, from X's rows of `2 * width` (the gate and up
// projections side by side, as one matmul writes them), so that the down
// projection's input costs one dispatch; with `round` unset they are stored as they
// are, for a down projection that reads floats.
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup) and `struct Params`, the uniform `P`, generated from kernels/quantize.rs.

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

fn value(i: u32) -> f32 {
    if P.gated == 0u {
        return X[i];
    }
    let at = i / P.width * 2u * P.width + i % P.width;
    let g = X[at];
    if P.gated == 1u {
        return g / (1.0 + exp(-g)) * X[at + P.width];
    }
    // GELU's tanh approximation as g · sigmoid(2u), the CPU's form (cpu/ops).
    let two_u = 1.5957691 * g * (1.0 + 0.044715 * g * g);
    return g / (1.0 + exp(-two_u)) * X[at + P.width];
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = gid.x + gid.y * nwg.x * WG;
    if b >= P.n_blocks {
        return;
    }
    let o = b * 32u;
    var v: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        v[j] = value(o + j);
    }
    if P.round != 0u {
        round8_block(&v);
    }
    for (var j = 0u; j < 32u; j++) {
        Y[o + j] = v[j];
    }
}
