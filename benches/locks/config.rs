//! What a run does: counts, and the quick mode.
#![allow(clippy::wildcard_imports)]

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

pub(crate) struct Config {
    pub(crate) quick: bool,
    pub(crate) rt_pairs: usize,
    pub(crate) ping_samples: usize,
    pub(crate) w1_warmup: usize,
    pub(crate) w1_pairs: usize,
    pub(crate) w2_tasks: usize,
    pub(crate) w2_pairs: usize,
    pub(crate) w3_tasks: usize,
    pub(crate) w3_acquisitions: u64,
    pub(crate) w4_procs: usize,
    pub(crate) w4_tasks: usize,
    pub(crate) w4_acquisitions: u64,
    pub(crate) w5_rounds: usize,
    pub(crate) w5_keys: usize,
}

impl Config {
    pub(crate) fn from_env() -> Config {
        let quick = std::env::var("DISTLOCK_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let div = if quick { 10 } else { 1 };
        Config {
            quick,
            rt_pairs: 100,
            ping_samples: 2_000 / div,
            w1_warmup: 1_000 / div,
            w1_pairs: 20_000 / div,
            w2_tasks: 64,
            w2_pairs: 100_000 / div,
            w3_tasks: 16,
            w3_acquisitions: 2_000 / div as u64,
            w4_procs: 4,
            w4_tasks: 4,
            w4_acquisitions: 2_000 / div as u64,
            w5_rounds: 2,
            w5_keys: 2_500 / div,
        }
    }
}
