//! Property tests: `parse_str` never panics, whatever it is fed (arbitrary strings, TOML-like
//! noise, and the example config mutated at random), and every error it returns points inside
//! the text.

use std::path::Path;

use proptest::prelude::*;
use rondo_config::{ConfigErrors, parse_str};

const EXAMPLE: &str = include_str!("../../../examples/rondo.toml");

/// Checks the invariants of one parse.
fn check(text: &str) -> Result<(), TestCaseError> {
    match parse_str(text, Path::new("fuzz.toml"), 3) {
        Ok(config) => {
            prop_assert_eq!(config.view.id, 3);
            prop_assert!(!config.summary().is_empty());
        }
        Err(ConfigErrors { errors }) => {
            prop_assert!(!errors.is_empty());
            let lines = text.split('\n').count();
            for e in &errors {
                prop_assert!(e.line >= 1 && e.line <= lines, "line out of range: {}", e);
                prop_assert!(e.column >= 1, "column out of range: {}", e);
                prop_assert!(!e.message.is_empty());
                prop_assert!(e.to_string().starts_with("fuzz.toml:"));
            }
        }
    }
    Ok(())
}

/// One edit of a text.
#[derive(Debug, Clone)]
enum Mutation {
    /// Remove `len` bytes at `at` (both scaled to the text).
    Delete { at: usize, len: usize },
    /// Insert `snippet` at `at`.
    Insert { at: usize, snippet: String },
    /// Replace `len` bytes at `at` with `snippet`.
    Replace { at: usize, len: usize, snippet: String },
    /// Duplicate line `line`.
    DuplicateLine { line: usize },
    /// Swap two lines.
    SwapLines { a: usize, b: usize },
}

/// Fragments likely to produce interesting (almost valid) configs.
fn snippet() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("=".to_owned()),
        Just("\"".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just(",".to_owned()),
        Just("\n".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("99999999999999999999".to_owned()),
        Just("1.5e300".to_owned()),
        Just("nan".to_owned()),
        Just("true".to_owned()),
        Just("[[route]]\nlistener = \"db\"\ncluster = \"www\"\n".to_owned()),
        Just("[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n".to_owned()),
        Just("[cluster.x]\nalgorithm = \"hash\"\n".to_owned()),
        Just("weight = 0".to_owned()),
        Just("é".to_owned()),
        "[a-z_.:\"=\\[\\]{}, \n0-9-]{0,12}",
        any::<String>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), snippet()).prop_map(|(at, snippet)| Mutation::Insert { at, snippet }),
        (any::<usize>(), 0usize..16, snippet()).prop_map(|(at, len, snippet)| Mutation::Replace {
            at,
            len,
            snippet
        }),
        any::<usize>().prop_map(|line| Mutation::DuplicateLine { line }),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines { a, b }),
    ]
}

/// The nearest char boundary at or before `at % (len + 1)`.
fn boundary(text: &str, at: usize) -> usize {
    let mut i = at % (text.len() + 1);
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &mut String, m: &Mutation) {
    match m {
        Mutation::Delete { at, len } => {
            let start = boundary(text, *at);
            let end = boundary(text, (start + len).min(text.len()));
            text.replace_range(start..end.max(start), "");
        }
        Mutation::Insert { at, snippet } => {
            let at = boundary(text, *at);
            text.insert_str(at, snippet);
        }
        Mutation::Replace { at, len, snippet } => {
            let start = boundary(text, *at);
            let end = boundary(text, (start + len).min(text.len()));
            text.replace_range(start..end.max(start), snippet);
        }
        Mutation::DuplicateLine { line } => {
            let mut lines: Vec<&str> = text.split('\n').collect();
            let i = line % lines.len();
            lines.insert(i, lines[i]);
            *text = lines.join("\n");
        }
        Mutation::SwapLines { a, b } => {
            let mut lines: Vec<&str> = text.split('\n').collect();
            let n = lines.len();
            lines.swap(a % n, b % n);
            *text = lines.join("\n");
        }
    }
}

#[test]
fn the_unmutated_example_parses() {
    check(EXAMPLE).unwrap();
    assert!(parse_str(EXAMPLE, Path::new("fuzz.toml"), 3).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        check(&text)?;
    }

    #[test]
    fn toml_like_noise_never_panics(text in "[a-z_.:\"'=\\[\\]{}, \n\t0-9#-]{0,300}") {
        check(&text)?;
    }

    #[test]
    fn mutated_examples_never_panic(mutations in proptest::collection::vec(mutation(), 1..6)) {
        let mut text = EXAMPLE.to_owned();
        for m in &mutations {
            apply(&mut text, m);
        }
        check(&text)?;
    }
}
