// Y = X rounded to 8-bit blocks of 32 (round8.wgsl, prepended); with `swiglu` set,
// the values rounded are silu(X) * U, the feed-forward gate (X the gate projection, U
// the up one), so that the down projection's input costs one dispatch, not two.

struct Params {
    n_blocks: u32,
    swiglu: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> U: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

fn value(i: u32) -> f32 {
    if P.swiglu != 0u {
        let g = X[i];
        return g / (1.0 + exp(-g)) * U[i];
    }
    return X[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = gid.x + gid.y * nwg.x * 64u;
    if b >= P.n_blocks {
        return;
    }
    let o = b * 32u;
    var v: array<f32, 32>;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        v[j] = value(o + j);
        amax = max(amax, abs(v[j]));
    }
    let s = round8_scale(amax);
    for (var j = 0u; j < 32u; j++) {
        Y[o + j] = round8(v[j], s);
    }
}
