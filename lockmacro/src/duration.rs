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

/// Property tests of [`parse`]: durations written in any mix of units read back as their
/// sum, and no text panics. A fixed number of cases per run.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    const UNITS: [(&str, u64); 5] = [
        ("ms", 1),
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ];

    proptest! {
        // No regression files written beside the crate: a failure prints its input.
        #![proptest_config(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::with_cases(256)
        })]

        #[test]
        fn written_durations_read_back(
            terms in prop::collection::vec((0u64..100_000, 0usize..5), 1..5),
            pad in "[ \t]{0,2}",
        ) {
            let text: String = terms.iter().map(|&(n, u)| format!("{n}{}", UNITS[u].0)).collect();
            let ms: u64 = terms.iter().map(|&(n, u)| n * UNITS[u].1).sum();
            prop_assert_eq!(parse(&format!("{pad}{text}{pad}")), Ok(Duration::from_millis(ms)));
        }

        /// A duration in ms written with the largest units first reads back as itself.
        #[test]
        fn a_duration_written_out_reads_back(ms in 0u64..(400 * 86_400_000)) {
            let mut left = ms;
            let mut text = String::new();
            for (unit, per) in UNITS.iter().rev() {
                if left >= *per {
                    text.push_str(&format!("{}{unit}", left / per));
                    left %= per;
                }
            }
            if text.is_empty() {
                text.push_str("0s");
            }
            prop_assert_eq!(parse(&text), Ok(Duration::from_millis(ms)));
        }

        #[test]
        fn no_text_panics(text in "[0-9a-z. -]{0,16}|\\PC{0,16}") {
            if let Ok(d) = parse(&text) {
                prop_assert!(text.trim().chars().next().is_some_and(|c| c.is_ascii_digit()), "{:?} gave {:?}", text, d);
            }
        }

        /// Numbers too large for a `u64` of ms are refused, not wrapped.
        #[test]
        fn overflow_is_refused(n in (u64::MAX / 1_000 + 1)..u64::MAX) {
            let seconds = format!("{n}s");
            prop_assert!(parse(&seconds).is_err());
        }
    }
}
