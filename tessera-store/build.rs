//! Tells the test builds which test servers this machine has, so a test
//! that needs one it lacks is marked ignored (and counted as not run)
//! rather than passing without running.
//!
//! - `tessera_no_test_postgres`: `TESSERA_TEST_POSTGRES_URL` is unset.
//! - `tessera_no_test_postgres_cluster`: `TESSERA_TEST_POSTGRES_CLUSTER`
//!   (the cluster the restart test may stop and start) is unset.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for (variable, cfg) in [
        ("TESSERA_TEST_POSTGRES_URL", "tessera_no_test_postgres"),
        (
            "TESSERA_TEST_POSTGRES_CLUSTER",
            "tessera_no_test_postgres_cluster",
        ),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={variable}");
        if std::env::var_os(variable).is_none_or(|value| value.is_empty()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
