//! Key templates: `"order:<id>"`, `"lock:{<tenant>}:job:<job.id>"`.
//!
//! Text outside `<...>` is literal (a `{...}` there is a Redis Cluster hash tag on
//! purpose); each `<path>` is a parameter binding, optionally followed by field names.

use syn::LitStr;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// Text copied as it is.
    Lit(String),
    /// A placeholder: `root.field.field`.
    Arg { root: String, fields: Vec<String> },
}

/// A parsed template and the literal it came from (for error spans).
pub(crate) struct Template {
    pub(crate) lit: LitStr,
    pub(crate) parts: Vec<Part>,
}

impl Template {
    /// `name` is the argument the template came from (`key`, `scope`), for messages.
    pub(crate) fn parse(lit: &LitStr, name: &str) -> syn::Result<Template> {
        parse_parts(&lit.value(), name)
            .map(|parts| Template {
                lit: lit.clone(),
                parts,
            })
            .map_err(|msg| syn::Error::new(lit.span(), msg))
    }

    /// The placeholders, in order.
    pub(crate) fn args(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.parts.iter().filter_map(|p| match p {
            Part::Arg { root, fields } => Some((root.as_str(), fields.as_slice())),
            Part::Lit(_) => None,
        })
    }
}

fn parse_parts(text: &str, name: &str) -> Result<Vec<Part>, String> {
    if text.is_empty() {
        let example = if name == "key" {
            "order:<id>"
        } else {
            "<tenant>"
        };
        return Err(format!(
            "the {name} template is empty; write e.g. `{name} = \"{example}\"`"
        ));
    }
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(['<', '>']) {
        if rest[i..].starts_with('>') {
            return Err(format!(
                "unbalanced `>` in {name} template `{text}`: it has no matching `<`"
            ));
        }
        lit.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let end = match after.find(['<', '>']) {
            Some(j) if after[j..].starts_with('>') => j,
            _ => {
                return Err(format!(
                    "unbalanced `<` in {name} template `{text}`: every `<` needs a closing `>`"
                ));
            }
        };
        let inner = &after[..end];
        if inner.trim().is_empty() {
            return Err(format!(
                "empty placeholder `<>` in {name} template `{text}`: name a parameter, e.g. `<id>`"
            ));
        }
        // A raw identifier names what it binds: `<r#type>` is `<type>`.
        let unraw = |s: &str| s.strip_prefix("r#").unwrap_or(s).to_owned();
        let mut segments = inner.split('.');
        let root = unraw(segments.next().unwrap_or_default());
        let fields: Vec<String> = segments.map(unraw).collect();
        let ident_ok = |s: &str| {
            let mut chars = s.chars();
            chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && chars.all(|c| c.is_alphanumeric() || c == '_')
        };
        let field_ok =
            |s: &str| ident_ok(s) || (!s.is_empty() && s.chars().all(|c| c.is_ascii_digit()));
        if !ident_ok(&root) || !fields.iter().all(|f| field_ok(f)) {
            return Err(format!(
                "invalid placeholder `<{inner}>` in {name} template `{text}`: expected a parameter name or a field path such as `<order.id>`"
            ));
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(std::mem::take(&mut lit)));
        }
        parts.push(Part::Arg { root, fields });
        rest = &after[end + 1..];
    }
    lit.push_str(rest);
    if !lit.is_empty() {
        parts.push(Part::Lit(lit));
    }
    check_hash_tags(text, name, &parts)?;
    Ok(parts)
}

/// Literal braces must form one well-formed hash tag: `{` ... `}` with something inside,
/// at most once (Redis hashes the first; a second brace group is how distlock names a
/// tagged key's companions, so no key may hold one).
fn check_hash_tags(text: &str, name: &str, parts: &[Part]) -> Result<(), String> {
    let mut open = false;
    let mut inside = false;
    let mut closed = false;
    for part in parts {
        match part {
            Part::Arg { .. } => inside |= open,
            Part::Lit(s) => {
                for c in s.chars() {
                    match c {
                        '{' if open => {
                            return Err(format!(
                                "nested `{{` in {name} template `{text}`: a hash tag is one `{{...}}`"
                            ));
                        }
                        '{' if closed => {
                            return Err(format!(
                                "a second hash tag in {name} template `{text}`: a key holds at most one `{{...}}` (Redis hashes the first)"
                            ));
                        }
                        '{' => {
                            open = true;
                            inside = false;
                        }
                        '}' if !open => {
                            return Err(format!(
                                "unbalanced `}}` in {name} template `{text}`: it has no matching `{{`"
                            ));
                        }
                        '}' if !inside => {
                            return Err(format!(
                                "empty hash tag `{{}}` in {name} template `{text}`"
                            ));
                        }
                        '}' => {
                            open = false;
                            closed = true;
                        }
                        _ => inside |= open,
                    }
                }
            }
        }
    }
    if open {
        return Err(format!(
            "unbalanced `{{` in {name} template `{text}`: a hash tag needs a closing `}}`"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(root: &str, fields: &[&str]) -> Part {
        Part::Arg {
            root: root.into(),
            fields: fields.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn parse_parts_key(text: &str) -> Result<Vec<Part>, String> {
        parse_parts(text, "key")
    }

    #[test]
    fn scope_messages_name_the_scope() {
        assert!(
            parse_parts("", "scope")
                .unwrap_err()
                .starts_with("the scope template is empty")
        );
        assert!(
            parse_parts("a<b", "scope")
                .unwrap_err()
                .contains("in scope template")
        );
    }

    #[test]
    fn parses_parts() {
        assert_eq!(
            parse_parts_key("order:<id>").unwrap(),
            vec![Part::Lit("order:".into()), arg("id", &[])]
        );
        assert_eq!(
            parse_parts_key("{<t>}:<o.c.id>:x").unwrap(),
            vec![
                Part::Lit("{".into()),
                arg("t", &[]),
                Part::Lit("}:".into()),
                arg("o", &["c", "id"]),
                Part::Lit(":x".into())
            ]
        );
        assert_eq!(parse_parts_key("<p.0>").unwrap(), vec![arg("p", &["0"])]);
        // A raw identifier names what it binds.
        assert_eq!(
            parse_parts_key("<r#type>:<o.r#match>").unwrap(),
            vec![
                arg("type", &[]),
                Part::Lit(":".into()),
                arg("o", &["match"])
            ]
        );
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "a<b",
            "a>b",
            "a<>",
            "a<b<c>>",
            "a<b c>",
            "<1a>",
            "{a",
            "a}",
            "{}",
            "{{a}}",
            "<a.>",
            "{a}:x:{b}",
            "{<t>}{:fence}",
        ] {
            assert!(parse_parts_key(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}

/// Property tests of [`parse_parts`]: no input panics; templates written from literal
/// pieces, placeholders and one hash tag parse back to those parts; unbalanced or nested
/// `<...>` and `{...}` are refused. A fixed number of cases per run.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::{Part, parse_parts};

    /// Literal text: anything but the template's own brackets.
    fn literal() -> impl Strategy<Value = String> {
        "[^<>{}]{1,6}"
    }

    fn ident() -> impl Strategy<Value = String> {
        "[a-z_][a-z0-9_]{0,5}"
    }

    /// A placeholder: a parameter, then fields (names or tuple indices).
    fn placeholder() -> impl Strategy<Value = Part> {
        (
            ident(),
            prop::collection::vec(prop_oneof![ident(), "[0-9]{1,2}"], 0..3),
        )
            .prop_map(|(root, fields)| Part::Arg { root, fields })
    }

    /// Pieces with no two literals side by side (they would read as one).
    fn pieces() -> impl Strategy<Value = Vec<Part>> {
        prop::collection::vec(
            prop_oneof![literal().prop_map(Part::Lit), placeholder()],
            1..6,
        )
        .prop_map(|mut parts| {
            parts.dedup_by(|b, a| matches!((a, b), (Part::Lit(_), Part::Lit(_))));
            parts
        })
    }

    fn text(parts: &[Part]) -> String {
        parts
            .iter()
            .map(|p| match p {
                Part::Lit(s) => s.clone(),
                Part::Arg { root, fields } => {
                    let mut path = vec![root.as_str()];
                    path.extend(fields.iter().map(String::as_str));
                    format!("<{}>", path.join("."))
                }
            })
            .collect()
    }

    /// The parts with adjacent literals joined, as the parser gives them.
    fn joined(parts: Vec<Part>) -> Vec<Part> {
        let mut out: Vec<Part> = Vec::new();
        for part in parts {
            match (out.last_mut(), part) {
                (Some(Part::Lit(a)), Part::Lit(b)) => a.push_str(&b),
                (_, part) => out.push(part),
            }
        }
        out
    }

    /// Whether `text`'s `<...>` or `{...}` are unbalanced or nested (braces counted
    /// outside placeholders; inside one they make it invalid anyway).
    fn badly_bracketed(text: &str) -> bool {
        let (mut angle, mut brace) = (false, false);
        for c in text.chars() {
            match c {
                '<' if angle => return true,
                '<' => angle = true,
                '>' if !angle => return true,
                '>' => angle = false,
                '{' if !angle && brace => return true,
                '{' if !angle => brace = true,
                '}' if !angle && !brace => return true,
                '}' if !angle => brace = false,
                _ => {}
            }
        }
        angle || brace
    }

    proptest! {
        // No regression files written beside the crate: a failure prints its input.
        #![proptest_config(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::with_cases(256)
        })]

        #[test]
        fn no_input_panics(text in "\\PC{0,24}", name in prop_oneof![Just("key"), Just("scope")]) {
            let _ = parse_parts(&text, name);
        }

        #[test]
        fn pieces_parse_back(parts in pieces()) {
            prop_assert_eq!(parse_parts(&text(&parts), "key"), Ok(parts));
        }

        /// One hash tag around some of the pieces: the braces join the literals beside
        /// them.
        #[test]
        fn a_hash_tag_around_pieces_parses_back(
            parts in pieces(),
            from in any::<prop::sample::Index>(),
            to in any::<prop::sample::Index>(),
        ) {
            let (a, b) = (from.index(parts.len()), to.index(parts.len()));
            let (from, to) = (a.min(b), a.max(b));
            let mut tagged = parts[..from].to_vec();
            tagged.push(Part::Lit("{".into()));
            tagged.extend_from_slice(&parts[from..=to]);
            tagged.push(Part::Lit("}".into()));
            tagged.extend_from_slice(&parts[to + 1..]);
            let tagged = joined(tagged);
            prop_assert_eq!(parse_parts(&text(&tagged), "key"), Ok(tagged));
        }

        /// Brackets out of balance, or one inside another, are refused.
        #[test]
        fn bad_brackets_are_refused(text in "[ab.<>{}]{1,12}") {
            if badly_bracketed(&text) {
                prop_assert!(parse_parts(&text, "key").is_err(), "{:?} was accepted", text);
            }
        }
    }
}
