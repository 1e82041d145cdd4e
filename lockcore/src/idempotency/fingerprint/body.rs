//! Request bodies and query strings, read into what the fingerprint covers: canonical
//! JSON text (numbers by exact decimal value), multipart parts, percent-decoded queries.

use super::*;

/// `%XX` decoded (a bad escape stays as it is); with `plus`, `+` is a space.
pub(super) fn percent_decode(raw: &[u8], plus: bool) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' if i + 2 < raw.len() => match (hex(raw[i + 1]), hex(raw[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// A query string as `[name, value]` pairs, each percent-decoded with `+` as a space (as
/// `application/x-www-form-urlencoded`, which axum's `Query` and actix's `web::Query`
/// read), sorted by name; the values of one name keep their order, which a handler may
/// read (`Query<HashMap>` keeps the last, `Vec` all in order): `a=%41&b` and `b=&a=A`
/// are one query, `a=1&a=2` and `a=2&a=1` are two. A name or value that does not decode
/// to UTF-8 is written as the array of its bytes, so that two such (`%FF`, `%FE`) stay
/// apart.
pub(super) fn canonical_query(query: &str) -> Value {
    canonical_form(query.as_bytes())
}

/// [`canonical_query`] of bytes: a query string, or an `application/x-www-form-urlencoded`
/// body (the same syntax).
pub(super) fn canonical_form(form: &[u8]) -> Value {
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = form
        .split(|&b| b == b'&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (name, value) = match p.iter().position(|&b| b == b'=') {
                Some(at) => (&p[..at], &p[at + 1..]),
                None => (p, &b""[..]),
            };
            (percent_decode(name, true), percent_decode(value, true))
        })
        .collect();
    // By the decoded bytes (for UTF-8, the order of the text). Stable: equal names keep
    // their order.
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let text = |bytes: Vec<u8>| match String::from_utf8(bytes) {
        Ok(text) => Value::String(text),
        Err(e) => Value::Array(e.into_bytes().into_iter().map(Value::from).collect()),
    };
    Value::Array(
        pairs
            .into_iter()
            .map(|(n, v)| Value::Array(vec![text(n), text(v)]))
            .collect(),
    )
}

/// What the fingerprint records of a request body: `json:<sha256>` of its canonical JSON
/// when `content_type` is JSON and the body parses; `form:<sha256>` of the canonical
/// JSON of its fields ([`canonical_form`], as the query is) when it is
/// `application/x-www-form-urlencoded`; `multipart:<sha256>` of its parts when it is
/// `multipart/form-data` and parses; else `bytes:<sha256>` of the bytes; empty for no
/// body.
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
pub(crate) fn body_label(content_type: Option<&[u8]>, body: &[u8]) -> String {
    if body.is_empty() {
        return String::new();
    }
    let mime = content_type.map(|ct| {
        ct.split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii()
    });
    let json = mime.is_some_and(|mime| {
        mime.eq_ignore_ascii_case(b"application/json")
            || (mime.len() >= 5 && mime[mime.len() - 5..].eq_ignore_ascii_case(b"+json"))
    });
    if json && let Some(text) = canonical_json(body) {
        return format!("json:{}", hex(&Sha256::digest(text.as_bytes())));
    }
    if mime.is_some_and(|mime| mime.eq_ignore_ascii_case(b"application/x-www-form-urlencoded")) {
        let mut text = String::new();
        write_canonical(&canonical_form(body), &mut text);
        return format!("form:{}", hex(&Sha256::digest(text.as_bytes())));
    }
    if let Some(parts) = content_type.and_then(|ct| multipart_parts(ct, body)) {
        return format!("multipart:{}", hex(&Sha256::digest(parts.as_bytes())));
    }
    format!("bytes:{}", hex(&Sha256::digest(body)))
}

/// A `multipart/form-data` body by its parts, not its boundary (every client makes a new
/// random one per submission, so a form sent again differs in its bytes): a JSON array,
/// in order, of each part's `name`, `filename` (`null` when absent), `filename*`
/// (decoded; only when present), `content_type` (lower case, empty when absent) and the
/// SHA-256 of its bytes ([`part_headers`]). `None` when the type is not multipart with a
/// boundary, or the body does not parse as one (the bytes are the payload then).
fn multipart_parts(content_type: &[u8], body: &[u8]) -> Option<String> {
    let ct = std::str::from_utf8(content_type).ok()?;
    let mut params = ct.split(';');
    if !params
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    let boundary = params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"'))
    })?;
    if boundary.is_empty() {
        return None;
    }
    let delimiter = [b"--", boundary.as_bytes()].concat();
    let next_delimiter = [b"\r\n--", boundary.as_bytes()].concat();
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    // The first delimiter: at the start, or after a preamble and a CRLF.
    let mut at = if body.starts_with(&delimiter) {
        delimiter.len()
    } else {
        find(body, &next_delimiter)? + next_delimiter.len()
    };
    let mut out = String::from("[");
    loop {
        let rest = body.get(at..)?;
        if rest.starts_with(b"--") {
            break; // the close delimiter
        }
        let rest = rest.strip_prefix(b"\r\n")?;
        let end = find(rest, &next_delimiter)?;
        let part = &rest[..end];
        let split = find(part, b"\r\n\r\n");
        let (head, content) = match split {
            Some(i) => (&part[..i], &part[i + 4..]),
            // No headers: the part starts with the blank line.
            None => (&b""[..], part.strip_prefix(b"\r\n")?),
        };
        let headers = part_headers(head)?;
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str("{\"content_type\":");
        push_json_str(&headers.content_type, &mut out);
        out.push_str(",\"filename\":");
        match &headers.filename {
            Some(f) => push_json_str(f, &mut out),
            None => out.push_str("null"),
        }
        // Only when present: a part without it is written as before.
        if let Some(f) = &headers.filename_ext {
            out.push_str(",\"filename*\":");
            push_json_str(f, &mut out);
        }
        out.push_str(",\"name\":");
        push_json_str(headers.name.as_deref().unwrap_or(""), &mut out);
        out.push_str(",\"sha256\":\"");
        out.push_str(&hex(&Sha256::digest(content)));
        out.push_str("\"}");
        at += 2 + end + next_delimiter.len();
    }
    out.push(']');
    Some(out)
}

/// A multipart part's headers as the fingerprint covers them.
#[derive(Debug, Default, PartialEq)]
pub(super) struct PartHeaders {
    /// `name` of `Content-Disposition`.
    pub(super) name: Option<String>,
    /// `filename` of `Content-Disposition`.
    pub(super) filename: Option<String>,
    /// `filename*` of `Content-Disposition` (RFC 6266, an RFC 8187 ext-value), decoded.
    pub(super) filename_ext: Option<String>,
    /// `Content-Type`, lower case, empty when absent.
    pub(super) content_type: String,
}

/// A multipart part's headers (see [`PartHeaders`]). `None` when they are not UTF-8,
/// name a header of these twice, or hold a `Content-Disposition` that does not parse
/// ([`disposition_params`]): the body's bytes are the payload then.
pub(super) fn part_headers(head: &[u8]) -> Option<PartHeaders> {
    let mut out = PartHeaders::default();
    let (mut seen_type, mut seen_disposition) = (false, false);
    for line in std::str::from_utf8(head).ok()?.split("\r\n") {
        let Some((field, value)) = line.split_once(':') else {
            continue;
        };
        let field = field.trim();
        if field.eq_ignore_ascii_case("content-type") {
            (!seen_type).then_some(())?;
            seen_type = true;
            out.content_type = value.trim().to_ascii_lowercase();
        } else if field.eq_ignore_ascii_case("content-disposition") {
            (!seen_disposition).then_some(())?;
            seen_disposition = true;
            for (param, value) in disposition_params(value)? {
                match param.as_str() {
                    "name" => out.name = Some(value),
                    "filename" => out.filename = Some(value),
                    "filename*" => out.filename_ext = Some(ext_value(&value)?),
                    _ => {}
                }
            }
        }
    }
    Some(out)
}

/// The parameters of a `Content-Disposition` value (RFC 6266 section 4.1, RFC 7578
/// section 4.2): after the disposition type, `; name=value` pairs, each value a token or
/// a quoted string (a `;` inside the quotes is part of it, a backslash escapes the next
/// character, so `\"` does not end it), names in lower case (they are
/// case-insensitive). A quoted value is its text between the quotes as sent, escapes
/// kept: readers differ on unescaping (browsers do not escape, and send `\` in a name
/// as it is), so `"a\b"` and `"ab"`, which one reader takes for one name, stay two.
/// `None` when it does not parse (an unterminated quote, a parameter without `=`,
/// text after a quoted string) or names one parameter twice (a reader might take
/// either).
pub(super) fn disposition_params(value: &str) -> Option<Vec<(String, String)>> {
    let is_space = |c: char| c == ' ' || c == '\t';
    let mut rest = value.trim_start_matches(is_space);
    // The disposition type: a token.
    let end = rest.find(';').unwrap_or(rest.len());
    rest = &rest[end..];
    let mut params: Vec<(String, String)> = Vec::new();
    loop {
        rest = rest.trim_start_matches(is_space);
        if rest.is_empty() {
            break;
        }
        rest = rest.strip_prefix(';')?.trim_start_matches(is_space);
        if rest.is_empty() {
            break; // a trailing `;`
        }
        let eq = rest.find('=')?;
        let name = rest[..eq].trim_matches(is_space).to_ascii_lowercase();
        if name.is_empty() || name.contains([';', '"']) {
            return None;
        }
        rest = rest[eq + 1..].trim_start_matches(is_space);
        let value = if let Some(quoted) = rest.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let close = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => {
                        value.push('\\');
                        value.push(chars.next()?.1);
                    }
                    (_, c) => value.push(c),
                }
            };
            rest = &quoted[close + 1..];
            let after = rest.trim_start_matches(is_space);
            if !(after.is_empty() || after.starts_with(';')) {
                return None;
            }
            value
        } else {
            let end = rest.find(';').unwrap_or(rest.len());
            let token = rest[..end].trim_end_matches(is_space);
            if token.contains(['"', '\\']) {
                return None;
            }
            rest = &rest[end..];
            token.to_owned()
        };
        if params.iter().any(|(n, _)| *n == name) {
            return None;
        }
        params.push((name, value));
    }
    Some(params)
}

/// An RFC 8187 ext-value (`charset'language'percent-encoded`, as `filename*` carries),
/// decoded: `UTF-8` or `ISO-8859-1` (any case). `None` for another charset, a missing
/// `'`, or bytes that are not in the charset.
pub(super) fn ext_value(text: &str) -> Option<String> {
    let (charset, rest) = text.split_once('\'')?;
    let (_language, encoded) = rest.split_once('\'')?;
    let bytes = percent_decode(encoded.as_bytes(), false);
    if charset.eq_ignore_ascii_case("utf-8") {
        String::from_utf8(bytes).ok()
    } else if charset.eq_ignore_ascii_case("iso-8859-1") {
        Some(bytes.into_iter().map(char::from).collect())
    } else {
        None
    }
}

/// The canonical JSON of a request body read from its text (see the module docs): object
/// keys sorted at every depth (a repeated key keeps its last value, as `serde_json`
/// does), no whitespace, strings as `serde_json` writes them, numbers by their exact
/// decimal value ([`canonical_number`]). `None` when it is not JSON (then the bytes are
/// the payload), nested deeper than `serde_json` reads (128), or holds a lone surrogate.
pub(super) fn canonical_json(body: &[u8]) -> Option<String> {
    let mut reader = JsonText { text: body, at: 0 };
    let mut out = String::with_capacity(body.len());
    reader.value(&mut out, 0)?;
    reader.space();
    (reader.at == body.len()).then_some(out)
}

/// A reader of JSON text that writes its canonical form as it goes.
struct JsonText<'a> {
    text: &'a [u8],
    at: usize,
}

impl JsonText<'_> {
    fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.space();
        (self.text.get(self.at) == Some(&byte)).then(|| self.at += 1)
    }

    fn value(&mut self, out: &mut String, depth: usize) -> Option<()> {
        if depth >= 128 {
            return None;
        }
        self.space();
        match *self.text.get(self.at)? {
            b'{' => self.object(out, depth)?,
            b'[' => self.array(out, depth)?,
            b'"' => {
                let s = self.string()?;
                push_json_str(&s, out);
            }
            b't' => self.literal(b"true", out)?,
            b'f' => self.literal(b"false", out)?,
            b'n' => self.literal(b"null", out)?,
            _ => {
                let start = self.at;
                self.number()?;
                let text = std::str::from_utf8(&self.text[start..self.at]).ok()?;
                out.push_str(&canonical_number(text)?);
            }
        }
        Some(())
    }

    /// An object at `{`, written with its keys sorted; of a repeated key the last value.
    fn object(&mut self, out: &mut String, depth: usize) -> Option<()> {
        self.at += 1;
        let mut entries: Vec<(String, String)> = Vec::new();
        self.space();
        if self.text.get(self.at) == Some(&b'}') {
            self.at += 1;
        } else {
            loop {
                self.space();
                let key = self.string()?;
                self.eat(b':')?;
                let mut value = String::new();
                self.value(&mut value, depth + 1)?;
                entries.push((key, value));
                self.space();
                match self.text.get(self.at)? {
                    b',' => self.at += 1,
                    b'}' => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        // Stable: of equal keys the last one read comes last, and is kept.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        out.push('{');
        let mut first = true;
        for (i, (key, value)) in entries.iter().enumerate() {
            if entries.get(i + 1).is_some_and(|next| next.0 == *key) {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            push_json_str(key, out);
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        Some(())
    }

    /// An array at `[`, its elements in order.
    fn array(&mut self, out: &mut String, depth: usize) -> Option<()> {
        self.at += 1;
        out.push('[');
        self.space();
        if self.text.get(self.at) == Some(&b']') {
            self.at += 1;
        } else {
            loop {
                self.value(out, depth + 1)?;
                self.space();
                match self.text.get(self.at)? {
                    b',' => {
                        self.at += 1;
                        out.push(',');
                    }
                    b']' => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        out.push(']');
        Some(())
    }

    fn literal(&mut self, word: &[u8], out: &mut String) -> Option<()> {
        let end = self.at + word.len();
        (self.text.get(self.at..end)? == word).then_some(())?;
        self.at = end;
        out.push_str(std::str::from_utf8(word).ok()?);
        Some(())
    }

    /// Past a number as JSON spells it: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let digits = |r: &mut Self| {
            let start = r.at;
            while r.text.get(r.at).is_some_and(u8::is_ascii_digit) {
                r.at += 1;
            }
            (r.at > start).then_some(())
        };
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        if self.text.get(self.at) == Some(&b'0') {
            self.at += 1;
        } else {
            digits(self)?;
        }
        if self.text.get(self.at) == Some(&b'.') {
            self.at += 1;
            digits(self)?;
        }
        if let Some(b'e' | b'E') = self.text.get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.text.get(self.at) {
                self.at += 1;
            }
            digits(self)?;
        }
        Some(())
    }

    /// A string's value (escapes decoded), the reader past its closing quote.
    fn string(&mut self) -> Option<String> {
        if self.text.get(self.at) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        let mut bytes = Vec::new();
        loop {
            let b = *self.text.get(self.at)?;
            self.at += 1;
            match b {
                b'"' => return String::from_utf8(bytes).ok(),
                b'\\' => {
                    let e = *self.text.get(self.at)?;
                    self.at += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let high = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&high) {
                                (self.text.get(self.at..self.at + 2)? == b"\\u").then_some(())?;
                                self.at += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return None;
                                }
                                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                            } else {
                                high
                            };
                            char::from_u32(code)?
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return None,
                b => bytes.push(b),
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = std::str::from_utf8(self.text.get(self.at..self.at + 4)?).ok()?;
        let code = u32::from_str_radix(digits, 16).ok()?;
        self.at += 4;
        Some(code)
    }
}

/// A JSON number's text written by its exact decimal value, so that two numbers share it
/// only when they are equal: `0` for zero (`-0`, `0.0`, `0e5`); an integral value as an
/// integer (`1`, `1.0`, `1e0` and `10e-1` are `1`; `18446744073709551616` stays itself,
/// not the `f64` nearest to it); any other value as `serde_json` writes the `f64`
/// nearest to it when that is the same value (`0.1`, `2.5`), else exactly, as
/// `<digits>e<exponent>` (`0.10000000000000000001` is `10000000000000000001e-20`).
/// Beyond 40 integer digits an integral value is written that way too. `None` for text
/// that is not a number.
pub(super) fn canonical_number(text: &str) -> Option<String> {
    let (negative, digits, exponent) = decimal(text)?;
    if digits.is_empty() {
        return Some("0".to_owned());
    }
    let sign = if negative { "-" } else { "" };
    if exponent >= 0 {
        let zeros = usize::try_from(exponent).ok()?;
        if digits.len() + zeros <= 40 {
            return Some(format!("{sign}{digits}{}", "0".repeat(zeros)));
        }
        return Some(format!("{sign}{digits}e{exponent}"));
    }
    // Not integral: `serde_json`'s spelling of the nearest `f64`, where it is this value.
    if let Ok(f) = text.parse::<f64>()
        && let Some(n) = serde_json::Number::from_f64(f)
    {
        let spelled = n.to_string();
        if decimal(&spelled).is_some_and(|d| d == (negative, digits.clone(), exponent)) {
            return Some(spelled);
        }
    }
    Some(format!("{sign}{digits}e{exponent}"))
}

/// The exact decimal value of a number's text: its sign, its significant digits (no
/// leading or trailing zeros; empty for zero) and the power of ten they are scaled by.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits: String = int.chars().chain(frac.chars()).collect();
    let significant = digits.trim_start_matches('0');
    let kept = significant.trim_end_matches('0');
    let exponent = exponent
        .checked_sub(i64::try_from(frac.len()).ok()?)?
        .checked_add(i64::try_from(significant.len() - kept.len()).ok()?)?;
    if kept.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, kept.to_owned(), exponent))
}
