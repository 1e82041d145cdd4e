// #[idempotent(header, detach = false)] on a handler returning `impl IntoResponse`
// Written by `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`; not compiled.

async fn pay(
    __distlock_idem_req: ::distlock::__private::IdemRequest,
    user: User,
    ::distlock::__private::BodyFp(
        Json(req),
        __distlock_idem_body_seen,
    ): ::distlock::__private::BodyFp<Json<PayReq>>,
) -> ::distlock::__private::IdemResponse {
    let __distlock_idem_scope: ::core::option::Option<::std::string::String> = ::core::option::Option::Some({
        let mut __distlock_idem_buf = ::distlock::__private::KeyBuf::new();
        ::distlock::__private::KeyBuf::push_arg(&mut __distlock_idem_buf, &(user));
        __distlock_idem_buf.finish()
    });
    #[allow(clippy::needless_borrow, unused_mut)]
    let __distlock_idem_fp = {
        #[allow(unused_imports)]
        use ::distlock::__private::{
            FpNonPayload as _, FpNone as _, FpSerialize as _, FpSet as _,
        };
        let mut __distlock_idem_fp = ::distlock::__private::Fingerprint::new();
        __distlock_idem_fp
    };
    let __distlock_idem_client = ::distlock::__private::default_locks();
    #[allow(unused_mut)]
    let mut __distlock_idem_run = match ::distlock::__private::HandlerRun::begin(
            &__distlock_idem_req,
            __distlock_idem_body_seen,
            __distlock_idem_client,
            ::distlock::__private::IdemFn {
                namespace: ::core::concat!(::core::module_path!(), "::", "pay"),
                site: ::core::concat!(
                    ::core::file!(), ":", ::core::line!(), ":", ::core::column!()
                ),
            },
            __distlock_idem_scope,
            __distlock_idem_fp,
            ::distlock::__private::IdemSpec {
                ttl_ms: 86400000u64,
                lease_ms: 30000u64,
                wait_ms: 0u64,
                max_body: 1048576usize,
                header: "Idempotency-Key",
                required: true,
                cancel_on_lost: true,
                replicas: ::core::option::Option::None,
            },
        )
        .await
    {
        ::core::result::Result::Ok(run) => run,
        ::core::result::Result::Err(__distlock_idem_done) => return __distlock_idem_done,
    };
    let __distlock_idem_out = match __distlock_idem_run
        .keep(async move {
            #[allow(clippy::diverging_sub_expression)]
            let __distlock_idem_ret: _ = { charge(&user, req).await };
            #[allow(unreachable_code)] __distlock_idem_ret
        })
        .await
    {
        ::core::result::Result::Ok(out) => out,
        ::core::result::Result::Err(__distlock_idem_done) => return __distlock_idem_done,
    };
    fn __distlock_idem_impl_check<__DistlockOut: IntoResponse>(_: &__DistlockOut) {}
    __distlock_idem_impl_check(&__distlock_idem_out);
    #[allow(clippy::needless_borrow)]
    let __distlock_idem_cap = {
        #[allow(unused_imports)]
        use ::distlock::__private::{
            CaptureActix as _, CaptureAxum as _, CaptureBoth as _, CaptureNone as _,
        };
        (&&&&::distlock::__private::Reply::new(__distlock_idem_out))
            .__distlock_capture(&__distlock_idem_req, 1048576usize)
    };
    __distlock_idem_run.finish_with(__distlock_idem_cap).await
}
