// #[idempotent(header)] on an axum handler
// Written by `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`; not compiled.

async fn pay(
    __distlock_idem_req: ::distlock::__private::IdemRequest,
    __distlock_p0: Path<u64>,
    user: User,
    __distlock_p2: ::distlock::__private::BodyFp<Json<PayReq>>,
) -> ::distlock::__private::IdemResponse {
    let ::distlock::__private::BodyFp(__distlock_p2, __distlock_idem_body_seen) = __distlock_p2;
    let (__distlock_idem_scope, __distlock_idem_fp, __distlock_idem_client) = {
        #[allow(unused_variables)]
        let Path(order) = &__distlock_p0;
        #[allow(unused_variables)]
        let user = &user;
        #[allow(unused_variables)]
        let Json(req) = &__distlock_p2;
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
        (__distlock_idem_scope, __distlock_idem_fp, __distlock_idem_client)
    };
    #[allow(clippy::too_many_arguments, unused_variables)]
    async fn __distlock_idem_body(
        Path(order): Path<u64>,
        user: User,
        Json(req): Json<PayReq>,
    ) -> Result<Json<Receipt>, AppError> {
        charge(order, &user, req).await
    }
    let __distlock_idem_run = match ::distlock::__private::HandlerRun::begin(
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
    #[allow(clippy::too_many_arguments)]
    async fn __distlock_idem_work(
        __distlock_idem_run: ::distlock::__private::HandlerRun,
        __distlock_idem_req: ::distlock::__private::IdemRequest,
        __distlock_p0: Path<u64>,
        user: User,
        __distlock_p2: Json<PayReq>,
    ) -> ::distlock::__private::IdemResponse {
        __distlock_idem_run
            .run(async move {
                let __distlock_idem_out = __distlock_idem_body(
                        __distlock_p0,
                        user,
                        __distlock_p2,
                    )
                    .await;
                #[allow(clippy::needless_borrow)]
                let capture = {
                    #[allow(unused_imports)]
                    use ::distlock::__private::{
                        CaptureActix as _, CaptureAxum as _, CaptureBoth as _,
                        CaptureNone as _,
                    };
                    (&&&&::distlock::__private::Reply::new(__distlock_idem_out))
                        .__distlock_capture(&__distlock_idem_req, 1048576usize)
                };
                capture.await
            })
            .await
    }
    #[allow(unused_imports)]
    use ::distlock::__private::{DetachLocal as _, DetachSend as _};
    let __distlock_idem_call = (&&::distlock::__private::Detach::new(
        ::distlock::__private::DetachMode::of(&__distlock_idem_req),
        __distlock_idem_work(
            __distlock_idem_run,
            __distlock_idem_req,
            __distlock_p0,
            user,
            __distlock_p2,
        ),
    ))
        .__distlock_run();
    __distlock_idem_call.await
}
