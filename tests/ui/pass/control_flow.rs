//! Early exits from the body: `return`, `?` and a body that never returns.
use distlock::distributed_lock;

#[derive(Debug)]
enum AppError {
    Lock,
    Parse(std::num::ParseIntError),
}
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError::Lock
    }
}
impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

#[distributed_lock(key = "parse:<text>")]
async fn parse(text: &str) -> Result<u64, AppError> {
    if text.is_empty() {
        return Ok(0);
    }
    let n: u64 = text.parse()?;
    if n > 10 {
        return Err(AppError::Lock);
    }
    Ok(n)
}

#[distributed_lock(key = "loop:<n>")]
async fn loops(n: u32) -> Result<u32, AppError> {
    let mut total = 0;
    for i in 0..n {
        if i == 5 {
            return Ok(total);
        }
        total += i;
    }
    let _: u8 = "7".parse()?;
    Ok(total)
}

#[distributed_lock(key = "diverge:<n>")]
async fn diverges(n: u32) -> Result<u32, AppError> {
    let _ = n;
    loop {
        tokio::task::yield_now().await;
    }
}

fn main() {
    let _ = parse("1");
    let _ = loops(3);
    let _ = diverges(1);
}
