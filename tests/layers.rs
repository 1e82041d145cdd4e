//! lockcore's modules import only from the layers below them (the order is in
//! `lockcore/src/lib.rs`): read from the sources, every `crate::<module>` path.
use std::collections::BTreeMap;
use std::path::Path;

/// The layers, lowest first; a module may use its own layer and those before it.
const LAYERS: &[&[&str]] = &[
    &["error", "key", "util"],
    &["notify"],
    &["backend"],
    &["local", "watchdog"],
    &["client"],
    &["lock"],
    &["idempotency"],
    &["integrations"],
    &["__private"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level module a source file belongs to.
fn module_of(path: &Path, src: &Path) -> String {
    let rel = path.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
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

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("lockcore/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file, &src);
        if module == "lib" {
            continue;
        }
        let own = layer_of(&module).unwrap_or_else(|| panic!("{module} is in no layer"));
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (at, _) in code.match_indices("crate::") {
                let rest = &code[at + "crate::".len()..];
                let used: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let Some(layer) = layer_of(&used) else {
                    continue; // a re-export at the root (`crate::Locks`)
                };
                if layer > own {
                    upward
                        .entry(format!("{}", file.strip_prefix(&src).unwrap().display()))
                        .or_default()
                        .push(used);
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports from a layer above: {upward:?}");
}
