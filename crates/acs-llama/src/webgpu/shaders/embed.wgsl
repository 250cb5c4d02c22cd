// X[t] = row TOK[t] of the embedding, for the tokens whose rows lie in this weight
// buffer (rows row0 .. row0 + rows). One thread per token and 32 values.
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup) and `struct Params`, the uniform `P`, generated from kernels/embed.rs.

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> TOK: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t = gid.y;
    if c >= P.cols / 32u || t >= P.n_tokens {
        return;
    }
    let tok = TOK[t];
    if tok < P.row0 || tok >= P.row0 + P.rows {
        return;
    }
    fill((tok - P.row0) * P.row_bytes, c);
    for (var j = 0u; j < 32u; j++) {
        X[t * P.cols + 32u * c + j] = y[j] * P.scale;
    }
}
