// Causal grouped-query attention of one sequence's new rows against its cache (which
// already holds them, as half floats two to a word: kv_store.wgsl); the queries are
// the first `d` floats of each of the step's QKV rows. One workgroup per
// (new row, head): scores into S, softmax, then the weighted sum of values, with the
// operations of model.rs's attention in order.

struct Params {
    row0: u32,
    pos0: u32,
    n_heads: u32,
    group: u32,
    head_dim: u32,
    d: u32,
    kv: u32,
    q_stride: u32,
    s_stride: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> QKV: array<f32>;
@group(0) @binding(1) var<storage, read> K: array<u32>;
@group(0) @binding(2) var<storage, read> V: array<u32>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;

var<workgroup> red: array<f32, 64>;

// Combines every thread's `v` with `op` (0: max, 1: sum) and returns the result to all.
fn reduce(lid: u32, v: f32, op: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w / 2u) {
        if lid < w {
            if op == 0u {
                red[lid] = max(red[lid], red[lid + w]);
            } else {
                red[lid] += red[lid + w];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let i = wg.x;
    let h = wg.y;
    let n = P.pos0 + i + 1u;
    let qo = (P.row0 + i) * P.q_stride + h * P.head_dim;
    let oo = (P.row0 + i) * P.d + h * P.head_dim;
    let ko = (h / P.group) * P.head_dim;
    let so = (i * P.n_heads + h) * P.s_stride;

    // -FLT_MAX by its bits: Chrome (Tint) rejects the rounded decimal -3.4028235e38
    // as out of range, where naga accepts it.
    var m = bitcast<f32>(0xff7fffffu);
    for (var t = lid; t < n; t += 64u) {
        var s = 0.0;
        // Heads start at even values (head_dim is even), so pairs never straddle words.
        for (var e = 0u; e < P.head_dim; e += 2u) {
            let k = unpack2x16float(K[(t * P.kv + ko + e) / 2u]);
            s += QKV[qo + e] * k.x;
            s += QKV[qo + e + 1u] * k.y;
        }
        s = s * P.scale;
        S[so + t] = s;
        m = max(m, s);
    }
    let mx = reduce(lid, m, 0u);
    var sum = 0.0;
    for (var t = lid; t < n; t += 64u) {
        let p = exp(S[so + t] - mx);
        S[so + t] = p;
        sum += p;
    }
    let total = reduce(lid, sum, 1u);
    storageBarrier();
    for (var e = lid; e < P.head_dim; e += 64u) {
        var acc = 0.0;
        for (var t = 0u; t < n; t++) {
            let v = unpack2x16float(V[(t * P.kv + ko + e) / 2u]);
            acc += S[so + t] / total * select(v.x, v.y, (e & 1u) == 1u);
        }
        O[oo + e] = acc;
    }
}
