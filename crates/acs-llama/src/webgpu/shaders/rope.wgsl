// RoPE in place on the queries and keys of the step's rows, for the families whose
// matmuls cannot fold it in (a bias or a norm comes between, or the pairs are the
// halves of a head, which lie in different workgroups of a matmul). X holds each row's
// queries, keys and values side by side (`stride` floats); the first `width` values
// of a row (the queries and keys) are heads of `head_dim`, of which the first
// `rope_dims` turn: pair i of a head is values (2i, 2i + 1) when `halves` is 0 (ggml's
// "normal" mode) and (i, i + rope_dims / 2) when it is 1 ("NeoX"). CS holds (cos, sin)
// per row and pair, computed on the host as the CPU path computes them. One thread per
// pair.
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup) and `struct Params`, the uniform `P`, generated from kernels/rope.rs.

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> CS: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = P.rope_dims / 2u;
    let per_row = (P.width / P.head_dim) * half;
    let i = gid.x + gid.y * nwg.x * WG;
    if i >= P.rows * per_row {
        return;
    }
    let row = i / per_row;
    let head = (i % per_row) / half;
    let pair = i % half;
    let base = row * P.stride + head * P.head_dim;
    var a = base + 2u * pair;
    var b = a + 1u;
    if P.halves != 0u {
        a = base + pair;
        b = a + half;
    }
    let c = CS[(row * half + pair) * 2u];
    let s = CS[(row * half + pair) * 2u + 1u];
    let x = X[a];
    let y = X[b];
    X[a] = x * c - y * s;
    X[b] = x * s + y * c;
}
