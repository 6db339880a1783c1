//! The seed corpus of malformed WQEs (host/tests/corpus/wqe/): every file must fail to
//! parse with the error kind and syndrome recorded in its name
//! (`<case>.<WqeError kind>.<SYNDROME>.hex`). Regenerate with corpus/gen_wqe_corpus.py.

use rshmem::mlx5::wqe::parse_wqe;

fn unhex(s: &str) -> Vec<u8> {
    let d: Vec<u8> = s
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .map(|c| c.to_digit(16).expect("hex digit") as u8)
        .collect();
    assert_eq!(d.len() % 2, 0);
    d.chunks(2).map(|p| (p[0] << 4) | p[1]).collect()
}

#[test]
fn every_corpus_wqe_fails_as_recorded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/wqe");
    let mut n = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(&dir).expect("corpus folder") {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let parts: Vec<&str> = name.split('.').collect();
        assert!(
            parts.len() == 4 && parts[3] == "hex",
            "{name}: expected <case>.<Kind>.<SYNDROME>.hex"
        );
        let bytes = unhex(&std::fs::read_to_string(&path).unwrap());
        let err = match parse_wqe(&bytes) {
            Ok(p) => panic!("{name}: parsed as {p:?}, expected {}", parts[1]),
            Err(e) => e,
        };
        assert_eq!(err.kind(), parts[1], "{name}: got {err}");
        assert_eq!(err.syndrome().name(), parts[2], "{name}: got {err}");
        kinds.insert(parts[1].to_string());
        n += 1;
    }
    assert!(n >= 27, "corpus shrank to {n} files");
    // Every WqeError kind is represented.
    assert_eq!(kinds.len(), 14, "{kinds:?}");
}
