// Y[r] = X[r] / sqrt(mean(X[r]²) + eps) * G, one workgroup per row; with `round` set,
// also Q[r] = Y[r] rounded to 8-bit blocks of 32 (round8.wgsl, prepended), the input
// of the block-format matmuls that follow, without a dispatch of its own.
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup) and `struct Params`, the uniform `P`, generated from kernels/rms_norm.rs.

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> G: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read_write> Q: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let base = wg.x * P.d;
    var s = 0.0;
    for (var i = lid.x; i < P.d; i += WG) {
        let v = X[base + i];
        s += v * v;
    }
    red[lid.x] = s;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if lid.x < w {
            red[lid.x] += red[lid.x + w];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(P.d) + P.eps);
    if P.round == 0u {
        for (var i = lid.x; i < P.d; i += WG) {
            Y[base + i] = X[base + i] * inv * G[i];
        }
        return;
    }
    // A block of 32 per thread, so that each thread has its block's maximum.
    for (var blk = lid.x; blk < P.d / 32u; blk += WG) {
        let o = 32u * blk;
        var y: array<f32, 32>;
        for (var j = 0u; j < 32u; j++) {
            y[j] = X[base + o + j] * inv * G[o + j];
            Y[base + o + j] = y[j];
        }
        round8_block(&y);
        for (var j = 0u; j < 32u; j++) {
            Q[base + o + j] = y[j];
        }
    }
}
