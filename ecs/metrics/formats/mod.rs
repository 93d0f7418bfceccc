//! The output formats of a run besides its report (`--json`): the files a
//! user lays beside a real benchmark or another simulator's results.
//!
//! | file | flag | what |
//! |---|---|---|
//! | [`bench_json`] | `--bench-json FILE` | `vllm bench serve --save-result`'s keys |
//! | [`aiperf`] | `--aiperf DIR` | NVIDIA AIPerf's `profile_export_aiperf.json` and `profile_export.jsonl` |
//! | [`prometheus`] | `--prometheus FILE` | the vLLM engines' `/metrics` at the end of the run |
//! | [`timeline`] | `--timeline FILE` | Chrome trace-event JSON (Perfetto, `chrome://tracing`) |
//! | [`html`] | `--html FILE` | one self-contained page: tables and figures |
//! | [`stream`] | | files written as the run goes, renamed into place at the end |

pub mod aiperf;
pub mod bench_json;
pub mod html;
pub mod prometheus;
pub mod stream;
pub mod timeline;
