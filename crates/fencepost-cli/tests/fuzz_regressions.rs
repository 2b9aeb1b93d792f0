//! The config file fuzz target's inputs kept as regressions (`fuzz/regressions/config_file/`:
//! every crasher the fuzzer found, and a few seeds), replayed through the same check the target
//! runs (`src/config.rs`, `check_decoder`), so that `scripts/test` runs them on stable Rust.

#[path = "../src/config.rs"]
mod config;

use std::path::PathBuf;

#[test]
fn l8_fuzz_regressions_config_file() {
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/config_file");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap_or_else(|error| panic!("{}: {error}", folder.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 3, "{} holds no inputs", folder.display());
    for input in inputs {
        config::check_decoder(&std::fs::read(&input).unwrap());
    }
}

/// L8: the seeds decode as expected: a valid file, an unknown key, an invalid device id.
#[test]
fn l8_config_file_decoder_accepts_the_documented_keys_only() {
    let path = std::path::Path::new("config.toml");
    let valid = config::ConfigFile::parse(
        b"coordinator = \"postgres://fp:secret@db/fp\"\nledger = \"/srv/ledger\"\ndevice = \"host-1\"\n",
        path,
    )
    .unwrap();
    assert_eq!(valid.device.as_deref(), Some("host-1"));
    assert_eq!(
        config::without_password(valid.coordinator.as_deref().unwrap()),
        "postgres://fp:***@db/fp"
    );
    for (bytes, says) in [
        (&b"coordinater = \"x\"\n"[..], "not valid"),
        (&b"device = \"\"\n"[..], "device"),
        (&b"device = \"a\\u0007b\"\n"[..], "device"),
        (&b"\xff\xfe"[..], "UTF-8"),
    ] {
        let error = config::ConfigFile::parse(bytes, path).unwrap_err();
        assert!(format!("{error:#}").contains(says), "{error:#}");
    }
}
