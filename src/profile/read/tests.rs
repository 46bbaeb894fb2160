//! Tests of `read.rs`.

use super::*;

const HEADER: &str = r#"{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-01-01T00:00:00.000Z","salt_id":"00","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},"contract":{}}"#;
const LINE: &str = r#"{"t_ms":5,"model":"m","api":"chat_completions","stream":true,"outcome":"ok","slo_class":"default","e2e_ms":9.0,"hash_ids":[0,1]}"#;

fn read(text: &str) -> Result<Profile, ReadError> {
    let mut p = Profile::default();
    p.add(Path::new("t.jsonl"), text.as_bytes())?;
    Ok(p)
}

#[test]
fn reads_entries_keys_and_reports_torn_lines() {
    let text = format!(
        "{HEADER}\n{{\"type\":\"blocks\",\"first_id\":0,\"keys\":[\"00000000000000ff\",\"0000000000000100\"]}}\n{LINE}\n{}",
        &LINE[..30]
    );
    let p = read(&text).unwrap();
    assert_eq!(p.entries.len(), 1);
    assert_eq!(p.entries[0].at_ms, 1_767_225_600_005);
    assert!(p.files[0].report.torn_last_line);
    assert_eq!(p.files[0].keys.get(1), Some(0x100));
    assert_eq!(
        p.block_identities()[0],
        [BlockId::Key(0xff), BlockId::Key(0x100)]
    );
    // One file, each key behind one id: the ids name the blocks as well.
    assert_eq!(
        p.compact_identities_of(&p.entries[0], true),
        [BlockId::Local(0, 0), BlockId::Local(0, 1)]
    );
    assert!(p.notes()[0].contains("torn"));
}

#[test]
fn shared_keys_are_those_behind_more_than_one_id() {
    let file = |keys: &[u64]| {
        let hex: Vec<String> = keys.iter().map(|k| format!("\"{k:016x}\"")).collect();
        format!(
            "{HEADER}\n{{\"type\":\"blocks\",\"first_id\":0,\"keys\":[{}]}}\n{LINE}\n",
            hex.join(",")
        )
    };
    let mut p = Profile::default();
    // 0xa in both files, 0xb twice in the second; 20,000 keys of their own, so
    // the filter's false positives are tried and dropped.
    let own = |base: u64| (0..10_000u64).map(move |i| base + i);
    let a: Vec<u64> = [0xa].into_iter().chain(own(1 << 40)).collect();
    let b: Vec<u64> = [0xb, 0xa, 0xb].into_iter().chain(own(2 << 40)).collect();
    p.add(Path::new("a"), file(&a).as_bytes()).unwrap();
    assert_eq!(p.shared_keys().len(), 0);
    p.add(Path::new("b"), file(&b).as_bytes()).unwrap();
    let mut shared: Vec<u64> = p.shared_keys().iter().copied().collect();
    shared.sort_unstable();
    assert_eq!(shared, [0xa, 0xb]);
}

#[test]
fn a_bad_middle_line_is_skipped_and_counted() {
    let text = format!("{HEADER}\nnot json\n{LINE}\n");
    let p = read(&text).unwrap();
    assert_eq!(p.entries.len(), 1);
    assert_eq!(p.files[0].report.invalid_lines, [2]);
    assert!(!p.files[0].report.torn_last_line);
}

#[test]
fn unknown_versions_and_non_profiles_are_refused() {
    let v2 = HEADER.replace("\"version\":1", "\"version\":2");
    let err = read(&format!("{v2}\n{LINE}\n")).unwrap_err();
    assert!(
        matches!(err, ReadError::UnsupportedVersion { version: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("version 2"));
    assert!(matches!(
        read("{\"a\":1}\n"),
        Err(ReadError::NotAProfile { .. })
    ));
    // What a crash right after creating a file leaves is skipped, with a note.
    let empty = read("").unwrap();
    assert!(empty.entries.is_empty() && empty.notes()[0].contains("empty"));
    let torn = read(&HEADER[..40]).unwrap();
    assert!(torn.files.is_empty() && torn.notes()[0].contains("torn header"));
}

#[test]
fn unknown_fields_and_line_types_are_listed() {
    let header = HEADER.replace("\"contract\":{}", "\"contract\":{},\"future\":1");
    let line = LINE.replace("\"e2e_ms\"", "\"later\":true,\"e2e_ms\"");
    let text = format!("{header}\n{line}\n{{\"type\":\"marker\"}}\n");
    let p = read(&text).unwrap();
    let f: Vec<&str> = p.files[0]
        .report
        .unknown_fields
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(f, ["header.future", "later", "type=marker"]);
}

#[test]
fn unknown_contract_keys_are_listed_and_the_known_ones_kept() {
    let header = HEADER.replace(
        "\"contract\":{}",
        "\"contract\":{\"engine\":\"vllm\",\"model\":\"m\",\"cards\":\"8\"}",
    );
    let p = read(&format!("{header}\n{LINE}\n")).unwrap();
    let file = &p.files[0];
    assert_eq!(file.header.contract.engine.as_deref(), Some("vllm"));
    let f: Vec<&str> = file
        .report
        .unknown_fields
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(f, ["header.contract.cards", "header.contract.model"]);
    // A known key of the wrong type still fails the header, as before.
    let bad = HEADER.replace("\"contract\":{}", "\"contract\":{\"engine\":7}");
    assert!(read(&format!("{bad}\n{LINE}\n")).is_err());
}
