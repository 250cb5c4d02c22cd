//! What the WebGPU tests share, natively (`webgpu.rs`) and in the browser
//! (`webgpu_browser.rs`).

/// Max |a - b| relative to max |a|, after checking the lengths agree.
pub fn rel_diff(cpu: &[f32], gpu: &[f32]) -> f32 {
    assert_eq!(cpu.len(), gpu.len(), "logit counts differ");
    let scale = cpu.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let diff = cpu
        .iter()
        .zip(gpu)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}
