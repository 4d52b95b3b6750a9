//! The docs stay a usable map: every relative link in README.md and docs/ resolves (the file
//! exists and, for `file.md#anchor`, the heading does), and every `src/...` path and
//! `fn name` that docs/README.md names exists in the code, and every rule of its
//! "Protocol rules and where they live" tables names the tests that show it
//! (`file::fn`, each a `#[test]` function in that file).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every .md under docs/.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut v = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut v);
    v.sort();
    v
}

/// The lines of `text` outside fenced code blocks, with their 1-based line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, l) in text.lines().enumerate() {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((n + 1, l));
        }
    }
    out
}

/// The targets of the inline links `[text](target)` in `line`, code spans left out.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'`' => in_code = !in_code,
            b']' if !in_code && b.get(i + 1) == Some(&b'(') => {
                if let Some(end) = line[i + 2..].find(')') {
                    let t = &line[i + 2..i + 2 + end];
                    out.push(t.split_whitespace().next().unwrap_or("").to_string());
                    i += 2 + end;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor the headings of `text` define (duplicates get -1, -2, ... as on GitHub).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, l) in prose_lines(text) {
        let Some(h) = l.strip_prefix('#') else {
            continue;
        };
        let h = h.trim_start_matches('#');
        if !h.starts_with(' ') {
            continue;
        }
        let base = slug(&h.replace('`', ""));
        let mut s = base.clone();
        let mut n = 0;
        while seen.contains(&s) {
            n += 1;
            s = format!("{base}-{n}");
        }
        seen.insert(s);
    }
    seen
}

/// What is wrong with `target` as a link from `file`, if anything.
fn check_link(file: &Path, target: &str) -> Option<String> {
    if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().unwrap().join(path)
    };
    if !dest.exists() {
        return Some(format!("{target}: {} does not exist", dest.display()));
    }
    if let Some(a) = anchor
        && dest.extension().is_some_and(|x| x == "md")
    {
        let text = std::fs::read_to_string(&dest).unwrap();
        if !anchors(&text).contains(a) {
            return Some(format!("{target}: no heading #{a} in {}", dest.display()));
        }
    }
    None
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for f in markdown_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in prose_lines(&text) {
            for t in link_targets(line) {
                checked += 1;
                if let Some(e) = check_link(&f, &t) {
                    broken.push(format!("{}:{n}: {e}", f.display()));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found: the parser broke");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The code spans of `line`.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

#[test]
fn the_map_names_files_and_functions_that_exist() {
    let text = std::fs::read_to_string(root().join("docs/README.md")).unwrap();
    let mut wrong = Vec::new();
    let mut fns = 0;
    for (_, line) in prose_lines(&text) {
        let spans = code_spans(line);
        let paths: Vec<&str> = spans
            .iter()
            .copied()
            .filter(|s| s.starts_with("src/") && !s.contains(' ') && !s.contains("::"))
            .collect();
        for p in &paths {
            if !root().join(p).exists() {
                wrong.push(format!("{p} does not exist"));
            }
        }
        let files: Vec<String> = paths
            .iter()
            .filter(|p| p.ends_with(".rs"))
            .filter_map(|p| std::fs::read_to_string(root().join(p)).ok())
            .collect();
        for name in spans.iter().filter_map(|s| s.strip_prefix("fn ")) {
            fns += 1;
            let defined = files.iter().any(|src| {
                src.contains(&format!("fn {name}(")) || src.contains(&format!("fn {name}<"))
            });
            if !defined {
                wrong.push(format!("`fn {name}` is in none of {paths:?}"));
            }
        }
    }
    assert!(fns > 50, "only {fns} functions found: the parser broke");
    assert!(
        wrong.is_empty(),
        "docs/README.md is stale:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Tools and their docs"), "tools-and-their-docs");
    assert_eq!(
        slug("2. BTH (IBTA vol. 1 §9.2), 12 bytes"),
        "2-bth-ibta-vol-1-92-12-bytes"
    );
    assert_eq!(
        slug("Driver (`src/driver.rs`)".replace('`', "").as_str()),
        "driver-srcdriverrs"
    );
    let a = anchors("# A\n## Same\n## Same\n```\n# not a heading\n```\n");
    assert_eq!(
        a,
        HashSet::from(["a".to_string(), "same".into(), "same-1".into()])
    );
}

/// The cells of a Markdown table row, trimmed (none when `line` is no row).
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// What is wrong with `span` (`path::fn`) as the name of a test, if anything.
fn check_test(span: &str) -> Option<String> {
    let Some((path, name)) = span.split_once("::") else {
        return Some(format!("`{span}` is not `file::fn`"));
    };
    let Ok(src) = std::fs::read_to_string(root().join(path)) else {
        return Some(format!("`{span}`: {path} does not exist"));
    };
    // `fn name(` at the start of a line (proptest's functions take arguments).
    let Some(at) = src
        .match_indices(&format!("fn {name}("))
        .map(|(i, _)| i)
        .find(|&i| {
            src[..i].ends_with(['\n', ' ']) && src[..i].trim_end_matches(' ').ends_with('\n')
        })
    else {
        return Some(format!("`{span}`: no `fn {name}(` in {path}"));
    };
    // The attributes and comments right above the function: `#[test]` among them.
    let is_test = src[..at]
        .lines()
        .rev()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| {
            let l = l.trim_start();
            l.starts_with("#[") || l.starts_with("//")
        })
        .any(|l| l.trim() == "#[test]");
    (!is_test).then(|| format!("`{span}`: `fn {name}` in {path} is not a #[test]"))
}

#[test]
fn every_protocol_rule_names_tests_that_exist() {
    let text = std::fs::read_to_string(root().join("docs/README.md")).unwrap();
    let lines = prose_lines(&text);
    let start = lines
        .iter()
        .position(|(_, l)| *l == "## Protocol rules and where they live")
        .expect("docs/README.md has no rule map");
    let mut wrong = Vec::new();
    let (mut rows, mut tests) = (0, 0);
    let mut test_col = None;
    for (n, line) in &lines[start + 1..] {
        if line.starts_with("## ") {
            break;
        }
        let Some(row) = cells(line) else {
            test_col = None;
            continue;
        };
        if row.first().is_some_and(|c| c.starts_with("---")) {
            continue;
        }
        if matches!(row.first(), Some(&("rule" | "what"))) {
            test_col = row.iter().position(|c| *c == "test");
            if test_col.is_none() {
                wrong.push(format!("line {n}: a table without a `test` column"));
            }
            continue;
        }
        let Some(col) = test_col else { continue };
        rows += 1;
        let named = code_spans(row.get(col).copied().unwrap_or(""));
        if named.is_empty() {
            wrong.push(format!("line {n}: no test named for `{}`", row[0]));
        }
        for span in named {
            tests += 1;
            wrong.extend(check_test(span).map(|w| format!("line {n}: {w}")));
        }
    }
    assert!(rows > 40, "only {rows} rule rows found: the parser broke");
    assert!(tests >= rows, "{tests} tests named for {rows} rules");
    assert!(
        wrong.is_empty(),
        "docs/README.md's rule map is stale:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_test_name_that_is_no_test_is_refused() {
    assert_eq!(
        check_test("tests/docs_links.rs::a_test_name_that_is_no_test_is_refused"),
        None
    );
    assert!(
        check_test("tests/docs_links.rs::cells").is_some(),
        "a helper"
    );
    assert!(check_test("tests/docs_links.rs::no_such_fn").is_some());
    assert!(check_test("tests/no_such_file.rs::x").is_some());
    assert!(check_test("no_separator").is_some());
}
