//! The in-process backend: the same TTL, token, fencing and loss rules as Redis.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Released;

#[derive(Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: HashMap<String, (String, Instant)>,
    fences: HashMap<String, u64>,
}

impl MemoryBackend {
    pub(crate) fn try_acquire(&self, key: &str, token: &str, ttl: Duration) -> Option<u64> {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, until)) = st.held.get(key) {
            if *until > now {
                return None;
            }
        }
        st.held
            .insert(key.to_owned(), (token.to_owned(), now + ttl));
        let fence = st.fences.entry(key.to_owned()).or_insert(0);
        *fence += 1;
        Some(*fence)
    }

    pub(crate) fn release(&self, key: &str, token: &str) -> Released {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.held.get(key) {
            Some((held, until)) if held == token && *until > now => {
                st.held.remove(key);
                Released::Now
            }
            _ => Released::Lost,
        }
    }
}
