// #[idempotent(key)] on a method `#[async_trait]` has rewritten
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
            let __distlock_idem_key: ::std::string::String = {
                let mut __distlock_idem_buf = ::distlock::__private::KeyBuf::new();
                __distlock_idem_buf.push_lit("deduct:");
                ::distlock::__private::KeyBuf::push_arg(
                    &mut __distlock_idem_buf,
                    &(sku),
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
                (&&&&::distlock::__private::FpArg("sku", &sku))
                    .__distlock_fp(&mut __distlock_idem_fp);
                __distlock_idem_fp
            };
            let __distlock_idem_client = ::distlock::__private::default_locks();
            ::distlock::__private::run_idempotent(
                    ::distlock::__private::IdemCall {
                        client: __distlock_idem_client,
                        target: ::distlock::__private::IdemTarget {
                            function: ::distlock::__private::IdemFn {
                                namespace: "shop-deduct",
                                site: ::core::concat!(
                                    ::core::file!(), ":", ::core::line!(), ":",
                                    ::core::column!()
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
                        (&&::distlock::__private::SameProbe::<
                            Result<u32, AppError>,
                        >::new())
                            .__distlock_same()
                    },
                    async move { { __self.take(sku).await } },
                )
                .await
        };
        #[allow(unreachable_code)] __ret
    })
}
