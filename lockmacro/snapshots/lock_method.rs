// #[distributed_lock] on an async `&self` method
// Written by `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`; not compiled.

async fn deduct(&self, sku: u64) -> Result<u32, AppError> {
    let __distlock_key: ::std::string::String = {
        let mut __distlock_buf = ::distlock::__private::KeyBuf::new();
        __distlock_buf.push_lit("stock:");
        ::distlock::__private::KeyBuf::push_arg(&mut __distlock_buf, &(self.shop));
        __distlock_buf.push_lit(":");
        ::distlock::__private::KeyBuf::push_arg(&mut __distlock_buf, &(sku));
        __distlock_buf.finish()
    };
    let __distlock_client = ::distlock::__private::client_of(&self.locks);
    ::distlock::__private::run_locked(
            __distlock_client,
            __distlock_key,
            ::distlock::__private::LockSpec {
                ttl_ms: 30000u64,
                wait_ms: 0u64,
                renew: true,
                max_hold_ms: 0u64,
                min_hold_ms: 0u64,
                cancel_on_lost: true,
                replicas: ::core::option::Option::None,
                kind: ::distlock::__private::LockKind::Lock,
                template: "stock:<self.shop>:<sku>",
            },
            async move {
                #[allow(clippy::diverging_sub_expression)]
                let __distlock_ret: Result<u32, AppError> = { self.take(sku).await };
                #[allow(unreachable_code)] __distlock_ret
            },
        )
        .await
}
