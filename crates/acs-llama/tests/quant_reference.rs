//! The dequantizers against ggml's own definition: blocks of random bytes (with sane
//! scales) dequantized by the `gguf` Python package's reference (`gguf.quants`, which
//! mirrors ggml-quants.c), recorded as checksums and samples. Generated once with
//! numpy; regenerate by running the same procedure if a format is added.

use acs_llama::quant::{GgmlType, dequantize_row, dot_row, dot_row_q8, quantize_activations};

struct Ref {
    ty: GgmlType,
    hex: &'static str,
    n: usize,
    /// Σ y[i]·(i+1): sensitive to every value's position.
    weighted_sum: f64,
    /// Σ y[i]².
    sum_sq: f64,
    samples: &'static [(usize, f64)],
}

const REFS: &[Ref] = &[
    Ref {
        ty: GgmlType::Q2_K,
        hex: "a8e5b8abeeab14cef599cc052535d5cec0ad06783f60ec83760457a17c472a49ed10c2fa0a67ce0d8f02264785762462c423399232b39168ce358d21b527970bb48a4200a5627b0c90b818268101caff961dbe20",
        n: 256,
        weighted_sum: -684.3625183105469,
        sum_sq: 1.3261552369804122,
        samples: &[
            (0, -0.092620849609375),
            (3, -0.092620849609375),
            (17, -0.129669189453125),
            (40, -0.0582427978515625),
            (77, -0.129669189453125),
            (100, -0.0092620849609375),
            (130, -0.11165618896484375),
            (150, 0.06392669677734375),
            (190, 0.0545501708984375),
            (201, 0.06330108642578125),
            (230, -0.06585693359375),
            (255, 0.1179656982421875),
        ],
    },
    Ref {
        ty: GgmlType::Q3_K,
        hex: "7fa901a7bf8a6343304464f943287f2d2133cee5d95535cc78861fd80e7fa01dd0a174645397c6a0adc1367e7e3976aa6b833bad348bb5a93fc4900f8a8987f50f8c3b8efc8c4ce733da7d4597758c5cbdd130e147d9d82f7c5b70102d58b85f48d7dead24924b1fbe1ebede0d24",
        n: 256,
        weighted_sum: -1429.7833709716797,
        sum_sq: 98.55112092383206,
        samples: &[
            (0, 0.0),
            (3, 0.0),
            (17, 0.3322906494140625),
            (40, -0.221527099609375),
            (77, -0.31646728515625),
            (100, 0.4272308349609375),
            (130, -0.31646728515625),
            (150, -0.0),
            (190, -0.18988037109375),
            (201, 0.031646728515625),
            (230, -0.18988037109375),
            (255, -0.8069915771484375),
        ],
    },
    Ref {
        ty: GgmlType::Q4_0,
        hex: "f31eb6faf3fe08fa81ace9fcf7815461b43c94227cdd59ec8e3eda1a5246fe42841e8723",
        n: 64,
        weighted_sum: -2.4852333068847656,
        sum_sq: 0.14590833085821941,
        samples: &[
            (0, -0.01357269287109375),
            (3, 0.04071807861328125),
            (10, -0.006786346435546875),
            (13, -0.047504425048828125),
            (20, -0.054290771484375),
            (23, 0.01357269287109375),
            (30, 0.020359039306640625),
            (37, 0.07708740234375),
            (40, -0.07708740234375),
            (47, -0.064239501953125),
            (50, -0.038543701171875),
            (57, -0.0513916015625),
        ],
    },
    Ref {
        ty: GgmlType::Q4_1,
        hex: "8b29efb69bf23ac986708b51dc4b22cbbce5cdf65c2855b5b68d7e4330df3c8ef7c6e57002383541",
        n: 64,
        weighted_sum: -170.70217895507812,
        sum_sq: 2.3779767714440823,
        samples: &[
            (0, 0.042999267578125),
            (3, -0.043609619140625),
            (10, -0.34674072265625),
            (13, -0.216827392578125),
            (20, -0.0869140625),
            (23, -0.216827392578125),
            (30, 0.0863037109375),
            (37, 0.1776123046875),
            (40, -0.0948486328125),
            (47, -0.2991943359375),
            (50, -0.0948486328125),
            (57, 0.075439453125),
        ],
    },
    Ref {
        ty: GgmlType::Q8_0,
        hex: "0b1c209c7027190cd49d5abcf2a919bd3c6206394868f9dd8b870c2ca566e9c90084432a3e969b7b403f650fcbaf8e29813c06af17eaa30a3c41d6ab24acc523a6ac6b9c",
        n: 64,
        weighted_sum: -1283.1616134643555,
        sum_sq: 446.5294927727955,
        samples: &[
            (0, 0.1263427734375),
            (3, 0.15398025512695312),
            (10, -0.05527496337890625),
            (13, -0.2645301818847656),
            (20, -0.027637481689453125),
            (23, -0.4777336120605469),
            (30, 0.0),
            (37, 3.081939697265625),
            (40, -2.592742919921875),
            (47, -3.962493896484375),
            (50, -4.549530029296875),
            (57, -4.1092529296875),
        ],
    },
    Ref {
        ty: GgmlType::Q4_K,
        hex: "3329b12941225f7064b00a74b72558885c9b6b311047cd005dd64ea5800a53401c635ba88007c6db81ed4f6e4d5ae06c7ba40d2d33a25ebc1422ebb235060becc997a5c651154a27ee13b1cd6bb304feb38d8d5bb44bad2e301d19da393dabf0abcb92f9c8f73d16a3cf03e14ca8dc775e30886edea238d4333dbde7850af347a34596c201c87cde90b386ddc56ff6f98a18af26d78b7ad7b016dd6c5961e972844be6c1f4a3d95eabe6d2c06639907b12d70f02b9359917c8e186c36ae7073a9ff213fca6675c8992babb2bca11b5bb04bdf93245d1eb7275acf394664c354e0bcd1eadb12886f26149495ae5c043c0ccaa4647f92ad8786672191c3408107554b3ddab88fe0fbffd4e9650847cfbdaf7e5228509eb224b31def83fc07fbabb",
        n: 512,
        weighted_sum: 181694.99667739868,
        sum_sq: 19624.551754234795,
        samples: &[
            (0, -1.11328125),
            (37, 3.389892578125),
            (74, 13.406402587890625),
            (111, 24.9837646484375),
            (148, 6.273345947265625),
            (185, 0.92535400390625),
            (222, 5.626800537109375),
            (259, -1.2021980285644531),
            (296, -0.33057403564453125),
            (333, -0.6285781860351562),
            (370, -0.3841056823730469),
            (407, 0.0446624755859375),
        ],
    },
    Ref {
        ty: GgmlType::Q5_K,
        hex: "7823f629b885df9cf719efb6eaf2c447b2fb9e1ea3e7be73b2602d40f41afe87b306109f9d2717fdf523b0cc07c98701f316389e0ba187338a27906bb89cc241cc981d07c40d3b57d7deb3c15f89910d23a6e7fbab249553897299be7c9ac732605b2d1ea56d47d435a8418b2e671aa3d953ea6aad71df15dc19ba05366f5c38c21c5512fb8c61aebb2531591ab3682281205a74cc14def46fb23013423cf322c0750ad8163536ccf7027b080f2a907f8723142a5b53014e8634c2c086edf43b4ddc35f7e42e9ce440a88e86793ba660f00241e921608b134d4f9030e690a708d168bb636a4a2c7612a60cd355edb2df8eebaf98298bc159d5bf1de62c3ed2d25bfa583577a37bf2c688527a7894291170a008a5883f3f4c35a666411c56819efdda308b93f93f4d530b6467adbcc22cdc423875b06dd97eb3e6c472e3bdb4c2941c5252ed5ff0af8aafaf315612873f388c127a13723e9f689ee3b1b4cfce50",
        n: 512,
        weighted_sum: 443696.12003326416,
        sum_sq: 23745.341410359833,
        samples: &[
            (0, -0.11065673828125),
            (37, 0.73211669921875),
            (74, 9.116455078125),
            (111, -1.2894287109375),
            (148, 13.65478515625),
            (185, 8.22894287109375),
            (222, -2.794189453125),
            (259, 7.257133483886719),
            (296, -2.1899032592773438),
            (333, -0.036163330078125),
            (370, 0.0),
            (407, 7.803802490234375),
        ],
    },
    Ref {
        ty: GgmlType::Q6_K,
        hex: "49c6370cbd68b7333b559c918131c3905c868fbec38b5b61ffbb592e1d15e0ce3a42ed51705ba72022c9d86124fd8af35b32f4e9ff6d94bafd8a689a5884f02c4ca86af0f2a858b1e6ffdef5b0e7c3174822911a5555708e642b06b33c0e3d1a5648647ef27a2f0b43caa49e735d8764c40f33fa40ebe8b08c97a17c64311bbadf8ec4b5a3a745abf6ec90cf8a21709782d38c211e2e06e13e6623d993eea389151b69c47ee30a19c509b9f18cf62b24e0a31a04e9fc57f601908d6f978950ccad448c367e9dba01038064c090b420f2502191054ac6c9a7041a5f23b99f22e98c53bee7cbc90f27b0cc9bd68f9bb096e847433247c8f68013303e5bd5be7e2cb3ceabe207f516100e98b30eefd61faa87363e3d5ff12a08bf297ae0f1c3f73cbff9a467a132f383dc00eba33f1f349a783213a92e09704868dadfee2d5ed7d7e6006bc4ad6c0be5e0f2c89f6e0f23b9a783c55c75d131ed99a5a60d5a711a0f8f8081e1d276d60c1dec6966919bb61fb9fb3ad9efa9401f59c0ea50c474f9873086c1d52a6ac3e9738f2868ce2cb62e42c8582a07dcd2fd2beaf1d1657241e123687d26",
        n: 512,
        weighted_sum: 135668.4751586914,
        sum_sq: 265870.2024194475,
        samples: &[
            (0, -21.5301513671875),
            (37, 6.01806640625),
            (74, -9.151611328125),
            (111, -10.894775390625),
            (148, 14.609375),
            (185, 16.6015625),
            (222, 10.25146484375),
            (259, -22.303466796875),
            (296, -0.354827880859375),
            (333, 20.98553466796875),
            (370, -8.92138671875),
            (407, -19.059326171875),
        ],
    },
    Ref {
        ty: GgmlType::F16,
        hex: "063c404020b6ea2d3bb79d3b8bb1f2afe8b07abe9f3ae4bc6d40633d113276c1b128e939ff352cb90940d93959b34a405b361a313436dc3c023508330634993f0a2d68bd2abadab7513cb33c5ab52712b7b4bdbd68bc3fbd5e34643aadb0c4b7813974bbf6bfb6ac2d3557bcbcbd9cb99bbdf0b491b47b30243b88a77438ff36",
        n: 64,
        weighted_sum: -198.35872268676758,
        sum_sq: 65.82022699585309,
        samples: &[
            (0, 1.005859375),
            (3, 0.0924072265625),
            (10, 0.82763671875),
            (13, 1.3466796875),
            (20, 2.017578125),
            (23, 2.14453125),
            (30, 0.25146484375),
            (37, 1.1748046875),
            (40, -0.294677734375),
            (47, -0.4853515625),
            (50, -1.990234375),
            (57, -0.30859375),
        ],
    },
    Ref {
        ty: GgmlType::BF16,
        hex: "0dbff6bf9a3f32bef6bdf3bec63c13bf6c3fd0bf2a3f9d3d923fb13fae3f63bb61bfb93f86bf8e3efebe363ef73f223fba3e56bdca3e563f183f62bf22bf323d443fdf3e22beefbf9bbfb73ff5bea23f903e17bfd9bf9dbe26bf97bfb5beaf3fd93ff0bf92beb8bea63e413fb93e5a3dc3bf6ebfd8be21bfcabfa0bf363f91bf",
        n: 64,
        weighted_sum: -383.76123046875,
        sum_sq: 59.839940207311884,
        samples: &[
            (0, -0.55078125),
            (3, -0.173828125),
            (10, 0.6640625),
            (13, 1.3828125),
            (20, -0.49609375),
            (23, 0.6328125),
            (30, -0.6328125),
            (37, 1.4296875),
            (40, 0.28125),
            (47, 1.3671875),
            (50, -0.28515625),
            (57, -0.9296875),
        ],
    },
    Ref {
        ty: GgmlType::Q5_0,
        hex: "63a0b8abeeab14cef599cc052535d5cec0ad06783f60a8a4c2fa0a67ce0d8f02264785762462c423399232b3",
        n: 64,
        weighted_sum: 54.77001953125,
        sum_sq: 0.9699959069839679,
        samples: &[
            (0, 0.102813720703125),
            (3, -0.07711029052734375),
            (10, 0.1370849609375),
            (13, -0.06854248046875),
            (20, 0.034271240234375),
            (23, -0.02570343017578125),
            (30, 0.11138153076171875),
            (37, 0.1636962890625),
            (40, 0.21826171875),
            (47, -0.0545654296875),
            (50, 0.1455078125),
            (57, -0.109130859375),
        ],
    },
    Ref {
        ty: GgmlType::Q5_1,
        hex: "961d6db1a5627b0c90b818268101caff5536e4307fa901a75420deb0304464f943287f2d2133cee5d95535cc78861fd8",
        n: 64,
        weighted_sum: -94.8021240234375,
        sum_sq: 0.5972164294216782,
        samples: &[
            (0, -0.082275390625),
            (3, -0.1368255615234375),
            (10, -0.147735595703125),
            (13, -0.03318023681640625),
            (20, -0.03863525390625),
            (23, -0.08773040771484375),
            (30, -0.1695556640625),
            (37, 0.008514404296875),
            (40, -0.076019287109375),
            (47, -0.08447265625),
            (50, 0.042327880859375),
            (57, -0.109832763671875),
        ],
    },
];

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn dequantize_matches_ggml_reference() {
    for r in REFS {
        let bytes = unhex(r.hex);
        let mut y = vec![0f32; r.n];
        dequantize_row(r.ty, &bytes, &mut y).unwrap();
        let ws: f64 = y
            .iter()
            .enumerate()
            .map(|(i, &v)| f64::from(v) * (i + 1) as f64)
            .sum();
        let sq: f64 = y.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let tol = 1e-5 * (1.0 + r.weighted_sum.abs());
        assert!(
            (ws - r.weighted_sum).abs() <= tol,
            "{:?}: {ws} vs {}",
            r.ty,
            r.weighted_sum
        );
        assert!(
            (sq - r.sum_sq).abs() <= 1e-5 * (1.0 + r.sum_sq),
            "{:?}",
            r.ty
        );
        for &(i, v) in r.samples {
            assert!(
                (f64::from(y[i]) - v).abs() <= 1e-6 * (1.0 + v.abs()),
                "{:?}[{i}]",
                r.ty
            );
        }
    }
}

#[test]
fn dot_kernels_agree_with_reference_values() {
    for r in REFS {
        let bytes = unhex(r.hex);
        let mut y = vec![0f32; r.n];
        dequantize_row(r.ty, &bytes, &mut y).unwrap();
        let x: Vec<f32> = (0..r.n)
            .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let exact: f32 = y.iter().zip(&x).map(|(a, b)| a * b).sum();
        let d = dot_row(r.ty, &bytes, &x).unwrap();
        assert!(
            (d - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
            "{:?}",
            r.ty
        );
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        let q = dot_row_q8(r.ty, &bytes, &quantize_activations(&x)).unwrap();
        assert!(
            (q - exact).abs() <= 1e-2 * norm(&x) * norm(&y),
            "{:?}: {q} vs {exact}",
            r.ty
        );
    }
}
