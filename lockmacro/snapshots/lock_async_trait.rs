// #[distributed_lock] on a method `#[async_trait]` has rewritten
// Written by `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`; not compiled.

fn deduct<'life0, 'async_trait>(
    &'life0 self,
    sku: u64,
) -> ::core::pin::Pin<
    Box<
        dyn ::core::future::Future<
            Output = Result<u32, AppError>,
        > + ::core::marker::Send + 'async_trait,
    >,
>
where
    'life0: 'async_trait,
    Self: 'async_trait,
{
    Box::pin(async move {
        if let ::core::option::Option::Some(__ret) = ::core::option::Option::None::<
            Result<u32, AppError>,
        > {
            #[allow(unreachable_code)] return __ret;
        }
        let __self = self;
        let sku = sku;
        let __ret: Result<u32, AppError> = {
            let __distlock_key: ::std::string::String = {
                let mut __distlock_buf = ::distlock::__private::KeyBuf::new();
                __distlock_buf.push_lit("stock:");
                ::distlock::__private::KeyBuf::push_arg(&mut __distlock_buf, &(sku));
                __distlock_buf.finish()
            };
            let __distlock_client = ::distlock::__private::client_of(&__self.locks);
            ::distlock::__private::run_locked(
                    __distlock_client,
                    __distlock_key,
                    ::distlock::__private::LockSpec {
                        ttl_ms: 30000u64,
                        wait_ms: 0u64,
                        renew: false,
                        max_hold_ms: 0u64,
                        min_hold_ms: 0u64,
                        cancel_on_lost: true,
                        replicas: ::core::option::Option::None,
                        kind: ::distlock::__private::LockKind::Lock,
                        template: "stock:<sku>",
                    },
                    async move { { __self.take(sku).await } },
                )
                .await
        };
        #[allow(unreachable_code)] __ret
    })
}
