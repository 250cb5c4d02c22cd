//! The compute kernels, one module per WGSL kernel in `shaders/`: each holds its
//! parameters, its pipeline, its bindings and its dispatch size.
//!
//! A kernel's parameters are a `#[repr(C)]` struct of 32-bit fields whose bytes go to
//! its slot of the step's uniform buffer; the shader's `struct Params` is generated
//! from the same fields ([`params!`]), and the constants both sides use (`WG`, a
//! kernel's `TILE` …) are prepended from the Rust ones, so that neither can drift
//! from the other.

pub(super) mod add;
pub(super) mod attention;
pub(super) mod dequant;
pub(super) mod embed;
pub(super) mod head_norm;
pub(super) mod matmul;
pub(super) mod quantize;
pub(super) mod rms_norm;
pub(super) mod rope;

use crate::quant::GgmlType;

use matmul::MatmulLayout;

/// Threads per workgroup of every kernel (`WG` in the shaders).
pub(super) const WG: u32 = 64;
/// The most workgroups WebGPU guarantees along one dispatch dimension.
pub(super) const MAX_GROUPS: u32 = 65_535;

/// Float to half float as the CPU's KV cache rounds.
pub(super) const HALF: &str = include_str!("../shaders/half.wgsl");
/// Rounding to 8-bit blocks as the CPU path rounds block-format matmul inputs.
const ROUND8: &str = include_str!("../shaders/round8.wgsl");

/// A kernel's parameters, as its shader's uniform `P` reads them.
pub(super) trait Params: bytemuck::Pod {
    /// Each field's name and WGSL type, in order: the shader's `struct Params`.
    const FIELDS: &'static [(&'static str, &'static str)];
}

/// Declares a kernel's parameter struct (fields of `u32` or `f32`, whose Rust names
/// are the WGSL types) and its [`Params`] field list, from one list of fields.
macro_rules! params {
    (
        $(#[$meta:meta])*
        struct $name:ident {
            $($(#[$field_meta:meta])* $field:ident: $ty:ident,)*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $name {
            $($(#[$field_meta])* pub(crate) $field: $ty,)*
        }

        impl $crate::webgpu::kernels::Params for $name {
            const FIELDS: &'static [(&'static str, &'static str)] =
                &[$((stringify!($field), stringify!($ty))),*];
        }

        // Every kernel's parameters fit its slot of the uniform buffer.
        const _: () = assert!(
            std::mem::size_of::<$name>() <= $crate::webgpu::arena::PARAM_BYTES as usize
        );
    };
}
use params;

/// A WGSL `u32` constant.
fn const_u32(name: &str, value: u32) -> String {
    format!("const {name}: u32 = {value}u;\n")
}

/// A kernel's WGSL: `WG` and the kernel's own `consts`, its parameters' struct from
/// `P`'s fields, then the library files it calls and its own file.
fn source<P: Params>(consts: &str, libs: &[&str], main: &str) -> String {
    let mut src = const_u32("WG", WG) + consts;
    src.push_str("struct Params {\n");
    for (name, ty) in P::FIELDS {
        src.push_str(&format!("    {name}: {ty},\n"));
    }
    src.push_str("}\n");
    for part in libs.iter().chain([&main]) {
        src.push_str(part);
    }
    src
}

/// Compiles a kernel whose entry point is `main`.
fn compile(device: &wgpu::Device, label: &str, src: &str) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// Workgroups for `n` threads of a 1-D kernel, folded into two dimensions when one
/// would exceed the per-dimension limit (the kernels unfold them with num_workgroups).
pub(super) fn groups_1d(n: u32) -> (u32, u32, u32) {
    let g = n.div_ceil(WG).max(1);
    (g.min(MAX_GROUPS), g.div_ceil(MAX_GROUPS), 1)
}

/// The compiled kernels; the weight-reading ones once per format the model uses.
#[derive(Debug)]
pub(super) struct Pipelines {
    pub(super) matmul: matmul::Pipelines,
    pub(super) embed: wgpu::ComputePipeline,
    pub(super) rms_norm: wgpu::ComputePipeline,
    pub(super) quantize: wgpu::ComputePipeline,
    pub(super) add: wgpu::ComputePipeline,
    pub(super) attention: wgpu::ComputePipeline,
    pub(super) rope: wgpu::ComputePipeline,
    pub(super) head_norm: wgpu::ComputePipeline,
}

impl Pipelines {
    /// Compiles the kernels: a matmul for each of `formats`, and one that applies
    /// RoPE for each of `rope_formats` (the query and key projections').
    pub(super) fn new(
        device: &wgpu::Device,
        formats: [&[GgmlType]; 2],
        embed_ty: GgmlType,
        layout: MatmulLayout,
    ) -> Pipelines {
        Pipelines {
            matmul: matmul::Pipelines::new(device, formats, layout),
            embed: embed::pipeline(device, embed_ty),
            rms_norm: rms_norm::pipeline(device),
            quantize: quantize::pipeline(device),
            add: add::pipeline(device),
            attention: attention::pipeline(device),
            rope: rope::pipeline(device),
            head_norm: head_norm::pipeline(device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kernel's shader file and parameter fields.
    fn kernels() -> [(&'static str, &'static [(&'static str, &'static str)]); 7] {
        [
            (add::SOURCE, <add::AddParams as Params>::FIELDS),
            (
                attention::SOURCE,
                <attention::AttentionParams as Params>::FIELDS,
            ),
            (embed::SOURCE, <embed::EmbedParams as Params>::FIELDS),
            (matmul::SOURCE, <matmul::MatmulParams as Params>::FIELDS),
            (
                quantize::SOURCE,
                <quantize::QuantizeParams as Params>::FIELDS,
            ),
            (
                rms_norm::SOURCE,
                <rms_norm::RmsNormParams as Params>::FIELDS,
            ),
            (rope::SOURCE, <rope::RopeParams as Params>::FIELDS),
        ]
    }

    /// The fields a shader reads (`P.name`), in order of first use.
    fn read_fields(src: &str) -> Vec<&str> {
        let mut seen = Vec::new();
        for (at, _) in src.match_indices("P.") {
            if src[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &src[at + 2..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if !seen.contains(&&rest[..end]) {
                seen.push(&rest[..end]);
            }
        }
        seen
    }

    /// Every shader reads each of its parameters and only those (a misspelt field
    /// would otherwise first fail when a device compiles the kernel), and declares
    /// neither its own `Params` nor a workgroup size other than `WG`.
    #[test]
    fn shaders_read_the_parameters_the_host_writes() {
        for (src, fields) in kernels() {
            let name = src.lines().next().unwrap_or_default();
            let mut read = read_fields(src);
            let mut declared: Vec<&str> = fields.iter().map(|f| f.0).collect();
            read.sort_unstable();
            declared.sort_unstable();
            assert_eq!(read, declared, "{name}");
            assert!(!src.contains("struct Params {"), "{name}");
            assert_eq!(
                src.matches("@workgroup_size(").count(),
                src.matches("@workgroup_size(WG)").count(),
                "{name}"
            );
            assert!(fields.iter().all(|f| f.1 == "u32" || f.1 == "f32"));
        }
    }

    /// The generated struct lists the fields in the Rust struct's order, which is the
    /// order of their bytes.
    #[test]
    fn the_wgsl_struct_follows_the_rust_one() {
        let src = source::<embed::EmbedParams>("", &[], "");
        assert!(src.starts_with("const WG: u32 = 64u;\n"));
        assert!(src.ends_with(
            "struct Params {\n    row0: u32,\n    rows: u32,\n    n_tokens: u32,\n    \
             cols: u32,\n    row_bytes: u32,\n    scale: f32,\n}\n"
        ));
        let p = embed::EmbedParams {
            row0: 1,
            rows: 2,
            n_tokens: 3,
            cols: 4,
            row_bytes: 5,
            scale: 0.5,
        };
        let words: Vec<u32> = bytemuck::bytes_of(&p)
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        assert_eq!(words, [1, 2, 3, 4, 5, 0.5f32.to_bits()]);
    }
}
