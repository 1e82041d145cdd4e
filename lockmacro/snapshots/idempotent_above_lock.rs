// #[idempotent] written above #[distributed_lock]: the lock inside the claim
// Written by `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`; not compiled.

async fn buy(id: u64, sku: u32) -> Result<u32, AppError> {
    let (
        __distlock_idem_key,
        __distlock_idem_scope,
        __distlock_idem_fp,
        __distlock_idem_client,
    ) = {
        #[allow(unused_variables)]
        let id = &id;
        #[allow(unused_variables)]
        let sku = &sku;
        let __distlock_idem_key: ::std::string::String = {
            let mut __distlock_idem_buf = ::distlock::__private::KeyBuf::new();
            __distlock_idem_buf.push_lit("pay:");
            ::distlock::__private::KeyBuf::push_arg(&mut __distlock_idem_buf, &(id));
            __distlock_idem_buf.finish()
        };
        let __distlock_idem_scope: ::core::option::Option<::std::string::String> = ::core::option::Option::None;
        #[allow(clippy::needless_borrow, unused_mut)]
        let __distlock_idem_fp = {
            #[allow(unused_imports)]
            use ::distlock::__private::{
                FpNonPayload as _, FpNone as _, FpSerialize as _, FpSet as _,
            };
            let mut __distlock_idem_fp = ::distlock::__private::Fingerprint::new();
            (&&&&::distlock::__private::FpArg("id", &id))
                .__distlock_fp(&mut __distlock_idem_fp);
            (&&&&::distlock::__private::FpArg("sku", &sku))
                .__distlock_fp(&mut __distlock_idem_fp);
            __distlock_idem_fp
        };
        let __distlock_idem_client = ::distlock::__private::default_locks();
        (
            __distlock_idem_key,
            __distlock_idem_scope,
            __distlock_idem_fp,
            __distlock_idem_client,
        )
    };
    #[allow(clippy::too_many_arguments, unused_variables)]
    async fn __distlock_idem_body(id: u64, sku: u32) -> Result<u32, AppError> {
        #[allow(unused_imports)]
        use distributed_lock as _;
        {
            let __distlock_key: ::std::string::String = {
                let mut __distlock_buf = ::distlock::__private::KeyBuf::new();
                __distlock_buf.push_lit("stock:");
                ::distlock::__private::KeyBuf::push_arg(&mut __distlock_buf, &(sku));
                __distlock_buf.finish()
            };
            let __distlock_client = ::distlock::__private::default_locks();
            ::distlock::__private::run_locked(
                    __distlock_client,
                    __distlock_key,
                    ::distlock::__private::LockSpec {
                        ttl_ms: 30000u64,
                        wait_ms: 3000u64,
                        renew: false,
                        max_hold_ms: 0u64,
                        min_hold_ms: 0u64,
                        cancel_on_lost: true,
                        replicas: ::core::option::Option::None,
                        kind: ::distlock::__private::LockKind::Lock,
                        template: "stock:<sku>",
                    },
                    async move {
                        #[allow(clippy::diverging_sub_expression)]
                        let __distlock_ret: Result<u32, AppError> = { take(sku).await };
                        #[allow(unreachable_code)] __distlock_ret
                    },
                )
                .await
        }
    }
    #[allow(unused_imports)]
    use ::distlock::__private::{DetachFnInline as _, DetachFnSend as _};
    let __distlock_idem_call = (&&::distlock::__private::DetachFn::new(
        __distlock_idem_body(id, sku),
    ))
        .__distlock_run(
            ::distlock::__private::IdemCall {
                client: __distlock_idem_client,
                target: ::distlock::__private::IdemTarget {
                    function: ::distlock::__private::IdemFn {
                        namespace: ::core::concat!(::core::module_path!(), "::", "buy"),
                        site: ::core::concat!(
                            ::core::file!(), ":", ::core::line!(), ":", ::core::column!()
                        ),
                    },
                    scope: __distlock_idem_scope,
                    key: __distlock_idem_key,
                },
                fp: __distlock_idem_fp,
                spec: ::distlock::__private::IdemSpec {
                    ttl_ms: 86400000u64,
                    lease_ms: 30000u64,
                    wait_ms: 0u64,
                    max_body: 1048576usize,
                    header: "",
                    required: true,
                    cancel_on_lost: true,
                    replicas: ::core::option::Option::None,
                },
            },
            {
                #[allow(unused_imports)]
                use ::distlock::__private::{SameByEq as _, SameBySerde as _};
                (&&::distlock::__private::SameProbe::<Result<u32, AppError>>::new())
                    .__distlock_same()
            },
        );
    __distlock_idem_call.await
}
