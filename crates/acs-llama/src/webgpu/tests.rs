//! Checks of the backend's parts that need a device (lavapipe counts).

use wgpu::util::DeviceExt;

use super::device::{STORAGE, map_read};
use super::kernels::{HALF, WG, groups_1d};
use super::{GpuModel, pick_adapter};
use crate::cpu::to_half;
use crate::gguf::GgufFile;
use crate::quant::GgmlType;

/// Which matrices the loader stacks: those that read the same input and share a
/// format, and only those. Needs an adapter (lavapipe counts).
#[test]
fn matrices_of_one_format_share_a_tensor() {
    use crate::testgen::{TestModelSpec, test_model_bytes};
    let load = |spec: &TestModelSpec| {
        let file = GgufFile::from_vec(test_model_bytes(spec).unwrap()).unwrap();
        GpuModel::new(&file).unwrap()
    };
    let same = load(&TestModelSpec::tiny());
    let (d, kv) = (same.config.d_model, same.config.kv_dim());
    for b in &same.blocks {
        assert_eq!(b.qkv.len(), 1);
        assert_eq!(b.qkv[0].rows, d + 2 * kv);
        assert_eq!(b.gate_up.len(), 1);
        assert_eq!(b.gate_up[0].rows, 2 * same.config.ffn);
    }
    let mixed = load(&TestModelSpec {
        value_down_type: Some(GgmlType::F16),
        ..TestModelSpec::tiny()
    });
    for b in &mixed.blocks {
        let rows: Vec<_> = b.qkv.iter().map(|w| (w.ty, w.rows)).collect();
        let q8 = GgmlType::Q8_0;
        assert_eq!(rows, [(q8, d), (q8, kv), (GgmlType::F16, kv)]);
        assert_eq!(b.gate_up.len(), 1);
    }
    // Both load every tensor they need.
    assert_eq!(
        same.weight_bytes_per_step(),
        mixed.weight_bytes_per_step() - {
            let f16 = |rows: usize, cols: usize| (rows * cols * 2) as u64;
            let q8 = |rows: usize, cols: usize| (rows * cols / 32 * 34) as u64;
            let c = &same.config;
            (f16(kv, d) - q8(kv, d) + f16(d, c.ffn) - q8(d, c.ffn)) * c.n_layers as u64
        }
    );
}

/// half.wgsl's rounding against the CPU cache's, bit for bit, on the values
/// where conversions differ: ties, subnormals, the edge of the finite range,
/// infinities and NaN. Needs an adapter (lavapipe counts).
#[test]
fn the_gpu_cache_rounds_as_the_cpu_cache() {
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.1,
        1.0 / 3.0,
        65504.0,
        65519.0,
        65520.0,
        1e6,
        7e4,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN_POSITIVE,
        6.1035156e-5,
        6.0e-5,
        5.9604645e-8,
        2.9802322e-8,
        2.9802326e-8,
        8.940697e-8,
        1.0009766,
        f32::from_bits(0x3f80_1000), // 1 + 2^-11: a tie
        f32::from_bits(0x3f80_3000), // 1 + 3 * 2^-11: a tie
        2048.5,
        2049.0,
        2051.0,
    ];
    // A spread over every exponent a half reaches and beyond, with odd mantissas.
    let mut s = 0x9e37_79b9u32;
    for _ in 0..20_000 {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        let exp = 100 + (s >> 8) % 45; // 2^-27 .. 2^17
        xs.push(f32::from_bits(
            (s & 0x8000_0000) | (exp << 23) | (s & 0x7f_ffff),
        ));
    }
    if xs.len() % 2 == 1 {
        xs.push(0.5);
    }
    let gpu = pollster::block_on(run_half(&xs));
    for (i, &x) in xs.iter().enumerate() {
        let want = to_half(x).to_bits();
        let got = (gpu[i / 2] >> (16 * (i % 2))) as u16;
        if x.is_nan() {
            assert!(half::f16::from_bits(got).is_nan(), "{x}: {got:#06x}");
        } else {
            assert_eq!(got, want, "{x:e} ({:#010x})", x.to_bits());
        }
    }
}

/// `xs` in pairs through half.wgsl's `half_pair`, as words.
async fn run_half(xs: &[f32]) -> Vec<u32> {
    let adapter = pick_adapter(true).await.expect("an adapter");
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor::default())
        .await
        .expect("a device");
    let src = [
        &format!("const WG: u32 = {WG}u;\n"),
        HALF,
        "@group(0) @binding(0) var<storage, read> X: array<f32>;
        @group(0) @binding(1) var<storage, read_write> Y: array<u32>;
        @compute @workgroup_size(WG)
        fn main(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
            let i = gid.x + gid.y * nwg.x * WG;
            if i < arrayLength(&Y) {
                Y[i] = half_pair(X[2u * i], X[2u * i + 1u]);
            }
        }",
    ]
    .concat();
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("half"),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("half"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    let input = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: &bytes,
        usage: STORAGE,
    });
    let size = (xs.len() * 2) as u64;
    let halves = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("halves"),
        size,
        usage: STORAGE,
        mapped_at_creation: false,
    });
    let entries: Vec<wgpu::BindGroupEntry<'_>> = [&input, &halves]
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipe.get_bind_group_layout(0),
        entries: &entries,
    });
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipe);
        pass.set_bind_group(0, &group, &[]);
        let (x, y, z) = groups_1d((xs.len() / 2) as u32);
        pass.dispatch_workgroups(x, y, z);
    }
    enc.copy_buffer_to_buffer(&halves, 0, &readback, 0, size);
    queue.submit([enc.finish()]);
    map_read(&device, &readback).await.expect("read back");
    let view = readback.get_mapped_range(..).expect("mapped");
    view.chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
