//! Compile-time durations: `"500ms"`, `"30s"`, `"5m"`, `"24h"`, `"1d"`, `"1m30s"`.

use std::time::Duration;

/// Parses a duration; the error text says what was wrong, without the argument name.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let expected = "expected whole numbers with units `ms`, `s`, `m`, `h` or `d`, e.g. `30s`, `500ms` or `1m30s`";
    if t.is_empty() {
        return Err(format!("empty duration: {expected}"));
    }
    if t.starts_with('-') {
        return Err(format!(
            "invalid duration `{text}`: durations cannot be negative"
        ));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(format!("invalid duration `{text}`: {expected}"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration `{text}`: the number is too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms_per = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(format!(
                    "invalid duration `{text}`: missing unit after `{n}`; {expected}"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration `{text}`: unknown unit `{other}`; {expected}"
                ));
            }
        };
        let ms = n
            .checked_mul(ms_per)
            .ok_or_else(|| format!("invalid duration `{text}`: too large"))?;
        total = total
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| format!("invalid duration `{text}`: too large"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse("30x").unwrap_err().contains("unknown unit `x`"));
        assert!(parse("-1s").unwrap_err().contains("negative"));
        assert!(parse("30").unwrap_err().contains("missing unit"));
        assert!(parse("s").is_err());
        assert!(parse("1.5s").is_err());
    }
}
