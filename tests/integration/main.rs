//! Integration tests: one binary, one module per concern.

mod common;
mod errors;
mod mechanisms;
mod runs;
mod sweep;
