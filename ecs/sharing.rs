//! Bandwidth sharing between NIXL flows (MODEL.md §8).
