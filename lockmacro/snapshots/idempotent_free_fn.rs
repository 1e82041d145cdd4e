// #[idempotent(key)] on a free async fn
// Written by `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`; not compiled.

async fn on_paid(notify_id: String, amount: u64) -> Result<Receipt, AppError> {
    let (
        __distlock_idem_key,
        __distlock_idem_scope,
        __distlock_idem_fp,
        __distlock_idem_client,
    ) = {
        #[allow(unused_variables)]
        let notify_id = &notify_id;
        #[allow(unused_variables)]
        let amount = &amount;
        let __distlock_idem_key: ::std::string::String = {
            let mut __distlock_idem_buf = ::distlock::__private::KeyBuf::new();
            __distlock_idem_buf.push_lit("pay-callback:");
            ::distlock::__private::KeyBuf::push_arg(
                &mut __distlock_idem_buf,
                &(notify_id),
            );
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
            (&&&&::distlock::__private::FpArg("notify_id", &notify_id))
                .__distlock_fp(&mut __distlock_idem_fp);
            (&&&&::distlock::__private::FpArg("amount", &amount))
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
    async fn __distlock_idem_body(
        notify_id: String,
        amount: u64,
    ) -> Result<Receipt, AppError> {
        charge(amount).await
    }
    #[allow(unused_imports)]
    use ::distlock::__private::{DetachFnInline as _, DetachFnSend as _};
    let __distlock_idem_call = (&&::distlock::__private::DetachFn::new(
        __distlock_idem_body(notify_id, amount),
    ))
        .__distlock_run(
            ::distlock::__private::IdemCall {
                client: __distlock_idem_client,
                target: ::distlock::__private::IdemTarget {
                    function: ::distlock::__private::IdemFn {
                        namespace: ::core::concat!(
                            ::core::module_path!(), "::", "on_paid"
                        ),
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
                (&&::distlock::__private::SameProbe::<Result<Receipt, AppError>>::new())
                    .__distlock_same()
            },
        );
    __distlock_idem_call.await
}
