//! lockcore's modules import only from the layers below them (the order is in
//! `lockcore/src/lib.rs`), and nothing above the backend names its topologies. Every
//! source file is parsed with syn; every path is resolved to the crate module it names:
//! `use` trees with their groups (`use crate::{a::X, b}`), `super::` chains from the
//! file's own module (and inline modules inside it), names re-exported at the root
//! (`crate::Locks` is `client`'s), and `crate::` paths inside macro calls.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use syn::visit::Visit;

/// The layers, lowest first; a module may use its own layer and those before it.
const LAYERS: &[&[&str]] = &[
    &["error", "events", "key", "metrics", "util"],
    &["notify"],
    &["backend"],
    &["contention", "local", "watchdog"],
    &["client"],
    &["lock", "fencing"],
    &["idempotency"],
    &["integrations"],
    &["__private"],
];

/// What only the backend may name: its private dispatch and the topologies' types.
const TOPOLOGY_NAMES: &[&str] = &["Flavor", "is_redlock", "is_memory", "is_cluster"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Root names and the module each comes from, read from `lib.rs`'s `pub use` items;
/// items defined in `lib.rs` itself count as the top layer's.
fn root_names(lib: &syn::File) -> HashMap<String, String> {
    fn walk(tree: &syn::UseTree, first: Option<&str>, out: &mut HashMap<String, String>) {
        match tree {
            syn::UseTree::Path(p) => {
                let seg = p.ident.to_string();
                let first = match first {
                    None if seg == "crate" => None,
                    None => Some(seg.as_str()),
                    some => some,
                };
                walk(&p.tree, first, out);
            }
            syn::UseTree::Name(n) => {
                if let Some(m) = first {
                    out.insert(n.ident.to_string(), m.to_owned());
                }
            }
            syn::UseTree::Rename(r) => {
                if let Some(m) = first {
                    out.insert(r.rename.to_string(), m.to_owned());
                }
            }
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| walk(t, first, out)),
            syn::UseTree::Glob(_) => {}
        }
    }
    let mut out = HashMap::new();
    for item in &lib.items {
        match item {
            syn::Item::Use(u) => walk(&u.tree, None, &mut out),
            syn::Item::Fn(f) => {
                out.insert(f.sig.ident.to_string(), "__private".to_owned());
            }
            _ => {}
        }
    }
    out
}

/// The module path of a source file: `backend/redis/cache.rs` is `backend::redis::cache`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Every top-level module a file's paths reach, and every topology name it uses.
struct Reach<'a> {
    /// The module the visitor is in (grows with inline `mod`s).
    here: Vec<String>,
    roots: &'a HashMap<String, String>,
    modules: BTreeSet<String>,
    names: BTreeSet<String>,
}

impl Reach<'_> {
    /// The crate module that `segments` (a path as written in `self.here`) starts in.
    fn resolve(&mut self, segments: &[String]) {
        for s in segments {
            if TOPOLOGY_NAMES.contains(&s.as_str()) {
                self.names.insert(s.clone());
            }
        }
        let mut at = self.here.clone();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                at.clear();
                rest = &rest[1..];
            }
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    at.pop();
                    rest = &rest[1..];
                }
            }
            // Relative to this module, an external crate or a local name.
            _ => return,
        }
        if let Some(top) = at.first() {
            self.modules.insert(top.clone());
        } else if let Some(next) = rest.first() {
            let module = self
                .roots
                .get(next)
                .cloned()
                .unwrap_or_else(|| next.clone());
            self.modules.insert(module);
        }
    }

    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.resolve(&prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix);
                }
            }
        }
    }

    /// `crate::a::b` and `super::x` inside a macro call's tokens.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let trees: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                proc_macro2::TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(proc_macro2::TokenTree::Punct(a)),
                        Some(proc_macro2::TokenTree::Punct(b)),
                        Some(proc_macro2::TokenTree::Ident(next)),
                    ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(next.to_string());
                        j += 3;
                    }
                    self.resolve(&path);
                    i = j;
                    continue;
                }
                proc_macro2::TokenTree::Ident(id)
                    if TOPOLOGY_NAMES.contains(&id.to_string().as_str()) =>
                {
                    self.names.insert(id.to_string());
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Reach<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.resolve(&segments);
        syn::visit::visit_path(self, p);
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        if TOPOLOGY_NAMES.contains(&m.method.to_string().as_str()) {
            self.names.insert(m.method.to_string());
        }
        syn::visit::visit_expr_method_call(self, m);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.here.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.here.pop();
    }
}

/// What one file (at module path `here`) does wrong: modules of a layer above its own,
/// and topology names outside the backend.
fn violations(here: &[&str], source: &str, roots: &HashMap<String, String>) -> Vec<String> {
    let file = syn::parse_file(source).unwrap();
    let mut reach = Reach {
        here: here.iter().map(|s| s.to_string()).collect(),
        roots,
        modules: BTreeSet::new(),
        names: BTreeSet::new(),
    };
    reach.visit_file(&file);
    let own = layer_of(here[0]).unwrap_or_else(|| panic!("{} is in no layer", here[0]));
    let mut out: Vec<String> = reach
        .modules
        .iter()
        .filter(|m| layer_of(m).is_some_and(|l| l > own))
        .map(|m| format!("uses {m}"))
        .collect();
    if here[0] != "backend" {
        out.extend(reach.names.iter().map(|n| format!("names {n}")));
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn lockcore_roots() -> HashMap<String, String> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("lockcore/src/lib.rs");
    root_names(&syn::parse_file(&std::fs::read_to_string(lib).unwrap()).unwrap())
}

#[test]
fn no_module_imports_from_a_layer_above_it_or_names_a_topology() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("lockcore/src");
    let roots = lockcore_roots();
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let here = module_path(rel);
        if here.is_empty() {
            continue; // lib.rs: the root may name every layer
        }
        let here: Vec<&str> = here.iter().map(String::as_str).collect();
        let text = std::fs::read_to_string(file).unwrap();
        let wrong = violations(&here, &text, &roots);
        checked += 1;
        if !wrong.is_empty() {
            found.insert(rel.display().to_string(), wrong);
        }
    }
    assert!(checked > 30, "only {checked} files read");
    assert!(found.is_empty(), "layering broken: {found:?}");
}

/// Each hole a line-by-line scan had, planted in a backend file: the check finds it.
#[test]
fn the_check_finds_each_planted_violation() {
    let roots = lockcore_roots();
    let cache = ["backend", "redis", "cache"];
    let planted = [
        (
            "a grouped import",
            "use crate::{error::Error, lock::LockGuard};",
        ),
        (
            "a nested group",
            "use crate::{key, lock::{self, LockGuard}};",
        ),
        ("a root re-export", "use crate::Locks;"),
        (
            "a root re-export in an expression",
            "fn f() { let _ = crate::LockGuard::info; }",
        ),
        ("a super chain", "use super::super::super::client::Inner;"),
        (
            "a path in a macro",
            "fn f() { tracing::debug!(\"{}\", crate::lock::DEFAULT_TTL.as_secs()); }",
        ),
        ("a glob", "use crate::idempotency::*;"),
        (
            "in an inline module",
            "mod tests { use super::super::super::super::watchdog::Watchdog; }",
        ),
    ];
    for (what, source) in planted {
        let found = violations(&cache, source, &roots);
        assert!(!found.is_empty(), "{what} went unseen: {source}");
    }
    // Allowed: the same layer, lower layers, and the file's own neighbours.
    let fine = "use crate::{error::Error, notify::Wakeups}; use super::super::Locking; \
                use super::pool::Direct; fn f() { crate::util::lock(&M); }";
    assert_eq!(violations(&cache, fine, &roots), Vec::<String>::new());

    let lock = ["lock"];
    for source in [
        "fn f(b: &Backend) { match &b.0 { Flavor::Redis(_) => {} } }",
        "fn f(b: &Backend) -> bool { b.is_redlock() }",
        "fn f(b: &Backend) -> bool { b.is_memory() }",
    ] {
        assert!(
            violations(&lock, source, &roots)
                .iter()
                .any(|v| v.starts_with("names")),
            "a topology question went unseen above the backend: {source}"
        );
    }
}
