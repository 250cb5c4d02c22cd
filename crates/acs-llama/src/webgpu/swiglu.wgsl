// G = silu(G) * U, the gate of the MLP.

struct Params {
    n: u32,
}

@group(0) @binding(0) var<storage, read_write> G: array<f32>;
@group(0) @binding(1) var<storage, read> U: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if i >= P.n {
        return;
    }
    let g = G[i];
    G[i] = g / (1.0 + exp(-g)) * U[i];
}
