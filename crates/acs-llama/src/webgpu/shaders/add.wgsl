// X[x_off + i] += Y[y_off + i % period] for i < n: the steering adds (one vector
// repeated over a sequence's rows, period = d_model) and the query, key and value
// biases (repeated over the step's rows of the three side by side).
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup) and `struct Params`, the uniform `P`, generated from kernels/add.rs.

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if i >= P.n {
        return;
    }
    X[P.x_off + i] += Y[P.y_off + i % P.period];
}
