//! Physical deployments, derived by hand: KV bytes and weights of presets,
//! num_gpu_blocks of one pod, roofline step times, the NIC conversion and
//! the fan-out of a read over TP ranks; and the refusals.

use std::path::Path;

use pdsim::hardware::memory::GIB;
use pdsim::hardware::{Efficiency, MemoryPlan, Pod, Roofline, StepShape, presets};

use crate::common::{assert_close, req, run_trace, tiny};

fn pod(model: &str, gpu: &str, tp: u32) -> Pod {
    let model = presets::model(model, None).unwrap();
    Pod {
        kv_dtype_bytes: model.dtype_bytes,
        model,
        gpu: presets::gpu(gpu, None).unwrap(),
        tp,
        kv_cache_dtype: "auto".into(),
        hybrid_kv_cache: true,
    }
}

#[test]
fn kv_bytes_and_weights_of_two_presets() {
    // Llama-3.1-8B: 32 layers × K and V × 8 KV heads × 128 × 2 B (bf16)
    // = 32 × 4096 = 131 072 B per token; at TP 4 each rank has 2 KV heads:
    // 32 × 2 × 2 × 128 × 2 = 32 768 B.
    let llama = pod("Llama-3.1-8B", "H100-SXM", 1);
    assert_eq!(llama.kv_bytes_per_token(), 131_072.0);
    assert_eq!(
        pod("Llama-3.1-8B", "H100-SXM", 4).kv_bytes_per_token(),
        32_768.0
    );
    // Weights: per layer attention 4096 × 128 × (32 + 2 × 8) + 32 × 128 × 4096
    // = 41 943 040, MLP 3 × 4096 × 14 336 = 176 160 768; × 32 layers =
    // 6 979 321 856; embeddings and LM head 2 × 128 256 × 4096 =
    // 1 050 673 152; in all 8 029 995 008 parameters × 2 B = 16 059 990 016 B.
    assert_eq!(llama.weight_bytes(), 16_059_990_016.0);
    // gpt-oss-120b: 2 × 8 × 64 × 2 B = 2048 B per token and layer; the
    // hybrid manager keeps a full-attention group of 18 layers per block:
    // 36 864 B per token, × 128 = 4 718 592 B per block.
    let oss = pod("gpt-oss-120b", "H200", 1);
    assert_eq!(oss.pool_layers(), 18);
    assert_eq!(oss.kv_bytes_per_token(), 36_864.0);
    assert_eq!(oss.block_bytes(128), 4_718_592.0);
    // Weights: attention 2880 × 64 × (64 + 16) + 64 × 64 × 2880 = 26 542 080
    // × 2 B = 53 084 160 B; 128 experts × 3 × 2880 × 2880 = 3 185 049 600
    // in MXFP4 (4.25 bits) = 1 692 057 600 B; router 2880 × 128 × 2 B =
    // 737 280 B; per layer 1 745 879 040, × 36 = 62 851 645 440; embeddings
    // and head 2 × 201 088 × 2880 × 2 B = 2 316 533 760; in all
    // 65 168 179 200 B = 60.69 GiB (the published checkpoint: 60.8 GiB).
    assert_eq!(oss.weight_bytes(), 65_168_179_200.0);
    // DeepSeek-V3's MLA latent: (512 + 64) × 2 B × 61 layers = 70 272 B
    // per token, the same on every rank.
    assert_eq!(pod("DeepSeek-V3", "H200", 8).kv_bytes_per_token(), 70_272.0);
}

#[test]
fn num_gpu_blocks_of_one_pod() {
    // Llama-3.1-8B on one H100 (81 090 MiB = 85 029 027 840 B as CUDA
    // reports it), utilization 0.9: ceil(0.9 × 85 029 027 840) =
    // 76 526 125 056 B. Less weights 16 059 990 016; the activation peak is
    // the sampler's, 1024 requests × 128 256 logits × 39 B = 5 122 031 616
    // (the forward pass of 8192 tokens holds 8192 × (4 × 4096 × 2 +
    // 3 × 14 336 × 2) = 973 078 528); non-torch 0.13 GiB = 139 586 437.12;
    // CUDA graphs 0.5 GiB = 536 870 912: 54 667 646 074.88 B for KV, ÷
    // 16 × 131 072 = 2 097 152 B per block = 26 067.56 → 26 067 blocks.
    let llama = pod("Llama-3.1-8B", "H100-SXM", 1);
    let m = MemoryPlan::derive(&llama, 0.9, 16, 8192, 1024, None);
    assert_eq!(m.requested, 76_526_125_056.0);
    assert_eq!(m.activations, 5_122_031_616.0);
    assert!(
        (m.kv_memory - 54_667_646_074.88).abs() < 1e-3,
        "{}",
        m.kv_memory
    );
    assert_eq!(m.num_gpu_blocks, 26_067);
    // kv_cache_memory_bytes skips the profile: 10 GiB ÷ 2 MiB = 5120.
    let given = MemoryPlan::derive(&llama, 0.9, 16, 8192, 1024, Some(10.0 * GIB));
    assert_eq!(given.num_gpu_blocks, 5120);
}

#[test]
fn roofline_of_a_decode_step_and_a_prefill_chunk() {
    // Llama-3.1-8B on an H200 at TP 1, default efficiencies: 0.8 × 4.8 TB/s
    // = 3.84e12 B/s, 0.5 × 989.5 TFLOP/s = 494.75e12 FLOP/s, 1 ms per step.
    let r = Roofline::new(&pod("Llama-3.1-8B", "H200", 1), Efficiency::default());
    // One decode after 1023 tokens: every group is memory-bound. Bytes:
    // 32 × (attention 83 886 080 + KV 4096 × (1024 + 1) + MLP 352 321 536)
    // + LM head 1 050 673 152 = 15 143 665 664 → ÷ 3.84e12 = 3.943 664 ms,
    // + 1 ms.
    let mut decode = StepShape::default();
    decode.add(1023, 1, 0, None);
    assert_close(
        r.step_time(&decode),
        15_143_665_664.0 / 3.84e12 + 1e-3,
        "decode step",
    );
    assert!(r.breakdown(&decode).memory_bound);
    // A 2048-token chunk of a new prompt: attention and MLP compute-bound.
    // Attention per layer 2 × 2048 × 41 943 040 + 4 × 32 × 128 × (2048 ×
    // 2049 / 2) FLOPs ÷ 494.75e12 = 0.416 726 ms; MLP 2 × 2048 ×
    // 176 160 768 ÷ 494.75e12 = 1.458 422 ms; × 32 layers; the LM head
    // (one request) memory-bound, 1 050 673 152 ÷ 3.84e12 = 0.273 613 ms;
    // + 1 ms = 61.278 ms.
    let mut chunk = StepShape::default();
    chunk.add(0, 2048, 2048, None);
    let attention =
        (2.0 * 2048.0 * 41_943_040.0 + 4.0 * 32.0 * 128.0 * (2048.0 * 2049.0 / 2.0)) / 494.75e12;
    let mlp = 2.0 * 2048.0 * 176_160_768.0 / 494.75e12;
    let expected = 32.0 * (attention + mlp) + 1_050_673_152.0 / 3.84e12 + 1e-3;
    assert_close(r.step_time(&chunk), expected, "prefill chunk");
    assert!((expected - 0.061_278).abs() < 1e-6);
    assert!(!r.breakdown(&chunk).memory_bound);
}

/// The tiny scenario on physical NICs: both pools Llama-3.1-8B (KV given
/// in blocks, Linear step cost), the prefiller at TP 1 with one NIC, the
/// decoder at TP 4.
fn physical_nics(p_bytes: f64, d_bytes: f64, d_nics: u32) -> pdsim::Scenario {
    let p = format!("prefill.nic.bytes_per_s={p_bytes}");
    let d = format!("decode.nic.bytes_per_s={d_bytes}");
    let count = format!("decode.nic.count={d_nics}");
    tiny(&[
        "prefill.model=Llama-3.1-8B",
        "prefill.gpu=H100-SXM",
        "decode.model=Llama-3.1-8B",
        "decode.gpu=H100-SXM",
        "decode.engine.tensor_parallel_size=4",
        "prefill.nic.tokens_per_s=null",
        "decode.nic.tokens_per_s=null",
        &p,
        &d,
        &count,
    ])
}

#[test]
fn nic_rates_convert_with_the_kv_a_read_moves() {
    // A read into the TP 4 decoder moves 4 ranks × 32 768 B = 131 072 B per
    // token (the whole model's KV): 131 072 000 B/s = 1000 tokens/s.
    let sc = physical_nics(131_072_000.0, 13_107_200.0, 4);
    assert_eq!(sc.prefill().read_bytes_per_token, Some(131_072.0));
    assert_eq!(sc.prefill().nic_tokens_per_s, 1000.0);
    assert_eq!(sc.decode().nic_tokens_per_s, 100.0);
    assert_eq!((sc.prefill().nics, sc.decode().nics), (1, 4));
    // 400 Gb/s = 50e9 B/s ÷ 131 072 = 381 469.726 5625 tokens/s.
    let gbps = tiny(&[
        "prefill.model=Llama-3.1-8B",
        "prefill.gpu=H100-SXM",
        "decode.model=Llama-3.1-8B",
        "decode.gpu=H100-SXM",
        "prefill.nic.tokens_per_s=null",
        "prefill.nic.gbps=400",
    ]);
    assert_eq!(gbps.prefill().nic_tokens_per_s, 381_469.726_562_5);
}

#[test]
fn a_read_from_tp1_into_tp4_fans_out_over_the_decoder_nics() {
    // One remote request of 40 prompt tokens: prefilled in one step of
    // max(10 ms, 40 × 1 ms) = 40 ms, answered at 0.04, read posted at
    // 0.045. Its four parts move 10 token-units each, prefiller NIC →
    // decoder NIC j.
    //
    // Decoder NICs of 100 tokens/s, prefiller NIC 1000: each part gets
    // min(1000 / 4, 100) = 100 → all done after 10 / 100 = 0.1 s, at 0.145
    // (one decoder NIC alone would need 40 / 100 = 0.4 s).
    let out = run_trace(
        &physical_nics(131_072_000.0, 13_107_200.0, 4),
        vec![req(0.0, 40, 1, None, true)],
    );
    assert_close(out.req(0).t1.unwrap(), 0.04, "answered");
    assert_close(
        out.req(0).read_done_at.unwrap(),
        0.145,
        "decoder NICs a quarter each",
    );
    // Decoder NICs of 1000: the prefiller's one NIC carries the whole read,
    // 250 tokens/s per part: 10 / 250 = 0.04 s, done at 0.085.
    let out = run_trace(
        &physical_nics(131_072_000.0, 131_072_000.0, 4),
        vec![req(0.0, 40, 1, None, true)],
    );
    assert_close(
        out.req(0).read_done_at.unwrap(),
        0.085,
        "prefiller NIC carries it all",
    );
    // Four decoder ranks on one NIC of 100: 4 parts share it, 25 each:
    // 10 / 25 = 0.4 s, done at 0.445.
    let out = run_trace(
        &physical_nics(131_072_000.0, 13_107_200.0, 1),
        vec![req(0.0, 40, 1, None, true)],
    );
    assert_close(
        out.req(0).read_done_at.unwrap(),
        0.445,
        "one decoder NIC for four ranks",
    );
    assert_eq!(
        out.report.counters["kv_transfers"], 1,
        "one transfer, four flows"
    );
}

fn refusal(sets: &[&str]) -> String {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    pdsim::scenario::load(Path::new("scenarios/h200_llama70b_4p2d.ron"), &sets)
        .expect_err("refused")
        .to_string()
}

#[test]
fn impossible_hardware_is_refused_with_a_sentence() {
    let err = refusal(&["prefill.gpu=H201"]);
    assert!(
        err.contains("prefill.gpu: unknown GPU preset `H201` (did you mean `H200`?)"),
        "{err}"
    );
    // 70B in bf16 (141 GB) on one 80 GB GPU.
    let err = refusal(&[
        "decode.gpu=H100-SXM",
        "decode.engine.tensor_parallel_size=1",
    ]);
    assert!(
        err.contains("decode: Llama-3.1-70B does not fit on H100-SXM at tensor_parallel_size 1"),
        "{err}"
    );
    // At TP 2 on H100s the weights fit (65.7 GiB per GPU) but what is left
    // holds fewer tokens than max_model_len = 131 072.
    let err = refusal(&[
        "decode.gpu=H100-SXM",
        "decode.engine.tensor_parallel_size=2",
        "decode.engine.max_model_len=131072",
        "prefill.engine.max_model_len=131072",
    ]);
    assert!(
        err.contains("(derived from the GPU memory)")
            && err.contains("smaller than max_model_len (131072)"),
        "{err}"
    );
    let err = refusal(&["decode.engine.tensor_parallel_size=3"]);
    assert!(
        err.contains("64 attention heads, which tensor_parallel_size 3 does not divide"),
        "{err}"
    );
    let err = refusal(&["decode.cost.kind=Roofline", "decode.model=null"]);
    assert!(
        err.contains("a physical pool names both its `model` and its `gpu`"),
        "{err}"
    );
    let err = refusal(&["decode.model=Qwen3-8B"]);
    assert!(err.contains("must serve the same model"), "{err}");
}

#[test]
fn a_config_json_missing_a_field_is_named() {
    let dir = crate::common::Scratch::new("hw");
    let file = dir.join("config.json");
    std::fs::write(
        &file,
        r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 64}"#,
    )
    .unwrap();
    let set = format!("decode.model={}", file.display());
    let err = refusal(&[&set, &format!("prefill.model={}", file.display())]);
    assert!(
        err.contains("config.json: field `hidden_size` is missing"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn runs_of_decode_steps_are_exact_under_the_physical_models() {
    // A busy tiny deployment of gpt-oss-120b (sliding windows of 128 over
    // contexts that cross it) with the roofline, and of a measured table:
    // booking repeated decode steps as one run gives every request the
    // same times as forming each step.
    let dir = crate::common::Scratch::new("table");
    let table = dir.join("steps.csv");
    std::fs::write(
        &table,
        "prefill_tokens,decode_requests,kv_tokens,seconds\n\
         0,1,0,0.004\n0,1,1000,0.005\n0,8,0,0.006\n0,8,1000,0.009\n\
         512,1,0,0.030\n512,1,1000,0.031\n512,8,0,0.033\n512,8,1000,0.036\n",
    )
    .unwrap();
    let table_set = format!("decode.cost.file={}", table.display());
    for cost in [
        vec!["decode.cost.kind=Roofline", "prefill.cost.kind=Roofline"],
        vec!["decode.cost.kind=Table", table_set.as_str()],
    ] {
        let mut sets = vec![
            "horizon=40",
            "workload.session_rate=2",
            "workload.output_tokens_mean=60",
            "workload.first_turn_tokens=[100,200]",
            "decode.engine.max_model_len=512",
            "prefill.engine.max_model_len=512",
            "decode.engine.num_gpu_blocks=160",
            "prefill.engine.num_gpu_blocks=200",
            "prefill.model=gpt-oss-120b",
            "prefill.gpu=H200",
            "decode.model=gpt-oss-120b",
            "decode.gpu=H200",
        ];
        sets.extend(cost.iter().copied());
        let sc = tiny(&sets);
        let run = |repeats: bool| {
            let mut sim = pdsim::Sim::new(&sc).unwrap();
            sim.set_step_repeats(repeats);
            sim.record_requests();
            let report = sim.run().unwrap();
            let done = sim
                .world
                .remove_resource::<pdsim::engine::record::FinishedRequests>()
                .unwrap()
                .0;
            let times: Vec<(u64, f64, f64)> = done
                .iter()
                .map(|r| (r.id, r.first_token_at.unwrap(), r.finished_at.unwrap()))
                .collect();
            (times, report)
        };
        let (step_by_step, slow) = run(false);
        let (repeated, fast) = run(true);
        assert!(
            step_by_step.len() > 30,
            "{cost:?}: {} requests",
            step_by_step.len()
        );
        assert_eq!(step_by_step, repeated, "{cost:?}");
        assert_eq!(slow.observations, fast.observations, "{cost:?}");
        assert!(fast.ticks < slow.ticks, "{cost:?}: runs were booked");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_prints_and_writes_what_the_guide_derives() {
    let dir = crate::common::Scratch::new("check");
    let json = dir.join("derived.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdsim"))
        .args([
            "check",
            "scenarios/llmd_guide_8p2d.ron",
            "--latency",
            "8:32:128",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("prefill: 8 pods × gpt-oss-120b on 1 × H200"),
        "{text}"
    );
    assert!(text.contains("KV 36.00 KiB per token (18 layers"), "{text}");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let decode = &d["pools"][1];
    // TP 4: 2 of the 8 KV heads per rank: 18 × 2 × 2 × 64 × 2 B = 9216 B.
    assert_eq!(decode["pod"]["kv_bytes_per_token"], 9216.0);
    // 400 Gb/s = 50e9 B/s; a read moves 4 × 9216 = 36 864 B per token.
    assert_eq!(decode["nic_tokens_per_s"], 50e9 / 36_864.0);
    assert_eq!(decode["nics"], 4);
    assert_eq!(decode["num_gpu_blocks_given"], false);
    let probes = decode["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 3);
    let lat = &decode["latency"][0];
    assert_eq!(
        lat["steps"], 128,
        "one prefill step of 256 tokens, 127 decode steps"
    );
    assert!(lat["e2e"].as_f64().unwrap() > lat["first_token"].as_f64().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    // A malformed --latency is refused by the command line.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdsim"))
        .args([
            "check",
            "scenarios/llmd_guide_8p2d.ron",
            "--latency",
            "8x32",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("BATCH:INPUT:OUTPUT"));
}

#[test]
fn nics_and_step_models_are_refused_when_they_cannot_be_converted() {
    let load = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        pdsim::scenario::load(Path::new("tests/scenarios/tiny.ron"), &sets)
            .expect_err("refused")
            .to_string()
    };
    let err = load(&["prefill.nic.tokens_per_s=null", "prefill.nic.gbps=400"]);
    assert!(
        err.contains("prefill.nic.gbps needs kv_bytes_per_token, or a `model`"),
        "{err}"
    );
    let err = load(&["decode.nic.gbps=400"]);
    assert!(
        err.contains("decode.nic: give one of tokens_per_s, bytes_per_s or gbps"),
        "{err}"
    );
    let err = load(&["decode.nic.count=2"]);
    assert!(
        err.contains("decode.nic.count must be between 1 and the pod's GPUs (1)"),
        "{err}"
    );
    let err = load(&["decode.cost.kind=Roofline"]);
    assert!(
        err.contains("the Roofline step time needs the pool's `model` and `gpu`"),
        "{err}"
    );
    let err = load(&["decode.cost.kind=Table"]);
    assert!(err.contains("the Table step time needs `file`"), "{err}");
    let err = load(&["decode.cost.c0=null"]);
    assert!(err.contains("decode.cost.c0 is missing"), "{err}");
    let err = load(&["decode.engine.num_gpu_blocks=null"]);
    assert!(
        err.contains(
            "decode.engine.num_gpu_blocks is missing: give it, or name the pool's `model` and `gpu`"
        ),
        "{err}"
    );
}
