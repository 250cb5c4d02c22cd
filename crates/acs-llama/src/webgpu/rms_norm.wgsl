// Y[r] = X[r] / sqrt(mean(X[r]²) + eps) * G, one workgroup per row.

struct Params {
    d: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> G: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let base = wg.x * P.d;
    var s = 0.0;
    for (var i = lid.x; i < P.d; i += 64u) {
        let v = X[base + i];
        s += v * v;
    }
    red[lid.x] = s;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w / 2u) {
        if lid.x < w {
            red[lid.x] += red[lid.x + w];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(P.d) + P.eps);
    for (var i = lid.x; i < P.d; i += 64u) {
        Y[base + i] = X[base + i] * inv * G[i];
    }
}
