// RMSNorm of each head of the step's queries or keys, in place, with one gain per
// value of a head (G): the Q/K norms of Qwen3 and Gemma 3, between the projections
// and RoPE. X holds each row's queries, keys and values side by side (`stride`
// floats); the heads normed are `heads` of `head_dim` from value `offset` of a row.
// One workgroup per (row, head).
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup) and `struct Params`, the uniform `P`, generated from kernels/head_norm.rs.

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> G: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let base = wg.x * P.stride + P.offset + wg.y * P.head_dim;
    var s = 0.0;
    for (var i = lid.x; i < P.head_dim; i += WG) {
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
    let inv = 1.0 / sqrt(red[0] / f32(P.head_dim) + P.eps);
    for (var i = lid.x; i < P.head_dim; i += WG) {
        X[base + i] = X[base + i] * inv * G[i];
    }
}
