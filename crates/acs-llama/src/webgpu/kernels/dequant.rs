//! Expanding weight blocks (`shaders/dequant.wgsl`): no kernel of its own, the part
//! every kernel that reads weights shares, compiled once per weight format.

use crate::quant::GgmlType;

use super::const_u32;

/// The weight formats with a WGSL kernel here.
pub const SUPPORTED: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// The shader library that expands blocks of the format `FORMAT` names.
pub(super) const SOURCE: &str = include_str!("../shaders/dequant.wgsl");

/// The constant that picks `ty`'s case of [`SOURCE`] (the others fold away).
pub(super) fn format(ty: GgmlType) -> String {
    const_u32("FORMAT", ty.id())
}
