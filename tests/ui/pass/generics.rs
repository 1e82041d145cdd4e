//! Generic functions: a type parameter and `impl Display` in placeholders.
use std::fmt::Display;

use distlock::distributed_lock;

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "job:<id>")]
async fn generic<T: Display + Send + Sync>(id: T) -> Result<String, AppError> {
    Ok(id.to_string())
}

#[distributed_lock(key = "job:<id>")]
async fn where_clause<T>(id: &T) -> Result<(), AppError>
where
    T: Display + ?Sized + Sync,
{
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "tenant:<tenant>")]
async fn impl_display(tenant: impl Display + Send) -> Result<(), AppError> {
    let _ = tenant.to_string();
    Ok(())
}

#[distributed_lock(key = "ret:<id>")]
async fn generic_error<E: From<distlock::Error>>(id: u8) -> Result<u8, E> {
    Ok(id)
}

fn main() {
    let _ = generic(5_u32);
    let _ = where_clause("str slice");
    let _ = impl_display('x');
    let _ = generic_error::<AppError>(1);
}
