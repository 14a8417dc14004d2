//! The examples' admission settings, read from the environment.

/// Set in a child run of this test binary: the program name the child
/// reads its admission settings for.
const PROBE: &str = "TESSERA_EXAMPLES_ADMISSION_PROBE";

/// What the examples read their admission settings with: in a child run
/// of this binary (with [`PROBE`] set) it reads them, and an invalid one
/// stops the child.
#[test]
fn an_invalid_admission_setting_stops_the_program_with_its_name() {
    if let Ok(program) = std::env::var(PROBE) {
        let config = tessera_examples::admission_from_env(&program);
        println!("read max_pending {}", config.max_pending);
        return;
    }
    let run = |value: Option<&str>| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "an_invalid_admission_setting_stops_the_program_with_its_name",
                "--nocapture",
            ])
            .env(PROBE, "quickstart");
        match value {
            Some(value) => command.env("TESSERA_CLAIM_MAX_PENDING", value),
            None => command.env_remove("TESSERA_CLAIM_MAX_PENDING"),
        };
        command.output().unwrap()
    };
    let invalid = run(Some("abc"));
    assert_eq!(invalid.status.code(), Some(2), "{invalid:?}");
    let stderr = String::from_utf8_lossy(&invalid.stderr);
    assert!(
        stderr.contains("quickstart: TESSERA_CLAIM_MAX_PENDING") && stderr.contains("\"abc\""),
        "{stderr}"
    );
    let valid = run(Some("7"));
    assert!(valid.status.success(), "{valid:?}");
    assert!(String::from_utf8_lossy(&valid.stdout).contains("read max_pending 7"));
}
