//! Expansion snapshots: what each attribute turns a fn into, for each shape it handles
//! (a free fn, a `&self` method, a method `#[async_trait]` has rewritten, a handler),
//! pretty-printed into `lockmacro/snapshots/NAME.rs`. A change to the generated code
//! shows there as a diff to review; `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`
//! rewrites the files.

use std::path::Path;

use proc_macro2::TokenStream;
use quote::quote;

fn check(name: &str, what: &str, out: TokenStream) {
    let file: syn::File = syn::parse2(out.clone())
        .unwrap_or_else(|e| panic!("{name}: the expansion does not parse as items: {e}\n{out}"));
    let text = format!(
        "// {what}\n// Written by `UPDATE_SNAPSHOTS=1 cargo test -p lockmacro`; not compiled.\n\n{}",
        prettyplease::unparse(&file)
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("snapshots")
        .join(format!("{name}.rs"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("the folder");
        std::fs::write(&path, &text).expect("the snapshot is written");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == text,
        "the expansion of {name} differs from {}: review it, then rewrite the file with \
         UPDATE_SNAPSHOTS=1 cargo test -p lockmacro\n--- the expansion now ---\n{text}",
        path.display()
    );
}

fn lock(args: TokenStream, item: TokenStream) -> TokenStream {
    crate::lock::distributed_lock(args, item)
}

fn idem(args: TokenStream, item: TokenStream) -> TokenStream {
    crate::idempotent::idempotent(args, item)
}

/// What `#[async_trait]` (0.1) makes of `async fn deduct(&self, sku: u64) -> R`: the
/// attributes below it see this.
fn async_trait_method(ret: TokenStream, body: TokenStream) -> TokenStream {
    quote! {
        fn deduct<'life0, 'async_trait>(
            &'life0 self,
            sku: u64,
        ) -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = #ret> + ::core::marker::Send + 'async_trait>>
        where
            'life0: 'async_trait,
            Self: 'async_trait,
        {
            Box::pin(async move {
                if let ::core::option::Option::Some(__ret) = ::core::option::Option::None::<#ret> {
                    #[allow(unreachable_code)]
                    return __ret;
                }
                let __self = self;
                let sku = sku;
                let __ret: #ret = { #body };
                #[allow(unreachable_code)]
                __ret
            })
        }
    }
}

#[test]
fn lock_on_a_free_fn() {
    let out = lock(
        quote!(key = "stock:<sku>", ttl = "10s", wait = "3s"),
        quote! {
            async fn deduct(sku: u64, n: u32) -> Result<u32, AppError> {
                take(sku, n).await
            }
        },
    );
    check(
        "lock_free_fn",
        "#[distributed_lock] on a free async fn",
        out,
    );
}

#[test]
fn lock_on_a_method() {
    let out = lock(
        quote!(
            key = "stock:<self.shop>:<sku>",
            renew = true,
            client = self.locks
        ),
        quote! {
            async fn deduct(&self, sku: u64) -> Result<u32, AppError> {
                self.take(sku).await
            }
        },
    );
    check(
        "lock_method",
        "#[distributed_lock] on an async `&self` method",
        out,
    );
}

#[test]
fn lock_on_an_async_trait_method() {
    let out = lock(
        quote!(key = "stock:<sku>", client = self.locks),
        async_trait_method(
            quote!(Result<u32, AppError>),
            quote!(__self.take(sku).await),
        ),
    );
    check(
        "lock_async_trait",
        "#[distributed_lock] on a method `#[async_trait]` has rewritten",
        out,
    );
}

#[test]
fn idempotent_on_a_free_fn() {
    let out = idem(
        quote!(key = "pay-callback:<notify_id>", ttl = "24h"),
        quote! {
            async fn on_paid(notify_id: String, amount: u64) -> Result<Receipt, AppError> {
                charge(amount).await
            }
        },
    );
    check(
        "idempotent_free_fn",
        "#[idempotent(key)] on a free async fn",
        out,
    );
}

#[test]
fn idempotent_on_a_method() {
    let out = idem(
        quote!(key = "notify:<id>", name = "email-notify"),
        quote! {
            async fn notify(&self, id: u64) -> Result<(), AppError> {
                self.send(id).await
            }
        },
    );
    check(
        "idempotent_method",
        "#[idempotent(key)] on an async `&self` method",
        out,
    );
}

#[test]
fn idempotent_on_an_async_trait_method() {
    let out = idem(
        quote!(key = "deduct:<sku>", name = "shop-deduct"),
        async_trait_method(
            quote!(Result<u32, AppError>),
            quote!(__self.take(sku).await),
        ),
    );
    check(
        "idempotent_async_trait",
        "#[idempotent(key)] on a method `#[async_trait]` has rewritten",
        out,
    );
}

#[test]
fn idempotent_on_a_handler() {
    let out = idem(
        quote!(header = "Idempotency-Key", scope = "<user>"),
        quote! {
            async fn pay(
                Path(order): Path<u64>,
                user: User,
                Json(req): Json<PayReq>,
            ) -> Result<Json<Receipt>, AppError> {
                charge(order, &user, req).await
            }
        },
    );
    check(
        "idempotent_handler",
        "#[idempotent(header)] on an axum handler",
        out,
    );
}

#[test]
fn idempotent_on_a_handler_kept_in_the_callers_future() {
    let out = idem(
        quote!(header = "Idempotency-Key", scope = "<user>", detach = false),
        quote! {
            async fn pay(user: User, Json(req): Json<PayReq>) -> impl IntoResponse {
                charge(&user, req).await
            }
        },
    );
    check(
        "idempotent_handler_inline",
        "#[idempotent(header, detach = false)] on a handler returning `impl IntoResponse`",
        out,
    );
}

#[test]
fn idempotent_above_a_lock() {
    let out = idem(
        quote!(key = "pay:<id>"),
        quote! {
            #[distributed_lock(key = "stock:<sku>", wait = "3s")]
            async fn buy(id: u64, sku: u32) -> Result<u32, AppError> {
                take(sku).await
            }
        },
    );
    check(
        "idempotent_above_lock",
        "#[idempotent] written above #[distributed_lock]: the lock inside the claim",
        out,
    );
}
